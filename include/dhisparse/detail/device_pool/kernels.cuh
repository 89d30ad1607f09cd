/**
 * @file detail/device_pool/kernels.cuh
 * @brief The kernel of `device_pool`'s construction (included at the bottom of
 *        device_pool.cuh).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/group_counters.hpp>

#include <cstdint>

namespace dhisparse::detail {

/// Initial metadata: every slot free and empty, the free stack full, lists empty.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) init_pool_kernel(device_pool_ref pool)
{
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x;
  std::int64_t const first  = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = first; i < pool.num_slots; i += stride) {
    pool.owner[i]     = -1;
    pool.position[i]  = -1;
    pool.state[i]     = free_slot_state;
    pool.keys[i]      = 0;  // the victim rescan loads a key beside its position, also of empty slots
    pool.touched[i]   = 0;
    pool.dirty[i]     = 0;
    pool.sel_count[i] = 0;
    pool.sel_score[i] = 0;
    if ((i & ((1 << key_floor_shift) - 1)) == 0) { pool.key_floor[i >> key_floor_shift] = ~0u; }  // no row
    // Popped from the top: the lowest slots go first.
    pool.free_stack[i] = std::int32_t(pool.num_slots - 1 - i);
  }
  for (std::int64_t r = first; r < pool.max_requests; r += stride) {
    pool.owned_count[r] = 0;
    pool.spare_count[r] = 0;
    pool.hand[r]        = 0;
    if (pool.cache.capacity > 0) {
      pool.cache.head[r]  = 0;
      pool.cache.count[r] = 0;
      pool.cache.flags[r] = 0;
    }
  }
  if (first == 0) {
    *pool.free_count  = pool.num_slots;
    *pool.limit       = pool.num_slots;
    *pool.epoch       = 0;
    *pool.dirty_count    = 0;
    *pool.dirty_overflow = 0;
    *pool.counters       = group_counters{};
  }
}

}  // namespace dhisparse::detail
