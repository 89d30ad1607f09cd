/**
 * @file bench/common/drift_lru.hpp
 * @brief The calibration measurement of the drift workload: the fraction of selected rows
 *        a HiSparse-style fixed buffer fetches from host (plain C++, host reference).
 *
 * The buffer is `host::kv_hierarchy<row_format::opaque<16>, policy::lru,
 * policy::static_budget<4096>>`: 4096 rows per request, exact LRU with ties broken by the
 * lower position, each step's tail rows inserted (and backed up at once).
 */
#pragma once

#include "drift.hpp"

#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host/hierarchy.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dhisparse::bench {

/// What `measure_lru_fetch` counted after the warm-up.
struct lru_fetch {
  std::uint64_t fetched  = 0;    ///< rows the buffer fetched from host
  std::uint64_t selected = 0;    ///< selected positions (tail rows included)
  double generator_s     = 0.0;  ///< time spent in the generator (context and steps)
  double steps_s         = 0.0;  ///< of which in `next` over all steps
};

/**
 * @brief Runs `warmup + steps` steps of the workload `c` through the LRU buffer.
 * @param c the workload (all its requests share the run; queries commit in full)
 * @param warmup steps run before counting
 * @param steps steps counted
 */
inline lru_fetch measure_lru_fetch(drift_config const& c, int warmup, int steps)
{
  using clock   = std::chrono::steady_clock;
  auto const t0 = clock::now();
  drift_generator gen(c);
  lru_fetch out;
  out.generator_s = std::chrono::duration<double>(clock::now() - t0).count();

  std::int64_t const capacity = std::int64_t(c.context) + std::int64_t(warmup + steps + 1) * c.queries;
  hierarchy_config hc;
  hc.max_requests           = c.requests;
  hc.max_batch              = c.requests;
  hc.max_queries            = c.queries;
  hc.max_top_k              = c.top_k;
  hc.max_context            = std::int32_t(capacity);
  hc.device_slots_per_group = std::int64_t(4096) * c.requests;
  hc.backup_interval_steps  = 1;
  hc.host.capacity_pages    = std::size_t((capacity + 63) / 64) * c.requests;
  host::kv_hierarchy<row_format::opaque<16>, policy::lru, policy::static_budget<4096>> buffer(hc);
  std::vector<request_id> ids;
  for (int b = 0; b < c.requests; ++b) {
    ids.push_back(request_id(b + 1));
    buffer.admit(ids.back(), gen.length(b), capacity);
  }
  std::vector<std::int32_t> const queries(c.requests, c.queries);
  std::vector<std::int32_t> selections(std::size_t(c.requests) * c.queries * c.top_k);
  for (int s = 0; s < warmup + steps; ++s) {
    auto const t = clock::now();
    gen.next(selections.data());
    out.steps_s += std::chrono::duration<double>(clock::now() - t).count();
    buffer.set_batch(ids.data(), queries.data(), c.requests);
    buffer.resolve(0, selections.data(), c.top_k);
    if (s >= warmup) {
      out.fetched += buffer.misses(0).size();
      for (std::int32_t p : selections) { out.selected += p >= 0 ? 1 : 0; }
    }
    buffer.retrieve(0);
    buffer.commit(nullptr);
    buffer.backup();
    gen.commit();
    DHISPARSE_EXPECTS(buffer.status() == 0,
                      "measure_lru_fetch: the LRU buffer raised status " + std::to_string(buffer.status()));
  }
  out.generator_s += out.steps_s;
  return out;
}

}  // namespace dhisparse::bench
