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

/// Warp-aggregated shared `atomicAdd(counter, v)` for 0 ≤ v ≤ Max (every lane calls it):
/// one ballot per bit of Max.
template <int Max>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void warp_add(int* counter, int v)
{
  int sum = 0;
#pragma unroll
  for (int bit = 0; (1 << bit) <= Max; ++bit) { sum += __popc(__ballot_sync(0xFFFFFFFFu, (v >> bit) & 1)) << bit; }
  if ((threadIdx.x & 31) == 0 && sum != 0) { atomicAdd(counter, sum); }
}

/**
 * One tile: entries [first, first + Per × Block) of batch entry b, Per per thread (entry
 * first + e × Block + t for thread t), their loads issued together: a hit is a chain of
 * four dependent loads (selection, page directory, map entry, the slot's pin and state),
 * so a thread with one entry leaves the SM waiting on latency when a request has many
 * tiles. The first tile of a request also finds its tail rows: the prefix of its Q tails
 * that has storage and no uncommitted predecessor (checked beside the entries, so that
 * their loads overlap).
 */
template <class Eviction, class Budget, int Block, int Per>
DHISPARSE_DEVICE void lookup_tile(resolve_params const& p, workspace_view const& w, int b, int first,
                                  std::uint32_t epoch, tile_totals& totals)
{
  constexpr bool counts     = Eviction::counts_selections;
  constexpr bool uses_cache = Budget::kind == budget_kind::per_request &&
                              Eviction::search == victim_search::smallest_key;
  auto const& pool          = p.pool;
  int const entries         = int(w.entries);  // ≤ max_request_entries
  std::int64_t const row    = std::int64_t(b) * entries;
  // The independent loads first: the selections, and the request's row of the batch.
  std::int32_t pos[Per];
#pragma unroll
  for (int e = 0; e < Per; ++e) {
    int const i = first + e * Block + int(threadIdx.x);
    pos[e]      = i < entries ? p.selections[row + i] : -1;
  }
  std::int32_t const r   = p.batch.requests[b];
  std::int32_t const nq  = p.batch.queries[b];
  std::int32_t const len = p.batch.lengths[r];
  cache_bound bound{};
  if constexpr (uses_cache) { bound = cache_bound::load(pool.cache, r); }
  // Tails (first tile): thread t checks tails t, t + Block, …; it keeps its lowest refusal.
  std::uint32_t refused = 0;
  int refused_tail      = nq;
  for (int t = int(threadIdx.x); first == 0 && t < nq && refused == 0; t += Block) {
    refused      = tail_refusal(p, r, len + t);
    refused_tail = t;
  }

  std::int32_t out[Per];
  std::int32_t* entry[Per];  // the map entry of a selection to look up, else null
  std::uint32_t flag = 0;
  int tail_selections = 0;
#pragma unroll
  for (int e = 0; e < Per; ++e) {
    int const q = (first + e * Block + int(threadIdx.x)) / p.top_k;
    out[e]      = -1;
    entry[e]    = nullptr;
    if (q >= nq || pos[e] == -1) { continue; }
    if (pos[e] < 0 || pos[e] > len + q) {
      flag |= status_invalid_selection;
    } else if (pos[e] >= len) {
      out[e] = pending;  // a tail row of this step: allocate gives it the tail's slot, or -1
      ++tail_selections;
    } else if ((entry[e] = p.map.entry(r, p.group, pos[e])) == nullptr) {
      flag |= status_capacity_exceeded;
    }
  }
  std::int32_t slot[Per];
#pragma unroll
  for (int e = 0; e < Per; ++e) { slot[e] = entry[e] != nullptr ? *entry[e] : not_resident; }
  int hits = 0, misses = 0;
#pragma unroll
  for (int e = 0; e < Per; ++e) {
    if (entry[e] == nullptr) { continue; }
    int const i = first + e * Block + int(threadIdx.x);
    if (slot[e] >= 0) {
      out[e] = slot[e];
      if constexpr (counts) {
        // The hooks run in allocate, once every selection of the row has been counted.
        hits += atomicExch(pool.touched + slot[e], epoch) != epoch;
        accumulate_selection(pool, slot[e], p.scores != nullptr ? p.scores[row + i] : 0.f);
      } else {
        policy_state const state = pool.state[slot[e]];  // read beside the pin: only its winner writes
        if (atomicExch(pool.touched + slot[e], epoch) != epoch) {
          ++hits;
          policy_state const next = Eviction::on_hit(state, selection_context{epoch, pos[e], 0.f, 1u});
          pool.state[slot[e]]     = next;
          if constexpr (!hits_raise_keys_v<Eviction>) {
            lower_key_floor(pool, slot[e], Eviction::eviction_key(next, pos[e]));
          }
          if constexpr (uses_cache) {
            if (bound.breaks(Eviction::eviction_key(next, pos[e]), pos[e])) { invalidate_cache(pool.cache, r); }
          }
        }
      }
    } else {
      std::uint32_t* bits     = w.miss_bits + std::int64_t(b) * w.bitmap_words;
      std::uint32_t const bit = 1u << (pos[e] & 31);
      if ((atomicOr(bits + (pos[e] >> 5), bit) & bit) == 0) {
        atomicOr(w.miss_words + std::int64_t(b) * w.summary_words + (pos[e] >> 10), 1u << ((pos[e] >> 5) & 31));
        ++misses;
      }
      out[e] = pending;
    }
  }
#pragma unroll
  for (int e = 0; e < Per; ++e) {
    int const i = first + e * Block + int(threadIdx.x);
    if (i < entries) { p.slot_table[row + i] = out[e]; }
  }
  warp_add<Per>(&totals.hits, hits);
  warp_add<Per>(&totals.misses, misses);
  warp_add<Per>(&totals.tail_selections, tail_selections);
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

/// Tiles of `per` entries per thread of a batch entry.
DHISPARSE_HOST_DEVICE inline int lookup_tiles(std::int64_t entries, int per)
{
  std::int64_t const tile = std::int64_t(lookup_block) * per;
  return int((entries + tile - 1) / tile);
}

/// Entries per thread of `lookup`'s tiles when a block has several tiles to look up.
inline constexpr int lookup_per_thread = 4;

/**
 * The tiles of the step, several per block (Per entries per thread each). Tiles are sized
 * for max_queries; a request with fewer queries has dead tiles (entries of queries
 * q ≥ Q_b only, no tails). The block's next Block tiles are checked at once, one per
 * thread; live ones are looked up, dead ones only get their slot-table entries set to -1
 * (a lookup would cost a round trip and two barriers, and at Q = 1 of Qmax = 8 seven
 * tiles in eight are dead).
 */
template <class Eviction, class Budget, int Block, int Per>
DHISPARSE_DEVICE void lookup_tiles_of_block(resolve_params const& p, workspace_view const& w, std::uint32_t epoch,
                                            tile_totals& totals, std::uint32_t* live, std::uint32_t* dead)
{
  constexpr int tile_entries = Block * Per;
  int const tiles            = lookup_tiles(w.entries, Per);
  int const n                = *p.batch.size * tiles;
  for (int base = blockIdx.x; base < n; base += Block * gridDim.x) {
    int const t     = base + int(threadIdx.x) * int(gridDim.x);
    bool is_live    = false;
    if (t < n) {
      int const first = (t % tiles) * tile_entries;
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
#pragma unroll
        for (int e = 0; e < Per; ++e) {
          int const i = (tile % tiles) * tile_entries + e * Block + int(threadIdx.x);
          if (i < w.entries) { p.slot_table[std::int64_t(tile / tiles) * w.entries + i] = -1; }
        }
      }
    }
    for (int word = 0; word < Block / 32; ++word) {
      for (std::uint32_t m = live[word]; m != 0; m &= m - 1) {  // block-uniform
        int const tile = base + (word * 32 + __ffs(m) - 1) * int(gridDim.x);
        lookup_tile<Eviction, Budget, Block, Per>(p, w, tile / tiles, (tile % tiles) * tile_entries, epoch, totals);
      }
    }
    __syncthreads();  // live is rewritten by the next round
  }
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
  // With at most one tile of one entry per thread per block, every tile is looked up (a
  // live check would only add a round trip ahead of the tile's own loads) and a small
  // batch spreads over many SMs. With more, a block takes tiles of several entries per
  // thread, whose loads overlap.
  int const tiles = lookup_tiles(w.entries, 1);
  int const n     = *p.batch.size * tiles;
  if (n <= int(gridDim.x)) {
    if (int(blockIdx.x) < n) {
      lookup_tile<Eviction, Budget, Block, 1>(p, w, blockIdx.x / tiles, (blockIdx.x % tiles) * Block, epoch, totals);
    }
    return;
  }
  lookup_tiles_of_block<Eviction, Budget, Block, lookup_per_thread>(p, w, epoch, totals, live, dead);
}

}  // namespace dhisparse::detail::resolve
