/**
 * @file resolve.cuh
 * @brief The fused per-step resolve of one layer group: union of each request's Q × K
 *        selections, hits, pins, evictions or reclaim, allocations, tail slots, miss plan
 *        and the per-query slot tables attention reads.
 *
 * ## Selections
 * `selections[b][q][k]` (int32) lists the positions query q of batch entry b attends to,
 * as an indexer emits them: in any order, with -1 for "none" anywhere. Query q of a request
 * of committed length n sits at position n + q and may select positions 0 … n + q (its own
 * and earlier tail rows included). A position outside that range is treated as empty and
 * raises `status_invalid_selection`. A position listed several times — by one query or by
 * several — is one row: every entry that names it gets its slot. Optional `scores` (same
 * shape) reach the eviction policy (`selection_context::score`, the highest per row).
 *
 * ## What one resolve does (all requests of the batch, stream-ordered, no host sync)
 * 1. `lookup`, tiles of 256 entries (a request spans several, so a small batch still
 *    fills the device): every valid selection of a committed position is looked up in the
 *    residency map; a hit pins the slot for this step and updates its policy state once;
 *    misses are marked once each in the request's bitmap and counted;
 * 2. `reclaim` (shared budgets only): when the free slots cannot serve the step's misses and
 *    tails, clean unpinned optional rows of all requests are released in the budget's
 *    reclaim order — no bytes move, the host store holds them;
 * 3. `allocate`, one block per request, launched early (programmatic dependent launch)
 *    and waiting on the device for its predecessor: lists the misses in ascending position
 *    order (host address order within the request's pages); its tail rows, then its
 *    misses, get slots — spare
 *    slots of the request first, then the free pool up to its cap, then (per-request
 *    budgets) its own rows that are neither pinned nor dirty, in the eviction policy's
 *    order; every miss becomes a plan entry (host row → slot) and every tail row a dirty
 *    slot (`tail_slots`); the slot table gets every entry's slot. With `fetch_rows` the
 *    rows are copied as well (in the allocate blocks, or by a dependent gather for
 *    batches under 16).
 * After `retrieve` has copied the plan, every slot in the slot table holds exactly the
 * committed bytes of its (request, position) for every layer of the group. Rows of batch
 * entries b ≥ the batch size are not written; rows of queries q ≥ Q_b are -1.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/host_store.cuh>
#include <dhisparse/miss_plan.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/reclaim.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {

/// Arguments of one resolve (one layer group, one step). Grid-invariant, passed by value.
struct resolve_params {
  std::int32_t const* selections;  ///< [max_batch][max_queries][top_k], -1 = none, any order
  float const* scores;             ///< [max_batch][max_queries][top_k] or nullptr
  std::int32_t top_k;              ///< K of this call (≤ the configured maximum)
  std::int32_t group;              ///< layer group
  std::int32_t max_context;        ///< positions a request may reach (sizes the workspace)
  group_layout layout;             ///< placement of the group's rows in host pages
  step_batch_ref batch;
  device_pool_ref pool;            ///< this group's pool
  residency_map_ref map;
  host_store_ref host;
  std::int32_t* slot_table;        ///< out [max_batch][max_queries][top_k], -1 = none
  std::int32_t* tail_slots;        ///< out [max_batch][max_queries], -1 = none
  miss_plan_ref plan;              ///< out: capacity ≥ max_batch × max_queries × top_k
  std::uint32_t* status;           ///< status word (see status.hpp), OR-ed into
  /// Shared budgets: reclaim when the free slots would fall below this many after the
  /// step's allocations …
  std::int32_t reclaim_low_watermark;
  /// … and then release this many optional rows beyond what the step needs, so that the
  /// pool scan of a reclaim serves several steps.
  std::int32_t reclaim_batch;
  /// Blocks of the reclaim kernel (0: as many as fit on the device at once; more are
  /// allowed, those that have not started when a reclaim begins take no part).
  std::int32_t reclaim_blocks;
  reclaim_scratch_ref reclaim;     ///< shared budgets: the pool's reclaim scratch
  /// Copy the missed rows too, so that no `retrieve` is needed (the plan stays, for
  /// replays): batches of 16 or more requests copy in their allocate blocks, overlapping
  /// with the other requests' allocation; smaller ones with a device-wide gather launched
  /// as a programmatic dependent of allocate.
  bool fetch_rows;
};

/**
 * @brief Bytes of scratch `resolve_async` needs for the given shapes.
 */
std::size_t resolve_workspace_size(int max_batch, int max_queries, int top_k, int max_context);

/**
 * @brief Enqueues the resolve of one group on `stream`: two kernels, three with a budget
 *        that reclaims (no allocation, no host synchronisation, fixed launch shapes).
 * @tparam Eviction eviction policy, @tparam Budget budget policy (policy/concepts.hpp)
 * @param workspace at least `resolve_workspace_size(…)` bytes of device memory, 256-byte
 *                  aligned, all zero before its first use (every resolve leaves it so);
 *                  may be reused by the next resolve on the same stream
 * @return cudaErrorInvalidValue (nothing enqueued) when `resolve_params_problem` reports a
 *         problem (bad shapes, Qmax × K above 16384, too small a workspace or plan, a field
 *         the policies need left null), else the launch status
 */
template <class Eviction, class Budget>
cudaError_t resolve_async(resolve_params const& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream);

/// The arguments `resolve_async<Eviction, Budget>` checks: a message naming the first bad
/// one, or empty.
template <class Eviction, class Budget>
std::string resolve_params_problem(resolve_params const& params, std::size_t workspace_bytes);

}  // namespace dhisparse

#include <dhisparse/detail/resolve/kernels.cuh>
