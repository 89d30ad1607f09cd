// bench/retrieval (realistic plans): the gather of missed rows on plans produced by the
// library's resolve, over many requests with long histories in a large host store
// (BENCH.md "retrieval", issue 15 item 2), against pinned cudaMemcpyAsync in the same run.
//
// World: 512 requests admitted one after another into one host store of --store-gib GiB
// (default 10; pages handed out in admission order, real page tables, 64 tokens a page),
// every request's history filling its share (38K tokens of 656-B rows at 10 GiB, 9.5K of
// 2624-B group rows); a kv_hierarchy<row, lru, static_budget<4096>> (HiSparse's buffer) per
// row size. Rows: 584 (DeepSeek-V4-Flash; stored as 592, the next multiple of 16), 656
// (FP8 MLA, groups of 1), 2624 (4 × 656, GLM-style groups of 4 layers). Each step a batch of
// B ∈ {1, 32, 128, 512} random requests selects K = 2048 positions that keep 99% or 86% of
// its previous selection and replace the rest with positions it never selected: after
// warm-up 1% / 14% of the selected rows miss (measured from the plans). Host memory:
// cudaHostAlloc or mmap + MADV_HUGEPAGE + cudaHostRegister (--memory both, the default),
// NUMA-local where the machine has several nodes.
//
// After each step's resolve the plan is gathered, L2 flushed before every timed call, as
//   emitted               the plan as resolve wrote it, default lanes per row
//   emitted_warp_per_row  the same, one warp per row (the kernel before issue 15)
//   address               order_plan_async + gather (the time includes the ordering)
//   address_gather_only   the gather of the ordered plan alone, at 1, 2, 4 and 6 blocks
//                         per SM (6 = the default grid; 16 rows in flight a block for
//                         656-B rows, 8 for 2624-B rows)
// Records: row_bytes, stored_row_bytes, batch, miss_rate (target), measured_miss_rate,
// rows (per step), gbps, of_memcpy, order, blocks, memory, median_us, exact.
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/retrieve.cuh>

#include <retrieval/common.cuh>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace dhisparse;
namespace rb = dhisparse::bench::retrieval;

namespace {

constexpr int K               = 2048;
constexpr int hot_rows        = 4096;
constexpr int requests        = 512;
constexpr int tokens_per_page = 64;
constexpr int headroom        = 256;  ///< tail positions a request may append during the run

/// Selections of one request that drift: a kept share of the last selection plus positions
/// never selected before, taken from a fixed permutation of its history.
class drifting_request {
 public:
  drifting_request(std::int32_t history, std::uint64_t seed) : history_{history}, rng_{seed}
  {
    offset_ = std::int64_t(rng_() % std::uint64_t(history_));
  }
  /// Writes K positions to `out`; `keep` of the last selection stays.
  void next(double keep, std::int32_t* out)
  {
    std::shuffle(last_.begin(), last_.end(), rng_);
    last_.resize(std::min(last_.size(), std::size_t(keep * K + 0.5)));
    while (int(last_.size()) < K) {
      // i ↦ (p·i + offset) mod n with p prime > n: a permutation; a long run wraps around.
      last_.push_back(std::int32_t((1'000'003LL * (next_fresh_++ % history_) + offset_) % history_));
    }
    std::copy(last_.begin(), last_.end(), out);
  }

 private:
  std::int32_t history_;
  std::mt19937_64 rng_;
  std::int64_t offset_     = 0;
  std::int64_t next_fresh_ = 0;
  std::vector<std::int32_t> last_;
};

/// One row size of the sweep.
struct row_case {
  int model_bytes;   ///< the model's row (584, 656, 2624)
  int stored_bytes;  ///< a group row in the store and the slab (multiple of 16)
};

struct measurement {
  char const* order;
  int blocks_per_sm;  ///< 0: the default grid
  std::vector<double> ms, gbps;
};

template <class Row>
using hierarchy_of = kv_hierarchy<Row, policy::lru, policy::static_budget<hot_rows>>;

/// Everything one row size needs, for one host memory.
struct run_context {
  rb::flags const* f;
  host_memory memory;
  dhisparse::detail::pinned_host_memory const* mem;
  std::size_t store_bytes;
  double memcpy_gbps;
  cudaStream_t stream;
  rb::l2_flush* flush;
  bench::json_report* report;
  bool* exact;
};

template <class Row>
void run_rows(run_context const& ctx, row_case rc, int layers)
{
  auto const& opt               = ctx.f->opt;
  std::size_t const group_bytes = std::size_t(layers) * Row::bytes;
  std::size_t const page_bytes  = std::size_t(tokens_per_page) * group_bytes;
  std::size_t const pages       = ctx.store_bytes / page_bytes;
  std::int32_t const capacity   = std::int32_t(pages / requests) * tokens_per_page;
  std::int32_t const history    = capacity - headroom;

  hierarchy_config c;
  c.group_layers                  = {layers};
  c.max_requests                  = requests;
  c.max_batch                     = requests;
  c.max_queries                   = 1;
  c.max_top_k                     = K;
  c.max_context                   = capacity;
  c.device_slots_per_group        = std::int64_t(requests) * hot_rows;
  c.host.tokens_per_page          = tokens_per_page;
  c.host.capacity_pages           = pages;
  c.host.memory                   = host_memory::caller;
  c.host.caller_memory            = ctx.mem->host();
  c.host.caller_bytes             = ctx.store_bytes;
  c.host.caller_memory_registered = true;
  auto h = std::make_unique<hierarchy_of<Row>>(c, ctx.stream);
  std::vector<drifting_request> drift;
  for (int r = 0; r < requests; ++r) {
    h->admit(request_id{std::uint64_t(r)}, history, ctx.stream, capacity);
    drift.emplace_back(history, 0xD21F7ull * 1000 + std::uint64_t(r));
  }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(ctx.stream));
  std::size_t const store_used = std::size_t(requests) * std::size_t(capacity / tokens_per_page) * page_bytes;
  std::printf("\nrows %d B (stored %d B, %d layer%s): %d requests x %d tokens, store %.2f GiB used\n", rc.model_bytes,
              rc.stored_bytes, layers, layers > 1 ? "s" : "", requests, history, double(store_used) / (1 << 30));

  std::size_t const entries = c.step_entries();
  std::int32_t* selections  = nullptr;
  std::int32_t* staged      = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&selections, entries * 4));
  DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&staged), entries * 4, cudaHostAllocDefault));
  std::size_t const ws_bytes = order_plan_workspace_size(h->store().bytes(), std::int32_t(entries));
  void* ws = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&ws, ws_bytes));
  DHISPARSE_CUDA_TRY(cudaMemset(ws, 0, ws_bytes));
  cudaEvent_t ev[2];
  for (auto& e : ev) { DHISPARSE_CUDA_TRY(cudaEventCreate(&e)); }
  int const sms = dhisparse::detail::multiprocessor_count();

  std::vector<int> const batches = !ctx.f->batches.empty() ? ctx.f->batches
                                   : opt.quick              ? std::vector<int>{1, 128}
                                                            : std::vector<int>{1, 32, 128, 512};
  std::vector<int> order(requests);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  int const warmup = opt.quick ? 3 : 4;
  int const timed  = opt.quick ? 5 : std::max(10, std::min(opt.reps, 12));
  for (int batch : batches) {
    batch = std::min(batch, requests);
    std::vector<request_id> ids;
    for (int b = 0; b < batch; ++b) { ids.push_back(request_id{std::uint64_t(order[std::size_t(b)])}); }
    std::vector<std::int32_t> const queries(std::size_t(batch), 1);
    h->set_batch(ids.data(), queries.data(), batch, ctx.stream);
    for (double miss : {0.01, 0.14}) {
      std::vector<measurement> m = {{"emitted", 0, {}, {}}, {"emitted_warp_per_row", 0, {}, {}}, {"address", 0, {}, {}},
                                    {"address_gather_only", 1, {}, {}}, {"address_gather_only", 2, {}, {}},
                                    {"address_gather_only", 4, {}, {}}, {"address_gather_only", 6, {}, {}}};
      double planned = 0, selected = 0;
      std::int64_t wrong = 0;
      for (int s = 0; s < warmup + timed; ++s) {
        std::fill(staged, staged + entries, -1);
        for (int b = 0; b < batch; ++b) {
          drift[std::size_t(order[std::size_t(b)])].next(1.0 - miss, staged + std::size_t(b) * K);
        }
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(selections, staged, entries * 4, cudaMemcpyHostToDevice, ctx.stream));
        h->resolve(0, selections, K, ctx.stream);
        miss_plan_ref const plan = h->plan_ref(0);
        retrieve_params p{};
        p.plan            = plan;
        p.slab            = h->layer_rows(0, 0).rows;
        p.group_row_bytes = group_bytes;
        p.byte_begin      = 0;
        p.byte_end        = group_bytes;
        plan_order_params const o{plan, h->store().ref().base, h->store().bytes(), 0};
        std::int32_t count = 0;
        for (auto& x : m) {
          (*ctx.flush)(ctx.stream);
          DHISPARSE_CUDA_TRY(cudaEventRecord(ev[0], ctx.stream));
          retrieve_params q = p;
          q.lanes_per_row   = std::string(x.order) == "emitted_warp_per_row" ? 32 : 0;
          int const blocks  = x.blocks_per_sm * sms;
          if (std::string(x.order) == "address") {
            DHISPARSE_CUDA_TRY(retrieve_async(q, o, ws, ws_bytes, blocks, ctx.stream));
          } else {
            DHISPARSE_CUDA_TRY(retrieve_async(q, blocks, ctx.stream));
          }
          DHISPARSE_CUDA_TRY(cudaEventRecord(ev[1], ctx.stream));
          DHISPARSE_CUDA_TRY(cudaEventSynchronize(ev[1]));
          if (s < warmup) { continue; }
          float t = 0;
          DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, ev[0], ev[1]));
          DHISPARSE_CUDA_TRY(cudaMemcpy(&count, plan.count, 4, cudaMemcpyDeviceToHost));
          x.ms.push_back(t);
          x.gbps.push_back(double(count) * double(group_bytes) / (1e6 * t));
        }
        if (s >= warmup) {
          planned += count;
          selected += double(batch) * K;
        }
        if (s + 1 == warmup + timed) {
          wrong = rb::wrong_rows(plan, p.slab, group_bytes, ctx.mem->host(), ctx.mem->device(), ctx.stream);
        }
        h->commit(nullptr, ctx.stream);
        h->backup(ctx.stream);
      }
      std::uint32_t const status = h->status_sync(ctx.stream);
      bool const exact           = wrong == 0 && status == 0;
      *ctx.exact                 = *ctx.exact && exact;
      if (status != 0) {
        std::printf("  status: %s\n", describe_status(status).c_str());
        h->clear_status(ctx.stream);
      }
      double const rows = planned / timed;
      for (auto const& x : m) {
        double const gbps = bench::median(x.gbps);
        std::printf("%-10s %5d %5.0f%% %6.2f%% %8.0f %-21s %6s %9.1f %7.1f %6.2f %s\n", rb::memory_name(ctx.memory), batch,
                    100 * miss, 100 * planned / selected, rows, x.order,
                    x.blocks_per_sm ? std::to_string(x.blocks_per_sm).c_str() : "auto", rb::median_us(x.ms),
                    gbps, gbps / ctx.memcpy_gbps, exact ? "exact" : "WRONG");
        auto& rep = *ctx.report;
        rep.add_record();
        rep.field("memory", rb::memory_name(ctx.memory));
        rep.field("row_bytes", double(rc.model_bytes));
        rep.field("stored_row_bytes", double(rc.stored_bytes));
        rep.field("batch", double(batch));
        rep.field("miss_rate", miss);
        rep.field("measured_miss_rate", planned / selected);
        rep.field("rows", rows);
        rep.field("order", x.order);
        rep.field("blocks_per_sm", double(x.blocks_per_sm));
        rep.field("median_us", rb::median_us(x.ms));
        rep.field("gbps", gbps);
        rep.field("of_memcpy", gbps / ctx.memcpy_gbps);
        rep.field("exact", exact ? 1.0 : 0.0);
      }
    }
  }
  for (auto& e : ev) { cudaEventDestroy(e); }
  cudaFree(ws);
  cudaFreeHost(staged);
  cudaFree(selections);
}

}  // namespace

int main(int argc, char** argv)
{
  auto f = rb::flags::parse(argc, argv);
  if (f.memories.size() == 1 && f.memories[0] == host_memory::pinned && argc > 0) {
    // Both kinds unless one was asked for.
    bool asked = false;
    for (int i = 1; i < argc; ++i) { asked = asked || std::string(argv[i]) == "--memory"; }
    if (!asked) { f.memories = {host_memory::pinned, host_memory::huge_pages}; }
  }
  auto const& opt = f.opt;
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  double const gib = f.store_gib > 0 ? f.store_gib : (opt.quick ? 2.0 : 10.0);
  std::size_t const store_bytes = std::size_t(gib * double(1ull << 30)) / (std::size_t{2} << 20) * (std::size_t{2} << 20);
  std::vector<int> const rows = !f.rows.empty() ? f.rows : std::vector<int>{584, 656, 2624};

  double const memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, stream);
  std::printf("device: %s   date: %s\n", bench::device_name().c_str(), bench::today().c_str());
  std::printf("pinned host->device cudaMemcpyAsync (1 GiB): %.1f GB/s\n", memcpy_gbps);
  std::printf("host store: %.2f GiB, %d requests, K = %d, static_budget<%d> + LRU, L2 flushed before each timed call\n",
              double(store_bytes) / (1 << 30), requests, K, hot_rows);
  bench::json_report report("retrieval_realistic");
  report.set("device", bench::device_name());
  report.set("date", bench::today());
  report.set("memcpy_h2d_gbps", memcpy_gbps);
  report.set("store_bytes", double(store_bytes));
  report.set("requests", double(requests));
  report.set("top_k", double(K));
  rb::l2_flush flush;
  bool exact = true;
  for (host_memory memory : f.memories) {
    auto const mem = rb::host_memory_of(memory, store_bytes);
    rb::fill(mem.device(), store_bytes, stream);
    // The store's own memory as a memcpy source (registered huge pages may differ).
    double store_memcpy = 0;
    {
      void* dev = nullptr;
      std::size_t const bytes = std::min(store_bytes, std::size_t{1} << 30);
      DHISPARSE_CUDA_TRY(cudaMalloc(&dev, bytes));
      auto const ms = bench::time_ms(stream, 2, 10, [&](int) {
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(dev, mem.host(), bytes, cudaMemcpyHostToDevice, stream));
      });
      store_memcpy = double(bytes) / (bench::median(ms) * 1e6);
      cudaFree(dev);
    }
    std::printf("\nhost memory: %s (%s); NUMA: %s; memcpy from it: %.1f GB/s\n", rb::memory_name(memory),
                rb::memory_how(memory), mem.numa().describe().c_str(), store_memcpy);
    report.set(std::string("numa_") + rb::memory_name(memory), mem.numa().describe());
    report.set(std::string("memcpy_from_store_gbps_") + rb::memory_name(memory), store_memcpy);
    std::printf("%-10s %5s %6s %7s %8s %-21s %6s %9s %7s %6s\n", "memory", "B", "miss", "meas.", "rows", "order",
                "blk/SM", "median_us", "GB/s", "of_mc");
    run_context const ctx{&f, memory, &mem, store_bytes, memcpy_gbps, stream, &flush, &report, &exact};
    for (int r : rows) {
      if (r == 584 || r == 592) {
        run_rows<row_format::opaque<592>>(ctx, {r, 592}, 1);
      } else if (r == 656) {
        run_rows<row_format::mla_fp8_656>(ctx, {656, 656}, 1);
      } else if (r == 2624) {
        run_rows<row_format::mla_fp8_656>(ctx, {2624, 2624}, 4);
      } else {
        std::printf("rows of %d bytes: not in this benchmark (584, 656, 2624)\n", r);
      }
    }
  }
  std::printf("\nevery checked row exact: %s\n", exact ? "yes" : "NO");
  report.set("exact", exact ? 1.0 : 0.0);
  report.write(opt.json_path);
  cudaStreamDestroy(stream);
  return exact ? 0 : 1;
}
