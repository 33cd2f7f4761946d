"""Vision projector (mmproj) files of the vision-encoder fixture, written by llama.cpp's own converter.

llama.cpp keeps a Gemma 4 model's vision tower in a separate GGUF (`mmproj-*.gguf`, projector type
`gemma4v`), written by `convert_hf_to_gguf.py --mmproj` for `Gemma4ForConditionalGeneration`
checkpoints (class `Gemma4VisionAudioModel`). Its DiffusionGemma converter drops the tower, so this
makes the file llama.cpp would make for the same tower: the fixture's vision tensors renamed to
Gemma 4's (`model.encoder.vision_tower.*` -> `model.vision_tower.*`, `model.encoder.embed_vision.*`
-> `model.embed_vision.*`), its config with Gemma 4's architecture, a processor config without
normalisation (Gemma 4's: mean 0, std 1), then the converter run unchanged, once with
`--outtype f32` and once with `--outtype f16`.

Writes fixtures/vision-encoder/mmproj-f32.gguf and mmproj-f16.gguf, and (`--out
fixtures/vision-generate --outtypes f32`: its BF16 checkpoint widened exactly)
fixtures/vision-generate/mmproj-f32.gguf. Needs a llama.cpp checkout (the
converter and its gguf-py; nothing of it is committed) and torch:

    python tools/oracle/make_mmproj_fixture.py --llama-cpp PATH/TO/llama.cpp [--out fixtures/vision-encoder]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

RENAMES = [("model.encoder.vision_tower.", "model.vision_tower."), ("model.encoder.embed_vision.", "model.embed_vision.")]


def gemma4_checkpoint(fixture: Path, out: Path) -> None:
    config = json.loads((fixture / "config.json").read_text())
    config["architectures"] = ["Gemma4ForConditionalGeneration"]
    config["model_type"] = "gemma4"
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "processor_config.json").write_text(
        json.dumps({"image_processor": {"image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0]}})
    )
    tensors = {}
    for name, value in load_file(str(fixture / "model.safetensors")).items():
        for old, new in RENAMES:
            if name.startswith(old):
                tensors[new + name[len(old):]] = value
    save_file(tensors, str(out / "model.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, type=Path, help="a llama.cpp checkout (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--out", type=Path, default=Path("fixtures/vision-encoder"))
    ap.add_argument("--outtypes", nargs="+", default=["f32", "f16"], choices=["f32", "f16"])
    args = ap.parse_args()
    converter = args.llama_cpp / "convert_hf_to_gguf.py"
    env = {**os.environ, "PYTHONPATH": str(args.llama_cpp / "gguf-py")}
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        gemma4_checkpoint(args.out, hf)
        for outtype in args.outtypes:
            target = (args.out / f"mmproj-{outtype}.gguf").resolve()
            cmd = [sys.executable, str(converter), str(hf), "--mmproj", "--outtype", outtype, "--outfile", str(target)]
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            print(f"wrote {target.name} ({target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
