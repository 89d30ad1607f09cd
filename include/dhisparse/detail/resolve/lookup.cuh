/**
 * @file detail/resolve/lookup.cuh
 * @brief First kernel of resolve: one block per request (a grid-stride loop over the real
 *        batch). Validates every entry, pins hits (the policy's `on_hit` once per row),
 *        marks misses in a bitmap (the union over queries and duplicates), writes the
 *        slot table of hits, and lists the misses in ascending position order.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/resolve/common.cuh>
#include <dhisparse/detail/resolve/workspace.cuh>
#include <dhisparse/resolve.cuh>
#include <dhisparse/status.hpp>

#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace dhisparse::detail::resolve {

/**
 * Appends, in ascending order, the set bits of `bits[words[0, n)]` (bit i of word w is
 * position 32 w + i) to `out` and clears those words. Returns the number appended.
 * Block-wide.
 */
template <int Block, class Scan>
DHISPARSE_DEVICE int drain_bits(std::uint32_t* bits, std::int32_t const* words, int n, std::int32_t* out,
                                typename Scan::TempStorage& temp)
{
  int written = 0;
  for (int base = 0; base < n; base += Block) {
    int const i             = base + int(threadIdx.x);
    std::int32_t const word = i < n ? words[i] : -1;
    std::uint32_t v         = word >= 0 ? bits[word] : 0u;
    int offset = 0, total = 0;
    Scan(temp).ExclusiveSum(__popc(v), offset, total);
    if (word >= 0) { bits[word] = 0; }
    while (v != 0) {
      int const bit          = __ffs(v) - 1;
      out[written + offset++] = word * 32 + bit;
      v &= v - 1;
    }
    written += total;
    __syncthreads();  // temp is reused by the next chunk
  }
  return written;
}

/**
 * Lists the non-zero words of a request's miss bitmap (from its summary bitmap, which it
 * clears) into `words`, ascending. Block-wide; returns how many.
 */
template <int Block, class Scan>
DHISPARSE_DEVICE int list_words(std::uint32_t* summary, std::int64_t summary_words, std::int32_t* words,
                                typename Scan::TempStorage& temp)
{
  int written = 0;
  for (std::int64_t base = 0; base < summary_words; base += Block) {
    std::int64_t const i = base + threadIdx.x;
    std::uint32_t v      = i < summary_words ? summary[i] : 0u;
    int offset = 0, total = 0;
    Scan(temp).ExclusiveSum(__popc(v), offset, total);
    if (v != 0) { summary[i] = 0; }
    while (v != 0) {
      int const bit            = __ffs(v) - 1;
      words[written + offset++] = std::int32_t(i * 32 + bit);
      v &= v - 1;
    }
    written += total;
    __syncthreads();
  }
  return written;
}

template <class Eviction, class Budget, int Block>
DHISPARSE_DEVICE void lookup_request(resolve_params const& p, workspace_view const& w, int b,
                                     std::uint32_t epoch)
{
  using scan = cub::BlockScan<int, Block>;
  __shared__ typename scan::TempStorage temp;
  __shared__ int tails, hits;
  __shared__ std::uint32_t flags;
  constexpr bool counts      = Eviction::counts_selections;
  constexpr bool uses_cache  = Budget::kind == budget_kind::per_request &&
                               Eviction::search == victim_search::smallest_key;
  auto const& pool           = p.pool;
  std::int32_t const r       = p.batch.requests[b];
  std::int32_t const nq      = p.batch.queries[b];
  std::int32_t const len     = p.batch.lengths[r];
  std::int64_t const entries = w.entries;
  std::int32_t const* sel    = p.selections + std::int64_t(b) * entries;
  float const* scores        = p.scores != nullptr ? p.scores + std::int64_t(b) * entries : nullptr;
  std::int32_t* table        = p.slot_table + std::int64_t(b) * entries;
  std::uint32_t* bits        = w.miss_bits + std::int64_t(b) * w.bitmap_words;
  std::uint32_t* summary     = w.miss_words + std::int64_t(b) * w.summary_words;
  cache_bound bound{};
  if constexpr (uses_cache) { bound = cache_bound::load(pool.cache, r); }

  if (threadIdx.x == 0) {
    // Tail rows: a prefix of the Q tails that has storage and no uncommitted predecessor.
    std::uint32_t f = 0;
    int t           = 0;
    while (t < nq) {
      std::int32_t const pos    = len + t;
      std::int32_t const* entry = p.map.entry(r, p.group, pos);
      if (pos >= p.batch.capacities[r] || entry == nullptr || p.host.group_row(r, pos, p.layout) == nullptr) {
        f |= status_capacity_exceeded;
        break;
      }
      if (*entry != not_resident) {  // an earlier resolve's tail was never committed
        f |= status_uncommitted_tail;
        break;
      }
      ++t;
    }
    tails  = t;
    flags  = f;
    hits   = 0;
  }
  __syncthreads();

  std::uint32_t won = 0;  // bit j: this thread's j-th entry made the row's first selection
  bool stale_cache  = false;
  int my_hits       = 0;
  for (int j = 0; j * Block < entries; ++j) {
    std::int64_t const i = std::int64_t(j) * Block + threadIdx.x;
    if (i >= entries) { break; }
    int const q              = int(i / p.top_k);
    std::int32_t out        = -1;
    std::int32_t const pos  = q < nq ? sel[i] : -1;
    if (pos != -1) {
      if (pos < 0 || pos > len + q) {
        atomicOr(&flags, status_invalid_selection);
      } else if (pos >= len) {
        out = pos - len < tails ? pending : -1;  // a tail row of this step
      } else if (std::int32_t* entry = p.map.entry(r, p.group, pos); entry == nullptr) {
        atomicOr(&flags, status_capacity_exceeded);
      } else if (std::int32_t const slot = *entry; slot >= 0) {
        out             = slot;
        bool const first = atomicExch(pool.touched + slot, epoch) != epoch;
        my_hits += first;
        if constexpr (counts) {
          accumulate_selection(pool, slot, scores != nullptr ? scores[i] : 0.f);
          won |= std::uint32_t(first) << j;
        } else if (first) {
          pool.state[slot] = Eviction::on_hit(pool.state[slot], selection_context{epoch, pos, 0.f, 1u});
          if constexpr (uses_cache) {
            stale_cache |= bound.breaks(Eviction::eviction_key(pool.state[slot], pos), pos);
          }
        }
      } else {
        std::uint32_t const bit = 1u << (pos & 31);
        if ((atomicOr(bits + (pos >> 5), bit) & bit) == 0) {
          atomicOr(summary + (pos >> 10), 1u << ((pos >> 5) & 31));
        }
        out = pending;
      }
    }
    table[i] = out;
  }
  if constexpr (counts) {
    __syncthreads();  // every selection has been accumulated
    for (int j = 0; won != 0; ++j, won >>= 1) {
      if ((won & 1u) == 0) { continue; }
      std::int64_t const i    = std::int64_t(j) * Block + threadIdx.x;
      std::int32_t const slot = table[i];
      std::int32_t const pos  = sel[i];
      pool.state[slot] = Eviction::on_hit(pool.state[slot], take_selection(pool, slot, epoch, pos));
      if constexpr (uses_cache) { stale_cache |= bound.breaks(Eviction::eviction_key(pool.state[slot], pos), pos); }
    }
  }
  if (my_hits != 0) { atomicAdd(&hits, my_hits); }
  if constexpr (uses_cache) {
    if (__syncthreads_or(stale_cache) && threadIdx.x == 0) { invalidate_cache(pool.cache, r); }
  } else {
    __syncthreads();
  }

  // The misses, ascending: the non-zero bitmap words from the summary, then their bits.
  std::int32_t* word_list = w.scratch + std::int64_t(b) * (entries + p.batch.max_queries);
  int const n_words       = list_words<Block, scan>(summary, w.summary_words, word_list, temp);
  int const n_misses = drain_bits<Block, scan>(bits, word_list, n_words, w.misses + std::int64_t(b) * entries, temp);
  if (threadIdx.x == 0) {
    w.need[b] = request_need{n_misses, tails};
    if (flags != 0) { atomicOr(p.status, flags); }
    atomicAdd(&pool.counters->selected_rows, static_cast<unsigned long long>(hits + n_misses));
  }
  __syncthreads();  // shared state is reused by the next request of this block
}

template <class Eviction, class Budget, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block) lookup_kernel(resolve_params p, workspace_view w)
{
  std::uint32_t const epoch = *p.pool.epoch + 1;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *w.epoch      = epoch;
    *p.plan.count = 0;
  }
  int const batch = *p.batch.size;
  for (int b = blockIdx.x; b < batch; b += gridDim.x) {
    lookup_request<Eviction, Budget, Block>(p, w, b, epoch);
  }
}

}  // namespace dhisparse::detail::resolve
