/**
 * @file policy/static_budget.cuh
 * @brief A fixed device budget of H slots per request and layer group (HiSparse's hot
 *        buffer): the baseline every adaptive policy is compared against.
 *
 * ## Budget policy contract
 * A budget policy is a struct with (checked by `dhisparse::is_budget_policy_v`):
 * - `static constexpr std::int32_t slots_per_request`: the most slots one request may own
 *   in one group, and the floor the pool must guarantee to every admitted request (the
 *   hierarchy refuses a pool smaller than `max_requests × slots_per_request`).
 * Misses are served from the free pool while the request owns fewer slots than its
 * budget, and by evicting the request's own rows (in the eviction policy's order) once it
 * owns its whole budget.
 */
#pragma once

#include <cstdint>

namespace dhisparse::policy {

/// @brief Exactly `H` device slots per request and group.
template <std::int32_t H>
struct static_budget {
  static_assert(H > 0, "static_budget<H>: H must be positive");
  static constexpr std::int32_t slots_per_request = H;
};

}  // namespace dhisparse::policy
