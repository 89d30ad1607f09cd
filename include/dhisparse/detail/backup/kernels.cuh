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

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) copy_kernel(backup_params p)
{
  int const g                = blockIdx.y;
  device_pool_ref const pool = p.pools[g];
  group_layout const layout  = p.layouts[g];
  int const lane             = threadIdx.x & 31;
  int const warps            = BlockSize / 32;
  std::int32_t const n       = min(*pool.dirty_count, pool.dirty_capacity);
  for (std::int32_t i = blockIdx.x * warps + threadIdx.x / 32; i < n; i += gridDim.x * warps) {
    std::int32_t const slot = pool.dirty_list[i];
    if (slot >= 0) { back_up_row(p, pool, layout, slot, lane); }  // -1: scrubbed by release
  }
}

/// After a dirty-list overflow: every dirty committed row the list missed.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) scan_kernel(backup_params p)
{
  int const g                = blockIdx.y;
  device_pool_ref const pool = p.pools[g];
  if (*pool.dirty_overflow == 0) { return; }
  group_layout const layout = p.layouts[g];
  int const lane            = threadIdx.x & 31;
  int const warps           = BlockSize / 32;
  std::int32_t const limit  = *pool.limit;
  for (std::int32_t s = blockIdx.x * warps + threadIdx.x / 32; s < limit; s += gridDim.x * warps) {
    std::int32_t const r = pool.owner[s];
    if (pool.dirty[s] != 0 && r >= 0 && pool.position[s] >= 0 && pool.position[s] < p.lengths[r]) {
      back_up_row(p, pool, layout, s, lane);
    }
  }
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
  if (blocks <= 0) { blocks = 64; }
  dim3 const grid(unsigned(blocks), unsigned(params.num_groups));
  bk::copy_kernel<bk::block_size><<<grid, bk::block_size, 0, stream>>>(params);
  bk::scan_kernel<bk::block_size><<<grid, bk::block_size, 0, stream>>>(params);
  bk::reset_kernel<bk::block_size><<<1, bk::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
