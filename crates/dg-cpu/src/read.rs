//! The CPU model's read forward ([`dg_sampler::ReadModel`]): a canvas of width W ≤ `canvas_length`
//! after the cache, self-conditioned at some rows only, the head computed at the rows asked for.
//!
//! Mirrors `DiffusionGemmaForBlockDiffusion.forward(decoder_input_ids=canvas, past_key_values=cache)`
//! (any canvas width; the cache is read, never written) with the per-row self-conditioning mask of
//! vLLM's structured mode (pinned rows get `s = 0`) and the logits kept at the slot rows only.

use dg_sampler::{Conditioning, ReadModel};

use crate::model::{CpuError, CpuModel};
use crate::ops::rms_norm_rows;

impl CpuModel {
    /// The read forward: see [`ReadModel::read_forward`].
    pub fn read_forward(
        &self,
        canvas: &[u32],
        conditioning: Option<Conditioning<'_>>,
        head_rows: &[usize],
        logits: &mut [f32],
    ) -> Result<(), CpuError> {
        let cfg = &self.config.text;
        let (w, h, v) = (canvas.len(), cfg.hidden_size, cfg.vocab_size);
        if w == 0 || w > self.config.canvas_length {
            return Err(CpuError::Read(format!("a canvas of {w} ids; it must have 1 to canvas_length ({})", self.config.canvas_length)));
        }
        let outside = |rows: &[usize]| rows.iter().find(|&&r| r >= w).copied();
        if let Some(r) = outside(head_rows) {
            return Err(CpuError::Read(format!("head row {r} is outside the canvas of {w}")));
        }
        if logits.len() != head_rows.len() * v {
            return Err(CpuError::Length { what: "logits buffer", got: logits.len(), expected: head_rows.len() * v });
        }
        self.check_ids(canvas)?;
        self.check_positions(w)?;
        let mut x = self.embed(canvas);
        if let Some(sc) = conditioning {
            if let Some(r) = outside(sc.rows) {
                return Err(CpuError::Read(format!("self-conditioned row {r} is outside the canvas of {w}")));
            }
            if sc.logits.len() != sc.rows.len() * v {
                return Err(CpuError::Length { what: "self-conditioning logits", got: sc.logits.len(), expected: sc.rows.len() * v });
            }
            let signal = self.self_conditioning_signal(sc.logits, sc.rows.len());
            for (&r, s) in sc.rows.iter().zip(signal.chunks_exact(h)) {
                x[r * h..(r + 1) * h].iter_mut().zip(s).for_each(|(x, s)| *x += s);
            }
        }
        rms_norm_rows(&mut x, h, None, cfg.rms_norm_eps);
        self.decoder_layers(&mut x, w, 0..cfg.num_layers());
        // gemm multiplies one row by another path than several (its sums group differently), so
        // a row's logits would depend, by f32 rounding, on how many rows were asked: one row runs
        // as two, and a row reads the same bits in any read.
        let rows: &[usize] = if let [r] = head_rows { &[*r, *r] } else { head_rows };
        let at_rows: Vec<f32> = rows.iter().flat_map(|&r| x[r * h..(r + 1) * h].iter().copied()).collect();
        if rows.len() == head_rows.len() {
            self.head(&at_rows, rows.len(), logits);
        } else {
            let mut two = vec![0f32; rows.len() * v];
            self.head(&at_rows, rows.len(), &mut two);
            logits.copy_from_slice(&two[..v]);
        }
        Ok(())
    }
}

impl ReadModel for CpuModel {
    type Error = CpuError;

    fn canvas_length(&self) -> usize {
        self.config.canvas_length
    }

    fn vocab_size(&self) -> usize {
        self.config.text.vocab_size
    }

    fn read_forward(&mut self, canvas: &[u32], sc: Option<Conditioning<'_>>, rows: &[usize], logits: &mut [f32]) -> Result<(), CpuError> {
        CpuModel::read_forward(self, canvas, sc, rows, logits)
    }
}
