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

/// The checkpoint dtype that stores `q`'s blocks (the inverse of the upload's
/// `dg_gpu::pack::quant_format`).
pub fn dtype(q: QuantFormat) -> StoredDtype {
    StoredDtype::ALL.into_iter().find(|&d| dg_gpu::pack::quant_format(d) == Some(q)).expect("every device format has its dtype")
}

/// `values` quantized to `q`: the blocks as the device holds them in u32 words ([`words`]) and
/// their dequantization.
pub fn blocks(q: QuantFormat, values: &[f32]) -> (Vec<u32>, Vec<f32>) {
    let bytes = dg_model::quantize(dtype(q), values).expect("quantizing test weights");
    let deq = dg_model::dequantize_bytes(dtype(q), &bytes).expect("dequantizing test weights");
    (words(q, bytes), deq)
}

/// Blocks of `q` as a row-major device buffer holds them (`dg_gpu::pack`): zero-padded to a
/// whole word, then the type's table (`QuantFormat::table`).
fn words(q: QuantFormat, mut bytes: Vec<u8>) -> Vec<u32> {
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    let mut words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
    words.extend_from_slice(q.table());
    words
}

/// `n` blocks of `q` of random bytes (seeded by `seed`) with sane scales, as the device holds
/// them in u32 words ([`words`]), and their host dequantization (`dg_model::dequantize_bytes`,
/// bit for bit with gguf-py): for the types dg does not quantize to. Every f16 scale field (`d`,
/// and `dmin` or `m`) becomes a normal f16 of either sign in 2⁻¹² .. 2⁻⁴ (products far from f32's
/// subnormals, which a device may flush), as does IQ1_M's `d` spread over the top nibbles of its
/// scales; MXFP4's E8M0 scale is 2⁻¹² .. 2³; NVFP4's UE4M3 scales stay random (all finite).
pub fn random_blocks(q: QuantFormat, n: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    let size = q.block_bytes();
    let mut bytes: Vec<u8> = super::seeded(n * size, seed, 1.0).iter().map(|&x| ((x + 1.0) * 128.0) as u8).collect();
    let mut sane = super::seeded(n * 8, seed ^ 0x5ca1e, 1.0).into_iter().map(|x| {
        let magnitude = 2f32.powf(-12.0 + 8.0 * x.abs());
        half::f16::from_f32(if x < 0.0 { -magnitude } else { magnitude }).to_bits()
    });
    // The byte offsets of the f16 scale fields (ggml-common.h).
    let fields: &[usize] = match q {
        QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q5_K | QuantFormat::Q4_K => &[0, 2],
        QuantFormat::Q2_K => &[80, 82],
        QuantFormat::Q3_K => &[108],
        QuantFormat::Q6_K => &[208],
        QuantFormat::IQ1_M | QuantFormat::MXFP4 | QuantFormat::NVFP4 => &[],
        _ => &[0],
    };
    for block in bytes.chunks_exact_mut(size) {
        for &at in fields {
            block[at..at + 2].copy_from_slice(&sane.next().unwrap().to_le_bytes());
        }
        match q {
            QuantFormat::IQ1_M => {
                let d = sane.next().unwrap();
                for k in 0..4 {
                    let at = 48 + 2 * k;
                    let nibble = ((d >> (4 * k)) & 15) as u8;
                    block[at + 1] = (block[at + 1] & 0x0f) | (nibble << 4);
                }
            }
            QuantFormat::MXFP4 => block[0] = 116 + (block[0] % 16),
            _ => {}
        }
    }
    let deq = dg_model::dequantize_bytes(dtype(q), &bytes).expect("dequantizing test blocks");
    assert!(deq.iter().all(|v| v.is_finite()), "{}: test blocks dequantize to finite values", q.name());
    (words(q, bytes), deq)
}

/// `words` (the blocks of [`blocks`] or [`random_blocks`]) of matrices of `[rows, cols]` one after the other, in K
/// panels one block wide as the upload stores them for the tensor cores (`dg_gpu::pack`).
pub fn panelled(q: QuantFormat, words: &[u32], rows: usize, cols: usize) -> Vec<u32> {
    let values = (words.len() - q.table().len()) * 4 / q.block_bytes() * q.block_len();
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
