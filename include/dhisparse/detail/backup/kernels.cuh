/**
 * @file detail/backup/kernels.cuh
 * @brief Kernels of `backup_async`.
 */
#pragma once

#include <dhisparse/backup.cuh>  // this file is included at its bottom
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/warp_copy.cuh>
#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace dhisparse {
namespace detail::backup {

inline constexpr int block_size = 256;
/// Blocks per group of a backup whose size the caller leaves open.
inline constexpr int default_blocks_per_group = 64;

/// One warp copies one dirty group row to its host page, then marks it clean.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void back_up_row(backup_params const& p, device_pool_ref const& pool,
                                                        group_layout const& layout, std::int32_t slot, int lane)
{
  std::int32_t const r   = pool.owner[slot];
  std::int32_t const pos = pool.position[slot];
  if (r < 0 || pos < 0) { return; }
  std::byte* dst = p.host.group_row(r, pos, layout);
  if (dst == nullptr) { return; }
  if (p.copy_rows) {
    auto const* src = reinterpret_cast<int4 const*>(pool.slab + std::size_t(slot) * pool.group_row_bytes);
    warp_copy(reinterpret_cast<int4*>(dst), src, int(pool.group_row_bytes / 16), lane);
    __threadfence_system();  // the host copy is complete before the row is marked clean
    __syncwarp();
  }
  if (lane == 0) {
    pool.dirty[slot] = 0;
    if (p.copy_rows) { atomicAdd(&pool.counters->backed_up_rows, 1ull); }
  }
}

/**
 * Calls `f(g, i)` for the indexes i in [0, count(g)) of every group g that fall to this
 * warp when the groups' index ranges, one after another, are dealt round-robin to all the
 * grid's warps. One 1-D grid serves every group, so its size (not the number of groups)
 * sets how many rows are in flight: a few blocks pace a backup beside retrieval, many
 * finish it fast.
 */
template <int BlockSize, class Count, class F>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void for_each_group_index(int num_groups, Count count, F f)
{
  std::int64_t const warps = std::int64_t(gridDim.x) * (BlockSize / 32);
  std::int64_t const warp  = std::int64_t(blockIdx.x) * (BlockSize / 32) + threadIdx.x / 32;
  std::int64_t base        = 0;  // first index of group g in the concatenated ranges
  for (int g = 0; g < num_groups; ++g) {
    std::int64_t const n = count(g);
    // The first index ≥ base that is ≡ warp (mod warps), relative to base.
    std::int64_t const first = ((warp - base) % warps + warps) % warps;
    for (std::int64_t i = first; i < n; i += warps) { f(g, std::int32_t(i)); }
    base += n;
  }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) copy_kernel(backup_params p)
{
  int const lane = threadIdx.x & 31;
  for_each_group_index<BlockSize>(
    p.num_groups, [&](int g) { return min(*p.pools[g].dirty_count, p.pools[g].dirty_capacity); },
    [&](int g, std::int32_t i) {
      device_pool_ref const& pool = p.pools[g];
      std::int32_t const slot     = pool.dirty_list[i];
      if (slot >= 0) { back_up_row(p, pool, p.layouts[g], slot, lane); }  // -1: scrubbed by release
    });
}

/// After a dirty-list overflow: every dirty committed row the list missed (the groups
/// without an overflow count no slots).
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) scan_kernel(backup_params p)
{
  int const lane = threadIdx.x & 31;
  for_each_group_index<BlockSize>(
    p.num_groups, [&](int g) { return *p.pools[g].dirty_overflow == 0 ? 0 : *p.pools[g].limit; },
    [&](int g, std::int32_t s) {
      device_pool_ref const& pool = p.pools[g];
      std::int32_t const r        = pool.owner[s];
      if (pool.dirty[s] != 0 && r >= 0 && pool.position[s] >= 0 && pool.position[s] < p.lengths[r]) {
        back_up_row(p, pool, p.layouts[g], s, lane);
      }
    });
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) reset_kernel(backup_params p)
{
  for (int g = threadIdx.x; g < p.num_groups; g += BlockSize) {
    *p.pools[g].dirty_count    = 0;
    *p.pools[g].dirty_overflow = 0;
  }
}

}  // namespace detail::backup

inline std::string backup_params_problem(backup_params const& params)
{
  if (params.num_groups <= 0) { return "backup: num_groups must be positive"; }
  return {};
}

inline cudaError_t backup_async(backup_params const& params, int blocks, cudaStream_t stream)
{
  namespace bk = detail::backup;
  if (!backup_params_problem(params).empty()) { return cudaErrorInvalidValue; }
  if (blocks <= 0) { blocks = bk::default_blocks_per_group * params.num_groups; }
  bk::copy_kernel<bk::block_size><<<unsigned(blocks), bk::block_size, 0, stream>>>(params);
  bk::scan_kernel<bk::block_size><<<unsigned(blocks), bk::block_size, 0, stream>>>(params);
  bk::reset_kernel<bk::block_size><<<1, bk::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
