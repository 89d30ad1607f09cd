// Catch2 main for GPU test executables; compiled once.
//
// Debian's Catch2 (2.13) has no SKIP(): an executable without a usable CUDA device
// prints why and returns the code CTest is told to read as "skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

#include "gpu_test.cuh"

int main(int argc, char* argv[])
{
  int count         = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    std::printf("skipped: no CUDA device (%s)\n",
                status == cudaSuccess ? "0 devices" : cudaGetErrorString(status));
    return dhisparse::test::skip_return_code;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::fprintf(stderr, "running on %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  return Catch::Session().run(argc, argv);
}
