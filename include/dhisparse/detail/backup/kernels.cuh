/**
 * @file detail/backup/kernels.cuh
 * @brief Kernels of `backup_async`.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/warp_copy.cuh>
#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse {
namespace detail::backup {

inline constexpr int block_size = 256;

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) copy_kernel(backup_params p)
{
  int const g                = blockIdx.y;
  device_pool_ref const pool = p.pools[g];
  group_layout const layout  = p.layouts[g];
  int const lane             = threadIdx.x & 31;
  int const warps            = BlockSize / 32;
  std::int32_t const n       = min(*pool.dirty_count, pool.dirty_capacity);
  int const vectors          = int(pool.group_row_bytes / 16);
  for (std::int32_t i = blockIdx.x * warps + threadIdx.x / 32; i < n; i += gridDim.x * warps) {
    std::int32_t const slot = pool.dirty_list[i];
    if (slot < 0) { continue; }  // scrubbed by release
    std::int32_t const r   = pool.owner[slot];
    std::int32_t const pos = pool.position[slot];
    if (r < 0 || pos < 0) { continue; }
    std::byte* dst = p.host.group_row(r, pos, layout);
    if (dst == nullptr) { continue; }
    auto const* src = reinterpret_cast<int4 const*>(pool.slab + std::size_t(slot) * pool.group_row_bytes);
    warp_copy(reinterpret_cast<int4*>(dst), src, vectors, lane);
    __threadfence_system();  // the host copy is complete before the row is marked clean
    __syncwarp();
    if (lane == 0) { pool.dirty[slot] = 0; }
  }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) reset_kernel(backup_params p)
{
  for (int g = threadIdx.x; g < p.num_groups; g += BlockSize) { *p.pools[g].dirty_count = 0; }
}

}  // namespace detail::backup

inline cudaError_t backup_async(backup_params const& params, int blocks, cudaStream_t stream)
{
  namespace bk = detail::backup;
  if (params.num_groups <= 0) { return cudaErrorInvalidValue; }
  if (blocks <= 0) { blocks = 64; }
  dim3 const grid(unsigned(blocks), unsigned(params.num_groups));
  bk::copy_kernel<bk::block_size><<<grid, bk::block_size, 0, stream>>>(params);
  bk::reset_kernel<bk::block_size><<<1, bk::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
