//! 16-bit weights ([`WeightFormat::Bf16`](crate::WeightFormat::Bf16) and [`WeightFormat::F16`](crate::WeightFormat::F16)): the host packing of f32
//! values into the device layout as u32 words (two halves per word, element `i` in the half
//! `i & 1` of word `i >> 1`, low half first) and its exact inverse, for tests and reference
//! packers. How kernels read these formats is defined with the formats ([`crate::format`]).

/// Packs `values` as [`WeightFormat::Bf16`](crate::WeightFormat::Bf16): each value rounded to the nearest bf16 (ties to even;
/// a NaN stays a NaN, quieted; overflow rounds to ±∞), two per word, element `i` in bits
/// `16·(i & 1) ..` of word `i >> 1`. An odd length is padded with a zero half.
pub fn pack_bf16(values: &[f32]) -> Vec<u32> {
    values
        .chunks(2)
        .map(|pair| {
            let lo = half::bf16::from_f32(pair[0]).to_bits();
            let hi = pair.get(1).map_or(0, |&v| half::bf16::from_f32(v).to_bits());
            u32::from(lo) | (u32::from(hi) << 16)
        })
        .collect()
}

/// The first `len` elements of [`WeightFormat::Bf16`](crate::WeightFormat::Bf16) words as f32, widened exactly as the
/// kernels do (`bits << 16`): `unpack_bf16(&pack_bf16(v), v.len())` is `v` rounded to bf16.
pub fn unpack_bf16(words: &[u32], len: usize) -> Vec<f32> {
    assert!(len.div_ceil(2) <= words.len(), "{len} bf16 elements need {} words, got {}", len.div_ceil(2), words.len());
    (0..len).map(|i| f32::from_bits(((words[i >> 1] >> (16 * (i & 1))) & 0xffff) << 16)).collect()
}

/// Packs `values` as [`WeightFormat::F16`](crate::WeightFormat::F16): each value rounded to the nearest IEEE f16
/// (`half::f16::from_f32`: ties to even; beyond ±65504 to ±∞; below 2⁻¹⁴ in magnitude to an f16
/// subnormal or ±0; a NaN stays a NaN), two per word, element `i` in bits `16·(i & 1) ..` of word
/// `i >> 1` (the layout the tensor-core GEMM, [`crate::coop_gemm`], reads). An odd length is padded with a zero
/// half.
pub fn pack_f16(values: &[f32]) -> Vec<u32> {
    values
        .chunks(2)
        .map(|pair| {
            let lo = half::f16::from_f32(pair[0]).to_bits();
            let hi = pair.get(1).map_or(0, |&v| half::f16::from_f32(v).to_bits());
            u32::from(lo) | (u32::from(hi) << 16)
        })
        .collect()
}

/// The first `len` elements of [`WeightFormat::F16`](crate::WeightFormat::F16) words as f32, widened exactly (what
/// `unpack2x16float` gives on a device that keeps f16 subnormals): `unpack_f16(&pack_f16(v),
/// v.len())` is `v` rounded to f16.
pub fn unpack_f16(words: &[u32], len: usize) -> Vec<f32> {
    assert!(len.div_ceil(2) <= words.len(), "{len} f16 elements need {} words, got {}", len.div_ceil(2), words.len());
    (0..len).map(|i| half::f16::from_bits((words[i >> 1] >> (16 * (i & 1))) as u16).to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_rounds_to_nearest_even_and_pads() {
        let bits = |v: f32| v.to_bits();
        // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to the even mantissa (1).
        let tie_down = f32::from_bits(0x3F80_8000);
        // 1 + 3·2^-8: halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
        let tie_up = f32::from_bits(0x3F81_8000);
        // Just above a tie rounds up; just below rounds down.
        let above = f32::from_bits(0x3F80_8001);
        let below = f32::from_bits(0x3F80_7FFF);
        let values = [tie_down, tie_up, above, below, -0.0, f32::INFINITY, f32::MAX, f32::NAN, 1.5];
        let words = pack_bf16(&values);
        assert_eq!(words.len(), 5, "9 values: 4 full words and one padded");
        assert_eq!(words[4] >> 16, 0, "the padding half is zero");
        let got = unpack_bf16(&words, values.len());
        assert_eq!(bits(got[0]), 0x3F80_0000);
        assert_eq!(bits(got[1]), 0x3F82_0000);
        assert_eq!(bits(got[2]), 0x3F81_0000);
        assert_eq!(bits(got[3]), 0x3F80_0000);
        assert_eq!(bits(got[4]), 0x8000_0000, "-0 keeps its sign");
        assert_eq!(got[5], f32::INFINITY);
        assert_eq!(got[6], f32::INFINITY, "f32::MAX is past the largest bf16: rounds to infinity");
        assert!(got[7].is_nan(), "NaN stays NaN");
        assert_eq!(got[8], 1.5);
        // The layout: element 2i in the low half of word i, element 2i+1 in the high half.
        assert_eq!(pack_bf16(&[1.0, -2.0]), vec![0x3F80 | (0xC000 << 16)]);
        // A NaN whose payload sits only in the dropped low bits must not become infinity.
        let low_nan = f32::from_bits(0x7F80_0001);
        assert!(unpack_bf16(&pack_bf16(&[low_nan]), 1)[0].is_nan());
        assert!(pack_bf16(&[]).is_empty() && unpack_bf16(&[], 0).is_empty());
    }

    #[test]
    fn unpacking_inverts_packing_on_bf16_values() {
        // Every value already a bf16 survives the round trip bit for bit, at odd and even lengths.
        for len in [1usize, 2, 7, 64, 65] {
            // Mask 0xFF7F clears the exponent's lowest bit: no infinity or NaN, signs and subnormals mixed.
            let values: Vec<f32> = (0..len).map(|i| f32::from_bits(((i as u32).wrapping_mul(0x9E37) & 0xFF7F) << 16)).collect();
            let words = pack_bf16(&values);
            assert_eq!(words.len(), len.div_ceil(2));
            let back = unpack_bf16(&words, len);
            assert!(values.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()), "len {len}");
        }
    }

    #[test]
    fn f16_packing_rounds_to_nearest_even_overflows_to_infinity_and_keeps_subnormals() {
        let half_bits = |v: f32| (pack_f16(&[v])[0] & 0xffff) as u16;
        // 1 + 2^-11 is halfway between f16 1 and 1 + 2^-10: ties to the even mantissa (1).
        assert_eq!(half_bits(f32::from_bits(0x3F80_1000)), 0x3C00);
        // 1 + 3·2^-11: halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): rounds up.
        assert_eq!(half_bits(f32::from_bits(0x3F80_3000)), 0x3C02);
        // Just above a tie rounds up; just below rounds down.
        assert_eq!(half_bits(f32::from_bits(0x3F80_1001)), 0x3C01);
        assert_eq!(half_bits(f32::from_bits(0x3F80_0FFF)), 0x3C00);
        assert_eq!(half_bits(-0.0), 0x8000, "-0 keeps its sign");
        // Overflow: 65504 is the largest f16; from 65520 (halfway to 2^16, ties to even) it is ∞.
        assert_eq!(half_bits(65504.0), 0x7BFF);
        assert_eq!(half_bits(65519.996), 0x7BFF);
        assert_eq!(half_bits(65520.0), 0x7C00);
        assert_eq!(half_bits(-65520.0), 0xFC00);
        assert_eq!(half_bits(1e6), 0x7C00);
        assert_eq!(half_bits(f32::MAX), 0x7C00);
        assert_eq!(half_bits(f32::NEG_INFINITY), 0xFC00);
        // Subnormals: multiples of 2^-24 below 2^-14, rounded to nearest even.
        let p2 = |e: i32| 2f32.powi(e);
        assert_eq!(half_bits(p2(-24)), 0x0001, "the smallest subnormal");
        assert_eq!(half_bits(-p2(-24)), 0x8001);
        assert_eq!(half_bits(p2(-25)), 0x0000, "halfway to the smallest subnormal: ties to zero");
        assert_eq!(half_bits(f32::from_bits(p2(-25).to_bits() + 1)), 0x0001, "just above the tie");
        assert_eq!(half_bits(3.0 * p2(-25)), 0x0002, "1.5 · 2^-24: ties to the even 2");
        assert_eq!(half_bits(1023.0 * p2(-24)), 0x03FF, "the largest subnormal");
        assert_eq!(half_bits(p2(-14) - p2(-25)), 0x0400, "halfway below the smallest normal: up to it (even)");
        assert_eq!(half_bits(p2(-14)), 0x0400, "the smallest normal");
        assert_eq!(half_bits(f32::MIN_POSITIVE), 0x0000, "far below f16 range: zero");
        assert_eq!(half_bits(-1e-30), 0x8000, "underflow keeps the sign");
        // NaN stays NaN, including one whose payload sits only in the dropped low bits.
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001), f32::from_bits(0xFFC0_0000)] {
            let h = half_bits(nan);
            assert!(h & 0x7C00 == 0x7C00 && h & 0x03FF != 0, "{:#010x} → {h:#06x} is not a NaN", nan.to_bits());
        }
        // Unpacked: the f32 values of those halves, exactly.
        let values = [65520.0, p2(-24), -p2(-24), 3.0 * p2(-25), 1023.0 * p2(-24), f32::NAN, -0.0, 1.5, -65504.0];
        let words = pack_f16(&values);
        assert_eq!(words.len(), 5, "9 values: 4 full words and one padded");
        assert_eq!(words[4] >> 16, 0, "the padding half is zero");
        let got = unpack_f16(&words, values.len());
        assert_eq!(got[0], f32::INFINITY);
        assert_eq!(got[1], p2(-24));
        assert_eq!(got[2], -p2(-24));
        assert_eq!(got[3], 2.0 * p2(-24));
        assert_eq!(got[4], 1023.0 * p2(-24));
        assert!(got[5].is_nan());
        assert_eq!(got[6].to_bits(), 0x8000_0000);
        assert_eq!(got[7], 1.5);
        assert_eq!(got[8], -65504.0);
        // The layout: element 2i in the low half of word i, element 2i+1 in the high half.
        assert_eq!(pack_f16(&[1.0, -2.0]), vec![0x3C00 | (0xC000 << 16)]);
        assert_eq!(pack_f16(&[1.0, -2.0, 0.5]), vec![0x3C00 | (0xC000 << 16), 0x3800]);
        assert!(pack_f16(&[]).is_empty() && unpack_f16(&[], 0).is_empty());
    }

    #[test]
    fn f16_unpacking_inverts_packing_on_every_f16() {
        // Every f16 bit pattern but the NaNs survives unpack → pack bit for bit (subnormals and
        // infinities included), at odd and even lengths.
        let all: Vec<u16> = (0..=u16::MAX).filter(|h| (h & 0x7C00) != 0x7C00 || (h & 0x03FF) == 0).collect();
        for len in [1usize, 2, 7, 64, 65, all.len()] {
            let words: Vec<u32> = all[..len].chunks(2).map(|p| u32::from(p[0]) | (u32::from(*p.get(1).unwrap_or(&0)) << 16)).collect();
            let values = unpack_f16(&words, len);
            assert_eq!(pack_f16(&values), words, "len {len}");
        }
    }
}
