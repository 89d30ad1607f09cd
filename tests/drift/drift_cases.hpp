/**
 * @file drift_cases.hpp
 * @brief Random small drift workloads and the selection contract, for the drift tests.
 */
#pragma once

#include <common/drift.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace dhisparse::test {

/// A small random workload: both regimes (fewer positions than K, and more), Q ≥ 1, B ≥ 1.
inline bench::drift_config random_drift_config(std::mt19937_64& rng)
{
  bench::drift_config c;
  c.top_k    = std::uniform_int_distribution<int>(c.sinks + c.window, 400)(rng);
  c.context  = std::uniform_int_distribution<std::int32_t>(1, 3 * c.top_k)(rng);
  c.dim      = std::uniform_int_distribution<int>(8, 64)(rng);
  c.topics   = std::uniform_int_distribution<int>(4, 64)(rng);
  c.segment_mean = std::uniform_real_distribution<double>(4, 64)(rng);
  c.requests = std::uniform_int_distribution<int>(1, 3)(rng);
  c.queries  = std::uniform_int_distribution<int>(1, 4)(rng);
  c.drift    = std::uniform_real_distribution<double>(0.0, 0.2)(rng);
  c.jump     = std::uniform_real_distribution<double>(0.0, 0.5)(rng);
  c.verify_drift = std::uniform_real_distribution<double>(0.0, 0.1)(rng);
  c.seed     = rng();
  return c;
}

/// Random accepted counts in [0, Q] for every request.
inline std::vector<std::int32_t> random_accepted(std::mt19937_64& rng, bench::drift_config const& c)
{
  std::vector<std::int32_t> a(c.requests);
  for (auto& x : a) { x = std::uniform_int_distribution<std::int32_t>(0, c.queries)(rng); }
  return a;
}

/**
 * @brief Checks the selection of query `q` of request `b` in `gen`'s current step: K
 *        entries, min(K, limit + 1) distinct ascending positions in [0, limit] then -1;
 *        the sinks and the window present; the rest the best scores (ties: lower
 *        position) of the positions between them; `scores` q·k of each entry.
 */
inline void check_selection_contract(bench::drift_generator const& gen, int b, int q, std::int32_t const* sel,
                                     float const* scores)
{
  auto const& c            = gen.config();
  std::int32_t const limit = gen.length(b) + q;
  std::int32_t const want  = std::min<std::int32_t>(c.top_k, limit + 1);
  INFO("request " << b << " query " << q << " limit " << limit << " K " << c.top_k);
  for (std::int32_t e = 0; e < c.top_k; ++e) {
    INFO("entry " << e);
    if (e < want) {
      REQUIRE(sel[e] >= 0);
      REQUIRE(sel[e] <= limit);
      if (e > 0) { REQUIRE(sel[e - 1] < sel[e]); }
    } else {
      REQUIRE(sel[e] == -1);
    }
  }
  std::vector<char> chosen(std::size_t(limit) + 1, 0);
  for (std::int32_t e = 0; e < want; ++e) { chosen[sel[e]] = 1; }
  for (std::int32_t p = 0; p < std::min(c.sinks, limit + 1); ++p) { REQUIRE(chosen[p]); }
  for (std::int32_t p = std::max(0, limit - c.window + 1); p <= limit; ++p) { REQUIRE(chosen[p]); }
  // Top scores: every selected scored position ranks above every unselected one.
  std::int32_t const sink_end     = std::min(c.sinks, limit + 1);
  std::int32_t const window_begin = std::max(sink_end, limit + 1 - c.window);
  std::uint64_t worst_in = ~std::uint64_t{0}, best_out = 0;
  bool any_in = false, any_out = false;
  for (std::int32_t p = sink_end; p < window_begin; ++p) {
    std::uint64_t const key =
      bench::drift_rank_key(bench::drift_dot(gen.step_query(b, q), gen.keys(b) + std::size_t(p) * c.dim, c.dim), p);
    if (chosen[p]) {
      worst_in = std::min(worst_in, key);
      any_in   = true;
    } else {
      best_out = std::max(best_out, key);
      any_out  = true;
    }
  }
  if (any_in && any_out) { REQUIRE(worst_in > best_out); }
  if (want < c.top_k) { REQUIRE_FALSE(any_out); }  // everything is selected
  if (scores != nullptr) {
    for (std::int32_t e = 0; e < c.top_k; ++e) {
      float const expect = sel[e] < 0 ? 0.0f
                                      : float(bench::drift_dot(gen.step_query(b, q),
                                                               gen.keys(b) + std::size_t(sel[e]) * c.dim, c.dim)) *
                                          bench::drift_score_unit;
      REQUIRE(scores[e] == expect);
    }
  }
}

}  // namespace dhisparse::test
