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

/// Per-tile counters of `lookup`, set to zero at the kernel's start and after each tile.
struct tile_totals {
  int hits, misses, tail_selections;
  int first_refused;  ///< the lowest refused tail (1 << 30: none refused)
  std::uint32_t flags;
  std::uint32_t tail_reason;
};

/**
 * Why tail t (position len + t) of request r cannot be written this step: 0 if it can,
 * `status_capacity_exceeded` without storage, `status_uncommitted_tail` when an earlier
 * resolve's tail at that position was never committed.
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t tail_refusal(resolve_params const& p, std::int32_t r,
                                                                  std::int32_t pos)
{
  std::int32_t const* entry = p.map.entry(r, p.group, pos);
  if (pos >= p.batch.capacities[r] || entry == nullptr || p.host.group_row(r, pos, p.layout) == nullptr) {
    return status_capacity_exceeded;
  }
  return *entry != not_resident ? status_uncommitted_tail : 0u;
}

/// Warp-aggregated shared `atomicAdd(counter, 1)` for the lanes where `pred` holds.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void warp_count(int* counter, bool pred)
{
  unsigned const ballot = __ballot_sync(0xFFFFFFFFu, pred);
  if ((threadIdx.x & 31) == 0 && ballot != 0) { atomicAdd(counter, __popc(ballot)); }
}

/**
 * One tile: entries [first, first + Block) of batch entry b (one per thread). The first
 * tile of a request also finds its tail rows: the prefix of its Q tails that has storage
 * and no uncommitted predecessor (checked beside the entries, so that their loads overlap).
 */
template <class Eviction, class Budget, int Block>
DHISPARSE_DEVICE void lookup_tile(resolve_params const& p, workspace_view const& w, int b, int first,
                                  std::uint32_t epoch, tile_totals& totals)
{
  constexpr bool counts     = Eviction::counts_selections;
  constexpr bool uses_cache = Budget::kind == budget_kind::per_request &&
                              Eviction::search == victim_search::smallest_key;
  auto const& pool          = p.pool;
  int const entries         = int(w.entries);  // ≤ max_request_entries
  int const i               = first + int(threadIdx.x);
  bool const in_tile        = i < entries;
  std::int64_t const at     = std::int64_t(b) * entries + i;
  // The independent loads first: the selection, and the request's row of the batch.
  std::int32_t pos       = in_tile ? p.selections[at] : -1;
  std::int32_t const r   = p.batch.requests[b];
  std::int32_t const nq  = p.batch.queries[b];
  std::int32_t const len = p.batch.lengths[r];
  cache_bound bound{};
  if constexpr (uses_cache) { bound = cache_bound::load(pool.cache, r); }
  int const q = i / p.top_k;
  if (q >= nq) { pos = -1; }
  // Tails (first tile): thread t checks tails t, t + Block, …; it keeps its lowest refusal.
  std::uint32_t refused = 0;
  int refused_tail      = nq;
  for (int t = int(threadIdx.x); first == 0 && t < nq && refused == 0; t += Block) {
    refused      = tail_refusal(p, r, len + t);
    refused_tail = t;
  }

  std::int32_t out     = -1;
  bool hit             = false;  // the first selection of a resident row this step
  bool miss            = false;  // the first selection of a missing row
  bool tail_selection  = false;
  std::uint32_t flag   = 0;
  if (pos != -1) {
    if (pos < 0 || pos > len + q) {
      flag = status_invalid_selection;
    } else if (pos >= len) {
      out            = pending;  // a tail row of this step: allocate gives it the tail's slot, or -1
      tail_selection = true;
    } else if (std::int32_t* entry = p.map.entry(r, p.group, pos); entry == nullptr) {
      flag = status_capacity_exceeded;
    } else if (std::int32_t const slot = *entry; slot >= 0) {
      out = slot;
      if constexpr (counts) {
        // The hooks run in allocate, once every selection of the row has been counted.
        hit = atomicExch(pool.touched + slot, epoch) != epoch;
        accumulate_selection(pool, slot, p.scores != nullptr ? p.scores[at] : 0.f);
      } else {
        policy_state const state = pool.state[slot];  // read beside the pin: only its winner writes
        hit                      = atomicExch(pool.touched + slot, epoch) != epoch;
        if (hit) {
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
        miss = true;
      }
      out = pending;
    }
  }
  if (in_tile) { p.slot_table[at] = out; }
  warp_count(&totals.hits, hit);
  warp_count(&totals.misses, miss);
  warp_count(&totals.tail_selections, tail_selection);
  if (flag != 0) { atomicOr(&totals.flags, flag); }
  if (refused != 0) { atomicMin(&totals.first_refused, refused_tail); }
  __syncthreads();
  if (refused != 0 && refused_tail == totals.first_refused) { totals.tail_reason = refused; }
  __syncthreads();
  if (threadIdx.x == 0) {
    request_need* need = w.need + b;
    if (first == 0) { need->tails = min(nq, totals.first_refused); }
    if (totals.misses != 0) { atomicAdd(&need->misses, totals.misses); }
    if (totals.hits != 0) { atomicAdd(&need->hits, totals.hits); }
    if (totals.tail_selections != 0) { atomicAdd(&need->tail_selections, totals.tail_selections); }
    if ((totals.flags | totals.tail_reason) != 0) { atomicOr(p.status, totals.flags | totals.tail_reason); }
    totals = tile_totals{0, 0, 0, 1 << 30, 0u, 0u};
  }
  __syncthreads();  // the totals are reset before the next tile of this block counts
}

/// Tiles per batch entry.
DHISPARSE_HOST_DEVICE inline int lookup_tiles(std::int64_t entries)
{
  return int((entries + lookup_block - 1) / lookup_block);
}

template <class Eviction, class Budget, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block) lookup_kernel(resolve_params p, workspace_view w)
{
  static_assert(Block == lookup_block && Block % 32 == 0);
  __shared__ tile_totals totals;
  __shared__ std::uint32_t live[Block / 32], dead[Block / 32];
  launch_dependents();  // allocate may be scheduled now; it waits for this grid's results
  std::uint32_t const epoch = *p.pool.epoch + 1;
  if (threadIdx.x == 0) {
    totals = tile_totals{0, 0, 0, 1 << 30, 0u, 0u};
    if (blockIdx.x == 0) {
      *w.epoch      = epoch;
      *p.plan.count = 0;
    }
  }
  __syncthreads();
  // Tiles are sized for max_queries; a request with fewer queries has dead tiles (entries
  // of queries q ≥ Q_b only, no tails). The block's next Block tiles are checked at once,
  // one per thread; live ones are looked up, dead ones only get their slot-table entries
  // set to -1 (a lookup would cost a round trip and two barriers, and at Q = 1 of
  // Qmax = 8 seven tiles in eight are dead). With at most one tile per block the check
  // would only add a round trip ahead of the tile's own loads: every tile is looked up.
  int const tiles = lookup_tiles(w.entries);
  int const n     = *p.batch.size * tiles;
  if (n <= int(gridDim.x)) {
    if (int(blockIdx.x) < n) {
      lookup_tile<Eviction, Budget, Block>(p, w, blockIdx.x / tiles, (blockIdx.x % tiles) * Block, epoch, totals);
    }
    return;
  }
  for (int base = blockIdx.x; base < n; base += Block * gridDim.x) {
    int const t     = base + int(threadIdx.x) * int(gridDim.x);
    bool is_live    = false;
    if (t < n) {
      int const first = (t % tiles) * Block;
      is_live         = first == 0 || first < p.batch.queries[t / tiles] * p.top_k;
    }
    unsigned const ballot      = __ballot_sync(0xFFFFFFFFu, is_live);
    unsigned const dead_ballot = __ballot_sync(0xFFFFFFFFu, t < n && !is_live);
    if ((threadIdx.x & 31) == 0) {
      live[threadIdx.x / 32] = ballot;
      dead[threadIdx.x / 32] = dead_ballot;
    }
    __syncthreads();
    for (int word = 0; word < Block / 32; ++word) {
      for (std::uint32_t m = dead[word]; m != 0; m &= m - 1) {
        int const tile = base + (word * 32 + __ffs(m) - 1) * int(gridDim.x);
        int const i    = (tile % tiles) * Block + int(threadIdx.x);
        if (i < w.entries) { p.slot_table[std::int64_t(tile / tiles) * w.entries + i] = -1; }
      }
    }
    for (int word = 0; word < Block / 32; ++word) {
      for (std::uint32_t m = live[word]; m != 0; m &= m - 1) {  // block-uniform
        int const tile = base + (word * 32 + __ffs(m) - 1) * int(gridDim.x);
        lookup_tile<Eviction, Budget, Block>(p, w, tile / tiles, (tile % tiles) * Block, epoch, totals);
      }
    }
    __syncthreads();  // live is rewritten by the next round
  }
}

}  // namespace dhisparse::detail::resolve
