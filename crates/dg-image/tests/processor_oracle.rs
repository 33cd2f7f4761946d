//! The image processor against transformers' (`Gemma4ImageProcessorPil` after `load_image`) on the
//! committed test images of fixtures/image-processor (made by tools/oracle/make_image_fixture.py).

use anyhow::{Context, Result, ensure};
use dg_image::{DecodeLimits, ImageError, ImageProcessor, decode};
use serde_json::Value;
use std::path::PathBuf;

/// PNG and lossless WebP decode to the same bytes everywhere, and the resize reproduces Pillow's
/// fixed-point arithmetic, so their pixel values must match exactly.
const LOSSLESS_TOLERANCE: f64 = 0.0;
/// Pillow decodes JPEG with libjpeg-turbo and the `image` crate with zune-jpeg: their IDCT and chroma
/// upsampling round differently: up to 3 levels of 255 at colour edges on the test image (one level
/// of margin here), and a resize carries those differences on.
const JPEG_TOLERANCE: f64 = 4.0 / 255.0;
/// Relative tolerance on the f64 sums over all patches (the sums see every value, the samples a few).
/// numpy's pairwise sum is good to about log2(n)·ε ≈ 1e-14 and ours is compensated, while one value
/// off by a level of 255 moves the largest sum by over 1e-9.
const SUM_REL_TOLERANCE_LOSSLESS: f64 = 1e-12;
const SUM_REL_TOLERANCE_JPEG: f64 = 5e-3;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/image-processor")
}

/// The sampled values; transformers' are f32 written as f64 decimals, read back to their f32
/// (serde_json's decimal parse may be an ulp off in f64, never in f32).
fn sample(values: &[f64], spec: &Value) -> Vec<(usize, f64, f64)> {
    let stride = spec["stride"].as_u64().unwrap() as usize;
    spec["values"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| (i * stride, values[i * stride], f64::from(v.as_f64().unwrap() as f32)))
        .collect()
}

fn check_sample(what: &str, values: &[f64], spec: &Value, tolerance: f64) -> Result<()> {
    for (index, ours, theirs) in sample(values, spec) {
        ensure!((ours - theirs).abs() <= tolerance, "{what}: value {index}: dg {ours} vs transformers {theirs} (tolerance {tolerance})");
    }
    Ok(())
}

/// Neumaier's compensated sum.
fn sum(values: impl Iterator<Item = f64>) -> f64 {
    let (mut total, mut carry) = (0.0f64, 0.0f64);
    for v in values {
        let t = total + v;
        carry += if total.abs() >= v.abs() { (total - t) + v } else { (v - t) + total };
        total = t;
    }
    total + carry
}

fn check_sum(what: &str, ours: f64, theirs: f64, rel: f64) -> Result<()> {
    ensure!((ours - theirs).abs() <= rel * theirs.abs().max(1.0), "{what}: dg {ours} vs transformers {theirs}");
    Ok(())
}

#[test]
fn processor_matches_transformers_on_every_test_image_and_budget() -> Result<()> {
    let dir = fixture_dir();
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("processor.json"))?)?;
    let images = reference["images"].as_array().context("images")?;
    ensure!(images.len() >= 8, "the fixture lost images");
    for record in images {
        let file = record["file"].as_str().unwrap();
        let jpeg = file.ends_with(".jpg");
        let (tolerance, sum_rel) =
            if jpeg { (JPEG_TOLERANCE, SUM_REL_TOLERANCE_JPEG) } else { (LOSSLESS_TOLERANCE, SUM_REL_TOLERANCE_LOSSLESS) };
        let image = decode(&std::fs::read(dir.join(file))?, DecodeLimits::default()).with_context(|| file.to_string())?;
        ensure!(
            (image.height, image.width) == (record["height"].as_u64().unwrap() as usize, record["width"].as_u64().unwrap() as usize),
            "{file}: decoded {}x{}",
            image.height,
            image.width
        );
        let bytes: Vec<f64> = image.pixels.iter().map(|&b| f64::from(b)).collect();
        check_sample(&format!("{file} decoded"), &bytes, &record["decoded"], tolerance * 255.0)?;
        for budget in record["budgets"].as_array().unwrap() {
            let max_soft_tokens = budget["max_soft_tokens"].as_u64().unwrap() as usize;
            let what = format!("{file} at {max_soft_tokens} soft tokens");
            let out = ImageProcessor::default().with_budget(max_soft_tokens)?.process(&image)?;
            let expect = |key: &str| budget[key].as_u64().unwrap() as usize;
            ensure!((out.height, out.width) == (expect("height"), expect("width")), "{what}: resized to {}x{}", out.height, out.width);
            ensure!(
                out.num_soft_tokens == expect("num_soft_tokens") && out.num_patches() == expect("num_patches"),
                "{what}: {} soft tokens, {} patches",
                out.num_soft_tokens,
                out.num_patches()
            );
            let head: Vec<[u32; 2]> = serde_json::from_value(budget["positions_head"].clone())?;
            ensure!(out.positions[..4] == head[..], "{what}: positions {:?} vs {head:?}", &out.positions[..4]);
            let values: Vec<f64> = out.pixel_values.iter().map(|&v| f64::from(v)).collect();
            check_sample(&what, &values, &budget["sample"], tolerance)?;
            check_sum(&format!("{what}: sum"), sum(values.iter().copied()), budget["sum"].as_f64().unwrap(), sum_rel)?;
            check_sum(&format!("{what}: sum of squares"), sum(values.iter().map(|v| v * v)), budget["sum_sq"].as_f64().unwrap(), sum_rel)?;
        }
    }
    Ok(())
}

#[test]
fn bad_images_are_clear_errors() {
    let png = std::fs::read(fixture_dir().join("wide.png")).unwrap();
    let truncated = decode(&png[..png.len() / 2], DecodeLimits::default()).unwrap_err();
    assert!(matches!(truncated, ImageError::Decode { .. }), "{truncated}");
    let text = decode(b"definitely not an image", DecodeLimits::default()).unwrap_err();
    assert!(matches!(text, ImageError::UnknownFormat), "{text}");
    let gif = decode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", DecodeLimits::default()).unwrap_err();
    assert!(matches!(gif, ImageError::UnsupportedFormat { .. }), "{gif}");
    let big = decode(&png, DecodeLimits { max_pixels: 97 * 41 - 1 }).unwrap_err();
    assert!(big.to_string().contains("97x41"), "{big}");
    let budget = ImageProcessor::default().with_budget(300).unwrap_err();
    assert!(budget.to_string().contains("300"), "{budget}");
}
