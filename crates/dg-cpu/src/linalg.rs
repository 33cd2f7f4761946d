//! Dense f32 matrix products on top of the `gemm` crate (multi-threaded through rayon).
//!
//! Every `nn.Linear` of the reference (`y = x · Wᵀ`, W stored `[out, in]`) and both attention
//! products go through [`matmul`]; strides let callers pass transposed or strided views (one
//! attention head inside a `[T, heads, d]` buffer) without copying.

use dg_model::Matrix;

/// A read-only strided view of a `rows × cols` matrix.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> View<'a> {
    /// A contiguous row-major matrix.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View { data, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// The transpose of a row-major `[rows, cols]` matrix, i.e. a `cols × rows` view.
    pub fn transposed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View { data, rows: cols, cols: rows, row_stride: 1, col_stride: cols }
    }

    /// Largest index the view touches, plus one (bounds check before the unsafe call).
    fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
    }
}

/// Whether a product may use all rayon threads or must stay on the calling thread (when the
/// caller already parallelises over heads or experts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    All,
    One,
}

/// `out[m×n] (row stride out_stride) = a · b`, or `+= a · b` when `accumulate`.
pub fn matmul(out: &mut [f32], out_stride: usize, a: View<'_>, b: View<'_>, accumulate: bool, threads: Threads) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "inner dimensions differ: {}x{} · {}x{}", a.rows, a.cols, b.rows, b.cols);
    assert!(a.extent() <= a.data.len() && b.extent() <= b.data.len(), "operand view out of bounds");
    if m == 0 || n == 0 {
        return;
    }
    assert!((m - 1) * out_stride + n <= out.len(), "output view out of bounds");
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                out[r * out_stride..r * out_stride + n].fill(0.0);
            }
        }
        return;
    }
    let parallelism = match threads {
        Threads::All => gemm::Parallelism::Rayon(0),
        Threads::One => gemm::Parallelism::None,
    };
    // SAFETY: all three views were bounds-checked above; `out` is exclusively borrowed and does
    // not alias the read-only operands.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            out_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `out[t×out] = x[t×in] · Wᵀ` for a linear layer `W: [out, in]`.
pub fn linear(out: &mut [f32], x: &[f32], tokens: usize, w: &Matrix) {
    linear_raw(out, x, tokens, &w.data, w.rows, w.cols, Threads::All);
}

/// [`linear`] on a raw `[rows = out, cols = in]` weight slice.
pub fn linear_raw(out: &mut [f32], x: &[f32], tokens: usize, w: &[f32], rows: usize, cols: usize, threads: Threads) {
    matmul(out, rows, View::rows(x, tokens, cols), View::transposed(w, rows, cols), false, threads);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn matmul_matches_naive_for_odd_shapes() {
        for &(m, k, n) in &[(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 2, 130)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 2.0).collect();
            let mut out = vec![0.0; m * n];
            matmul(&mut out, n, View::rows(&a, m, k), View::rows(&b, k, n), false, Threads::All);
            let want = naive(&a, &b, m, k, n);
            for (x, y) in out.iter().zip(&want) {
                assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{m}x{k}x{n}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn linear_uses_the_transpose_of_out_in_weights() {
        // W = [[1, 2], [3, 4], [5, 6]] maps R^2 → R^3.
        let w = Matrix::new(3, 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let mut out = vec![0.0; 3];
        linear(&mut out, &[1.0, 10.0], 1, &w);
        assert_eq!(out, vec![21.0, 43.0, 65.0]);
    }
}
