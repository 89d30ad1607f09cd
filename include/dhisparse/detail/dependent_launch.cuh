/**
 * @file detail/dependent_launch.cuh
 * @brief Programmatic dependent launch (sm_90) between the kernels of one operation: the
 *        next kernel's blocks are scheduled while its predecessor still runs and wait on
 *        the device, so no launch gap separates them.
 *
 * The predecessor calls `launch_dependents()` (early: its dependents may then start); the
 * dependent is launched with `launch_dependent(…)` and calls `wait_for_prerequisites()`
 * before it reads anything its predecessor writes (it returns once the predecessor has
 * completed and its writes are visible). Both are no-ops on older architectures, and the
 * wait returns at once in a kernel launched without the attribute. Stream capture records
 * the dependency as a programmatic graph edge.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

namespace dhisparse::detail {

#if defined(__CUDACC__)
/// See the file comment.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // griddepcontrol.launch_dependents
#endif
}

/// See the file comment.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void wait_for_prerequisites()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();  // griddepcontrol.wait
#endif
}

/// Launches `kernel<<<grid, block, shared_bytes, stream>>>(args…)` as a programmatic
/// dependent of the stream's previous kernel.
template <class... Params, class... Args>
cudaError_t launch_dependent_shared(void (*kernel)(Params...), unsigned grid, unsigned block,
                                    std::size_t shared_bytes, cudaStream_t stream, Args&&... args)
{
  cudaLaunchAttribute early{};
  early.id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim          = dim3(grid);
  config.blockDim         = dim3(block);
  config.dynamicSmemBytes = shared_bytes;
  config.stream           = stream;
  config.attrs            = &early;
  config.numAttrs         = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

/// `launch_dependent_shared` without dynamic shared memory.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), unsigned grid, unsigned block, cudaStream_t stream,
                             Args&&... args)
{
  return launch_dependent_shared(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}
#endif  // __CUDACC__

}  // namespace dhisparse::detail
