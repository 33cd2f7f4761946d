"""GGUF fixtures: the oracle's random model quantized into ggml blocks, transformers run on the
dequantized weights.

A preset with ``gguf_scheme`` (``q8_0`` or ``q4_k_m``, dg's quantization schemes) goes through the
usual oracle run with one extra step right after the random weights are drawn (``GgufQuantizer``):

1. the model is saved as an HF checkpoint in a temporary directory and dg's own quantizer writes it
   as GGUF (``cargo run -p xtask -- write-gguf --scheme S``): the scheme's matrices become ggml
   blocks (Q8_0, Q5_0, Q4_K), everything else stays as stored (F32, or BF16 for a bfloat16
   checkpoint), with llama.cpp's DiffusionGemma tensor names and metadata;
2. gguf-py (ggml's own ``gguf`` package) reads that file and dequantizes every tensor
   (``gguf.quants.dequantize``); those values replace the model's weights, so every reference
   tensor is transformers' run on exactly the values the file encodes;
3. as cross-checks, the Q8_0 and Q5_0 blocks must equal gguf-py's ``gguf.quants.quantize`` of the
   same input byte for byte, the tensors kept unquantized must come back unchanged, and the
   K-quant tensors (which gguf-py cannot quantize) must stay close to the values they encode.

A preset's ``gguf_tensors`` (``{"layers.0.experts.gate_up_proj": "IQ2_XXS", ...}``, names under
``model.decoder``) writes single tensors in other ggml types, so one small fixture covers a family
of types. Each is made the most honest way available (``tensor_blocks``):

- a type dg quantizes (``DG_QUANTIZES``): dg's quantizer, from the checkpoint's values
  (``write-gguf --tensor NAME=TYPE``);
- a type only gguf-py quantizes (Q4_1, MXFP4): gguf-py's ``quantize`` of the tensor, its bytes handed
  to dg's writer (``--tensor NAME=TYPE:FILE``);
- a type neither quantizes (the IQ grid types need an importance matrix in llama.cpp; NVFP4 has no
  quantizer in gguf-py): valid random blocks (random bytes: every grid index and sign pattern is
  valid) whose scales are set so that each block's values have the tensor's own RMS
  (``drawn_blocks``). These tensors encode no trained or random weight of the model: the file
  defines them, and the reference runs on gguf-py's dequantization of them like every other tensor.

The fixture directory then holds ``model.gguf`` (written again from the saved fixture checkpoint,
then the safetensors file is removed) beside config.json, generation_config.json and the reference
files; reloading ``model.gguf`` through gguf-py must reproduce ``logits_plain`` bit for bit.
"""

from __future__ import annotations

import copy
import os
import subprocess
import tempfile
import zlib
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[2]
DECODER = "model.decoder"
ENCODER = "model.encoder.language_model"
SCHEMES = ("q8_0", "q4_k_m", "q2_k", "q3_k_m", "iq4_xs")

# The HF <-> GGUF tensor names of crates/dg-model/src/gguf/names.rs (llama.cpp's DiffusionGemma
# converter over gguf-py's Gemma 4 tensor map).
SHARED = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "self_cond_pre_norm.weight": "self_conditioning.pre_norm.weight",
    "self_cond_gate.weight": "self_conditioning.gate_proj.weight",
    "self_cond_up.weight": "self_conditioning.up_proj.weight",
    "self_cond_down.weight": "self_conditioning.down_proj.weight",
}
LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "layer_output_scale.weight": "layer_scalar",
}
ENC_SCALAR = "enc_layer_output_scale.weight"
IGNORABLE = ("rope_freqs.weight",)

# Types gguf-py quantizes itself (ggml's reference quantizers); a file's blocks must equal its bytes.
GGUF_PY_QUANTIZES = (Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.Q4_1, Q.Q5_1, Q.MXFP4)
# The types dg's quantizer writes (dg_model::QUANTIZABLE).
DG_QUANTIZES = (Q.Q4_0, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS)
# The other quantized types are checked only for being a plausible encoding of the weights: normwise
# distance from the unquantized tensor. On Gaussian weights Q4_K's 4 bits land around 0.1, IQ4_XS and
# IQ4_NL about as close; Q3_K about 0.2 and Q2_K's 2.6 bits about 0.35, so those get more room.
MAX_NORMWISE = {Q.Q2_K: 0.45, Q.Q3_K: 0.3}
MAX_NORMWISE_DEFAULT = 0.2
# Drawn blocks (no quantizer): their values' RMS must match the tensor's within this factor (each
# block's scale is set to it; f16 and UE4M3 scales round, and a block's RMS is over few values).
MAX_DRAWN_RMS_RATIO = 1.5


def hf_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor; None for tensors dg ignores (rope_freqs)."""
    if gguf_name in IGNORABLE:
        return None
    if gguf_name in SHARED:
        return f"{DECODER}.{SHARED[gguf_name]}"
    prefix, layer, rest = gguf_name.split(".", 2)
    if prefix != "blk":
        raise KeyError(f"unknown GGUF tensor {gguf_name!r}")
    if rest == ENC_SCALAR:
        return f"{ENCODER}.layers.{layer}.layer_scalar"
    return f"{DECODER}.layers.{layer}.{LAYER[rest]}"


def save_hf(model: torch.nn.Module, out: Path, bfloat16: bool, generation_config) -> None:
    """save_pretrained the model (in BF16 when the checkpoint is bfloat16) with these sampler defaults."""
    to_save = copy.deepcopy(model)
    to_save.generation_config = generation_config
    if bfloat16:
        to_save = to_save.to(torch.bfloat16)
        to_save.config.text_config.dtype = torch.bfloat16
    to_save.save_pretrained(out)


def write_gguf(model_dir: Path, out: Path, scheme: str, tensors: list[str] = ()) -> None:
    """dg's quantizer: ``xtask write-gguf --scheme`` over an HF model directory, with ``--tensor``
    options (``DG_XTASK`` may name a built xtask binary; by default cargo builds and runs it)."""
    xtask = os.environ.get("DG_XTASK")
    cmd = [xtask] if xtask else ["cargo", "run", "-q", "-p", "xtask", "--"]
    args = ["write-gguf", "--model", str(model_dir), "--out", str(out), "--scheme", scheme]
    for t in tensors:
        args += ["--tensor", t]
    subprocess.run([*cmd, *args], cwd=ROOT, check=True)


def _set_iq1_m_scales(blocks: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M's f16 scale: nibble k of its bits in the top nibble of u16 k of ``scales`` (bytes 48..56)."""
    packed = blocks[:, 48:56].copy().view("<u2")
    bits = d.astype(np.float16).view(np.uint16)
    for k in range(4):
        packed[:, k] = (packed[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
    blocks[:, 48:56] = packed.view(np.uint8)


def drawn_blocks(qtype: Q, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks of ``qtype`` (an IQ grid type or NVFP4) for a tensor of ``values``: random
    bytes, then each block's scale (each 16-value sub-block's for NVFP4) set so that its values have
    the RMS of ``values``. The scales are linear in what gguf-py dequantizes, so one pass with unit
    scales measures each block's RMS."""
    block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = values.size // block_len
    target = float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
    blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)

    def rms(b: np.ndarray, group: int) -> np.ndarray:
        v = gguf.quants.dequantize(b, qtype).reshape(-1, group).astype(np.float64)
        r = np.sqrt(np.mean(v**2, axis=1))
        return np.where(r > 0, r, target)  # an all-zero group keeps its unit scale

    if qtype == Q.NVFP4:
        blocks[:, 0:4] = 0x38  # UE4M3 1.0 (gguf-py reads it as 0.5 with the doubled E2M1 values)
        scale = target / rms(blocks, 16) * 1.0  # the UE4M3 value that gives the target
        blocks[:, 0:4] = gguf.quants.NVFP4.fp32_to_ue4m3(scale.astype(np.float32)).reshape(n, 4)
    elif qtype == Q.IQ1_M:
        _set_iq1_m_scales(blocks, np.ones(n))
        _set_iq1_m_scales(blocks, target / rms(blocks, block_len))
    else:  # every other grid type: an f16 d first
        blocks[:, 0:2] = np.array([1.0], dtype="<f2").view(np.uint8)
        d = (target / rms(blocks, block_len)).astype("<f2")
        blocks[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    return blocks


def tensor_blocks(name: str, qtype: Q, values: np.ndarray, rng: np.random.Generator, tmp: Path) -> str:
    """The ``write-gguf --tensor`` option that writes tensor ``name`` (its f32 ``values``) as
    ``qtype``: dg's quantizer, gguf-py's, or drawn blocks (see the module documentation)."""
    if qtype in DG_QUANTIZES:
        return f"{name}={qtype.name}"
    if qtype in GGUF_PY_QUANTIZES:
        blocks = gguf.quants.quantize(values.astype(np.float32), qtype)
    else:
        blocks = drawn_blocks(qtype, values, rng)
    path = tmp / f"{name}.{qtype.name}.bin"
    path.write_bytes(np.ascontiguousarray(blocks).tobytes())
    return f"{name}={qtype.name}:{path}"


def read_dequantized(path: Path) -> dict[str, tuple[Q, np.ndarray, np.ndarray]]:
    """Every text tensor of a GGUF file by HF name: (type, raw data, gguf-py's dequantized f32 values)."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        shape = [int(d) for d in reversed(t.shape)]  # ggml ne -> row-major
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        out[name] = (t.tensor_type, np.asarray(t.data), values)
    return out


def load_values(model: torch.nn.Module, tensors: dict[str, tuple[Q, np.ndarray, np.ndarray]], drawn: set[str] = frozenset()) -> list[str]:
    """Replace the model's weights by the dequantized values; returns the cross-check failures.
    ``drawn`` names the tensors of drawn blocks (``drawn_blocks``)."""
    state = model.state_dict()
    problems, written = [], set()
    with torch.no_grad():
        for name, (qtype, raw, values) in tensors.items():
            target = state[name]
            if tuple(target.shape) != values.shape:
                raise ValueError(f"{name}: GGUF shape {values.shape}, model {tuple(target.shape)}")
            original = target.detach().numpy().astype(np.float32)
            if name in drawn:
                ratio = np.sqrt(np.mean(values.astype(np.float64) ** 2) / np.mean(original.astype(np.float64) ** 2))
                if not (np.isfinite(values).all() and 1 / MAX_DRAWN_RMS_RATIO <= ratio <= MAX_DRAWN_RMS_RATIO):
                    problems.append(f"{name}: drawn {qtype.name} blocks have {ratio:.3f} times the weights' RMS")
            elif qtype in GGUF_PY_QUANTIZES:
                ours = gguf.quants.quantize(original, qtype).reshape(-1)
                if not np.array_equal(ours, raw.reshape(-1)):
                    problems.append(f"{name}: dg's {qtype.name} blocks differ from gguf-py's")
            elif qtype in (Q.F32, Q.BF16, Q.F16):
                if not np.array_equal(values, original):
                    problems.append(f"{name}: kept as {qtype.name} but changed")
            else:
                err = np.linalg.norm(values - original) / np.linalg.norm(original)
                if err > MAX_NORMWISE.get(qtype, MAX_NORMWISE_DEFAULT):
                    problems.append(f"{name}: {qtype.name} lands {err:.3f} normwise from the weights")
            target.copy_(torch.from_numpy(values))
            written.add(target.data_ptr())
    missing = [n for n, p in model.named_parameters() if p.data_ptr() not in written]
    if missing:
        raise ValueError(f"the GGUF file lacks {missing}")
    return problems


def load_model(directory: Path, configs: Path | None = None) -> torch.nn.Module:
    """The model of a GGUF fixture directory: config.json's geometry (from ``configs``, by default the
    directory itself), gguf-py's dequantization of model.gguf."""
    from transformers import DiffusionGemmaConfig

    import model_builder as mb

    model = mb.construct_model(DiffusionGemmaConfig.from_pretrained(str(configs or directory)))
    tensors = read_dequantized(directory / "model.gguf")
    state = model.state_dict()
    written = set()
    with torch.no_grad():
        for name, (_, _, values) in tensors.items():
            state[name].copy_(torch.from_numpy(values))
            written.add(state[name].data_ptr())
    missing = [n for n, p in model.named_parameters() if p.data_ptr() not in written]
    if missing:
        raise ValueError(f"{directory / 'model.gguf'} lacks {missing}")
    return model


def type_counts(tensors: dict[str, tuple[Q, np.ndarray, np.ndarray]]) -> dict[str, int]:
    """How many tensors of each ggml type a file holds."""
    counts: dict[str, int] = {}
    for qtype, _, _ in tensors.values():
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return dict(sorted(counts.items()))


class GgufValues:
    """The oracle's ``prepare`` step for a GGUF file made by another tool from the checkpoint the
    oracle loaded (e.g. llama.cpp's converter): the model takes gguf-py's values of the file's
    tensors, with ``load_values``'s cross-checks against the checkpoint's (an F32, BF16 or F16
    tensor must hold exactly the checkpoint's values, a norm widened to F32 included)."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, model: torch.nn.Module) -> None:
        tensors = read_dequantized(self.path)
        problems = load_values(model, tensors)
        if problems:
            raise AssertionError(f"{self.path}: " + "; ".join(problems))
        print(f"  {self.path.name}: {type_counts(tensors)}, loaded through gguf-py")


class GgufQuantizer:
    """The oracle's ``prepare`` step for a GGUF preset: quantize the model, load its dequantized values.

    The bytes of the last file made are kept: they become the fixture's model.gguf (quantizing the
    dequantized weights again would not give the same blocks for the K-quants).
    """

    def __init__(self, scheme: str, bfloat16: bool, generation_config, tensors: dict[str, str] | None = None):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown gguf_scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        self.scheme, self.bfloat16, self.generation_config = scheme, bfloat16, generation_config
        self.tensors = {f"{DECODER}.{name}": Q[t] for name, t in (tensors or {}).items()}
        self.gguf_bytes = b""

    def __call__(self, model: torch.nn.Module) -> None:
        state = model.state_dict()
        drawn = {n for n, q in self.tensors.items() if q not in DG_QUANTIZES and q not in GGUF_PY_QUANTIZES}
        with tempfile.TemporaryDirectory() as tmp:
            save_hf(model, Path(tmp), self.bfloat16, self.generation_config)
            # The values the checkpoint stores (BF16-rounded for a bfloat16 one), as dg reads them.
            stored = lambda n: state[n].detach().to(torch.bfloat16 if self.bfloat16 else torch.float32).float().numpy()  # noqa: E731
            # Drawn blocks come from a generator seeded by the tensor's name: the same for any model seed.
            rng = lambda n: np.random.default_rng(zlib.crc32(n.encode()))  # noqa: E731
            options = [tensor_blocks(n, q, stored(n), rng(n), Path(tmp)) for n, q in sorted(self.tensors.items())]
            write_gguf(Path(tmp), Path(tmp) / "model.gguf", self.scheme, options)
            tensors = read_dequantized(Path(tmp) / "model.gguf")
            self.gguf_bytes = (Path(tmp) / "model.gguf").read_bytes()
        for name, qtype in self.tensors.items():
            if tensors[name][0] != qtype:
                raise AssertionError(f"{name}: the file stores {tensors[name][0].name}, the preset asks {qtype.name}")
        problems = load_values(model, tensors, drawn)
        if problems:
            raise AssertionError("; ".join(problems))

    def finish_fixture(self, out: Path, model: torch.nn.Module, check_logits) -> str:
        """Replace the fixture's safetensors by the GGUF file, and check that gguf-py's dequantization
        of it is the model the reference was computed on (``check_logits`` asserts bit equality)."""
        (out / "model.gguf").write_bytes(self.gguf_bytes)
        for f in out.glob("model.safetensors*"):
            f.unlink()
        reloaded = copy.deepcopy(model)
        tensors = read_dequantized(out / "model.gguf")
        with torch.no_grad():
            state = reloaded.state_dict()
            for p in reloaded.parameters():
                p.zero_()
            for name, (_, _, values) in tensors.items():
                state[name].copy_(torch.from_numpy(values))
        check_logits(reloaded)
        return f"model.gguf {type_counts(tensors)}; gguf-py's dequantization reproduces logits_plain"
