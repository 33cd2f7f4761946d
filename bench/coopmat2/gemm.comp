#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable

// C[M, N] = A[M, K] . W[N, K]^T: A f16 rows, W f16 rows (the head's E), C f32 rows.
layout(local_size_x = BLOCK, local_size_y = 1, local_size_z = 1) in;

layout (binding = 0) readonly buffer A { float16_t data_a[]; };
layout (binding = 1) readonly buffer W { float16_t data_w[]; };
layout (binding = 2) writeonly buffer C { float data_c[]; };

void main() {
    const uint ir = gl_WorkGroupID.x % (M / BM);
    const uint ic = gl_WorkGroupID.x / (M / BM);

    tensorLayoutNV<2> layoutA = createTensorLayoutNV(2);
    tensorLayoutNV<2> layoutW = createTensorLayoutNV(2);
    tensorLayoutNV<2> layoutC = createTensorLayoutNV(2);
    layoutA = setTensorLayoutDimensionNV(layoutA, M, K);
    layoutW = setTensorLayoutDimensionNV(layoutW, N, K);
    layoutC = setTensorLayoutDimensionNV(layoutC, M, N);
    layoutA = setTensorLayoutStrideNV(layoutA, K, 1);
    layoutW = setTensorLayoutStrideNV(layoutW, K, 1);
    layoutC = setTensorLayoutStrideNV(layoutC, N, 1);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> sum =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    for (uint k = 0; k < K; k += BK * UNROLL) {
        [[unroll]] for (uint j = 0; j < UNROLL; ++j) {
            coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
            coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> w;
            coopMatLoadTensorNV(a, data_a, 0, sliceTensorLayoutNV(layoutA, ir * BM, BM, k + j * BK, BK));
            coopMatLoadTensorNV(w, data_w, 0, sliceTensorLayoutNV(layoutW, ic * BN, BN, k + j * BK, BK), transposed);
            sum = coopMatMulAdd(a, w, sum);
        }
    }
    coopMatStoreTensorNV(sum, data_c, 0, sliceTensorLayoutNV(layoutC, ir * BM, BM, ic * BN, BN));
}
