/**
 * @file detail/retrieve/kernels.cuh
 * @brief The gather kernel of `retrieve_async`.
 */
#pragma once

#include <dhisparse/retrieve.cuh>  // this file is included at its bottom
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/dependent_launch.cuh>
#include <dhisparse/detail/device_info.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace dhisparse {
namespace detail::retrieve {

inline constexpr int block_size = 256;
/// Resident gather blocks per SM the kernel is compiled for (40 registers a thread; 8
/// would need 32 and spill), and the default grid: one full wave.
inline constexpr int blocks_per_sm = 6;
/// 16-byte loads one lane issues before its stores (per round of a row).
inline constexpr int loads_per_lane = 4;

/// Lanes per row for `vectors` 16-byte vectors: the fewest (4 … 32) that need at most
/// `loads_per_lane` loads each, 32 beyond. The rule `lanes_per_row = 0` applies.
DHISPARSE_HOST_DEVICE constexpr int auto_lanes(int vectors)
{
  return vectors <= 4 * loads_per_lane    ? 4
         : vectors <= 8 * loads_per_lane  ? 8
         : vectors <= 16 * loads_per_lane ? 16
                                          : 32;
}

/// Copies the plan's rows, `Lanes` lanes per row: each lane loads up to `loads_per_lane`
/// vectors of the row, then stores them (no store sits between two loads of a round).
template <int Lanes>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void gather_rows(retrieve_params const& p, miss_entry const* entries,
                                                         std::int32_t n, int vectors)
{
  // 32-bit indices (plans hold at most 2^31 - 1 entries): fewer registers, more blocks.
  int const lane            = int(threadIdx.x) % Lanes;
  std::int32_t const stride = std::int32_t(gridDim.x * (blockDim.x / Lanes));
  for (std::int32_t i = std::int32_t(blockIdx.x * (blockDim.x / Lanes) + threadIdx.x / Lanes); i < n; i += stride) {
    miss_entry const e = entries[i];
    if (e.src == nullptr) { continue; }
    auto const* src = reinterpret_cast<int4 const*>(e.src + p.byte_begin);
    auto* dst = reinterpret_cast<int4*>(p.slab + std::size_t(e.slot) * p.group_row_bytes + p.byte_begin);
    for (int base = lane; base < vectors; base += Lanes * loads_per_lane) {
      int4 v[loads_per_lane];
#pragma unroll
      for (int u = 0; u < loads_per_lane; ++u) {
        if (base + u * Lanes < vectors) { v[u] = src[base + u * Lanes]; }
      }
#pragma unroll
      for (int u = 0; u < loads_per_lane; ++u) {
        if (base + u * Lanes < vectors) { dst[base + u * Lanes] = v[u]; }
      }
    }
  }
}

/// The gather of the whole plan, grid-wide (also behind `resolve_and_retrieve`).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void gather(retrieve_params const& p)
{
  std::int32_t const n = *p.plan.count;
  int const vectors    = int((p.byte_end - p.byte_begin) / 16);
  int const lanes      = p.lanes_per_row > 0 ? p.lanes_per_row : auto_lanes(vectors);
  miss_entry const* entries = p.plan.entries;
  // One runtime → compile-time dispatch; the branch is uniform over the grid.
  switch (lanes) {
    case 4: gather_rows<4>(p, entries, n, vectors); break;
    case 8: gather_rows<8>(p, entries, n, vectors); break;
    case 16: gather_rows<16>(p, entries, n, vectors); break;
    default: gather_rows<32>(p, entries, n, vectors); break;
  }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize, blocks_per_sm) gather_kernel(retrieve_params p)
{
  wait_for_prerequisites();  // launched early (see retrieve_async)
  gather(p);
}

/// Blocks that fill the current device in one wave.
inline int default_blocks() { return multiprocessor_count() * blocks_per_sm; }

/// Arguments `retrieve_async` accepts.
}  // namespace detail::retrieve

inline std::string retrieve_params_problem(retrieve_params const& params)
{
  int const lanes = params.lanes_per_row;
  if (params.group_row_bytes % row_alignment != 0) {
    return "retrieve: group_row_bytes (" + std::to_string(params.group_row_bytes) + ") is not a multiple of 16";
  }
  if (params.byte_begin % row_alignment != 0 || params.byte_end % row_alignment != 0) {
    return "retrieve: byte_begin / byte_end are not multiples of 16";
  }
  if (params.byte_begin > params.byte_end || params.byte_end > params.group_row_bytes) {
    return "retrieve: byte_begin / byte_end are not a range within the group row (byte_begin <= byte_end <= "
           "group_row_bytes)";
  }
  if (lanes != 0 && lanes != 4 && lanes != 8 && lanes != 16 && lanes != 32) {
    return "retrieve: lanes_per_row (" + std::to_string(lanes) + ") must be 0, 4, 8, 16 or 32";
  }
  return {};
}

inline cudaError_t retrieve_async(retrieve_params const& params, int blocks, cudaStream_t stream)
{
  namespace rt = detail::retrieve;
  if (!retrieve_params_problem(params).empty()) { return cudaErrorInvalidValue; }
  if (blocks <= 0) { blocks = rt::default_blocks(); }
  // A programmatic dependent launch: after resolve's allocate (which lets dependents start)
  // the gather's blocks are already resident when the plan is complete.
  cudaError_t const launched =
    detail::launch_dependent(rt::gather_kernel<rt::block_size>, unsigned(blocks), rt::block_size, stream, params);
  if (launched != cudaSuccess) { return launched; }
  return detail::check_launch(stream);
}

}  // namespace dhisparse

// The plan order's launcher uses the checks above.
#include <dhisparse/detail/retrieve/order.cuh>
