//! The SPIR-V of the tensor-core kernels, written by dg instead of by wgpu where
//! [`crate::tuning::SpirvChoice`] asks for it: naga's translation of the kernel's WGSL with the
//! options wgpu's Vulkan backend uses, then every cooperative-matrix load and store through
//! workgroup memory marked `Aligned` ([`STAGE_ALIGN`] bytes). naga writes
//! `OpCooperativeMatrixLoadKHR` and `StoreKHR` with no memory operand, so the driver may assume
//! only the alignment of one element. No HF module: how the kernels reach a Vulkan driver.
//!
//! The alignment holds by construction of the staged tiles (`dg_kernels::coop_gemm`): every staged
//! row is `bk` (or `bn`) halves plus 8 of padding, a multiple of 8 halves (16 bytes); fragments
//! start at multiples of 16 rows and 16 columns; stages and the stores' scratch fragments are whole
//! multiples of 16 bytes; and each workgroup array's size is a multiple of 16 bytes, so the arrays
//! after the first start 16-aligned wherever the driver lays them out in declaration order. The
//! tensor-core tests compare these kernels' results bit for bit with the f32 path's rounding on the
//! devices that run them.

use naga::back::spv;

/// Bytes every cooperative-matrix access through workgroup memory is promised to be aligned to.
pub const STAGE_ALIGN: u32 = 16;

const OP_VARIABLE: u32 = 59;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_COOP_LOAD: u32 = 4457;
const OP_COOP_STORE: u32 = 4458;
const STORAGE_WORKGROUP: u32 = 4;
const MEMORY_ACCESS_ALIGNED: u32 = 0x2;
/// Words of a load (`type, result, pointer, layout, stride`) and of a store (`pointer, object,
/// layout, stride`) with their opcode word and no memory operand, as naga writes them.
const COOP_LOAD_WORDS: u32 = 6;
const COOP_STORE_WORDS: u32 = 5;

/// The SPIR-V of entry point `entry` of `wgsl` (a compute shader), as wgpu's Vulkan backend
/// would write it for a Vulkan 1.3 device with shader f16, subgroups and cooperative matrices:
/// SPIR-V 1.6, indices into fixed-size arrays and buffers clamped (`Restrict`), workgroup memory
/// zeroed by the driver, no loop bounding (dg's loops run over uniform counts: `plan.rs`), the
/// bindings numbered as written.
pub fn compile(wgsl: &str, entry: &str) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(wgsl))?;
    use spv::Capability as C;
    let capabilities = [
        C::Shader,
        C::Float16,
        C::GroupNonUniform,
        C::GroupNonUniformVote,
        C::GroupNonUniformArithmetic,
        C::GroupNonUniformBallot,
        C::GroupNonUniformShuffle,
        C::GroupNonUniformShuffleRelative,
        C::GroupNonUniformQuad,
        C::CooperativeMatrixKHR,
        C::VulkanMemoryModel,
    ];
    let restrict = naga::proc::BoundsCheckPolicy::Restrict;
    let options = spv::Options {
        lang_version: (1, 6),
        flags: spv::WriterFlags::empty(),
        // Descriptor set = group and binding = binding: wgpu's Vulkan backend numbers a layout's
        // bindings in the order of its entries, and dg's layouts (`plan.rs`) list 0, 1, 2, … in order.
        fake_missing_bindings: true,
        capabilities: Some(capabilities.into_iter().collect()),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: restrict,
            buffer: restrict,
            image_load: restrict,
            binding_array: restrict,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::Native,
        force_loop_bounding: false,
        use_storage_input_output_16: false,
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: entry.into() };
    spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| e.to_string())
}

/// Marks every cooperative-matrix load and store of `words` (a SPIR-V module) whose pointer is
/// into a workgroup variable, and that has no memory operand yet, `Aligned` to `bytes`; returns
/// how many it marked. Other instructions are copied unchanged (SPIR-V refers to ids, not
/// offsets, so instructions may grow). Panics on a malformed module (a word count of 0 or past
/// the end): its input is naga's output.
pub fn align_workgroup_coop(words: &[u32], bytes: u32) -> (Vec<u32>, usize) {
    const HEADER: usize = 5;
    // Every pointer's root variable and each variable's storage class, from a first pass (the
    // access chains and variables come before the functions that use them, but a pass over all
    // is simplest).
    let mut storage: std::collections::HashMap<u32, u32> = Default::default();
    let mut base: std::collections::HashMap<u32, u32> = Default::default();
    let mut at = HEADER;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        assert!(count > 0 && at + count <= words.len(), "malformed SPIR-V at word {at}");
        match op {
            OP_VARIABLE => {
                storage.insert(words[at + 2], words[at + 3]);
            }
            OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN | OP_PTR_ACCESS_CHAIN => {
                base.insert(words[at + 2], words[at + 3]);
            }
            _ => {}
        }
        at += count;
    }
    let in_workgroup = |mut id: u32| {
        while let Some(&b) = base.get(&id) {
            id = b;
        }
        storage.get(&id) == Some(&STORAGE_WORKGROUP)
    };
    let mut out = Vec::with_capacity(words.len() + 64);
    out.extend_from_slice(&words[..HEADER.min(words.len())]);
    let mut marked = 0;
    let mut at = HEADER;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        let inst = &words[at..at + count];
        let pointer = match (op, count as u32) {
            (OP_COOP_LOAD, COOP_LOAD_WORDS) => Some(inst[3]),
            (OP_COOP_STORE, COOP_STORE_WORDS) => Some(inst[1]),
            _ => None,
        };
        if pointer.is_some_and(in_workgroup) {
            out.push((((count + 2) as u32) << 16) | op);
            out.extend_from_slice(&inst[1..]);
            out.extend_from_slice(&[MEMORY_ACCESS_ALIGNED, bytes]);
            marked += 1;
        } else {
            out.extend_from_slice(inst);
        }
        at += count;
    }
    (out, marked)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "enable f16;\nenable wgpu_cooperative_matrix;\n\
        @group(0) @binding(0) var<storage, read> a: array<f16>;\n\
        @group(0) @binding(1) var<storage, read_write> c: array<f32>;\n\
        var<workgroup> sa: array<vec4<f16>, 64>;\n\
        @compute @workgroup_size(32)\n\
        fn main(@builtin(local_invocation_index) lt: u32) {\n\
            sa[lt] = vec4<f16>(a[lt]);\n\
            workgroupBarrier();\n\
            let fa = coopLoadT<coop_mat16x16<f16, A>>(&sa[0], 4u);\n\
            let fb = coopLoad<coop_mat16x16<f16, B>>(&a[0], 16u);\n\
            var acc = coop_mat16x16<f32, C>();\n\
            acc = coopMultiplyAdd(fa, fb, acc);\n\
            coopStore(acc, &c[0], 16u);\n\
        }\n";

    fn coop_accesses(words: &[u32]) -> Vec<(u32, usize)> {
        let mut found = Vec::new();
        let mut at = 5;
        while at < words.len() {
            let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
            if op == OP_COOP_LOAD || op == OP_COOP_STORE {
                found.push((op, count));
            }
            at += count;
        }
        found
    }

    #[test]
    fn only_the_workgroup_access_is_marked_aligned() {
        let words = compile(KERNEL, "main").unwrap();
        assert_eq!(coop_accesses(&words), vec![(OP_COOP_LOAD, 6), (OP_COOP_LOAD, 6), (OP_COOP_STORE, 5)]);
        let (aligned, marked) = align_workgroup_coop(&words, STAGE_ALIGN);
        assert_eq!(marked, 1, "one of the three accesses is through workgroup memory");
        assert_eq!(coop_accesses(&aligned), vec![(OP_COOP_LOAD, 8), (OP_COOP_LOAD, 6), (OP_COOP_STORE, 5)]);
        assert_eq!(aligned.len(), words.len() + 2);
        // Marking again finds nothing new: the marked load has its memory operand.
        assert_eq!(align_workgroup_coop(&aligned, STAGE_ALIGN).1, 0);
    }
}
