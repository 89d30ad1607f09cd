/**
 * @file detail/resolve/kernels.cuh
 * @brief Launch of `resolve_async` (see resolve.cuh for the contract): `lookup`, the
 *        reclaim of shared budgets, `allocate`.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_info.cuh>
#include <dhisparse/detail/reclaim/kernels.cuh>
#include <dhisparse/detail/resolve/allocate.cuh>
#include <dhisparse/detail/resolve/lookup.cuh>
#include <dhisparse/detail/resolve/workspace.cuh>
#include <dhisparse/retrieve.cuh>
#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {
namespace detail::resolve {
// Defined in lookup.cuh and allocate.cuh; declared here too, because a translation unit
// that starts with one of them reaches this launcher (through resolve.cuh) first.
DHISPARSE_HOST_DEVICE inline int lookup_tiles(std::int64_t entries, int per);
template <class Eviction, class Budget, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block) lookup_kernel(resolve_params p, workspace_view w);
template <class Eviction, class Budget, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block) allocate_kernel(resolve_params p, workspace_view w);
template <int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block, retrieve::blocks_per_sm)
  fetch_kernel(retrieve_params p, std::int32_t const* batch_size);
}  // namespace detail::resolve

inline std::size_t resolve_workspace_size(int max_batch, int max_queries, int top_k, int max_context)
{
  std::size_t bytes = 0;
  detail::resolve::carve(nullptr, max_batch, max_queries, top_k, max_context, &bytes);
  return bytes;
}

template <class Eviction, class Budget>
std::string resolve_params_problem(resolve_params const& params, std::size_t workspace_bytes)
{
  namespace rd               = detail::resolve;
  constexpr bool per_request = Budget::kind == budget_kind::per_request;
  constexpr bool reclaims    = Budget::kind == budget_kind::shared && Budget::reclaim != reclaim_order::none;
  auto const& b              = params.batch;
  auto const str             = [](auto v) { return std::to_string(v); };
  std::int64_t const entries = std::int64_t(b.max_queries) * params.top_k;
  if (params.top_k <= 0) { return "resolve: top_k (" + str(params.top_k) + ") must be positive"; }
  if (b.max_batch <= 0 || b.max_queries <= 0) { return "resolve: batch.max_batch / max_queries must be positive"; }
  if (params.max_context <= 0) { return "resolve: max_context must be positive"; }
  if (entries > rd::max_request_entries) {
    return "resolve: max_queries × top_k (" + str(entries) + ") exceeds " + str(rd::max_request_entries);
  }
  std::size_t const need = resolve_workspace_size(b.max_batch, b.max_queries, params.top_k, params.max_context);
  if (workspace_bytes < need) {
    return "resolve: workspace_bytes (" + str(workspace_bytes) + ") is below resolve_workspace_size (" + str(need) + ")";
  }
  if (params.plan.capacity < std::int64_t(b.max_batch) * entries) {
    return "resolve: plan.capacity (" + str(params.plan.capacity) + ") is below max_batch × max_queries × top_k (" +
           str(std::int64_t(b.max_batch) * entries) + ")";
  }
  if (Eviction::needs_scores && params.scores == nullptr) {
    return "resolve: scores is null (the eviction policy orders rows by the indexer's scores)";
  }
  if (per_request && params.pool.owned == nullptr) { return "resolve: pool.owned is null (a per-request budget)"; }
  if (per_request && Eviction::search == victim_search::smallest_key &&
      (params.pool.cache.capacity <= 0 || params.pool.cache.capacity > rd::max_cache_entries)) {
    return "resolve: pool.cache.capacity (" + str(params.pool.cache.capacity) + ") must be in [1, " +
           str(rd::max_cache_entries) + "] for this eviction policy and a per-request budget";
  }
  if (reclaims && params.reclaim.candidates == nullptr) {
    return "resolve: reclaim.candidates is null (a shared budget that reclaims)";
  }
  return {};
}

template <class Eviction, class Budget>
cudaError_t resolve_async(resolve_params const& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream)
{
  static_assert(is_complete_eviction_policy_v<Eviction>, "Eviction: see policy/concepts.hpp");
  static_assert(is_budget_policy_v<Budget>, "Budget: see policy/concepts.hpp");
  namespace rd                 = detail::resolve;
  namespace rc                 = detail::reclaim;
  constexpr bool reclaims      = Budget::kind == budget_kind::shared && Budget::reclaim != reclaim_order::none;
  constexpr bool per_request   = Budget::kind == budget_kind::per_request;
  auto const& b                = params.batch;
  std::int64_t const entries   = std::int64_t(b.max_queries) * params.top_k;
  if (!resolve_params_problem<Eviction, Budget>(params, workspace_bytes).empty()) { return cudaErrorInvalidValue; }
  auto const w = rd::carve(workspace, b.max_batch, b.max_queries, params.top_k, params.max_context);
  // Blocks loop over the real batch (its size is in device memory): launch shapes that do
  // not grow with max_batch beyond what the device runs at once. `lookup` spreads each
  // request over tiles, so that one request still occupies many SMs.
  int const sms = detail::multiprocessor_count();
  unsigned const lookup_grid =
    unsigned(std::min<std::int64_t>(std::int64_t(b.max_batch) * rd::lookup_tiles(entries, 1), 8 * sms));
  rd::lookup_kernel<Eviction, Budget, rd::lookup_block><<<lookup_grid, rd::lookup_block, 0, stream>>>(params, w);
  if constexpr (reclaims) {
    auto kernel = rc::resolve_reclaim_kernel<Eviction, rc::block_size>;
    int const blocks =
      params.reclaim_blocks > 0 ? params.reclaim_blocks : rc::resident_blocks(kernel, rc::block_size);
    if (blocks <= 0) { return cudaErrorInvalidConfiguration; }
    reclaim_params rp{};
    rp.pool     = params.pool;
    rp.map      = params.map;
    rp.scratch  = params.reclaim;
    rp.group    = params.group;
    rp.floors   = b.floors;
    rp.order    = Budget::reclaim;
    rp.blocks   = blocks;
    // Not a cooperative launch (those are not started early): the blocks that have started
    // when a reclaim is found needed form its team (reclaim::join_team).
    cudaError_t const launched = detail::launch_dependent(kernel, unsigned(blocks), rc::block_size, stream, rp, w.need,
                                                          w.epoch, w.roster, b, params.reclaim_low_watermark,
                                                          params.reclaim_batch);
    if (launched != cudaSuccess) { return launched; }
  }
  // Per-request victim search by key: the rescan keeps as much of an owned list in shared
  // memory as a block can hold beside the kernel's own (all of it up to ≈ 16 000 rows).
  std::size_t stage_bytes = 0;
  auto* allocate          = rd::allocate_kernel<Eviction, Budget, rd::block_size>;
  if constexpr (per_request && Eviction::search == victim_search::smallest_key) {
    std::size_t available = 0;
    cudaError_t status    = detail::dynamic_shared_bytes(allocate, available);
    if (status != cudaSuccess) { return status; }
    std::size_t const rows = std::min(std::size_t(params.pool.max_owned), available / rd::rescan_stage::bytes(1));
    stage_bytes            = rd::rescan_stage::bytes(int(rows));
    status = cudaFuncSetAttribute(allocate, cudaFuncAttributeMaxDynamicSharedMemorySize, int(stage_bytes));
    if (status != cudaSuccess) { return status; }
  }
  // allocate starts while its predecessor finishes (its blocks wait on the device, not
  // behind a launch gap); so does the gather of the missed rows.
  cudaError_t launched = detail::launch_dependent_shared(allocate, unsigned(std::min(b.max_batch, 4 * sms)),
                                                         rd::block_size, stage_bytes, stream, params, w);
  if (launched == cudaSuccess && params.fetch_rows) {
    retrieve_params rp{};
    rp.plan            = params.plan;
    rp.slab            = params.pool.slab;
    rp.group_row_bytes = params.pool.group_row_bytes;
    rp.byte_begin      = 0;
    rp.byte_end        = params.pool.group_row_bytes;
    launched = detail::launch_dependent(rd::fetch_kernel<detail::retrieve::block_size>,
                                        unsigned(detail::retrieve::default_blocks()),
                                        detail::retrieve::block_size, stream, rp, b.size);
  }
  if (launched != cudaSuccess) { return launched; }
  return detail::check_launch(stream);
}

}  // namespace dhisparse
