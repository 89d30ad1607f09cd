/**
 * @file bench/serving/serving.cu
 * @brief The serving benchmark (BENCH.md "serving", issue 16): the whole decode loop with
 *        the library's real kernels for the modes resident, hisparse, adaptive and
 *        adaptive+spec, on the same requests, in one process; scenarios A and B; a
 *        concurrency sweep; tokens/s, step latency, fetch fraction, PCIe traffic, accepted
 *        length and the largest concurrency under a latency bound; JSON and a table.
 *        `--check` runs the end-to-end exactness self-check instead. docs/serving.md has
 *        the loop, the scaling of a simulated subset of layers, and every assumption.
 */
#include <common/bench.cuh>
#include "kernels.hpp"
#include "options.hpp"
#include "runner.hpp"
#include "workload.hpp"

#include <dhisparse/error.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dhisparse::bench::serving {

// The run_mode instantiations live in run_resident.cu, run_hisparse.cu, run_adaptive.cu.
extern template run_result run_mode<policy::resident_budget>(scenario_setup const&, device_buffers&,
                                                             run_config const&);
extern template run_result run_mode<policy::static_budget<4096>>(scenario_setup const&, device_buffers&,
                                                                 run_config const&);
extern template run_result run_mode<policy::adaptive_budget<>>(scenario_setup const&, device_buffers&,
                                                               run_config const&);

namespace {

using hisparse_budget = policy::static_budget<4096>;
using adaptive_b      = policy::adaptive_budget<>;

/// Qmax × K one request may select per step (resolve's per-request union; the library's
/// hierarchy_config validation refuses more).
constexpr std::int64_t selection_limit = 16384;
constexpr int offset_stride   = 24;  ///< positions between requests that share a template
constexpr int tokens_per_page = 64;

double gib(double bytes) { return bytes / double(std::size_t(1) << 30); }

// ---------------------------------------------------------------------------------------
// Pinned host memory for the host store: allocated and filled once per scenario.
// ---------------------------------------------------------------------------------------
struct pinned_memory {
  void* p           = nullptr;
  std::size_t bytes = 0;
  pinned_memory(std::size_t n, bool fill, std::uint64_t seed) : bytes{n}
  {
    auto const t0 = std::chrono::steady_clock::now();
    DHISPARSE_CUDA_TRY(cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable));
    if (fill) {  // valid FP8 / fp32 / bf16 bytes everywhere, so prefill rows look like data
      std::size_t const words = n / 8;
      int const threads       = std::max(1, int(std::thread::hardware_concurrency()));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([=] {
          auto* w                 = static_cast<std::uint64_t*>(p);
          std::size_t const begin = words * t / threads, end = words * (t + 1) / threads;
          for (std::size_t i = begin; i < end; ++i) { w[i] = mix64(seed + i) & row_byte_mask; }
        });
      }
      for (auto& th : pool) { th.join(); }
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ~pinned_memory() { cudaFreeHost(p); }
  pinned_memory(pinned_memory const&)            = delete;
  pinned_memory& operator=(pinned_memory const&) = delete;
  double seconds = 0.0;
};

// ---------------------------------------------------------------------------------------
// Device buffers of a scenario.
// ---------------------------------------------------------------------------------------
void fill_random(void* p, std::size_t bytes, std::uint64_t seed, std::uint64_t and_mask, std::uint64_t or_mask,
                 cudaStream_t s)
{
  launch_fill_words(static_cast<std::uint64_t*>(p), bytes / 8, seed, and_mask, or_mask, s);
}

int round_up(std::int64_t v, int m) { return int((v + m - 1) / m * m); }

std::size_t build_buffers(scenario_setup const& su, device_buffers& db, std::vector<double> const& p_draft_host)
{
  options const& o = *su.opt;
  auto const& sc   = su.sc;
  cudaStream_t s   = db.stream;
  std::size_t total = 0;
  auto count = [&](auto const& a) { total += a.bytes(); };
  std::size_t const bq = std::size_t(su.max_c) * su.qmax;

  db.selections = device_array<std::int32_t>(std::size_t(su.groups) * bq * sc.top_k);
  count(db.selections);
  if (o.indexer) {
    std::int64_t const per_request = std::int64_t(su.max_capacity) + su.qmax + 16;
    std::int64_t const cap_rows    = (std::int64_t(16) << 30) / index_dim;  // 16 GiB of keys at most
    std::int64_t rows              = std::min<std::int64_t>(per_request * su.max_c, cap_rows);
    rows                           = std::max(rows, per_request);
    db.index_keys = device_array<std::int8_t>(std::size_t(rows) * index_dim);
    std::vector<std::int64_t> base(std::size_t(su.max_c));
    for (int r = 0; r < su.max_c; ++r) {
      base[std::size_t(r)] = rows >= per_request * su.max_c ? std::int64_t(r) * per_request
                                                            : (std::int64_t(r) * per_request) % (rows - per_request + 1);
    }
    db.key_base = device_array<std::int64_t>(base.size());
    DHISPARSE_CUDA_TRY(cudaMemcpy(db.key_base.data(), base.data(), base.size() * sizeof(std::int64_t),
                                  cudaMemcpyHostToDevice));
    fill_random(db.index_keys.data(), db.index_keys.bytes(), 11, ~0ull, 0, s);
    db.index_queries = device_array<std::int8_t>(bq * su.index_heads * index_dim);
    fill_random(db.index_queries.data(), db.index_queries.bytes(), 12, ~0ull, 0, s);
    std::vector<float> w(std::size_t(su.index_heads), 1.0f / float(su.index_heads));
    db.index_weights = device_array<float>(w.size());
    DHISPARSE_CUDA_TRY(cudaMemcpy(db.index_weights.data(), w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    db.score_stride = round_up(std::int64_t(su.max_capacity) + su.qmax + 16, 4);
    db.index_scores = device_array<float>(bq * std::size_t(db.score_stride));
    db.topk_out     = device_array<std::int32_t>(bq * sc.top_k);
    count(db.index_keys), count(db.index_queries), count(db.index_scores), count(db.topk_out);
    prepare_indexer(su.index_heads, su.qmax);
  }
  db.attn_queries = device_array<std::uint16_t>(bq * sc.heads * 576);
  // bf16 of magnitude in [0.5, 1), random sign.
  fill_random(db.attn_queries.data(), db.attn_queries.bytes(), 13, 0x807F807F807F807Full, 0x3F003F003F003F00ull, s);
  db.attn_out_elems = bq * sc.heads * 512;
  db.attn_out = device_array<std::uint16_t>(db.attn_out_elems * (su.check ? sc.layers_sim : 1));
  db.attn_lse = device_array<float>(bq * sc.heads);
  count(db.attn_queries), count(db.attn_out), count(db.attn_lse);

  auto features = [](double mb) { return std::max(64, round_up(std::int64_t(mb * 1048576.0 / (2.0 * dense_hidden)), 64)); };
  db.n_dense  = features(o.dense_mb);
  db.n_lm     = features(o.lm_head_mb);
  db.n_draft  = features(o.draft_mb);
  bool const spec = su.qmax > 1;
  // bf16 weights of magnitude ≈ 2^-7 (random sign), activations in [0.5, 1).
  std::uint64_t const w_and = 0x807F807F807F807Full, w_or = 0x3C003C003C003C00ull;
  db.dense_w = device_array<std::uint16_t>(std::size_t(sc.layers_sim) * db.n_dense * dense_hidden);
  fill_random(db.dense_w.data(), db.dense_w.bytes(), 14, w_and, w_or, s);
  db.lm_w = device_array<std::uint16_t>(std::size_t(db.n_lm) * dense_hidden);
  fill_random(db.lm_w.data(), db.lm_w.bytes(), 15, w_and, w_or, s);
  if (spec) {
    db.draft_w = device_array<std::uint16_t>(std::size_t(db.n_draft) * dense_hidden);
    fill_random(db.draft_w.data(), db.draft_w.bytes(), 16, w_and, w_or, s);
  }
  db.act_x = device_array<std::uint16_t>(bq * dense_hidden);
  fill_random(db.act_x.data(), db.act_x.bytes(), 17, 0x807F807F807F807Full, 0x3F003F003F003F00ull, s);
  db.act_y = device_array<std::uint16_t>(bq * std::size_t(std::max({db.n_dense, db.n_lm, spec ? db.n_draft : 0})));
  count(db.dense_w), count(db.lm_w), count(db.draft_w), count(db.act_x), count(db.act_y);

  if (spec) {
    int const d = su.qmax - 1;
    db.drafts   = d;
    db.draft_tokens = device_array<std::int32_t>(std::size_t(su.max_c) * d);
    launch_draft_tokens(db.draft_tokens.data(), su.max_c, d, o.vocab, s);
    std::vector<float> pd(p_draft_host.begin(), p_draft_host.end());
    db.p_draft = device_array<float>(pd.size());
    DHISPARSE_CUDA_TRY(cudaMemcpy(db.p_draft.data(), pd.data(), pd.size() * sizeof(float), cudaMemcpyHostToDevice));
    db.p = device_array<float>(std::size_t(su.max_c) * (d + 1) * o.vocab);
    launch_build_p(db.p.data(), su.max_c, d, o.vocab, db.p_draft.data(), db.draft_tokens.data(), s);
    db.cand_ids   = device_array<std::int32_t>(std::size_t(su.max_c) * d * 16);
    db.cand_probs = device_array<float>(std::size_t(su.max_c) * d * 16);
    launch_build_candidates(db.cand_ids.data(), db.cand_probs.data(), su.max_c, d, 16, o.vocab,
                            db.draft_tokens.data(), 0.5f, s);
    db.accepted   = device_array<std::int32_t>(std::size_t(su.max_c));
    db.emitted    = device_array<std::int32_t>(std::size_t(su.max_c) * (d + 1));
    db.next_token = device_array<std::int32_t>(std::size_t(su.max_c));
    db.kept       = device_array<std::int32_t>(std::size_t(su.max_c));
    db.verify_status = device_array<std::uint32_t>(1);
    count(db.p), count(db.cand_ids), count(db.cand_probs);
  }
  db.rng           = device_array<std::uint64_t>(2);
  db.tokens_total  = device_array<unsigned long long>(1);
  db.step_tokens   = device_array<std::int32_t>(std::size_t(su.hash_capacity));
  db.step_index    = device_array<std::int32_t>(1);
  db.bench_status  = device_array<std::uint32_t>(1);
  db.attn_status   = device_array<std::uint32_t>(1);
  db.hashes        = device_array<unsigned long long>(std::size_t(su.hash_capacity));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
  return total;
}

/// Frees every per-scenario buffer (streams and the cuBLAS handle stay).
void release_buffers(device_buffers& db)
{
  db.selections = {};
  db.index_keys = {};
  db.key_base = {};
  db.index_queries = {};
  db.index_weights = {};
  db.index_scores = {};
  db.topk_out = {};
  db.attn_queries = {};
  db.attn_out = {};
  db.attn_lse = {};
  db.attn_workspace = {};
  db.dense_w = {};
  db.lm_w = {};
  db.draft_w = {};
  db.act_x = {};
  db.act_y = {};
  db.draft_tokens = {};
  db.p = {};
  db.p_draft = {};
  db.cand_ids = {};
  db.cand_probs = {};
}

/// Bytes `build_buffers` allocates (for --plan).
double buffer_bytes_estimate(scenario_setup const& su)
{
  options const& o   = *su.opt;
  double const bq    = double(su.max_c) * su.qmax;
  double const K     = su.sc.top_k;
  double b           = double(su.groups) * bq * K * 4;  // selections
  if (o.indexer) {
    double const per_request = double(su.max_capacity) + su.qmax + 16;
    b += std::min(per_request * su.max_c, double(std::int64_t(16) << 30) / index_dim) * index_dim;  // keys
    b += bq * su.index_heads * index_dim + bq * per_request * 4 + bq * K * 4;  // queries, scores, top-K
  }
  b += bq * su.sc.heads * (576 + 512 * (su.check ? su.sc.layers_sim : 1)) * 2;  // attention in / out
  auto mb = [](double m) { return std::max(64.0, m) * 1048576.0; };
  b += su.sc.layers_sim * mb(o.dense_mb) + mb(o.lm_head_mb) + (su.qmax > 1 ? mb(o.draft_mb) : 0.0);
  b += bq * dense_hidden * 2 * 2 + bq * std::max({o.dense_mb, o.lm_head_mb, o.draft_mb}) * 1048576.0 / dense_hidden;
  if (su.qmax > 1) { b += double(su.max_c) * su.qmax * o.vocab * 4; }  // p
  return b;
}

// ---------------------------------------------------------------------------------------
// Running one mode.
// ---------------------------------------------------------------------------------------
run_result dispatch(scenario_setup const& su, device_buffers& db, run_config const& rc)
{
  switch (rc.m) {
    case mode::hisparse: return run_mode<hisparse_budget>(su, db, rc);
    case mode::resident: return run_mode<policy::resident_budget>(su, db, rc);
    default: return run_mode<adaptive_b>(su, db, rc);
  }
}

/// Requests of the first `c` that a mode admits into pools of `pool` slots (budget floors).
int served_for(scenario_setup const& su, mode m, int c, int queries, std::int64_t pool)
{
  std::int64_t sum = 0;
  int n            = 0;
  for (int r = 0; r < c; ++r) {
    std::int64_t const backed =
      backed_capacity(std::int64_t(su.len0[std::size_t(r)]) + su.tokens_per_request, su.max_capacity);
    std::int64_t floor = 0;
    switch (m) {
      case mode::resident:
        floor = request_floor<policy::resident_budget>(backed, queries, su.sc.top_k, backup_interval_for(true, su));
        break;
      case mode::hisparse: floor = request_floor<hisparse_budget>(backed, queries, su.sc.top_k, 1); break;
      default: floor = request_floor<adaptive_b>(backed, queries, su.sc.top_k, 1); break;
    }
    if (sum + floor > pool) { break; }
    sum += floor;
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------------------
double percentile(std::vector<double> v, double q)
{
  if (v.empty()) { return 0.0; }
  std::sort(v.begin(), v.end());
  std::size_t const i = std::size_t(std::ceil(q * double(v.size()))) - (q > 0.0 ? 1 : 0);
  return v[std::min(i, v.size() - 1)];
}

struct metrics {
  double tok_s_full = 0, tok_s_sim = 0;
  double p50_full = 0, p99_full = 0, p50_sim = 0, p99_sim = 0;
  double p50_token_full = 0, p99_token_full = 0;
  double accepted_len = 0, fetch_fraction = 0;
  double h2d_gbps = 0, d2h_gbps = 0, pcie_bytes_per_token_full = 0;
  double layers_ms = 0, step_ms = 0;  // means, simulated
};

metrics compute(scenario_setup const& su, run_result const& r)
{
  metrics m;
  double const scale = double(su.sc.layers_full) / double(su.sc.layers_sim);
  std::vector<double> full, sim, per_token;
  double sum_full = 0, sum_sim = 0;
  for (std::size_t i = 0; i < r.layers_ms.size(); ++i) {
    double const f = r.layers_ms[i] * scale + r.step_ms[i];
    double const t = r.layers_ms[i] + r.step_ms[i];
    full.push_back(f);
    sim.push_back(t);
    sum_full += f;
    sum_sim += t;
    m.layers_ms += r.layers_ms[i];
    m.step_ms += r.step_ms[i];
    int const tokens = i < r.step_tokens.size() ? std::max(1, r.step_tokens[i]) : r.rc.served;
    per_token.push_back(f * double(r.rc.served) / double(tokens));
  }
  double const n = double(std::max<std::size_t>(1, r.layers_ms.size()));
  m.layers_ms /= n;
  m.step_ms /= n;
  m.tok_s_full     = sum_full > 0 ? double(r.tokens) / (sum_full * 1e-3) : 0.0;
  m.tok_s_sim      = sum_sim > 0 ? double(r.tokens) / (sum_sim * 1e-3) : 0.0;
  m.p50_full       = percentile(full, 0.5);
  m.p99_full       = percentile(full, 0.99);
  m.p50_sim        = percentile(sim, 0.5);
  m.p99_sim        = percentile(sim, 0.99);
  m.p50_token_full = percentile(per_token, 0.5);
  m.p99_token_full = percentile(per_token, 0.99);
  m.accepted_len   = double(r.tokens) / (n * std::max(1, r.rc.served));
  m.fetch_fraction = r.selected > 0 ? double(r.fetched) / double(r.selected) : 0.0;
  m.h2d_gbps       = sum_sim > 0 ? r.h2d_bytes / (sum_sim * 1e-3) / 1e9 : 0.0;
  m.d2h_gbps       = sum_sim > 0 ? r.d2h_bytes / (sum_sim * 1e-3) / 1e9 : 0.0;
  m.pcie_bytes_per_token_full = r.tokens > 0 ? (r.h2d_bytes + r.d2h_bytes) * scale / double(r.tokens) : 0.0;
  return m;
}

std::string status_text(run_result const& r)
{
  std::string s;
  if (r.hierarchy_status != 0) { s += "hierarchy:" + describe_status(r.hierarchy_status); }
  if (r.bench_status & bench_template_exhausted) { s += std::string(s.empty() ? "" : ";") + "template_exhausted"; }
  if (r.bench_status & bench_attention_status) { s += std::string(s.empty() ? "" : ";") + "attention_invalid_slot"; }
  if (r.bench_status & bench_verify_status) { s += std::string(s.empty() ? "" : ";") + "verify_invalid_input"; }
  if (r.ring_status != 0) { s += std::string(s.empty() ? "" : ";") + describe_status(r.ring_status); }
  return s.empty() ? "ok" : s;
}

void print_header()
{
  std::printf("%-4s %-14s %5s %5s %10s %9s %9s %9s %9s %6s %8s %8s %8s %9s %s\n", "scn", "mode", "C", "served",
              "tok/s", "p50 ms", "p99 ms", "p99 tok", "sim p50", "acc", "fetch %", "H2D GB/s", "D2H GB/s",
              "PCIe B/tok", "status");
}

void print_row(scenario_setup const& su, run_result const& r, metrics const& m)
{
  std::printf("%-4s %-14s %5d %5d %10.0f %9.3f %9.3f %9.3f %9.3f %6.2f %8.3f %8.2f %8.2f %9.0f %s\n",
              su.sc.name.c_str(), mode_name(r.rc.m), r.rc.requested, r.rc.served, m.tok_s_full, m.p50_full,
              m.p99_full, m.p99_token_full, m.p50_sim, m.accepted_len, 100.0 * m.fetch_fraction, m.h2d_gbps,
              m.d2h_gbps, m.pcie_bytes_per_token_full, status_text(r).c_str());
  std::fflush(stdout);
}

/// The speculation controller's model and choices of a run.
std::string controller_text(run_result const& r)
{
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "controller: step ms (full model) by longest chain k = 0.." << r.shape_ms.size() - 1 << ":";
  for (double ms : r.shape_ms) { os << " " << ms; }
  os << " (after the timed steps:";
  for (double ms : r.shape_ms_end) { os << " " << ms; }
  os << "); chose " << r.mean_drafts << " drafts per request; steps by k:";
  for (std::size_t k = 0; k < r.shape_steps.size(); ++k) {
    if (r.shape_steps[k] > 0) { os << " " << k << ":" << r.shape_steps[k]; }
  }
  return os.str();
}

std::string phases_text(run_result const& r)
{
  std::ostringstream os;
  for (auto const& [label, ms] : r.phases) { os << label << " " << ms << " ms; "; }
  return os.str();
}

// ---------------------------------------------------------------------------------------
// One scenario: setup, sweep, report.
// ---------------------------------------------------------------------------------------
struct scenario_outcome {
  scenario_setup su;
  std::vector<run_result> results;
  std::vector<metrics> m;
  std::string assumptions;
};

std::vector<double> p_draft_of(options const& o)
{
  // Conditional acceptance of draft i given the ones before: survival[i] / survival[i-1].
  // One-hot q: accepted with probability p(x); candidates: q(x) = 1/2, so p(x) = α / 2.
  double const qx = o.draft_dist == "candidates" ? 0.5 : 1.0;
  std::vector<double> out;
  for (std::size_t i = 0; i < o.survival.size(); ++i) {
    double const prev = i == 0 ? 1.0 : o.survival[i - 1];
    out.push_back(std::min(1.0, o.survival[i] / prev) * qx);
  }
  return out;
}

std::string format(char const* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(char const* fmt, ...)
{
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

scenario_outcome run_scenario(options const& o, std::string const& name, device_buffers* db)
{
  scenario_outcome out;
  scenario_setup& su = out.su;
  su.sc  = o.resolve_scenario(name);
  su.opt = &o;
  auto& sc = su.sc;
  bool const any_spec =
    std::find(o.modes.begin(), o.modes.end(), mode::adaptive_spec) != o.modes.end();
  su.qmax   = any_spec ? 1 + o.drafts : 1;
  su.groups = sc.layers_sim / sc.group_layers;
  su.fetch  = o.fetch_for(sc.group_layers);
  su.index_heads   = sc.index_heads;
  su.index_stride  = sc.index_stride;
  su.salt          = o.seed;
  // Every step a run takes: eager, warm-up, the controller's calibration (one untimed and
  // `calibration_steps` timed replays per shape), timed, phase and union-probe steps.
  int const calibration = any_spec && o.spec_length == "controller" ? (1 + o.drafts) * (1 + o.calibration_steps) : 0;
  su.hash_capacity = 1 + o.warmup + calibration + o.steps + o.phase_steps + (any_spec ? o.union_steps : 0);
  su.tokens_per_request = std::int64_t(su.hash_capacity) * su.qmax + su.qmax;
  su.page_bytes = std::size_t(tokens_per_page) * sc.layers_sim * row_bytes;

  std::printf("\n=== scenario %s: %s ===\n", sc.name.c_str(), sc.model.c_str());
  // Templates from a trace fix K and the contexts; the drift workload uses the scenario's.
  std::unique_ptr<selection_templates> templates;
  int stride = offset_stride;
  if (!o.trace_path.empty() && db != nullptr) {
    templates = std::make_unique<selection_templates>(
      load_trace_templates(o.trace_path, o.templates, su.tokens_per_request));
    sc.top_k = templates->top_k;
    stride   = 0;
  }
  DHISPARSE_EXPECTS(std::int64_t(su.qmax) * sc.top_k <= selection_limit,
                    "scenario " + sc.name + ": (1 + drafts) x K = " + std::to_string(su.qmax * sc.top_k) +
                      " exceeds the library's per-request selection limit " +
                      std::to_string(selection_limit) + " (use fewer --drafts)");
  std::int32_t const context = templates ? *std::max_element(templates->start.begin(), templates->start.end())
                                         : sc.context;
  // Host memory caps the concurrency.
  int const R = templates ? templates->count : o.templates;
  auto host_per_request = [&](int max_c) {
    std::int64_t const offsets = std::int64_t((max_c - 1) / R) * stride;
    std::int64_t const cap     = std::int64_t(context) + offsets + su.tokens_per_request;
    return std::size_t((cap + tokens_per_page - 1) / tokens_per_page + 1) * su.page_bytes;
  };
  std::vector<int> sweep;
  double const host_budget = o.host_gib * double(std::size_t(1) << 30);
  for (int c : sc.concurrency) {
    if (double(host_per_request(c)) * c <= host_budget) {
      sweep.push_back(c);
    } else {
      std::printf("note: concurrency %d needs %.1f GiB of pinned host memory for the host store (--host-gib %.0f): "
                  "dropped\n",
                  c, gib(double(host_per_request(c)) * c), o.host_gib);
    }
  }
  if (sweep.empty()) {
    int c = std::max(1, int(host_budget / double(host_per_request(1))));
    while (c > 1 && double(host_per_request(c)) * c > host_budget) { --c; }
    sweep.push_back(c);
  }
  sc.concurrency = sweep;
  su.max_c       = sweep.back();

  std::vector<std::int32_t> const starts =
    templates ? templates->start : std::vector<std::int32_t>(std::size_t(R), context);
  su.len0.resize(std::size_t(su.max_c));
  for (int r = 0; r < su.max_c; ++r) { su.len0[std::size_t(r)] = starts[std::size_t(r % R)] + (r / R) * stride; }
  su.max_capacity = std::int32_t(*std::max_element(su.len0.begin(), su.len0.end()) + su.tokens_per_request);
  int const pool_ref = sc.pool_ref > 0 ? sc.pool_ref : su.max_c;
  su.pool_slots = std::int64_t(std::ceil(sc.pool_fraction * pool_ref * double(context + su.tokens_per_request)));
  su.pool_slots = std::min<std::int64_t>(su.pool_slots, (std::int64_t(1) << 31) - 1);
  std::size_t const host_bytes = std::size_t(su.max_c) * host_per_request(su.max_c);
  double const slab_bytes      = double(su.groups) * double(su.pool_slots) * sc.group_layers * row_bytes;

  if (db == nullptr) {  // --plan: the sizing only
    std::printf("sweep %s; pool %lld slots per group (%.1f GiB of slabs); benchmark buffers about %.1f GiB; "
                "host store %.1f GiB pinned; %lld positions per request per run; Q max %d\n",
                [&] {
                  std::ostringstream os;
                  for (int c : sc.concurrency) { os << (os.tellp() > 0 ? "," : "") << c; }
                  return os.str();
                }()
                  .c_str(),
                static_cast<long long>(su.pool_slots), gib(slab_bytes), gib(buffer_bytes_estimate(su)),
                gib(double(host_bytes)),
                static_cast<long long>(su.tokens_per_request), su.qmax);
    for (int c : sc.concurrency) {
      std::printf("  C = %4d served:", c);
      for (mode m : o.modes) {
        std::printf("  %s %d", mode_name(m), served_for(su, m, c, m == mode::adaptive_spec ? su.qmax : 1, su.pool_slots));
      }
      std::printf("\n");
    }
    return out;
  }
  if (!templates) {
    std::int64_t const offsets = std::int64_t((su.max_c - 1) / R) * stride;
    std::printf("building %d x %d drift templates of %lld positions (context %d, K %d)...\n", R, su.groups,
                static_cast<long long>(offsets + su.tokens_per_request), context, sc.top_k);
    std::fflush(stdout);
    templates = std::make_unique<selection_templates>(
      make_drift_templates(R, su.groups, context, sc.top_k, offsets + su.tokens_per_request, o.seed));
  }
  su.templates = templates.get();

  pinned_memory host(host_bytes, !su.check, o.seed);
  su.host_memory = host.p;
  su.host_bytes  = host.bytes;
  std::printf("host store: %.1f GiB pinned (%.1f s to allocate and fill); templates: %s (%.1f s)\n", gib(host.bytes),
              host.seconds, templates->source.c_str(), templates->build_s);

  std::size_t const buffer_bytes = build_buffers(su, *db, p_draft_of(o));
  double const scale      = double(sc.layers_full) / double(sc.layers_sim);
  out.assumptions = format(
    "%s. Simulated %d of %d layers (%d groups of %d); per-layer time scaled by %.2f, per-step work "
    "(LM head, drafter, verify, commit) counted once. Device pool %lld slots per group = %.3f x the live KV of %d "
    "requests (%.1f GiB of slabs for the simulated layers) - each mode admits what it would in the full model. "
    "Rows stored as FP8-656 (model row %d B). Heads %d; indexer stand-in %s (%d heads x 128 int8 dims, one "
    "128-B key per %d position(s), per group). Dense stand-in %.0f MB/layer (bf16 "
    "cuBLAS GEMM over B*Q tokens), LM head %.0f MB/step, drafter %.0f MB/step. Drafts %d (%s q), survival %s, "
    "speculation length %s. "
    "Fetch %s. Latency bound %.1f ms per token (full model). Workload: %s.",
    sc.model.c_str(), sc.layers_sim, sc.layers_full, su.groups, sc.group_layers, scale,
    static_cast<long long>(su.pool_slots), sc.pool_fraction, pool_ref, gib(slab_bytes), sc.row_bytes_model, sc.heads,
    o.indexer ? "on" : "OFF", sc.index_heads, sc.index_stride, o.dense_mb, o.lm_head_mb, o.draft_mb, o.drafts, o.draft_dist.c_str(),
    [&] {
      std::ostringstream os;
      for (std::size_t i = 0; i < o.survival.size(); ++i) { os << (i ? "/" : "") << o.survival[i]; }
      return os.str();
    }()
      .c_str(),
    o.spec_length == "controller" ? "chosen per request and step by speculation_controller (cost fitted per run)"
                                  : "fixed",
    su.fetch == fetch_kind::fused ? "fused (resolve_and_retrieve)"
    : su.fetch == fetch_kind::split ? "split (resolve, retrieve)"
                                    : "layered (layer 0 first, the rest on a side stream)",
    o.latency_bound_ms, templates->source.c_str());
  std::printf("assumptions: %s\n", out.assumptions.c_str());
  std::printf("hierarchy: miss plans %s; backup grid %s\n",
              o.order_plans < 0 ? "gathered as emitted"
                                : ("ordered by host address from " + std::to_string(o.order_plans) + " entries").c_str(),
              o.backup_blocks == 0 ? "64 blocks per group" : (std::to_string(o.backup_blocks) + " blocks").c_str());
  std::printf("device memory: %.1f GiB of slabs per run + %.1f GiB of benchmark buffers\n", gib(slab_bytes),
              gib(double(buffer_bytes)));
  print_header();

  bool resident_capped = false;
  for (int c : sc.concurrency) {
    for (mode m : o.modes) {
      bool const spec = m == mode::adaptive_spec;
      int const q     = spec ? su.qmax : 1;
      run_config rc;
      rc.m         = m;
      rc.requested = c;
      rc.queries   = q;
      rc.spec      = spec;
      rc.served    = served_for(su, m, c, q, su.pool_slots);
      if (rc.served == 0) {
        std::printf("%-4s %-14s %5d: no request fits the pool\n", sc.name.c_str(), mode_name(m), c);
        continue;
      }
      if (rc.served < c) {
        if (m == mode::resident && resident_capped) { continue; }
        if (m == mode::resident) { resident_capped = true; }
      }
      run_result r = dispatch(su, *db, rc);
      if (rc.served < c) {
        r.note = "capped by HBM: " + std::to_string(rc.served) + " of " + std::to_string(c) + " requests fit";
      }
      out.m.push_back(compute(su, r));
      print_row(su, r, out.m.back());
      if (r.controlled) { std::printf("     %s\n", controller_text(r).c_str()); }
      out.results.push_back(std::move(r));
    }
  }
  std::printf("phases (eager, serialized, ms per step of the simulated layers):\n");
  for (auto const& r : out.results) {
    std::printf("  %-14s C=%-4d %s\n", mode_name(r.rc.m), r.rc.served, phases_text(r).c_str());
  }
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  release_buffers(*db);  // before the next scenario allocates its own
  return out;
}

// ---------------------------------------------------------------------------------------
// Summary: largest concurrency under the bound, target ratios.
// ---------------------------------------------------------------------------------------
struct target_line {
  std::string scenario, name;
  double value = NAN, published = NAN, target = NAN;
  std::string detail;
};

std::vector<target_line> summarize(options const& o, std::vector<scenario_outcome> const& all, json_report& js)
{
  std::vector<target_line> targets;
  for (auto const& so : all) {
    auto const& name = so.su.sc.name;
    std::map<mode, int> best;
    for (std::size_t i = 0; i < so.results.size(); ++i) {
      auto const& r = so.results[i];
      if (so.m[i].p99_token_full <= o.latency_bound_ms) { best[r.rc.m] = std::max(best[r.rc.m], r.rc.served); }
    }
    std::printf("\nscenario %s: largest concurrency with p99 per-token latency <= %.1f ms (full model):", name.c_str(),
                o.latency_bound_ms);
    for (mode m : o.modes) {
      std::printf("  %s %d", mode_name(m), best[m]);
      js.add_record();
      js.field("kind", "max_concurrency");
      js.field("scenario", name);
      js.field("mode", mode_name(m));
      js.field("latency_bound_ms", o.latency_bound_ms);
      js.field("max_concurrency", double(best[m]));
    }
    std::printf("\n");
    auto find = [&](mode m, int c) -> metrics const* {  // c < 0: the largest served
      metrics const* hit = nullptr;
      int most           = -1;
      for (std::size_t i = 0; i < so.results.size(); ++i) {
        auto const& r = so.results[i];
        if (r.rc.m != m) { continue; }
        if (c >= 0 && r.rc.requested == c) { return &so.m[i]; }
        if (c < 0 && r.rc.served > most) {
          most = r.rc.served;
          hit  = &so.m[i];
        }
      }
      return hit;
    };
    auto ratio = [&](metrics const* a, metrics const* b) {
      return a != nullptr && b != nullptr && b->tok_s_full > 0 ? a->tok_s_full / b->tok_s_full : NAN;
    };
    int const top = so.su.sc.concurrency.back();
    if (name == "A") {
      targets.push_back({name, "adaptive+spec / hisparse tokens/s, C = " + std::to_string(top),
                         ratio(find(mode::adaptive_spec, top), find(mode::hisparse, top)), 1.45, 1.6, ""});
      targets.push_back({name, "adaptive+spec / adaptive tokens/s, C = " + std::to_string(top),
                         ratio(find(mode::adaptive_spec, top), find(mode::adaptive, top)), 1.27, 1.35, ""});
      double const mc = best[mode::hisparse] > 0 ? double(best[mode::adaptive_spec]) / best[mode::hisparse] : NAN;
      targets.push_back({name, "max concurrency under the bound, adaptive+spec / hisparse", mc, 4.0, 4.0,
                         std::to_string(best[mode::adaptive_spec]) + " vs " + std::to_string(best[mode::hisparse]) +
                           (best[mode::adaptive_spec] == top ? " (adaptive+spec reached the top of the sweep)" : "")});
    }
    if (name == "B") {
      targets.push_back({name, "adaptive+spec (highest C) / resident (its highest C) tokens/s",
                         ratio(find(mode::adaptive_spec, -1), find(mode::resident, -1)), 1.85, 2.0, ""});
    }
    targets.push_back({name, "adaptive / resident tokens/s, C = 8", ratio(find(mode::adaptive, 8), find(mode::resident, 8)),
                       0.92, 0.98, "published 0.92 is HiSparse's"});
  }
  std::printf("\n%-3s %-62s %8s %9s %7s %s\n", "scn", "target", "measured", "published", "target", "");
  for (auto const& t : targets) {
    bool const met = !std::isnan(t.value) && t.value >= t.target;
    std::printf("%-3s %-62s %8.3f %9.2f %7.2f %s %s\n", t.scenario.c_str(), t.name.c_str(), t.value, t.published,
                t.target, std::isnan(t.value) ? "n/a" : met ? "met" : "NOT met", t.detail.c_str());
    js.add_record();
    js.field("kind", "target");
    js.field("scenario", t.scenario);
    js.field("name", t.name);
    js.field("measured", std::isnan(t.value) ? -1.0 : t.value);
    js.field("published", t.published);
    js.field("target", t.target);
    js.field("met", met ? 1.0 : 0.0);
  }
  return targets;
}

// ---------------------------------------------------------------------------------------
// --check: every mode's attention outputs equal resident serving's, step by step.
// ---------------------------------------------------------------------------------------
int run_check(options const& given)
{
  options o      = given;
  o.steps        = 16;
  o.warmup       = 2;
  o.phase_steps  = 1;
  o.templates    = 4;
  o.dense_mb     = 8;
  o.lm_head_mb   = 8;
  o.draft_mb     = 8;
  o.vocab        = 32000;
  device_buffers db;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&db.stream, cudaStreamNonBlocking));
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&db.side, cudaStreamNonBlocking));

  scenario_setup su;
  su.opt           = &o;
  su.sc.name       = "check";
  su.sc.model      = "check: FP8-656 rows, K = 1024, 2 groups of 2 layers, 12K context, 4 requests";
  su.sc.top_k      = 1024;
  su.sc.group_layers = 2;
  su.sc.layers_sim = 4;
  su.sc.layers_full = 4;
  su.sc.context    = 12000;
  su.sc.heads      = 64;
  su.max_c         = 4;
  su.qmax          = 1 + o.drafts;
  su.groups        = 2;
  su.fetch         = o.fetch_for(su.sc.group_layers);
  su.check         = true;
  su.salt          = 0x5EEDull + o.seed;
  su.index_heads   = 64;
  su.hash_capacity = 1 + o.warmup + o.steps + o.phase_steps;
  su.tokens_per_request = std::int64_t(su.hash_capacity) * su.qmax + su.qmax;
  su.page_bytes    = std::size_t(tokens_per_page) * su.sc.layers_sim * row_bytes;
  auto templates   = make_drift_templates(o.templates, su.groups, su.sc.context, su.sc.top_k, su.tokens_per_request,
                                          o.seed);
  su.templates     = &templates;
  su.len0.assign(4, su.sc.context);
  su.max_capacity  = std::int32_t(su.sc.context + su.tokens_per_request);
  std::size_t const per_request =
    std::size_t((su.max_capacity + tokens_per_page - 1) / tokens_per_page + 1) * su.page_bytes;
  pinned_memory host(per_request * su.max_c, false, 0);
  su.host_memory = host.p;
  su.host_bytes  = host.bytes;
  build_buffers(su, db, p_draft_of(o));

  std::int64_t const backed = backed_capacity(su.max_capacity, su.max_capacity);
  auto pool_for = [&](mode m, int q) -> std::int64_t {
    switch (m) {
      case mode::resident:
        return 4 * request_floor<policy::resident_budget>(backed, q, su.sc.top_k, backup_interval_for(true, su)) + 64;
      case mode::hisparse: return 4 * 4096 + 64;
      default: return 4 * request_floor<adaptive_b>(backed, q, su.sc.top_k, 1) + 6000;  // < live KV: reclaims
    }
  };
  struct check_run {
    char const* name;
    mode m;
    bool spec;
    run_result r;
  };
  std::vector<check_run> runs = {{"resident", mode::resident, false, {}},
                                 {"hisparse", mode::hisparse, false, {}},
                                 {"adaptive", mode::adaptive, false, {}},
                                 {"resident+spec", mode::resident, true, {}},
                                 {"adaptive+spec", mode::adaptive_spec, true, {}}};
  bool ok = true;
  for (auto& cr : runs) {
    scenario_setup s2 = su;
    int const q       = cr.spec ? su.qmax : 1;
    s2.pool_slots     = pool_for(cr.m, q);
    run_config rc;
    rc.m = cr.m, rc.requested = 4, rc.served = 4, rc.queries = q, rc.spec = cr.spec;
    cr.r = dispatch(s2, db, rc);
    std::printf("%-14s pool %7lld  fetched %8llu  evicted %7llu  reclaimed %7llu  tokens %5llu  status %s\n", cr.name,
                static_cast<long long>(s2.pool_slots), cr.r.fetched, cr.r.evicted, cr.r.reclaimed, cr.r.tokens,
                status_text(cr.r).c_str());
    if (status_text(cr.r) != "ok") { ok = false; }
  }
  auto same = [&](check_run const& a, check_run const& b) {
    bool eq = a.r.hashes == b.r.hashes && a.r.all_step_tokens == b.r.all_step_tokens;
    std::printf("%-14s vs %-14s: %zu steps, attention outputs of every layer %s\n", a.name, b.name, a.r.hashes.size(),
                eq ? "identical" : "DIFFER");
    if (!eq) {
      for (std::size_t i = 0; i < std::min(a.r.hashes.size(), b.r.hashes.size()); ++i) {
        if (a.r.hashes[i] != b.r.hashes[i] || a.r.all_step_tokens[i] != b.r.all_step_tokens[i]) {
          std::printf("  first difference at step %zu (tokens %d vs %d)\n", i, a.r.all_step_tokens[i],
                      b.r.all_step_tokens[i]);
          break;
        }
      }
    }
    return eq;
  };
  ok = same(runs[0], runs[1]) && ok;
  ok = same(runs[0], runs[2]) && ok;
  ok = same(runs[3], runs[4]) && ok;
  // The check must have exercised the hierarchy: fetches, evictions, reclaims, acceptance.
  auto expect = [&](bool cond, char const* what) {
    if (!cond) { std::printf("not exercised: %s\n", what); }
    ok = ok && cond;
  };
  expect(runs[1].r.fetched > 0 && runs[1].r.evicted > 0, "hisparse fetched and evicted rows");
  expect(runs[2].r.fetched > 0 && runs[2].r.reclaimed > 0, "adaptive fetched and reclaimed rows");
  expect(runs[4].r.fetched > 0 && runs[4].r.reclaimed > 0, "adaptive+spec fetched and reclaimed rows");
  unsigned long long const steps = static_cast<unsigned long long>(o.steps) * 4;
  expect(runs[4].r.tokens > steps && runs[4].r.tokens < steps * unsigned(su.qmax),
         "speculation accepted some but not all drafts");
  std::printf("check: %s\n", ok ? "PASS" : "FAIL");
  cudaStreamDestroy(db.stream);
  cudaStreamDestroy(db.side);
  return ok ? 0 : 1;
}

int run(int argc, char** argv)
{
  options const o = options::parse(argc, argv);
  if (o.plan) {
    for (auto const& name : o.scenarios) { run_scenario(o, name, nullptr); }
    return 0;
  }
  int devices     = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("serving benchmark: skipped: no CUDA device\n");
    return 0;
  }
  std::printf("serving benchmark on %s (%s)%s\n", device_name().c_str(), today().c_str(), o.quick ? ", quick" : "");
  if (o.check) { return run_check(o); }

  device_buffers db;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&db.stream, cudaStreamNonBlocking));
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&db.side, cudaStreamNonBlocking));
  double const memcpy_gbps = measure_h2d_memcpy_gbps(std::size_t(1) << 30, db.stream);
  std::printf("pinned host->device memcpy: %.1f GB/s (the PCIe limit of this run)\n", memcpy_gbps);

  json_report js("serving");
  js.set("date", today());
  js.set("device", device_name());
  js.set("h2d_memcpy_gbps", memcpy_gbps);
  js.set("quick", o.quick ? 1.0 : 0.0);
  js.set("latency_bound_ms", o.latency_bound_ms);
  js.set("steps", double(o.steps));
  js.set("order_plans_min_entries", double(o.order_plans));  // -1: plans gathered as emitted
  js.set("backup_blocks", double(o.backup_blocks));
  std::vector<scenario_outcome> all;
  for (auto const& name : o.scenarios) {
    all.push_back(run_scenario(o, name, &db));
    auto const& so = all.back();
    js.set("assumptions_" + so.su.sc.name, so.assumptions);
    for (std::size_t i = 0; i < so.results.size(); ++i) {
      auto const& r = so.results[i];
      auto const& m = so.m[i];
      js.add_record();
      js.field("kind", "run");
      js.field("scenario", so.su.sc.name);
      js.field("mode", mode_name(r.rc.m));
      js.field("concurrency", double(r.rc.requested));
      js.field("served", double(r.rc.served));
      js.field("queries", double(r.rc.queries));
      js.field("tokens_per_s", m.tok_s_full);
      js.field("tokens_per_s_sim", m.tok_s_sim);
      js.field("fetch_fraction", m.fetch_fraction);
      js.field("p50_ms", m.p50_full);
      js.field("p99_ms", m.p99_full);
      js.field("p50_ms_sim", m.p50_sim);
      js.field("p99_ms_sim", m.p99_sim);
      js.field("p50_token_ms", m.p50_token_full);
      js.field("p99_token_ms", m.p99_token_full);
      js.field("accepted_len", m.accepted_len);
      js.field("pcie_h2d_gbps", m.h2d_gbps);
      js.field("pcie_d2h_gbps", m.d2h_gbps);
      js.field("pcie_bytes_per_token", m.pcie_bytes_per_token_full);
      js.field("layers_ms_sim", m.layers_ms);
      js.field("step_ms", m.step_ms);
      js.field("selected_rows", double(r.selected));
      js.field("fetched_rows", double(r.fetched));
      js.field("evicted_rows", double(r.evicted));
      js.field("reclaimed_rows", double(r.reclaimed));
      js.field("reclaims", double(r.reclaims));
      js.field("backed_up_rows", double(r.backed_up));
      if (r.union_steps > 0) {
        js.field("union_probe_steps", double(r.union_steps));
        js.field("union_fetched_rows", double(r.union_fetched));
        js.field("per_query_missed_rows", double(r.per_query_missed));
        js.field("union_saving",
                 r.per_query_missed > 0 ? 1.0 - double(r.union_fetched) / double(r.per_query_missed) : 0.0);
        js.field("union_resolve_fetched_rows", double(r.union_resolve_fetched));
      }
      if (r.controlled) {
        js.field("controller_mean_drafts", r.mean_drafts);
        for (std::size_t k = 0; k < r.shape_ms.size(); ++k) {
          js.field("controller_shape_ms_" + std::to_string(k), r.shape_ms[k]);
          js.field("controller_shape_ms_end_" + std::to_string(k), r.shape_ms_end[k]);
          js.field("controller_steps_" + std::to_string(k), double(r.shape_steps[k]));
        }
      }
      js.field("tokens", double(r.tokens));
      js.field("steps", double(r.layers_ms.size()));
      js.field("setup_s", r.setup_s);
      for (auto const& [label, ms] : r.phases) { js.field("phase_" + label + "_ms", ms); }
      js.field("status", status_text(r));
      if (!r.note.empty()) { js.field("note", r.note); }
    }
  }
  summarize(o, all, js);
  js.write(o.json_path);
  return 0;
}

}  // namespace
}  // namespace dhisparse::bench::serving

int main(int argc, char** argv)
{
  try {
    return dhisparse::bench::serving::run(argc, argv);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "serving benchmark: error: %s\n", e.what());
    return 1;
  }
}
