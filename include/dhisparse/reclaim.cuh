/**
 * @file reclaim.cuh
 * @brief Instant release of optional rows: clean, unpinned rows of any request go back to
 *        the free pool by metadata alone — 0 bytes move, because the host store holds an
 *        exact copy of every committed row. Dirty rows (not yet backed up) are never
 *        released; pinned rows (selected in the current step) neither.
 *
 * Which rows go first is the budget's `reclaim_order` (policy/concepts.hpp):
 * - `global`: the smallest (eviction key, position, request) over the whole pool;
 * - `fair_share`: requests give rows by water filling over their excess above their floor
 *   (owned − floor), each in its own (key, position) order; a request at or below the
 *   level gives nothing, ties at the level go to the lower request indices.
 * The selection is exact and deterministic (a radix select over the candidates, in one
 * kernel whose blocks meet at barriers), so the host reference releases the same rows.
 * `reclaim_async` is a cooperative launch. Inside resolve the kernel follows lookup as a
 * programmatic dependent, so that its check costs no launch gap; when a reclaim is needed,
 * the blocks that have started by then do it (a team formed from tickets, never waiting
 * for a block the device has not placed), with the same result whatever their number.
 * In global order the candidates are first only the rows whose key is at most a
 * bound estimated from a sample of slots (enough of them to hold the rows to release, with
 * a margin); when fewer qualify, the remaining rows are added and the select runs over all.
 * Either way the released rows are the same: the sample decides how much is read, not what
 * is released. The pass up to the bound reads the pool's key floors (one lower bound of the
 * rows' keys per four slots, device_pool.cuh) and the states of only the slots whose floor
 * lies at or under the bound. Resolve runs it when a step needs more free slots than the pool has; an engine
 * runs it to hand memory back (`set_pool_limit`) or to keep a reserve (`reclaim_async`).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/residency_map.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse {

/// Scratch of the reclaim of one pool (device memory; `reclaim_scratch_size`).
struct reclaim_scratch_ref {
  std::int32_t* candidates;  ///< [num_slots] eligible slots of the current pass
  std::int32_t* ties;        ///< [num_slots] candidates at their segment's threshold key
  std::uint32_t* hist;       ///< max(2 × segments × 256, 3 × 2048) digit counts (zero between reclaims)
  std::int32_t* segment;     ///< [segments][6]: target, remaining, mode, eligible, ties, pad
  std::uint64_t* prefix;     ///< [segments][2]: key prefix, tie prefix
  std::uint64_t* scalars;    ///< [16]: candidates, key min, key max, tie min, tie max, …
  std::uint32_t* sample;     ///< [4096 + 4]: key histogram of a sample of slots, its key range
  std::int32_t segments;     ///< 1 (global order) or max_requests (fair share)
  std::int32_t sample_slots; ///< slots sampled for the key bound (global order; 0: no bound)
};
static_assert(std::is_trivially_copyable_v<reclaim_scratch_ref>);

/// Arguments of one reclaim. Grid-invariant, passed by value.
struct reclaim_params {
  device_pool_ref pool;
  residency_map_ref map;
  reclaim_scratch_ref scratch;
  std::int32_t group;
  std::int32_t const* floors;    ///< [max_requests] (fair share)
  reclaim_order order;           ///< global or fair_share
  std::uint32_t pin_epoch;       ///< rows touched in this epoch are pinned; 0: none
  std::int32_t target_free;      ///< release rows until the pool has this many free slots
  std::int32_t blocks;           ///< grid size (0: as many as fit on the device at once)
};

/// Bytes of `reclaim_scratch_ref` for a pool of `num_slots` and `segments` segments.
std::size_t reclaim_scratch_size(std::int32_t num_slots, std::int32_t segments);

/// Carves a `reclaim_scratch_ref` out of `memory` (≥ `reclaim_scratch_size` bytes, 256-byte
/// aligned, zero before the first reclaim; every reclaim leaves it so). `sample_slots`: see
/// `hierarchy_config::reclaim_sample_slots`.
reclaim_scratch_ref make_reclaim_scratch(void* memory, std::int32_t num_slots, std::int32_t segments,
                                         std::int32_t sample_slots = 16384);

/**
 * @brief Enqueues a reclaim of one pool on `stream`: releases the fewest optional rows in
 *        `order` that bring the free slots to `target_free` (or every optional row, if that
 *        is not enough). One cooperative kernel; no allocation, no host synchronisation.
 * @tparam Eviction eviction policy (its `eviction_key` orders the rows)
 */
template <class Eviction>
cudaError_t reclaim_async(reclaim_params const& params, cudaStream_t stream);

/// The arguments `reclaim_async` checks (an order, the scratch, enough segments for a fair
/// share): a message naming the first bad one, or empty. `reclaim_async` returns
/// `cudaErrorInvalidValue` (nothing enqueued) when it reports a problem.
std::string reclaim_params_problem(reclaim_params const& params);

}  // namespace dhisparse

#include <dhisparse/detail/reclaim/kernels.cuh>
