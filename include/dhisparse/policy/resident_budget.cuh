/**
 * @file policy/resident_budget.cuh
 * @brief Every position a request can reach stays on the device once it was fetched or
 *        written: plain resident serving through the same API (the host store still
 *        receives every committed row). The contract of budget policies is in
 *        policy/concepts.hpp.
 *
 * floor = the request's capacity plus the essential extras (tail slots kept for reuse),
 * cap = unlimited; admission refuses requests whose capacity the pool cannot hold, so
 * nothing is ever evicted or reclaimed.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

#include <cstdint>

namespace dhisparse::policy {

/// @brief Floors = whole capacities; never evicts (see the file comment).
struct resident_budget {
  static constexpr budget_kind kind      = budget_kind::shared;
  static constexpr reclaim_order reclaim = reclaim_order::none;

  static constexpr std::int64_t floor(budget_inputs in) noexcept
  {
    return in.capacity + std::int64_t(in.max_queries) * 2;
  }
  static constexpr std::int64_t cap(budget_inputs) noexcept { return unlimited_slots; }
};

}  // namespace dhisparse::policy
