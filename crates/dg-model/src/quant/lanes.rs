//! `N` f32 values operated on side by side, one per independent computation (a lane per
//! sub-block): every operation is one IEEE operation per lane, as the scalar code does it, and each
//! is a loop over a fixed-size array that the compiler turns into vector instructions. Branches
//! become [`Mask`]s and [`Mask::select`]. Nothing here reorders or fuses arithmetic, so a lane's
//! results are the scalar code's bit for bit.

use std::ops::{Add, Div, Mul, Sub};

/// `fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES]` (the quantizer module's) that
/// runs `$portable` compiled for AVX2 where the CPU has it, else as built: the same operations on
/// wider registers, so the bytes do not depend on the path.
macro_rules! quantize_block_with_avx2 {
    ($portable:ident) => {
        pub(super) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { avx2(x) };
            }
            $portable(x)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        fn avx2(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
            $portable(x)
        }
    };
}
pub(super) use quantize_block_with_avx2;

/// The `N` sub-blocks of `SUB` values of `x` (`N · SUB` values) transposed into lanes: element
/// `l` of every sub-block side by side.
#[inline(always)]
pub(super) fn transposed<const N: usize, const SUB: usize>(x: &[f32]) -> [F32s<N>; SUB] {
    let (subs, _) = x.as_chunks::<SUB>();
    std::array::from_fn(|l| F32s(std::array::from_fn(|j| subs[j][l])))
}

/// One f32 per lane (aligned for 256-bit registers).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(align(32))]
pub(super) struct F32s<const N: usize>(pub [f32; N]);

/// One condition per lane, all bits set where it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(align(32))]
pub(super) struct Mask<const N: usize>([u32; N]);

impl<const N: usize> F32s<N> {
    #[inline(always)]
    pub(super) fn splat(v: f32) -> Self {
        Self([v; N])
    }

    #[inline(always)]
    fn map(self, f: impl Fn(f32) -> f32) -> Self {
        let mut out = self.0;
        for v in &mut out {
            *v = f(*v);
        }
        Self(out)
    }

    #[inline(always)]
    fn zip(self, other: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        let mut out = self.0;
        for (v, &o) in out.iter_mut().zip(&other.0) {
            *v = f(*v, o);
        }
        Self(out)
    }

    #[inline(always)]
    fn compare(self, other: Self, f: impl Fn(f32, f32) -> bool) -> Mask<N> {
        let mut out = [0u32; N];
        for ((m, &a), &b) in out.iter_mut().zip(&self.0).zip(&other.0) {
            *m = if f(a, b) { u32::MAX } else { 0 };
        }
        Mask(out)
    }

    #[inline(always)]
    pub(super) fn abs(self) -> Self {
        self.map(f32::abs)
    }

    #[inline(always)]
    pub(super) fn sqrt(self) -> Self {
        self.map(f32::sqrt)
    }

    #[inline(always)]
    pub(super) fn lt(self, other: Self) -> Mask<N> {
        self.compare(other, |a, b| a < b)
    }

    #[inline(always)]
    pub(super) fn gt(self, other: Self) -> Mask<N> {
        self.compare(other, |a, b| a > b)
    }

    #[inline(always)]
    pub(super) fn eq(self, other: Self) -> Mask<N> {
        self.compare(other, |a, b| a == b)
    }

    /// ggml's `nearest_int` of each lane clamped to `lo..=hi`, as f32 (exact: the ints are small).
    #[inline(always)]
    pub(super) fn nearest_int_clamped(self, lo: i32, hi: i32) -> Self {
        let mut out = [0f32; N];
        for (o, &v) in out.iter_mut().zip(&self.0) {
            *o = super::nearest_int(v).clamp(lo, hi) as f32;
        }
        Self(out)
    }
}

impl<const N: usize> Mask<N> {
    #[inline(always)]
    pub(super) fn and(self, other: Self) -> Self {
        let mut out = self.0;
        for (m, &o) in out.iter_mut().zip(&other.0) {
            *m &= o;
        }
        Self(out)
    }

    #[inline(always)]
    pub(super) fn not(self) -> Self {
        let mut out = self.0;
        for m in &mut out {
            *m = !*m;
        }
        Self(out)
    }

    /// Whether the mask holds, lane by lane.
    #[inline(always)]
    pub(super) fn lanes(self) -> [bool; N] {
        self.0.map(|m| m != 0)
    }

    /// `yes` in the lanes where the mask holds, `no` elsewhere (bit for bit, zeros' signs kept).
    #[inline(always)]
    pub(super) fn select(self, yes: F32s<N>, no: F32s<N>) -> F32s<N> {
        let mut out = [0f32; N];
        for (((o, &m), &y), &n) in out.iter_mut().zip(&self.0).zip(&yes.0).zip(&no.0) {
            *o = f32::from_bits((y.to_bits() & m) | (n.to_bits() & !m));
        }
        F32s(out)
    }
}

macro_rules! lane_op {
    ($trait:ident, $method:ident, $op:tt) => {
        impl<const N: usize> $trait for F32s<N> {
            type Output = Self;
            #[inline(always)]
            fn $method(self, other: Self) -> Self {
                self.zip(other, |a, b| a $op b)
            }
        }
    };
}

lane_op!(Add, add, +);
lane_op!(Sub, sub, -);
lane_op!(Mul, mul, *);
lane_op!(Div, div, /);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_keep_the_bits_of_the_chosen_lane() {
        let (a, b) = (F32s([1.0, -0.0, f32::MAX, 2.0]), F32s([0.0, 0.0, -1.0, f32::MIN_POSITIVE]));
        let picked = a.lt(b).select(a, b);
        assert_eq!(picked.0.map(f32::to_bits), [0f32, 0.0, -1.0, f32::MIN_POSITIVE].map(f32::to_bits));
        assert_eq!(a.gt(b).and(a.eq(a)).not().select(a, b).0.map(f32::to_bits), [0f32, -0.0, -1.0, f32::MIN_POSITIVE].map(f32::to_bits));
    }

    #[test]
    fn rounding_clamps_like_the_scalar_code() {
        let x = F32s([-3.5, 0.5, 1.5, 14.6, 15.5, 1e30, f32::INFINITY, -0.2]);
        assert_eq!(x.nearest_int_clamped(0, 15).0, [0.0, 0.0, 2.0, 15.0, 15.0, 15.0, 0.0, 0.0]);
    }
}
