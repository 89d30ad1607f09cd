// bench/retrieval (overlap): how much of the missed-row retrieval hides behind attention,
// and what backup (device → host) traffic does to it (issue 15 item 3, BENCH.md
// "retrieval": ≥ 0.95 of solo bandwidth with backup running; ≥ 70% hidden).
//
// Group loop: G = 8 layer groups of B = 128 requests, K = 2048, the real sparse MLA
// attention (FP8-656 rows, h_q = 64, Q = 1) over each layer of the group, and the
// retrieval of each group's miss plan (rows of a pinned host pool, in address order as
// order_plan_async leaves them; 1% or 14% of B × K rows; groups of 1 layer (656-B rows)
// and of 4 layers (2624-B group rows)). Slabs are double-buffered by group parity.
//   attention   G × layers attention calls alone
//   retrieval   G retrievals alone (on the retrieval stream)
//   serial      one stream: retrieve(g), then attention of g, for every g
//   overlapped  retrieve(g + 1) on a second stream while attention of g runs (events:
//               attention of g waits for retrieve(g); retrieve(g + 1) waits for attention
//               of g − 1, the last reader of its slab); retrieve(0) cannot overlap
// hidden = (serial − overlapped) / retrieval; the prologue bounds it by (G − 1) / G.
// Variants: the retrieval grid (default 6 blocks per SM, 1 per SM, 16 blocks) and the
// retrieval stream's priority (normal, highest): attention fills every SM, and the gather
// only gets SMs as attention blocks retire unless it holds a few of its own.
//
// Backup beside retrieval: the retrieval's GB/s alone, beside a 2 GiB device → host
// cudaMemcpyAsync (copy engine, full duplex), beside a backup-like kernel that floods the
// link (2 blocks per SM, warp per 656-B row, zero-copy stores into mapped host memory, no
// fence), and beside a paced backup: the library's copy (warp per row, each row fenced
// system-wide before the next, as `backup_async` copies) on grids of 1, 2, 4, … blocks up
// to 2 per SM (`hierarchy_config::backup_blocks`), running exactly while the retrieval
// runs (the retrieval stream raises a stop flag after its last gather). A decode step
// commits B × groups rows (5 MB at B = 128, 61 groups of 656 B): the smallest grid whose
// backup GB/s keeps up with that over a step is the one to choose.
#include <dhisparse/detail/warp_copy.cuh>
#include <dhisparse/retrieve.cuh>
#include <dhisparse/sparse_attention.cuh>

#include <retrieval/common.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace dhisparse;
namespace rb = dhisparse::bench::retrieval;
namespace sa = dhisparse::sparse_attention;
using fp8_row = row_format::mla_fp8_656;

namespace {

constexpr int B       = 128;
constexpr int K       = 2048;
constexpr int heads   = 64;
constexpr int groups  = 8;
constexpr int hot     = 4096;  ///< slots per request in a slab
constexpr std::int64_t slots = std::int64_t(B) * hot;

/// A backup-like kernel: warp per row, device rows → mapped host rows (detail::warp_copy).
template <int Dummy = 0>
__global__ void backup_like_kernel(std::byte const* rows, std::byte* host, std::int64_t n, int row_bytes,
                                   std::int64_t host_rows)
{
  int const lane = threadIdx.x & 31;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x / 32) {
    std::int64_t const to = (i * 7919) % host_rows;  // spread over the host buffer
    dhisparse::detail::warp_copy(reinterpret_cast<int4*>(host + to * row_bytes),
                                 reinterpret_cast<int4 const*>(rows + (i % (1 << 16)) * row_bytes), row_bytes / 16,
                                 lane);
  }
}

/// The paced backup: warp per row as `backup_async` copies (16-byte stores into mapped
/// host memory, fenced system-wide before the next row), until `*stop` is raised (or
/// `max_rows` rows, a bound for safety); adds the rows it copied to `*copied`.
template <int Dummy = 0>
__global__ void paced_backup_kernel(std::byte const* rows, std::byte* host, std::int64_t src_rows, int row_bytes,
                                    std::int64_t host_rows, int const volatile* stop, std::int64_t max_rows,
                                    unsigned long long* copied)
{
  int const lane        = threadIdx.x & 31;
  std::int64_t const w  = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  std::int64_t const ws = std::int64_t(gridDim.x) * blockDim.x / 32;
  unsigned long long done = 0;
  for (std::int64_t i = w; i < max_rows; i += ws) {
    if (__shfl_sync(0xffffffffu, lane == 0 ? *stop : 0, 0) != 0) { break; }
    std::int64_t const to = (i * 7919) % host_rows;
    dhisparse::detail::warp_copy(reinterpret_cast<int4*>(host + to * row_bytes),
                                 reinterpret_cast<int4 const*>(rows + (i % src_rows) * row_bytes), row_bytes / 16, lane);
    __threadfence_system();
    __syncwarp();
    ++done;
  }
  if (lane == 0 && done > 0) { atomicAdd(copied, done); }
}

template <int Dummy = 0>
__global__ void raise_stop_kernel(int* stop)
{
  *reinterpret_cast<int volatile*>(stop) = 1;
  __threadfence_system();
}

struct shape {
  int layers;
  double miss;
};

struct variant {
  char const* name;
  int blocks;     ///< retrieval grid (0: default)
  bool priority;  ///< retrieval stream at the highest priority
};

}  // namespace

int main(int argc, char** argv)
{
  auto const f    = rb::flags::parse(argc, argv);
  auto const& opt = f.opt;
  int sms         = dhisparse::detail::multiprocessor_count();
  int lowest = 0, highest = 0;
  DHISPARSE_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  cudaStream_t attn, retr, retr_high, side;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithPriority(&attn, cudaStreamNonBlocking, lowest));
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithPriority(&retr, cudaStreamNonBlocking, lowest));
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithPriority(&retr_high, cudaStreamNonBlocking, highest));
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, lowest));

  double const memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, attn);
  std::printf("device: %s   date: %s   SMs: %d\n", bench::device_name().c_str(), bench::today().c_str(), sms);
  std::printf("pinned host->device cudaMemcpyAsync (1 GiB): %.1f GB/s\n", memcpy_gbps);

  std::size_t const pool_bytes = opt.quick ? (std::size_t{1} << 30) : (std::size_t{4} << 30);
  host_memory const memory     = f.memories.front();
  auto const pool              = rb::host_memory_of(memory, pool_bytes);
  // Rows of small finite FP8 values and scales: attention takes its usual path.
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(pool.device(), 0x11, pool_bytes, attn));
  std::printf("host pool: %.1f GiB %s; NUMA: %s\n", double(pool_bytes) / (1 << 30), rb::memory_name(memory),
              pool.numa().describe().c_str());

  // Device side: two slabs (group parity), two slot tables, queries, outputs.
  std::size_t const max_group_bytes = 4 * fp8_row::bytes;
  std::byte* slab[2];
  std::int32_t* table[2];
  for (int i = 0; i < 2; ++i) {
    DHISPARSE_CUDA_TRY(cudaMalloc(&slab[i], std::size_t(slots) * max_group_bytes));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(slab[i], 0x11, std::size_t(slots) * max_group_bytes, attn));
    DHISPARSE_CUDA_TRY(cudaMalloc(&table[i], std::size_t(B) * K * 4));
  }
  std::mt19937_64 rng(20261203);
  for (int i = 0; i < 2; ++i) {
    std::vector<std::int32_t> t(std::size_t(B) * K);
    for (int b = 0; b < B; ++b) {  // K distinct slots of request b's share of the slab
      std::vector<std::int32_t> own(hot);
      std::iota(own.begin(), own.end(), b * hot);
      std::shuffle(own.begin(), own.end(), rng);
      std::copy(own.begin(), own.begin() + K, t.begin() + std::ptrdiff_t(b) * K);
    }
    DHISPARSE_CUDA_TRY(cudaMemcpy(table[i], t.data(), t.size() * 4, cudaMemcpyHostToDevice));
  }
  bf16 *queries = nullptr, *out = nullptr;
  float* lse = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&queries, std::size_t(B) * heads * 576 * 2));
  DHISPARSE_CUDA_TRY(cudaMalloc(&out, std::size_t(B) * heads * 512 * 2));
  DHISPARSE_CUDA_TRY(cudaMalloc(&lse, std::size_t(B) * heads * 4));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(queries, 0x3C, std::size_t(B) * heads * 576 * 2, attn));
  sa::params ap;
  ap.batch       = B;
  ap.num_queries = 1;
  ap.num_heads   = heads;
  ap.top_k       = K;
  sa::set_contiguous_strides<fp8_row>(ap);
  ap.queries       = queries;
  ap.num_slots     = slots;
  ap.out           = out;
  ap.lse           = lse;
  ap.softmax_scale = 1.f / std::sqrt(576.f);
  std::size_t const attn_ws_bytes = sa::workspace_size<fp8_row>(ap);
  void* attn_ws = nullptr;
  if (attn_ws_bytes > 0) { DHISPARSE_CUDA_TRY(cudaMalloc(&attn_ws, attn_ws_bytes)); }

  // Backup traffic: a 2 GiB pinned buffer (D2H destination) and a device source.
  std::size_t const d2h_bytes = opt.quick ? (std::size_t{512} << 20) : (std::size_t{2} << 30);
  void* d2h_host = nullptr;
  void* d2h_dev  = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostAlloc(&d2h_host, d2h_bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  DHISPARSE_CUDA_TRY(cudaMalloc(&d2h_dev, d2h_bytes));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(d2h_dev, 0x22, d2h_bytes, attn));
  std::byte* d2h_host_dev = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d2h_host_dev), d2h_host, 0));
  int* stop_flag                  = nullptr;  // the paced backup's stop flag and row count
  unsigned long long* copied_rows = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&stop_flag, sizeof(int)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&copied_rows, sizeof(unsigned long long)));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(attn));

  std::vector<cudaEvent_t> ev(4 * groups + 8);
  for (auto& e : ev) { DHISPARSE_CUDA_TRY(cudaEventCreate(&e)); }
  auto elapsed = [](cudaEvent_t a, cudaEvent_t b) {  // b may be on a stream the caller did not wait for
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(b));
    float t = 0;
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, a, b));
    return double(t);
  };

  bench::json_report report("retrieval_overlap");
  report.set("device", bench::device_name());
  report.set("date", bench::today());
  report.set("memcpy_h2d_gbps", memcpy_gbps);
  report.set("memory", rb::memory_name(memory));
  report.set("numa", pool.numa().describe());
  report.set("batch", double(B));
  report.set("top_k", double(K));
  report.set("heads", double(heads));
  report.set("groups", double(groups));

  std::vector<shape> const shapes = {{1, 0.01}, {1, 0.14}, {4, 0.01}, {4, 0.14}};
  std::vector<variant> const variants = {{"default_grid", 0, false},
                                         {"default_grid_high_priority", 0, true},
                                         {"1_block_per_sm", sms, false},
                                         {"1_block_per_sm_high_priority", sms, true},
                                         {"16_blocks_high_priority", 16, true}};
  int const reps = opt.quick ? 4 : std::max(10, std::min(opt.reps, 12));
  for (shape const& sh : shapes) {
    std::size_t const group_bytes = std::size_t(sh.layers) * fp8_row::bytes;
    int const rows                = int(std::lround(sh.miss * B * K));
    std::size_t const pool_rows   = pool_bytes / group_bytes;
    // One plan per group, rows in address order, distinct slots.
    miss_entry* plans = nullptr;
    std::int32_t* counts = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&plans, sizeof(miss_entry) * std::size_t(rows) * groups));
    DHISPARSE_CUDA_TRY(cudaMalloc(&counts, sizeof(std::int32_t) * groups));
    {
      std::vector<miss_entry> host(std::size_t(rows) * groups);
      std::vector<std::int32_t> slot_ids(static_cast<std::size_t>(slots));
      std::iota(slot_ids.begin(), slot_ids.end(), 0);
      for (int g = 0; g < groups; ++g) {
        std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
        std::vector<std::size_t> picks(static_cast<std::size_t>(rows));
        for (auto& p : picks) { p = rng() % pool_rows; }
        std::sort(picks.begin(), picks.end());
        picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
        while (picks.size() < std::size_t(rows)) { picks.push_back(picks.back()); }  // (rare) duplicates
        for (int i = 0; i < rows; ++i) {
          host[std::size_t(g) * rows + i] =
            miss_entry{pool.device() + picks[std::size_t(i)] * group_bytes, slot_ids[std::size_t(i)], i};
        }
      }
      DHISPARSE_CUDA_TRY(cudaMemcpy(plans, host.data(), host.size() * sizeof(miss_entry), cudaMemcpyHostToDevice));
      std::vector<std::int32_t> const c(groups, rows);
      DHISPARSE_CUDA_TRY(cudaMemcpy(counts, c.data(), c.size() * 4, cudaMemcpyHostToDevice));
    }
    auto retrieve = [&](int g, int blocks, cudaStream_t s) {
      retrieve_params p{};
      p.plan            = {plans + std::size_t(g) * rows, counts + g, rows};
      p.slab            = slab[g % 2];
      p.group_row_bytes = group_bytes;
      p.byte_begin      = 0;
      p.byte_end        = group_bytes;
      DHISPARSE_CUDA_TRY(retrieve_async(p, blocks, s));
    };
    auto attention = [&](int g, cudaStream_t s) {
      for (int l = 0; l < sh.layers; ++l) {
        sa::params p   = ap;
        p.rows         = slab[g % 2] + std::size_t(l) * fp8_row::bytes;
        p.row_stride   = group_bytes;
        p.slots        = table[g % 2];
        DHISPARSE_CUDA_TRY((sa::run<fp8_row>(p, attn_ws, attn_ws_bytes, s)));
      }
    };
    // Median over `reps` of a timed loop between events ev[0] (on `first`) and ev[1].
    auto timed = [&](cudaStream_t first, std::function<void()> const& loop) {
      std::vector<double> ms;
      for (int r = 0; r < opt.warmup + reps; ++r) {
        DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
        DHISPARSE_CUDA_TRY(cudaEventRecord(ev[0], first));
        loop();
        DHISPARSE_CUDA_TRY(cudaEventRecord(ev[1], first));
        DHISPARSE_CUDA_TRY(cudaEventSynchronize(ev[1]));
        if (r >= opt.warmup) { ms.push_back(elapsed(ev[0], ev[1])); }
      }
      return bench::median(ms);
    };
    double const bytes_per_loop = double(rows) * double(group_bytes) * groups;
    auto new_record = [&](char const* measure) {  // a record with the shape's fields
      report.add_record();
      report.field("measure", measure);
      report.field("layers", double(sh.layers));
      report.field("row_bytes", double(group_bytes));
      report.field("miss_rate", sh.miss);
      report.field("rows", double(rows));
    };
    double const t_attn = timed(attn, [&] {
      for (int g = 0; g < groups; ++g) { attention(g, attn); }
    });
    double const t_serial = timed(attn, [&] {
      for (int g = 0; g < groups; ++g) {
        retrieve(g, 0, attn);
        attention(g, attn);
      }
    });
    std::printf("\ngroups of %d layer%s (%zu-B group rows), %.0f%% misses: %d rows = %.1f MB per group; "
                "attention %.1f us per group\n",
                sh.layers, sh.layers > 1 ? "s" : "", group_bytes, 100 * sh.miss, rows, rows * double(group_bytes) / 1e6,
                1e3 * t_attn / groups);
    std::printf("  %-30s %10s %10s %10s %8s %9s %8s\n", "retrieval", "retr_ms", "serial_ms", "overlap_ms", "hidden",
                "hid_steady", "GB/s");
    for (variant const& v : variants) {
      cudaStream_t const rs = v.priority ? retr_high : retr;
      double const t_retr = timed(rs, [&] {
        for (int g = 0; g < groups; ++g) { retrieve(g, v.blocks, rs); }
      });
      double const t_over = timed(attn, [&] {
        // ev[2 + g]: retrieve(g) done; ev[2 + groups + g]: attention of g done.
        DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(rs, ev[0], 0));
        retrieve(0, v.blocks, rs);
        DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2], rs));
        for (int g = 0; g < groups; ++g) {
          DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(attn, ev[2 + g], 0));
          attention(g, attn);
          DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2 + groups + g], attn));
          if (g + 1 < groups) {
            if (g >= 1) { DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(rs, ev[2 + groups + g - 1], 0)); }
            retrieve(g + 1, v.blocks, rs);
            DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2 + g + 1], rs));
          }
        }
      });
      double const serial = std::string(v.name) == "default_grid" ? t_serial : t_attn + t_retr;
      double const hidden = std::clamp((serial - t_over) / t_retr, 0.0, 1.0);
      double const steady = std::clamp((serial - t_over) / (t_retr * (groups - 1) / groups), 0.0, 1.0);
      double const gbps   = bytes_per_loop / (t_retr * 1e6);
      std::printf("  %-30s %10.3f %10.3f %10.3f %7.0f%% %8.0f%% %8.1f\n", v.name, t_retr, serial, t_over, 100 * hidden,
                  100 * steady, gbps);
      new_record("overlap_attention");
      report.field("variant", v.name);
      report.field("retrieval_ms", t_retr);
      report.field("attention_ms", t_attn);
      report.field("serial_ms", serial);
      report.field("overlapped_ms", t_over);
      report.field("hidden_fraction", hidden);
      report.field("hidden_fraction_overlappable", steady);
      report.field("gbps", gbps);
      report.field("of_memcpy", gbps / memcpy_gbps);
    }

    // Retrieval beside backup traffic (default grid, retrieval stream).
    double const solo = timed(retr, [&] {
      for (int g = 0; g < groups; ++g) { retrieve(g, 0, retr); }
    });
    double d2h_ms = 0;
    double const with_copy = timed(retr, [&] {
      DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2], side));
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d2h_host, d2h_dev, d2h_bytes, cudaMemcpyDeviceToHost, side));
      DHISPARSE_CUDA_TRY(cudaEventRecord(ev[3], side));
      for (int g = 0; g < groups; ++g) { retrieve(g, 0, retr); }
    });
    d2h_ms = elapsed(ev[2], ev[3]);
    std::int64_t const backup_rows = std::int64_t(d2h_bytes / fp8_row::bytes);
    double backup_ms = 0;
    double const with_kernel = timed(retr, [&] {
      DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2], side));
      backup_like_kernel<<<2 * sms, 256, 0, side>>>(static_cast<std::byte const*>(d2h_dev), d2h_host_dev, backup_rows,
                                                    int(fp8_row::bytes), backup_rows);
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      DHISPARSE_CUDA_TRY(cudaEventRecord(ev[3], side));
      for (int g = 0; g < groups; ++g) { retrieve(g, 0, retr); }
    });
    backup_ms = elapsed(ev[2], ev[3]);
    double const solo_gbps = bytes_per_loop / (solo * 1e6);
    std::printf("  beside backup: retrieval alone %.1f GB/s; beside a %.1f GB D2H memcpy %.1f GB/s (%.2f of alone; "
                "the copy took %.1f ms, retrieval %.1f ms); beside a backup-like kernel %.1f GB/s (%.2f; it took %.1f ms)\n",
                solo_gbps, d2h_bytes / 1e9, bytes_per_loop / (with_copy * 1e6), solo / with_copy, d2h_ms, with_copy,
                bytes_per_loop / (with_kernel * 1e6), solo / with_kernel, backup_ms);
    new_record("beside_backup");
    report.field("solo_gbps", solo_gbps);
    report.field("with_d2h_memcpy_gbps", bytes_per_loop / (with_copy * 1e6));
    report.field("with_d2h_memcpy_of_solo", solo / with_copy);
    report.field("d2h_memcpy_ms", d2h_ms);
    report.field("d2h_covers_retrieval", d2h_ms >= with_copy ? 1.0 : 0.0);
    report.field("with_backup_kernel_gbps", bytes_per_loop / (with_kernel * 1e6));
    report.field("with_backup_kernel_of_solo", solo / with_kernel);
    report.field("backup_kernel_ms", backup_ms);
    report.field("backup_covers_retrieval", backup_ms >= with_kernel ? 1.0 : 0.0);

    // Paced backup: the same retrievals beside the library's copy on grids of growing size.
    std::printf("  beside a paced backup (warp per fenced row, runs while retrieval runs):\n");
    std::printf("    %-14s %12s %10s %14s\n", "backup_blocks", "retr_GB/s", "of_solo", "backup_GB/s");
    std::vector<int> paces = {1, 2, 4, 8, 16, 32, sms, 2 * sms};
    for (int const blocks : paces) {
      double backup_span = 0;
      unsigned long long copied = 0;
      double const with_paced = timed(retr, [&] {
        DHISPARSE_CUDA_TRY(cudaMemsetAsync(stop_flag, 0, sizeof(int), side));
        DHISPARSE_CUDA_TRY(cudaMemsetAsync(copied_rows, 0, sizeof(unsigned long long), side));
        DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2], side));
        paced_backup_kernel<<<blocks, 256, 0, side>>>(static_cast<std::byte const*>(d2h_dev), d2h_host_dev,
                                                      std::int64_t(1) << 16, int(fp8_row::bytes), backup_rows,
                                                      stop_flag, backup_rows, copied_rows);
        DHISPARSE_CUDA_TRY(cudaGetLastError());
        DHISPARSE_CUDA_TRY(cudaEventRecord(ev[3], side));
        DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(retr, ev[2], 0));  // the flag is down before it is raised
        for (int g = 0; g < groups; ++g) { retrieve(g, 0, retr); }
        raise_stop_kernel<<<1, 1, 0, retr>>>(stop_flag);
        DHISPARSE_CUDA_TRY(cudaGetLastError());  // (each repetition starts after a device synchronize)
      });
      backup_span = elapsed(ev[2], ev[3]);
      DHISPARSE_CUDA_TRY(cudaMemcpy(&copied, copied_rows, sizeof copied, cudaMemcpyDeviceToHost));
      double const retr_gbps   = bytes_per_loop / (with_paced * 1e6);
      double const backup_gbps = double(copied) * fp8_row::bytes / (backup_span * 1e6);
      std::printf("    %-14d %12.1f %10.2f %14.2f\n", blocks, retr_gbps, solo / with_paced, backup_gbps);
      new_record("beside_paced_backup");
      report.field("backup_blocks", double(blocks));
      report.field("gbps", retr_gbps);
      report.field("of_solo", solo / with_paced);
      report.field("backup_gbps", backup_gbps);
      report.field("backup_rows", double(copied));
      report.field("backup_ms", backup_span);
    }
    cudaFree(plans);
    cudaFree(counts);
  }
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  report.write(opt.json_path);
  for (auto& e : ev) { cudaEventDestroy(e); }
  cudaFreeHost(d2h_host);
  cudaFree(d2h_dev);
  cudaFree(stop_flag);
  cudaFree(copied_rows);
  cudaFree(attn_ws);
  cudaFree(queries);
  cudaFree(out);
  cudaFree(lse);
  for (int i = 0; i < 2; ++i) {
    cudaFree(slab[i]);
    cudaFree(table[i]);
  }
  for (cudaStream_t s : {attn, retr, retr_high, side}) { cudaStreamDestroy(s); }
  return 0;
}
