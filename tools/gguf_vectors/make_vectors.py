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
- the same ``_blocks.bin`` and ``_dequantized.f32`` pair for every other type gguf-py dequantizes
  (``MORE_FORMATS``: Q4_0 ... NVFP4), byte scales (MXFP4, NVFP4) starting from ``SPECIAL_BYTE_SCALES``.

- ``ggml_types.txt``: gguf-py's ggml types, ``NAME ID BLOCK_SIZE TYPE_SIZE DEQUANTIZES`` a line.

It also writes ``crates/dg-model/src/quant/iq_grids.rs``, gguf-py's IQ grids and level tables as Rust
consts (``--verify`` checks it too).

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

import gguf.quants
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
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

# The formats added after the four above, drawn from the generator after the quantization input (so
# the files above do not change). The scales are f16 fields at the given offsets, but for IQ1_M (its
# f16 scale split over the top nibbles of four u16, `IQ1M_SCALE`) and the FP4 formats (byte scales:
# MXFP4's E8M0 at 0, NVFP4's four UE4M3 at 0..4, `BYTE_SCALES`).
IQ1M_SCALE = "iq1_m"
BYTE_SCALES = "bytes"
MORE_FORMATS = [
    ("q4_0", Q.Q4_0, 18, [0], 64),
    ("q4_1", Q.Q4_1, 20, [0, 2], 64),
    ("q5_1", Q.Q5_1, 24, [0, 2], 64),
    ("q2_k", Q.Q2_K, 84, [80, 82], 24),
    ("q3_k", Q.Q3_K, 110, [108], 24),
    ("q5_k", Q.Q5_K, 176, [0, 2], 24),
    ("iq4_nl", Q.IQ4_NL, 18, [0], 64),
    ("iq4_xs", Q.IQ4_XS, 136, [0], 24),
    ("iq3_xxs", Q.IQ3_XXS, 98, [0], 24),
    ("iq3_s", Q.IQ3_S, 110, [0], 24),
    ("iq2_xxs", Q.IQ2_XXS, 66, [0], 24),
    ("iq2_xs", Q.IQ2_XS, 74, [0], 24),
    ("iq2_s", Q.IQ2_S, 82, [0], 24),
    ("iq1_s", Q.IQ1_S, 50, [0], 24),
    ("iq1_m", Q.IQ1_M, 56, IQ1M_SCALE, 24),
    ("mxfp4", Q.MXFP4, 17, BYTE_SCALES, 64),
    ("nvfp4", Q.NVFP4, 36, BYTE_SCALES, 24),
]

# f16 bit patterns every format's scales take first: +-0, subnormals (smallest, largest, between),
# the smallest normal, 1, the largest finite, infinities, quiet and signalling NaNs of both signs.
SPECIAL_SCALES = [
    0x0000, 0x8000, 0x0001, 0x8001, 0x0200, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x3C00, 0xBC00,
    0x7BFF, 0xFBFF, 0x7BFE, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7DFF,
]
# Byte scales every FP4 block starts with: E8M0's subnormal halves (0, 1), 1, the largest (254, 255);
# UE4M3's zero, subnormals, the largest finite (0x7E), its NaN pattern (0x7F, read as 0) and bytes with
# the unused top bit set.
SPECIAL_BYTE_SCALES = [0x00, 0x01, 0x02, 0x07, 0x08, 0x38, 0x7E, 0x7F, 0x80, 0x81, 0xFE, 0xFF]


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


def random_blocks_more(rng: np.random.Generator, block_bytes: int, scales, n: int) -> np.ndarray:
    """`random_blocks` for `MORE_FORMATS`, whose scales may be IQ1_M's split f16 or bytes."""
    if scales == BYTE_SCALES:
        blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        special = np.array(SPECIAL_BYTE_SCALES, dtype=np.uint8)
        blocks[:len(special), 0] = special
        if block_bytes == 36:  # NVFP4: the special bytes in every sub-block's scale, shifted
            for s in range(1, 4):
                blocks[:len(special), s] = np.roll(special, -3 * s)
        return blocks
    if scales == IQ1M_SCALE:
        blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        d = np.concatenate([np.array(SPECIAL_SCALES, dtype=np.uint16), random_f16_bits(rng, n - len(SPECIAL_SCALES))])
        packed = blocks[:, 48:56].copy().view("<u2")  # four u16; d's nibble k in the top nibble of u16 k
        for k in range(4):
            packed[:, k] = (packed[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = packed.view(np.uint8)
        return blocks
    blocks = random_blocks(rng, block_bytes, scales, n)
    if len(scales) == 2:  # a scale and a min both NaN (different payloads and signs): which NaN wins
        blocks[len(SPECIAL_SCALES), scales[0]:scales[0] + 2] = [0x01, 0x7E]
        blocks[len(SPECIAL_SCALES), scales[1]:scales[1] + 2] = [0x02, 0xFE]
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
    files["ggml_types.txt"] = ggml_types()
    for stem, qtype, block_bytes, scales, n in MORE_FORMATS:
        blocks = random_blocks_more(rng, block_bytes, scales, n)
        with np.errstate(all="ignore"):
            values = dequantize(blocks, qtype)
        files[f"{stem}_blocks.bin"] = blocks.tobytes()
        files[f"{stem}_dequantized.f32"] = values.astype("<f4").tobytes()
    return files


GRIDS_RS = ROOT / "crates" / "dg-model" / "src" / "quant" / "iq_grids.rs"

# (Rust const, gguf-py class, bytes per grid entry): ggml-common.h's tables (iq2xxs_grid, ...), each
# entry one little-endian integer whose bytes are the entry's values (i8 for IQ1_S, u8 otherwise).
GRIDS = [
    ("IQ2XXS_GRID", "IQ2_XXS", 8),
    ("IQ2XS_GRID", "IQ2_XS", 8),
    ("IQ2S_GRID", "IQ2_S", 8),
    ("IQ3XXS_GRID", "IQ3_XXS", 4),
    ("IQ3S_GRID", "IQ3_S", 4),
    ("IQ1S_GRID", "IQ1_S", 8),
]


def grids_source() -> str:
    """iq_grids.rs: gguf-py's IQ grids, sign table and 4-bit value tables as Rust consts."""
    lines = [
        "//! ggml's lookup tables for the IQ and FP4 formats (`ggml/src/ggml-common.h`: `iq2xxs_grid`, ...,",
        "//! `ksigns_iq2xs`, `kvalues_iq4nl`, `kvalues_mxfp4`), generated from gguf-py's copies of them",
        "//! (`gguf.quants`) by `tools/gguf_vectors/make_vectors.py`, whose `--verify` checks this file. Do not edit.",
        "//!",
        "//! A grid entry is one little-endian integer whose bytes are the entry's values, as ggml stores it.",
        "",
    ]
    for const, cls_name, width in GRIDS:
        cls = getattr(gguf.quants, cls_name)
        cls.init_grid()
        values = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
        assert values.shape[1] == width and np.all(values == np.round(values)), cls_name
        entries = values.astype(np.int64).astype(np.uint8).view(f"<u{width}").reshape(-1)
        rust_type = f"u{8 * width}"
        lines.append(f"/// gguf-py's `{cls_name}` grid (ggml's `{const.lower()}`): {len(entries)} entries of {width} values.")
        lines.append("#[rustfmt::skip]")
        lines.append(f"pub const {const}: [{rust_type}; {len(entries)}] = [")
        per_line = 120 // (2 * width + 4)
        for at in range(0, len(entries), per_line):
            lines.append("    " + " ".join(f"0x{int(e):0{2 * width}x}," for e in entries[at:at + per_line]))
        lines.append("];")
        lines.append("")
    ksigns = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    lines.append("/// ggml's `ksigns_iq2xs`: 7 sign bits and their parity as the eighth.")
    lines.append("#[rustfmt::skip]")
    lines.append(f"pub const KSIGNS_IQ2XS: [u8; {len(ksigns)}] = [")
    for at in range(0, len(ksigns), 16):
        lines.append("    " + " ".join(f"0x{int(e):02x}," for e in ksigns[at:at + 16]))
    lines.append("];")
    lines.append("")
    for const, values, what in [
        ("KVALUES_IQ4NL", gguf.quants.IQ4_NL.kvalues, "IQ4_NL's and IQ4_XS's 16 levels"),
        ("KVALUES_MXFP4", gguf.quants.MXFP4.kvalues, "FP4 (E2M1) values doubled, MXFP4's and NVFP4's levels"),
    ]:
        lines.append(f"/// ggml's `{const.lower()}`: {what}.")
        lines.append(f"pub const {const}: [i8; 16] = [{', '.join(str(v) for v in values)}];")
        lines.append("")
    return "\n".join(lines)


def ggml_types() -> bytes:
    """gguf-py's type table: ``NAME ID BLOCK_SIZE TYPE_SIZE DEQUANTIZES`` a line per ``GGMLQuantizationType``,
    DEQUANTIZES 1 where ``gguf.quants.dequantize`` reads the type."""

    def dequantizes(t: Q) -> int:
        return int(t in (Q.F32, Q.F16) or t in gguf.quants._type_traits)

    lines = [f"{t.name} {int(t)} {GGML_QUANT_SIZES[t][0]} {GGML_QUANT_SIZES[t][1]} {dequantizes(t)}\n" for t in Q]
    return "".join(lines).encode()


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
        cmd = ["cargo", "test", "-q", "--release", "-p", "dg-model", "--test", "quant_vectors"]
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
    grids = grids_source()
    if args.verify:
        grids_ok = GRIDS_RS.exists() and GRIDS_RS.read_text() == grids
        print(f"{GRIDS_RS}: {'matches' if grids_ok else 'differs from'} a fresh regeneration", file=sys.stdout if grids_ok else sys.stderr)
        return verify(args.out, files) | (0 if grids_ok else 1)
    write(args.out, files)
    GRIDS_RS.write_text(grids)
    print(f"wrote {GRIDS_RS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
