//! Split K for the dense tensor-core kernel: a product whose tiles would leave most
//! multiprocessors idle runs its K in ranges, one layer of workgroups each, whose partials
//! `crate::split_k` adds (or the product's consumer, as it reads them). When a product splits, and
//! how far, is the planner's rule (`dg_gpu::planner::split`).

use crate::gemm::GemmParams;

/// K cut into `splits` ranges of `steps` K steps (the last may be shorter), one layer of
/// workgroups each, whose partial products [`crate::split_k`] adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub splits: u32,
    pub steps: u32,
}

impl Split {
    /// Elements of the partial products.
    pub fn partial_len(self, p: &GemmParams) -> u64 {
        u64::from(self.splits) * self.split_stride(p) as u64
    }

    fn split_stride(self, p: &GemmParams) -> u32 {
        p.batch.max(1) * p.m * p.n
    }

    /// The tensor-core GEMM's parameters for the partials: `p`'s operands, C as contiguous
    /// `[splits][batch][m][n]` at the start of the scratch, a plain product.
    pub fn partial_params(self, p: &GemmParams) -> GemmParams {
        GemmParams {
            c_offset: 0,
            c_rs: p.n,
            c_batch: p.m * p.n,
            alpha: 1.0,
            accumulate: 0,
            epilogue: crate::gemm::EPILOGUE_NONE,
            cap: 0.0,
            split_steps: self.steps,
            split_stride: self.split_stride(p),
            ..*p
        }
    }

    /// The reduction's parameters: `p`'s C, alpha, accumulate and epilogue.
    pub fn reduce_params(self, p: &GemmParams) -> crate::split_k::SplitKParams {
        crate::split_k::SplitKParams {
            m: p.m,
            n: p.n,
            batch: p.batch.max(1),
            splits: self.splits,
            split_stride: self.split_stride(p),
            c_offset: p.c_offset,
            c_rs: p.c_rs,
            c_batch: p.c_batch,
            alpha: p.alpha,
            accumulate: p.accumulate,
            epilogue: p.epilogue,
            cap: p.cap,
        }
    }
}
