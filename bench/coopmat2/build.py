#!/usr/bin/env python3
"""Compile bench/coopmat2/gemm.comp into the SPIR-V variants `xtask coopmat2-probe` times.

    python3 bench/coopmat2/build.py OUT_DIR

GL_NV_cooperative_matrix2 needs a recent glslang (naga cannot express it; Debian 12's glslang 12
predates it): tools/native/glslang.py drives the one the `slangpy` wheel bundles (an installed
`slangpy`, or GLSLANG=path/to/libslang-glslang-*.so from the unpacked wheel). Each output is
validated.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'tools', 'native'))
from glslang import compile_glsl, library, with_defines  # noqa: E402

# (workgroup size, BM, BN, BK, unroll) by shape (M, N, K): the head over a quarter of the
# vocabulary, the decoder's q and o projections, and a stand-in for the experts' gate/up (the 128
# experts' 1.01 GB of F16 weights as one 180224-row W under 32 rows of A: the same weight bytes in
# tiles of the experts' 32 rows, A shared where each expert has its own).
SHAPES = {
    (32, 180224, 2816): [(128, 32, 128, 32, 4), (64, 32, 64, 32, 4), (128, 32, 256, 32, 4), (128, 32, 128, 64, 2)],
    (256, 65536, 2816): [(256, 128, 256, 32, 4), (256, 128, 128, 32, 4), (256, 256, 128, 32, 4),
                         (256, 128, 256, 64, 2), (128, 128, 128, 32, 4), (128, 64, 128, 32, 4),
                         (64, 64, 64, 32, 4), (64, 64, 128, 32, 4), (128, 64, 256, 32, 4), (128, 32, 128, 32, 4),
                         (128, 64, 128, 32, 2), (128, 64, 128, 32, 8), (128, 64, 128, 16, 8), (128, 128, 256, 32, 4),
                         (256, 64, 256, 32, 4), (256, 128, 256, 16, 8), (64, 32, 128, 32, 4), (64, 64, 128, 16, 8)],
    (256, 4096, 2816): [(256, 128, 128, 32, 4), (128, 128, 64, 32, 4), (128, 64, 64, 32, 4)],
    (256, 2816, 4096): [(256, 128, 128, 32, 4), (128, 128, 64, 32, 4), (128, 64, 64, 32, 4)],
}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else 'coopmat2-spv'
    os.makedirs(out_dir, exist_ok=True)
    lib = library()
    template = open(os.path.join(HERE, 'gemm.comp')).read()
    for (m, n, k), variants in SHAPES.items():
        for block, bm, bn, bk, unroll in variants:
            # The kernel has no bounds: the tile must divide the shape and a pass of K steps K.
            assert m % bm == 0 and n % bn == 0 and k % (bk * unroll) == 0, (m, n, k, bm, bn, bk, unroll)
            source = with_defines(template, [('BLOCK', block), ('BM', bm), ('BN', bn), ('BK', bk), ('UNROLL', unroll),
                                             ('M', f'{m}u'), ('N', f'{n}u'), ('K', f'{k}u')])
            name = f'gemm_b{block}_bm{bm}_bn{bn}_bk{bk}_u{unroll}_{m}x{n}x{k}'
            spirv = compile_glsl(lib, name, source)
            with open(os.path.join(out_dir, name + '.spv'), 'wb') as f:
                f.write(spirv)
            print(name, len(spirv), 'bytes')


if __name__ == '__main__':
    main()
