/**
 * @file detail/resolve/lookup.cuh
 * @brief First kernel of resolve: tiles of `lookup_block` entries, several per request, so
 *        that a small batch still spreads over the device. Validates every entry, pins
 *        hits (the policy's `on_hit` once per row, or the per-step accumulators of
 *        policies that count selections), marks misses in the request's bitmap (the union
 *        over queries and duplicates) and counts them, and writes the slot table of hits.
 *        Misses and selected tail rows are left `pending` for `allocate`.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/resolve/common.cuh>
#include <dhisparse/detail/resolve/workspace.cuh>
#include <dhisparse/resolve.cuh>
#include <dhisparse/status.hpp>

#include <cstdint>

namespace dhisparse::detail::resolve {

/**
 * Tail rows of batch entry b: the prefix of its Q tails that has storage and no
 * uncommitted predecessor. Block-wide (threads check tails in parallel); returns the
 * count and ORs the reason of the first refused tail into `flags`.
 */
DHISPARSE_DEVICE inline int count_tails(resolve_params const& p, std::int32_t r, std::int32_t nq, std::int32_t len,
                                 std::uint32_t& flags)
{
  __shared__ int first_refused;
  if (threadIdx.x == 0) { first_refused = nq; }
  __syncthreads();
  std::uint32_t reason = 0;
  int mine             = nq;
  for (int t = threadIdx.x; t < nq; t += blockDim.x) {
    std::int32_t const pos    = len + t;
    std::int32_t const* entry = p.map.entry(r, p.group, pos);
    std::uint32_t why         = 0;
    if (pos >= p.batch.capacities[r] || entry == nullptr || p.host.group_row(r, pos, p.layout) == nullptr) {
      why = status_capacity_exceeded;
    } else if (*entry != not_resident) {  // an earlier resolve's tail was never committed
      why = status_uncommitted_tail;
    }
    if (why != 0 && t < mine) {
      mine   = t;
      reason = why;
    }
  }
  if (mine < nq) { atomicMin(&first_refused, mine); }
  __syncthreads();
  int const tails = first_refused;
  if (mine == tails && mine < nq) { atomicOr(&flags, reason); }
  return tails;
}

/// One tile: entries [first, first + Block) of batch entry b (one per thread).
template <class Eviction, class Budget, int Block>
DHISPARSE_DEVICE void lookup_tile(resolve_params const& p, workspace_view const& w, int b, std::int64_t first,
                                  std::uint32_t epoch)
{
  __shared__ int tile_hits, tile_misses, tile_tail_selections;
  __shared__ std::uint32_t flags;
  constexpr bool counts     = Eviction::counts_selections;
  constexpr bool uses_cache = Budget::kind == budget_kind::per_request &&
                              Eviction::search == victim_search::smallest_key;
  auto const& pool          = p.pool;
  std::int64_t const i      = first + threadIdx.x;
  bool const in_tile        = i < w.entries;
  // The independent loads first: the selection, and the request's row of the batch.
  std::int32_t pos       = in_tile ? p.selections[std::int64_t(b) * w.entries + i] : -1;
  std::int32_t const r   = p.batch.requests[b];
  std::int32_t const nq  = p.batch.queries[b];
  std::int32_t const len = p.batch.lengths[r];
  cache_bound bound{};
  if constexpr (uses_cache) { bound = cache_bound::load(pool.cache, r); }
  if (threadIdx.x == 0) {
    tile_hits = tile_misses = tile_tail_selections = 0;
    flags                                          = 0;
  }
  __syncthreads();
  int const q = int(i / p.top_k);
  if (q >= nq) { pos = -1; }

  std::int32_t out = -1;
  if (pos != -1) {
    if (pos < 0 || pos > len + q) {
      atomicOr(&flags, status_invalid_selection);
    } else if (pos >= len) {
      out = pending;  // a tail row of this step: allocate gives it the tail's slot, or -1
      atomicAdd(&tile_tail_selections, 1);
    } else if (std::int32_t* entry = p.map.entry(r, p.group, pos); entry == nullptr) {
      atomicOr(&flags, status_capacity_exceeded);
    } else if (std::int32_t const slot = *entry; slot >= 0) {
      out = slot;
      if constexpr (counts) {
        // The hooks run in allocate, once every selection of the row has been counted.
        bool const first_selection = atomicExch(pool.touched + slot, epoch) != epoch;
        accumulate_selection(pool, slot, p.scores != nullptr ? p.scores[std::int64_t(b) * w.entries + i] : 0.f);
        if (first_selection) { atomicAdd(&tile_hits, 1); }
      } else {
        policy_state const state   = pool.state[slot];  // read beside the pin: only its winner writes
        bool const first_selection = atomicExch(pool.touched + slot, epoch) != epoch;
        if (first_selection) {
          atomicAdd(&tile_hits, 1);
          policy_state const next = Eviction::on_hit(state, selection_context{epoch, pos, 0.f, 1u});
          pool.state[slot]        = next;
          if constexpr (uses_cache) {
            if (bound.breaks(Eviction::eviction_key(next, pos), pos)) { invalidate_cache(pool.cache, r); }
          }
        }
      }
    } else {
      std::uint32_t* bits     = w.miss_bits + std::int64_t(b) * w.bitmap_words;
      std::uint32_t const bit = 1u << (pos & 31);
      if ((atomicOr(bits + (pos >> 5), bit) & bit) == 0) {
        atomicOr(w.miss_words + std::int64_t(b) * w.summary_words + (pos >> 10), 1u << ((pos >> 5) & 31));
        atomicAdd(&tile_misses, 1);
      }
      out = pending;
    }
  }
  if (in_tile) { p.slot_table[std::int64_t(b) * w.entries + i] = out; }
  int tails = 0;
  if (first == 0) { tails = count_tails(p, r, nq, len, flags); }  // block-uniform branch
  __syncthreads();
  if (threadIdx.x == 0) {
    request_need* need = w.need + b;
    if (first == 0) { need->tails = tails; }
    if (tile_misses != 0) { atomicAdd(&need->misses, tile_misses); }
    if (tile_hits != 0) { atomicAdd(&need->hits, tile_hits); }
    if (tile_tail_selections != 0) { atomicAdd(&need->tail_selections, tile_tail_selections); }
    if (flags != 0) { atomicOr(p.status, flags); }
  }
  __syncthreads();  // shared state is reused by the next tile of this block
}

/// Tiles per batch entry.
DHISPARSE_HOST_DEVICE inline int lookup_tiles(std::int64_t entries)
{
  return int((entries + lookup_block - 1) / lookup_block);
}

template <class Eviction, class Budget, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block) lookup_kernel(resolve_params p, workspace_view w)
{
  static_assert(Block == lookup_block);
  launch_dependents();  // allocate may be scheduled now; it waits for this grid's results
  std::uint32_t const epoch = *p.pool.epoch + 1;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *w.epoch      = epoch;
    *p.plan.count = 0;
  }
  int const tiles       = lookup_tiles(w.entries);
  std::int64_t const n  = std::int64_t(*p.batch.size) * tiles;
  for (std::int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    lookup_tile<Eviction, Budget, Block>(p, w, int(t / tiles), std::int64_t(t % tiles) * Block, epoch);
  }
}

}  // namespace dhisparse::detail::resolve
