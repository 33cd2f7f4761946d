#!/usr/bin/env python3
"""Test vectors for dg's ggml block formats, from gguf-py (ggml's own ``gguf`` package).

Usage:
    python3 tools/gguf_vectors/make_vectors.py            # (re)write crates/dg-model/tests/data/quant/
    python3 tools/gguf_vectors/make_vectors.py --verify   # regenerate in memory, compare with the committed files
    python3 tools/gguf_vectors/make_vectors.py --check    # another seed into a temporary directory, then
                                                          # cargo test -p dg-model --test quant_vectors on it
    python3 tools/gguf_vectors/make_vectors.py --out DIR --seed N

Needs numpy and gguf only (``python3 -m pip install gguf``). Files, all little-endian:

- ``{q8_0,q5_0,q4_k,q6_k}_blocks.bin``: random blocks (random bytes) whose f16 scale fields (``d``; and
  ``dmin`` for Q4_K) cycle through ``SPECIAL_SCALES`` (zeros, subnormals, the extreme finite values,
  infinities, NaNs) and then take random finite f16 values of either sign and any exponent.
- ``{...}_dequantized.f32``: ``gguf.quants.dequantize`` of those blocks, as f32.
- ``quantize_input.f32``: rows of 32 f32 inputs (Gaussian at several magnitudes, zero rows with either
  sign of zero first, f32 subnormals, magnitudes whose scale's reciprocal overflows, values whose scale
  overflows f16, exact ties for both quantizers, equal magnitudes of opposite signs, random bit patterns).
- ``{q8_0,q5_0}_quantized.bin``: ``gguf.quants.quantize`` of ``quantize_input.f32`` (gguf-py quantizes
  only these two of the four).

The seed is fixed, so the same script, numpy and gguf give the same bytes (``--verify`` checks it). A
block whose quantization scale's reciprocal overflows f32 casts infinities to integers, which numpy does
the x86-64 way (``cvttss2si``); those bytes are x86-64's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "dg-model" / "tests" / "data" / "quant"
SEED = 23

# (file stem, ggml type, bytes per block, byte offsets of the f16 scales, blocks written)
FORMATS = [
    ("q8_0", Q.Q8_0, 34, [0], 256),
    ("q5_0", Q.Q5_0, 22, [0], 256),
    ("q4_k", Q.Q4_K, 144, [0, 2], 48),
    ("q6_k", Q.Q6_K, 210, [208], 48),
]
QUANTIZED = [("q8_0", Q.Q8_0), ("q5_0", Q.Q5_0)]

# f16 bit patterns every format's scales take first: +-0, subnormals (smallest, largest, between),
# the smallest normal, 1, the largest finite, infinities, quiet and signalling NaNs of both signs.
SPECIAL_SCALES = [
    0x0000, 0x8000, 0x0001, 0x8001, 0x0200, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x3C00, 0xBC00,
    0x7BFF, 0xFBFF, 0x7BFE, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7DFF,
]


def random_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 bit patterns of either sign, every exponent (subnormals included) equally likely."""
    bits = rng.integers(0, 0x7C00, size=n, dtype=np.uint16)
    sign = rng.integers(0, 2, size=n, dtype=np.uint16) << np.uint16(15)
    return bits | sign


def random_blocks(rng: np.random.Generator, block_bytes: int, scale_offsets: list[int], n: int) -> np.ndarray:
    blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for k, at in enumerate(scale_offsets):
        # Each scale field walks the special list from a different start, so Q4_K pairs them up.
        special = np.roll(np.array(SPECIAL_SCALES, dtype=np.uint16), -5 * k)
        scales = np.concatenate([special, random_f16_bits(rng, n - len(special))])
        blocks[:, at:at + 2] = scales.astype("<u2").view(np.uint8).reshape(n, 2)
    return blocks


def quantize_input(rng: np.random.Generator) -> np.ndarray:
    """Rows of 32 f32 values that reach every branch and corner of Q8_0's and Q5_0's quantizers."""
    rows: list[np.ndarray] = []

    def add(row) -> None:
        rows.append(np.asarray(row, dtype=np.float32).reshape(-1, 32))

    for magnitude in [1.0, 1e-3, 1e3, 1e-20, 1e20]:
        add(rng.standard_normal((16, 32)) * magnitude)
    zeros = np.zeros((4, 32))
    zeros[1, 0] = -0.0  # gguf-py's max is x[argmax |x|]: -0.0 here, so Q5_0's d is +0.0
    zeros[2, :] = -0.0
    zeros[3, 5] = -0.0
    add(zeros)
    add(np.where(rng.random((4, 32)) < 0.8, 0.0, rng.standard_normal((4, 32))))  # mostly zeros
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    add(rng.integers(-1000, 1000, size=(4, 32)) * tiny)  # f32 subnormals: scales of 0 in f16
    add(rng.standard_normal((4, 32)) * 1e-37)  # d = amax / 127 and 1 / d overflows f32
    add(rng.standard_normal((4, 32)) * 1e-39)
    for amax in [65504.0 * 127, 65520.0 * 127, 65504.0 * 16, 65520.0 * 16, 3e38]:
        row = rng.uniform(-1, 1, size=32) * amax
        row[rng.integers(32)] = amax  # d right at (or just past) f16's largest finite value
        add(row)
    # Q8_0 ties: amax 127 makes d = 1, so x / d = x and halves round away from zero.
    ties = rng.integers(-126, 126, size=(4, 32)) + 0.5
    ties[:, 0] = 127.0
    add(ties)
    # Q5_0 ties: max = -16 (d = 1) or 16 (d = -1) makes x / d + 16.5 exact at the truncation edge.
    for m in [-16.0, 16.0]:
        t = rng.integers(-32, 32, size=(4, 32)) / 2.0
        t[:, 3] = m
        add(np.clip(t, -16, 16))
    add(rng.integers(-8, 8, size=(4, 32)).astype(np.float64))  # integers
    opposite = rng.standard_normal((4, 32))
    opposite[:, 7] = 3.0
    opposite[:, 9] = -3.0  # equal magnitudes: the first one is the max
    opposite[2:, 7], opposite[2:, 9] = -3.0, 3.0
    add(opposite)
    bits = rng.integers(0, 2**32, size=(16, 32), dtype=np.uint64).astype(np.uint32)
    finite = bits.view(np.float32)
    add(np.where(np.isfinite(finite), finite, 0.0))  # random bit patterns: any exponent, both signs
    return np.concatenate(rows).astype(np.float32)


def vectors(seed: int) -> dict[str, bytes]:
    """Every file's name and bytes for `seed`."""
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    for stem, qtype, block_bytes, scale_offsets, n in FORMATS:
        blocks = random_blocks(rng, block_bytes, scale_offsets, n)
        with np.errstate(all="ignore"):  # inf and NaN scales are part of the test
            values = dequantize(blocks, qtype)
        files[f"{stem}_blocks.bin"] = blocks.tobytes()
        files[f"{stem}_dequantized.f32"] = values.astype("<f4").tobytes()
    x = quantize_input(rng)
    files["quantize_input.f32"] = x.astype("<f4").tobytes()
    for stem, qtype in QUANTIZED:
        with np.errstate(all="ignore"):  # rows whose 1 / d overflows
            files[f"{stem}_quantized.bin"] = quantize(x, qtype).tobytes()
    return files


def write(out: Path, files: dict[str, bytes]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    print(f"wrote {len(files)} files ({sum(map(len, files.values()))} bytes) to {out}")


def verify(out: Path, files: dict[str, bytes]) -> int:
    """0 when `out` holds exactly `files`, else 1 with every difference named."""
    problems = []
    for name, data in files.items():
        path = out / name
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_bytes() != data:
            problems.append(f"{path}: differs from a fresh regeneration ({path.stat().st_size} bytes, expected {len(data)})")
    for path in sorted(out.glob("*")):
        if path.name not in files:
            problems.append(f"{path}: not made by this script")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{len(files)} files in {out} match a fresh regeneration")
    return 1 if problems else 0


def check(seed: int) -> int:
    """Fresh vectors from another seed, and dg's integration test run on them."""
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp), vectors(seed))
        env = dict(os.environ, DG_QUANT_VECTORS=tmp)
        cmd = ["cargo", "test", "-q", "-p", "dg-model", "--test", "quant_vectors"]
        print(f"seed {seed}: DG_QUANT_VECTORS={tmp} {' '.join(cmd)}")
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--verify", action="store_true", help="compare a fresh regeneration with the files in --out")
    mode.add_argument("--check", action="store_true", help="run dg's test on vectors from another seed")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=None, help=f"default {SEED} (--check: a random one)")
    args = ap.parse_args()
    if args.check:
        return check(args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little"))
    files = vectors(SEED if args.seed is None else args.seed)
    if args.verify:
        return verify(args.out, files)
    write(args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
