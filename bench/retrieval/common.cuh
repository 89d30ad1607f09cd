/**
 * @file bench/retrieval/common.cuh
 * @brief What the three retrieval benchmarks share: the command line beyond
 *        `bench::options`, host memory of either kind (with the library's NUMA placement),
 *        a device fill of that memory, an L2 flush between timed calls, and the check of
 *        gathered rows against the host bytes.
 */
#pragma once

#include <dhisparse/host_store.cuh>
#include <dhisparse/miss_plan.cuh>

#include <common/bench.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace dhisparse::bench::retrieval {

/// Flags of the retrieval benchmarks; what remains goes to `bench::options`.
struct flags {
  std::vector<host_memory> memories{host_memory::pinned};
  std::vector<int> batches;    ///< empty: the benchmark's default
  std::vector<int> rows;       ///< empty: the benchmark's default
  double store_gib = 0;        ///< 0: the benchmark's default
  std::vector<int> gpus;       ///< bench_retrieval: GPU counts pulling at once (gpus.cuh); empty: one GPU
  options opt;

  static std::vector<int> int_list(char const* text)
  {
    std::vector<int> out;
    for (char const* c = text; *c != '\0';) {
      char* end = nullptr;
      long const v = std::strtol(c, &end, 10);
      if (end == c) { break; }
      out.push_back(int(v));
      c = *end == ',' ? end + 1 : end;
    }
    return out;
  }

  /// `--memory pinned|huge|both`, `--huge` (= `--memory huge`), `--batches 1,32`,
  /// `--rows 656,2624`, `--store-gib N`, `--gpus N` (or a list); the rest as
  /// `bench::options` (--json, --reps, --quick).
  static flags parse(int argc, char** argv)
  {
    flags f;
    std::vector<char*> rest{argv[0]};
    for (int i = 1; i < argc; ++i) {
      std::string const a = argv[i];
      bool const value = i + 1 < argc;
      if (a == "--huge") {
        f.memories = {host_memory::huge_pages};
      } else if (a == "--memory" && value) {
        std::string const m = argv[++i];
        f.memories = m == "both"   ? std::vector<host_memory>{host_memory::pinned, host_memory::huge_pages}
                     : m == "huge" ? std::vector<host_memory>{host_memory::huge_pages}
                                   : std::vector<host_memory>{host_memory::pinned};
      } else if (a == "--batches" && value) {
        f.batches = int_list(argv[++i]);
      } else if (a == "--rows" && value) {
        f.rows = int_list(argv[++i]);
      } else if (a == "--store-gib" && value) {
        f.store_gib = std::atof(argv[++i]);
      } else if (a == "--gpus" && value) {
        f.gpus = int_list(argv[++i]);
      } else if (a == "--help" || a == "-h") {
        std::printf("usage: %s [--memory pinned|huge|both] [--huge] [--batches B1,B2,...] [--rows R1,R2,...]\n"
                    "       [--store-gib N] [--gpus N | --gpus N1,N2,...] [--json FILE] [--reps N] [--quick]\n",
                    argv[0]);
        std::exit(0);
      } else {
        rest.push_back(argv[i]);
      }
    }
    f.opt = options::parse(int(rest.size()), rest.data());
    return f;
  }
};

inline char const* memory_name(host_memory m)
{
  return m == host_memory::huge_pages ? "huge_pages" : m == host_memory::pinned ? "pinned" : "caller";
}
inline char const* memory_how(host_memory m)
{
  return m == host_memory::huge_pages ? "mmap + MADV_HUGEPAGE + cudaHostRegister" : "cudaHostAlloc";
}

/// Host memory of one kind, mapped, placed by the library (NUMA node closest to the GPU).
inline dhisparse::detail::pinned_host_memory host_memory_of(host_memory kind, std::size_t bytes)
{
  host_store_config c;
  c.memory = kind;
  return dhisparse::detail::pinned_host_memory(c, bytes);
}

/**
 * @brief A miss plan of `rows` distinct random rows of `row_bytes` in a pool of `pool_rows`
 *        rows at device address `base`, in the order they were drawn; slots a random
 *        permutation of [0, rows), entry i's query index i.
 */
inline std::vector<miss_entry> random_plan(std::byte* base, std::size_t pool_rows, int rows, int row_bytes,
                                           std::mt19937_64& rng)
{
  std::vector<std::size_t> picks;
  std::vector<char> used(pool_rows, 0);
  while (int(picks.size()) < rows) {
    std::size_t const p = rng() % pool_rows;
    if (!used[p]) {
      used[p] = 1;
      picks.push_back(p);
    }
  }
  std::vector<std::int32_t> slots(static_cast<std::size_t>(rows));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<miss_entry> plan(static_cast<std::size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    plan[std::size_t(i)] = miss_entry{base + picks[std::size_t(i)] * std::size_t(row_bytes), slots[std::size_t(i)], i};
  }
  return plan;
}

/// Sorts plan entries [first, last) by host address (the order `order_plan_async` gives).
inline void sort_by_address(std::vector<miss_entry>::iterator first, std::vector<miss_entry>::iterator last)
{
  std::sort(first, last, [](miss_entry const& a, miss_entry const& b) { return a.src < b.src; });
}

/// 16-byte vector `i` of the fill pattern (never all zero).
DHISPARSE_HOST_DEVICE inline int4 pattern(std::uint64_t i)
{
  std::uint64_t x = i * 0x9E3779B97F4A7C15ull + 0x5EEDull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return make_int4(int(x | 1u), int(x >> 32), int(i), int(i >> 32) ^ 0x7E57);
}

template <int Dummy = 0>
__global__ void fill_kernel(int4* memory, std::uint64_t vectors)
{
  for (std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += std::uint64_t(gridDim.x) * blockDim.x) {
    memory[i] = pattern(i);
  }
}

/// Writes the pattern into `bytes` of mapped host memory through the device (PCIe speed).
inline void fill(std::byte* device_address, std::size_t bytes, cudaStream_t stream)
{
  fill_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<int4*>(device_address), bytes / 16);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
}

/// A device buffer larger than L2, written before each timed call so that no timed gather
/// finds its rows (or its plan) in L2 from an earlier one.
class l2_flush {
 public:
  explicit l2_flush(std::size_t bytes = std::size_t{256} << 20) : bytes_{bytes}
  {
    DHISPARSE_CUDA_TRY(cudaMalloc(&buffer_, bytes_));
  }
  l2_flush(l2_flush const&)            = delete;
  l2_flush& operator=(l2_flush const&) = delete;
  ~l2_flush() { cudaFree(buffer_); }
  void operator()(cudaStream_t stream) { DHISPARSE_CUDA_TRY(cudaMemsetAsync(buffer_, ++value_ & 0xFF, bytes_, stream)); }

 private:
  void* buffer_ = nullptr;
  std::size_t bytes_;
  int value_ = 0;
};

template <int Dummy = 0>
__global__ void pack_rows_kernel(std::byte const* slab, std::size_t row_bytes, miss_entry const* entries,
                                 std::int64_t first, std::int64_t step, std::int64_t n, std::byte* out)
{
  std::int64_t const vectors = std::int64_t(row_bytes / 16);
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * vectors;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const k = i / vectors, v = i % vectors;
    miss_entry const e   = entries[first + k * step];
    reinterpret_cast<int4*>(out + k * row_bytes)[v] =
      reinterpret_cast<int4 const*>(slab + std::size_t(e.slot) * row_bytes)[v];
  }
}

/**
 * @brief Compares the slab rows of up to `max_checked` plan entries (evenly spread) with
 *        the host bytes they were copied from; returns the number of entries that differ
 *        (synchronous). `host_base` / `device_base`: the same memory's two addresses.
 */
inline std::int64_t wrong_rows(miss_plan_ref plan, std::byte const* slab, std::size_t row_bytes,
                               std::byte const* host_base, std::byte const* device_base, cudaStream_t stream,
                               std::int64_t max_checked = 32768)
{
  std::int32_t count = 0;
  DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&count, plan.count, 4, cudaMemcpyDeviceToHost, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  if (count <= 0) { return 0; }
  std::int64_t const step = std::max<std::int64_t>(1, (count + max_checked - 1) / max_checked);
  std::int64_t const n    = (count + step - 1) / step;
  std::vector<miss_entry> entries(static_cast<std::size_t>(count));
  DHISPARSE_CUDA_TRY(cudaMemcpy(entries.data(), plan.entries, entries.size() * sizeof(miss_entry), cudaMemcpyDeviceToHost));
  std::byte* packed = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&packed, std::size_t(n) * row_bytes));
  pack_rows_kernel<<<1024, 256, 0, stream>>>(slab, row_bytes, plan.entries, 0, step, n, packed);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  std::vector<std::byte> got(std::size_t(n) * row_bytes);
  DHISPARSE_CUDA_TRY(cudaMemcpyAsync(got.data(), packed, got.size(), cudaMemcpyDeviceToHost, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  cudaFree(packed);
  std::int64_t wrong = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    miss_entry const& e = entries[std::size_t(k * step)];
    if (e.src == nullptr) { continue; }
    std::byte const* want = host_base + (e.src - device_base);
    wrong += std::memcmp(want, got.data() + std::size_t(k) * row_bytes, row_bytes) != 0;
  }
  return wrong;
}

/**
 * @brief Like `bench::time_ms`, with an untimed `prepare(rep)` (restore inputs, flush L2)
 *        enqueued before each call's start event.
 */
inline std::vector<double> time_prepared_ms(cudaStream_t stream, int warmup, int reps,
                                            std::function<void(int)> const& prepare,
                                            std::function<void(int)> const& work)
{
  cudaEvent_t start, stop;
  DHISPARSE_CUDA_TRY(cudaEventCreate(&start));
  DHISPARSE_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < warmup + reps; ++i) {
    prepare(i);
    DHISPARSE_CUDA_TRY(cudaEventRecord(start, stream));
    work(i);
    DHISPARSE_CUDA_TRY(cudaEventRecord(stop, stream));
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(stop));
    float t = 0.f;
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, start, stop));
    if (i >= warmup) { ms.push_back(t); }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

/// Median of `ms` in microseconds.
inline double median_us(std::vector<double> const& ms) { return 1e3 * median(ms); }

}  // namespace dhisparse::bench::retrieval
