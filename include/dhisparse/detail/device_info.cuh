/**
 * @file detail/device_info.cuh
 * @brief Properties of the current device that launch shapes depend on, queried once per
 *        device and process.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>

namespace dhisparse::detail {

/// Attribute `A` of the current device, queried once per device (`fallback` if it cannot be).
template <cudaDeviceAttr A>
int device_attribute(int fallback)
{
  constexpr int max_devices = 64;
  static std::array<std::atomic<int>, max_devices> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= max_devices) {
    cudaGetLastError();
    return fallback;
  }
  int value = cached[device].load(std::memory_order_relaxed);
  if (value == 0) {
    if (cudaDeviceGetAttribute(&value, A, device) != cudaSuccess || value <= 0) {
      cudaGetLastError();
      value = fallback;
    }
    cached[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

/// Streaming multiprocessors of the current device (132 if it cannot be queried).
inline int multiprocessor_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(132); }

/**
 * Dynamic shared memory one block of `kernel` may have on the current device: the device's
 * opt-in limit per block less the kernel's static shared memory.
 */
template <class... Params>
cudaError_t dynamic_shared_bytes(void (*kernel)(Params...), std::size_t& bytes)
{
  static std::atomic<long long> static_bytes{-1};  // one per kernel: a property of its code
  long long used = static_bytes.load(std::memory_order_relaxed);
  if (used < 0) {
    cudaFuncAttributes attributes{};
    cudaError_t const status = cudaFuncGetAttributes(&attributes, kernel);
    if (status != cudaSuccess) { return status; }
    used = static_cast<long long>(attributes.sharedSizeBytes);
    static_bytes.store(used, std::memory_order_relaxed);
  }
  long long const limit = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(48 * 1024);
  bytes                 = limit > used ? std::size_t(limit - used) : 0;
  return cudaSuccess;
}

}  // namespace dhisparse::detail
