//! Quantized weights for the kernel tests: seeded values quantized into ggml blocks as a GGUF file
//! stores them ([`blocks`], with the host's dequantization of the same blocks, bit-exact against
//! gguf-py), the same blocks in the K panels the tensor-core kernels read ([`panelled`], through the
//! upload's own packing), and one kernel run on uploaded words ([`dispatch`]), which
//! `tests/kernels_quant.rs` (the portable kernels) and `tests/tensor_cores_quant.rs` (the
//! tensor-core ones) share.

use dg_gpu::pack::{Order, Packing};
use dg_gpu::{GpuContext, Pipelines, PlanBuilder};
use dg_kernels::format::QuantFormat;
use dg_kernels::{KernelKey, WeightFormat};
use dg_model::StoredDtype;

use super::{guarded_output, read_guarded};

/// The checkpoint dtype that stores `q`'s blocks.
pub fn dtype(q: QuantFormat) -> StoredDtype {
    match q {
        QuantFormat::Q8_0 => StoredDtype::Q8_0,
        QuantFormat::Q5_0 => StoredDtype::Q5_0,
        QuantFormat::Q4_K => StoredDtype::Q4_K,
        QuantFormat::Q6_K => StoredDtype::Q6_K,
    }
}

/// `values` quantized to `q`: the blocks as u32 words (zero-padded to a whole word) and their
/// dequantization.
pub fn blocks(q: QuantFormat, values: &[f32]) -> (Vec<u32>, Vec<f32>) {
    let mut bytes = dg_model::quantize(dtype(q), values).expect("quantizing test weights");
    let deq = dg_model::dequantize_bytes(dtype(q), &bytes).expect("dequantizing test weights");
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    (bytemuck::pod_collect_to_vec(&bytes), deq)
}

/// `words` (the blocks of [`blocks`]) of matrices of `[rows, cols]` one after the other, in K
/// panels one block wide as the upload stores them for the tensor cores (`dg_gpu::pack`).
pub fn panelled(q: QuantFormat, words: &[u32], rows: usize, cols: usize) -> Vec<u32> {
    let values = words.len() * 4 / q.block_bytes() * q.block_len();
    let bytes = &bytemuck::cast_slice::<u32, u8>(words)[..values / q.block_len() * q.block_bytes()];
    let stored = dg_model::StoredTensor::from_bytes(dtype(q), vec![values / cols, cols], bytes);
    let order = Order::KPanels { rows, cols, panel: q.block_len() };
    let packing = Packing::new(vec![&stored], WeightFormat::Quantized(q), order);
    let mut out = vec![0u8; packing.bytes()];
    packing.fill(0, &mut out);
    bytemuck::pod_collect_to_vec(&out)
}

/// Runs `key` once with uniform `p`, the `inputs` uploaded as read-only bindings and a
/// guard-banded output holding `c0` as the last binding, over `groups` workgroups; returns the
/// output.
pub fn dispatch<P: bytemuck::Pod>(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    key: KernelKey,
    p: &P,
    inputs: &[&[u32]],
    c0: &[f32],
    groups: [u32; 3],
) -> Vec<f32> {
    let pipeline = pipelines.get(ctx, key).unwrap_or_else(|e| panic!("{key:?}: {e}"));
    let buffers: Vec<wgpu::Buffer> = inputs.iter().map(|v| ctx.upload("input", v).unwrap()).collect();
    let cb = guarded_output(ctx, "c", c0.len());
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(c0));
    let mut all: Vec<&wgpu::Buffer> = buffers.iter().collect();
    all.push(&cb);
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&pipeline, p, &all, groups);
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_guarded(ctx, &cb, c0.len())
}
