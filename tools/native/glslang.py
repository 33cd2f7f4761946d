"""GLSL to SPIR-V through the glslang library that the pinned `slangpy` wheel bundles.

slangpy ships glslang as `libslang-glslang-*.so` with C entry points `glslang_compile_1_2` and
`glslang_validateSPIRV` (slang's `slang-glslang.h`); this drives them through ctypes, so no
glslang executable is needed. Every output is validated. The library is the one inside the
installed `slangpy` package, or $GLSLANG (a path to the .so of an unpacked wheel).

Pinned: `pip install slangpy==0.43.1` (the committed SPIR-V is what its glslang writes).
"""
import ctypes
import glob
import importlib.util
import os
import sys

SLANGPY = '0.43.1'


def library():
    """The glslang library: $GLSLANG, else the one inside an installed `slangpy` package."""
    path = os.environ.get('GLSLANG')
    if not path:
        spec = importlib.util.find_spec('slangpy')
        found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), 'libslang-glslang-*.so'))) if spec and spec.origin else []
        path = found[-1] if found else None
    if not path:
        sys.exit(f'no glslang: `pip install slangpy=={SLANGPY}`, or set GLSLANG to the libslang-glslang-*.so of an unpacked slangpy wheel')
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


def with_defines(source, defines):
    """`source` with `#define NAME VALUE` lines for `defines` (name, value pairs) after its `#version` line."""
    lines = ''.join(f'#define {name} {value}\n' for name, value in defines)
    head, sep, rest = source.partition('\n')
    assert head.startswith('#version'), 'a GLSL source starts with its #version line'
    return head + sep + lines + rest


def compile_glsl(lib, name, source, spirv=(1, 6)):
    """SPIR-V (bytes) of the compute shader `source` (entry point `main`), for Vulkan 1.3 and
    SPIR-V `spirv`, optimised; exits naming `name` with glslang's diagnostics where it fails."""
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
    r.spirvVersion = Version(spirv[0], spirv[1], 0)
    r.entryPointName = b'main'
    rc = lib.glslang_compile_1_2(ctypes.byref(r))
    words = b''.join(out)
    if rc != 0 or not words:
        sys.exit(f'{name}: compile failed ({rc}): {b"".join(diag).decode(errors="replace")}')
    array = (ctypes.c_uint32 * (len(words) // 4)).from_buffer_copy(words)
    lib.glslang_validateSPIRV.restype = ctypes.c_bool
    if not lib.glslang_validateSPIRV(array, len(array)):
        sys.exit(f'{name}: SPIR-V does not validate')
    return words
