/**
 * @file backup.cuh
 * @brief Eager copy of newly committed rows device → host store. A row becomes clean
 *        (evictable, and free to reclaim without a copy) only once its copy completed.
 *
 * Each group's dirty list holds the slots committed since the last backup. One warp
 * copies one group row (all layers) to its host page with 16-byte stores over PCIe,
 * fences them system-wide, and only then clears the slot's dirty flag. The warps of one
 * 1-D grid take the rows of all groups round-robin, so the grid's size paces the backup:
 * a few blocks (a few rows in flight) keep up with a decode step's commits while leaving
 * the link to retrieval, which runs the other way but shares the GPU's PCIe engine and
 * memory system; the default (64 blocks per group) finishes a large backup fastest. Rows committed
 * while the list was full (`status_dirty_list_overflow`) are found by a scan of the pool
 * (dirty rows below their request's committed length) in the same backup, so a late
 * backup costs a scan but loses nothing. A last launch empties the lists. Slots that were
 * released meanwhile were scrubbed from the list by release.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/host_store.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace dhisparse {

/// Arguments of one backup (all groups). Grid-invariant, passed by value.
struct backup_params {
  device_pool_ref const* pools;  ///< [num_groups] in device memory
  group_layout const* layouts;   ///< [num_groups] in device memory
  host_store_ref host;
  std::int32_t const* lengths;   ///< [max_requests] committed lengths (the overflow scan)
  std::int32_t num_groups;
  /// false: mark the dirty rows clean without copying them (nor counting them in
  /// `backed_up_rows`) — a reader of a shared host store, whose rows another hierarchy
  /// backs up (shared_host_store.cuh); the caller orders this after that backup.
  bool copy_rows = true;
};

/**
 * @brief Enqueues the backup of every group's dirty rows on `stream`.
 * @param blocks blocks of the grid, shared by all groups (≤ 0: 64 per group)
 * @return cudaErrorInvalidValue (nothing enqueued) when `backup_params_problem` reports a
 *         problem, else the launch status
 */
cudaError_t backup_async(backup_params const& params, int blocks, cudaStream_t stream);

/// The arguments `backup_async` checks: a message naming the first bad one, or empty.
std::string backup_params_problem(backup_params const& params);

}  // namespace dhisparse

#include <dhisparse/detail/backup/kernels.cuh>
