#!/usr/bin/env python3
"""Blocks of every ggml type dg's GPU kernels read beyond Q8_0, Q5_0, Q4_K and Q6_K, with gguf-py's
dequantization of them: the reference the GPU product tests of dg-parity compare the kernels with.

Usage:
    python3 tools/gpu_quant_vectors/make_vectors.py           # (re)write crates/dg-parity/tests/data/ggml_types/
    python3 tools/gpu_quant_vectors/make_vectors.py --verify  # regenerate in memory, compare with the committed files

Needs numpy and gguf only (``python3 -m pip install gguf``). Files, little-endian:

- ``{type}_blocks.bin``: random blocks (random bytes) whose scales are set to sane values: f16 ``d``
  (and ``dmin`` / ``m``) of either sign and magnitudes 2^-12 .. 2^-4 (normal f16, products far from f32's
  subnormals, which a device may flush), MXFP4's E8M0 exponent 2^-12 .. 2^4, IQ1_M's ``d`` spread over
  the top nibbles of its scales as ggml stores it. NVFP4's UE4M3 scales stay random bytes (all finite).
- ``{type}_dequantized.f32``: ``gguf.quants.dequantize`` of those blocks.

The seed is fixed: the same script, numpy and gguf give the same bytes (``--verify`` checks it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parents[2] / "crates" / "dg-parity" / "tests" / "data" / "ggml_types"
SEED = 41

# (ggml type, byte offsets of its f16 scale fields, blocks written: 8 super-blocks, 24 small blocks)
TYPES = [
    (Q.Q4_0, [0]),
    (Q.Q4_1, [0, 2]),
    (Q.Q5_1, [0, 2]),
    (Q.Q2_K, [80, 82]),
    (Q.Q3_K, [108]),
    (Q.Q5_K, [0, 2]),
    (Q.IQ2_XXS, [0]),
    (Q.IQ2_XS, [0]),
    (Q.IQ3_XXS, [0]),
    (Q.IQ1_S, [0]),
    (Q.IQ4_NL, [0]),
    (Q.IQ3_S, [0]),
    (Q.IQ2_S, [0]),
    (Q.IQ4_XS, [0]),
    (Q.IQ1_M, []),
    (Q.MXFP4, []),
    (Q.NVFP4, []),
]


def sane_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """f16 bit patterns of either sign, magnitudes 2^-12 .. 2^-4."""
    exponent = rng.integers(15 - 12, 15 - 4, size=n, dtype=np.uint16)
    mantissa = rng.integers(0, 1024, size=n, dtype=np.uint16)
    sign = rng.integers(0, 2, size=n, dtype=np.uint16) << np.uint16(15)
    return sign | (exponent << np.uint16(10)) | mantissa


def blocks_of(rng: np.random.Generator, qtype: Q, offsets: list[int]) -> np.ndarray:
    values, size = GGML_QUANT_SIZES[qtype]
    n = 8 if values == 256 else 48 * 32 // values // 2
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for at in offsets:
        blocks[:, at : at + 2] = sane_f16(rng, n).astype("<u2").view(np.uint8).reshape(n, 2)
    if qtype == Q.IQ1_M:
        # d's nibbles in the top 4 bits of the 4 u16 scales (bytes 48..56), lowest nibble first.
        d = sane_f16(rng, n)
        scales = blocks[:, 48:56].copy().view("<u2")
        for k in range(4):
            scales[:, k] = (scales[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = scales.view(np.uint8)
    if qtype == Q.MXFP4:
        blocks[:, 0] = rng.integers(127 - 12 + 1, 127 + 4 + 1, size=n, dtype=np.uint8)
    return blocks


def vectors() -> dict[str, bytes]:
    rng = np.random.default_rng(SEED)
    files: dict[str, bytes] = {}
    for qtype, offsets in TYPES:
        blocks = blocks_of(rng, qtype, offsets)
        values = dequantize(blocks, qtype).astype("<f4")
        assert np.isfinite(values).all(), qtype.name
        stem = qtype.name.lower()
        files[f"{stem}_blocks.bin"] = blocks.tobytes()
        files[f"{stem}_dequantized.f32"] = values.tobytes()
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="compare with the committed files")
    args = parser.parse_args()
    files = vectors()
    if args.verify:
        bad = [name for name, data in files.items() if not (OUT / name).is_file() or (OUT / name).read_bytes() != data]
        if bad:
            print(f"{OUT}: differs from what gguf-py gives: {', '.join(bad)}", file=sys.stderr)
            return 1
        print(f"{len(files)} files as gguf-py gives")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (OUT / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
