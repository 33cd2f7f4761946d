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

The fixture directory then holds ``model.gguf`` (written again from the saved fixture checkpoint,
then the safetensors file is removed) beside config.json, generation_config.json and the reference
files; reloading ``model.gguf`` through gguf-py must reproduce ``logits_plain`` bit for bit.
"""

from __future__ import annotations

import copy
import os
import subprocess
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[2]
DECODER = "model.decoder"
ENCODER = "model.encoder.language_model"
SCHEMES = ("q8_0", "q4_k_m")

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

# Types gguf-py quantizes itself (ggml's reference quantizers); dg's blocks must equal its bytes.
GGUF_PY_QUANTIZES = (Q.Q8_0, Q.Q5_0)
# The K-quants are checked only for being a plausible encoding of the weights: normwise distance
# from the unquantized tensor (Q4_K's 4 bits land around 0.1 on Gaussian weights).
MAX_KQUANT_NORMWISE = 0.2


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


def write_gguf(model_dir: Path, out: Path, scheme: str) -> None:
    """dg's quantizer: ``xtask write-gguf --scheme`` over an HF model directory (``DG_XTASK`` may name
    a built xtask binary; by default cargo builds and runs it)."""
    xtask = os.environ.get("DG_XTASK")
    cmd = [xtask] if xtask else ["cargo", "run", "-q", "-p", "xtask", "--"]
    args = ["write-gguf", "--model", str(model_dir), "--out", str(out), "--scheme", scheme]
    subprocess.run([*cmd, *args], cwd=ROOT, check=True)


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


def load_values(model: torch.nn.Module, tensors: dict[str, tuple[Q, np.ndarray, np.ndarray]]) -> list[str]:
    """Replace the model's weights by the dequantized values; returns the cross-check failures."""
    state = model.state_dict()
    problems, written = [], set()
    with torch.no_grad():
        for name, (qtype, raw, values) in tensors.items():
            target = state[name]
            if tuple(target.shape) != values.shape:
                raise ValueError(f"{name}: GGUF shape {values.shape}, model {tuple(target.shape)}")
            original = target.detach().numpy().astype(np.float32)
            if qtype in GGUF_PY_QUANTIZES:
                ours = gguf.quants.quantize(original, qtype).reshape(-1)
                if not np.array_equal(ours, raw.reshape(-1)):
                    problems.append(f"{name}: dg's {qtype.name} blocks differ from gguf-py's")
            elif qtype in (Q.F32, Q.BF16, Q.F16):
                if not np.array_equal(values, original):
                    problems.append(f"{name}: kept as {qtype.name} but changed")
            else:
                err = np.linalg.norm(values - original) / np.linalg.norm(original)
                if err > MAX_KQUANT_NORMWISE:
                    problems.append(f"{name}: {qtype.name} lands {err:.3f} normwise from the weights")
            target.copy_(torch.from_numpy(values))
            written.add(target.data_ptr())
    missing = [n for n, p in model.named_parameters() if p.data_ptr() not in written]
    if missing:
        raise ValueError(f"the GGUF file lacks {missing}")
    return problems


def load_model(directory: Path) -> torch.nn.Module:
    """The model of a GGUF fixture directory: config.json's geometry, gguf-py's dequantization of model.gguf."""
    from transformers import DiffusionGemmaConfig

    import model_builder as mb

    model = mb.construct_model(DiffusionGemmaConfig.from_pretrained(str(directory)))
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


class GgufQuantizer:
    """The oracle's ``prepare`` step for a GGUF preset: quantize the model, load its dequantized values.

    The bytes of the last file made are kept: they become the fixture's model.gguf (quantizing the
    dequantized weights again would not give the same blocks for the K-quants).
    """

    def __init__(self, scheme: str, bfloat16: bool, generation_config):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown gguf_scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        self.scheme, self.bfloat16, self.generation_config = scheme, bfloat16, generation_config
        self.gguf_bytes = b""

    def __call__(self, model: torch.nn.Module) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            save_hf(model, Path(tmp), self.bfloat16, self.generation_config)
            write_gguf(Path(tmp), Path(tmp) / "model.gguf", self.scheme)
            tensors = read_dequantized(Path(tmp) / "model.gguf")
            self.gguf_bytes = (Path(tmp) / "model.gguf").read_bytes()
        problems = load_values(model, tensors)
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
