// bench/retrieval: the exact gather of missed rows (retrieve_async) host → GPU, against
// pinned cudaMemcpyAsync measured in the same run (BENCH.md "retrieval").
//
// For each row size (656, 1152, 2624 = one 4-layer group of 656-byte rows, 4096) and
// rows per call (4K, 36K, 262K): a miss plan of distinct random rows of a pinned pool,
// in random order and sorted by host address, gathered into a device slab. Plans rotate
// between repetitions. Reported: median time, GB/s of rows moved, and the ratio to the
// pinned memcpy bandwidth (1 GiB contiguous copy).
#include <dhisparse/retrieve.cuh>

#include <common/bench.cuh>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

using namespace dhisparse;

int main(int argc, char** argv)
{
  auto const opt = bench::options::parse(argc, argv);
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::size_t const pool_bytes = opt.quick ? (std::size_t{256} << 20) : (std::size_t{4} << 30);
  std::vector<std::size_t> const row_sizes = {656, 1152, 2624, 4096};
  std::vector<int> const row_counts = opt.quick ? std::vector<int>{4096, 36864}
                                                : std::vector<int>{4096, 36864, 262144};
  int const rotations = 3;

  double const memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, stream);
  std::printf("device: %s   date: %s\n", bench::device_name().c_str(), bench::today().c_str());
  std::printf("pinned host->device cudaMemcpyAsync (1 GiB): %.1f GB/s\n", memcpy_gbps);
  std::printf("pinned pool: %.1f GiB\n\n", double(pool_bytes) / (1 << 30));

  std::byte* pool = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&pool), pool_bytes,
                                   cudaHostAllocMapped | cudaHostAllocPortable));
  for (std::size_t i = 0; i < pool_bytes; i += 4096) { pool[i] = std::byte(i >> 12); }
  std::byte* pool_dev = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pool_dev), pool, 0));

  int const max_rows = *std::max_element(row_counts.begin(), row_counts.end());
  std::byte* slab    = nullptr;
  std::size_t const slab_bytes = std::size_t(max_rows) * row_sizes.back();
  DHISPARSE_CUDA_TRY(cudaMalloc(&slab, slab_bytes));
  miss_entry* entries = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&entries, sizeof(miss_entry) * max_rows * rotations));
  std::int32_t* counts = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&counts, sizeof(std::int32_t) * rotations));

  bench::json_report report("retrieval");
  report.set("device", bench::device_name());
  report.set("date", bench::today());
  report.set("memcpy_h2d_gbps", memcpy_gbps);
  report.set("pool_bytes", double(pool_bytes));

  std::printf("%8s %8s %9s %10s %9s %8s\n", "row_B", "rows", "order", "median_ms", "GB/s", "vs_memcpy");
  std::mt19937_64 rng(12345);
  for (std::size_t row_bytes : row_sizes) {
    std::size_t const pool_rows = pool_bytes / row_bytes;
    for (int rows : row_counts) {
      for (bool sorted : {false, true}) {
        // `rotations` plans of distinct random rows; slots are a permutation.
        std::vector<miss_entry> host_entries(std::size_t(rows) * rotations);
        for (int r = 0; r < rotations; ++r) {
          std::vector<std::size_t> picks;
          std::vector<char> used(pool_rows, 0);
          while (int(picks.size()) < rows) {
            std::size_t const p = rng() % pool_rows;
            if (!used[p]) {
              used[p] = 1;
              picks.push_back(p);
            }
          }
          if (sorted) { std::sort(picks.begin(), picks.end()); }
          std::vector<std::int32_t> slots(rows);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng);
          for (int i = 0; i < rows; ++i) {
            host_entries[std::size_t(r) * rows + i] =
              miss_entry{pool_dev + picks[i] * row_bytes, slots[i], std::int32_t(i)};
          }
        }
        DHISPARSE_CUDA_TRY(cudaMemcpy(entries, host_entries.data(),
                                      sizeof(miss_entry) * host_entries.size(), cudaMemcpyHostToDevice));
        std::vector<std::int32_t> host_counts(rotations, rows);
        DHISPARSE_CUDA_TRY(cudaMemcpy(counts, host_counts.data(), sizeof(std::int32_t) * rotations,
                                      cudaMemcpyHostToDevice));
        auto const ms = bench::time_ms(stream, opt.warmup, opt.reps, [&](int rep) {
          int const r = rep % rotations;
          retrieve_params p{};
          p.plan            = {entries + std::size_t(r) * rows, counts + r, rows};
          p.slab            = slab;
          p.group_row_bytes = row_bytes;
          p.byte_begin      = 0;
          p.byte_end        = row_bytes;
          DHISPARSE_CUDA_TRY(retrieve_async(p, 0, stream));
        });
        double const med  = bench::median(ms);
        double const gbps = double(rows) * row_bytes / (med * 1e6);
        char const* order = sorted ? "sorted" : "random";
        std::printf("%8zu %8d %9s %10.4f %9.1f %8.2f\n", row_bytes, rows, order, med, gbps, gbps / memcpy_gbps);
        report.add_record();
        report.field("row_bytes", double(row_bytes));
        report.field("rows", double(rows));
        report.field("order", order);
        report.field("median_ms", med);
        report.field("gbps", gbps);
        report.field("fraction_of_memcpy", gbps / memcpy_gbps);
      }
    }
  }
  // Correctness spot check of the last configuration: gather rotation 0 once more and
  // compare every gathered row with its source in the pool.
  {
    int const rows = row_counts.back();
    std::size_t const row_bytes = row_sizes.back();
    retrieve_params p{};
    p.plan            = {entries, counts, rows};
    p.slab            = slab;
    p.group_row_bytes = row_bytes;
    p.byte_begin      = 0;
    p.byte_end        = row_bytes;
    DHISPARSE_CUDA_TRY(retrieve_async(p, 0, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    std::vector<miss_entry> plan(rows);
    DHISPARSE_CUDA_TRY(cudaMemcpy(plan.data(), entries, sizeof(miss_entry) * rows, cudaMemcpyDeviceToHost));
    std::vector<std::byte> got(std::size_t(rows) * row_bytes);
    DHISPARSE_CUDA_TRY(cudaMemcpy(got.data(), slab, got.size(), cudaMemcpyDeviceToHost));
    bool same = true;
    for (auto const& e : plan) {
      std::byte const* want = pool + (e.src - pool_dev);
      same = same && std::equal(want, want + row_bytes, got.data() + std::size_t(e.slot) * row_bytes);
    }
    std::printf("\ncheck of every gathered row of the last plan: %s\n", same ? "exact" : "MISMATCH");
    if (!same) { return 1; }
  }
  report.write(opt.json_path);
  cudaFree(counts);
  cudaFree(entries);
  cudaFree(slab);
  cudaFreeHost(pool);
  cudaStreamDestroy(stream);
  return 0;
}
