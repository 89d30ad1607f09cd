/**
 * @file bench/retrieval/gpus.cuh
 * @brief `bench_retrieval --gpus N`: several GPUs of one host pulling missed rows from host
 *        memory at once (issue 19 item 4). Per-GPU PCIe figures do not add up for free: the
 *        GPUs share the host's memory bandwidth and, on a multi-socket host, its
 *        inter-socket link.
 *
 * For each GPU count n of the list (`--gpus 8` = 1, 2, 4, 8; `--gpus 1,3` as given; counts
 * above the devices present are skipped) the first n devices each get their own host pool
 * (`--store-gib`, default 4 GiB; pinned or huge pages, placed by the library on the NUMA
 * node closest to that GPU — the binding is printed per GPU), a slab and a plan of distinct
 * random rows of their pool sorted by host address (what `order_plan_async` / resolve's
 * address order hands to retrieve). Then, in one run:
 *   memcpy    every GPU copies the same bytes as its gather with one pinned
 *             `cudaMemcpyAsync` (contiguous), all at once;
 *   retrieve  every GPU gathers its plan with `retrieve_async`, all at once.
 * "At once": each GPU's stream waits behind a gate kernel that polls one mapped host word;
 * the host releases every gate after all work is enqueued, so the GPUs start together,
 * apart only by how soon each sees the word (not measured here). A GPU's time runs from
 * its gate's release to the end of its work (events on its stream); the aggregate
 * bandwidth is the bytes of all GPUs over the longest of those times. Reported per GPU count and row size: aggregate GB/s of both,
 * per-GPU GB/s, and each GPU's gather over its concurrent memcpy (`of_memcpy`); per GPU also
 * its solo memcpy (alone on the link). Gathered rows are checked against the host bytes.
 */
#pragma once

#include <dhisparse/retrieve.cuh>

#include <retrieval/common.cuh>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace dhisparse::bench::retrieval {

/// Holds a stream until the host writes a non-zero `*release` (or ~4 G cycles pass, ≈ 2 s:
/// a mistake shows up as a wrong time, never as a hang).
template <int Dummy = 0>
__global__ void gate_kernel(int const volatile* release)
{
  long long const begin = clock64();
  while (*release == 0 && clock64() - begin < 4'000'000'000ll) { __nanosleep(256); }
}

/// GPU counts of `--gpus`: one value N is 1, 2, 4, … up to N (N itself included); a list
/// is taken as given.
inline std::vector<int> gpu_counts(std::vector<int> const& asked)
{
  if (asked.size() != 1) { return asked; }
  std::vector<int> out;
  for (int n = 1; n < asked[0]; n *= 2) { out.push_back(n); }
  out.push_back(asked[0]);
  return out;
}

/// One GPU of the run and what it owns.
struct gpu_lane {
  int device = 0;
  cudaStream_t stream{};
  cudaEvent_t start{}, stop{};
  detail::pinned_host_memory pool;
  std::byte* slab          = nullptr;  ///< gather and memcpy destination
  miss_entry* entries      = nullptr;  ///< the plan retrieve reads
  miss_entry* pristine     = nullptr;  ///< the plan as built (restored before each call)
  std::int32_t* count      = nullptr;
  int* release             = nullptr;  ///< the gate word, as this device addresses it
  double solo_memcpy_gbps  = 0;

  gpu_lane(int d, host_memory kind, std::size_t pool_bytes, std::size_t slab_bytes, int max_rows, int* gate)
    : device{d}
  {
    DHISPARSE_CUDA_TRY(cudaSetDevice(d));
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DHISPARSE_CUDA_TRY(cudaEventCreate(&start));
    DHISPARSE_CUDA_TRY(cudaEventCreate(&stop));
    pool = host_memory_of(kind, pool_bytes);  // NUMA node of the current device, i.e. d
    fill(pool.device(), pool_bytes, stream);
    DHISPARSE_CUDA_TRY(cudaMalloc(&slab, slab_bytes));
    DHISPARSE_CUDA_TRY(cudaMalloc(&entries, sizeof(miss_entry) * std::size_t(max_rows)));
    DHISPARSE_CUDA_TRY(cudaMalloc(&pristine, sizeof(miss_entry) * std::size_t(max_rows)));
    DHISPARSE_CUDA_TRY(cudaMalloc(&count, sizeof(std::int32_t)));
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&release), gate, 0));
  }
  gpu_lane(gpu_lane const&)            = delete;
  gpu_lane& operator=(gpu_lane const&) = delete;
  ~gpu_lane()
  {
    cudaSetDevice(device);
    cudaFree(count);
    cudaFree(pristine);
    cudaFree(entries);
    cudaFree(slab);
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
    cudaStreamDestroy(stream);
  }

  /// A plan of `rows` distinct random rows of `row_bytes` of the pool, sorted by host
  /// address, slots a permutation; uploaded as the pristine plan.
  void make_plan(int rows, int row_bytes, std::size_t pool_bytes, std::mt19937_64& rng)
  {
    auto plan = random_plan(pool.device(), pool_bytes / std::size_t(row_bytes), rows, row_bytes, rng);
    sort_by_address(plan.begin(), plan.end());
    DHISPARSE_CUDA_TRY(cudaSetDevice(device));
    DHISPARSE_CUDA_TRY(cudaMemcpy(pristine, plan.data(), sizeof(miss_entry) * plan.size(), cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemcpy(count, &rows, sizeof rows, cudaMemcpyHostToDevice));
  }

  retrieve_params params(int rows, int row_bytes) const
  {
    retrieve_params p{};
    p.plan            = {entries, count, rows};
    p.slab            = slab;
    p.group_row_bytes = std::size_t(row_bytes);
    p.byte_begin      = 0;
    p.byte_end        = std::size_t(row_bytes);
    return p;
  }
};

/// What one timed call of every lane at once measured: each lane's milliseconds.
using lane_times = std::vector<double>;

/**
 * @brief Runs `work(lane)` on every lane of `lanes` at once behind the gate (after an
 *        untimed `prepare(lane)`), `reps` times after `warmup`; returns each repetition's
 *        per-lane milliseconds. Nothing between the gates' launch and their release waits
 *        for the device.
 */
template <class Prepare, class Work>
std::vector<lane_times> time_together(std::vector<gpu_lane*> const& lanes, int volatile* gate, int warmup, int reps,
                                      Prepare&& prepare, Work&& work)
{
  std::vector<lane_times> out;
  for (int rep = 0; rep < warmup + reps; ++rep) {
    *gate = 0;
    for (gpu_lane* l : lanes) {
      DHISPARSE_CUDA_TRY(cudaSetDevice(l->device));
      prepare(*l);
      gate_kernel<<<1, 1, 0, l->stream>>>(l->release);
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      DHISPARSE_CUDA_TRY(cudaEventRecord(l->start, l->stream));
      work(*l);
      DHISPARSE_CUDA_TRY(cudaEventRecord(l->stop, l->stream));
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *gate = 1;
    lane_times t;
    for (gpu_lane* l : lanes) {
      DHISPARSE_CUDA_TRY(cudaSetDevice(l->device));
      DHISPARSE_CUDA_TRY(cudaEventSynchronize(l->stop));
      float ms = 0.f;
      DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&ms, l->start, l->stop));
      t.push_back(ms);
    }
    if (rep >= warmup) { out.push_back(t); }
  }
  return out;
}

/// Median over repetitions of lane `i`'s time (`i` < 0: of the longest lane), in ms.
inline double median_lane_ms(std::vector<lane_times> const& runs, int i)
{
  std::vector<double> v;
  for (lane_times const& t : runs) { v.push_back(i >= 0 ? t[std::size_t(i)] : *std::max_element(t.begin(), t.end())); }
  return median(v);
}

/// The `--gpus` benchmark; returns the process's exit code (1 when a gathered row differs).
inline int run_gpus(flags const& f)
{
  auto const& opt = f.opt;
  int devices     = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_retrieval --gpus: skipped: no CUDA device\n");
    return 0;
  }
  std::vector<int> counts;
  for (int n : gpu_counts(f.gpus)) {
    if (n >= 1 && n <= devices) {
      counts.push_back(n);
    } else {
      std::printf("%d GPUs: skipped (the machine has %d)\n", n, devices);
    }
  }
  if (counts.empty()) { return 0; }
  int const most                   = *std::max_element(counts.begin(), counts.end());
  std::size_t const pool_bytes     = f.store_gib > 0 ? std::size_t(f.store_gib * double(1ull << 30)) / 4096 * 4096
                                     : opt.quick     ? (std::size_t{256} << 20)
                                                     : (std::size_t{4} << 30);
  std::vector<int> const row_sizes = !f.rows.empty() ? f.rows : std::vector<int>{656, 2624};
  int const rows                   = opt.quick ? 36864 : 262144;
  int const max_row                = *std::max_element(row_sizes.begin(), row_sizes.end());
  host_memory const memory         = f.memories.front();

  int* gate = nullptr;  // one word every device polls
  DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&gate), sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  *gate = 0;
  std::vector<std::unique_ptr<gpu_lane>> lanes;
  bench::json_report report("retrieval_gpus");
  report.set("date", bench::today());
  report.set("memory", memory_name(memory));
  report.set("pool_bytes_per_gpu", double(pool_bytes));
  std::printf("bench_retrieval --gpus: %d device(s) present, %s host memory, %.2f GiB per GPU, %d rows per call\n",
              devices, memory_name(memory), double(pool_bytes) / (1 << 30), rows);
  for (int d = 0; d < most; ++d) {
    lanes.push_back(std::make_unique<gpu_lane>(d, memory, pool_bytes, std::size_t(rows) * std::size_t(max_row), rows, gate));
    gpu_lane& l = *lanes.back();
    l.solo_memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, l.stream);
    cudaDeviceProp prop{};
    DHISPARSE_CUDA_TRY(cudaGetDeviceProperties(&prop, d));
    std::printf("GPU %d: %s, PCI %02x:%02x, solo pinned memcpy %.1f GB/s; host pool NUMA: %s\n", d, prop.name,
                prop.pciBusID, prop.pciDeviceID, l.solo_memcpy_gbps, l.pool.numa().describe().c_str());
    std::string const key = "gpu" + std::to_string(d);
    report.set(key + "_name", std::string(prop.name));
    report.set(key + "_solo_memcpy_gbps", l.solo_memcpy_gbps);
    report.set(key + "_numa", l.pool.numa().describe());
  }

  std::printf("\n%5s %6s %8s %12s %12s %9s %s\n", "gpus", "row_B", "rows", "memcpy_GB/s", "gather_GB/s", "of_memcpy",
              "per GPU: gather GB/s / concurrent memcpy GB/s");
  bool all_exact = true;
  std::mt19937_64 rng(2026);
  for (int row_bytes : row_sizes) {
    if (row_bytes % 16 != 0 || std::size_t(rows) * 2 > pool_bytes / std::size_t(row_bytes)) {
      std::printf("%5s %6d: skipped (not a multiple of 16 bytes, or the pool is too small)\n", "", row_bytes);
      continue;
    }
    for (auto& l : lanes) { l->make_plan(rows, row_bytes, pool_bytes, rng); }
    std::size_t const bytes = std::size_t(rows) * std::size_t(row_bytes);
    for (int n : counts) {
      std::vector<gpu_lane*> set;
      for (int d = 0; d < n; ++d) { set.push_back(lanes[std::size_t(d)].get()); }
      auto const copies = time_together(
        set, gate, opt.warmup, opt.reps, [](gpu_lane&) {},
        [&](gpu_lane& l) {
          DHISPARSE_CUDA_TRY(cudaMemcpyAsync(l.slab, l.pool.host(), bytes, cudaMemcpyHostToDevice, l.stream));
        });
      auto const gathers = time_together(
        set, gate, opt.warmup, opt.reps,
        [&](gpu_lane& l) {
          DHISPARSE_CUDA_TRY(cudaMemcpyAsync(l.entries, l.pristine, sizeof(miss_entry) * std::size_t(rows),
                                             cudaMemcpyDeviceToDevice, l.stream));
        },
        [&](gpu_lane& l) { DHISPARSE_CUDA_TRY(retrieve_async(l.params(rows, row_bytes), 0, l.stream)); });
      double const copy_gbps   = double(n) * double(bytes) / (median_lane_ms(copies, -1) * 1e6);
      double const gather_gbps = double(n) * double(bytes) / (median_lane_ms(gathers, -1) * 1e6);
      std::printf("%5d %6d %8d %12.1f %12.1f %9.2f ", n, row_bytes, rows, copy_gbps, gather_gbps, gather_gbps / copy_gbps);
      report.add_record();
      report.field("gpus", double(n));
      report.field("row_bytes", double(row_bytes));
      report.field("rows", double(rows));
      report.field("memcpy_gbps", copy_gbps);
      report.field("gbps", gather_gbps);
      report.field("of_memcpy", gather_gbps / copy_gbps);
      for (int d = 0; d < n; ++d) {
        double const g = double(bytes) / (median_lane_ms(gathers, d) * 1e6);
        double const c = double(bytes) / (median_lane_ms(copies, d) * 1e6);
        std::printf(" %.1f/%.1f", g, c);
        std::string const key = "gpu" + std::to_string(d);
        report.field(key + "_gbps", g);
        report.field(key + "_memcpy_gbps", c);
        report.field(key + "_of_memcpy", g / c);
        report.field(key + "_of_solo_memcpy", g / set[std::size_t(d)]->solo_memcpy_gbps);
      }
      std::printf("\n");
      std::int64_t wrong = 0;  // the last gather of every GPU of the set, against its pool
      for (gpu_lane* l : set) {
        DHISPARSE_CUDA_TRY(cudaSetDevice(l->device));
        wrong += wrong_rows(l->params(rows, row_bytes).plan, l->slab, std::size_t(row_bytes), l->pool.host(),
                            l->pool.device(), l->stream, 65536);
      }
      report.field("wrong_rows", double(wrong));
      if (wrong != 0) { std::printf("  MISMATCH: %lld rows differ\n", static_cast<long long>(wrong)); }
      all_exact = all_exact && wrong == 0;
    }
  }
  std::printf("\ncheck of gathered rows against the pools: %s\n", all_exact ? "exact" : "MISMATCH");
  report.set("exact", all_exact ? 1.0 : 0.0);
  report.write(opt.json_path);
  lanes.clear();
  cudaFreeHost(gate);
  return all_exact ? 0 : 1;
}

}  // namespace dhisparse::bench::retrieval
