//! dg's ggml block formats against gguf-py (`gguf.quants`), on the vectors
//! `tools/gguf_vectors/make_vectors.py` writes to `tests/data/quant/` (or to the directory named by
//! `DG_QUANT_VECTORS`, which its `--check` mode sets): dequantization of random blocks with extreme
//! scales bit for bit, and Q8_0/Q5_0 quantization byte for byte.
//!
//! NaN outputs (from NaN scales, and from infinite scales times a zero quant) must be NaN; their
//! bits are compared only on x86-64, where the vectors are made: the sign and payload of a NaN an
//! operation produces are the platform's (x86's default NaN is negative, AArch64's positive).

use std::path::PathBuf;

use dg_model::{StoredDtype, StoredTensor, dequantize_bytes, quantize};

/// Mismatches printed before a test gives up.
const SHOWN: usize = 8;

fn dir() -> PathBuf {
    match std::env::var_os("DG_QUANT_VECTORS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant"),
    }
}

fn read(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (regenerate with tools/gguf_vectors/make_vectors.py)", path.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    let bytes = read(name);
    assert_eq!(bytes.len() % 4, 0, "{name}: {} bytes is not whole f32s", bytes.len());
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn stem(dtype: StoredDtype) -> String {
    dtype.name().to_lowercase()
}

/// Whether `got` is the value gguf-py computed (bits, or NaN for NaN off x86-64).
fn same_value(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits() || (!cfg!(target_arch = "x86_64") && got.is_nan() && want.is_nan())
}

fn check_dequantization(dtype: StoredDtype) {
    let (blocks, want) = (read(&format!("{}_blocks.bin", stem(dtype))), read_f32(&format!("{}_dequantized.f32", stem(dtype))));
    let n_blocks = blocks.len() / dtype.block_bytes();
    assert!(n_blocks > 0 && blocks.len() % dtype.block_bytes() == 0, "{}: {} bytes of blocks", dtype.name(), blocks.len());
    assert_eq!(want.len(), n_blocks * dtype.block_len(), "{}: {} dequantized values for {n_blocks} blocks", dtype.name(), want.len());

    let got = dequantize_bytes(dtype, &blocks).unwrap();
    let bad: Vec<usize> = (0..want.len()).filter(|&i| !same_value(got[i], want[i])).collect();
    let shown: Vec<String> = bad
        .iter()
        .take(SHOWN)
        .map(|&i| {
            let b = i / dtype.block_len();
            let block = &blocks[b * dtype.block_bytes()..(b + 1) * dtype.block_bytes()];
            format!(
                "block {b} value {}: dg {:#010x} ({}), gguf-py {:#010x} ({}); block {block:02x?}",
                i % dtype.block_len(),
                got[i].to_bits(),
                got[i],
                want[i].to_bits(),
                want[i]
            )
        })
        .collect();
    assert!(bad.is_empty(), "{}: {} of {} values differ from gguf-py:\n{}", dtype.name(), bad.len(), want.len(), shown.join("\n"));
    assert!(
        want.iter().any(|v| v.is_nan()) && want.iter().any(|v| v.is_infinite()),
        "{}: the vectors reach no NaN or infinity",
        dtype.name()
    );

    // The tensor path (parallel chunks through StoredTensor::widen_range) gives the same values.
    let t = StoredTensor::from_bytes(dtype, vec![n_blocks, dtype.block_len()], &blocks[..]);
    let widened = t.to_f32();
    assert!(widened.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{}: to_f32 differs from dequantize_bytes", dtype.name());
}

fn check_quantization(dtype: StoredDtype) {
    let x = read_f32("quantize_input.f32");
    let want = read(&format!("{}_quantized.bin", stem(dtype)));
    assert_eq!(want.len(), dtype.bytes_for(x.len()).unwrap(), "{}: {} quantized bytes for {} inputs", dtype.name(), want.len(), x.len());
    let got = quantize(dtype, &x).unwrap();
    let bb = dtype.block_bytes();
    let bad: Vec<usize> = (0..want.len() / bb).filter(|&b| got[b * bb..(b + 1) * bb] != want[b * bb..(b + 1) * bb]).collect();
    let shown: Vec<String> = bad
        .iter()
        .take(SHOWN)
        .map(|&b| {
            let r = b * bb..(b + 1) * bb;
            format!("block {b}: input {:?}\n  dg      {:02x?}\n  gguf-py {:02x?}", &x[b * 32..(b + 1) * 32], &got[r.clone()], &want[r])
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{}: {} of {} blocks differ from gguf-py's quantization:\n{}",
        dtype.name(),
        bad.len(),
        want.len() / bb,
        shown.join("\n")
    );
}

#[test]
fn q8_0_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q8_0);
}

#[test]
fn q5_0_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q5_0);
}

#[test]
fn q4_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q4_K);
}

#[test]
fn q6_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q6_K);
}

#[test]
fn q8_0_quantizes_as_gguf_py() {
    check_quantization(StoredDtype::Q8_0);
}

#[test]
fn q5_0_quantizes_as_gguf_py() {
    check_quantization(StoredDtype::Q5_0);
}
