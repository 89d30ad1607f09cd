/**
 * @file bench/serving/indexer_bench.cu
 * @brief bench_indexer: the serving benchmark's indexer stand-in (kernels.hpp) alone.
 *
 * For each configuration (C requests, Q queries each, L keys per request, heads) it builds
 * a batch in device memory, times launch_indexer_scores and launch_indexer_topk separately
 * (CUDA events, median after warm-up) and prints µs, the key bytes read per second against
 * the HBM copy bandwidth measured in the same run, and the int8 tera-operations per second
 * of the scores. It checks the results: sampled scores against a host computation of
 * Σ_h w_h · relu(q_h · k_t) (exact integer dot products, relative tolerance 1e-5), scores
 * past each row's keys left untouched, and top-K rows holding exactly the K best keys
 * (ties at the K-th score may be any of the equal ones). Prints PASS / FAIL; exits 1 on a
 * failure.
 *
 * usage: bench_indexer [--old] [--small] [--only scores|topk] [--reps N] [--json FILE]
 *   --old    also time the previous kernels (launch_*_baseline), checking their scores
 *   --small  small, uneven batches (lengths, queries, index_stride > 1), few repetitions:
 *            for compute-sanitizer
 *   --only   launch only the scores kernel, or time and check only the top-K (the scores
 *            kernel still runs once to give it its input): one kernel per sanitizer run
 */
#include "kernels.hpp"

#include <common/bench.cuh>

#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace dhisparse;
using namespace dhisparse::bench::serving;

struct config {
  int requests;      ///< C
  int queries;       ///< Q (most per request)
  int keys;          ///< L: keys of the longest request
  int heads;
  int index_stride;  ///< positions per key
  int top_k;
  bool uneven;       ///< lengths and queries vary per request
};

struct cli {
  bool old   = false;
  bool small = false;
  bool scores = true;  ///< time and check the scores kernel
  bool topk   = true;  ///< run, time and check the top-K kernel
  int reps   = 20;
  int warmup = 3;
  std::string json_path;
};

cli parse(int argc, char** argv)
{
  cli c;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--old") {
      c.old = true;
    } else if (a == "--small") {
      c.small = true;
    } else if (a == "--only" && i + 1 < argc && (std::strcmp(argv[i + 1], "scores") == 0 ||
                                                  std::strcmp(argv[i + 1], "topk") == 0)) {
      c.scores = std::strcmp(argv[++i], "scores") == 0;
      c.topk   = !c.scores;
    } else if (a == "--reps" && i + 1 < argc) {
      c.reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      c.json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--old] [--small] [--only scores|topk] [--reps N] [--json FILE]\n", argv[0]);
      std::exit(2);
    }
  }
  if (c.small) { c.reps = std::min(c.reps, 3), c.warmup = 1; }
  return c;
}

template <class T>
T* device_alloc(std::size_t n)
{
  void* p = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

template <class T>
void upload(T* dst, std::vector<T> const& src)
{
  DHISPARSE_CUDA_TRY(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

/// One configuration's buffers, host mirrors of the small ones and the batch view.
struct problem {
  config cfg{};
  std::vector<std::int32_t> lengths, nq;  // per request: positions, queries
  std::vector<std::int64_t> base;         // first key row of request b
  std::vector<std::int8_t> host_queries;  // [C][Q][heads][128]
  std::vector<float> host_weights;        // [heads]
  std::int64_t rows_per_request = 0, score_stride = 0;
  std::int32_t max_tokens = 0;
  std::int32_t* d_size = nullptr;
  std::int32_t* d_requests = nullptr;
  std::int32_t* d_queries = nullptr;
  std::int32_t* d_lengths = nullptr;
  std::int64_t* d_base = nullptr;
  std::int8_t* keys = nullptr;
  std::int8_t* queries = nullptr;
  float* weights = nullptr;
  float* scores = nullptr;
  std::int32_t* topk = nullptr;
  step_batch_ref batch{};

  std::int32_t keys_of(int b) const  // keys the scores kernel covers
  {
    return (lengths[std::size_t(b)] + nq[std::size_t(b)] + cfg.index_stride - 1) / cfg.index_stride;
  }
  std::int32_t keys_of(int b, int q) const  // keys up to query q's position (top-K)
  {
    return (lengths[std::size_t(b)] + q + cfg.index_stride) / cfg.index_stride;
  }
  std::size_t score_elems() const { return std::size_t(cfg.requests) * cfg.queries * std::size_t(score_stride); }

  explicit problem(config const& c, cudaStream_t s) : cfg(c)
  {
    int const C = c.requests, Q = c.queries;
    std::mt19937_64 rng(0x5EED0000u + std::uint64_t(C) * 131u + std::uint64_t(Q) * 7u + std::uint64_t(c.keys));
    max_tokens = c.keys * c.index_stride;  // positions of the longest request
    for (int b = 0; b < C; ++b) {
      int const q      = c.uneven ? 1 + int(rng() % std::uint64_t(Q)) : Q;
      int const tokens = c.uneven ? max_tokens - int(rng() % std::uint64_t(max_tokens / 2)) : max_tokens;
      nq.push_back(q);
      lengths.push_back(tokens - q);
    }
    rows_per_request = (max_tokens + c.index_stride - 1) / c.index_stride + 16;
    score_stride     = (rows_per_request + 3) / 4 * 4;
    for (int b = 0; b < C; ++b) { base.push_back(std::int64_t(b) * rows_per_request); }
    std::vector<std::int32_t> requests(static_cast<std::size_t>(C));
    for (int b = 0; b < C; ++b) { requests[std::size_t(b)] = b; }

    d_size     = device_alloc<std::int32_t>(1);
    d_requests = device_alloc<std::int32_t>(std::size_t(C));
    d_queries  = device_alloc<std::int32_t>(std::size_t(C));
    d_lengths  = device_alloc<std::int32_t>(std::size_t(C));
    d_base     = device_alloc<std::int64_t>(std::size_t(C));
    upload(d_size, std::vector<std::int32_t>{C});
    upload(d_requests, requests);
    upload(d_queries, nq);
    upload(d_lengths, lengths);
    upload(d_base, base);

    std::size_t const key_bytes = std::size_t(C) * std::size_t(rows_per_request) * index_dim;
    keys = device_alloc<std::int8_t>(key_bytes);
    launch_fill_words(reinterpret_cast<std::uint64_t*>(keys), key_bytes / 8, rng(), ~0ull, 0, s);
    host_queries.resize(std::size_t(C) * Q * c.heads * index_dim);
    for (auto& v : host_queries) { v = std::int8_t(rng() & 0xFF); }
    queries = device_alloc<std::int8_t>(host_queries.size());
    upload(queries, host_queries);
    std::uniform_real_distribution<float> wd(0.5f, 1.5f);
    for (int h = 0; h < c.heads; ++h) { host_weights.push_back(wd(rng) / float(c.heads)); }
    weights = device_alloc<float>(host_weights.size());
    upload(weights, host_weights);
    scores = device_alloc<float>(score_elems());
    topk   = device_alloc<std::int32_t>(std::size_t(C) * Q * c.top_k);

    batch.size        = d_size;
    batch.requests    = d_requests;
    batch.queries     = d_queries;
    batch.lengths     = d_lengths;
    batch.capacities  = d_lengths;
    batch.floors      = d_lengths;
    batch.caps        = d_lengths;
    batch.max_batch   = C;
    batch.max_queries = Q;
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
  }
  problem(problem const&)            = delete;
  problem& operator=(problem const&) = delete;
  ~problem()
  {
    for (void* p : {static_cast<void*>(d_size), static_cast<void*>(d_requests), static_cast<void*>(d_queries),
                    static_cast<void*>(d_lengths), static_cast<void*>(d_base), static_cast<void*>(keys),
                    static_cast<void*>(queries), static_cast<void*>(weights), static_cast<void*>(scores),
                    static_cast<void*>(topk)}) {
      cudaFree(p);
    }
  }

  void poison(cudaStream_t s) const
  {
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(scores, 0xFF, score_elems() * sizeof(float), s));  // NaN
    DHISPARSE_CUDA_TRY(
      cudaMemsetAsync(topk, 0x7F, std::size_t(cfg.requests) * cfg.queries * cfg.top_k * sizeof(std::int32_t), s));
  }
  void scores_async(bool old, cudaStream_t s) const
  {
    (old ? launch_indexer_scores_baseline : launch_indexer_scores)(batch, keys, d_base, queries, weights, cfg.heads,
                                                                   cfg.index_stride, scores, score_stride,
                                                                   max_tokens, s);
  }
  void topk_async(bool old, cudaStream_t s) const
  {
    (old ? launch_indexer_topk_baseline : launch_indexer_topk)(batch, scores, score_stride, cfg.index_stride,
                                                               cfg.top_k, topk, s);
  }
  double key_bytes() const
  {
    double v = 0;
    for (int b = 0; b < cfg.requests; ++b) { v += double(keys_of(b)) * index_dim; }
    return v;
  }
  double int8_ops() const
  {
    double v = 0;
    for (int b = 0; b < cfg.requests; ++b) { v += 2.0 * nq[std::size_t(b)] * double(keys_of(b)) * cfg.heads * index_dim; }
    return v;
  }
  double score_bytes_read() const  // what one top-K pass reads at least
  {
    double v = 0;
    for (int b = 0; b < cfg.requests; ++b) {
      for (int q = 0; q < nq[std::size_t(b)]; ++q) { v += 4.0 * keys_of(b, q); }
    }
    return v;
  }

  float score_at(int b, int q, std::int64_t t) const
  {
    float v = 0;
    DHISPARSE_CUDA_TRY(cudaMemcpy(&v, scores + (std::int64_t(b) * cfg.queries + q) * score_stride + t, sizeof v,
                                  cudaMemcpyDeviceToHost));
    return v;
  }

  /// Σ_h w_h · relu(q_h · k_t), exact dot products, in double.
  double reference(int b, int q, std::int64_t t) const
  {
    std::int8_t key[index_dim];
    DHISPARSE_CUDA_TRY(cudaMemcpy(key, keys + (base[std::size_t(b)] + t) * index_dim, index_dim, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int h = 0; h < cfg.heads; ++h) {
      std::int8_t const* qh = host_queries.data() + ((std::size_t(b) * cfg.queries + q) * cfg.heads + h) * index_dim;
      std::int64_t dot      = 0;
      for (int d = 0; d < index_dim; ++d) { dot += std::int64_t(qh[d]) * key[d]; }
      sum += double(host_weights[std::size_t(h)]) * double(std::max<std::int64_t>(dot, 0));
    }
    return sum;
  }
};

/// Sampled scores against the host; untouched scores past each row's keys. Returns failures.
int check_scores(problem const& p, int samples, std::mt19937_64& rng)
{
  int bad = 0, shown = 0;
  auto fail = [&](char const* what, int b, int q, std::int64_t t, double got, double want) {
    ++bad;
    if (shown++ < 8) { std::printf("    %s at (b %d, q %d, t %lld): got %.9g, want %.9g\n", what, b, q, (long long)t, got, want); }
  };
  int const C = p.cfg.requests;
  for (int i = 0; i < samples; ++i) {
    int const b          = int(rng() % std::uint64_t(C));
    int const q          = int(rng() % std::uint64_t(p.nq[std::size_t(b)]));
    std::int32_t const n = p.keys_of(b);
    std::int64_t const t = i % 8 == 0 ? n - 1 : i % 8 == 1 ? 0 : std::int64_t(rng() % std::uint64_t(n));
    double const want    = p.reference(b, q, t);
    double const got     = p.score_at(b, q, t);
    if (!(std::fabs(got - want) <= 1e-5 * std::fabs(want))) { fail("score", b, q, t, got, want); }
  }
  for (int b = 0; b < C; ++b) {  // past the keys, and rows of queries the request does not have
    for (int q = 0; q < p.cfg.queries; ++q) {
      std::int64_t const t = q < p.nq[std::size_t(b)] ? p.keys_of(b) : 0;
      if (t < p.score_stride) {
        float const v = p.score_at(b, q, t);
        if (!std::isnan(v)) { fail("written past the keys", b, q, t, v, NAN); }
      }
    }
  }
  return bad;
}

/// Top-K rows of a few (b, q): exactly the K best keys (any of the ties at the K-th).
int check_topk(problem const& p, std::mt19937_64& rng)
{
  int bad   = 0;
  int const C = p.cfg.requests, K = p.cfg.top_k;
  std::vector<std::pair<int, int>> rows = {{0, 0}, {C - 1, p.nq[std::size_t(C - 1)] - 1}};
  for (int i = 0; i < 3; ++i) {
    int const b = int(rng() % std::uint64_t(C));
    rows.emplace_back(b, int(rng() % std::uint64_t(p.nq[std::size_t(b)])));
  }
  for (auto [b, q] : rows) {
    std::int32_t const n = p.keys_of(b, q);
    std::vector<float> s(static_cast<std::size_t>(n));
    std::vector<std::int32_t> out(static_cast<std::size_t>(K));
    std::int64_t const row = std::int64_t(b) * p.cfg.queries + q;
    DHISPARSE_CUDA_TRY(cudaMemcpy(s.data(), p.scores + row * p.score_stride, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
    DHISPARSE_CUDA_TRY(cudaMemcpy(out.data(), p.topk + row * K, out.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    std::string why;
    std::vector<char> seen(static_cast<std::size_t>(n), 0);
    int const expect = std::min<std::int32_t>(K, n);
    for (int i = 0; i < K && why.empty(); ++i) {
      std::int32_t const e = out[std::size_t(i)];
      if (i >= expect) {
        if (e != -1) { why = "entry " + std::to_string(i) + " should be -1"; }
      } else if (e < 0 || e >= n) {
        why = "entry " + std::to_string(i) + " = " + std::to_string(e) + " is not a key of the row";
      } else if (seen[std::size_t(e)]++) {
        why = "key " + std::to_string(e) + " twice";
      }
    }
    if (why.empty() && n > K) {
      std::vector<float> sorted = s;
      std::nth_element(sorted.begin(), sorted.begin() + (K - 1), sorted.end(), std::greater<float>());
      float const kth = sorted[std::size_t(K - 1)];
      std::int64_t above_all = 0, above_out = 0;
      for (float v : s) { above_all += v > kth; }
      for (int i = 0; i < K && why.empty(); ++i) {
        float const v = s[std::size_t(out[std::size_t(i)])];
        if (v < kth) { why = "key " + std::to_string(out[std::size_t(i)]) + " scores below the K-th best"; }
        above_out += v > kth;
      }
      if (why.empty() && above_out != above_all) {
        why = std::to_string(above_all - above_out) + " keys above the K-th best are missing";
      }
    }
    if (!why.empty()) {
      ++bad;
      std::printf("    top-K of (b %d, q %d), %d keys: %s\n", b, q, n, why.c_str());
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv)
{
  using dhisparse::bench::median;
  cli const opt = parse(argc, argv);
  int devices   = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_indexer: skipped: no CUDA device\n");
    return 0;
  }
  cudaStream_t s = nullptr;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::vector<config> configs;
  if (opt.small) {
    configs = {{3, 3, 5000, 32, 1, 64, true},
               {5, 8, 9000, 64, 3, 2048, true},
               {2, 1, 3000, 64, 1, 2048, true},
               {4, 2, 1100, 64, 1, 2048, true}};  // fewer keys than K in every row
  } else {
    configs = {{8, 1, 500000, 64, 1, 2048, false},
               {8, 8, 500000, 64, 1, 2048, false},
               {128, 1, 100000, 64, 1, 2048, false},
               {128, 8, 100000, 64, 1, 2048, false},
               {32, 4, 100000, 32, 1, 2048, false},
               {32, 4, 100000, 64, 4, 2048, true}};  // a compressed indexer (one key per 4 positions)
  }
  double const hbm = opt.small ? 0.0 : dhisparse::bench::measure_d2d_copy_gbps(std::size_t(1) << 30, s);
  std::printf("bench_indexer on %s: HBM copy %.0f GB/s (read + write); int8 mma.sync peak ~990 TOPS, wgmma ~1980 "
              "(H100/H200 SXM datasheet rates, not measured)\n",
              dhisparse::bench::device_name().c_str(), hbm);
  std::printf("%-8s %4s %3s %7s %5s %6s %3s | %10s %8s %7s %5s | %9s %8s | %s\n", "kernels", "C", "Q", "L", "heads",
              "stride", "K", "scores us", "key GB/s", "TOPS", "%HBM", "top-K us", "GB/s", "check");
  dhisparse::bench::json_report report("indexer");
  report.set("device", dhisparse::bench::device_name());
  report.set("date", dhisparse::bench::today());
  report.set("hbm_copy_gbps", hbm);
  std::mt19937_64 rng(20261204);
  int failures = 0;
  for (config const& c : configs) {
    problem p(c, s);
    prepare_indexer(c.heads, c.queries);
    for (int pass = 0; pass < (opt.old ? 2 : 1); ++pass) {
      bool const old = pass == 1;
      p.poison(s);
      p.scores_async(old, s);
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
      int bad = opt.scores ? check_scores(p, opt.small ? 400 : 600, rng) : 0;
      if (opt.topk) {
        p.topk_async(old, s);
        DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
        if (!old) { bad += check_topk(p, rng); }  // the baseline's top-K is a threshold bin, not exact
      }
      auto const timed = [&](bool run, auto&& launch) {
        return run ? median(dhisparse::bench::time_ms(s, opt.warmup, opt.reps, [&](int) { launch(); })) * 1e-3 : NAN;
      };
      double const ts = timed(opt.scores, [&] { p.scores_async(old, s); });
      double const tk = timed(opt.topk, [&] { p.topk_async(old, s); });
      double const gbps = p.key_bytes() / ts * 1e-9;
      char const* verdict = bad == 0 ? (old ? "PASS (scores only)" : "PASS") : "FAIL";
      std::printf("%-8s %4d %3d %7d %5d %6d %3d | %10.1f %8.0f %7.1f %5.0f | %9.1f %8.0f | %s\n", old ? "old" : "new",
                  c.requests, c.queries, c.keys, c.heads, c.index_stride, c.top_k, ts * 1e6, gbps,
                  p.int8_ops() / ts * 1e-12, hbm > 0 ? 100.0 * gbps / hbm : 0.0, tk * 1e6,
                  p.score_bytes_read() / tk * 1e-9, verdict);
      std::fflush(stdout);
      failures += bad != 0;
      report.add_record();
      report.field("kernels", old ? "old" : "new");
      report.field("requests", c.requests), report.field("queries", c.queries), report.field("keys", c.keys);
      report.field("heads", c.heads), report.field("index_stride", c.index_stride), report.field("top_k", c.top_k);
      report.field("scores_us", ts * 1e6), report.field("key_gbps", gbps);
      report.field("int8_tops", p.int8_ops() / ts * 1e-12), report.field("topk_us", tk * 1e6);
      report.field("check", bad == 0 ? "pass" : "fail");
    }
  }
  if (!opt.json_path.empty()) { report.write(opt.json_path); }
  cudaStreamDestroy(s);
  std::printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
