//! Pillow's bicubic resize of an 8-bit image (`Image.resize(size, BICUBIC)`, libImaging `Resample.c`),
//! reproduced bit for bit: the cubic kernel with a = -0.5 widened by the downscale factor, weights
//! normalised then rounded to 22-bit fixed point, a horizontal pass into an 8-bit image, then a
//! vertical pass, each output rounded half-up and clamped to 0..=255.

use crate::RgbImage;

/// libImaging's `PRECISION_BITS` (32 - 8 - 2): the fixed-point fraction of the weights.
const PRECISION_BITS: u32 = 22;
/// The bicubic kernel's support in source pixels at scale 1.
const BICUBIC_SUPPORT: f64 = 2.0;

fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output index: the first source index and the fixed-point weights of the sources from it.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

/// libImaging's `precompute_coeffs` + `normalize_coeffs_8bpc` for the box `0..in_size`.
fn taps(in_size: usize, out_size: usize) -> Taps {
    let scale = in_size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = BICUBIC_SUPPORT * filter_scale;
    let (mut first, mut weights) = (Vec::with_capacity(out_size), Vec::with_capacity(out_size));
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // C's `(int)` truncates toward zero; a negative start is then clamped to 0.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let w: Vec<f64> = (xmin..xmax).map(|x| bicubic((x as f64 - center + 0.5) / filter_scale)).collect();
        let total: f64 = w.iter().sum();
        let unit = f64::from(1u32 << PRECISION_BITS);
        let fixed = w
            .iter()
            .map(|&v| {
                let v = if total != 0.0 { v / total } else { v };
                if v < 0.0 { (-0.5 + v * unit) as i32 } else { (0.5 + v * unit) as i32 }
            })
            .collect();
        first.push(xmin);
        weights.push(fixed);
    }
    Taps { first, weights }
}

/// libImaging's `clip8`: the rounded fixed-point sum to a byte.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes an RGB image to `width` x `height` exactly as Pillow's bicubic filter does.
pub fn resize_bicubic(image: &RgbImage, width: usize, height: usize) -> RgbImage {
    let half = 1i64 << (PRECISION_BITS - 1);
    let mut current = image.clone();
    if width != image.width {
        let taps = taps(image.width, width);
        let mut pixels = vec![0u8; width * image.height * 3];
        for y in 0..image.height {
            let row = &image.pixels[y * image.width * 3..(y + 1) * image.width * 3];
            for (xx, (&x0, w)) in taps.first.iter().zip(&taps.weights).enumerate() {
                for c in 0..3 {
                    let sum = w.iter().enumerate().map(|(i, &k)| i64::from(row[(x0 + i) * 3 + c]) * i64::from(k)).sum::<i64>();
                    pixels[(y * width + xx) * 3 + c] = clip8(half + sum);
                }
            }
        }
        current = RgbImage { width, height: image.height, pixels };
    }
    if height != current.height {
        let taps = taps(current.height, height);
        let stride = current.width * 3;
        let mut pixels = vec![0u8; stride * height];
        for (yy, (&y0, w)) in taps.first.iter().zip(&taps.weights).enumerate() {
            for i in 0..stride {
                let sum = w.iter().enumerate().map(|(j, &k)| i64::from(current.pixels[(y0 + j) * stride + i]) * i64::from(k)).sum::<i64>();
                pixels[yy * stride + i] = clip8(half + sum);
            }
        }
        current = RgbImage { width: current.width, height, pixels };
    }
    current
}
