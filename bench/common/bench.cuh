/**
 * @file bench/common/bench.cuh
 * @brief Shared benchmark plumbing: CUDA-event timing with medians and physical-limit
 *        probes (pinned memcpy, HBM copy); the command line, medians and the JSON writer
 *        are in report.hpp (plain C++), included here.
 *
 * Every benchmark prints a human table and, with `--json FILE`, writes its records
 * as JSON; it measures the limit it reports against in the same run (BENCH.md).
 */
#pragma once

#include <dhisparse/error.cuh>

#include "report.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace dhisparse::bench {

/**
 * @brief Times `work(rep)` with CUDA events on `stream`: `warmup` untimed calls, then
 *        `reps` timed ones; returns the per-call milliseconds. `rep` lets the caller
 *        rotate inputs so that caches do not flatter the result.
 */
inline std::vector<double> time_ms(cudaStream_t stream, int warmup, int reps,
                                   std::function<void(int)> const& work)
{
  cudaEvent_t start, stop;
  DHISPARSE_CUDA_TRY(cudaEventCreate(&start));
  DHISPARSE_CUDA_TRY(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) { work(i); }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    DHISPARSE_CUDA_TRY(cudaEventRecord(start, stream));
    work(warmup + i);
    DHISPARSE_CUDA_TRY(cudaEventRecord(stop, stream));
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(stop));
    float t = 0.f;
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

/// Pinned host→device `cudaMemcpyAsync` bandwidth in GB/s (median), `bytes` per copy.
inline double measure_h2d_memcpy_gbps(std::size_t bytes, cudaStream_t stream, int reps = 10)
{
  void* host = nullptr;
  void* dev  = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  DHISPARSE_CUDA_TRY(cudaMalloc(&dev, bytes));
  std::memset(host, 0x5A, bytes);
  auto ms = time_ms(stream, 2, reps, [&](int) {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
  });
  cudaFree(dev);
  cudaFreeHost(host);
  return double(bytes) / (median(ms) * 1e6);
}

/// HBM device→device copy bandwidth in GB/s, counting bytes read plus bytes written.
inline double measure_d2d_copy_gbps(std::size_t bytes, cudaStream_t stream, int reps = 10)
{
  void* a = nullptr;
  void* b = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&a, bytes));
  DHISPARSE_CUDA_TRY(cudaMalloc(&b, bytes));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(a, 0x5A, bytes, stream));
  auto ms = time_ms(stream, 2, reps, [&](int) {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (median(ms) * 1e6);
}

/// Name of the current device, for reports.
inline std::string device_name()
{
  int dev = 0;
  DHISPARSE_CUDA_TRY(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  DHISPARSE_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}

}  // namespace dhisparse::bench
