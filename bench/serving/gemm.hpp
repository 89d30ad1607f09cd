/**
 * @file bench/serving/gemm.hpp
 * @brief The dense stand-in: bf16 GEMMs through cuBLAS (one per layer, sized like one
 *        GPU's share of the active weights; the LM head and the drafter once per step).
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse::bench::serving {

/// Owns a cuBLAS handle and its workspace (so that GEMMs can be captured in a CUDA graph).
class gemm_engine {
 public:
  gemm_engine();
  ~gemm_engine();
  gemm_engine(gemm_engine const&)            = delete;
  gemm_engine& operator=(gemm_engine const&) = delete;

  /**
   * @brief Y = W · X in cuBLAS's column-major terms — W is n × k, X is k × m (m tokens of
   *        k features, i.e. [m][k] row-major), Y is n × m ([m][n] row-major); bf16 in and
   *        out, fp32 accumulation. Stream-ordered, capturable.
   */
  void run(void const* w, int n, int k, void const* x, int m, void* y, cudaStream_t stream);

 private:
  void* handle_    = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t(32) << 20;
};

/// Hidden size of every dense stand-in GEMM (the K dimension); weights of B bytes have
/// B / (2 · hidden) output features.
inline constexpr int dense_hidden = 4096;

}  // namespace dhisparse::bench::serving
