#!/usr/bin/env python3
"""Compile bench/coopmat2/gemm.comp into the SPIR-V variants `xtask coopmat2-probe` times.

    python3 bench/coopmat2/build.py OUT_DIR

GL_NV_cooperative_matrix2 needs a recent glslang (naga cannot express it; Debian 12's glslang 12
predates it). This uses the glslang library that the `slangpy` wheel bundles (an
installed `slangpy`, or GLSLANG=path/to/libslang-glslang-*.so from the unpacked wheel), through its
C entry points `glslang_compile_1_2` and `glslang_validateSPIRV`. Each output is validated.
"""
import ctypes
import glob
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

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


def library():
    """The glslang library: $GLSLANG, else the one inside an installed `slangpy` package."""
    path = os.environ.get('GLSLANG')
    if not path:
        spec = importlib.util.find_spec('slangpy')
        found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), 'libslang-glslang-*.so'))) if spec and spec.origin else []
        path = found[-1] if found else None
    if not path:
        sys.exit('no glslang: `pip install slangpy`, or set GLSLANG to the libslang-glslang-*.so of an unpacked slangpy wheel')
    return ctypes.CDLL(path)


OUTF = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class Version(ctypes.Structure):
    _fields_ = [('major', ctypes.c_int), ('minor', ctypes.c_int), ('patch', ctypes.c_int)]


class Request(ctypes.Structure):
    """glslang_CompileRequest_1_2 of slang's slang-glslang.h."""
    _fields_ = [('sizeInBytes', ctypes.c_size_t), ('sourcePath', ctypes.c_char_p), ('inputBegin', ctypes.c_void_p),
                ('inputEnd', ctypes.c_void_p), ('diagnosticFunc', OUTF), ('diagnosticUserData', ctypes.c_void_p),
                ('outputFunc', OUTF), ('outputUserData', ctypes.c_void_p), ('slangStage', ctypes.c_int),
                ('action', ctypes.c_uint), ('optimizationLevel', ctypes.c_uint), ('debugInfoType', ctypes.c_uint),
                ('spirvTargetName', ctypes.c_char_p), ('spirvVersion', Version), ('entryPointName', ctypes.c_char_p)]


def compile_glsl(lib, name, source):
    data = source.encode()
    buf = ctypes.create_string_buffer(data, len(data))
    out, diag = [], []
    on_out = OUTF(lambda p, n, _: out.append(ctypes.string_at(p, n)))
    on_diag = OUTF(lambda p, n, _: diag.append(ctypes.string_at(p, n)))
    r = Request()
    r.sizeInBytes = ctypes.sizeof(Request)
    r.sourcePath = name.encode()
    r.inputBegin = ctypes.addressof(buf)
    r.inputEnd = ctypes.addressof(buf) + len(data)
    r.diagnosticFunc, r.outputFunc = on_diag, on_out
    r.slangStage = 6  # SLANG_STAGE_COMPUTE
    r.action = 0  # GLSLANG_ACTION_COMPILE_GLSL_TO_SPIRV
    r.optimizationLevel = 2
    r.spirvTargetName = b'vulkan1.3'
    r.spirvVersion = Version(1, 6, 0)
    r.entryPointName = b'main'
    rc = lib.glslang_compile_1_2(ctypes.byref(r))
    spirv = b''.join(out)
    if rc != 0 or not spirv:
        sys.exit(f'{name}: compile failed ({rc}): {b"".join(diag).decode(errors="replace")}')
    words = (ctypes.c_uint32 * (len(spirv) // 4)).from_buffer_copy(spirv)
    lib.glslang_validateSPIRV.restype = ctypes.c_bool
    if not lib.glslang_validateSPIRV(words, len(words)):
        sys.exit(f'{name}: SPIR-V does not validate')
    return spirv


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else 'coopmat2-spv'
    os.makedirs(out_dir, exist_ok=True)
    lib = library()
    template = open(os.path.join(HERE, 'gemm.comp')).read()
    for (m, n, k), variants in SHAPES.items():
        for block, bm, bn, bk, unroll in variants:
            # The kernel has no bounds: the tile must divide the shape and a pass of K steps K.
            assert m % bm == 0 and n % bn == 0 and k % (bk * unroll) == 0, (m, n, k, bm, bn, bk, unroll)
            defines = ''.join(f'#define {key} {value}\n' for key, value in
                              [('BLOCK', block), ('BM', bm), ('BN', bn), ('BK', bk), ('UNROLL', unroll),
                               ('M', f'{m}u'), ('N', f'{n}u'), ('K', f'{k}u')])
            source = template.replace('#version 450\n', '#version 450\n' + defines, 1)
            name = f'gemm_b{block}_bm{bm}_bn{bn}_bk{bk}_u{unroll}_{m}x{n}x{k}'
            spirv = compile_glsl(lib, name, source)
            with open(os.path.join(out_dir, name + '.spv'), 'wb') as f:
                f.write(spirv)
            print(name, len(spirv), 'bytes')


if __name__ == '__main__':
    main()
