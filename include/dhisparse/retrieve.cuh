/**
 * @file retrieve.cuh
 * @brief Exact fused gather of a miss plan: every missed group row host → device slot,
 *        optionally in host-address order over the whole batch.
 *
 * The gather reads straight from the pinned host store (zero-copy over PCIe) with 16-byte
 * loads. A group of `lanes_per_row` lanes copies one group row; every lane issues all of
 * its loads of a row (up to four) before it stores, so a 656-byte row is one round trip of
 * 16 lanes and a warp keeps two rows in flight. Because a group row holds all layers of
 * the group, one pass serves every layer; `byte_begin`/`byte_end` restrict the copy to a
 * range of layers, which replays the same plan for a later part of the group (e.g. to
 * overlap the copy of layers 1… with attention of layer 0).
 *
 * Address order. Resolve emits each request's misses in position order (host-address order
 * within the request's pages), request after request in whatever order their blocks finish.
 * Small rows gathered from random places of a large store reach about half of the pinned
 * memcpy bandwidth; the same rows in host-address order reach 0.8–0.9 of it (BENCH.md).
 * `order_plan_async` sorts a plan in place by host address, over all requests, on the
 * device (count read on the device, no host sync, work in proportion to the entries plus
 * a fixed 64 Ki-bucket scan, graph-capturable); `retrieve_async(params, order, …)` orders
 * and then gathers.
 *
 * @code
 * // Once: workspace for the plan's capacity and the store's address range, zeroed.
 * std::size_t bytes = dhisparse::order_plan_workspace_size(store_bytes, plan.capacity);
 * cudaMalloc(&ws, bytes); cudaMemsetAsync(ws, 0, bytes, stream);
 * // Every step, after resolve:
 * dhisparse::plan_order_params order{plan, store.ref().base, store_bytes, 0};
 * dhisparse::retrieve_async(params, order, ws, bytes, 0, stream);
 * @endcode
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/miss_plan.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {

/// Arguments of one retrieve. Grid-invariant, passed by value.
struct retrieve_params {
  miss_plan_ref plan;            ///< entries [0, *plan.count)
  std::byte* slab;               ///< destination [num_slots][group_row_bytes]
  std::size_t group_row_bytes;   ///< layers × row bytes
  std::size_t byte_begin;        ///< first byte of each group row to copy (multiple of 16)
  std::size_t byte_end;          ///< one past the last (multiple of 16, ≤ group_row_bytes)
  /// Lanes that copy one row together: 4, 8, 16 or 32; 0 (default) picks the fewest that
  /// copy the bytes in at most four 16-byte loads per lane (32 above 1 KiB).
  int lanes_per_row;
};

/**
 * @brief Enqueues the copy of every plan entry on `stream` (no allocation, no host sync).
 *
 * Launched as a programmatic dependent of the stream's previous kernel: its blocks wait on
 * the device for that kernel (e.g. resolve's allocate or `order_plan_async`) to complete.
 * @param blocks grid size (0: a default that fills the device); the plan's length is read
 *               on device, so the launch shape does not depend on it
 * @return cudaErrorInvalidValue (nothing enqueued) when `retrieve_params_problem` reports a
 *         problem, else the launch status
 */
cudaError_t retrieve_async(retrieve_params const& params, int blocks, cudaStream_t stream);

/// The arguments `retrieve_async` checks (byte ranges multiples of 16 and within the group
/// row, a supported `lanes_per_row`): a message naming the first bad one, or empty.
std::string retrieve_params_problem(retrieve_params const& params);

/// Arguments of `order_plan_async`: which plan, and the host address range it reads.
struct plan_order_params {
  miss_plan_ref plan;           ///< reordered in place: entries [0, min(*count, capacity))
  std::byte const* host_base;   ///< device address of the host range (e.g. `host_store_ref::base`)
  std::size_t host_bytes;       ///< bytes of that range (e.g. capacity_pages × page_bytes)
  /// Plans with fewer entries are left as emitted (every entry is in flight at once then,
  /// so order does not matter; the ordering kernels return at once). 0: order every plan.
  std::int32_t min_entries;
};

/**
 * @brief Bytes of workspace `order_plan_async` needs for plans of up to `capacity` entries
 *        over `host_bytes` of host memory. The workspace must be zeroed once before its
 *        first use (e.g. `cudaMemsetAsync`); every call leaves it zeroed again.
 */
std::size_t order_plan_workspace_size(std::size_t host_bytes, std::int32_t capacity);

/**
 * @brief Sorts the plan's entries in place by (host address, slot, position) on `stream`:
 *        a bucket pass over 64 Ki address ranges, then an exact rank within each bucket.
 *        Stream-ordered, allocation-free, host-sync-free, fixed launch shapes (the entry
 *        count is read on the device): capturable in a CUDA graph.
 *
 * Exact: the result is a permutation of the entries (the gather copies the same rows to
 * the same slots in another order). Entries outside `[host_base, host_base + host_bytes)`
 * (or null) go last; a bucket of more than 4096 entries keeps its entries in arrival order
 * (possible only with duplicate or 16-byte rows).
 * @return cudaErrorInvalidValue (nothing enqueued) when `plan_order_problem` reports a
 *         problem; else the launch status
 */
cudaError_t order_plan_async(plan_order_params const& params, void* workspace, std::size_t workspace_bytes,
                             cudaStream_t stream);

/// The arguments `order_plan_async` checks (a null plan, a null, misaligned or too small
/// workspace, an empty host range): a message naming the first bad one, or empty.
std::string plan_order_problem(plan_order_params const& params, void const* workspace, std::size_t workspace_bytes);

/**
 * @brief `order_plan_async` then `retrieve_async` on the same plan (`params.plan` and
 *        `order.plan` must name the same entries and count): missed rows gathered in
 *        host-address order over the whole batch.
 * @return cudaErrorInvalidValue (nothing enqueued) when `retrieve_params_problem` or
 *         `plan_order_problem` reports a problem or the two plans differ; else the launch
 *         status
 */
cudaError_t retrieve_async(retrieve_params const& params, plan_order_params const& order, void* workspace,
                           std::size_t workspace_bytes, int blocks, cudaStream_t stream);

}  // namespace dhisparse

#include <dhisparse/detail/retrieve/kernels.cuh>  // and, at its bottom, detail/retrieve/order.cuh
