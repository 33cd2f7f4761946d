//! Comparing two f32 tensors: the metrics every parity level reports.
//!
//! max |Δ|, max relative error, normwise error ‖ours − ref‖₂ / ‖ref‖₂, the worst element with both
//! values, non-finite counts on each side (a one-sided NaN fails), and the argmax rule of the
//! reference format: each row's argmax must agree wherever the reference's top-2 gap exceeds a
//! margin.

use std::fmt;

/// Where two tensors differ most, and by how much.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub max_abs: f64,
    pub max_rel: f64,
    pub normwise: f64,
    /// (row, column, ours, reference) of the largest |Δ|.
    pub worst: (usize, usize, f32, f32),
    pub nonfinite_ours: usize,
    pub nonfinite_ref: usize,
    /// Rows checked by the argmax rule and rows where it failed: (row, ours, reference, gap).
    pub argmax_rows_checked: usize,
    pub argmax_mismatches: Vec<(usize, usize, usize, f32)>,
}

/// Compares `ours` with `reference`, both `[rows, cols]`; `argmax_margin` selects the rows whose
/// argmax must agree (reference top-2 gap strictly greater than the margin).
pub fn compare(ours: &[f32], reference: &[f32], cols: usize, argmax_margin: f32) -> Comparison {
    assert_eq!(ours.len(), reference.len(), "compared tensors differ in size");
    let mut c = Comparison {
        max_abs: 0.0,
        max_rel: 0.0,
        normwise: 0.0,
        worst: (0, 0, 0.0, 0.0),
        nonfinite_ours: 0,
        nonfinite_ref: 0,
        argmax_rows_checked: 0,
        argmax_mismatches: Vec::new(),
    };
    let (mut diff2, mut ref2) = (0f64, 0f64);
    for (i, (&a, &b)) in ours.iter().zip(reference).enumerate() {
        c.nonfinite_ours += usize::from(!a.is_finite());
        c.nonfinite_ref += usize::from(!b.is_finite());
        if !a.is_finite() || !b.is_finite() {
            continue;
        }
        let d = (a as f64 - b as f64).abs();
        diff2 += d * d;
        ref2 += (b as f64) * (b as f64);
        if d > c.max_abs {
            c.max_abs = d;
            c.worst = (i / cols.max(1), i % cols.max(1), a, b);
        }
        let rel = d / (b as f64).abs().max(f64::MIN_POSITIVE);
        if b != 0.0 && rel > c.max_rel {
            c.max_rel = rel;
        }
    }
    c.normwise = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    if cols > 0 {
        for (row, (a, b)) in ours.chunks_exact(cols).zip(reference.chunks_exact(cols)).enumerate() {
            let (rb, gap) = top2(b);
            if gap > argmax_margin {
                c.argmax_rows_checked += 1;
                let (ra, _) = top2(a);
                if ra != rb {
                    c.argmax_mismatches.push((row, ra, rb, gap));
                }
            }
        }
    }
    c
}

/// Index of the first maximum and the gap to the second largest value.
pub fn top2(row: &[f32]) -> (usize, f32) {
    let (mut best, mut first, mut second) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > first {
            second = first;
            first = v;
            best = i;
        } else if v > second {
            second = v;
        }
    }
    (best, first - second)
}

impl Comparison {
    /// Passes when the normwise error is within `tolerance`, no value is non-finite on one side
    /// only, and the argmax rule holds.
    pub fn passes(&self, tolerance: f64) -> bool {
        self.normwise <= tolerance && self.nonfinite_ours == self.nonfinite_ref && self.argmax_mismatches.is_empty()
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (r, col, a, b) = self.worst;
        write!(
            f,
            "normwise={:.3e} max_abs={:.3e} max_rel={:.3e} worst=[{r},{col}] ours={a} ref={b} argmax={}/{} agree",
            self.normwise,
            self.max_abs,
            self.max_rel,
            self.argmax_rows_checked - self.argmax_mismatches.len(),
            self.argmax_rows_checked,
        )?;
        if self.nonfinite_ours + self.nonfinite_ref > 0 {
            write!(f, " nonfinite ours={} ref={}", self.nonfinite_ours, self.nonfinite_ref)?;
        }
        if let Some((row, ours, reference, gap)) = self.argmax_mismatches.first() {
            write!(f, " first_argmax_mismatch=row {row}: ours {ours} ref {reference} (ref top-2 gap {gap})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_and_argmax_rule() {
        let reference = [1.0, 2.0, 5.0, 5.0005];
        let ours = [1.0, 2.1, 5.0006, 5.0];
        let c = compare(&ours, &reference, 2, 1e-3);
        assert!((c.max_abs - 0.1).abs() < 1e-6);
        assert_eq!(c.worst.0, 0);
        // Row 1's reference gap is 5e-4 < 1e-3: its flipped argmax is not held against us.
        assert_eq!(c.argmax_rows_checked, 1);
        assert!(c.argmax_mismatches.is_empty());
        assert!(c.passes(0.1) && !c.passes(1e-3));
    }

    #[test]
    fn one_sided_nan_fails() {
        let c = compare(&[f32::NAN, 1.0], &[0.0, 1.0], 2, 1e-3);
        assert!(!c.passes(1.0));
        let c = compare(&[1.0, 3.0], &[1.0, 2.0], 2, 1e-3);
        assert_eq!(c.argmax_mismatches.len(), 0);
        let c = compare(&[3.0, 1.0], &[1.0, 2.0], 2, 1e-3);
        assert_eq!(c.argmax_mismatches, vec![(0, 0, 1, 1.0)]);
    }
}
