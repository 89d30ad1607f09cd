/**
 * @file bench/common/drift.hpp
 * @brief The standard selection workload ("drift trace", BENCH.md): topic-segmented
 *        index keys, a drifting query with jumps, and sinks + local window + top scores.
 *
 * Plain C++ (no CUDA needed). Every residency study runs on this workload so that results
 * are comparable; docs/trace.md defines it precisely and records how the defaults of
 * `drift_config::drift` and `drift_config::jump` were calibrated.
 *
 * Reproducibility: one seed gives the same trace bit for bit. Random bits come from
 * explicitly seeded `std::mt19937_64` engines (whose output the C++ standard fixes), and
 * the uniform, Gaussian and Zipf samplers are our own, so nothing depends on a standard
 * library's distribution classes. Keys and queries are rounded to 16-bit fixed point
 * (`drift_fixed_one` = 1.0) and scored with exact integer dot products, so the order of
 * the summation cannot change a selection: the GPU version (drift_gpu.cuh) makes the
 * same selections as this one.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse::bench {

/// Fixed-point scale of keys and queries: a component x is stored as round(x · 4096).
inline constexpr int drift_fixed_one = 4096;
/// Exact integer scores are q·k in units of 2^-24 (`drift_fixed_one`²).
inline constexpr float drift_score_unit = 1.0f / float(drift_fixed_one) / float(drift_fixed_one);

/// @brief Exact score of two fixed-point vectors of `d` components, in `drift_score_unit`s.
DHISPARSE_HOST_DEVICE inline std::int32_t drift_dot(std::int16_t const* a, std::int16_t const* b, int d)
{
  std::int32_t s = 0;
  for (int i = 0; i < d; ++i) { s += std::int32_t(a[i]) * std::int32_t(b[i]); }
  return s;
}

/// @brief Total order of scored candidates as one 64-bit key: a higher score first, then
///        the lower position (the larger key wins).
DHISPARSE_HOST_DEVICE inline std::uint64_t drift_rank_key(std::int32_t score, std::int32_t position)
{
  return (std::uint64_t(std::uint32_t(score) ^ 0x80000000u) << 32) | std::uint32_t(~std::uint32_t(position));
}

/// @brief The position a `drift_rank_key` was made from.
DHISPARSE_HOST_DEVICE inline std::int32_t drift_rank_position(std::uint64_t key)
{
  return std::int32_t(~std::uint32_t(key));
}

/**
 * @brief Parameters of the drift workload. The defaults are the standard workload
 *        (BENCH.md) with the calibrated drift ε and jump probability j (docs/trace.md).
 */
struct drift_config {
  std::int32_t context = 100000;  ///< N: tokens of each request's context before step 0
  int top_k            = 2048;    ///< K: positions selected per query
  int dim              = 64;      ///< d: index key dimension
  int topics           = 256;     ///< T: topic centres
  double segment_mean  = 256.0;   ///< mean length of a topic segment (geometric)
  double zipf_exponent = 1.1;     ///< topics of segments are Zipf(s) over the T topics
  double key_noise     = 0.6;     ///< key = normalize(centre + key_noise · noise)
  double drift         = 0.03;    ///< ε: per step q ← normalize(q + ε · noise)
  double jump          = 0.03;    ///< j: probability per step of q ← normalize(q/2 + c/2)
  double verify_drift  = 0.03;    ///< drift from verify query i-1 to query i (Q > 1)
  int sinks            = 4;       ///< positions 0 .. sinks-1 are always selected
  int window           = 64;      ///< the last `window` positions are always selected
  int requests         = 1;       ///< B: independent requests (own random streams)
  int queries          = 1;       ///< Q: queries per request and step (consecutive positions)
  std::uint64_t seed   = 1;       ///< the whole trace is a function of the seed

  /// Throws `dhisparse::error` naming the first invalid field.
  void validate() const
  {
    DHISPARSE_EXPECTS(context > 0, "drift_config.context must be positive");
    DHISPARSE_EXPECTS(dim > 0 && topics > 0, "drift_config.dim and .topics must be positive");
    DHISPARSE_EXPECTS(sinks >= 0 && window >= 1, "drift_config: sinks >= 0 and window >= 1");
    DHISPARSE_EXPECTS(top_k >= sinks + window,
                      "drift_config.top_k (" + std::to_string(top_k) + ") must hold the sinks and the window (" +
                        std::to_string(sinks + window) + ")");
    DHISPARSE_EXPECTS(requests > 0 && queries > 0, "drift_config.requests and .queries must be positive");
    DHISPARSE_EXPECTS(queries <= window, "drift_config.queries must not exceed the window");
    DHISPARSE_EXPECTS(segment_mean >= 1.0, "drift_config.segment_mean must be at least 1");
    DHISPARSE_EXPECTS(jump >= 0.0 && jump <= 1.0, "drift_config.jump must be a probability");
    DHISPARSE_EXPECTS(drift >= 0.0 && verify_drift >= 0.0 && key_noise >= 0.0,
                      "drift_config: drift, verify_drift and key_noise must be non-negative");
  }
};

/// splitmix64: derives independent engine seeds from (seed, stream).
inline std::uint64_t drift_mix(std::uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/**
 * @brief A seeded random stream with its own samplers: uniform doubles from the top 53
 *        bits of `std::mt19937_64`, Gaussians by Marsaglia's polar method.
 */
class drift_random {
 public:
  /// @param seed the trace seed  @param stream independent stream number (0: topic centres)
  drift_random(std::uint64_t seed, std::uint64_t stream) : engine_{drift_mix(seed ^ drift_mix(stream))} {}

  /// Uniform in [0, 1).
  double uniform() { return double(engine_() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  int below(int n) { return std::min(n - 1, int(uniform() * n)); }
  /// Standard normal.
  double gaussian()
  {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u = 0, v = 0, s = 0;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double const m = std::sqrt(-2.0 * std::log(s) / s);
    spare_         = v * m;
    has_spare_     = true;
    return u * m;
  }

 private:
  std::mt19937_64 engine_;
  double spare_   = 0.0;
  bool has_spare_ = false;
};

/**
 * @brief The drift workload on the CPU: B requests, each with its own context, query and
 *        random stream; every step selects K positions for each of the Q queries.
 *
 * A step is `next` (draw the queries, append their tail keys, select) followed by
 * `commit` (keep the accepted tail tokens). Query i of request b sits at position
 * `length(b) + i` and selects among positions 0 .. length(b) + i. Not thread-safe.
 */
class drift_generator {
 public:
  /// Builds the topic centres and every request's context (O(B · N · d) Gaussians).
  explicit drift_generator(drift_config config) : config_{std::move(config)}
  {
    config_.validate();
    int const d = config_.dim;
    drift_random centre_rng(config_.seed, 0);
    centres_.resize(std::size_t(config_.topics) * d);
    for (int t = 0; t < config_.topics; ++t) {
      random_unit(centre_rng, &centres_[std::size_t(t) * d]);
    }
    // Zipf CDF over topic ranks (topic 0 is the most frequent).
    zipf_cdf_.resize(config_.topics);
    double sum = 0.0;
    for (int t = 0; t < config_.topics; ++t) {
      sum += std::pow(double(t + 1), -config_.zipf_exponent);
      zipf_cdf_[t] = sum;
    }
    for (double& c : zipf_cdf_) { c /= sum; }

    std::vector<double> v(d);
    requests_.reserve(config_.requests);
    for (int b = 0; b < config_.requests; ++b) {
      requests_.emplace_back(drift_random(config_.seed, std::uint64_t(b) + 1));
      auto& rq = requests_.back();
      rq.keys.resize(std::size_t(config_.context) * d);
      int topic = zipf_topic(rq.rng);
      for (std::int32_t p = 0; p < config_.context; ++p) {
        if (p > 0 && rq.rng.uniform() < 1.0 / config_.segment_mean) { topic = zipf_topic(rq.rng); }
        noisy_centre(rq.rng, topic, config_.key_noise, v.data());
        quantize(v.data(), &rq.keys[std::size_t(p) * d]);
      }
      rq.length = config_.context;
      // The query starts near a random topic (as close as a key of that topic).
      noisy_centre(rq.rng, rq.rng.below(config_.topics), config_.key_noise, v.data());
      rq.query = v;
      rq.step_queries.assign(std::size_t(config_.queries) * d, 0.0);
      rq.step_fixed.assign(std::size_t(config_.queries) * d, 0);
    }
  }

  /// @brief The workload's parameters.
  [[nodiscard]] drift_config const& config() const noexcept { return config_; }
  /// @brief Committed tokens of request `b` (its query 0 sits at this position).
  [[nodiscard]] std::int32_t length(int b) const { return requests_.at(b).length; }
  /// @brief Keys of request `b`, [length(b) (+ queries during a step)][dim], fixed point.
  [[nodiscard]] std::int16_t const* keys(int b) const { return requests_.at(b).keys.data(); }
  /// @brief Query `q` of request `b` in the current step, [dim], fixed point.
  [[nodiscard]] std::int16_t const* step_query(int b, int q) const
  {
    return &requests_.at(b).step_fixed[std::size_t(q) * config_.dim];
  }
  /// @brief Whether `next` (or `begin_step`) ran and `commit` did not yet.
  [[nodiscard]] bool in_step() const noexcept { return in_step_; }

  /**
   * @brief One step's selections on the CPU: `begin_step`, then `select` for every query.
   * @param selections out: int32 [B][Q][K], each query's positions ascending, -1 padded
   *        only where fewer than K positions exist
   * @param scores out (optional): float [B][Q][K], q·k of each selected position, 0 for -1
   */
  void next(std::int32_t* selections, float* scores = nullptr)
  {
    begin_step();
    std::size_t const k = std::size_t(config_.top_k);
    for (int b = 0; b < config_.requests; ++b) {
      for (int q = 0; q < config_.queries; ++q) {
        std::size_t const row = (std::size_t(b) * config_.queries + q) * k;
        select(b, q, selections + row, scores != nullptr ? scores + row : nullptr);
      }
    }
  }

  /**
   * @brief Draws the step's queries and appends their tail keys: for every request,
   *        q ← normalize(q + ε·noise), with probability j q ← normalize(q/2 + c/2) for a
   *        uniformly drawn topic centre c; query i > 0 is normalize(q_{i-1} + ε_v·noise).
   *        The token at position length + i gets key normalize(c_i + 0.6·noise), c_i the
   *        centre nearest to query i.
   */
  void begin_step()
  {
    DHISPARSE_EXPECTS(!in_step_, "drift_generator: commit the previous step first");
    int const d = config_.dim;
    std::vector<double> v(d);
    for (auto& rq : requests_) {
      add_noise(rq.rng, config_.drift, rq.query.data());
      if (rq.rng.uniform() < config_.jump) {
        double const* c = &centres_[std::size_t(rq.rng.below(config_.topics)) * d];
        for (int i = 0; i < d; ++i) { rq.query[i] = 0.5 * rq.query[i] + 0.5 * c[i]; }
        normalize(rq.query.data());
      }
      rq.keys.resize(std::size_t(rq.length + config_.queries) * d);
      for (int q = 0; q < config_.queries; ++q) {
        double* sq = &rq.step_queries[std::size_t(q) * d];
        if (q == 0) {
          std::copy(rq.query.begin(), rq.query.end(), sq);
        } else {
          std::copy(sq - d, sq, sq);
          add_noise(rq.rng, config_.verify_drift, sq);
        }
        quantize(sq, &rq.step_fixed[std::size_t(q) * d]);
        noisy_centre(rq.rng, nearest_topic(sq), config_.key_noise, v.data());
        quantize(v.data(), &rq.keys[std::size_t(rq.length + q) * d]);
      }
    }
    in_step_ = true;
  }

  /**
   * @brief Selection of query `q` of request `b` in the current step: the sinks, the
   *        highest scores of the positions between sinks and window (ties: lower position
   *        first), the window of the last positions up to length + q; ascending.
   * @param out int32 [K]
   * @param scores float [K] or nullptr
   */
  void select(int b, int q, std::int32_t* out, float* scores)
  {
    DHISPARSE_EXPECTS(in_step_, "drift_generator::select: no step in progress");
    auto const& rq        = requests_.at(b);
    std::int16_t const* x = step_query(b, q);
    auto const bounds     = selection_bounds(rq.length + q);
    // Candidates: 64-bit keys ordered by (score, then lower position), largest first.
    candidates_.clear();
    for (std::int32_t p = bounds.sink_end; p < bounds.window_begin; ++p) {
      candidates_.push_back(drift_rank_key(drift_dot(x, &rq.keys[std::size_t(p) * config_.dim], config_.dim), p));
    }
    auto const top = candidates_.begin() + bounds.top;
    std::nth_element(candidates_.begin(), top, candidates_.end(), std::greater<>());
    int k = 0;
    for (std::int32_t p = 0; p < bounds.sink_end; ++p) { out[k++] = p; }
    for (auto it = candidates_.begin(); it != top; ++it) { out[k++] = drift_rank_position(*it); }
    std::sort(out + bounds.sink_end, out + k);
    for (std::int32_t p = bounds.window_begin; p <= rq.length + q; ++p) { out[k++] = p; }
    for (int i = k; i < config_.top_k; ++i) { out[i] = -1; }
    if (scores != nullptr) {
      for (int i = 0; i < config_.top_k; ++i) {
        scores[i] = out[i] < 0 ? 0.0f
                               : float(drift_dot(x, &rq.keys[std::size_t(out[i]) * config_.dim], config_.dim)) *
                                   drift_score_unit;
      }
    }
  }

  /**
   * @brief Ends the step: request b keeps the tail tokens of its first `accepted[b]`
   *        queries (nullptr: all Q) and continues from the query of its last kept position
   *        (query 0 if it kept none).
   */
  void commit(std::int32_t const* accepted = nullptr)
  {
    DHISPARSE_EXPECTS(in_step_, "drift_generator::commit: no step in progress");
    int const d = config_.dim;
    for (int b = 0; b < config_.requests; ++b) {
      std::int32_t const a = accepted != nullptr ? accepted[b] : config_.queries;
      DHISPARSE_EXPECTS(a >= 0 && a <= config_.queries,
                        "drift_generator::commit: accepted[" + std::to_string(b) + "] = " + std::to_string(a) +
                          " is not in [0, queries]");
    }
    for (int b = 0; b < config_.requests; ++b) {
      auto& rq             = requests_[b];
      std::int32_t const a = accepted != nullptr ? accepted[b] : config_.queries;
      double const* last   = &rq.step_queries[std::size_t(std::max(a, 1) - 1) * d];
      std::copy(last, last + d, rq.query.begin());
      rq.length += a;
      rq.keys.resize(std::size_t(rq.length) * d);
    }
    in_step_ = false;
  }

  /// Where a query's selection parts lie, for a query at position `limit`.
  struct bounds {
    std::int32_t sink_end;      ///< sinks: [0, sink_end)
    std::int32_t window_begin;  ///< window: [window_begin, limit]; scored: [sink_end, window_begin)
    std::int32_t top;           ///< how many scored positions are selected
  };
  /// @brief The parts of the selection of a query at position `limit` (inclusive).
  [[nodiscard]] bounds selection_bounds(std::int32_t limit) const
  {
    std::int32_t const total = limit + 1;
    bounds r{};
    r.sink_end     = std::min<std::int32_t>(config_.sinks, total);
    r.window_begin = std::max<std::int32_t>(r.sink_end, total - config_.window);
    r.top = std::min<std::int32_t>(config_.top_k - r.sink_end - (total - r.window_begin), r.window_begin - r.sink_end);
    return r;
  }

 private:
  struct request_state {
    explicit request_state(drift_random r) : rng{r} {}
    drift_random rng;
    std::vector<std::int16_t> keys;  // [length (+ Q in a step)][d]
    std::int32_t length = 0;
    std::vector<double> query;         // the query the next step drifts from
    std::vector<double> step_queries;  // [Q][d]
    std::vector<std::int16_t> step_fixed;
  };

  int zipf_topic(drift_random& rng) const
  {
    auto const it = std::upper_bound(zipf_cdf_.begin(), zipf_cdf_.end(), rng.uniform());
    return std::min(int(it - zipf_cdf_.begin()), config_.topics - 1);
  }
  void normalize(double* v) const
  {
    double n = 0.0;
    for (int i = 0; i < config_.dim; ++i) { n += v[i] * v[i]; }
    n = std::sqrt(n);
    if (n == 0.0) { return; }
    for (int i = 0; i < config_.dim; ++i) { v[i] /= n; }
  }
  void random_unit(drift_random& rng, double* v) const
  {
    for (int i = 0; i < config_.dim; ++i) { v[i] = rng.gaussian(); }
    normalize(v);
  }
  void add_noise(drift_random& rng, double scale, double* v) const
  {
    for (int i = 0; i < config_.dim; ++i) { v[i] += scale * rng.gaussian(); }
    normalize(v);
  }
  void noisy_centre(drift_random& rng, int topic, double scale, double* v) const
  {
    double const* c = &centres_[std::size_t(topic) * config_.dim];
    std::copy(c, c + config_.dim, v);
    add_noise(rng, scale, v);
  }
  int nearest_topic(double const* q) const
  {
    int best         = 0;
    double best_score = -2.0;
    for (int t = 0; t < config_.topics; ++t) {
      double s        = 0.0;
      double const* c = &centres_[std::size_t(t) * config_.dim];
      for (int i = 0; i < config_.dim; ++i) { s += q[i] * c[i]; }
      if (s > best_score) {
        best_score = s;
        best       = t;
      }
    }
    return best;
  }
  void quantize(double const* v, std::int16_t* out) const
  {
    for (int i = 0; i < config_.dim; ++i) { out[i] = std::int16_t(std::lround(v[i] * drift_fixed_one)); }
  }

  drift_config config_;
  std::vector<double> centres_;  // [T][d], unit vectors
  std::vector<double> zipf_cdf_;
  std::vector<request_state> requests_;
  std::vector<std::uint64_t> candidates_;
  bool in_step_ = false;
};

}  // namespace dhisparse::bench
