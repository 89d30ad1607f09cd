/**
 * @file policy/adaptive_budget.cuh
 * @brief Load-adaptive residency: each request is guaranteed its essential set, and keeps
 *        every other row it touched (optional residency) while the pool has free slots.
 *        When a step needs more free slots than there are, a device-side reclaim releases
 *        clean, unpinned optional rows at once — no copy: the host store holds every
 *        committed row exactly. The contract of budget policies is in policy/concepts.hpp.
 *
 * floor = `essential_floor` (one step's selections, tails, rows not yet backed up),
 * cap = unlimited. `Order` chooses which optional rows go first:
 * - `reclaim_order::global`: the smallest eviction keys over all requests (with LRU: the
 *   rows unused longest anywhere);
 * - `reclaim_order::fair_share`: from the requests furthest above their floor (water
 *   filling), each giving its own smallest keys.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

#include <cstdint>

namespace dhisparse::policy {

/// @brief Floors = essential sets, no caps, global reclaim in `Order` (see the file comment).
template <reclaim_order Order = reclaim_order::global>
struct adaptive_budget {
  static_assert(Order != reclaim_order::none, "adaptive_budget: choose global or fair_share");
  static constexpr budget_kind kind      = budget_kind::shared;
  static constexpr reclaim_order reclaim = Order;

  static constexpr std::int64_t floor(budget_inputs in) noexcept { return essential_floor(in); }
  static constexpr std::int64_t cap(budget_inputs) noexcept { return unlimited_slots; }
};

}  // namespace dhisparse::policy
