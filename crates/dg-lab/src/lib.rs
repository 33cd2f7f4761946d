//! dg-lab: what was tried and may be tried again, kept out of the product.
//!
//! The product (the kernels some planner rule can choose, the planner, the forward) lives in
//! dg-kernels and dg-gpu; the cross-checks that prove it right in dg-parity. This crate holds the
//! experiments around them: [`probe`], timed measurements of dg's kernels and of the GPU itself
//! (`cargo xtask probe NAME`), and [`coopmat2`], GEMMs written with `VK_NV_cooperative_matrix2`
//! timed beside dg's tiles (`cargo xtask coopmat2-probe`); [`tiles`], the tensor-core tiles no
//! planner rule picks; [`pipeline_cache`], wgpu's pipeline cache measured across processes; [`coop_configs`], the
//! driver's own list of cooperative-matrix configurations (the 8-bit ones wgpu does not report); and
//! [`overrides`], the lab's `DG_*` variables parsed into the one
//! `dg_gpu::Overrides` value through which they reach the planner. Nothing here is reachable from
//! `dg`.
//!
//! The rule (docs/architecture.md): a variant is promoted into the product only with a planner
//! rule and a changed golden plan; a losing one is deleted once its bench/history entry is
//! written (git keeps the code).

pub mod coop_configs;
pub mod coopmat2;
pub mod overrides;
pub mod pipeline_cache;
pub mod probe;
pub mod tiles;
