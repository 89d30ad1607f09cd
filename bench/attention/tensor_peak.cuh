/**
 * @file bench/attention/tensor_peak.cuh
 * @brief bf16 tensor-core peak of this GPU, measured in the benchmark's own run: every SM
 *        runs two warpgroups that issue back-to-back `wgmma` m64n128k16 (bf16 → fp32) on
 *        non-zero operands resident in shared memory, two accumulator sets per warpgroup so
 *        that one `wgmma` group is always queued (no global memory traffic at all).
 *
 * This is the ceiling the tensor cores reach with perfect operand supply: an upper bound of
 * what any bf16 matmul (and the attention kernel's QK and PV products) can achieve. cuBLAS
 * is not a dependency of dhisparse; BENCH.md's 8192³ GEMM (≈ 790 TFLOP/s) is printed next
 * to it for comparison.
 */
#pragma once

#include "common/bench.cuh"

#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace dhisparse::bench {

namespace tensor_peak_detail {

/// D[64 x 128] += A[64 x 16] B[16 x 128] (both K-major in shared memory), sm_90a.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
    "{\n.reg .pred p;\n"
    "setp.ne.b32 p, %66, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
    "%64, %65, p, 1, 1, 0, 0;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
    : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
#endif
}

__device__ __forceinline__ std::uint64_t sw128_desc(std::uint32_t addr)
{
  return std::uint64_t((addr & 0x3FFFFu) >> 4) | (std::uint64_t(1) << 16) |
         (std::uint64_t(1024 >> 4) << 32) | (std::uint64_t(1) << 62);
}

inline constexpr int threads    = 256;  // two warpgroups
inline constexpr int a_bytes    = 64 * 128;   // A: 64 rows x 64 bf16 (128-byte swizzle atoms)
inline constexpr int b_bytes    = 128 * 128;  // B: 128 rows x 64 bf16
inline constexpr int smem_bytes = 2 * a_bytes + b_bytes + 1024;

/// `iterations` x 8 wgmma m64n128k16 per warpgroup; writes one checksum per thread so the
/// products are not dead code.
__global__ void __launch_bounds__(threads, 1) wgmma_loop(int iterations, float* sink)
{
  extern __shared__ __align__(1024) unsigned char smem_dynamic[];
  std::uint32_t const dyn  = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_dynamic));
  std::uint32_t const base = (dyn + 1023u) & ~1023u;
  unsigned char* const smem = smem_dynamic + (base - dyn);
  // Non-zero bf16 operands (values in [0.5, 1.5), varying bits).
  for (int i = threadIdx.x; i < (2 * a_bytes + b_bytes) / 2; i += threads) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u;
    h ^= h >> 13;
    reinterpret_cast<std::uint16_t*>(smem)[i] = std::uint16_t(0x3F00u | (h & 0x7Fu));
  }
  __syncthreads();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  int const wg = threadIdx.x / 128;
  std::uint32_t const a_addr = base + std::uint32_t(wg) * a_bytes;
  std::uint32_t const b_addr = base + 2 * a_bytes;
  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc0[i] = 0.f;
    acc1[i] = 0.f;
  }
  for (int it = 0; it < iterations; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wgmma_m64n128k16(acc0, sw128_desc(a_addr + 32 * k), sw128_desc(b_addr + 32 * k));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wgmma_m64n128k16(acc1, sw128_desc(a_addr + 32 * k), sw128_desc(b_addr + 32 * k));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) { s += acc0[i] + acc1[i]; }
  sink[blockIdx.x * threads + threadIdx.x] = s;
#else
  (void)iterations;
  sink[blockIdx.x * threads + threadIdx.x] = 0.f;
#endif
}

}  // namespace tensor_peak_detail

/**
 * @brief Measured bf16 tensor-core peak in TFLOP/s (median of `reps` timed launches, one CTA
 *        of two warpgroups per SM). Returns 0 when the binary has no sm_90a code.
 */
inline double measure_bf16_tensor_peak_tflops(cudaStream_t stream, int reps = 10)
{
  namespace d = tensor_peak_detail;
  int device = 0, sms = 0;
  DHISPARSE_CUDA_TRY(cudaGetDevice(&device));
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  float* sink = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&sink, std::size_t(sms) * d::threads * sizeof(float)));
  DHISPARSE_CUDA_TRY(cudaFuncSetAttribute(d::wgmma_loop, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          d::smem_bytes));
  int const iterations = 20000;
  auto ms = time_ms(stream, 2, reps, [&](int) {
    d::wgmma_loop<<<sms, d::threads, d::smem_bytes, stream>>>(iterations, sink);
  });
  std::vector<float> host(std::size_t(sms) * d::threads);
  DHISPARSE_CUDA_TRY(cudaMemcpy(host.data(), sink, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(sink);
  if (host[0] == 0.f) { return 0.0; }  // no wgmma in this binary
  double const flops = 2.0 * 64 * 128 * 16 * 8.0 * iterations * 2 /*warpgroups*/ * sms;
  return flops / (median(ms) * 1e-3) / 1e12;
}

}  // namespace dhisparse::bench
