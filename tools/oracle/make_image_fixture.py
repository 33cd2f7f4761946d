"""The image processor's oracle fixture: transformers' Gemma 4 processor on committed test images.

Makes (first run, or --images) a handful of small test images of different sizes, aspect ratios,
modes and formats under fixtures/image-processor/, then records what transformers does with each:
`load_image` (EXIF orientation applied) + `Gemma4ImageProcessorPil` (bicubic resize to the budget,
rescale, patchify) at several soft-token budgets. processor.json (not reference.json: these are no model fixture) holds, per image: the decoded size
and a strided sample of its RGB bytes; per budget: the resized size, the soft-token count, the real
(unpadded) patch count, the f64 sum and sum of squares of the real patches' pixel values and a
strided sample of them. The padding rows are checked here to be zero with position (-1, -1).

    python tools/oracle/make_image_fixture.py [--images] [--out fixtures/image-processor]
"""

import argparse
import io
import json
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image
from transformers.image_utils import load_image
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

BUDGETS = (70, 280, 1120)
SAMPLE = 64  # values per strided sample


def blocks(rng, height, width, block, channels=3):
    """Random colour blocks with a gradient: structure for the resize, small once compressed."""
    grid = rng.integers(0, 256, size=(height // block + 1, width // block + 1, channels))
    img = np.repeat(np.repeat(grid, block, 0), block, 1)[:height, :width].astype(np.float64)
    ramp = np.linspace(-40, 40, width)[None, :, None]
    return np.clip(img + ramp, 0, 255).astype(np.uint8)


def make_images(out: Path):
    rng = np.random.default_rng(61)
    Image.fromarray(blocks(rng, 41, 97, 3)).save(out / "wide.png")
    Image.fromarray(blocks(rng, 330, 200, 10)).save(out / "tall.png")
    Image.fromarray(blocks(rng, 700, 900, 50)).save(out / "big.png")
    Image.fromarray(blocks(rng, 500, 2, 1)).save(out / "strip.png")
    Image.fromarray(blocks(rng, 60, 60, 4, channels=4), mode="RGBA").save(out / "rgba.png")
    Image.fromarray(blocks(rng, 70, 33, 5, channels=1)[..., 0], mode="L").save(out / "grey.png")
    Image.fromarray(blocks(rng, 100, 150, 6)).save(out / "lossless.webp", lossless=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    Image.fromarray(blocks(rng, 48, 64, 8)).save(out / "rotated.jpg", quality=92, exif=exif.tobytes())


def strided(values: np.ndarray):
    flat = values.reshape(-1)
    step = max(1, flat.size // SAMPLE)
    idx = np.arange(0, flat.size, step)[:SAMPLE]
    return {"stride": int(step), "values": [v.item() for v in flat[idx]]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fixtures/image-processor")
    ap.add_argument("--images", action="store_true", help="(re)make the test images first")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.images or not any(out.glob("*.png")):
        make_images(out)

    records = []
    for path in sorted(p for p in out.iterdir() if p.suffix in (".png", ".jpg", ".webp")):
        image = load_image(str(path))
        decoded = np.array(image.convert("RGB"))
        record = {"file": path.name, "height": decoded.shape[0], "width": decoded.shape[1], "decoded": strided(decoded), "budgets": []}
        for budget in BUDGETS:
            proc = Gemma4ImageProcessorPil(max_soft_tokens=budget)
            res = proc(images=[image], return_tensors="np")
            pixels, positions = res["pixel_values"][0], res["image_position_ids"][0]
            real = int((positions[:, 0] >= 0).sum())
            assert (pixels[real:] == 0).all() and (positions[real:] == -1).all()
            patch_w = int(positions[:real, 0].max()) + 1
            patch_h = int(positions[:real, 1].max()) + 1
            values = pixels[:real].astype(np.float64)
            record["budgets"].append({
                "max_soft_tokens": budget,
                "height": patch_h * proc.patch_size,
                "width": patch_w * proc.patch_size,
                "num_soft_tokens": int(res["num_soft_tokens_per_image"][0]),
                "num_patches": real,
                "sum": float(values.sum()),
                "sum_sq": float((values**2).sum()),
                "sample": strided(pixels[:real]),
                "positions_head": positions[:4].tolist(),
            })
        records.append(record)
    meta = {"transformers": transformers.__version__, "pillow": PIL.__version__, "processor": "Gemma4ImageProcessorPil", "images": records}
    (out / "processor.json").write_text(json.dumps(meta) + "\n")
    print(f"wrote {out / 'processor.json'} for {len(records)} images")


if __name__ == "__main__":
    main()
