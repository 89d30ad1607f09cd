/**
 * @file error.cuh
 * @brief CUDA error handling: `DHISPARSE_CUDA_TRY` and the debug-sync launch check.
 */
#pragma once

#include <dhisparse/error.hpp>

#include <cuda_runtime_api.h>

#include <string>

namespace dhisparse::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* expr, const char* file,
                                          int line)
{
  // Clear the error so that a non-sticky failure does not poison later, unrelated calls.
  cudaGetLastError();
  throw_error(file, line,
              std::string(expr) + " failed: " + cudaGetErrorName(status) + ": " +
                cudaGetErrorString(status));
}

}  // namespace dhisparse::detail

/**
 * @brief Evaluates a CUDA runtime call; on failure clears the error state and throws
 * `dhisparse::error` naming the call, the CUDA error and file:line.
 */
#define DHISPARSE_CUDA_TRY(expr)                                                           \
  do {                                                                                     \
    cudaError_t dhisparse_status_ = (expr);                                                \
    if (dhisparse_status_ != cudaSuccess) {                                                \
      ::dhisparse::detail::throw_cuda_error(dhisparse_status_, #expr, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

/**
 * @brief Checks the last launch. With `DHISPARSE_DEBUG_SYNC` defined (CMake option
 * `DHISPARSE_DEBUG_SYNC`) it also synchronizes `stream` so that a faulting kernel is
 * reported at its own launch site.
 *
 * Used by launch-level functions that return `cudaError_t`: evaluates to the error.
 */
namespace dhisparse::detail {
inline cudaError_t check_launch([[maybe_unused]] cudaStream_t stream)
{
  cudaError_t status = cudaGetLastError();
#if defined(DHISPARSE_DEBUG_SYNC)
  if (status == cudaSuccess) { status = cudaStreamSynchronize(stream); }
#endif
  return status;
}
}  // namespace dhisparse::detail
