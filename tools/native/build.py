#!/usr/bin/env python3
"""Compile dg's Vulkan-native kernels (crates/dg-kernels/glsl/*.comp) into the SPIR-V variants that
dg-kernels embeds (crates/dg-kernels/spirv/), or check that the committed files are what the
sources compile to.

    python3 tools/native/build.py            write crates/dg-kernels/spirv/*.spv
    python3 tools/native/build.py --check    compile into a temporary directory and compare

Needs the pinned compiler: `pip install slangpy==0.43.1` (glslang.py). Each variant is the source
with `#define` lines: the cooperative-matrix fragment (FM x FN x FK) and subgroup size (SG) of one
shape dg-kernels' `native` module lists, the weights' format and A's, and the int8 mode's variants
(`native_grouped_gemm_int8_*`, dg-kernels' `native_int8_gemm`). The names are the ones
`dg_kernels::native_grouped_gemm` and `native_int8_gemm` include; the lists change together.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from glslang import compile_glsl, library, with_defines  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, '..', '..'))
GLSL = os.path.join(ROOT, 'crates', 'dg-kernels', 'glsl')
SPIRV = os.path.join(ROOT, 'crates', 'dg-kernels', 'spirv')

# (label, FM, FN, FK, SG): lavapipe's 8x8x8 (subgroups of 8) and NVIDIA's 16x8x16 and 16x16x16
# (subgroups of 32); dg_kernels::native::NativeShape.
SHAPES = [('8x8x8', 8, 8, 8, 8), ('16x8x16', 16, 8, 16, 32), ('16x16x16', 16, 16, 16, 32)]
# (label, WFMT): the weights' formats of the grouped product.
FORMATS = [('f16', 'W_F16'), ('q4_k', 'W_Q4_K'), ('q6_k', 'W_Q6_K'), ('q8_0', 'W_Q8_0')]
# (label, A_F16): A stored as f32 or f16.
A_FORMATS = [('a32', 0), ('a16', 1)]
# The int8 mode's (label, FM, FN, FK, SG): s8 x s8 -> s32 fragments, lavapipe's 8x8x8 (subgroups
# of 8) and NVIDIA's 16x8x32 and 16x16x32 (subgroups of 32); dg_kernels::native_int8_gemm::Int8Shape.
INT8_SHAPES = [('8x8x8', 8, 8, 8, 8), ('16x8x32', 16, 8, 32, 32), ('16x16x32', 16, 16, 32, 32)]
# The int8 mode's weight formats.
INT8_FORMATS = [('q4_k', 'W_Q4_K'), ('q8_0', 'W_Q8_0')]


def variants():
    """(file name, source file, defines) of every variant."""
    for shape, fm, fn, fk, sg in SHAPES:
        for w, wfmt in FORMATS:
            for a, a16 in A_FORMATS:
                defines = [('FM', f'{fm}u'), ('FN', f'{fn}u'), ('FK', f'{fk}u'), ('SG', f'{sg}u'), ('WFMT', wfmt), ('A_F16', a16), ('INT8', 0)]
                yield f'native_grouped_gemm_{shape}_{w}_{a}.spv', 'native_grouped_gemm.comp', defines
    for shape, fm, fn, fk, sg in INT8_SHAPES:
        for w, wfmt in INT8_FORMATS:
            for a, a16 in A_FORMATS:
                defines = [('FM', f'{fm}u'), ('FN', f'{fn}u'), ('FK', f'{fk}u'), ('SG', f'{sg}u'), ('WFMT', wfmt), ('A_F16', a16), ('INT8', 1)]
                yield f'native_grouped_gemm_int8_{shape}_{w}_{a}.spv', 'native_grouped_gemm.comp', defines


def build(out_dir):
    lib = library()
    os.makedirs(out_dir, exist_ok=True)
    sources = {}
    for name, source, defines in variants():
        if source not in sources:
            sources[source] = open(os.path.join(GLSL, source)).read()
        spirv = compile_glsl(lib, name, with_defines(sources[source], defines))
        with open(os.path.join(out_dir, name), 'wb') as f:
            f.write(spirv)


def check():
    """Exits non-zero naming each committed file that differs from (or is missing beside) a fresh build."""
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        fresh = sorted(os.listdir(tmp))
        committed = sorted(f for f in os.listdir(SPIRV) if f.endswith('.spv'))
        bad = [f'{f}: not committed' for f in fresh if f not in committed]
        bad += [f'{f}: no variant compiles to it' for f in committed if f not in fresh]
        for f in fresh:
            if f in committed and open(os.path.join(tmp, f), 'rb').read() != open(os.path.join(SPIRV, f), 'rb').read():
                bad.append(f'{f}: differs from what its source compiles to')
        if bad:
            sys.exit('crates/dg-kernels/spirv is stale (python3 tools/native/build.py rewrites it):\n  ' + '\n  '.join(bad))
        print(f'{len(fresh)} SPIR-V files match their sources')


if __name__ == '__main__':
    if sys.argv[1:] == ['--check']:
        check()
    elif not sys.argv[1:]:
        build(SPIRV)
    else:
        sys.exit(__doc__)
