//! dg's ggml block formats against gguf-py (`gguf.quants`), on the vectors
//! `tools/gguf_vectors/make_vectors.py` writes to `tests/data/quant/` (or to the directory named by
//! `DG_QUANT_VECTORS`, which its `--check` mode sets): dequantization of random blocks with extreme
//! scales bit for bit for every block type dg reads, and Q8_0/Q5_0 quantization byte for byte.
//!
//! `ggml_types.txt` (gguf-py's type table) holds [`StoredDtype`]'s ggml ids and block sizes to
//! gguf-py's, and its list of types dg reads to every type gguf-py dequantizes but TQ1_0 and TQ2_0.
//!
//! NaN outputs (from NaN scales, and from infinite scales times a zero quant) must be NaN; their
//! bits are compared only on x86-64, where the vectors are made: the sign and payload of a NaN an
//! operation produces are the platform's (x86's default NaN is negative, AArch64's positive). Where
//! a NaN product meets a NaN min (`d * q + m`), the product's NaN wins, as it does on x86-64.

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

/// The extreme values a format's blocks can dequantize to, which its vectors must reach.
#[derive(Clone, Copy, PartialEq)]
enum Extremes {
    /// f16 scales: NaN (a NaN scale, or an infinite one times a zero quant) and infinity.
    NanAndInfinity,
    /// MXFP4's E8M0 scale is at most 2^127: products overflow, but nothing is NaN.
    Infinity,
    /// NVFP4's UE4M3 scales are at most 240: every value is finite.
    Finite,
}

fn check_dequantization(dtype: StoredDtype, extremes: Extremes) {
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
    let reached = (want.iter().any(|v| v.is_nan()), want.iter().any(|v| v.is_infinite()));
    let expected = match extremes {
        Extremes::NanAndInfinity => (true, true),
        Extremes::Infinity => (false, true),
        Extremes::Finite => (false, false),
    };
    assert_eq!(reached, expected, "{}: (NaN, infinity) reached by the vectors", dtype.name());

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
fn q4_0_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q4_0, Extremes::NanAndInfinity);
}

#[test]
fn q4_1_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q4_1, Extremes::NanAndInfinity);
}

#[test]
fn q5_0_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q5_0, Extremes::NanAndInfinity);
}

#[test]
fn q5_1_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q5_1, Extremes::NanAndInfinity);
}

#[test]
fn q8_0_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q8_0, Extremes::NanAndInfinity);
}

#[test]
fn q2_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q2_K, Extremes::NanAndInfinity);
}

#[test]
fn q3_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q3_K, Extremes::NanAndInfinity);
}

#[test]
fn q4_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q4_K, Extremes::NanAndInfinity);
}

#[test]
fn q5_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q5_K, Extremes::NanAndInfinity);
}

#[test]
fn q6_k_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::Q6_K, Extremes::NanAndInfinity);
}

#[test]
fn iq2_xxs_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ2_XXS, Extremes::NanAndInfinity);
}

#[test]
fn iq2_xs_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ2_XS, Extremes::NanAndInfinity);
}

#[test]
fn iq2_s_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ2_S, Extremes::NanAndInfinity);
}

#[test]
fn iq3_xxs_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ3_XXS, Extremes::NanAndInfinity);
}

#[test]
fn iq3_s_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ3_S, Extremes::NanAndInfinity);
}

#[test]
fn iq1_s_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ1_S, Extremes::NanAndInfinity);
}

#[test]
fn iq1_m_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ1_M, Extremes::NanAndInfinity);
}

#[test]
fn iq4_nl_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ4_NL, Extremes::NanAndInfinity);
}

#[test]
fn iq4_xs_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::IQ4_XS, Extremes::NanAndInfinity);
}

#[test]
fn mxfp4_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::MXFP4, Extremes::Infinity);
}

#[test]
fn nvfp4_dequantizes_as_gguf_py() {
    check_dequantization(StoredDtype::NVFP4, Extremes::Finite);
}

/// Types gguf-py dequantizes that dg leaves out: the ternary formats no DiffusionGemma GGUF uses.
const NOT_READ: [&str; 2] = ["TQ1_0", "TQ2_0"];

#[test]
fn dtypes_are_gguf_py_types() {
    let table = String::from_utf8(read("ggml_types.txt")).unwrap();
    let mut read_by_dg = Vec::new();
    for line in table.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [name, id, block_len, block_bytes, dequantizes] = f[..] else { panic!("ggml_types.txt: bad line {line:?}") };
        let n = |s: &str| s.parse::<usize>().unwrap_or_else(|e| panic!("ggml_types.txt: {line:?}: {e}"));
        match StoredDtype::from_name(name) {
            Some(d) => {
                assert_eq!((d.ggml_type() as usize, d.block_len(), d.block_bytes()), (n(id), n(block_len), n(block_bytes)), "{name}");
                assert_eq!(StoredDtype::from_ggml_type(d.ggml_type()), Some(d));
                read_by_dg.push(d);
            }
            None => {
                assert!(dequantizes == "0" || NOT_READ.contains(&name), "gguf-py dequantizes {name} (ggml type {id}); dg does not read it");
                assert_eq!(StoredDtype::from_ggml_type(n(id) as u32), None, "{name}");
            }
        }
    }
    let mut all = StoredDtype::ALL.to_vec();
    all.sort_by_key(|d| d.ggml_type());
    assert_eq!(read_by_dg, all, "the dtypes dg reads against StoredDtype::ALL");
}

#[test]
fn every_quantized_dtype_has_vectors() {
    // A dtype added to StoredDtype without vectors (and a test above) fails here.
    let tested = [
        "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
        "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "mxfp4", "nvfp4",
    ];
    let quantized: Vec<String> = StoredDtype::ALL.into_iter().filter(|d| d.is_quantized()).map(stem).collect();
    let mut sorted = tested.map(String::from).to_vec();
    sorted.sort();
    let mut all = quantized.clone();
    all.sort();
    assert_eq!(sorted, all);
}

#[test]
fn q8_0_quantizes_as_gguf_py() {
    check_quantization(StoredDtype::Q8_0);
}

#[test]
fn q5_0_quantizes_as_gguf_py() {
    check_quantization(StoredDtype::Q5_0);
}
