//! The experts' tensor-core product (`dg_kernels::coop_grouped_gemm`) on seeded inputs, as the
//! tests and the throughput probes run it: a grouped product's inputs with padded strides
//! ([`Case`], [`Inputs`]), its buffers with F16 experts in K panels ([`Buffers`]), a run through
//! the Recorder or of one tile directly, and the exact (f64) product of the f16-rounded operands
//! it is checked against ([`grouped_reference`], [`check`]).

use dg_gpu::ops::Recorder;
use dg_gpu::{GpuContext, GpuMatrix, MatrixLayout, Pipelines};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{AFormat, CoopTile};
use dg_kernels::coop_grouped_gemm::{self, WPath};
use dg_kernels::grouped_gemm::GroupedGemmParams;

use super::{GUARD, guarded_output, max_rel_err, read_guarded, seeded};

/// Tolerance on max |C − C_ref| / max |C_ref| against the exact product of the f16-rounded
/// operands: products of two f16 values are exact in f32, so the only error is the f32
/// accumulation over k terms, about ε·√k of the largest output (see `coop_gemm.rs`); 16·ε·√k
/// leaves a wide margin while an indexing or staging bug gives errors of order 1.
pub fn tolerance(k: usize) -> f32 {
    16.0 * f32::EPSILON * (k as f32).sqrt()
}

/// `v` rounded to f16 and back (the operands the tensor cores multiply).
pub fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// One grouped product's inputs.
#[derive(Debug, Clone)]
pub struct Case {
    pub n: usize,
    pub k: usize,
    pub counts: Vec<u32>,
    pub gather: bool,
}

/// A grouped product's parameters and host data ([`Case::inputs`]).
#[derive(Debug, Clone)]
pub struct Inputs {
    pub params: GroupedGemmParams,
    pub offsets: Vec<u32>,
    pub rows: Vec<u32>,
    pub a: Vec<f32>,
    pub w: Vec<f32>,
    pub c0: Vec<f32>,
    pub slots: usize,
}

impl Case {
    /// Seeded inputs with padded strides: A rows of k + 4, C rows of n + 4 (columns n.. must keep
    /// their values); the experts back to back, as the K-panel upload stores them.
    pub fn inputs(&self, seed: u64) -> Inputs {
        let (n, k) = (self.n, self.k);
        let mut offsets = vec![0u32];
        for &c in &self.counts {
            offsets.push(offsets.last().unwrap() + c);
        }
        let slots = *offsets.last().unwrap() as usize;
        let tokens = if self.gather { slots.div_ceil(3).max(1) } else { slots.max(1) };
        let rows: Vec<u32> = (0..slots.max(1)).map(|s| ((s * 7 + 3) % tokens) as u32).collect();
        let (a_rs, c_rs, stride) = (k + 4, n + 4, n * k);
        let params = GroupedGemmParams {
            n: n as u32,
            k: k as u32,
            groups: self.counts.len() as u32,
            max_rows: *self.counts.iter().max().unwrap(),
            a_rs: a_rs as u32,
            b_group_stride: stride as u32,
            c_rs: c_rs as u32,
            gather: u32::from(self.gather),
            ..bytemuck::Zeroable::zeroed()
        };
        Inputs {
            params,
            offsets,
            rows,
            a: seeded(tokens * a_rs, seed, 1.0),
            w: f16_round(&seeded(self.counts.len() * stride, seed + 1, 1.0)),
            c0: seeded(slots.max(1) * c_rs, seed + 2, 2.0),
            slots,
        }
    }
}

impl Inputs {
    /// A as a kernel reading it in format `a` takes it: f32 words, or halves two a word.
    pub fn a_words(&self, a: AFormat) -> Vec<u32> {
        match a {
            AFormat::F32 => bytemuck::cast_slice(&self.a).to_vec(),
            AFormat::F16 => dg_kernels::pack_f16(&self.a),
        }
    }

    /// The same product over the tile table of m tiles of `tile_rows` (after the offsets, as
    /// `moe_dispatch` writes it) instead of the `max_rows` grid.
    pub fn with_table(&self, tile_rows: u32) -> Inputs {
        let groups = self.params.groups as usize;
        let counts: Vec<u32> = self.offsets[..=groups].windows(2).map(|w| w[1] - w[0]).collect();
        let table = coop_grouped_gemm::tile_table(&counts, self.slots as u32, tile_rows);
        let params = GroupedGemmParams { tiles: table.len() as u32, tile_rows, ..self.params };
        Inputs { params, offsets: [&self.offsets[..=groups], &table[..]].concat(), ..self.clone() }
    }
}

/// The experts of `x` as the F16 upload on a tensor-core device stores them: K panels of `panel`
/// columns.
pub fn panelled(ctx: &GpuContext, x: &Inputs, panel: u32) -> GpuMatrix {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    let words: Vec<u32> = x.w.chunks_exact(n * k).flat_map(|g| coop_grouped_gemm::pack_f16_panels(g, n, k, panel as usize)).collect();
    GpuMatrix { buffer: ctx.upload("w", &words).unwrap(), format: WeightFormat::F16, layout: MatrixLayout::KPanels }
}

/// The buffers of one grouped product: experts in K panels of `panel` columns, C holding `c0`
/// inside a guard band.
#[derive(Debug)]
pub struct Buffers {
    pub a: wgpu::Buffer,
    pub w: GpuMatrix,
    pub offsets: wgpu::Buffer,
    pub rows: wgpu::Buffer,
    pub c: wgpu::Buffer,
}

impl Buffers {
    pub fn upload(ctx: &GpuContext, x: &Inputs, panel: u32) -> Self {
        let c = guarded_output(ctx, "c", x.c0.len());
        ctx.queue.write_buffer(&c, 0, bytemuck::cast_slice(&x.c0));
        Buffers {
            a: ctx.upload("a", &x.a).unwrap(),
            w: panelled(ctx, x, panel),
            offsets: ctx.upload("offsets", &x.offsets).unwrap(),
            rows: ctx.upload("rows", &x.rows).unwrap(),
            c,
        }
    }
}

/// Runs the grouped product through the Recorder on F16 experts in K panels; returns C.
pub fn run_grouped(ctx: &GpuContext, pipelines: &mut Pipelines, x: &Inputs) -> Vec<f32> {
    let b = Buffers::upload(ctx, x, coop_grouped_gemm::PANEL);
    let mut rec = Recorder::new(ctx, pipelines);
    rec.grouped_product((&b.a, AFormat::F32), &b.w, &b.offsets, &b.rows, &b.c, x.slots, x.params).unwrap();
    rec.finish().unwrap().run(ctx).unwrap();
    read_guarded(ctx, &b.c, x.c0.len())
}

/// The exact product of the f16-rounded operands over the slots `pick` keeps; C's other values as
/// they were.
pub fn grouped_reference(x: &Inputs, pick: impl Fn(usize) -> bool) -> Vec<f32> {
    let p = &x.params;
    let (n, k, a_rs, c_rs, stride) = (p.n as usize, p.k as usize, p.a_rs as usize, p.c_rs as usize, p.b_group_stride as usize);
    let a16 = f16_round(&x.a);
    let mut want = x.c0.clone();
    for e in 0..p.groups as usize {
        for s in (x.offsets[e] as usize..x.offsets[e + 1] as usize).filter(|&s| pick(s)) {
            let row = if p.gather != 0 { x.rows[s] as usize } else { s };
            for j in 0..n {
                let sum: f64 = (0..k).map(|q| f64::from(a16[row * a_rs + q]) * f64::from(x.w[e * stride + j * k + q])).sum();
                want[s * c_rs + j] = sum as f32;
            }
        }
    }
    want
}

pub fn check(got: &[f32], want: &[f32], x: &Inputs, pick: impl Fn(usize) -> bool, what: &str) {
    let c_rs = x.params.c_rs as usize;
    let n = x.params.n as usize;
    for s in 0..x.slots {
        for j in n..c_rs {
            assert_eq!(got[s * c_rs + j].to_bits(), want[s * c_rs + j].to_bits(), "{what}: slot {s} column {j} past n was written");
        }
    }
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for s in (0..x.slots).filter(|&s| pick(s)) {
        g.extend_from_slice(&got[s * c_rs..s * c_rs + n]);
        w.extend_from_slice(&want[s * c_rs..s * c_rs + n]);
    }
    assert!(g.iter().all(|&v| v != GUARD), "{what}: a slot left unwritten");
    let (err, at) = max_rel_err(&g, &w);
    let tol = tolerance(x.params.k as usize);
    assert!(err <= tol, "{what}: rel err {err} > {tol} at {at}: got {} want {}", g[at], w[at]);
}

/// A plan of `replays` dispatches of `tile`'s kernel on `b` (bypassing the Recorder's choice).
pub fn tile_plan(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    tile: CoopTile,
    path: WPath,
    x: &Inputs,
    b: &Buffers,
    replays: u32,
) -> dg_gpu::Plan {
    let pipeline = pipelines.get_source(ctx, coop_grouped_gemm::source_with(super::on_device(ctx, tile), path)).unwrap();
    let mut plan = dg_gpu::PlanBuilder::new(ctx);
    for _ in 0..replays {
        plan.push(&pipeline, &x.params, &[&b.a, &b.w.buffer, &b.offsets, &b.rows, &b.c], coop_grouped_gemm::workgroups(tile, &x.params));
    }
    plan.finish(ctx).unwrap()
}

/// Runs `tile`'s kernel once; returns C.
pub fn run_tile(ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, x: &Inputs) -> Vec<f32> {
    // K panels as the upload writes them, whatever the tile's K step.
    let b = Buffers::upload(ctx, x, coop_grouped_gemm::PANEL);
    tile_plan(ctx, pipelines, tile, path, x, &b, 1).run(ctx).unwrap();
    read_guarded(ctx, &b.c, x.c0.len())
}

/// 256 tokens routed top-8 over 128 experts by a seeded hash: the decoder's slot counts.
pub fn real_counts(seed: u64) -> Vec<u32> {
    let mut counts = vec![0u32; 128];
    let mut s = seed | 1;
    for _ in 0..256 {
        let mut chosen = Vec::new();
        while chosen.len() < 8 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let e = (s % 128) as usize;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for e in chosen {
            counts[e] += 1;
        }
    }
    counts
}
