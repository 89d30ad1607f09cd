/**
 * @file detail/resolve/common.cuh
 * @brief Device helpers shared by the resolve, reclaim and prewarm kernels: policy hook
 *        contexts, the per-step selection accumulators, the victim-cache threshold.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/dependent_launch.cuh>
#include <dhisparse/detail/warp_reduce.cuh>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/policy/concepts.hpp>

#include <cstdint>
#include <cstring>

namespace dhisparse::detail {

/// A float as an unsigned integer with the same order (0 is below every non-NaN float).
DHISPARSE_HOST_DEVICE inline std::uint32_t ordered_score(float s) noexcept
{
  std::uint32_t bits = 0;
  std::memcpy(&bits, &s, sizeof bits);
  return (bits >> 31) != 0 ? ~bits : bits | 0x80000000u;
}

/// Inverse of `ordered_score`; 0 (no score) reads as 0.
DHISPARSE_HOST_DEVICE inline float score_of(std::uint32_t ordered) noexcept
{
  if (ordered == 0) { return 0.f; }
  std::uint32_t const bits = (ordered >> 31) != 0 ? ordered & 0x7FFFFFFFu : ~ordered;
  float s                  = 0.f;
  std::memcpy(&s, &bits, sizeof s);
  return s;
}

#if defined(__CUDACC__)

/// Adds one selection (with its score) to a slot's per-step accumulators.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void accumulate_selection(device_pool_ref const& pool, std::int32_t slot,
                                                                 float score)
{
  atomicAdd(pool.sel_count + slot, 1u);
  atomicMax(pool.sel_score + slot, ordered_score(score));
}

/// The hook context of a slot from its accumulators, which it resets.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE selection_context take_selection(device_pool_ref const& pool,
                                                                        std::int32_t slot, std::uint32_t epoch,
                                                                        std::int32_t position)
{
  selection_context c{epoch, position, score_of(pool.sel_score[slot]), pool.sel_count[slot]};
  pool.sel_count[slot] = 0;
  pool.sel_score[slot] = 0;
  return c;
}

/**
 * The bound of a request's victim cache: a row whose (key, position) falls below it must
 * be in the cache. `active` is false when the cache is invalid (any key is fine then);
 * a complete cache must see every key change.
 */
struct cache_bound {
  bool active;
  bool complete;
  std::uint64_t key;
  std::int32_t position;

  DHISPARSE_DEVICE static cache_bound load(victim_cache_ref const& c, std::int32_t request)
  {
    cache_bound b{false, false, 0, 0};
    if (c.capacity == 0) { return b; }
    std::uint32_t const flags = c.flags[request];
    if ((flags & 1u) == 0) { return b; }
    b.active   = true;
    b.complete = (flags & 2u) != 0;
    std::int32_t const n = c.count[request];
    if (n > 0) {
      std::int64_t const last = std::int64_t(request) * c.capacity + n - 1;
      b.key      = c.key[last];
      b.position = c.position[last];
    }
    return b;
  }
  /// Whether a row now keyed (key, position) breaks the cache's invariant.
  DHISPARSE_DEVICE bool breaks(std::uint64_t k, std::int32_t pos) const
  {
    return active && (complete || k < key || (k == key && pos < position));
  }
};

/// Warp-wide minimum and maximum of 64-bit values (every lane gets them).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void warp_min_max(std::uint64_t& lo, std::uint64_t& hi)
{
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    std::uint64_t const l = __shfl_xor_sync(0xFFFFFFFFu, lo, o);
    std::uint64_t const h = __shfl_xor_sync(0xFFFFFFFFu, hi, o);
    lo                    = l < lo ? l : lo;
    hi                    = h > hi ? h : hi;
  }
}

/// Marks a request's victim cache invalid (rescanned by the next step that needs victims).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void invalidate_cache(victim_cache_ref const& c, std::int32_t request)
{
  if (c.capacity > 0) { c.flags[request] = 0; }
}

#endif  // __CUDACC__

}  // namespace dhisparse::detail
