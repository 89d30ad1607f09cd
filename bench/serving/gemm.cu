/**
 * @file bench/serving/gemm.cu
 * @brief cuBLAS bf16 GEMMs of the dense stand-in (see gemm.hpp).
 */
#include "gemm.hpp"

#include <dhisparse/error.cuh>

#include <cublas_v2.h>

#include <string>

namespace dhisparse::bench::serving {
namespace {
void cublas_try(cublasStatus_t s, char const* what)
{
  DHISPARSE_EXPECTS(s == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS: ") + what + " failed with status " +
                                                  std::to_string(int(s)));
}
cublasHandle_t as_handle(void* h) { return static_cast<cublasHandle_t>(h); }
}  // namespace

gemm_engine::gemm_engine()
{
  cublasHandle_t h = nullptr;
  cublas_try(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  DHISPARSE_CUDA_TRY(cudaMalloc(&workspace_, workspace_bytes_));
  cublas_try(cublasSetWorkspace(h, workspace_, workspace_bytes_), "cublasSetWorkspace");
  cublas_try(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

gemm_engine::~gemm_engine()
{
  if (handle_ != nullptr) { cublasDestroy(as_handle(handle_)); }
  cudaFree(workspace_);
}

void gemm_engine::run(void const* w, int n, int k, void const* x, int m, void* y, cudaStream_t stream)
{
  if (m <= 0 || n <= 0) { return; }
  cublasHandle_t const h = as_handle(handle_);
  cublas_try(cublasSetStream(h, stream), "cublasSetStream");
  float const alpha = 1.0f, beta = 0.0f;
  cublas_try(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, n, x, CUDA_R_16BF, k, &beta,
                          y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

}  // namespace dhisparse::bench::serving
