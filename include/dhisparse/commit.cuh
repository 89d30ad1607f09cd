/**
 * @file commit.cuh
 * @brief After the model wrote (and, when speculating, verification judged) the tail rows
 *        of a step: accepted tail rows become committed, rejected ones are recycled.
 *
 * For batch entry b with Q_b tail rows and `accepted[b] = a` (0 ≤ a ≤ Q_b; all Q_b when
 * `accepted` is null, as in plain decoding), in every group:
 * - tail rows 0 … a-1 stay resident as committed rows; they stay dirty (never evicted)
 *   and join the group's dirty list until `backup` has copied them to the host store;
 * - tail rows a … Q_b-1 are unmapped; their slots stay with the request as *spare* slots
 *   (owned, empty), reused first by its next step;
 * - the request's committed length grows by a.
 * An out-of-range count rejects the whole tail and raises `status_invalid_accept_count`.
 * One kernel for all groups; tail slot entries are consumed (set to -1).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse {

/// Arguments of one commit. Grid-invariant, passed by value.
struct commit_params {
  step_batch_ref batch;
  std::int32_t const* accepted;   ///< [max_batch] tail rows kept per entry; nullptr = all
  device_pool_ref const* pools;   ///< [num_groups] in device memory
  std::int32_t* tail_slots;       ///< [num_groups][max_batch][max_queries], consumed
  residency_map_ref map;
  std::int32_t num_groups;
  std::uint32_t* status;
};

/// Enqueues the commit of a step on `stream`. Returns the launch status.
cudaError_t commit_async(commit_params const& params, cudaStream_t stream);

}  // namespace dhisparse

#include <dhisparse/detail/commit/kernels.cuh>
