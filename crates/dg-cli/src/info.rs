//! `dg info`: a model's geometry, parameter count, checkpoint dtype and memory per backend, and the
//! GPU adapters wgpu finds with their key limits and features.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use dg_model::{LayerKind, ModelConfig, ModelDir, StoredDtype, tensor_manifest, vision_manifest};
use serde_json::{Value, json};

use crate::args::InfoArgs;
use crate::error::Input;
use crate::model_dir;

pub fn run(args: InfoArgs) -> Result<()> {
    if args.schemes {
        return schemes(&args);
    }
    let dir = model_dir::resolve(args.model.as_deref())?;
    let model = model_dir::open_with_mmproj(&dir, args.mmproj.as_deref())?;
    let adapters = adapters(&model.config);
    let info = model_json(&model, &dir, model_dir::is_bundled(&dir), adapters);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", render(&info));
    }
    Ok(())
}

/// `dg info --schemes`: the memory table of the model's geometry, or `--config`'s.
fn schemes(args: &InfoArgs) -> Result<()> {
    let (config, model) = match &args.config {
        Some(path) => (ModelConfig::from_file(path).context(Input(format!("cannot read {}", path.display())))?, None),
        None => {
            let model = model_dir::open(&model_dir::resolve(args.model.as_deref())?)?;
            (model.config.clone(), Some(model))
        }
    };
    // A bare config is counted as the released checkpoint stores it: BF16.
    let stored = |name: &str| model.as_ref().and_then(|m| stored_dtype(m, name)).unwrap_or(StoredDtype::BF16);
    let rows = crate::schemes::rows(&config, &stored, args.context)?;
    let context = args.context.min(config.text.max_position_embeddings);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&crate::schemes::json(&rows, context))?);
    } else {
        print!("{}", crate::schemes::render(&rows, context));
    }
    Ok(())
}

/// The type `model`'s checkpoint stores tensor `name` in; `None` when it is missing or a dtype dg
/// does not read.
fn stored_dtype(model: &ModelDir, name: &str) -> Option<StoredDtype> {
    let (_, dtype) = model.checkpoint.shape(name).ok()?;
    StoredDtype::ALL.into_iter().find(|d| d.name() == dtype)
}

/// Bytes of `elements` elements stored as `dtype` (a safetensors or ggml type name); 0 for a
/// missing tensor.
fn stored_bytes(dtype: &str, elements: usize) -> u64 {
    let per_element = match dtype {
        "F64" | "I64" | "U64" => 8,
        "I32" | "U32" => 4,
        "I16" | "U16" => 2,
        "missing" => 0,
        other => match StoredDtype::ALL.into_iter().find(|d| d.name() == other) {
            Some(d) => return d.bytes_for(elements).unwrap_or(0) as u64,
            None => 1,
        },
    };
    elements as u64 * per_element
}

/// The vision tower and its projection (`model.encoder.vision_tower.*`, `embed_vision.*`): its
/// geometry, parameters, bytes as stored and as the f32 CPU reference holds them; null without a
/// `vision_config`.
fn vision_json(model: &ModelDir) -> Value {
    let Some(v) = &model.config.vision else { return Value::Null };
    let (mut params, mut stored, mut missing) = (0u64, 0u64, 0usize);
    for (name, shape) in vision_manifest(v, model.config.text.hidden_size) {
        let elements: usize = shape.iter().product();
        params += elements as u64;
        match (&model.mmproj, model.checkpoint.shape(&name)) {
            (Some(_), _) => {}
            (None, Ok((_, dtype))) => stored += stored_bytes(&dtype, elements),
            (None, Err(_)) => missing += 1,
        }
    }
    if let Some(mmproj) = &model.mmproj {
        stored = mmproj.tensor_bytes();
    }
    // What `dg generate --weights auto` uploads of the tower on a GPU without tensor cores and
    // with them (`crate::weights::tower_format`).
    let tower_format = |tensor_cores| crate::weights::tower_format(model, crate::args::WeightsArg::Auto, tensor_cores);
    let src = model.vision_source();
    let manifest = vision_manifest(v, model.config.text.hidden_size);
    let dtype = |name: &str| {
        let shape = manifest.iter().find(|(n, _)| n == name).map(|(_, s)| s.as_slice()).unwrap_or_default();
        src.stored(name, shape).map_or(StoredDtype::F32, |t| t.dtype)
    };
    let gpu = |format| crate::footprint::tower_bytes(v, model.config.text.hidden_size, &dtype, format);
    json!({
        "num_hidden_layers": v.num_layers,
        "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size,
        "num_attention_heads": v.num_heads,
        "head_dim": v.head_dim,
        "patch_size": v.patch_size,
        "pooling_kernel_size": v.pooling_kernel_size,
        "parameters": params,
        "stored_bytes": stored,
        "missing_tensors": missing,
        "cpu_f32_bytes": params * 4,
        "gpu": {
            "dtype": crate::weights::name(tower_format(false)),
            "device_bytes": gpu(tower_format(false)).total,
            "tensor_cores": { "dtype": crate::weights::name(tower_format(true)), "device_bytes": gpu(tower_format(true)).total },
        },
    })
}

fn model_json(model: &ModelDir, path: &std::path::Path, bundled: bool, adapters: Vec<Value>) -> Value {
    let t = &model.config.text;
    let params = t.num_parameters();
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    let mut dtype_bytes: BTreeMap<String, u64> = BTreeMap::new();
    let mut checkpoint_bytes = 0u64;
    let mut tensors = Vec::new();
    for (name, shape) in tensor_manifest(t) {
        let dtype = match model.checkpoint.shape(&name) {
            Ok((_, dtype)) => dtype,
            Err(_) => "missing".to_string(),
        };
        let bytes = stored_bytes(&dtype, shape.iter().product());
        checkpoint_bytes += bytes;
        *dtypes.entry(dtype.clone()).or_default() += 1;
        *dtype_bytes.entry(dtype.clone()).or_default() += bytes;
        let gguf_name = model.checkpoint.gguf().and_then(|_| dg_model::gguf::to_gguf(&name));
        tensors.push(json!({ "name": name, "gguf_name": gguf_name, "shape": shape, "dtype": dtype, "bytes": bytes }));
    }
    let format = if model.checkpoint.gguf().is_some() { "gguf" } else { "safetensors" };
    let vision = vision_json(model);
    let layer = |kind: LayerKind| t.layers.iter().find(|l| l.kind == kind);
    let heads = |kind| layer(kind).map(|l| json!({ "kv_heads": l.num_kv_heads, "head_dim": l.head_dim }));
    let kv_bytes_per_token: usize = t.layers.iter().map(|l| 2 * l.num_kv_heads * l.head_dim * 4).sum();
    // What `dg generate --weights auto` stores on a GPU without tensor cores, and with them (the
    // F16 mode): a quantized checkpoint's blocks where the GPU reads them, the rest in the upload's
    // format.
    let auto = |tensor_cores| crate::weights::choose(model, crate::args::WeightsArg::Auto, tensor_cores).format;
    let (gpu_format, coop_format) = (auto(false), auto(true));
    let gpu_name = crate::weights::name(gpu_format);
    let stored = |name: &str| stored_dtype(model, name).unwrap_or(StoredDtype::F32);
    let gpu = crate::footprint::weight_bytes(t, &stored, gpu_format);
    let coop = crate::footprint::weight_bytes(t, &stored, coop_format);
    json!({
        "model": path.display().to_string(),
        "bundled_random_model": bundled,
        "layers": t.layers.iter().map(|l| l.kind.hf_name()).collect::<Vec<_>>(),
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "num_attention_heads": t.num_attention_heads,
        "sliding_heads": heads(LayerKind::Sliding),
        "full_heads": heads(LayerKind::Full),
        "num_experts": t.num_experts,
        "top_k_experts": t.top_k_experts,
        "moe_intermediate_size": t.moe_intermediate_size,
        "vocab_size": t.vocab_size,
        "canvas_length": model.config.canvas_length,
        "sliding_window": t.sliding_window,
        "max_position_embeddings": t.max_position_embeddings,
        "parameters": params,
        "vision": vision,
        "checkpoint": {
            "format": format,
            "path": model.checkpoint.origin().display().to_string(),
            "dtypes": dtypes,
            "dtype_bytes": dtype_bytes,
            "text_bytes": checkpoint_bytes,
            "tensors": tensors,
        },
        "memory": {
            "cpu": { "dtype": "f32", "bytes": params * 4 },
            "gpu": {
                "dtype": gpu_name,
                "device_bytes": gpu.total,
                "device_bytes_by_format": gpu.by_format,
                "bytes_per_parameter": gpu.total as f64 / params.max(1) as f64,
                "tensor_cores": { "dtype": crate::weights::name(coop_format), "device_bytes": coop.total, "device_bytes_by_format": coop.by_format },
            },
            "kv_cache_bytes_per_token": kv_bytes_per_token,
            // The GPU's caches of one sequence at a few context lengths: sliding layers hold
            // only their window and an encoder chunk, so past those the cache grows with the
            // full layers alone; f32, or f16 where the tensor cores run all attention (the real
            // model in the F16 and quantized modes).
            "gpu_kv_cache_bytes": gpu_cache_contexts(t.max_position_embeddings)
                .map(|positions| {
                    let bytes = |format| dg_gpu::sequence_cache_bytes(&model.config, positions, format);
                    // The whole arena (activations and the default cache) of one sequence: with
                    // the tensor cores and without (f32), bindings unbounded.
                    let arena = |format, coop| dg_gpu::arena_bytes(&model.config, positions, 1, format, (u64::MAX, coop)).ok();
                    json!({
                        "positions": positions,
                        "bytes": bytes(dg_gpu::WeightFormat::F32),
                        "f16_bytes": bytes(dg_gpu::WeightFormat::F16),
                        "arena_bytes": { "tensor_cores": arena(dg_gpu::tensor_core_cache_format(&model.config), true), "portable": arena(dg_gpu::WeightFormat::F32, false) },
                    })
                })
                .collect::<Vec<_>>(),
            // Each sequence of a GPU batch: its canvas's logits and self-conditioning input, and
            // its own KV cache (per token of its context).
            "batch_sequence_bytes": dg_gpu::canvas_vocab_bytes(&model.config),
        },
        "adapters": adapters,
    })
}

/// The context lengths `dg info` gives the GPU cache's bytes for: 4096, `dg serve`'s default
/// context, and the model's longest (each at most the model's longest).
fn gpu_cache_contexts(max_positions: usize) -> impl Iterator<Item = usize> {
    let mut at = vec![4096.min(max_positions), crate::settings::DEFAULT_CONTEXT_CAP.min(max_positions), max_positions];
    at.dedup();
    at.into_iter()
}

/// Every adapter wgpu finds, with its key limits and features.
fn adapters(config: &dg_model::ModelConfig) -> Vec<Value> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let found = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    found
        .iter()
        .map(|a| {
            let info = a.get_info();
            let limits = a.limits();
            let features = a.features();
            json!({
                "name": info.name,
                "device_type": format!("{:?}", info.device_type),
                "backend": format!("{:?}", info.backend),
                "driver": format!("{} {}", info.driver, info.driver_info).trim().to_string(),
                "max_storage_buffer_binding_size": limits.max_storage_buffer_binding_size,
                "max_buffer_size": limits.max_buffer_size,
                "canvases_per_binding": dg_gpu::canvases_per_binding(config, limits.max_storage_buffer_binding_size),
                "shader_f16": features.contains(wgpu::Features::SHADER_F16),
                "subgroup": features.contains(wgpu::Features::SUBGROUP),
                "timestamp_query": features.contains(wgpu::Features::TIMESTAMP_QUERY),
            })
        })
        .collect()
}

fn size(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1_048_576 => format!("{:.1} KiB", b / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", b / 1_048_576.0),
        _ => format!("{:.1} GiB", b / 1_073_741_824.0),
    }
}

fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The text form of [`model_json`].
fn render(v: &Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let layers: Vec<&str> = v["layers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let pattern: Vec<&str> = layers.iter().map(|l| if *l == "full_attention" { "F" } else { "S" }).collect();
    let sliding = layers.iter().filter(|l| **l == "sliding_attention").count();
    let heads = |k: &str, name: &str| match &v[k] {
        Value::Null => String::new(),
        h => format!("; {name}: {} kv × head_dim {}", h["kv_heads"], h["head_dim"]),
    };
    let mem = &v["memory"];
    let params = n("parameters");
    let ckpt = &v["checkpoint"];
    let dtypes = ckpt["dtypes"].as_object().map(|m| {
        m.iter()
            .map(|(d, c)| format!("{d} ({c} tensors, {})", size(ckpt["dtype_bytes"][d].as_u64().unwrap_or(0))))
            .collect::<Vec<_>>()
            .join(", ")
    });
    let mut out = format!("model      {}\n", v["model"].as_str().unwrap_or(""));
    if v["bundled_random_model"] == true {
        out += "           the bundled model: random weights, its text is noise\n";
    }
    out += &format!("layers     {} ({} sliding, {} full): {}\n", layers.len(), sliding, layers.len() - sliding, pattern.join(" "));
    out += &format!(
        "hidden     {} · dense MLP {} · vocab {} · canvas {} · sliding window {} · max positions {}\n",
        n("hidden_size"),
        n("intermediate_size"),
        n("vocab_size"),
        n("canvas_length"),
        n("sliding_window"),
        n("max_position_embeddings")
    );
    out += &format!("heads      {} query{}{}\n", n("num_attention_heads"), heads("sliding_heads", "sliding"), heads("full_heads", "full"));
    out += &format!("experts    {} per layer, top-{}, width {}\n", n("num_experts"), n("top_k_experts"), n("moe_intermediate_size"));
    out += &format!("parameters {} (text; embedding counted once)\n", group(params));
    let vision = &v["vision"];
    if !vision.is_null() {
        let missing = vision["missing_tensors"].as_u64().unwrap_or(0);
        out += &format!(
            "vision     {} layers of {} ({} heads × {}), patch {} pooled {}×{}: {} parameters, {} stored{}, {} as f32, {} on the GPU ({}; {} with tensor cores)\n",
            vision["num_hidden_layers"],
            vision["hidden_size"],
            vision["num_attention_heads"],
            vision["head_dim"],
            vision["patch_size"],
            vision["pooling_kernel_size"],
            vision["pooling_kernel_size"],
            group(vision["parameters"].as_u64().unwrap_or(0)),
            size(vision["stored_bytes"].as_u64().unwrap_or(0)),
            if missing > 0 { format!(" ({missing} tensors missing from the checkpoint)") } else { String::new() },
            size(vision["cpu_f32_bytes"].as_u64().unwrap_or(0)),
            size(vision["gpu"]["device_bytes"].as_u64().unwrap_or(0)),
            vision["gpu"]["dtype"].as_str().unwrap_or(""),
            size(vision["gpu"]["tensor_cores"]["device_bytes"].as_u64().unwrap_or(0)),
        );
    }
    out += &format!(
        "checkpoint {}; text weights {} ({} {})\n",
        dtypes.unwrap_or_default(),
        size(ckpt["text_bytes"].as_u64().unwrap_or(0)),
        ckpt["format"].as_str().unwrap_or(""),
        ckpt["path"].as_str().unwrap_or(""),
    );
    if ckpt["format"] == "gguf" {
        for t in ckpt["tensors"].as_array().into_iter().flatten() {
            out += &format!(
                "           {:<44} {:<6} {:>10}  {}\n",
                t["gguf_name"].as_str().unwrap_or("-"),
                t["dtype"].as_str().unwrap_or(""),
                size(t["bytes"].as_u64().unwrap_or(0)),
                t["shape"]
            );
        }
    }
    out += &format!(
        "memory     cpu: f32 weights {} (4 bytes/param)\n           gpu: weights {} on the device as `--weights auto` holds them ({}; {:.2} bytes/param), {} with tensor cores (the F16 mode); `dg info --schemes` for each quantization scheme\n           KV cache {} per token of context (f32); on the GPU a sequence's is {} (f32; half that, f16, where the tensor cores run all attention, as the real model's F16 and quantized modes)\n           beside the weights, a sequence's activations and cache on the GPU take {}\n           a GPU batch: {} a sequence beside its KV cache (its canvas's logits and self-conditioning input)\n",
        size(mem["cpu"]["bytes"].as_u64().unwrap_or(0)),
        size(mem["gpu"]["device_bytes"].as_u64().unwrap_or(0)),
        mem["gpu"]["device_bytes_by_format"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(f, b)| format!("{f} {}", size(b.as_u64().unwrap_or(0))))
            .collect::<Vec<_>>()
            .join(", "),
        mem["gpu"]["bytes_per_parameter"].as_f64().unwrap_or(0.0),
        size(mem["gpu"]["tensor_cores"]["device_bytes"].as_u64().unwrap_or(0)),
        size(mem["kv_cache_bytes_per_token"].as_u64().unwrap_or(0)),
        mem["gpu_kv_cache_bytes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{} at {} positions", size(c["bytes"].as_u64().unwrap_or(0)), c["positions"]))
            .collect::<Vec<_>>()
            .join(", "),
        mem["gpu_kv_cache_bytes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let arena = |k: &str| size(c["arena_bytes"][k].as_u64().unwrap_or(0));
                format!("{} with tensor cores, {} without at {} positions", arena("tensor_cores"), arena("portable"), c["positions"])
            })
            .collect::<Vec<_>>()
            .join("; "),
        size(mem["batch_sequence_bytes"].as_u64().unwrap_or(0)),
    );
    let adapters = v["adapters"].as_array().cloned().unwrap_or_default();
    if adapters.is_empty() {
        out += "adapters   none found (the GPU backend needs one; on Linux without a GPU: \
                apt-get install -y mesa-vulkan-drivers libvulkan1)\n";
    }
    for (i, a) in adapters.iter().enumerate() {
        let yes = |k: &str| if a[k] == true { "yes" } else { "no" };
        out += &format!(
            "{}{} — {}, {}, {}\n           max storage binding {}, max buffer {}; shader-f16 {}, subgroup {}, timestamp {}\n           {}\n",
            if i == 0 { "adapters   " } else { "           " },
            a["name"].as_str().unwrap_or(""),
            a["device_type"].as_str().unwrap_or(""),
            a["backend"].as_str().unwrap_or(""),
            a["driver"].as_str().unwrap_or(""),
            size(a["max_storage_buffer_binding_size"].as_u64().unwrap_or(0)),
            size(a["max_buffer_size"].as_u64().unwrap_or(0)),
            yes("shader_f16"),
            yes("subgroup"),
            yes("timestamp_query"),
            match a["canvases_per_binding"].as_u64().unwrap_or(0) {
                0 => "a canvas's logits do not fit one storage binding: the GPU backend cannot run this model here".to_string(),
                n => format!("a GPU batch (`--batch`) is bounded by memory only ({n} canvases' logits to a buffer)"),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(group(25_250_986_752), "25,250,986,752");
        assert_eq!(group(999), "999");
        assert_eq!(size(1_380_000), "1.3 MiB");
        assert_eq!(size(512), "0.5 KiB");
        assert_eq!(size(128 << 20), "128.0 MiB");
    }
}
