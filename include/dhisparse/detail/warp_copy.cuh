/**
 * @file detail/warp_copy.cuh
 * @brief One warp copies a row in 16-byte vectors, several loads in flight per lane: the
 *        inner loop of retrieval (host → device) and backup (device → host).
 */
#pragma once

#include <dhisparse/detail/config.hpp>

namespace dhisparse::detail {

/// 16-byte loads each lane keeps in flight.
inline constexpr int warp_copy_unroll = 4;

/// Copies `vectors` 16-byte vectors from `src` to `dst`; called by all 32 lanes of a warp.
template <int Unroll = warp_copy_unroll>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void warp_copy(int4* dst, int4 const* src, int vectors, int lane)
{
  int v = lane;
  for (; v + 32 * (Unroll - 1) < vectors; v += 32 * Unroll) {
    int4 tmp[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) { tmp[u] = src[v + 32 * u]; }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) { dst[v + 32 * u] = tmp[u]; }
  }
  for (; v < vectors; v += 32) { dst[v] = src[v]; }
}

}  // namespace dhisparse::detail
