// Tensor-core grouped GEMM of the MoE experts (see coop_grouped_gemm.rs for the contract). Tokens
// are grouped by expert into slots; the slots of expert g are offsets[g] .. offsets[g + 1]. For
// every slot s of expert g:
//   C[s, j] = sum over p of f16(A[row(s), p]) * W[g, j, p]     (f16 products, f32 accumulation)
// with row(s) = gather_rows[s] when `gather` != 0, else s;  A[r, p] = a[r * a_rs + p] (f32),
// C[s, j] = c[s * c_rs + j] (f32), and W in K panels of P columns, f16 (P = 32) or a quantized
// format's blocks one block (P values) wide (in planes where it has them), read through fetch_w:
//   W[g, j, p] = element g * b_group_stride + (p / P) * N * P + j * P + p % P
// so that the BN x BK block of W one step stages is contiguous (whole cache lines: the kernel
// streams each expert's weights about once and is bound by how well it reads them); a step of
// BK = 2P takes two panels, a panel of P = c * BK serves c steps.
// Requires N % BN == 0, K % BK == 0, a_rs and b_group_stride multiples of 4, and subgroups of
// exactly 32 invocations.
//
// The grid: with a tile table (p.tiles != 0), n tile fastest, then the table's entries: entry t,
// at offsets[groups + 1 + t], names one m tile that holds slots, as group | (m tile << 16), or
// NO_TILE past the last one (moe_dispatch.wgsl writes it). Without one, the grid covers max_rows
// (an upper bound on any group's slot count, known without a readback): m tile fastest, then n
// tile, then group. Either way a workgroup whose m tile starts past its group's count leaves at
// once. The rows of a tile past the count are
// staged from the group's last row (any valid row: rows of a product are independent) and never
// stored. The K loop is the dense kernel's (coop_kloop.rs). Stores (coop_grouped_gemm.rs,
// stores): fragments whose rows are all the group's go straight to C; partial ones through a
// 16 x 16 scratch per subgroup in workgroup memory, from which the rows below the count are
// copied out; where each subgroup spans the tile's rows, fragments with no such row not at all.

// (`enable f16;` and `enable wgpu_cooperative_matrix;` come first, ahead of the const prelude.)

alias SElem = SELEM_TYPE;

struct Params {
    n: u32,
    k: u32,
    groups: u32,
    max_rows: u32,
    a_rs: u32,
    b_group_stride: u32,
    c_rs: u32,
    gather: u32,
    tiles: u32,
    tile_rows: u32,
    first_group: u32, // the experts' first in `offsets` (W holds experts first_group ..; no table)
    _pad1: u32,
}

const NO_TILE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<A_ELEM>;
@group(0) @binding(2) var<storage, read> w: array<W_WORD>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> gather_rows: array<u32>;
@group(0) @binding(5) var<storage, read_write> c: array<f32>;

var<workgroup> sa: array<SElem, SAL>;
var<workgroup> sb: array<SElem, SBL>;
// One 16 x 16 f32 fragment per subgroup, for the stores of a partial tile.
var<workgroup> scratch: array<f32, WT * 8u>;

//@PUT

@compute @workgroup_size(WT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lt: u32) {
    let id = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    // Read-only storage indexed by a uniform value: uniform, so the early exits and the store
    // branch keep the barriers in uniform control flow.
    let tiles_n = p.n / BN;
    let tiles_m = (p.max_rows + BM - 1u) / BM;
    let table = p.tiles != 0u;
    let t = id / tiles_n;
    if (!select(id < tiles_m * tiles_n * p.groups, t < p.tiles, table)) {
        return;   // padding of a folded grid
    }
    // select, not branches or `&&`: naga would see the exits below in non-uniform control flow.
    let entry = offsets[select(0u, p.groups + 1u + t, table)];
    if (select(false, entry == NO_TILE, table)) {
        return;   // past the last m tile that holds slots
    }
    let g = select(id / (tiles_m * tiles_n), entry & 0xffffu, table);
    let m0 = select(id % tiles_m, entry >> 16u, table) * BM;
    let n0 = select((id / tiles_m) % tiles_n, id % tiles_n, table) * BN;
    let first = offsets[p.first_group + g];
    let count = offsets[p.first_group + g + 1u] - first;
    if (m0 >= count) {
        return;
    }
    let sg = lt / 32u;
    let sm = (sg / SGN) * WM;
    let sn = (sg % SGN) * WN;
    let k4 = p.k / 4u;
    let steps = p.k / BK;
    let stride_s = KPS;

    var a_src: array<u32, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        let e = lt + l * WT;
        let s = first + min(m0 + e / BK4, count - 1u);
        var row = s;
        if (p.gather != 0u) {
            row = gather_rows[s];
        }
        a_src[l] = row * (p.a_rs / 4u) + e % BK4;
    }
    // W in K panels (coop_grouped_gemm.rs, source_for): unit l of this invocation at step 0 is at
    // W_AT from w_first, the tile's first row in its group's first panel; W_OFFSET(s) for step s.
    let w_first = W_FIRST;
    let w_step = W_STEP;
    // Direct W fragments (coop_kloop.rs, direct): the subgroup's first column, W rows BK4 apart.
    let w_sub = w_first + sn * BK4;
    let stride_w = BK4;

//@KLOOP
    let stride_c = p.c_rs;
    let stride_f = FRAGMENT_SIDE;
    let lane = lt % 32u;
//@STORE
}
