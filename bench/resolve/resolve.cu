// bench/resolve: the library's resolve, and resolve + retrieve, against a HiSparse-style
// fused swap-in kernel written for the benchmark (hisparse_baseline.cuh: one CTA per
// request, LRU order array, shared-memory hash, warp-per-row copy), on the same inputs,
// in the same run (BENCH.md "resolve", issue 12).
//
// Shapes: one layer group of one 656-byte FP8 MLA row, K = 2048, B ∈ {1, 16, 128, 512},
// Q ∈ {1, 4, 8}, selections that keep 86% or 99% of the previous step's rows (the rest
// never selected before: misses), handed over in random order as an indexer emits them.
// Budgets: static_budget<4096> (HiSparse's buffer, Q = 1), static_budget<16448> (Q > 1:
// the essential set of Q = 8 queries), adaptive_budget (global reclaim). Requests 0–127
// hold 100 000-token histories, 128–511 hold 25 000 (the host store: 15 GiB of pinned
// pages handed out in admission order, shared by the three hierarchies). Verify steps
// accept one draft. Timing: CUDA events around each call, median over the timed steps
// after warm-up; the measured fetch fraction comes from the hierarchy's counters.
// Exactness: sampled slot-table entries of every configuration's last step are compared
// with the host rows; the baseline checks itself (baseline_selfcheck.cu).
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>

#include <common/bench.cuh>
#include <resolve/hisparse_baseline.cuh>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace dhisparse;

namespace {

using row                        = row_format::mla_fp8_656;
constexpr int K                  = 2048;
constexpr int max_batch          = 512;
constexpr int long_requests      = 128;
constexpr std::int32_t long_len  = 100'000;
constexpr std::int32_t short_len = 25'000;
constexpr std::int32_t headroom  = 2048;  // tail rows the runs append
constexpr int tokens_per_page    = 64;

std::int32_t initial_length(int r) { return r < long_requests ? long_len : short_len; }

/// One pinned, mapped host buffer that every hierarchy of the run uses as its store.
struct shared_store {
  std::byte* memory  = nullptr;
  std::size_t bytes  = 0;
  std::size_t pages  = 0;
  shared_store()
  {
    for (int r = 0; r < max_batch; ++r) {
      pages += (std::size_t(initial_length(r)) + headroom + tokens_per_page - 1) / tokens_per_page;
    }
    bytes = pages * tokens_per_page * row::bytes;
    DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&memory), bytes,
                                     cudaHostAllocMapped | cudaHostAllocPortable));
  }
  ~shared_store() { cudaFreeHost(memory); }
};

hierarchy_config make_config(shared_store const& store, int max_queries, std::int64_t slots)
{
  hierarchy_config c;
  c.group_layers                  = {1};
  c.max_requests                  = max_batch;
  c.max_batch                     = max_batch;
  c.max_queries                   = max_queries;
  c.max_top_k                     = K;
  c.max_context                   = long_len + headroom;
  c.device_slots_per_group        = slots;
  c.map_page_positions            = 1024;
  c.host.tokens_per_page          = tokens_per_page;
  c.host.capacity_pages           = store.pages;
  c.host.memory                   = host_memory::caller;
  c.host.caller_memory            = store.memory;
  c.host.caller_bytes             = store.bytes;
  c.host.caller_memory_registered = true;
  return c;
}

/// The row of (request, position) in the benchmark's world: 16 marker bytes, rest as is.
void mark_row(std::byte* row_bytes, int request, std::int32_t position)
{
  std::uint64_t const a = 0x5EED0000'00000000ull | std::uint64_t(request);
  std::uint64_t const b = 0xB0B0000000000000ull | std::uint64_t(position);
  std::memcpy(row_bytes, &a, 8);
  std::memcpy(row_bytes + 8, &b, 8);
}

/**
 * Drifting selections: each step keeps a fraction of a request's previous first-query
 * selection and fills the rest with positions it never selected (misses for every policy);
 * further queries replace 10% of the first query's rows with rows it just dropped (rows
 * verify positions share, which stay resident). Entries come sorted: resolve sorts its
 * misses itself, the baseline copies in selection order, so sorted input is the fair one.
 */
class drift {
 public:
  drift(std::uint64_t seed, double keep) : rng_{seed}, keep_{keep} {}

  /// Selections of batch entries 0..batch-1 (request b) with `queries` queries each, in
  /// the hierarchy's [max_batch][max_queries][K] layout.
  void next(int batch, int queries, int max_queries, std::vector<std::int32_t>& out)
  {
    out.assign(std::size_t(max_batch) * max_queries * K, -1);
    if (state_.size() < std::size_t(batch)) { state_.resize(std::size_t(batch)); }
    for (int b = 0; b < batch; ++b) {
      auto& s = state_[std::size_t(b)];
      if (s.offset < 0) { s.offset = std::int64_t(rng_() % std::uint64_t(initial_length(b))); }
      std::shuffle(s.previous.begin(), s.previous.end(), rng_);
      std::size_t const kept = std::min(s.previous.size(), std::size_t(keep_ * K + 0.5));
      std::vector<std::int32_t> dropped(s.previous.begin() + std::ptrdiff_t(kept), s.previous.end());
      s.previous.resize(kept);
      while (s.previous.size() < std::size_t(K)) {  // never selected before (until a long
        s.previous.push_back(fresh(b, s));             // run wraps around the context)
      }
      std::int32_t* q0 = out.data() + std::size_t(b) * max_queries * K;
      std::copy(s.previous.begin(), s.previous.end(), q0);
      for (int q = 1; q < queries; ++q) {
        std::int32_t* query = q0 + std::size_t(q) * K;
        std::copy(q0, q0 + K, query);
        std::size_t const swaps = std::min(dropped.size(), std::size_t(K / 10));
        for (std::size_t i = 0; i < swaps; ++i) { query[rng_() % K] = dropped[(i + q) % dropped.size()]; }
        std::sort(query, query + K);
      }
      std::sort(q0, q0 + K);
    }
  }

 private:
  struct request_state {
    std::vector<std::int32_t> previous;
    std::int64_t offset = -1;  ///< of the request's permutation of its positions
    std::int64_t cursor = 0;
  };
  /// The next position of a fixed permutation of [0, length): i ↦ (p·i + offset) mod n
  /// with p prime to n.
  static std::int32_t fresh(int b, request_state& s)
  {
    std::int64_t const n = initial_length(b);
    return std::int32_t((1'000'003 * (s.cursor++ % n) + s.offset) % n);
  }
  std::mt19937_64 rng_;
  double keep_;
  std::vector<request_state> state_;
};

struct timing {
  double resolve_us = 0, resolve_retrieve_us = 0, fused_us = 0, fetch_fraction = 0, fetched_per_step = 0;
  bool exact = true;
};

/// Keeps the GPU busy for about `microseconds`, so that the launches queued behind it are
/// timed on the device without the host's launch latency (what a CUDA graph also removes).
template <int Dummy = 0>
__global__ void spin_kernel(long long cycles)
{
  long long const start = clock64();
  while (clock64() - start < cycles) {}
}
void spin(cudaStream_t stream) { spin_kernel<<<1, 1, 0, stream>>>(200'000); }

/// Runs `steps` steps of `h` on selections from `d`; times the last `timed` of them.
template <class H>
timing run_hierarchy(H& h, drift& d, int batch, int queries, int warmup, int timed, cudaStream_t stream,
                     std::vector<std::int32_t>& lengths)
{
  auto const& c = h.config();
  std::vector<request_id> ids;
  for (int b = 0; b < batch; ++b) { ids.push_back(request_id{std::uint64_t(b)}); }
  std::vector<std::int32_t> q(std::size_t(batch), queries), accepted(std::size_t(max_batch), 1);
  h.set_batch(ids.data(), q.data(), batch, stream);
  std::size_t const entries = c.step_entries();
  std::int32_t *d_sel = nullptr, *d_accepted = nullptr, *h_sel = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&d_sel, entries * 4));
  DHISPARSE_CUDA_TRY(cudaMalloc(&d_accepted, max_batch * 4));
  DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_sel), entries * 4, cudaHostAllocDefault));
  DHISPARSE_CUDA_TRY(cudaMemcpy(d_accepted, accepted.data(), max_batch * 4, cudaMemcpyHostToDevice));
  cudaEvent_t ev[3];
  for (auto& e : ev) { DHISPARSE_CUDA_TRY(cudaEventCreate(&e)); }
  std::vector<double> resolve_ms, both_ms, fused_ms;
  std::vector<std::int32_t> sel;
  group_counters before{}, after{};
  timing t;
  for (int s = 0; s < warmup + timed; ++s) {
    d.next(batch, queries, c.max_queries, sel);
    std::copy(sel.begin(), sel.end(), h_sel);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_sel, h_sel, entries * 4, cudaMemcpyHostToDevice, stream));
    if (s == warmup) { h.read_counters(0, &before, stream); }
    // Steps rotate over: resolve timed alone, resolve + retrieve, the fused launch.
    int const mode = s % 3;
    spin(stream);
    DHISPARSE_CUDA_TRY(cudaEventRecord(ev[0], stream));
    if (mode == 2) {
      h.resolve_and_retrieve(0, d_sel, K, stream);
      DHISPARSE_CUDA_TRY(cudaEventRecord(ev[1], stream));
    } else {
      h.resolve(0, d_sel, K, stream);
      DHISPARSE_CUDA_TRY(cudaEventRecord(ev[1], stream));
      h.retrieve(0, stream);
    }
    DHISPARSE_CUDA_TRY(cudaEventRecord(ev[2], stream));
    if (s + 1 == warmup + timed) {  // exactness of a sample of the last step's slots
      std::vector<std::int32_t> table(entries);
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(table.data(), h.slot_table(0), entries * 4, cudaMemcpyDeviceToHost, stream));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      auto const view = h.layer_rows(0, 0);
      for (int i = 0; i < 64; ++i) {
        std::size_t const e    = (std::size_t(i) * 7919u) % (std::size_t(batch) * c.max_queries * K);
        int const b            = int(e / (std::size_t(c.max_queries) * K));
        std::int32_t const pos = sel[e];
        if (pos < 0 || int((e / K) % c.max_queries) >= queries) { continue; }
        if (table[e] < 0) {
          t.exact = false;
          continue;
        }
        std::byte got[16], want[16];
        DHISPARSE_CUDA_TRY(cudaMemcpy(got, view.rows + std::size_t(table[e]) * view.stride, 16, cudaMemcpyDeviceToHost));
        mark_row(want, b, pos);
        t.exact &= std::memcmp(got, want, 16) == 0 &&
                   std::memcmp(h.host_row(ids[b], 0, 0, pos), want, 16) == 0;
      }
    }
    h.commit(queries > 1 ? d_accepted : nullptr, stream);
    h.backup(stream);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    for (int b = 0; b < batch; ++b) { lengths[std::size_t(b)] += 1; }
    if (s >= warmup) {
      float a = 0, z = 0;
      DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&a, ev[0], ev[1]));
      DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&z, ev[0], ev[2]));
      if (mode == 0) { resolve_ms.push_back(a); }
      if (mode == 1) { both_ms.push_back(z); }
      if (mode == 2) { fused_ms.push_back(a); }
    }
  }
  h.read_counters(0, &after, stream);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  std::uint32_t const status = h.status_sync(stream);
  if (status != 0) {
    std::printf("  status: %s\n", describe_status(status).c_str());
    t.exact = false;
    h.clear_status(stream);
  }
  t.resolve_us          = 1e3 * bench::median(resolve_ms);
  t.resolve_retrieve_us = 1e3 * bench::median(both_ms);
  t.fused_us            = 1e3 * bench::median(fused_ms);
  double const selected = double(after.selected_rows - before.selected_rows);
  double const fetched  = double(after.fetched_rows - before.fetched_rows);
  t.fetch_fraction      = selected > 0 ? fetched / selected : 0;
  t.fetched_per_step    = fetched / timed;
  for (auto& e : ev) { cudaEventDestroy(e); }
  cudaFree(d_sel);
  cudaFree(d_accepted);
  cudaFreeHost(h_sel);
  return t;
}

/// The baseline's state for `max_batch` requests of H = 4096 slots, one layer.
struct baseline_state {
  static constexpr int hot = 4096;
  std::byte* rows           = nullptr;
  std::int32_t *position = nullptr, *lru = nullptr, *table = nullptr, *newest = nullptr, *requests = nullptr,
               *lengths = nullptr, *sel = nullptr;
  baseline_state()
  {
    std::size_t const slots = std::size_t(max_batch) * hot;
    DHISPARSE_CUDA_TRY(cudaMalloc(&rows, slots * row::bytes));
    DHISPARSE_CUDA_TRY(cudaMalloc(&position, slots * 4));
    DHISPARSE_CUDA_TRY(cudaMalloc(&lru, slots * 4));
    DHISPARSE_CUDA_TRY(cudaMalloc(&table, std::size_t(max_batch) * K * 4));
    DHISPARSE_CUDA_TRY(cudaMalloc(&newest, max_batch * 4));
    DHISPARSE_CUDA_TRY(cudaMalloc(&requests, max_batch * 4));
    DHISPARSE_CUDA_TRY(cudaMalloc(&lengths, max_batch * 4));
    DHISPARSE_CUDA_TRY(cudaMalloc(&sel, std::size_t(max_batch) * K * 4));
    reset();
  }
  void reset()
  {
    std::vector<std::int32_t> order(std::size_t(max_batch) * hot);
    for (std::size_t i = 0; i < order.size(); ++i) { order[i] = std::int32_t(i % hot); }
    DHISPARSE_CUDA_TRY(cudaMemcpy(lru, order.data(), order.size() * 4, cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemset(position, 0xFF, order.size() * 4));
  }
  ~baseline_state()
  {
    for (void* p : {static_cast<void*>(rows), static_cast<void*>(position), static_cast<void*>(lru),
                    static_cast<void*>(table), static_cast<void*>(newest), static_cast<void*>(requests),
                    static_cast<void*>(lengths), static_cast<void*>(sel)}) {
      cudaFree(p);
    }
  }
};

/// The baseline on the same selections (first query), reading the same host store.
double run_baseline(baseline_state& st, host_store const& store, drift& d, int batch, int warmup, int timed,
                    std::vector<std::int32_t> const& lengths, cudaStream_t stream, bool& exact)
{
  std::vector<std::int32_t> requests(static_cast<std::size_t>(batch)), lens(static_cast<std::size_t>(batch));
  std::iota(requests.begin(), requests.end(), 0);
  DHISPARSE_CUDA_TRY(cudaMemcpy(st.requests, requests.data(), std::size_t(batch) * 4, cudaMemcpyHostToDevice));
  bench::hisparse::swap_in_params p{};
  p.top_k         = st.sel;
  p.requests      = st.requests;
  p.lengths       = st.lengths;
  p.host          = store.ref();
  p.layout        = store.layout(0);
  p.layer_offset  = 0;
  p.buffer_rows   = st.rows;
  p.slot_position = st.position;
  p.lru           = st.lru;
  p.slot_table    = st.table;
  p.newest_slot   = st.newest;
  p.batch         = batch;
  p.top_k_count   = K;
  p.hot_slots     = baseline_state::hot;
  p.row_bytes     = row::bytes;
  cudaEvent_t start, stop;
  DHISPARSE_CUDA_TRY(cudaEventCreate(&start));
  DHISPARSE_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> ms;
  std::vector<std::int32_t> sel;
  for (int s = 0; s < warmup + timed; ++s) {
    d.next(batch, 1, 1, sel);
    for (int b = 0; b < batch; ++b) { lens[std::size_t(b)] = lengths[std::size_t(b)] + s; }
    DHISPARSE_CUDA_TRY(cudaMemcpy(st.sel, sel.data(), std::size_t(batch) * K * 4, cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemcpy(st.lengths, lens.data(), std::size_t(batch) * 4, cudaMemcpyHostToDevice));
    spin(stream);
    DHISPARSE_CUDA_TRY(cudaEventRecord(start, stream));
    DHISPARSE_CUDA_TRY(bench::hisparse::swap_in_async(p, stream));
    DHISPARSE_CUDA_TRY(cudaEventRecord(stop, stream));
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(stop));
    float t = 0;
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, start, stop));
    if (s >= warmup) { ms.push_back(t); }
    if (s + 1 == warmup + timed) {  // a sample of the last step is exact too
      std::vector<std::int32_t> table(std::size_t(batch) * K);
      DHISPARSE_CUDA_TRY(cudaMemcpy(table.data(), st.table, table.size() * 4, cudaMemcpyDeviceToHost));
      for (int i = 0; i < 64; ++i) {
        std::size_t const e = (std::size_t(i) * 7919u) % table.size();
        if (table[e] < 0) {
          exact = false;
          continue;
        }
        std::byte got[16], want[16];
        DHISPARSE_CUDA_TRY(cudaMemcpy(got, st.rows + std::size_t(table[e]) * row::bytes, 16, cudaMemcpyDeviceToHost));
        mark_row(want, int(e / K), sel[e]);
        exact &= std::memcmp(got, want, 16) == 0;
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1e3 * bench::median(ms);
}

template <class H>
std::unique_ptr<H> make_hierarchy(shared_store& store, int max_queries, std::int64_t slots, cudaStream_t stream,
                                  bool write_rows)
{
  auto h = std::make_unique<H>(make_config(store, max_queries, slots), stream);
  for (int r = 0; r < max_batch; ++r) {
    h->admit(request_id{std::uint64_t(r)}, initial_length(r), stream, initial_length(r) + headroom);
    if (write_rows) {
      for (std::int32_t p = 0; p < initial_length(r); ++p) {
        mark_row(h->host_row(request_id{std::uint64_t(r)}, 0, 0, p), r, p);
      }
    }
  }
  return h;
}

}  // namespace

int main(int argc, char** argv)
{
  // --batches B1,B2,…: only these batch sizes (the rest of the arguments: bench::options).
  std::vector<int> only_batches;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--batches" && i + 1 < argc) {
      for (char const* c = argv[++i]; *c != '\0'; c += *c == ',') {
        char* end = nullptr;
        only_batches.push_back(int(std::strtol(c, &end, 10)));
        c = end;
      }
    } else {
      args.push_back(argv[i]);
    }
  }
  auto const opt = bench::options::parse(int(args.size()), args.data());
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  double const memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, stream);
  std::printf("device: %s   date: %s\n", bench::device_name().c_str(), bench::today().c_str());
  std::printf("pinned host->device cudaMemcpyAsync (1 GiB): %.1f GB/s\n", memcpy_gbps);

  shared_store store;
  std::printf("host store: %.1f GiB pinned, %d requests (0-%d: %d tokens, the rest %d)\n",
              double(store.bytes) / (1 << 30), max_batch, long_requests - 1, long_len, short_len);
  using static_q1 = kv_hierarchy<row, policy::lru, policy::static_budget<4096>>;
  using static_q8 = kv_hierarchy<row, policy::lru, policy::static_budget<16448>>;
  using adaptive  = kv_hierarchy<row, policy::lru, policy::adaptive_budget<>>;
  // The three hierarchies admit the same requests in the same order, so their page tables
  // name the same pages of the shared store; the first writes the rows.
  auto h1 = make_hierarchy<static_q1>(store, 1, std::int64_t(max_batch) * 4096, stream, true);
  auto h8 = make_hierarchy<static_q8>(store, 8, std::int64_t(max_batch) * 16448, stream, false);
  auto ha = make_hierarchy<adaptive>(store, 8, std::int64_t(max_batch) * 16448, stream, false);
  baseline_state base;

  bench::json_report report("resolve");
  report.set("device", bench::device_name());
  report.set("date", bench::today());
  report.set("memcpy_h2d_gbps", memcpy_gbps);
  report.set("top_k", K);
  report.set("row_bytes", double(row::bytes));

  std::vector<int> const batches = !only_batches.empty() ? only_batches
                                  : opt.quick             ? std::vector<int>{1, 16}
                                                          : std::vector<int>{1, 16, 128, 512};
  std::vector<double> const keeps = {0.86, 0.99};
  int const warmup = opt.warmup + 5;
  std::printf("(times on the device only: a spin kernel ahead of each timed call hides host launch latency)\n");
  std::printf("\n%-14s %4s %2s %4s %8s %8s %9s %8s %9s %8s %6s %5s\n", "budget", "B", "Q", "hits", "fetched",
              "resolve", "+retrieve", "fused", "baseline", "speedup", "GB/s", "exact");
  std::vector<std::int32_t> len1(max_batch), len8(max_batch), lena(max_batch);
  for (int r = 0; r < max_batch; ++r) { len1[r] = len8[r] = lena[r] = initial_length(r); }
  std::uint64_t seed = 2026;
  for (int batch : batches) {
    int const timed = batch >= 128 ? 12 : 24;  // rotating over three measurements
    for (double keep : keeps) {
      for (int queries : {1, 4, 8}) {
        for (int which = 0; which < 2; ++which) {  // static, adaptive
          ++seed;
          drift d(seed, keep);
          timing t;
          char const* budget = which == 0 ? (queries == 1 ? "static<4096>" : "static<16448>") : "adaptive";
          if (which == 0 && queries == 1) {
            t = run_hierarchy(*h1, d, batch, queries, warmup, timed, stream, len1);
          } else if (which == 0) {
            t = run_hierarchy(*h8, d, batch, queries, warmup, timed, stream, len8);
          } else {
            t = run_hierarchy(*ha, d, batch, queries, warmup, timed, stream, lena);
          }
          double baseline_us = 0;
          bool base_exact    = true;
          if (which == 0 && queries == 1) {
            drift db(seed, keep);  // the same selections
            base.reset();
            std::vector<std::int32_t> start(max_batch);
            for (int r = 0; r < max_batch; ++r) { start[r] = len1[r] - warmup - timed; }
            baseline_us = run_baseline(base, h1->store(), db, batch, warmup, timed, start, stream, base_exact);
          }
          double const best = std::min(t.resolve_retrieve_us, t.fused_us);
          double const gbps = t.fetched_per_step * row::bytes / (t.fused_us * 1e3);
          std::printf("%-14s %4d %2d %3.0f%% %7.2f%% %8.1f %9.1f %8.1f %9.1f %8.2f %6.1f %5s\n", budget, batch, queries,
                      keep * 100, 100 * t.fetch_fraction, t.resolve_us, t.resolve_retrieve_us, t.fused_us, baseline_us,
                      baseline_us > 0 ? baseline_us / best : 0.0, gbps, t.exact && base_exact ? "yes" : "NO");
          report.add_record();
          report.field("batch", batch);
          report.field("queries", queries);
          report.field("hit_rate", keep);
          report.field("budget", budget);
          report.field("fetch_fraction", t.fetch_fraction);
          report.field("resolve_us", t.resolve_us);
          report.field("resolve_retrieve_us", t.resolve_retrieve_us);
          report.field("resolve_retrieve_fused_us", t.fused_us);
          report.field("fetched_gbps_fused", gbps);
          report.field("baseline_us", baseline_us);
          report.field("exact", t.exact && base_exact ? 1.0 : 0.0);
        }
      }
    }
  }

  // Reclaim: optional rows of the adaptive pool released by metadata alone.
  {
    std::int32_t const release = opt.quick ? 20'000 : 100'000;
    std::vector<double> ms;
    cudaEvent_t start, stop;
    DHISPARSE_CUDA_TRY(cudaEventCreate(&start));
    DHISPARSE_CUDA_TRY(cudaEventCreate(&stop));
    group_counters c0{}, c1{};
    {  // a reclaim that releases nothing: loads the kernel's module, which the first call would time
      std::int32_t free_now = 0;
      DHISPARSE_CUDA_TRY(cudaMemcpy(&free_now, ha->pool_ref(0).free_count, 4, cudaMemcpyDeviceToHost));
      ha->reclaim(0, free_now, stream);
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    for (int i = 0; i < 5; ++i) {
      DHISPARSE_CUDA_TRY(cudaMemcpy(&c0, ha->counters(0), sizeof c0, cudaMemcpyDeviceToHost));
      std::int32_t free_now = 0;
      DHISPARSE_CUDA_TRY(cudaMemcpy(&free_now, ha->pool_ref(0).free_count, 4, cudaMemcpyDeviceToHost));
      spin(stream);  // the reclaim is enqueued before the GPU reaches `start`
      DHISPARSE_CUDA_TRY(cudaEventRecord(start, stream));
      ha->reclaim(0, free_now + release, stream);
      DHISPARSE_CUDA_TRY(cudaEventRecord(stop, stream));
      DHISPARSE_CUDA_TRY(cudaEventSynchronize(stop));
      DHISPARSE_CUDA_TRY(cudaMemcpy(&c1, ha->counters(0), sizeof c1, cudaMemcpyDeviceToHost));
      float t = 0;
      DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, start, stop));
      if (c1.reclaimed_rows - c0.reclaimed_rows == std::uint64_t(release)) { ms.push_back(t); }
    }
    std::int32_t const pool = std::int32_t(ha->config().device_slots_per_group);
    // The first reclaim after the resolve runs also tightens the key floors that hits left low.
    double const first_us = ms.empty() ? 0.0 : 1e3 * ms.front();
    std::printf("\nreclaim of %d optional rows from a pool of %d slots: %.1f us (median of %zu; first %.1f), "
                "0 bytes moved (fetched %llu, backed up %llu rows during it)\n",
                release, pool, 1e3 * bench::median(ms), ms.size(), first_us, c1.fetched_rows - c0.fetched_rows,
                c1.backed_up_rows - c0.backed_up_rows);
    report.add_record();
    report.field("operation", "reclaim");
    report.field("reclaimed_rows", release);
    report.field("pool_slots", pool);
    report.field("reclaim_us", 1e3 * bench::median(ms));
    report.field("reclaim_first_us", first_us);
    report.field("reclaim_bytes", 0.0);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  report.write(opt.json_path);
  cudaStreamDestroy(stream);
  return 0;
}
