//! `cargo xtask bench-gpu`: the GPU canvas forward at a given geometry (default: the real model's
//! with 6 layers, one 5:1 period) on random weights, against a random cached context.
//!
//! Prints ms per canvas forward (device work plus submit/wait, without and with the logits
//! readback), ms per layer from a timestamp profile, and the per-kernel breakdown, with the work
//! counted from the config: achieved TFLOP/s and the memory-bandwidth floor of the f32 weights one
//! forward reads. Timing waits for the device before reading the clock; setup (weights, upload,
//! plans) stays outside. `--profile-encoder` also profiles the encoder (`DiffusionGemmaEncoderModel`)
//! on a prompt of `--context` tokens (one chunk) and then a commit of a canvas, in
//! [`ENCODER_PROFILES`] rounds: every round's time in kernels, and for the median round the host's
//! time writing its tables and recording each chunk's plan and the per-kernel breakdown; then the
//! prefill's wall time as `GpuModel::encode` runs it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use dg_gpu::{EncoderProfile, GpuContext, GpuModel, GpuOptions, Instrumentation, LayerContext};
use dg_model::{LayerKind, ModelConfig, TextConfig};
use dg_parity::testing::{random_context, seeded};

use crate::random_model;

/// Rounds of the encoder's profile (`--profile-encoder`): a single one was once 3× slower in
/// every kernel than the runs around it (bench/HISTORY.md), which one round cannot tell apart.
const ENCODER_PROFILES: usize = 3;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model config (HF config.json format).
    #[arg(long, default_value = "bench/configs/real-6layer.json")]
    config: PathBuf,
    /// Cached context tokens (the prompt already encoded).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Timed canvas forwards.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Also run a timestamp-query profile of one forward.
    #[arg(long)]
    profile: bool,
    /// Also profile the encoder: a prefill of `--context` tokens, then the commit of a canvas.
    #[arg(long)]
    profile_encoder: bool,
    /// Adapter name substring.
    #[arg(long)]
    adapter: Option<String>,
    /// Storage of the weight matrices on the GPU (arithmetic is f32 either way).
    #[arg(long, value_enum, default_value = "f32")]
    weights: random_model::WeightsArg,
    /// Device memory bandwidth in GB/s for the bandwidth floor (default: the H200's 4.8 TB/s).
    #[arg(long, default_value_t = 4800.0)]
    bandwidth: f64,
}

/// The work of one canvas forward with self-conditioning, counted from the config (matrices only;
/// norms, RoPE and softmaxes are left out).
struct Cost {
    /// FLOPs of each decoder layer: projections, attention over the visible cache plus the canvas,
    /// dense MLP, router and the top-k experts of every token.
    layer_flops: Vec<f64>,
    /// The layers plus the soft embedding P·E, the self-conditioning MLP and the tied head.
    flops: f64,
    /// f32 weight bytes read: every matrix once (with C = 256 tokens × top-8 nearly every expert
    /// is hit) and the embedding twice (soft embedding and head).
    bytes: f64,
    /// The part of `bytes` in the decoder layers.
    layer_bytes: f64,
}

fn forward_cost(cfg: &TextConfig, canvas: usize, context: usize, bytes_per_weight: f64) -> Cost {
    let (t, h, heads) = (canvas as f64, cfg.hidden_size as f64, cfg.num_attention_heads as f64);
    let (dense, e, k, ie) =
        (cfg.intermediate_size as f64, cfg.num_experts as f64, cfg.top_k_experts as f64, cfg.moe_intermediate_size as f64);
    let mut layer_flops = Vec::new();
    let mut layer_params = 0.0;
    for l in &cfg.layers {
        let (d, kv) = (l.head_dim as f64, l.num_kv_heads as f64);
        let cached = match l.kind {
            LayerKind::Sliding => context.min(cfg.sliding_kept()),
            LayerKind::Full => context,
        };
        let kv_projections = if l.has_v_proj() { 2.0 } else { 1.0 };
        // q, o, k (and v), dense gate/up/down, router: every token goes through all of them.
        let shared = 2.0 * heads * d * h + kv_projections * kv * d * h + 3.0 * h * dense + e * h;
        let attention = 2.0 * 2.0 * t * heads * d * (cached as f64 + t); // scores and P·V
        let experts = 2.0 * t * k * 3.0 * h * ie;
        layer_flops.push(2.0 * t * shared + attention + experts);
        layer_params += shared + e * 3.0 * h * ie;
    }
    let (v, sc_mlp) = (cfg.vocab_size as f64, 3.0 * h * dense);
    let flops = layer_flops.iter().sum::<f64>() + 2.0 * (2.0 * t * v * h) + 2.0 * t * sc_mlp;
    Cost {
        layer_flops,
        flops,
        bytes: bytes_per_weight * (layer_params + sc_mlp + 2.0 * v * h),
        layer_bytes: bytes_per_weight * layer_params,
    }
}

pub fn run(args: Args) -> Result<bool> {
    let config = ModelConfig::from_file(&args.config).with_context(|| format!("reading {}", args.config.display()))?;
    let cfg = &config.text;
    let (c, v) = (config.canvas_length, cfg.vocab_size);
    println!(
        "config: {} layers, hidden {}, vocab {}, {} experts top-{}, canvas {c}, context {}",
        cfg.num_layers(),
        cfg.hidden_size,
        v,
        cfg.num_experts,
        cfg.top_k_experts,
        args.context
    );
    let env = dg_lab::overrides::gpu_options_from_env()?;
    let ctx = GpuContext::new(&GpuOptions { adapter: args.adapter.clone().or(env.adapter), ..env })?;
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {}), cooperative matrices: {}",
        ctx.info.name,
        ctx.info.device_type,
        ctx.info.backend,
        ctx.info.driver,
        ctx.info.driver_info,
        if ctx.coop_matrix { "yes" } else { "no" }
    );
    let t = Instant::now();
    // Room for a committed canvas after the prompt when the encoder is profiled.
    let max_context = args.context + if args.profile_encoder { c } else { 0 };
    let (mut model, label) = random_model::upload(ctx, &config, args.weights, max_context)?;
    println!(
        "random weights + upload: {:.1}s, {:.2} GB of weights on the GPU ({label}, {:.2} bytes per parameter)",
        t.elapsed().as_secs_f64(),
        model.weight_bytes() as f64 / 1e9,
        model.weight_bytes() as f64 / model.weight_parameters().max(1) as f64
    );

    let kv = random_context(cfg, args.context);
    let layers: Vec<LayerContext<'_>> = kv.iter().map(|(k, v)| LayerContext { keys: k, values: v }).collect();
    let t = Instant::now();
    model.set_context(args.context, &layers)?;
    println!("context + plans: {:.2}s, {} dispatches per forward", t.elapsed().as_secs_f64(), model.dispatches());

    let canvas: Vec<u32> = (0..c as u32).map(|i| i.wrapping_mul(2_654_435_761) % v as u32).collect();
    let sc = seeded(c * v, 99, 8.0);
    let mut logits = vec![0f32; c * v];
    model.canvas_forward(&canvas, Some(&sc), &mut logits)?;
    model.run_step(&canvas, true, None)?;
    let created = model.created();

    let time = |model: &mut GpuModel, read: bool, logits: &mut [f32]| -> Result<f64> {
        let t = Instant::now();
        for _ in 0..args.steps {
            model.run_step(&canvas, true, if read { Some(&mut *logits) } else { None })?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e3 / args.steps as f64)
    };
    let layers_n = cfg.num_layers();
    let no_read = time(&mut model, false, &mut logits)?;
    let with_read = time(&mut model, true, &mut logits)?;
    assert_eq!(created, model.created(), "a GPU object was created during the timed steps");
    println!(
        "canvas forward (self-conditioning on): {no_read:.2} ms without readback, {with_read:.2} ms with the [C, V] logits readback ({} steps)",
        args.steps
    );
    let cost = forward_cost(cfg, c, args.context, model.weight_bytes() as f64 / model.weight_parameters().max(1) as f64);
    let layers_flops: f64 = cost.layer_flops.iter().sum();
    println!(
        "work per forward: {:.1} GFLOP ({:.1} in the {layers_n} layers), {:.2} GB of weights read ({:.2} in the layers)",
        cost.flops / 1e9,
        layers_flops / 1e9,
        cost.bytes / 1e9,
        cost.layer_bytes / 1e9
    );
    let floor_ms = |bytes: f64| bytes / (args.bandwidth * 1e9) * 1e3;
    println!("achieved GEMM TFLOP/s (counted FLOPs / wall time): {:.1} over the forward", cost.flops / (no_read * 1e-3) / 1e12);
    println!(
        "memory-bandwidth floor at {:.0} GB/s: {:.2} ms per forward (measured {:.1}x the floor), {:.3} ms for the layers",
        args.bandwidth,
        floor_ms(cost.bytes),
        no_read / floor_ms(cost.bytes),
        floor_ms(cost.layer_bytes)
    );
    println!(
        "objects created after the first step: none (buffers {}, bind groups {}, pipelines {})",
        created.buffers, created.bind_groups, created.pipelines
    );
    println!(
        "host encoding of a forward's commands (before its submit): {:.3} ms for {} dispatches (median of 20)",
        model.time_encoding(20)?,
        model.dispatches()
    );
    let layers_ms = model.time_layers(args.steps)?;
    println!(
        "decoder layers alone (one pass, wall time, {} replays): {layers_ms:.2} ms for {layers_n} layers = {:.3} ms per layer",
        args.steps,
        layers_ms / layers_n as f64
    );
    println!(
        "achieved GEMM TFLOP/s in the decoder layers: {:.1} ({:.1}x the layers' bandwidth floor)",
        layers_flops / (layers_ms * 1e-3) / 1e12,
        layers_ms / floor_ms(cost.layer_bytes)
    );

    if args.profile {
        let prof = model.profile_step(&canvas, true)?;
        let by_scope = print_kernels("profile (timestamp queries, one pass per dispatch)", &prof);
        let layer_ms: Vec<f64> = (0..layers_n).map(|i| by_scope.get(&format!("layer{i}")).copied().unwrap_or(0.0) / 1e6).collect();
        println!("mean per layer: {:.3} ms", layer_ms.iter().sum::<f64>() / layers_n as f64);
        println!("| layer | ms | GFLOP | TFLOP/s |\n|---|---|---|---|");
        for (i, (ms, flops)) in layer_ms.iter().zip(&cost.layer_flops).enumerate() {
            println!("| layer{i} ({}) | {ms:.3} | {:.1} | {:.1} |", cfg.layers[i].kind.hf_name(), flops / 1e9, flops / (ms * 1e-3) / 1e12);
        }
        print_dispatches(&prof, "layer", layers_n);
    }
    if args.profile_encoder {
        // The prompt from an empty cache, then a canvas committed after it: one chunk each, once
        // to compile the encoder's pipelines.
        let prompt: Vec<u32> = (0..args.context as u32).map(|i| i.wrapping_mul(2_246_822_519) % v as u32).collect();
        model.reset();
        model.encode(&prompt)?;
        model.encode(&canvas)?;
        // Profiled ENCODER_PROFILES times (a prefill then a commit each round); the round with
        // the median total is printed, and every round's total, so that a slow round shows.
        let mut rounds: [Vec<EncoderProfile>; 2] = Default::default();
        for _ in 0..ENCODER_PROFILES {
            model.reset();
            rounds[0].push(model.profile_encode(&prompt)?);
            rounds[1].push(model.profile_encode(&canvas)?);
        }
        for (what, mut profiles) in ["prefill", "commit"].into_iter().zip(rounds) {
            let total = |p: &EncoderProfile| p.kernels.iter().map(|k| k.2).sum::<f64>() / 1e6;
            let totals: Vec<String> = profiles.iter().map(|p| format!("{:.2}", total(p))).collect();
            profiles.sort_by(|a, b| total(a).total_cmp(&total(b)));
            let p = &profiles[profiles.len() / 2];
            let title = format!(
                "encoder {what} of {} tokens at position {} (the median of {ENCODER_PROFILES} profiled rounds: {} ms in kernels)",
                p.tokens,
                if what == "prefill" { 0 } else { args.context },
                totals.join(", ")
            );
            let by_scope = print_kernels(&title, &p.kernels);
            let layer_ms: f64 =
                (0..layers_n).map(|i| by_scope.get(&format!("encoder layer{i}")).copied().unwrap_or(0.0)).sum::<f64>() / 1e6;
            println!(
                "host: ids and RoPE tables {:.2} ms, recording of the plan {:.2} ms; layers {layer_ms:.2} ms in kernels, {:.3} ms a layer",
                p.tables_ms,
                p.record_ms,
                layer_ms / layers_n as f64
            );
            print_dispatches(&p.kernels, "encoder layer", layers_n);
        }
        // The same prefill as `GpuModel::encode` runs it (recorded and submitted a layer at a
        // time, no timestamps), wall time to its completion, beside the kernels' sum above.
        let walls: Vec<String> = (0..ENCODER_PROFILES)
            .map(|_| -> Result<String> {
                model.reset();
                let start = Instant::now();
                model.encode(&prompt)?;
                Ok(format!("{:.2}", start.elapsed().as_secs_f64() * 1e3))
            })
            .collect::<Result<_>>()?;
        println!("\nencoder prefill of {} tokens as `encode` runs it, wall: {} ms", prompt.len(), walls.join(", "));
    }
    Ok(true)
}

/// Prints a profile's total, its time by scope and by kernel (most first); returns the
/// nanoseconds by scope.
fn print_kernels(title: &str, prof: &[(String, String, f64)]) -> BTreeMap<String, f64> {
    let total: f64 = prof.iter().map(|p| p.2).sum();
    let mut by_scope: BTreeMap<String, f64> = BTreeMap::new();
    let mut by_kernel: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for (scope, kernel, ns) in prof {
        *by_scope.entry(scope.clone()).or_default() += ns;
        let e = by_kernel.entry(kernel.clone()).or_default();
        e.0 += ns;
        e.1 += 1;
    }
    println!("\n{title}: {:.2} ms in kernels", total / 1e6);
    println!("| scope | ms |\n|---|---|");
    for (scope, ns) in &by_scope {
        println!("| {scope} | {:.3} |", ns / 1e6);
    }
    println!("\n| kernel | dispatches | ms | share |\n|---|---|---|---|");
    let mut kernels: Vec<_> = by_kernel.into_iter().collect();
    kernels.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    for (k, (ns, n)) in kernels {
        println!("| {k} | {n} | {:.3} | {:.1}% |", ns / 1e6, 100.0 * ns / total);
    }
    by_scope
}

/// Prints every dispatch of the first and the last layer (scopes `{layer}0` and `{layer}{n - 1}`).
fn print_dispatches(prof: &[(String, String, f64)], layer: &str, layers_n: usize) {
    println!("\nper dispatch of {layer}0 and {layer}{}:", layers_n - 1);
    let (first, last) = (format!("{layer}0"), format!("{layer}{}", layers_n - 1));
    for (scope, kernel, ns) in prof {
        if *scope == first || *scope == last {
            println!("  {scope:16} {kernel:40} {:8.1} us", ns / 1e3);
        }
    }
}
