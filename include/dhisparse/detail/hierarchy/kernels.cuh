/**
 * @file detail/hierarchy/kernels.cuh
 * @brief Kernels of `kv_hierarchy::release`: return a request's slots and clear its map.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/residency_map.cuh>

#include <cstdint>

namespace dhisparse::detail::hierarchy {

inline constexpr int block_size = 256;

/// One block per group: scrub the request's slots from the dirty list, then push every
/// slot it owns back on the free stack, empty and clean.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  release_slots_kernel(device_pool_ref const* pools, std::int32_t request)
{
  device_pool_ref const pool = pools[blockIdx.x];
  std::int32_t const dirty_n = min(*pool.dirty_count, pool.dirty_capacity);
  for (int i = threadIdx.x; i < dirty_n; i += BlockSize) {
    std::int32_t const slot = pool.dirty_list[i];
    if (slot >= 0 && pool.owner[slot] == request) { pool.dirty_list[i] = -1; }
  }
  std::int32_t const n    = pool.owned_count[request];
  std::int32_t const base = *pool.free_count;
  __syncthreads();
  std::int32_t const* owned = pool.owned + std::int64_t(request) * pool.max_owned;
  for (int i = threadIdx.x; i < n; i += BlockSize) {
    std::int32_t const slot  = owned[i];
    pool.owner[slot]         = -1;
    pool.position[slot]      = -1;
    pool.policy_state[slot]  = 0;
    pool.touched[slot]       = 0;
    pool.dirty[slot]         = 0;
    pool.free_stack[base + i] = slot;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *pool.free_count           = base + n;
    pool.owned_count[request] = 0;
  }
}

/// One block per directory entry of the request: reset its map page to "not resident".
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  clear_map_kernel(residency_map_ref map, std::int32_t request)
{
  std::int32_t const page =
    map.directory[std::int64_t(request) * map.max_pages_per_request + blockIdx.x];
  if (page < 0) { return; }
  std::int64_t const per_page = std::int64_t(map.num_groups) << map.page_shift;
  std::int32_t* entries       = map.pages + std::int64_t(page) * per_page;
  for (std::int64_t i = threadIdx.x; i < per_page; i += BlockSize) { entries[i] = not_resident; }
}

}  // namespace dhisparse::detail::hierarchy
