/**
 * @file policy/lfu_decay.cuh
 * @brief Least frequently used with exponential decay: each query that selects a row adds one to its
 *        count, and counts halve every `HalfLife` steps; the row whose decayed count is
 *        smallest goes first.
 *
 * The key must not depend on the current epoch (policy/concepts.hpp), so the policy keeps,
 * instead of the count itself, the epoch at which the decayed count falls to one:
 * `expiry = last + HalfLife · log2(count at last)`. Comparing expiries compares decayed
 * counts at any later time. Everything is integer arithmetic (log2 in 1/256 steps), so
 * the host reference and the GPU agree bit for bit.
 *
 * State: bits 0–31 = count at the last selection in 1/65536 units (saturating),
 * bits 32–63 = epoch of the last selection.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

#include <cstdint>

namespace dhisparse::policy {

/// @brief LFU with counts halving every `HalfLife` steps (see the file comment).
template <std::uint32_t HalfLife = 32>
struct lfu_decay : eviction_defaults {
  static_assert(HalfLife > 0 && HalfLife < (1u << 16), "lfu_decay<HalfLife>: HalfLife in [1, 65535]");
  static constexpr bool counts_selections = true;
  static constexpr std::uint32_t one      = 1u << 16;  // a count of 1

  DHISPARSE_HOST_DEVICE static constexpr policy_state pack(std::uint32_t count, std::uint32_t epoch) noexcept
  {
    return (policy_state{epoch} << 32) | count;
  }
  /// log2(x / 65536) · 256 for x ≥ 65536 (integer part from the highest bit, 8 fraction
  /// bits by linear interpolation).
  DHISPARSE_HOST_DEVICE static constexpr std::uint32_t log2_q8(std::uint32_t x) noexcept
  {
    int msb = 31;
    while (msb > 0 && ((x >> msb) & 1u) == 0) { --msb; }
    std::uint32_t const frac = msb >= 8 ? (x >> (msb - 8)) & 0xFFu : (x << (8 - msb)) & 0xFFu;
    return (std::uint32_t(msb - 16) << 8) | frac;
  }
  /// count · 2^(-elapsed / HalfLife), with whole halvings by shift and the remainder
  /// linear between them.
  DHISPARSE_HOST_DEVICE static constexpr std::uint32_t decayed(std::uint32_t count, std::uint32_t elapsed) noexcept
  {
    std::uint32_t const halvings = elapsed / HalfLife;
    if (halvings >= 32) { return 0; }
    std::uint64_t const c    = count >> halvings;
    std::uint64_t const part = elapsed % HalfLife;
    return std::uint32_t(c - (c * part) / (2 * HalfLife));
  }
  /// One per query that selected the row (a tail or prewarmed row counts one).
  DHISPARSE_HOST_DEVICE static constexpr std::uint64_t added(selection_context c) noexcept
  {
    return std::uint64_t(c.selections > 0 ? c.selections : 1u) * one;
  }
  DHISPARSE_HOST_DEVICE static constexpr policy_state saturate(std::uint64_t count, std::uint32_t epoch) noexcept
  {
    return pack(count > 0xFFFFFFFFull ? 0xFFFFFFFFu : std::uint32_t(count), epoch);
  }
  DHISPARSE_HOST_DEVICE static constexpr policy_state on_insert(selection_context c) noexcept
  {
    return saturate(added(c), c.epoch);
  }
  DHISPARSE_HOST_DEVICE static constexpr policy_state on_hit(policy_state s, selection_context c) noexcept
  {
    std::uint32_t const last = std::uint32_t(s >> 32);
    return saturate(std::uint64_t(decayed(std::uint32_t(s), c.epoch - last)) + added(c), c.epoch);
  }
  /// Epoch (in 1/256 steps) at which the decayed count reaches one.
  DHISPARSE_HOST_DEVICE static constexpr std::uint64_t eviction_key(policy_state s, std::int32_t) noexcept
  {
    std::uint32_t const count = std::uint32_t(s) < one ? one : std::uint32_t(s);
    return ((s >> 32) << 8) + std::uint64_t(log2_q8(count)) * HalfLife;
  }
};

}  // namespace dhisparse::policy
