#version 450
// The experts' grouped product for short groups on Vulkan's cooperative matrices, SPIR-V taken past
// WGSL (native_grouped_gemm.rs is the contract; the same inputs, outputs and parameters as
// coop_grouped_gemm.wgsl). For every slot s of expert g (slots offsets[g] .. offsets[g + 1]):
//   C[s, j] = sum over p of f16(A[row(s), p]) * W[g, j, p]     (f16 products, f32 accumulation)
// computed transposed, C^T = W . A^T: the weights' rows on the fragments' M side (FM, 16 on NVIDIA)
// and the slots on their N side (FN: 8 where the adapter offers 16x8x16), so that a short group
// wastes the narrow side and not the weights' (Marlin's arrangement).
//
// Compile-time variant (tools/native/build.py): FM x FN x FK the fragment, SG the subgroup size,
// WFMT the weights' format (W_F16, W_Q4_K, W_Q6_K, W_Q8_0), A_F16 whether A is stored as f16,
// INT8 the int8 mode (Q8_0 and Q4_K weights; native_int8_gemm.rs is its contract).
//
// The int8 mode (INT8 = 1) multiplies on s8 x s8 -> s32 fragments, as llama.cpp's MMQ kernels do:
// per 32 values of K each slot's activations are quantized to int8 with an f32 scale
// (dg_cpu::int8::quantize_block_q8_1: d = max|a| / 127, q = round half away from zero of a / d),
// the weights' Q8_0 quants enter the fragments as they are stored, and the block's integer sums
// (exact in s32: 32 products of at most 127 * 128) are scaled and added to f32 accumulators:
//   C[s, j] = sum over blocks b of (d_w[j, b] * d_a[s, b]) * (sum of q_w * q_a over the block).
// The scale d_w[j] * d_a[s] differs per element of a fragment, and a fragment's elements are
// spread over the invocations in a way only the driver knows, so the scales enter as a matrix:
// the block's outer product d_w x d_a is written into workgroup memory (the subgroup's area of
// the partial sums, unused until the K loop ends) and loaded as an accumulator fragment of the
// same shape and layout as the sums; the integer fragment is converted to f32 and multiplied by
// it component-wise (cooperative matrices of one type take OpFMul element by element, per
// SPV_KHR_cooperative_matrix). Rounding: the scales' product and its product with the sum each
// round once in f32, as the CPU reference (dg_cpu::int8::dot_q8_0) rounds them.
// Q4_K (per 32-value sub-block: scale d*sc, min dmin*m, unsigned nibbles 0..15 entering the s8
// fragments as they are) adds llama.cpp's min term: the sub-block's product is
//   (d*sc * d_a) * (sum of q_w * q_a) - (dmin*m) * s_a,   s_a = d_a * (sum of q_a),
// the second outer product (dmin*m) x s_a a second matrix in workgroup memory (dg_cpu::int8::dot_q4_k).
//
// A workgroup computes BN = 2 FM rows of W for TM = 32 slots (one m tile of the dispatch's tile
// table) in NSG subgroups that split K: subgroup sg takes the K chunks sg, sg + NSG, ... (a chunk
// is one block of a quantized format, a whole 256-value super-block for the K-quants; 32 values of
// F16), so each weight byte is loaded once, by one invocation, and the K loop synchronises only
// within a subgroup: per 32 values of K, each invocation dequantizes whole 32-value runs of W rows
// and converts runs of A rows into the subgroup's own f16 tiles in workgroup memory, from which the
// fragments load. Fragments of slots past the group's count are skipped. The subgroups' partial
// sums meet once, after the K loop, in workgroup memory; their sum goes to C for the slots below
// the count.
//
// The grid is coop_grouped_gemm.wgsl's: with a tile table (p.tiles != 0: the host passes it only
// where the table's rows are TM), n tile fastest, then the table's entries; else m tile fastest,
// then n tile, then group over max_rows. Requires N % BN == 0, K a multiple of the chunk, a_rs and
// b_group_stride multiples of 4, and subgroups of exactly SG invocations.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#if INT8
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#endif

#define W_F16 0
#define W_Q4_K 1
#define W_Q6_K 2
#define W_Q8_0 3

const uint NSG = 4u;
const uint RM = 2u;
const uint BN = FM * RM;
const uint TM = 32u;
const uint RN = TM / FN;
const uint KS = 32u;
// A tile row's stride in workgroup memory: KS values and 8 of padding (16 bytes, as fragment
// loads want rows), so that the invocations staging rows side by side write to different banks.
const uint KP = KS + 8u;
#if WFMT == W_Q4_K || WFMT == W_Q6_K
const uint KU = 256u;
#else
const uint KU = 32u;
#endif
const uint NO_TILE = 0xffffffffu;

layout(local_size_x = SG * NSG, local_size_y = 1, local_size_z = 1) in;

layout(std140, set = 0, binding = 0) uniform Params {
    uint n;
    uint k;
    uint groups;
    uint max_rows;
    uint a_rs;
    uint b_group_stride;
    uint c_rs;
    uint gather;
    uint tiles;
    uint tile_rows;
    uint first_group;
    uint pad1;
} p;
layout(std430, set = 0, binding = 1) readonly buffer A { uint a[]; };
#if WFMT == W_Q6_K
layout(std430, set = 0, binding = 2) readonly buffer W { uint w[]; };
#else
layout(std430, set = 0, binding = 2) readonly buffer W { uvec4 w4[]; };
#endif
layout(std430, set = 0, binding = 3) readonly buffer Offsets { uint offsets[]; };
layout(std430, set = 0, binding = 4) readonly buffer Rows { uint gather_rows[]; };
layout(std430, set = 0, binding = 5) buffer C { float c[]; };

#if INT8
// A tile row's stride in the int8 tiles: KS values and 16 bytes of padding (rows 16 bytes apart).
const uint KP8 = KS + 16u;
// Each subgroup's int8 tiles (W's BN rows and A's TM slots, KS values each, rows KP8 apart) and
// their blocks' scales; then each subgroup's partial sums, BN x TM column-major (C^T), which
// hold the block's scales d_w x d_a (the same layout) during the K loop.
shared int8_t sw8[NSG * BN * KP8];
shared int8_t sa8[NSG * TM * KP8];
shared float dw[NSG * BN];
shared float da[NSG * TM];
#if WFMT == W_Q4_K
// The sub-block's mins dmin*m of W's rows, the sums s_a of A's slots, and their outer product.
shared float mw[NSG * BN];
shared float sa_sum[NSG * TM];
shared float mins[NSG * BN * TM];
#endif
#else
// Each subgroup's tiles: W's BN rows and A's TM slots, KS values of K each (rows KP apart); then each subgroup's
// partial sums, BN x TM column-major (C^T).
shared float16_t sw[NSG * BN * KP];
shared float16_t sa[NSG * TM * KP];
#endif
shared float sums[NSG * BN * TM];

#if WFMT == W_Q4_K
// Byte i of a Q4_K header's 12 bytes of scales and mins (its words y, z, w).
uint scale_byte(uvec4 head, uint i) {
    return (head[1u + i / 4u] >> (8u * (i % 4u))) & 0xffu;
}
#endif

#if !INT8
// W row j's 32 values k0 .. k0 + 32 (k0 a multiple of 32) of expert g (its first element at
// base = g * b_group_stride), into sw[at ..].
void stage_w(uint base, uint j, uint k0, uint at) {
#if WFMT == W_F16
    // K panels of 32: [k / 32, n, 32] halves.
    uint v = (base + (k0 / 32u) * p.n * 32u + j * 32u) / 8u;
    for (uint q = 0u; q < 4u; q++) {
        uvec4 x = w4[v + q];
        for (uint e = 0u; e < 4u; e++) {
            f16vec2 h = unpackFloat2x16(x[e]);
            sw[at + 8u * q + 2u * e] = h.x;
            sw[at + 8u * q + 2u * e + 1u] = h.y;
        }
    }
#elif WFMT == W_Q4_K
    // Blocks in K panels one block wide, in planes of 8 blocks (format/planes.rs): 72 words of
    // 16 bytes a group, word r block r's header (d, dmin, 12 bytes of scales and mins), word
    // 8 + 8 s + r sub-block s's nibbles (byte i: value i low, value 16 + i high).
    uint b = base / 256u + (k0 / 256u) * p.n + j;
    uint s = (k0 % 256u) / 32u;
    uint g = (b / 8u) * 72u;
    uint r = b % 8u;
    uvec4 head = w4[g + r];
    uvec4 qs = w4[g + 8u + 8u * s + r];
    vec2 dm = unpackHalf2x16(head.x);
    // get_scale_min_k4 of ggml over the 12 bytes of head.yzw.
    uint sc;
    uint m;
    if (s < 4u) {
        sc = scale_byte(head, s) & 63u;
        m = scale_byte(head, s + 4u) & 63u;
    } else {
        uint hi = scale_byte(head, s + 4u);
        sc = (hi & 15u) | ((scale_byte(head, s - 4u) >> 6u) << 4u);
        m = (hi >> 4u) | ((scale_byte(head, s) >> 6u) << 4u);
    }
    float d1 = dm.x * float(sc);
    float m1 = dm.y * float(m);
    for (uint i = 0u; i < 16u; i++) {
        uint byte = (qs[i / 4u] >> (8u * (i % 4u))) & 0xffu;
        sw[at + i] = float16_t(d1 * float(byte & 15u) - m1);
        sw[at + 16u + i] = float16_t(d1 * float(byte >> 4u) - m1);
    }
#elif WFMT == W_Q6_K
    // Blocks in K panels one block wide, in ggml's order (210 bytes: ql[128], qh[64],
    // scales[16] i8, d f16); sub-block s of 32 values: half h = s / 4, quarter u = s % 4.
    uint b = base / 256u + (k0 / 256u) * p.n + j;
    uint s = (k0 % 256u) / 32u;
    uint o = b * 210u;
    uint h = s / 4u;
    uint u = s % 4u;
    uint od = o + 208u;
    float d = unpackHalf2x16(w[od / 4u] >> (8u * (od % 4u))).x;
    for (uint l = 0u; l < 32u; l++) {
        uint oql = o + 64u * h + 32u * (u & 1u) + l;
        uint oqh = o + 128u + 32u * h + l;
        uint osc = o + 192u + 8u * h + l / 16u + 2u * u;
        uint ql = (w[oql / 4u] >> (8u * (oql % 4u) + 4u * (u >> 1u))) & 15u;
        uint qh = (w[oqh / 4u] >> (8u * (oqh % 4u) + 2u * u)) & 3u;
        int sc = int(w[osc / 4u] << (24u - 8u * (osc % 4u))) >> 24;
        sw[at + l] = float16_t(d * float(sc) * float(int(ql | (qh << 4u)) - 32));
    }
#elif WFMT == W_Q8_0
    // Blocks in K panels one block wide, in planes of 8 blocks (format/planes.rs): 17 words of
    // 16 bytes a group, word r block r's quants 0..16, word 8 + r its quants 16..32, word 16 the
    // 8 scales d (f16, block r in half r % 2 of its u32 r / 2).
    uint b = base / 32u + (k0 / 32u) * p.n + j;
    uint g = (b / 8u) * 17u;
    uint r = b % 8u;
    float d = unpackHalf2x16(w4[g + 16u][r / 2u])[r % 2u];
    for (uint q = 0u; q < 2u; q++) {
        uvec4 x = w4[g + 8u * q + r];
        for (uint i = 0u; i < 16u; i++) {
            int v = int(x[i / 4u] << (24u - 8u * (i % 4u))) >> 24;
            sw[at + 16u * q + i] = float16_t(float(v) * d);
        }
    }
#endif
}

// A row `row`'s 32 values k0 .. k0 + 32, rounded to f16, into sa[at ..].
void stage_a(uint row, uint k0, uint at) {
    uint e = row * p.a_rs + k0;
#if A_F16
    for (uint q = 0u; q < 16u; q++) {
        f16vec2 h = unpackFloat2x16(a[e / 2u + q]);
        sa[at + 2u * q] = h.x;
        sa[at + 2u * q + 1u] = h.y;
    }
#else
    for (uint q = 0u; q < 32u; q++) {
        sa[at + q] = float16_t(uintBitsToFloat(a[e + q]));
    }
#endif
}

#endif

#if INT8
#if WFMT == W_Q4_K
// W row j's 32 values k0 .. k0 + 32 (k0 a multiple of 32) of expert g: the sub-block's nibbles
// into sw8[at ..], its scale d*sc into dw[d_at] and its min dmin*m into mw[d_at]. The planes'
// layout as stage_w reads it.
void stage_w8(uint base, uint j, uint k0, uint at, uint d_at) {
    uint b = base / 256u + (k0 / 256u) * p.n + j;
    uint s = (k0 % 256u) / 32u;
    uint g = (b / 8u) * 72u;
    uint r = b % 8u;
    uvec4 head = w4[g + r];
    uvec4 qs = w4[g + 8u + 8u * s + r];
    vec2 dm = unpackHalf2x16(head.x);
    uint sc;
    uint m;
    if (s < 4u) {
        sc = scale_byte(head, s) & 63u;
        m = scale_byte(head, s + 4u) & 63u;
    } else {
        uint hi = scale_byte(head, s + 4u);
        sc = (hi & 15u) | ((scale_byte(head, s - 4u) >> 6u) << 4u);
        m = (hi >> 4u) | ((scale_byte(head, s) >> 6u) << 4u);
    }
    dw[d_at] = dm.x * float(sc);
    mw[d_at] = dm.y * float(m);
    for (uint i = 0u; i < 16u; i++) {
        uint byte = (qs[i / 4u] >> (8u * (i % 4u))) & 0xffu;
        sw8[at + i] = int8_t(byte & 15u);
        sw8[at + 16u + i] = int8_t(byte >> 4u);
    }
}
#else
// W row j's Q8_0 block at k0 (k0 a multiple of 32) of expert g: its 32 quants into sw8[at ..],
// its scale into dw[d_at]. The planes' layout as stage_w reads it.
void stage_w8(uint base, uint j, uint k0, uint at, uint d_at) {
    uint b = base / 32u + (k0 / 32u) * p.n + j;
    uint g = (b / 8u) * 17u;
    uint r = b % 8u;
    dw[d_at] = unpackHalf2x16(w4[g + 16u][r / 2u])[r % 2u];
    for (uint q = 0u; q < 2u; q++) {
        uvec4 x = w4[g + 8u * q + r];
        for (uint i = 0u; i < 16u; i++) {
            sw8[at + 16u * q + i] = int8_t(int(x[i / 4u] << (24u - 8u * (i % 4u))) >> 24);
        }
    }
}
#endif

// A row `row`'s value i of the block at k0, as f32.
float a_value(uint e, uint i) {
#if A_F16
    return unpackHalf2x16(a[(e + i) / 2u])[(e + i) % 2u];
#else
    return uintBitsToFloat(a[e + i]);
#endif
}

// C's roundf (half away from zero) of |x| < 2^23: the fraction x - trunc(x) is exact.
float round_away(float x) {
    float t = trunc(x);
    return abs(x - t) >= 0.5 ? t + sign(x) : t;
}

// A row `row`'s 32 values k0 .. k0 + 32 quantized (quantize_row_q8_1 with an f32 scale) into
// sa8[at ..], their scale into da[d_at].
void stage_a8(uint row, uint k0, uint at, uint d_at) {
    uint e = row * p.a_rs + k0;
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) {
        amax = max(amax, abs(a_value(e, i)));
    }
    float d = amax / 127.0;
    float id = d != 0.0 ? 1.0 / d : 0.0;
    da[d_at] = d;
    int sum = 0;
    for (uint i = 0u; i < 32u; i++) {
        int q = int(clamp(round_away(a_value(e, i) * id), -127.0, 127.0));
        sa8[at + i] = int8_t(q);
        sum += q;
    }
#if WFMT == W_Q4_K
    sa_sum[d_at] = float(sum) * d;
#endif
}
#endif

void main() {
    uint id = gl_WorkGroupID.x + gl_NumWorkGroups.x * (gl_WorkGroupID.y + gl_NumWorkGroups.y * gl_WorkGroupID.z);
    uint tiles_n = p.n / BN;
    uint tiles_m = (p.max_rows + TM - 1u) / TM;
    uint g;
    uint m0;
    uint n0;
    if (p.tiles != 0u) {
        uint t = id / tiles_n;
        if (t >= p.tiles) {
            return;   // padding of a folded grid
        }
        uint entry = offsets[p.groups + 1u + t];
        if (entry == NO_TILE) {
            return;   // past the last m tile that holds slots
        }
        g = entry & 0xffffu;
        m0 = (entry >> 16u) * TM;
        n0 = (id % tiles_n) * BN;
    } else {
        if (id >= tiles_m * tiles_n * p.groups) {
            return;
        }
        g = id / (tiles_m * tiles_n);
        m0 = (id % tiles_m) * TM;
        n0 = ((id / tiles_m) % tiles_n) * BN;
    }
    uint first = offsets[p.first_group + g];
    uint count = offsets[p.first_group + g + 1u] - first;
    if (m0 >= count) {
        return;
    }
    uint live = min(count - m0, TM);
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint base = g * p.b_group_stride;

    coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator> acc[RM][RN];
    [[unroll]] for (uint i = 0u; i < RM; i++) {
        [[unroll]] for (uint t = 0u; t < RN; t++) {
            acc[i][t] = coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>(0.0);
        }
    }
    // Every subgroup passes the same barriers as often (a driver may treat a subgroup barrier
    // as a workgroup one, as lavapipe does): chunks past K are skipped, not their barriers.
    uint chunks = p.k / KU;
#if INT8
    uint w_at = sg * BN * KP8;
    uint a_at = sg * TM * KP8;
    uint scale_at = sg * BN * TM;
    for (uint c0 = 0u; c0 < chunks; c0 += NSG) {
        uint ch = c0 + sg;
        bool live_chunk = ch < chunks;
        for (uint sb = 0u; sb < KU / KS; sb++) {
            uint k0 = ch * KU + sb * KS;
            if (live_chunk) {
                for (uint r = lane; r < BN; r += SG) {
                    stage_w8(base, n0 + r, k0, w_at + r * KP8, sg * BN + r);
                }
                for (uint r = lane; r < TM; r += SG) {
                    if (r < live) {
                        uint slot = first + m0 + r;
                        stage_a8(p.gather != 0u ? gather_rows[slot] : slot, k0, a_at + r * KP8, sg * TM + r);
                    } else {
                        for (uint q = 0u; q < KS; q++) {
                            sa8[a_at + r * KP8 + q] = int8_t(0);
                        }
                        da[sg * TM + r] = 0.0;
#if WFMT == W_Q4_K
                        sa_sum[sg * TM + r] = 0.0;
#endif
                    }
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (live_chunk) {
                // The block's scales d_w[j] * d_a[s], column-major as the sums are stored.
                for (uint e = lane; e < BN * TM; e += SG) {
                    sums[scale_at + e] = dw[sg * BN + e % BN] * da[sg * TM + e / BN];
#if WFMT == W_Q4_K
                    mins[scale_at + e] = mw[sg * BN + e % BN] * sa_sum[sg * TM + e / BN];
#endif
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (live_chunk) {
                coopmat<int, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator> isum[RM][RN];
                [[unroll]] for (uint i = 0u; i < RM; i++) {
                    [[unroll]] for (uint t = 0u; t < RN; t++) {
                        isum[i][t] = coopmat<int, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>(0);
                    }
                }
                for (uint kk = 0u; kk < KS; kk += FK) {
                    coopmat<int8_t, gl_ScopeSubgroup, FM, FK, gl_MatrixUseA> wf[RM];
                    [[unroll]] for (uint i = 0u; i < RM; i++) {
                        coopMatLoad(wf[i], sw8, w_at + i * FM * KP8 + kk, KP8, gl_CooperativeMatrixLayoutRowMajor);
                    }
                    [[unroll]] for (uint t = 0u; t < RN; t++) {
                        if (t * FN < live) {
                            coopmat<int8_t, gl_ScopeSubgroup, FK, FN, gl_MatrixUseB> af;
                            coopMatLoad(af, sa8, a_at + t * FN * KP8 + kk, KP8, gl_CooperativeMatrixLayoutColumnMajor);
                            [[unroll]] for (uint i = 0u; i < RM; i++) {
                                isum[i][t] = coopMatMulAdd(wf[i], af, isum[i][t]);
                            }
                        }
                    }
                }
                [[unroll]] for (uint t = 0u; t < RN; t++) {
                    if (t * FN < live) {
                        [[unroll]] for (uint i = 0u; i < RM; i++) {
                            coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator> scale;
                            coopMatLoad(scale, sums, scale_at + t * FN * BN + i * FM, BN, gl_CooperativeMatrixLayoutColumnMajor);
#if WFMT == W_Q4_K
                            coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator> minus;
                            coopMatLoad(minus, mins, scale_at + t * FN * BN + i * FM, BN, gl_CooperativeMatrixLayoutColumnMajor);
                            acc[i][t] += coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>(isum[i][t]) * scale - minus;
#else
                            acc[i][t] += coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>(isum[i][t]) * scale;
#endif
                        }
                    }
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
    // Every subgroup's last reads of its scales are done before the sums overwrite them.
    memoryBarrierShared();
    barrier();
#else
    uint w_at = sg * BN * KP;
    uint a_at = sg * TM * KP;
    for (uint c0 = 0u; c0 < chunks; c0 += NSG) {
        uint ch = c0 + sg;
        bool live_chunk = ch < chunks;
        for (uint s = 0u; s < KU / KS; s++) {
            uint k0 = ch * KU + s * KS;
            if (live_chunk) {
                for (uint r = lane; r < BN; r += SG) {
                    stage_w(base, n0 + r, k0, w_at + r * KP);
                }
                for (uint r = lane; r < TM; r += SG) {
                    if (r < live) {
                        uint slot = first + m0 + r;
                        stage_a(p.gather != 0u ? gather_rows[slot] : slot, k0, a_at + r * KP);
                    } else {
                        for (uint q = 0u; q < KS; q++) {
                            sa[a_at + r * KP + q] = float16_t(0.0);
                        }
                    }
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (live_chunk) {
                for (uint kk = 0u; kk < KS; kk += FK) {
                    coopmat<float16_t, gl_ScopeSubgroup, FM, FK, gl_MatrixUseA> wf[RM];
                    [[unroll]] for (uint i = 0u; i < RM; i++) {
                        coopMatLoad(wf[i], sw, w_at + i * FM * KP + kk, KP, gl_CooperativeMatrixLayoutRowMajor);
                    }
                    [[unroll]] for (uint t = 0u; t < RN; t++) {
                        if (t * FN < live) {
                            coopmat<float16_t, gl_ScopeSubgroup, FK, FN, gl_MatrixUseB> af;
                            coopMatLoad(af, sa, a_at + t * FN * KP + kk, KP, gl_CooperativeMatrixLayoutColumnMajor);
                            [[unroll]] for (uint i = 0u; i < RM; i++) {
                                acc[i][t] = coopMatMulAdd(wf[i], af, acc[i][t]);
                            }
                        }
                    }
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
#endif
    // The subgroups' partial sums, then their sum for the live slots.
    uint sum_at = sg * BN * TM;
    [[unroll]] for (uint i = 0u; i < RM; i++) {
        [[unroll]] for (uint t = 0u; t < RN; t++) {
            if (t * FN < live) {
                coopMatStore(acc[i][t], sums, sum_at + t * FN * BN + i * FM, BN, gl_CooperativeMatrixLayoutColumnMajor);
            }
        }
    }
    memoryBarrierShared();
    barrier();
    for (uint e = gl_LocalInvocationIndex; e < live * BN; e += SG * NSG) {
        uint j = e % BN;
        uint t = e / BN;
        float total = 0.0;
        [[unroll]] for (uint q = 0u; q < NSG; q++) {
            total += sums[q * BN * TM + t * BN + j];
        }
        c[(first + m0 + t) * p.c_rs + n0 + j] = total;
    }
}
