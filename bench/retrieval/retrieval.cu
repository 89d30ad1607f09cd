// bench/retrieval: the exact gather of missed rows (retrieve_async) host → GPU on synthetic
// plans, against pinned cudaMemcpyAsync measured in the same run (BENCH.md "retrieval").
// bench_retrieval_realistic runs the same gather on plans from the real resolve.
//
// For each host memory kind (--memory pinned|huge|both; pinned = cudaHostAlloc, huge =
// mmap + MADV_HUGEPAGE + cudaHostRegister; NUMA-local where the machine has several nodes),
// row size (656, 1152, 2624 = one 4-layer group of 656-byte rows, 4096) and rows per call
// (4K, 36K, 262K): miss plans of distinct random rows of the pool, gathered into a device
// slab in five ways:
//   random               plan in random order, default lanes per row (16 for 656 B)
//   random_warp_per_row  the same with one warp per row (the kernel before issue 15)
//   sorted               plan sorted by host address on the host, default lanes
//   sorted_warp_per_row  the same with one warp per row
//   ordered_on_device    the random plan ordered by order_plan_async, then gathered
//                        (the time includes the ordering)
//   sorted_dma_batch     not the library: the sorted plan's rows copied by the copy engines,
//                        one cudaMemcpyBatchAsync of one copy per row from host arrays of
//                        pointers (the time includes the call's enqueueing) — the question
//                        is whether DMA reaches what an SM gather of host memory does not
// Plans rotate between repetitions and L2 is flushed before each timed call. Reported:
// median time, GB/s of rows moved, the ratio to pinned memcpy (1 GiB contiguous copy).
//
// `--gpus N` (or a list of counts) runs instead several GPUs of the host pulling rows at
// once, against concurrent cudaMemcpyAsync on the same GPUs (gpus.cuh).
#include <dhisparse/retrieve.cuh>

#include <retrieval/common.cuh>
#include <retrieval/gpus.cuh>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace dhisparse;
namespace rb = dhisparse::bench::retrieval;

namespace {

struct variant {
  char const* name;
  bool sorted;         ///< plan sorted by address on the host
  int lanes;           ///< retrieve_params::lanes_per_row
  bool device_order;   ///< order_plan_async before the gather (timed)
  bool dma = false;    ///< cudaMemcpyBatchAsync of the plan's rows instead of retrieve_async
};

}  // namespace

int main(int argc, char** argv)
{
  auto const f   = rb::flags::parse(argc, argv);
  if (!f.gpus.empty()) { return rb::run_gpus(f); }
  auto const& opt = f.opt;
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::size_t const pool_bytes = f.store_gib > 0 ? std::size_t(f.store_gib * double(1ull << 30)) / 4096 * 4096
                                 : opt.quick     ? (std::size_t{256} << 20)
                                                 : (std::size_t{4} << 30);
  std::vector<int> const row_sizes = !f.rows.empty() ? f.rows : std::vector<int>{656, 1152, 2624, 4096};
  std::vector<int> const row_counts = opt.quick ? std::vector<int>{4096, 36864} : std::vector<int>{4096, 36864, 262144};
  std::vector<variant> const variants = {{"random", false, 0, false},
                                         {"random_warp_per_row", false, 32, false},
                                         {"sorted", true, 0, false},
                                         {"sorted_warp_per_row", true, 32, false},
                                         {"ordered_on_device", false, 0, true},
                                         {"sorted_dma_batch", true, 0, false, true}};
  int const rotations = 3;

  double const memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, stream);
  std::printf("device: %s   date: %s\n", bench::device_name().c_str(), bench::today().c_str());
  std::printf("pinned host->device cudaMemcpyAsync (1 GiB): %.1f GB/s\n", memcpy_gbps);
  std::printf("pool: %.2f GiB; plans rotate (%d), L2 flushed before each timed call\n",
              double(pool_bytes) / (1 << 30), rotations);

  int const max_rows = *std::max_element(row_counts.begin(), row_counts.end());
  int const max_row  = *std::max_element(row_sizes.begin(), row_sizes.end());
  std::byte* slab    = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&slab, std::size_t(max_rows) * std::size_t(max_row)));
  std::size_t const plan_entries = std::size_t(max_rows) * rotations;
  miss_entry *entries = nullptr, *pristine = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&entries, sizeof(miss_entry) * plan_entries));
  DHISPARSE_CUDA_TRY(cudaMalloc(&pristine, sizeof(miss_entry) * plan_entries));
  std::int32_t* counts = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&counts, sizeof(std::int32_t) * rotations));
  std::size_t const ws_bytes = order_plan_workspace_size(pool_bytes, max_rows);
  void* ws                   = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&ws, ws_bytes));
  DHISPARSE_CUDA_TRY(cudaMemset(ws, 0, ws_bytes));
  rb::l2_flush flush;

  bench::json_report report("retrieval");
  report.set("device", bench::device_name());
  report.set("date", bench::today());
  report.set("memcpy_h2d_gbps", memcpy_gbps);
  report.set("pool_bytes", double(pool_bytes));

  bool all_exact = true;
  std::mt19937_64 rng(12345);
  for (host_memory memory : f.memories) {
    auto const mem = rb::host_memory_of(memory, pool_bytes);
    rb::fill(mem.device(), pool_bytes, stream);
    std::printf("\npool memory: %s (%s); NUMA: %s\n", rb::memory_name(memory), rb::memory_how(memory),
                mem.numa().describe().c_str());
    std::printf("%8s %8s %-20s %10s %9s %8s\n", "row_B", "rows", "order", "median_us", "GB/s", "of_memcpy");
    for (int row_bytes : row_sizes) {
      if (row_bytes % 16 != 0) {
        std::printf("%8d: skipped (rows are multiples of 16 bytes)\n", row_bytes);
        continue;
      }
      std::size_t const pool_rows = pool_bytes / std::size_t(row_bytes);
      for (int rows : row_counts) {
        if (std::size_t(rows) > pool_rows / 2) { continue; }
        // `rotations` plans of distinct random rows; slots are a permutation.
        std::vector<miss_entry> random_plans, sorted_plans;
        for (int r = 0; r < rotations; ++r) {
          auto const plan = rb::random_plan(mem.device(), pool_rows, rows, row_bytes, rng);
          random_plans.insert(random_plans.end(), plan.begin(), plan.end());
        }
        sorted_plans = random_plans;
        for (int r = 0; r < rotations; ++r) {
          rb::sort_by_address(sorted_plans.begin() + std::ptrdiff_t(r) * rows,
                              sorted_plans.begin() + std::ptrdiff_t(r + 1) * rows);
        }
        std::vector<std::int32_t> const host_counts(rotations, rows);
        DHISPARSE_CUDA_TRY(cudaMemcpy(counts, host_counts.data(), sizeof(std::int32_t) * rotations, cudaMemcpyHostToDevice));
        // The DMA variant's host arrays: one copy per row of each rotation's sorted plan.
        std::vector<void*> dma_dst(sorted_plans.size());
        std::vector<void const*> dma_src(sorted_plans.size());
        std::vector<std::size_t> const dma_sizes(static_cast<std::size_t>(rows), static_cast<std::size_t>(row_bytes));
        for (std::size_t i = 0; i < sorted_plans.size(); ++i) {
          dma_dst[i] = slab + std::size_t(sorted_plans[i].slot) * std::size_t(row_bytes);
          dma_src[i] = mem.host() + (sorted_plans[i].src - mem.device());
        }
        for (variant const& v : variants) {
          auto const& plans = v.sorted ? sorted_plans : random_plans;
          DHISPARSE_CUDA_TRY(cudaMemcpy(pristine, plans.data(), sizeof(miss_entry) * plans.size(), cudaMemcpyHostToDevice));
          auto params = [&](int r) {
            retrieve_params p{};
            p.plan            = {entries + std::size_t(r) * rows, counts + r, rows};
            p.slab            = slab;
            p.group_row_bytes = std::size_t(row_bytes);
            p.byte_begin      = 0;
            p.byte_end        = std::size_t(row_bytes);
            p.lanes_per_row   = v.lanes;
            return p;
          };
          cudaError_t dma_status = cudaSuccess;  // a refused batch skips the variant, not the run
          auto const ms = rb::time_prepared_ms(
            stream, opt.warmup, opt.reps,
            [&](int rep) {
              int const r = rep % rotations;
              DHISPARSE_CUDA_TRY(cudaMemcpyAsync(entries + std::size_t(r) * rows, pristine + std::size_t(r) * rows,
                                                 sizeof(miss_entry) * std::size_t(rows), cudaMemcpyDeviceToDevice, stream));
              flush(stream);
            },
            [&](int rep) {
              retrieve_params const p = params(rep % rotations);
              if (v.dma) {
                std::size_t const at = std::size_t(rep % rotations) * std::size_t(rows);
                cudaMemcpyAttributes attrs{};
                attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
                std::size_t attrs_at = 0;
                dma_status = cudaMemcpyBatchAsync(dma_dst.data() + at, dma_src.data() + at, dma_sizes.data(),
                                                  std::size_t(rows), &attrs, &attrs_at, 1, stream);
              } else if (v.device_order) {
                plan_order_params const o{p.plan, mem.device(), pool_bytes, 0};
                DHISPARSE_CUDA_TRY(retrieve_async(p, o, ws, ws_bytes, 0, stream));
              } else {
                DHISPARSE_CUDA_TRY(retrieve_async(p, 0, stream));
              }
            });
          if (dma_status != cudaSuccess) {
            std::printf("%8d %8d %-20s refused: %s\n", row_bytes, rows, v.name, cudaGetErrorString(dma_status));
            continue;
          }
          double const us   = rb::median_us(ms);
          double const gbps = double(rows) * row_bytes / (us * 1e3);
          std::printf("%8d %8d %-20s %10.1f %9.1f %8.2f\n", row_bytes, rows, v.name, us, gbps, gbps / memcpy_gbps);
          report.add_record();
          report.field("memory", rb::memory_name(memory));
          report.field("row_bytes", double(row_bytes));
          report.field("rows", double(rows));
          report.field("order", v.name);
          report.field("lanes_per_row", double(v.lanes));
          report.field("median_us", us);
          report.field("gbps", gbps);
          report.field("of_memcpy", gbps / memcpy_gbps);
          // Gathered rows of the last call (all, or 64 Ki spread over the plan; the plan is
          // ordered now when the variant orders) against the pool.
          if (rows == row_counts.back() || v.device_order) {
            retrieve_params const p = params((opt.warmup + opt.reps - 1) % rotations);
            std::int64_t const wrong =
              rb::wrong_rows(p.plan, slab, std::size_t(row_bytes), mem.host(), mem.device(), stream, 65536);
            all_exact = all_exact && wrong == 0;
            report.field("wrong_rows", double(wrong));
            if (wrong != 0) { std::printf("  MISMATCH: %lld rows differ\n", static_cast<long long>(wrong)); }
          }
        }
      }
    }
  }
  std::printf("\ncheck of gathered rows against the pool: %s\n", all_exact ? "exact" : "MISMATCH");
  report.set("exact", all_exact ? 1.0 : 0.0);
  report.write(opt.json_path);
  cudaFree(ws);
  cudaFree(counts);
  cudaFree(pristine);
  cudaFree(entries);
  cudaFree(slab);
  cudaStreamDestroy(stream);
  return all_exact ? 0 : 1;
}
