/**
 * @file retrieve.cuh
 * @brief Exact fused gather of a miss plan: every missed group row host → device slot.
 *
 * One warp copies one group row with 16-byte loads straight from the pinned host store
 * (zero-copy over PCIe), several loads in flight per lane. Because a group row holds all
 * layers of the group, one pass serves every layer; `byte_begin`/`byte_end` restrict the
 * copy to a range of layers, which replays the same plan for a later part of the group
 * (e.g. to overlap the copy of layers 1… with attention of layer 0).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/miss_plan.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse {

/// Arguments of one retrieve. Grid-invariant, passed by value.
struct retrieve_params {
  miss_plan_ref plan;            ///< entries [0, *plan.count)
  std::byte* slab;               ///< destination [num_slots][group_row_bytes]
  std::size_t group_row_bytes;   ///< layers × row bytes
  std::size_t byte_begin;        ///< first byte of each group row to copy (multiple of 16)
  std::size_t byte_end;          ///< one past the last (multiple of 16, ≤ group_row_bytes)
};

/**
 * @brief Enqueues the copy of every plan entry on `stream` (no allocation, no host sync).
 * @param blocks grid size (0: a default that fills the device); the plan's length is read
 *               on device, so the launch shape does not depend on it
 * @return cudaErrorInvalidValue for misaligned byte ranges, else the launch status
 */
cudaError_t retrieve_async(retrieve_params const& params, int blocks, cudaStream_t stream);

}  // namespace dhisparse

#include <dhisparse/detail/retrieve/kernels.cuh>
