/**
 * @file policy/lru.cuh
 * @brief Least-recently-used eviction: the slot whose row was last selected longest ago
 *        goes first (HiSparse's policy).
 *
 * ## Eviction policy contract
 * An eviction policy is a struct with three `static` `DHISPARSE_HOST_DEVICE` hooks over a
 * 32-bit per-slot state (checked by `dhisparse::is_eviction_policy_v`):
 * - `std::uint32_t on_insert(std::uint32_t epoch)`: state of a row just brought in (a miss
 *   or a tail row) at step `epoch`;
 * - `std::uint32_t on_hit(std::uint32_t state, std::uint32_t epoch)`: state after the row
 *   was selected again; called once per slot and step, whatever the number of queries
 *   that selected it;
 * - `std::uint64_t eviction_key(std::uint32_t state, std::int32_t position)`: priority,
 *   the smallest key is evicted first. Keys must be below 2^63 and distinct among one
 *   request's rows of a group: mix the position in (positions are below 2^31).
 * Epochs count the steps of a layer group from 1; they are the clock of time-based
 * policies. Rows that are pinned (selected in the current step) or dirty (not yet backed
 * up) are never offered for eviction, whatever their key.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cstdint>

namespace dhisparse::policy {

/// @brief Least recently used first; ties within one step broken by the lower position.
struct lru {
  DHISPARSE_HOST_DEVICE static constexpr std::uint32_t on_insert(std::uint32_t epoch) noexcept
  {
    return epoch;
  }
  DHISPARSE_HOST_DEVICE static constexpr std::uint32_t on_hit(std::uint32_t,
                                                               std::uint32_t epoch) noexcept
  {
    return epoch;
  }
  DHISPARSE_HOST_DEVICE static constexpr std::uint64_t eviction_key(std::uint32_t state,
                                                                    std::int32_t position) noexcept
  {
    return (std::uint64_t{state} << 31) | std::uint32_t(position);
  }
};

}  // namespace dhisparse::policy
