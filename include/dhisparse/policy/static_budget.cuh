/**
 * @file policy/static_budget.cuh
 * @brief A fixed device budget of H slots per request and layer group (HiSparse's hot
 *        buffer): the baseline every adaptive policy is compared against. The contract of
 *        budget policies is in policy/concepts.hpp.
 *
 * floor = cap = H. A request is served from the free pool until it owns H slots, then
 * evicts its own rows (in the eviction policy's order). H must cover the essential set of
 * the configuration (`essential_floor` at `max_context`): the hierarchy refuses a smaller
 * H at construction, so a step never runs out of slots.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

#include <cstdint>

namespace dhisparse::policy {

/// @brief Exactly `H` device slots per request and group.
template <std::int32_t H>
struct static_budget {
  static_assert(H > 0, "static_budget<H>: H must be positive");
  static constexpr budget_kind kind                 = budget_kind::per_request;
  static constexpr reclaim_order reclaim            = reclaim_order::none;
  static constexpr std::int32_t slots_per_request   = H;

  static constexpr std::int64_t floor(budget_inputs) noexcept { return H; }
  static constexpr std::int64_t cap(budget_inputs) noexcept { return H; }
};

}  // namespace dhisparse::policy
