//! Quantized blocks in planes: how the tensor-core kernels store ggml blocks held in K panels
//! (`coop_gemm::BLayout::NkPanels`, the experts of `coop_grouped_gemm`), and their W units over
//! that layout. No HF module: a device layout of ggml's `block_q8_0`, `block_q5_0`, `block_q4_K`.
//!
//! In K panels, consecutive blocks are one K block of consecutive rows, and a K step's invocation
//! takes one row's run (or a vec4 of it). As ggml stores them, a subgroup's 32 runs are 34, 22 or
//! 144 bytes apart, so each of its loads touches 32 sectors and the unaligned 34- and 22-byte
//! blocks take 9 and 6 word loads a run. Here every [`PLANE_GROUP`] consecutive blocks (8 rows
//! of one panel) are rearranged into planes of 16-byte rows: the run's quants of the 8 rows side
//! by side, then their high bits, then their scales. A subgroup's load of a plane then reads
//! contiguous bytes, a run is 2 or 3 aligned 16-byte loads, and the scales of a group share one
//! 16-byte word. The group's size is the blocks' (34·8 = 272, 22·8 = 176, 144·8 = 1152 bytes),
//! so a matrix takes the bytes it takes in ggml's order. Q6_K and the other types keep ggml's order.
//!
//! A group of blocks `r = 0..8`, in 16-byte words:
//! - Q8_0 (17 words): `r` quants 0..16 of block r, `8 + r` quants 16..32, `16` the 8 scales `d`
//!   (f16, block r in half `r % 2` of word `r / 2`).
//! - Q5_0 (11 words): `r` the 16 bytes of nibbles, `8 + r / 4` the high bits `qh` (word `r % 4`),
//!   `10` the 8 `d`.
//! - Q4_K (72 words): `r` the header (d, dmin, 12 bytes of scales and mins), `8 + 8·s + r` the 32
//!   nibbles of sub-block `s`: byte `i` holds value `i` (bits 0..4) and value `16 + i` (bits 4..8),
//!   the order of a Q5_0 block's nibbles (ggml puts sub-blocks `2j` and `2j + 1` in the low and
//!   high nibbles of the same 32 bytes).

use super::{CoopW, DEQUANT_VEC4, QuantFormat, run_put, vec4_unit};

/// Blocks rearranged together into planes: 8 rows of a panel (a matrix in planes has a multiple
/// of 8 rows).
pub const PLANE_GROUP: usize = 8;

/// The most bytes of one group ([`PLANE_GROUP`] Q6_K blocks).
pub const MAX_GROUP_BYTES: usize = PLANE_GROUP * QuantFormat::Q6_K.block_bytes();

impl QuantFormat {
    /// Whether this format's blocks are stored in planes when in K panels (Q8_0, Q5_0, Q4_K; the
    /// others keep ggml's order).
    pub const fn planes(self) -> bool {
        matches!(self, QuantFormat::Q8_0 | QuantFormat::Q5_0 | QuantFormat::Q4_K)
    }

    /// Rearranges one group of [`PLANE_GROUP`] blocks as ggml stores them (`ggml`) into planes
    /// (`out`, as long); a copy for a format without planes.
    pub fn to_planes(self, ggml: &[u8], out: &mut [u8]) {
        self.map_group(ggml, out, true);
    }

    /// The inverse of [`Self::to_planes`].
    pub fn from_planes(self, planes: &[u8], out: &mut [u8]) {
        self.map_group(planes, out, false);
    }

    /// Moves bytes between a group in ggml's order and in planes (`forward`: ggml → planes).
    fn map_group(self, src: &[u8], dst: &mut [u8], forward: bool) {
        let bytes = self.block_bytes();
        assert!(src.len() == PLANE_GROUP * bytes && dst.len() == src.len(), "a group is {PLANE_GROUP} {} blocks", self.name());
        // Each moved range of block r: (ggml offset in the block, planes offset of block 0 in the
        // group, planes bytes between blocks, length).
        let whole = [(0, 0, bytes, bytes)];
        let ranges: &[(usize, usize, usize, usize)] = match self {
            QuantFormat::Q8_0 => &[(2, 0, 16, 16), (18, 128, 16, 16), (0, 256, 2, 2)],
            QuantFormat::Q5_0 => &[(6, 0, 16, 16), (2, 128, 4, 4), (0, 160, 2, 2)],
            QuantFormat::Q4_K => &[(0, 0, 16, 16)],
            _ => &whole,
        };
        for r in 0..PLANE_GROUP {
            let block = r * bytes;
            for &(g, first, stride, n) in ranges {
                let p = first + stride * r;
                match forward {
                    true => dst[p..p + n].copy_from_slice(&src[block + g..block + g + n]),
                    false => dst[block + g..block + g + n].copy_from_slice(&src[p..p + n]),
                }
            }
            if self == QuantFormat::Q4_K {
                // Sub-block s's value l: nibble (s % 2) of ggml's byte 16 + 32·(s / 2) + l; in planes,
                // nibble (l / 16) of byte 128 + 128·s + 16·r + l % 16.
                for s in 0..8 {
                    for i in 0..16 {
                        let (lo, hi) = (block + 16 + 32 * (s / 2) + i, block + 16 + 32 * (s / 2) + 16 + i);
                        let plane = 128 + 128 * s + 16 * r + i;
                        let shift = 4 * (s % 2);
                        match forward {
                            true => dst[plane] = ((src[lo] >> shift) & 15) | (((src[hi] >> shift) & 15) << 4),
                            false => {
                                let keep = 0xF0u8 >> shift;
                                dst[lo] = (dst[lo] & keep) | ((src[plane] & 15) << shift);
                                dst[hi] = (dst[hi] & keep) | ((src[plane] >> 4) << shift);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The one-vec4 W unit over blocks in planes (the [`QuantFormat::coop_w`] of that layout):
    /// W bound as 16-byte words; `fetch_w(v)` loads the word of vec4 `v`'s quants, its high bits
    /// and its block's scales, each a 4-byte load, and tags the block's place in its group.
    pub(super) fn coop_w_planes(self) -> CoopW {
        match self {
            QuantFormat::Q8_0 => vec4_unit(
                "vec4<u32>",
                "vec4<u32>",
                "fn fetch_w(v: u32) -> vec4<u32> {
    let b = v / 8u;
    let e = v % 8u;
    let g = (b / 8u) * 17u;
    let r = b % 8u;
    return vec4<u32>(w[g + 16u][r / 2u], w[g + 8u * (e / 4u) + r][e % 4u], 0u, r & 1u);
}
",
                &format!(
                    "{DEQUANT_VEC4}fn w16(x: vec4<u32>) -> vec4<f16> {{
    return q8_vec4(x.y, unpack2x16float(x.x)[x.w]);
}}
"
                ),
                "fn pin_w(l: u32, v: vec4<u32>) {\n    pin_f(l, bitcast<vec4<f32>>(v));\n}\n",
            ),
            QuantFormat::Q5_0 => vec4_unit(
                "vec4<u32>",
                "vec4<u32>",
                "fn fetch_w(v: u32) -> vec4<u32> {
    let b = v / 8u;
    let e = v % 8u;
    let g = (b / 8u) * 11u;
    let r = b % 8u;
    return vec4<u32>(w[g + 10u][r / 2u], w[g + r][e % 4u], w[g + 8u + r / 4u][r % 4u], (r & 1u) | (e << 1u));
}
",
                &format!(
                    "{DEQUANT_VEC4}fn w16(x: vec4<u32>) -> vec4<f16> {{
    let e = x.w >> 1u;
    return q5_vec4(select(x.y, x.y >> 4u, e >= 4u), x.z >> (4u * e), unpack2x16float(x.x)[x.w & 1u]);
}}
"
                ),
                "fn pin_w(l: u32, v: vec4<u32>) {\n    pin_f(l, bitcast<vec4<f32>>(v));\n}\n",
            ),
            // Vec4 v is element 4v: super-block b = v / 64 (8 K steps of 8 vec4s a row), sub-block
            // s = (v % 64) / 8, its vec4 e = v % 8 (high nibbles from the fifth).
            QuantFormat::Q4_K => vec4_unit(
                "vec4<u32>",
                "QW",
                "struct QW {
    q: u32,
    head: vec4<u32>,
    j: u32,
}
fn fetch_w(v: u32) -> QW {
    let b = v / 64u;
    let s = (v % 64u) / 8u;
    let e = v % 8u;
    let g = (b / 8u) * 72u;
    let r = b % 8u;
    return QW(w[g + 8u + 8u * s + r][e % 4u], w[g + r], s | ((e / 4u) << 3u));
}
",
                &format!(
                    "{DEQUANT_VEC4}fn w16(x: QW) -> vec4<f16> {{
    return q4k_vec4(select(x.q, x.q >> 4u, (x.j & 8u) != 0u), q4k_scales(x.head, x.j & 7u));
}}
"
                ),
                "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(v.head ^ vec4<u32>(v.q, v.j, 0u, 0u)));\n}\n",
            ),
            _ => self.coop_w(),
        }
    }

    /// The 32-value run unit over blocks in planes (the [`QuantFormat::coop_w_run`] of that
    /// layout): the run's quants as one or two 16-byte loads, its high bits and scale one 4-byte
    /// load each (Q4_K: the header's 16 bytes); `v` a multiple of 8.
    pub(super) fn coop_w_run_planes(self) -> Option<CoopW> {
        let vec4 = |w: &str, k: u32| if k < 4 { format!("{w}[{k}]") } else { format!("({w}[{}] >> 4u)", k - 4) };
        Some(match self {
            QuantFormat::Q8_0 => CoopW {
                word: "vec4<u32>",
                elem: "QR",
                vec4s: 8,
                fetch: "struct QR {
    q0: vec4<u32>,
    q1: vec4<u32>,
    d: u32,
    odd: u32,
}
fn fetch_w(v: u32) -> QR {
    let b = v / 8u;
    let g = (b / 8u) * 17u;
    let r = b % 8u;
    return QR(w[g + r], w[g + 8u + r], w[g + 16u][r / 2u], r & 1u);
}
",
                put: run_put("QR", 8, "    let d = unpack2x16float(x.d)[x.odd];\n", |k| format!("q8_vec4(x.q{}[{}], d)", k / 4, k % 4)),
                pin_w: "fn pin_w(l: u32, v: QR) {\n    pin_f(l, bitcast<vec4<f32>>(v.q0 ^ v.q1 ^ vec4<u32>(v.d, v.odd, 0u, 0u)));\n}\n",
            },
            QuantFormat::Q5_0 => CoopW {
                word: "vec4<u32>",
                elem: "QR",
                vec4s: 8,
                fetch: "struct QR {
    s: vec4<u32>,
    qh: u32,
    d: u32,
    odd: u32,
}
fn fetch_w(v: u32) -> QR {
    let b = v / 8u;
    let g = (b / 8u) * 11u;
    let r = b % 8u;
    return QR(w[g + r], w[g + 8u + r / 4u][r % 4u], w[g + 10u][r / 2u], r & 1u);
}
",
                put: run_put("QR", 8, "    let d = unpack2x16float(x.d)[x.odd];\n", |k| {
                    format!("q5_vec4({}, x.qh >> {}u, d)", vec4("x.s", k), 4 * k)
                }),
                pin_w: "fn pin_w(l: u32, v: QR) {\n    pin_f(l, bitcast<vec4<f32>>(v.s ^ vec4<u32>(v.qh, v.d, v.odd, 0u)));\n}\n",
            },
            QuantFormat::Q4_K => CoopW {
                word: "vec4<u32>",
                elem: "QR",
                vec4s: 8,
                fetch: "struct QR {
    head: vec4<u32>,
    q: vec4<u32>,
    j: u32,
}
fn fetch_w(v: u32) -> QR {
    let b = v / 64u;
    let s = (v % 64u) / 8u;
    let g = (b / 8u) * 72u;
    let r = b % 8u;
    return QR(w[g + r], w[g + 8u + 8u * s + r], s);
}
",
                put: run_put("QR", 8, "    let dm = q4k_scales(x.head, x.j);\n", |k| format!("q4k_vec4({}, dm)", vec4("x.q", k))),
                pin_w: "fn pin_w(l: u32, v: QR) {\n    pin_f(l, bitcast<vec4<f32>>(v.head ^ v.q ^ vec4<u32>(v.j, 0u, 0u, 0u)));\n}\n",
            },
            _ => return None,
        })
    }

    /// Half a run over blocks in planes: values `16·h ..` of a run, `h = (v % 8) / 4` (`v` a
    /// multiple of 4): one 16-byte load of quants (Q8_0: plane `h`; Q5_0 and Q4_K: the run's
    /// nibbles, high ones for `h = 1`), and the block's high bits and scales as for the run.
    pub(super) fn coop_w_half_planes(self) -> Option<CoopW> {
        Some(match self {
            QuantFormat::Q8_0 => CoopW {
                word: "vec4<u32>",
                elem: "QH",
                vec4s: 4,
                fetch: "struct QH {
    q: vec4<u32>,
    d: u32,
    odd: u32,
}
fn fetch_w(v: u32) -> QH {
    let b = v / 8u;
    let g = (b / 8u) * 17u;
    let r = b % 8u;
    return QH(w[g + 8u * ((v % 8u) / 4u) + r], w[g + 16u][r / 2u], r & 1u);
}
",
                put: run_put("QH", 4, "    let d = unpack2x16float(x.d)[x.odd];\n", |k| format!("q8_vec4(x.q[{k}], d)")),
                pin_w: "fn pin_w(l: u32, v: QH) {\n    pin_f(l, bitcast<vec4<f32>>(v.q ^ vec4<u32>(v.d, v.odd, 0u, 0u)));\n}\n",
            },
            QuantFormat::Q5_0 => CoopW {
                word: "vec4<u32>",
                elem: "QH",
                vec4s: 4,
                fetch: "struct QH {
    s: vec4<u32>,
    qh: u32,
    d: u32,
    tag: u32,
}
fn fetch_w(v: u32) -> QH {
    let b = v / 8u;
    let g = (b / 8u) * 11u;
    let r = b % 8u;
    return QH(w[g + r], w[g + 8u + r / 4u][r % 4u], w[g + 10u][r / 2u], (r & 1u) | ((v % 8u) / 4u) << 1u);
}
",
                put: run_put(
                    "QH",
                    4,
                    "    let d = unpack2x16float(x.d)[x.tag & 1u];\n    let h = x.tag >> 1u;\n    let qh = x.qh >> (16u * h);\n",
                    |k| format!("q5_vec4(x.s[{k}] >> (4u * h), qh >> {}u, d)", 4 * k),
                ),
                pin_w: "fn pin_w(l: u32, v: QH) {\n    pin_f(l, bitcast<vec4<f32>>(v.s ^ vec4<u32>(v.qh, v.d, v.tag, 0u)));\n}\n",
            },
            QuantFormat::Q4_K => CoopW {
                word: "vec4<u32>",
                elem: "QH",
                vec4s: 4,
                fetch: "struct QH {
    head: vec4<u32>,
    q: vec4<u32>,
    j: u32,
}
fn fetch_w(v: u32) -> QH {
    let b = v / 64u;
    let s = (v % 64u) / 8u;
    let g = (b / 8u) * 72u;
    let r = b % 8u;
    return QH(w[g + r], w[g + 8u + 8u * s + r], s | (((v % 8u) / 4u) << 3u));
}
",
                put: run_put("QH", 4, "    let dm = q4k_scales(x.head, x.j & 7u);\n    let shift = 4u * (x.j >> 3u);\n", |k| {
                    format!("q4k_vec4(x.q[{k}] >> shift, dm)")
                }),
                pin_w: "fn pin_w(l: u32, v: QH) {\n    pin_f(l, bitcast<vec4<f32>>(v.head ^ v.q ^ vec4<u32>(v.j, 0u, 0u, 0u)));\n}\n",
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random bytes for a group of `q` blocks.
    fn group(q: QuantFormat, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..PLANE_GROUP * q.block_bytes())
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn planes_round_trip_and_move_every_byte() {
        for q in QuantFormat::ALL {
            for seed in 1..4 {
                let ggml = group(q, seed);
                let mut planes = vec![0u8; ggml.len()];
                q.to_planes(&ggml, &mut planes);
                let mut back = vec![0u8; ggml.len()];
                q.from_planes(&planes, &mut back);
                assert_eq!(back, ggml, "{q:?}");
                assert_eq!(q.planes(), planes != ggml, "{q:?}: planes rearrange exactly the formats that have them");
                let ones = |b: &[u8]| b.iter().map(|x| x.count_ones()).sum::<u32>();
                assert_eq!(ones(&planes), ones(&ggml), "{q:?}");
            }
        }
    }

    /// The places the WGSL units read: word `w` (16 bytes) of a group.
    fn word(planes: &[u8], w: usize) -> [u32; 4] {
        std::array::from_fn(|c| u32::from_le_bytes(planes[16 * w + 4 * c..16 * w + 4 * c + 4].try_into().unwrap()))
    }

    #[test]
    fn the_documented_words_hold_each_blocks_fields() {
        let half = |w: [u32; 4], r: usize| (w[r / 2] >> (16 * (r % 2))) as u16;
        // Q8_0: quants 0..16 in word r, 16..32 in word 8 + r, d in word 16.
        let q = QuantFormat::Q8_0;
        let ggml = group(q, 7);
        let mut planes = vec![0u8; ggml.len()];
        q.to_planes(&ggml, &mut planes);
        for r in 0..8 {
            let block = &ggml[34 * r..34 * (r + 1)];
            assert_eq!(half(word(&planes, 16), r), u16::from_le_bytes([block[0], block[1]]));
            assert_eq!(bytemuck::cast_slice::<u32, u8>(&word(&planes, r)), &block[2..18]);
            assert_eq!(bytemuck::cast_slice::<u32, u8>(&word(&planes, 8 + r)), &block[18..34]);
        }
        // Q5_0: nibbles in word r, qh word r % 4 of word 8 + r / 4, d in word 10.
        let q = QuantFormat::Q5_0;
        let ggml = group(q, 8);
        let mut planes = vec![0u8; ggml.len()];
        q.to_planes(&ggml, &mut planes);
        for r in 0..8 {
            let block = &ggml[22 * r..22 * (r + 1)];
            assert_eq!(half(word(&planes, 10), r), u16::from_le_bytes([block[0], block[1]]));
            assert_eq!(word(&planes, 8 + r / 4)[r % 4], u32::from_le_bytes(block[2..6].try_into().unwrap()));
            assert_eq!(bytemuck::cast_slice::<u32, u8>(&word(&planes, r)), &block[6..22]);
        }
        // Q4_K: header in word r; sub-block s's value l in nibble l / 16 of byte l % 16 of word
        // 8 + 8s + r.
        let q = QuantFormat::Q4_K;
        let ggml = group(q, 9);
        let mut planes = vec![0u8; ggml.len()];
        q.to_planes(&ggml, &mut planes);
        for r in 0..8 {
            let block = &ggml[144 * r..144 * (r + 1)];
            assert_eq!(bytemuck::cast_slice::<u32, u8>(&word(&planes, r)), &block[..16]);
            for s in 0..8 {
                let sub = bytemuck::cast::<[u32; 4], [u8; 16]>(word(&planes, 8 + 8 * s + r));
                for l in 0..32 {
                    let ggml_value = (block[16 + 32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
                    assert_eq!((sub[l % 16] >> (4 * (l / 16))) & 15, ggml_value, "r {r} s {s} l {l}");
                }
            }
        }
    }
}
