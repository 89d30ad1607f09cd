/**
 * @file speculation_controller.hpp
 * @brief A load-aware speculation length: per request, how many drafts to verify in the
 *        next step, chosen from its running acceptance and the step's cost (plain C++, host
 *        side; its output is the `num_drafts` array `kv_hierarchy::set_drafts` and
 *        `verify_params::num_drafts` read).
 *
 * Model (docs/integration.md, "Choosing the speculation length"):
 * - each request b accepts each next draft of a chain with probability α_b, estimated from
 *   its own history: every verified chain with d drafts and a accepted is a successes and,
 *   if a < d, one failure; counts decay by `memory` per observation and start from
 *   `prior_acceptance` worth `prior_weight` observations. With d drafts the expected tokens
 *   of a step are E_b(d) = 1 + α_b + … + α_b^d;
 * - a step costs T = fixed + per_query · (queries) + per_fetched_row · (rows fetched), and a
 *   draft query adds `per_query + per_fetched_row · fetched_rows_per_query` (the engine
 *   measures the second term from the hierarchy's counters: the union of a request's queries
 *   fetches far less than K rows per extra query);
 * - pool pressure: when the device pool's occupancy is above `pressure_start`, every draft
 *   also pays `pressure_cost` times the share of the remaining headroom it would use (its
 *   tail row and its misses need slots that reclaim would have to free), so drafts shrink
 *   before the pool runs dry.
 * `choose` returns the d_b that maximize Σ_b E_b(d_b) / T: the increments α_b^k are
 * decreasing in k, so the best allocation of D drafts takes the D largest increments over
 * all requests; the best D is found by trying each (exact for this model; a test checks it
 * against brute force).
 *
 * Engines that replay one captured step per shape pad every request to the step's longest
 * chain: a step whose longest chain has k drafts costs `shape_cost[k]` whatever the other
 * requests draft, so the linear model above overstates what a short chain saves.
 * `choose_shape` takes the measured cost of each shape instead and picks one k for the step
 * (every request gets min(k, its limit) drafts: once the shape is paid for, more drafts add
 * tokens for free), maximizing Σ_b E_b(min(k, limit_b)) / cost(k); pool pressure scales the
 * drafts' share of the cost, shape_cost[k] − shape_cost[0], as it scales a draft query.
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/verify_params.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse {

/// Cost of one verify step in any time unit (µs), fitted by the engine from its timings.
struct step_cost_model {
  double fixed           = 0.0;  ///< per step: launches, weights, what does not scale with queries
  double per_query       = 1.0;  ///< per query: the model's and attention's work for one token
  double per_fetched_row = 0.0;  ///< per row fetched from host memory
};

/// Settings of a `speculation_controller`.
struct speculation_settings {
  int max_drafts          = 7;     ///< upper bound of every d_b (≤ max_queries − 1, ≤ max_verify_drafts)
  double prior_acceptance = 0.6;   ///< α of a request without history
  double prior_weight     = 4.0;   ///< … worth this many observations
  double memory           = 0.95;  ///< weight kept by the past at every observation (0, 1]
  step_cost_model cost;
  double pressure_start = 0.85;    ///< pool occupancy above which drafts pay for headroom
  double pressure_cost  = 4.0;     ///< extra cost (in units of a draft query) at a full pool
};

/// What `choose` knows about the coming step.
struct speculation_load {
  double fetched_rows_per_query = 0.0;  ///< rows an extra draft query fetches (measured, ≥ 0)
  double pool_occupancy         = 0.0;  ///< owned / limit of the device pool, ≥ 0 (above 1: full)
};

/**
 * @brief Per-request acceptance statistics and the speculation length that maximizes the
 *        expected tokens per unit of step time. Requests are addressed by a dense index
 *        (e.g. `kv_hierarchy::request_index`), below `max_requests`.
 */
class speculation_controller {
 public:
  speculation_controller(int max_requests, speculation_settings s) : s_{std::move(s)}
  {
    DHISPARSE_EXPECTS(max_requests > 0, "speculation_controller: max_requests must be positive");
    DHISPARSE_EXPECTS(s_.max_drafts >= 0 && s_.max_drafts <= max_verify_drafts,
                      "speculation_controller: max_drafts must be in [0, max_verify_drafts = 256]");
    DHISPARSE_EXPECTS(s_.prior_acceptance >= 0.0 && s_.prior_acceptance < 1.0,
                      "speculation_controller: prior_acceptance must be in [0, 1)");
    DHISPARSE_EXPECTS(s_.memory > 0.0 && s_.memory <= 1.0, "speculation_controller: memory must be in (0, 1]");
    DHISPARSE_EXPECTS(s_.prior_weight > 0.0, "speculation_controller: prior_weight must be positive");
    DHISPARSE_EXPECTS(s_.cost.per_query > 0.0 && s_.cost.fixed >= 0.0 && s_.cost.per_fetched_row >= 0.0 &&
                        std::isfinite(s_.cost.per_query) && std::isfinite(s_.cost.fixed) &&
                        std::isfinite(s_.cost.per_fetched_row),
                      "speculation_controller: costs must be finite and non-negative (per_query positive)");
    DHISPARSE_EXPECTS(s_.pressure_start >= 0.0 && s_.pressure_start < 1.0 && s_.pressure_cost >= 0.0 &&
                        std::isfinite(s_.pressure_cost),
                      "speculation_controller: pressure_start must be in [0, 1), pressure_cost finite and >= 0");
    stats_.assign(std::size_t(max_requests), fresh());
  }

  /// A new request in slot `r` (forgets what its predecessor taught).
  void reset(int r) { stats_.at(check(r)) = fresh(); }

  /// Verification of request r verified `drafted` chain drafts and accepted `accepted`.
  void observe(int r, int drafted, int accepted)
  {
    DHISPARSE_EXPECTS(drafted >= 0 && accepted >= 0 && accepted <= drafted,
                      "speculation_controller::observe: accepted must be in [0, drafted]");
    auto& st = stats_.at(check(r));
    if (drafted == 0) { return; }
    st.accepted = s_.memory * st.accepted + accepted;
    st.rejected = s_.memory * st.rejected + (accepted < drafted ? 1.0 : 0.0);
  }

  /// The running acceptance α of request r.
  [[nodiscard]] double acceptance(int r) const
  {
    auto const& st = stats_.at(check(r));
    return std::min(st.accepted / (st.accepted + st.rejected), 1.0 - 1e-9);
  }

  /// Expected tokens of a step of request r with d drafts: 1 + α + … + α^d.
  [[nodiscard]] double expected_tokens(int r, int d) const
  {
    double const a = acceptance(r);
    double sum = 1.0, term = 1.0;
    for (int k = 1; k <= d; ++k) { sum += term *= a; }
    return sum;
  }

  /// Cost of one draft query under `load` (a root query costs `cost.per_query`).
  [[nodiscard]] double draft_cost(speculation_load const& load) const
  {
    check(load);
    double const base = s_.cost.per_query + s_.cost.per_fetched_row * load.fetched_rows_per_query;
    double const over = std::clamp((load.pool_occupancy - s_.pressure_start) / (1.0 - s_.pressure_start), 0.0, 1.0);
    return base * (1.0 + s_.pressure_cost * over);
  }

  /// Expected step time of `n` requests with `drafts` drafts in all.
  [[nodiscard]] double step_time(int n, long drafts, speculation_load const& load) const
  {
    return step_time(n, drafts, load, draft_cost(load));
  }

  /**
   * @brief The drafts of each request of the coming step (`num_drafts[i]` for request
   *        `requests[i]`, i < n) that maximize expected tokens per unit of step time.
   * @param limit optional per-request upper bounds (nullptr: `max_drafts` for all)
   * @return the expected tokens per unit of time of the choice
   */
  double choose(std::int32_t const* requests, int n, speculation_load const& load, std::int32_t* num_drafts,
                std::int32_t const* limit = nullptr) const
  {
    DHISPARSE_EXPECTS(n >= 0 && (n == 0 || (requests != nullptr && num_drafts != nullptr)),
                      "speculation_controller::choose: requests and num_drafts must not be null");
    double const per_draft = draft_cost(load);  // checks the load; once, not per candidate D
    std::vector<std::pair<double, int>> increments;  // (α_b^k, i), every request's k = 1 … cap
    double tokens = 0.0;
    for (int i = 0; i < n; ++i) {  // (acceptance checks each request index before anything is written)
      int const cap = std::min(s_.max_drafts, limit != nullptr ? std::max(0, limit[i]) : s_.max_drafts);
      double const a = acceptance(requests[i]);
      double term    = 1.0;
      for (int k = 1; k <= cap; ++k) { increments.emplace_back(term *= a, i); }
      tokens += 1.0;
    }
    std::stable_sort(increments.begin(), increments.end(),
                     [](auto const& x, auto const& y) { return x.first > y.first; });
    double best      = n > 0 ? tokens / step_time(n, 0, load, per_draft) : 0.0;
    std::size_t take = 0;
    for (std::size_t D = 1; D <= increments.size(); ++D) {
      tokens += increments[D - 1].first;
      double const rate = tokens / step_time(n, long(D), load, per_draft);
      if (rate > best) {
        best = rate;
        take = D;
      }
    }
    std::fill(num_drafts, num_drafts + n, 0);
    for (std::size_t j = 0; j < take; ++j) { ++num_drafts[increments[j].second]; }
    return best;
  }

  /**
   * @brief The drafts of each request of the coming step when the step's cost is that of its
   *        longest chain (see the file comment): `num_drafts[i] = min(k, limit[i])` for the
   *        k < `shapes` that maximizes expected tokens per unit of step time.
   * @param shape_cost `[shapes]` cost of a step whose longest chain has k drafts (positive;
   *        measured by the engine, e.g. each captured graph's replay time)
   * @param shapes k = 0 … shapes − 1 (at most max_drafts + 1 are used)
   * @param limit optional per-request upper bounds (nullptr: `max_drafts` for all)
   * @return the expected tokens per unit of time of the choice
   */
  double choose_shape(std::int32_t const* requests, int n, double const* shape_cost, int shapes,
                      speculation_load const& load, std::int32_t* num_drafts, std::int32_t const* limit = nullptr) const
  {
    DHISPARSE_EXPECTS(n >= 0 && (n == 0 || (requests != nullptr && num_drafts != nullptr)),
                      "speculation_controller::choose_shape: requests and num_drafts must not be null");
    DHISPARSE_EXPECTS(shape_cost != nullptr && shapes >= 1,
                      "speculation_controller::choose_shape: shape_cost must hold at least one shape");
    for (int k = 0; k < shapes; ++k) {
      DHISPARSE_EXPECTS(shape_cost[k] > 0.0 && std::isfinite(shape_cost[k]),
                        "speculation_controller::choose_shape: shape costs must be positive and finite");
    }
    int const top = std::min(shapes - 1, s_.max_drafts);
    // Pressure: the drafts' share of the cost grows as in draft_cost.
    double const pressure = draft_cost(load) / (s_.cost.per_query + s_.cost.per_fetched_row * load.fetched_rows_per_query);
    auto cap_of = [&](int i) { return std::min(s_.max_drafts, limit != nullptr ? std::max(0, limit[i]) : s_.max_drafts); };
    double best = -1.0;
    int best_k  = 0;
    for (int k = 0; k <= top; ++k) {
      double tokens = 0.0;
      for (int i = 0; i < n; ++i) { tokens += expected_tokens(requests[i], std::min(k, cap_of(i))); }
      double const cost = shape_cost[0] + std::max(0.0, shape_cost[k] - shape_cost[0]) * pressure;
      double const rate = tokens / cost;
      if (rate > best) {
        best   = rate;
        best_k = k;
      }
    }
    for (int i = 0; i < n; ++i) { num_drafts[i] = std::min(best_k, cap_of(i)); }
    return n > 0 ? best : 0.0;
  }

  [[nodiscard]] speculation_settings const& settings() const noexcept { return s_; }

 private:
  struct request_stats {
    double accepted, rejected;
  };
  request_stats fresh() const
  {
    return {s_.prior_acceptance * s_.prior_weight, (1.0 - s_.prior_acceptance) * s_.prior_weight};
  }
  /// `step_time` with the load's draft cost already computed.
  double step_time(int n, long drafts, speculation_load const& load, double per_draft) const
  {
    return s_.cost.fixed + s_.cost.per_query * n + s_.cost.per_fetched_row * load.fetched_rows_per_query * n +
           per_draft * double(drafts);
  }
  /// A load the cost model can use: finite, non-negative fetched rows and occupancy.
  static void check(speculation_load const& load)
  {
    DHISPARSE_EXPECTS(std::isfinite(load.fetched_rows_per_query) && load.fetched_rows_per_query >= 0.0,
                      "speculation_controller: load.fetched_rows_per_query must be finite and >= 0");
    DHISPARSE_EXPECTS(std::isfinite(load.pool_occupancy) && load.pool_occupancy >= 0.0,
                      "speculation_controller: load.pool_occupancy must be finite and >= 0");
  }
  std::size_t check(int r) const
  {
    DHISPARSE_EXPECTS(r >= 0 && std::size_t(r) < stats_.size(),
                      "speculation_controller: request index " + std::to_string(r) + " out of range");
    return std::size_t(r);
  }

  speculation_settings s_;
  std::vector<request_stats> stats_;
};

}  // namespace dhisparse
