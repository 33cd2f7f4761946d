use dg_kernels::coop_grouped_gemm as g;
fn main() {
    let k = g::source_with_a(g::TILE_32X128, g::WPath::Direct, dg_kernels::coop_gemm::AFormat::F32);
    println!("{}", k.wgsl);
}
