/**
 * @file detail/device_info.cuh
 * @brief Properties of the current device that launch shapes depend on, queried once per
 *        device and process.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

namespace dhisparse::detail {

/// Streaming multiprocessors of the current device (132 if it cannot be queried).
inline int multiprocessor_count()
{
  constexpr int max_devices = 64;
  static std::array<std::atomic<int>, max_devices> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= max_devices) {
    cudaGetLastError();
    return 132;
  }
  int sms = cached[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
      cudaGetLastError();
      sms = 132;
    }
    cached[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace dhisparse::detail
