// The CUDA backend's matrix product (backend.h, the "cublas_ops.cc" section):
// Gemm over row-major float32 matrices on cuBLAS. ops::MatMul calls it for
// tensors on a GPU (worker/tensor/ops.cc); it is the GPU twin of
// cpu::Gemm (cpu_math.h), with the same argument order and semantics.
//
// Row-major on a column-major library: a row-major [r, c] matrix with
// leading dimension c is, byte for byte, its transpose as a column-major
// [c, r] matrix with the same leading dimension. So the row-major product
// C = op(A) op(B) is computed as the column-major product
// C^T = op(B)^T op(A)^T: B goes first, the m and n extents swap, and each
// operand keeps its own transpose flag (see Gemm for the leading
// dimensions).
//
// Precision: FP32 in, FP32 accumulate, FP32 out. The handle was put in
// CUBLAS_PEDANTIC_MATH by DeviceContext, which rules out TF32 and every
// other reduced-precision shortcut, so the GPU stays within the 1e-4 of the
// CPU that the tests hold it to. A mixed-precision product (ComputeType
// bfloat16 or float16, whose operands the caller rounded to that type) goes
// through cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_16BF / _16F: tensor
// cores convert the float operands to the 16-bit type — exactly, since they
// already hold its values — and accumulate in FP32. The handle is switched
// to the default math mode for that call and back to pedantic after it.
//
// Thread-safety: reentrant. The device's cuBLAS handle is used under its
// context's op lock; the work is queued on the compute stream and not
// waited for.

#include <cstddef>
#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "worker/tensor/cuda/backend.h"
#include "worker/tensor/cuda/device_context.h"

namespace distrain::cuda {

void Gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c, ComputeType compute) {
  DeviceContext& ctx = DeviceContext::Get(device);
  DISTRAIN_CHECK(m >= 0 && n >= 0 && k >= 0) << "Gemm m=" << m << " n=" << n << " k=" << k;
  if (m == 0 || n == 0) return;
  absl::MutexLock lock(&ctx.op_mutex());
  cublasHandle_t handle = ctx.cublas();
  // alpha and beta are host scalars. Set on every call: the mode is handle
  // state, and this file should not depend on no other user having changed it.
  DISTRAIN_CUBLAS_CHECK(Cublas().cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));

  if (k == 0) {
    // An empty sum: C = beta * C, as BLAS defines it (and cpu::Gemm gets
    // from cblas). Done here because cuBLAS rejects the zero leading
    // dimension an empty operand would have. beta == 0 writes zeros without
    // reading C, which may hold anything, NaN included.
    if (beta == 1.0f) return;
    if (beta == 0.0f) {
      DISTRAIN_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(m * n) * sizeof(float),
                                          ctx.compute_stream()));
      return;
    }
    DISTRAIN_CUBLAS_CHECK(Cublas().cublasSscal_64(handle, m * n, &beta, c, 1));
    return;
  }

  // The column-major product C^T[n, m] = op(B)^T[n, k] op(A)^T[k, m].
  //  * B stored [k, n] (no transpose) is column-major [n, k] with ld n:
  //    exactly op(B)^T = B^T, so CUBLAS_OP_N, ldb = n. Stored [n, k]
  //    (trans_b) it is column-major [k, n] with ld k, whose transpose is
  //    op(B)^T: CUBLAS_OP_T, ldb = k.
  //  * A stored [m, k] is column-major [k, m] with ld k = op(A)^T:
  //    CUBLAS_OP_N, lda = k. Stored [k, m] (trans_a) it is column-major
  //    [m, k] with ld m, transposed by cuBLAS: CUBLAS_OP_T, lda = m.
  //  * C stored [m, n] is column-major [n, m] with ld n.
  // Every leading dimension is at least the row count cuBLAS checks it
  // against (n, k or m of the operand as stored), and all are >= 1 here.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t ldb = trans_b ? k : n;
  const int64_t lda = trans_a ? m : k;
  // The 64-bit entry points: no extent or leading dimension has to fit an int.
  if (compute == ComputeType::kFloat32) {
    DISTRAIN_CUBLAS_CHECK(Cublas().cublasSgemm_64(handle, op_b, op_a, n, m, k, &alpha, b, ldb, a,
                                                  lda, &beta, c, n));
    return;
  }
  const cublasComputeType_t tensor_core_type = compute == ComputeType::kBfloat16
                                                   ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                   : CUBLAS_COMPUTE_32F_FAST_16F;
  DISTRAIN_CUBLAS_CHECK(Cublas().cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  const cublasStatus_t status = Cublas().cublasGemmEx_64(
      handle, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
      CUDA_R_32F, n, tensor_core_type, CUBLAS_GEMM_DEFAULT);
  DISTRAIN_CUBLAS_CHECK(Cublas().cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
  DISTRAIN_CUBLAS_CHECK(status);
}

}  // namespace distrain::cuda
