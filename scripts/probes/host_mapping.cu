// Probe (issue 15): does the way host memory is mapped into the GPU's address space decide
// how fast the SM gather reads small scattered rows? Same pool size, same plans (random
// rows, sorted by address as resolve emits them), three allocations:
//   host_alloc  cudaHostAlloc (the library's default)
//   pool_numa   a cudaMemPool of location cudaMemLocationTypeHostNuma (stream-ordered
//               host allocation; device access granted with cudaMemPoolSetAccess)
//   vmm_numa    cuMemCreate(CU_MEM_LOCATION_TYPE_HOST_NUMA) + cuMemMap at the recommended
//               granularity, device and host access set with cuMemSetAccess
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude
//        scripts/probes/host_mapping.cu -o host_mapping -lcuda
// Run:   ./host_mapping [pool GiB, default 8]
// Plans: random or sorted by address; "warm" re-gathers one plan every repetition (the rows'
// translations and host-side caches warm), "cold" draws fresh rows each repetition (as each
// decode step's misses are).
#include <dhisparse/retrieve.cuh>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } \
  } while (0)
#define CD(x)                                                   \
  do {                                                          \
    CUresult r_ = (x);                                          \
    if (r_ != CUDA_SUCCESS) {                                   \
      char const* s_ = nullptr;                                 \
      cuGetErrorString(r_, &s_);                                \
      std::printf("%s: %s\n", #x, s_ ? s_ : "?");               \
      return nullptr;                                           \
    }                                                           \
  } while (0)

__global__ void fill_kernel(std::uint64_t* p, std::size_t n)
{
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    p[i] = i * 0x9E3779B97F4A7C15ull;
  }
}

__global__ void flush_kernel(int* p, std::size_t n)
{
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    p[i] += 1;
  }
}

std::byte* vmm_alloc(std::size_t bytes, std::size_t& granularity)
{
  CUmemAllocationProp prop{};
  prop.type          = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id   = 0;
  CD(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  bytes = (bytes + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle h;
  CD(cuMemCreate(&h, bytes, &prop, 0));
  CUdeviceptr p = 0;
  CD(cuMemAddressReserve(&p, bytes, granularity, 0, 0));
  CD(cuMemMap(p, bytes, 0, h, 0));
  CUmemAccessDesc acc[2]{};
  acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc[0].location.id   = 0;
  acc[0].flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  acc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  acc[1].location.id   = 0;
  acc[1].flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CD(cuMemSetAccess(p, bytes, acc, 2));
  return reinterpret_cast<std::byte*>(p);
}

int main(int argc, char** argv)
{
  double const gib        = argc > 1 ? std::atof(argv[1]) : 8.0;
  std::size_t const bytes = std::size_t(gib * double(1ull << 30)) / (2u << 20) * (2u << 20);
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, pool %.1f GiB\n", prop.name, double(bytes) / (1ull << 30));

  int* flush = nullptr;
  std::size_t const flush_n = std::size_t(256) << 20;  // 1 GiB of ints: past the L2
  CK(cudaMalloc(&flush, flush_n * 4));
  std::size_t const max_rows = 262144;
  std::byte* slab = nullptr;
  CK(cudaMalloc(&slab, max_rows * 2624));
  dhisparse::miss_entry* entries = nullptr;
  std::int32_t* count = nullptr;
  CK(cudaMalloc(&entries, max_rows * sizeof(dhisparse::miss_entry)));
  CK(cudaMalloc(&count, 4));
  std::vector<dhisparse::miss_entry> plan(max_rows);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  // memcpy limit from a cudaHostAlloc buffer.
  double memcpy_gbps = 0;
  {
    void* h = nullptr;
    std::size_t const n = std::size_t(1) << 30;
    CK(cudaHostAlloc(&h, n, cudaHostAllocDefault));
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
      CK(cudaEventRecord(e0, stream));
      CK(cudaMemcpyAsync(slab, h, std::min(n, max_rows * 2624), cudaMemcpyHostToDevice, stream));
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      best = std::min(best, t);
    }
    memcpy_gbps = double(std::min(n, max_rows * 2624)) / (1e6 * best);
    CK(cudaFreeHost(h));
  }
  std::printf("memcpy H2D %.1f GB/s\n", memcpy_gbps);

  for (int kind = 0; kind < 3; ++kind) {
    char const* name = kind == 0 ? "host_alloc" : kind == 1 ? "pool_numa" : "vmm_numa";
    std::byte* base  = nullptr;
    cudaMemPool_t pool{};
    std::size_t gran = 0;
    if (kind == 0) {
      CK(cudaHostAlloc(reinterpret_cast<void**>(&base), bytes, cudaHostAllocMapped));
    } else if (kind == 1) {
      cudaMemPoolProps pp{};
      pp.allocType     = cudaMemAllocationTypePinned;
      pp.handleTypes   = cudaMemHandleTypeNone;
      pp.location.type = cudaMemLocationTypeHostNuma;
      pp.location.id   = 0;
      cudaError_t const e = cudaMemPoolCreate(&pool, &pp);
      if (e != cudaSuccess) {
        std::printf("%s: cudaMemPoolCreate: %s\n", name, cudaGetErrorString(e));
        continue;
      }
      cudaMemAccessDesc d{};
      d.location.type = cudaMemLocationTypeDevice;
      d.location.id   = 0;
      d.flags         = cudaMemAccessFlagsProtReadWrite;
      CK(cudaMemPoolSetAccess(pool, &d, 1));
      CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&base), bytes, pool, stream));
      CK(cudaStreamSynchronize(stream));
    } else {
      base = vmm_alloc(bytes, gran);
      if (base == nullptr) { continue; }
      std::printf("%s: granularity %zu\n", name, gran);
    }
    fill_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<std::uint64_t*>(base), bytes / 8);
    CK(cudaStreamSynchronize(stream));
    for (int row : {656, 2624}) {
      std::size_t const rows_in_pool = bytes / row;
      for (std::size_t n : {std::size_t(36864), std::size_t(262144)}) {
        for (int mode = 0; mode < 4; ++mode) {  // random, sorted; warm (one plan), cold (a fresh plan each rep)
          bool const sorted = mode & 1, cold = mode >= 2;
          std::mt19937_64 rng(n * 31 + row);
          std::vector<std::size_t> idx;
          std::int32_t m = 0;
          auto make_plan = [&] {
            idx.assign(n, 0);
            for (auto& i : idx) { i = rng() % rows_in_pool; }
            std::sort(idx.begin(), idx.end());
            idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
            if (!sorted) { std::shuffle(idx.begin(), idx.end(), rng); }
            for (std::size_t i = 0; i < idx.size(); ++i) {
              plan[i] = {base + idx[i] * row, std::int32_t(i), std::int32_t(i)};
            }
            m = std::int32_t(idx.size());
            CK(cudaMemcpy(entries, plan.data(), m * sizeof(dhisparse::miss_entry), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(count, &m, 4, cudaMemcpyHostToDevice));
          };
          make_plan();
          dhisparse::retrieve_params p{};
          p.plan            = {entries, count, std::int32_t(max_rows)};
          p.slab            = slab;
          p.group_row_bytes = std::size_t(row);
          p.byte_begin      = 0;
          p.byte_end        = std::size_t(row);
          std::vector<float> ts;
          double moved = 0;
          for (int r = 0; r < 8; ++r) {
            if (cold && r > 0) { make_plan(); }
            flush_kernel<<<1024, 256, 0, stream>>>(flush, flush_n);
            CK(cudaEventRecord(e0, stream));
            CK(dhisparse::retrieve_async(p, 0, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float t = 0;
            CK(cudaEventElapsedTime(&t, e0, e1));
            if (r >= 2) {
              ts.push_back(t);
              moved += double(m) * row / (1e6 * t);
            }
          }
          std::sort(ts.begin(), ts.end());
          double const gbps = moved / double(ts.size());  // mean of the reps' GB/s
          // Check a few rows.
          std::vector<std::uint64_t> got(row / 8), want(row / 8);
          bool ok = true;
          for (int c = 0; c < 4 && ok; ++c) {
            std::size_t const i = std::size_t(c) * (m - 1) / 3;
            CK(cudaMemcpy(got.data(), slab + i * row, row, cudaMemcpyDeviceToHost));
            std::size_t const w0 = idx[i] * row / 8;
            for (int j = 0; j < row / 8; ++j) { ok = ok && got[j] == (w0 + j) * 0x9E3779B97F4A7C15ull; }
          }
          std::printf("%-10s row %4d  rows %6d  %-6s %-4s  %7.1f us  %5.1f GB/s  %.2f of memcpy  %s\n", name, row, m,
                      sorted ? "sorted" : "random", cold ? "cold" : "warm", ts[ts.size() / 2] * 1e3, gbps, gbps / memcpy_gbps,
                      ok ? "exact" : "WRONG");
        }
      }
    }
    if (kind == 0) { CK(cudaFreeHost(base)); }
    if (kind == 1) {
      CK(cudaFreeAsync(base, stream));
      CK(cudaStreamSynchronize(stream));
      CK(cudaMemPoolDestroy(pool));
    }
  }
  return 0;
}
