/**
 * @file policy/clock.cuh
 * @brief CLOCK (second chance): per request a hand walks its slots in order; a row
 *        selected since the hand last passed it is spared once (its reference bit is
 *        cleared), the first unreferenced rows are evicted. Victim search costs in
 *        proportion to the rows the hand passes, not to the rows a request owns.
 *
 * State: bit 0 = referenced, bits 1… = epoch of the last selection. A global reclaim
 * (shared budgets) orders rows by `eviction_key`: unreferenced rows first, older first.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

namespace dhisparse::policy {

/// @brief CLOCK / second-chance eviction (see the file comment).
struct clock : eviction_defaults {
  static constexpr victim_search search = victim_search::sweep;

  DHISPARSE_HOST_DEVICE static constexpr policy_state on_insert(selection_context c) noexcept
  {
    return (policy_state{c.epoch} << 1) | 1u;
  }
  DHISPARSE_HOST_DEVICE static constexpr policy_state on_hit(policy_state, selection_context c) noexcept
  {
    return (policy_state{c.epoch} << 1) | 1u;
  }
  DHISPARSE_HOST_DEVICE static constexpr bool referenced(policy_state s) noexcept { return (s & 1u) != 0; }
  DHISPARSE_HOST_DEVICE static constexpr policy_state clear_reference(policy_state s) noexcept
  {
    return s & ~policy_state{1};
  }
  DHISPARSE_HOST_DEVICE static constexpr std::uint64_t eviction_key(policy_state s, std::int32_t) noexcept
  {
    return ((s & 1u) << 40) | (s >> 1);
  }
};

}  // namespace dhisparse::policy
