/**
 * @file detail/warp_reduce.cuh
 * @brief Warp-wide sums by register shuffles, called by all 32 lanes of a warp: the
 *        reductions that resolve (its victim search) and verification share.
 *        (`__reduce_add_sync` needs sm_80 and 32-bit integers; the library builds for
 *        older targets and sums 64-bit integers and floats too.)
 */
#pragma once

#include <dhisparse/detail/config.hpp>

namespace dhisparse::detail {

/// Sum over the warp's lanes; every lane gets it. Floats are added in the same butterfly
/// order on every call, so the result is deterministic.
template <class T>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE T warp_sum(T v)
{
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xFFFFFFFFu, v, o); }
  return v;
}

/// Inclusive prefix sum over the warp's lanes (lane i gets the sum of lanes 0..i).
template <class T>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE T warp_inclusive_sum(T v)
{
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    T const up = __shfl_up_sync(0xFFFFFFFFu, v, o);
    if (lane >= o) { v += up; }
  }
  return v;
}

}  // namespace dhisparse::detail
