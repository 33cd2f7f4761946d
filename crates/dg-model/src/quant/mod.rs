//! ggml's quantized block formats (`ggml/src/ggml-quants.c`, `gguf-py/gguf/quants.py`): the
//! dequantization every reader of a GGUF file needs (every block type gguf-py dequantizes but the
//! ternary TQ1_0 and TQ2_0), and the reference quantizers `dg quantize` writes some of them with.
//!
//! Every format is one module with a `dequantize_block` (and, where dg writes the format, a
//! `quantize_block`) over one block; this module checks lengths and dispatches. Dequantization is ggml's `dequantize_row_*` with the
//! f32 operations in its order, so the values are bit-identical to ggml's and to gguf-py's
//! `gguf.quants.dequantize` (which computes the same products in the same order). Quantization
//! follows gguf-py where gguf-py can quantize (Q8_0, Q5_0; its bytes are the oracle) and ggml's C
//! reference (`quantize_row_*_ref`) for the K-quants. All arithmetic is plain f32 without fused
//! multiply-adds, as numpy computes and as ggml's C reads (a build that contracts `a * b + c`
//! into one FMA may round differently).

mod fp4;
mod iq;
mod iq_grids;
mod k_quants;
mod lanes;
mod legacy;
mod q4_k;
mod q5_0;
mod q6_k;
mod q8_0;
#[cfg(test)]
mod reference;
mod scheme;

pub use scheme::{Quantized, Scheme, quantize_tensor};

use rayon::prelude::*;

use crate::stored::StoredDtype;

/// Blocks quantized per parallel task at least (a Q4_K block takes about 4 microseconds, a Q8_0
/// block well under one).
const QUANTIZE_TASK_BLOCKS: usize = 64;

/// What can go wrong when quantizing or dequantizing a run of values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error("{dtype} is not a quantized block format")]
    NotQuantized { dtype: &'static str },
    #[error("dg reads {dtype} but does not write it (it quantizes to {})", QUANTIZABLE.map(|d| d.name()).join(", "))]
    NoQuantizer { dtype: &'static str },
    #[error("{len} {unit} are not a whole number of {dtype} blocks of {per_block} {unit}")]
    PartialBlock { dtype: &'static str, len: usize, unit: &'static str, per_block: usize },
    #[error("value {index} is {value}: {dtype} quantizes finite values only")]
    NonFinite { dtype: &'static str, index: usize, value: f32 },
}

/// The block formats [`quantize`] writes.
pub const QUANTIZABLE: [StoredDtype; 4] = [StoredDtype::Q5_0, StoredDtype::Q8_0, StoredDtype::Q4_K, StoredDtype::Q6_K];

/// `values` quantized into whole blocks of `dtype`, as ggml lays them out in a GGUF tensor.
///
/// Q8_0 and Q5_0 give gguf-py's bytes (`gguf.quants.quantize`), Q4_K ggml's
/// `quantize_row_q4_K_ref` and Q6_K `quantize_row_q6_K_ref` (the algorithms llama.cpp's
/// `llama-quantize` uses without an importance matrix).
pub fn quantize(dtype: StoredDtype, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    check_blocks(dtype, values.len(), dtype.block_len(), "values")?;
    if !QUANTIZABLE.contains(&dtype) {
        return Err(QuantError::NoQuantizer { dtype: dtype.name() });
    }
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite { dtype: dtype.name(), index, value: values[index] });
    }
    let mut out = vec![0u8; values.len() / dtype.block_len() * dtype.block_bytes()];
    match dtype {
        StoredDtype::Q8_0 => quantize_blocks(values, &mut out, q8_0::quantize_block),
        StoredDtype::Q5_0 => quantize_blocks(values, &mut out, q5_0::quantize_block),
        StoredDtype::Q4_K => quantize_blocks(values, &mut out, q4_k::quantize_block),
        StoredDtype::Q6_K => quantize_blocks(values, &mut out, q6_k::quantize_block),
        _ => unreachable!("{} is not in QUANTIZABLE", dtype.name()),
    }
    Ok(out)
}

/// `bytes` (whole blocks of `dtype`) dequantized to f32, exactly as ggml's `dequantize_row_*`.
pub fn dequantize_bytes(dtype: StoredDtype, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    check_blocks(dtype, bytes.len(), dtype.block_bytes(), "bytes")?;
    let mut out = vec![0f32; bytes.len() / dtype.block_bytes() * dtype.block_len()];
    dequantize(dtype, bytes, &mut out);
    Ok(out)
}

/// `bytes` (whole blocks of `dtype`) dequantized into `out` (as many elements as they hold).
///
/// # Panics
/// When `dtype` is not quantized or the lengths disagree: callers hold whole blocks
/// ([`crate::StoredTensor::widen_range`] checks, [`dequantize_bytes`] returns an error).
pub(crate) fn dequantize(dtype: StoredDtype, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(Some(bytes.len()), dtype.bytes_for(out.len()), "{} {} bytes for {} values", bytes.len(), dtype.name(), out.len());
    use StoredDtype::*;
    match dtype {
        Q4_0 => dequantize_blocks(bytes, out, legacy::q4_0::dequantize_block),
        Q4_1 => dequantize_blocks(bytes, out, legacy::q4_1::dequantize_block),
        Q5_0 => dequantize_blocks(bytes, out, q5_0::dequantize_block),
        Q5_1 => dequantize_blocks(bytes, out, legacy::q5_1::dequantize_block),
        Q8_0 => dequantize_blocks(bytes, out, q8_0::dequantize_block),
        Q2_K => dequantize_blocks(bytes, out, k_quants::q2_k::dequantize_block),
        Q3_K => dequantize_blocks(bytes, out, k_quants::q3_k::dequantize_block),
        Q4_K => dequantize_blocks(bytes, out, q4_k::dequantize_block),
        Q5_K => dequantize_blocks(bytes, out, k_quants::q5_k::dequantize_block),
        Q6_K => dequantize_blocks(bytes, out, q6_k::dequantize_block),
        IQ2_XXS => dequantize_blocks(bytes, out, iq::iq2_xxs::dequantize_block),
        IQ2_XS => dequantize_blocks(bytes, out, iq::iq2_xs::dequantize_block),
        IQ2_S => dequantize_blocks(bytes, out, iq::iq2_s::dequantize_block),
        IQ3_XXS => dequantize_blocks(bytes, out, iq::iq3_xxs::dequantize_block),
        IQ3_S => dequantize_blocks(bytes, out, iq::iq3_s::dequantize_block),
        IQ1_S => dequantize_blocks(bytes, out, iq::iq1_s::dequantize_block),
        IQ1_M => dequantize_blocks(bytes, out, iq::iq1_m::dequantize_block),
        IQ4_NL => dequantize_blocks(bytes, out, iq::iq4_nl::dequantize_block),
        IQ4_XS => dequantize_blocks(bytes, out, iq::iq4_xs::dequantize_block),
        MXFP4 => dequantize_blocks(bytes, out, fp4::mxfp4::dequantize_block),
        NVFP4 => dequantize_blocks(bytes, out, fp4::nvfp4::dequantize_block),
        F32 | F16 | BF16 => panic!("{} is not a quantized block format", dtype.name()),
    }
}

fn check_blocks(dtype: StoredDtype, len: usize, per_block: usize, unit: &'static str) -> Result<(), QuantError> {
    if !dtype.is_quantized() {
        return Err(QuantError::NotQuantized { dtype: dtype.name() });
    }
    if !len.is_multiple_of(per_block) {
        return Err(QuantError::PartialBlock { dtype: dtype.name(), len, unit, per_block });
    }
    Ok(())
}

/// Every block of `bytes` through `block`. The block function's sizes are checked against the
/// lengths (whole blocks of `dtype`'s sizes, which the caller checked), so a module whose sizes
/// disagree with [`StoredDtype`] fails here, in every build.
fn dequantize_blocks<const BYTES: usize, const LEN: usize>(bytes: &[u8], out: &mut [f32], block: fn(&[u8; BYTES], &mut [f32; LEN])) {
    let (blocks, rest) = bytes.as_chunks::<BYTES>();
    let (outs, out_rest) = out.as_chunks_mut::<LEN>();
    assert!(rest.is_empty() && out_rest.is_empty() && blocks.len() == outs.len(), "blocks of {BYTES} bytes and {LEN} values");
    for (b, o) in blocks.iter().zip(outs) {
        block(b, o);
    }
}

/// Blocks are independent, so they are quantized in parallel (the bytes do not depend on the
/// thread count): Q4_K's grid search, the slowest, quantizes about 60 million values a second per
/// core with AVX2 (see BENCHMARKS.md).
fn quantize_blocks<const BYTES: usize, const LEN: usize>(values: &[f32], out: &mut [u8], block: fn(&[f32; LEN]) -> [u8; BYTES]) {
    let (blocks, rest) = values.as_chunks::<LEN>();
    let (outs, out_rest) = out.as_chunks_mut::<BYTES>();
    debug_assert!(rest.is_empty() && out_rest.is_empty() && blocks.len() == outs.len());
    outs.par_iter_mut().zip(blocks.par_iter()).with_min_len(QUANTIZE_TASK_BLOCKS).for_each(|(o, b)| *o = block(b));
}

/// The little-endian f16 at `bytes[at..at + 2]`, widened (exactly) to f32.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// `v` rounded to the nearest f16 (ties to even, overflow to infinity), little-endian: ggml's
/// `GGML_FP32_TO_FP16` and numpy's `astype(np.float16)`.
fn f16_le(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// `v` through f16 and back, as ggml reads back a scale it has just stored.
fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// ggml's `nearest_int`: round to nearest (ties to even) by adding 1.5 * 2^23 and reading the
/// mantissa. ggml asserts |v| <= 4194303 in debug builds only; outside that range this gives the
/// same bits as ggml's release build, so the quantizers stay identical even there.
fn nearest_int(v: f32) -> i32 {
    let biased = v + 12_582_912.0;
    (biased.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The byte numpy's `astype(np.int8)` / `astype(np.uint8)` keeps of an f32 on x86-64: a truncating
/// conversion to i32 (`cvttss2si`, which gives `i32::MIN` for NaN and out-of-range values) and its
/// low byte. Only NaN and infinite products reach the out-of-range case (a block whose scale's
/// reciprocal overflows f32, which then stores a zero f16 scale), so the bytes differ from other
/// platforms' numpy only there, and never in value.
fn numpy_int_byte(v: f32) -> u8 {
    const LIMIT: f32 = 2_147_483_648.0; // 2^31
    let i = if v.is_nan() || !(-LIMIT..LIMIT).contains(&v) { i32::MIN } else { v as i32 };
    i as u8
}

/// Bytes as lowercase hex, for tests that spell out expected blocks.
#[cfg(test)]
fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` standard normal values from a fixed seed (xorshift64 and Box-Muller), for round trips.
#[cfg(test)]
fn gaussian(n: usize, mut seed: u64) -> Vec<f32> {
    let mut uniform = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos()) as f32).collect()
}

/// Per-block root-mean-square error of `got` against `want`, relative to the block's RMS; the worst block.
#[cfg(test)]
fn worst_relative_rms(want: &[f32], got: &[f32], block: usize) -> f32 {
    let rms = |v: &mut dyn Iterator<Item = f32>| (v.map(|e| e * e).sum::<f32>() / block as f32).sqrt();
    want.chunks(block)
        .zip(got.chunks(block))
        .map(|(w, g)| rms(&mut w.iter().zip(g).map(|(a, b)| a - b)) / rms(&mut w.iter().copied()))
        .fold(0.0, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even_like_ggml() {
        assert_eq!([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, -7.6].map(nearest_int), [0, 2, 2, 0, -2, 2, -8]);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(f32::NAN), 0);
        assert_eq!(nearest_int(f32::INFINITY), -0x0040_0000);
    }

    #[test]
    fn numpy_casts_keep_the_low_byte_of_a_truncated_i32() {
        assert_eq!([200.0, -200.0, 300.5, -1.9, 31.99].map(numpy_int_byte), [200, 56, 44, 255, 31]);
        assert_eq!([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e10, -1e10].map(numpy_int_byte), [0; 5]);
    }

    #[test]
    fn lengths_and_dtypes_are_checked() {
        assert_eq!(quantize(StoredDtype::F16, &[0.0; 32]), Err(QuantError::NotQuantized { dtype: "F16" }));
        let e = quantize(StoredDtype::Q4_K, &[0.0; 32]).unwrap_err();
        assert_eq!(e, QuantError::PartialBlock { dtype: "Q4_K", len: 32, unit: "values", per_block: 256 });
        assert_eq!(e.to_string(), "32 values are not a whole number of Q4_K blocks of 256 values");
        let e = dequantize_bytes(StoredDtype::Q8_0, &[0; 35]).unwrap_err();
        assert_eq!(e, QuantError::PartialBlock { dtype: "Q8_0", len: 35, unit: "bytes", per_block: 34 });
        let mut x = [1.0f32; 64];
        x[40] = f32::NAN;
        assert!(matches!(quantize(StoredDtype::Q5_0, &x), Err(QuantError::NonFinite { index: 40, .. })));
        assert_eq!(quantize(StoredDtype::Q6_K, &[]), Ok(vec![]));
    }

    #[test]
    fn formats_dg_does_not_write_are_refused_by_name() {
        for dtype in StoredDtype::ALL.into_iter().filter(|d| d.is_quantized() && !QUANTIZABLE.contains(d)) {
            let e = quantize(dtype, &vec![0.0; dtype.block_len()]).unwrap_err();
            assert_eq!(e, QuantError::NoQuantizer { dtype: dtype.name() });
            assert!(e.to_string().starts_with(&format!("dg reads {} but does not write it", dtype.name())), "{e}");
        }
    }

    #[test]
    fn every_format_round_trips_zeros_and_agrees_with_the_stored_tensor() {
        for dtype in QUANTIZABLE {
            let n = 2 * dtype.block_len();
            let bytes = quantize(dtype, &vec![0.0; n]).unwrap();
            assert_eq!(bytes.len(), dtype.bytes_for(n).unwrap(), "{}", dtype.name());
            assert_eq!(dequantize_bytes(dtype, &bytes).unwrap(), vec![0.0; n], "{}", dtype.name());
            let ramp: Vec<f32> = (0..n).map(|i| (i as f32 - 100.0) * 0.03).collect();
            let bytes = quantize(dtype, &ramp).unwrap();
            let t = crate::StoredTensor::from_bytes(dtype, vec![2, dtype.block_len()], &bytes[..]);
            assert_eq!(t.to_f32(), dequantize_bytes(dtype, &bytes).unwrap(), "{}", dtype.name());
        }
    }
}
