/**
 * @file release.cuh
 * @brief Launch-level release of a request: its slots back to the free pools, its
 *        residency map cleared, and — when it is part of the current step — the request
 *        taken out of that step. What `kv_hierarchy::release` enqueues, for engines that
 *        own their buffers through the launch layer (`resolve_async`, `commit_async`, …).
 *
 * In order, on one stream:
 * 1. leave the step (when `batch_size` is given): the request's batch entry gets 0 queries,
 *    its tail entries and query positions -1, and plan entries that copy one of its host
 *    rows are emptied, so that a later retrieve never writes into a slot released here;
 * 2. its slots leave the dirty lists (a later backup never writes through them);
 * 3. every slot it owns in every group returns to the free stack (per-request budgets: its
 *    owned list; shared budgets: a scan of each pool) and its per-request lists are reset;
 * 4. its residency map pages are reset to "not resident";
 * 5. the per-request fields given in `request_fields` (lengths, capacities, floors, caps)
 *    are zeroed.
 * The host-side page pools (the host store's and the map's free pages) are not touched:
 * the owner of those pools returns the request's pages itself (`host_store::release`,
 * `residency_map::release`), which `kv_hierarchy::release` does right after.
 * Stream-ordered, allocation-free, no host synchronization; capturable.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/host_store.cuh>
#include <dhisparse/miss_plan.cuh>
#include <dhisparse/residency_map.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse {

/// Arguments of one release. Grid-invariant, passed by value.
struct release_params {
  device_pool_ref const* pools = nullptr;  ///< [num_groups] in device memory
  std::int32_t num_groups      = 0;
  std::int32_t num_slots       = 0;  ///< slots of each group's slab (bounds the scan of shared budgets)
  /// The pools keep per-request owned lists (per-request budgets, `device_pool_shape::max_owned`
  /// > 0): the release walks the request's list; otherwise it scans every pool.
  bool owned_lists = false;
  residency_map_ref map{};
  std::int32_t request = -1;  ///< internal index of the request (`kv_hierarchy::request_index`)

  // --- the step the request may be part of; batch_size == nullptr: none ----------------
  std::int32_t const* batch_size = nullptr;  ///< scalar: real batch size
  std::int32_t const* batch_requests = nullptr;  ///< [max_batch] request index of entry b
  std::int32_t* batch_queries = nullptr;     ///< [max_batch] queries of entry b (set to 0)
  std::int32_t* tail_slots = nullptr;        ///< [num_groups][max_batch][max_queries] (set to -1)
  std::int32_t* query_positions = nullptr;   ///< [max_batch][max_queries] (set to -1)
  std::int32_t max_batch   = 0;
  std::int32_t max_queries = 0;
  miss_plan_ref plans[2]{};  ///< miss plans a retrieve may still replay (capacity 0: none)
  host_store_ref host{};     ///< to recognise the request's host rows in the plans

  /// Nullable `[max_requests]` arrays whose entry `request` is zeroed (the hierarchy's
  /// lengths, capacities, floors and caps).
  std::int32_t* request_fields[4] = {nullptr, nullptr, nullptr, nullptr};
};
static_assert(std::is_trivially_copyable_v<release_params>);

/**
 * @brief Enqueues the release of one request on `stream` (see the file comment).
 * @return `cudaErrorInvalidValue` (nothing enqueued) when `release_params_problem` reports a
 *         problem; the launch status otherwise
 */
cudaError_t release_async(release_params const& params, cudaStream_t stream);

/// The arguments `release_async` checks (null pools, no groups, a negative request or slot
/// count, a step to leave without its batch, tail-slot or position arrays or its shape): a
/// message naming the first bad one, or empty.
std::string release_params_problem(release_params const& params);

}  // namespace dhisparse

#include <dhisparse/detail/release/launch.cuh>
