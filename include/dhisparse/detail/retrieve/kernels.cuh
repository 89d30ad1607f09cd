/**
 * @file detail/retrieve/kernels.cuh
 * @brief The gather kernel of `retrieve_async`.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_info.cuh>
#include <dhisparse/detail/warp_copy.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse {
namespace detail::retrieve {

inline constexpr int block_size = 256;
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) gather_kernel(retrieve_params p)
{
  int const lane        = threadIdx.x & 31;
  int const warps       = BlockSize / 32;
  std::int64_t const n  = *p.plan.count;
  int const vectors     = int((p.byte_end - p.byte_begin) / 16);
  for (std::int64_t i = std::int64_t(blockIdx.x) * warps + threadIdx.x / 32; i < n;
       i += std::int64_t(gridDim.x) * warps) {
    miss_entry const e = p.plan.entries[i];
    if (e.src == nullptr) { continue; }
    auto const* src = reinterpret_cast<int4 const*>(e.src + p.byte_begin);
    auto* dst = reinterpret_cast<int4*>(p.slab + std::size_t(e.slot) * p.group_row_bytes + p.byte_begin);
    warp_copy(dst, src, vectors, lane);
  }
}

/// Blocks that fill the current device (a few resident blocks per SM).
inline int default_blocks() { return multiprocessor_count() * 8; }

}  // namespace detail::retrieve

inline cudaError_t retrieve_async(retrieve_params const& params, int blocks, cudaStream_t stream)
{
  namespace rt = detail::retrieve;
  if (params.byte_begin % row_alignment != 0 || params.byte_end % row_alignment != 0 ||
      params.byte_begin > params.byte_end || params.byte_end > params.group_row_bytes ||
      params.group_row_bytes % row_alignment != 0) {
    return cudaErrorInvalidValue;
  }
  if (blocks <= 0) { blocks = rt::default_blocks(); }
  rt::gather_kernel<rt::block_size><<<blocks, rt::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
