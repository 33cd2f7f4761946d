//! The lab's probe kernels (dg_lab::probe) parse and validate with naga on every machine, GPU or
//! not, so that a probe run on a GPU fails only on what the GPU does.

use dg_lab::probe::experts::STREAM_PANELS_WGSL;
use dg_lab::probe::streaming::{IN_FLIGHT_STEPS, PAD_KIB, stream_in_flight_wgsl};
use dg_lab::probe::tensor_cores::{DRAIN_PROBE_CASES, DRAIN_PROBE_GROUPS, drain_probe_sums_at, drain_probe_wgsl, peak_probe_wgsl};

/// The probes' generated kernels parse and validate (with cooperative matrices and f16) on every
/// machine, GPU or not, so that a probe run on a GPU fails only on what the GPU does; the drain
/// probe's output covers its last workgroup's stores.
#[test]
fn probe_kernels_validate() {
    let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16;
    let mut kernels: Vec<String> = Vec::new();
    for (reload, barrier) in [(false, false), (true, false), (true, true)] {
        kernels.extend([1u32, 4, 8].map(|acc| peak_probe_wgsl(acc, reload, barrier)));
    }
    kernels.extend(
        DRAIN_PROBE_CASES.iter().map(|&(_, loads, distance, barrier)| drain_probe_wgsl(loads, distance, barrier, DRAIN_PROBE_GROUPS)),
    );
    kernels.push(STREAM_PANELS_WGSL.to_string());
    kernels.extend(IN_FLIGHT_STEPS.iter().flat_map(|&steps| PAD_KIB.iter().map(move |&pad| stream_in_flight_wgsl(steps, pad))));
    for wgsl in &kernels {
        let module = naga::front::wgsl::parse_str(wgsl).unwrap_or_else(|e| panic!("{}\n{wgsl}", e.emit_to_string(wgsl)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{wgsl}"));
    }
    // Last subgroup's last accumulator ends where the sums start.
    let last = (DRAIN_PROBE_GROUPS * 4 - 1) * 1024 + 768 + 256;
    assert_eq!(last, drain_probe_sums_at(DRAIN_PROBE_GROUPS));
}
