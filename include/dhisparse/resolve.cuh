/**
 * @file resolve.cuh
 * @brief The fused per-step resolve of one layer group: union of each request's Q × K
 *        selections, hits, pins, evictions and allocations, tail slots, miss plan and the
 *        per-query slot tables attention reads.
 *
 * ## Selections
 * `selections[b][q][k]` (int32, -1 = none) lists the positions query q of batch entry b
 * attends to. Query q of a request of committed length n sits at position n + q and may
 * select positions 0 … n + q (its own and earlier tail rows included). Within a query,
 * valid positions are strictly increasing and -1 entries come last. Entries that break
 * this (out of range, not above their predecessor, after a -1) are treated as empty and
 * raise `status_invalid_selection`.
 *
 * ## What one resolve does (all requests of the batch, stream-ordered, no host sync)
 * 1. every valid selection of a committed position is looked up in the residency map:
 *    a hit pins the slot for this step and updates its policy state once; a miss claims
 *    the position, so that queries sharing it share one slot (the union);
 * 2. per request: slots for its misses and its Q tail rows come from the free pool while
 *    it owns fewer than `slot_budget` slots, then from evicting its own rows that are
 *    neither pinned nor dirty, smallest eviction key first; every miss becomes a plan
 *    entry (host row → slot) and every tail row a dirty slot (`tail_slots`);
 * 3. the slot table gets the slot of every valid selection.
 * After `retrieve` has copied the plan, every slot in the slot table holds exactly the
 * committed bytes of its (request, position) for every layer of the group.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/policy_traits.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/host_store.cuh>
#include <dhisparse/miss_plan.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse {

/// Arguments of one resolve (one layer group, one step). Grid-invariant, passed by value.
struct resolve_params {
  std::int32_t const* selections;  ///< [max_batch][max_queries][top_k], -1 = none
  std::int32_t top_k;              ///< K of this call (≤ the configured maximum)
  std::int32_t group;              ///< layer group
  std::int32_t slot_budget;        ///< slots one request may own in this group
  group_layout layout;             ///< placement of the group's rows in host pages
  step_batch_ref batch;
  device_pool_ref pool;            ///< this group's pool
  residency_map_ref map;
  host_store_ref host;
  std::int32_t* slot_table;        ///< out [max_batch][max_queries][top_k], -1 = none
  std::int32_t* tail_slots;        ///< out [max_batch][max_queries], -1 = none
  miss_plan_ref plan;              ///< out: capacity ≥ max_batch × max_queries × top_k
  std::uint32_t* status;           ///< status word (see status.hpp), OR-ed into
};

/**
 * @brief Bytes of scratch `resolve_async` needs for the given shapes.
 * @param max_owned most slots one request may own (the budget)
 */
std::size_t resolve_workspace_size(int max_batch, int max_queries, int top_k, int max_owned);

/**
 * @brief Enqueues the resolve of one group on `stream` (four kernels; no allocation, no
 *        host synchronisation, fixed launch shapes).
 * @tparam Eviction eviction policy (see policy/lru.cuh for the contract)
 * @param workspace at least `resolve_workspace_size(…)` bytes of device memory, 256-byte
 *                  aligned; may be reused by the next resolve on the same stream
 * @return the launch status
 */
template <class Eviction>
cudaError_t resolve_async(resolve_params const& params, void* workspace,
                          std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace dhisparse

#include <dhisparse/detail/resolve/kernels.cuh>
