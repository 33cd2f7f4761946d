// The uniform parameters of the strided GEMMs (gemm.wgsl, coop_gemm.wgsl): `GemmParams` in
// gemm.rs, field for field.
struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    a_offset: u32,
    a_rs: u32,
    a_cs: u32,
    a_batch: u32,
    b_offset: u32,
    b_rs: u32,
    b_cs: u32,
    b_batch: u32,
    b_batch_div: u32,
    c_offset: u32,
    c_rs: u32,
    c_batch: u32,
    alpha: f32,
    accumulate: u32,
    epilogue: u32,
    cap: f32,
}
