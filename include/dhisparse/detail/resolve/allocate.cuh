/**
 * @file detail/resolve/allocate.cuh
 * @brief Last kernel of resolve: one block per request. Lists its misses (ascending,
 *        from the bitmap `lookup` marked), then gives its tail rows, then its misses,
 *        slots — its spare slots first, then the free pool up to its
 *        cap, then (per-request budgets) victims among its own rows — maps them, writes
 *        the plan and the tail slots, and fills the slot-table entries `lookup` left
 *        pending. With `fetch_rows` small batches get the gather of the plan as a
 *        dependent launch (`fetch_kernel`, all SMs on a few requests' rows) and larger
 *        ones copy their rows in the allocate block (copies overlap other requests'
 *        allocation).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/resolve/common.cuh>
#include <dhisparse/detail/resolve/victims.cuh>
#include <dhisparse/detail/resolve/workspace.cuh>
#include <dhisparse/resolve.cuh>
#include <dhisparse/retrieve.cuh>
#include <dhisparse/status.hpp>

#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <type_traits>

namespace dhisparse::detail::resolve {

/// Where the slot of the i-th new row of a request comes from.
struct slot_sources {
  std::int32_t const* spare;       ///< the request's spare stack (top = its last entry)
  int spares;                      ///< spare slots used
  int spare_top;                   ///< entries on the spare stack before
  std::int32_t const* free_stack;
  int popped;                      ///< slots popped from the free stack
  int pop_top;                     ///< free-stack size before the pop
  std::int32_t const* victims;

  DHISPARSE_DEVICE std::int32_t operator()(int i) const
  {
    if (i < spares) { return spare[spare_top - 1 - i]; }
    if (i < spares + popped) { return free_stack[pop_top - 1 - (i - spares)]; }
    return victims[i - spares - popped];
  }
};

/**
 * Takes up to `want` slots off the free stack; returns how many, and the stack size before
 * through `top`. Called by one thread per block. One fetch-and-subtract, not a CAS loop:
 * the blocks of a large batch pop at once, and a CAS loop would serialise them (one winner
 * per round trip). A block that overdraws takes what was left and clamps the counter back
 * to zero; as nothing pushes while allocate runs, the ranges taken stay disjoint.
 */
DHISPARSE_DEVICE inline int pop_free(device_pool_ref const& pool, int want, int& top)
{
  int const before = atomicSub(pool.free_count, want);
  int const take   = max(0, min(want, before));
  if (take < want) { atomicMax(pool.free_count, 0); }
  top = before;
  return take;
}

/**
 * Copies the group rows of plan entries [0, n) host → device, block-wide: the flattened
 * (row, 16-byte vector) pairs are spread over the threads, `Unroll` loads in flight each.
 */
template <int Block, int Unroll = 4>
DHISPARSE_DEVICE void block_copy_rows(miss_entry const* entries, int n, std::byte* slab, std::size_t group_row_bytes)
{
  int const vectors        = int(group_row_bytes / 16);
  std::int64_t const total = std::int64_t(n) * vectors;
  for (std::int64_t base = threadIdx.x; base < total; base += std::int64_t(Block) * Unroll) {
    int4 v[Unroll];
    int4* dst[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      std::int64_t const i = base + std::int64_t(u) * Block;
      dst[u]               = nullptr;
      if (i < total) {
        miss_entry const& e = entries[i / vectors];
        int const vec       = int(i % vectors);
        v[u]                = reinterpret_cast<int4 const*>(e.src)[vec];
        dst[u] = reinterpret_cast<int4*>(slab + std::size_t(e.slot) * group_row_bytes) + vec;
      }
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      if (dst[u] != nullptr) { *dst[u] = v[u]; }
    }
  }
}

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

/// The allocation of batch entry b (see the file comment).
template <class Eviction, class Budget, int Block, class Storage>
DHISPARSE_DEVICE void allocate_request(resolve_params const& p, workspace_view const& w, int b, std::uint32_t epoch,
                                       bool in_block_copy, rescan_stage const& stage, Storage& vs)
{
  constexpr bool per_request = Budget::kind == budget_kind::per_request;
  constexpr bool counts      = Eviction::counts_selections;
  constexpr bool uses_cache  = per_request && Eviction::search == victim_search::smallest_key;
  using scan = cub::BlockScan<int, Block>;
  __shared__ typename scan::TempStorage temp;
  __shared__ slot_sources src;
  __shared__ int found_victims, plan_base;
  __shared__ std::uint32_t flags;
  auto const& pool            = p.pool;
  std::int32_t const r        = p.batch.requests[b];
  std::int32_t const nq       = p.batch.queries[b];
  if (nq == 0) {
    // Not part of the step (a repeated or released entry): no rows, no tails. Its request
    // index may be another entry's, whose block owns the request's lists this step — a
    // write-back of counts read here would undo that block's allocation (F19).
    for (int j = threadIdx.x; j < p.batch.max_queries; j += Block) {
      p.tail_slots[std::int64_t(b) * p.batch.max_queries + j] = -1;
    }
    if (threadIdx.x == 0) { w.need[b] = request_need{}; }
    return;
  }
  std::int32_t const len      = p.batch.lengths[r];
  std::int64_t const entries  = w.entries;
  request_need const need     = w.need[b];
  int const rows              = need.misses + need.tails;
  std::int32_t* const misses  = w.misses + std::int64_t(b) * entries;
  std::int32_t* const victims = w.scratch + std::int64_t(b) * (entries + p.batch.max_queries);
  std::int32_t const owned_n  = pool.owned_count[r];
  std::int32_t const* sel     = p.selections + std::int64_t(b) * entries;
  std::int32_t* table         = p.slot_table + std::int64_t(b) * entries;
  int const live              = nq * p.top_k;  // ≤ max_request_entries

  // The misses, ascending: the non-zero bitmap words from the summary, then their bits
  // (victims reuses the word list's scratch afterwards).
  if (need.misses > 0) {
    int const n_words = list_words<Block, scan>(w.miss_words + std::int64_t(b) * w.summary_words, w.summary_words,
                                                victims, temp);
    drain_bits<Block, scan>(w.miss_bits + std::int64_t(b) * w.bitmap_words, victims, n_words, misses, temp);
  }
  if constexpr (counts) {
    // The hits' hooks, once per row, now that every selection of the step is counted.
    bool stale = false;
    cache_bound const bound = uses_cache ? cache_bound::load(pool.cache, r) : cache_bound{};
    for (std::int64_t i = threadIdx.x; i < live && need.hits > 0; i += Block) {
      std::int32_t const slot = table[i];
      if (slot < 0) { continue; }
      std::uint32_t const count = atomicExch(pool.sel_count + slot, 0u);
      if (count == 0) { continue; }  // another entry of the row took it
      std::int32_t const pos  = sel[i];
      float const score       = score_of(atomicExch(pool.sel_score + slot, 0u));
      pool.state[slot]        = Eviction::on_hit(pool.state[slot], selection_context{epoch, pos, score, count});
      if constexpr (!hits_raise_keys_v<Eviction>) {
        lower_key_floor(pool, slot, Eviction::eviction_key(pool.state[slot], pos));
      }
      if constexpr (uses_cache) { stale |= bound.breaks(Eviction::eviction_key(pool.state[slot], pos), pos); }
    }
    if constexpr (uses_cache) {
      if (__syncthreads_or(stale) && threadIdx.x == 0) { invalidate_cache(pool.cache, r); }
    }
  }
  __syncthreads();

  if (threadIdx.x == 0) {
    std::uint32_t f       = 0;
    int const spare_top   = pool.spare_count[r];
    int const spares      = min(spare_top, rows);
    int want              = rows - spares;
    if constexpr (per_request) { want = min(want, max(0, p.batch.caps[r] - owned_n)); }
    int top          = 0;
    int const popped = want > 0 ? pop_free(pool, want, top) : 0;
    if (popped < want) { f |= status_pool_exhausted; }
    src           = slot_sources{pool.spare + std::int64_t(r) * pool.spare_capacity, spares, spare_top,
                       pool.free_stack, popped, top, victims};
    found_victims = 0;
    flags         = f;
  }
  __syncthreads();
  slot_sources const from = src;
  if constexpr (per_request) {
    int const evict = rows - from.spares - from.popped;
    if (evict > 0) {
      int found = 0;
      if constexpr (Eviction::search == victim_search::sweep) {
        found = sweep_victims<Eviction, Block>(pool, r, epoch, evict, victims, vs);
      } else {
        found = smallest_key_victims<Eviction, Block>(pool, r, epoch, evict, victims, stage, vs);
      }
      if (threadIdx.x == 0) { found_victims = found; }
    }
  }
  __syncthreads();
  int const found    = found_victims;
  int const total    = from.spares + from.popped + found;
  int const tails    = min(need.tails, total);
  int const assigned = max(0, total - need.tails);  // misses with a slot
  if (threadIdx.x == 0) {
    if (total < rows) { flags |= status_budget_exceeded; }
    plan_base = assigned > 0 ? atomicAdd(p.plan.count, assigned) : 0;
    pool.spare_count[r] = from.spare_top - from.spares;
    pool.owned_count[r] = owned_n + from.popped;
    w.need[b]           = request_need{};  // for the next resolve
    group_counters* c   = pool.counters;
    atomicAdd(&c->selected_rows, static_cast<unsigned long long>(need.hits + need.misses));
    if (assigned > 0) { atomicAdd(&c->fetched_rows, static_cast<unsigned long long>(assigned)); }
    if (tails > 0) { atomicAdd(&c->tail_rows, static_cast<unsigned long long>(tails)); }
    if (found > 0) { atomicAdd(&c->evicted_rows, static_cast<unsigned long long>(found)); }
  }
  __syncthreads();

  cache_bound bound{};
  if constexpr (uses_cache) { bound = cache_bound::load(pool.cache, r); }
  bool stale_cache   = false;
  std::int32_t* tail_slots = p.tail_slots + std::int64_t(b) * p.batch.max_queries;
  std::int32_t* owned      = per_request ? pool.owned + std::int64_t(r) * pool.max_owned : nullptr;
  for (int i = threadIdx.x; i < total; i += Block) {
    std::int32_t const slot = from(i);
    bool const tail         = i < need.tails;
    std::int32_t const pos  = tail ? len + i : misses[i - need.tails];
    if (i >= from.spares + from.popped) {  // a victim: unmap its row
      *p.map.entry(r, p.group, pool.position[slot]) = not_resident;
    } else if (i >= from.spares) {  // from the free stack
      pool.owner[slot] = r;
      if constexpr (per_request) { owned[owned_n + (i - from.spares)] = slot; }
    }
    pool.position[slot] = pos;
    pool.touched[slot]  = epoch;
    pool.dirty[slot]    = tail ? 1u : 0u;
    if constexpr (!counts) {
      pool.state[slot] = Eviction::on_insert(selection_context{epoch, pos, 0.f, tail ? 0u : 1u});
      lower_key_floor(pool, slot, Eviction::eviction_key(pool.state[slot], pos));
      if constexpr (uses_cache) { stale_cache |= bound.breaks(Eviction::eviction_key(pool.state[slot], pos), pos); }
    }
    *p.map.entry(r, p.group, pos) = slot;
    if (tail) {
      tail_slots[i] = slot;
    } else {
      p.plan.entries[plan_base + (i - need.tails)] = miss_entry{p.host.group_row(r, pos, p.layout), slot, pos};
    }
  }
  for (int j = tails + int(threadIdx.x); j < p.batch.max_queries; j += Block) { tail_slots[j] = -1; }
  __syncthreads();  // every new row is mapped, every tail slot and plan entry written
  if (p.fetch_rows && in_block_copy && assigned > 0) {
    block_copy_rows<Block>(p.plan.entries + plan_base, assigned, pool.slab, pool.group_row_bytes);
  }

  // Entries left pending by lookup: their rows have slots now (or none: -1). A selected
  // tail row has its tail's slot if the tail got one.
  // Several entries per thread and pass, their loads issued together (the chain table →
  // map directory → map page is latency, not bandwidth).
  if (need.misses + need.tail_selections > 0) {
    constexpr int unroll = 4;
    for (int base = int(threadIdx.x); base < live; base += Block * unroll) {
      std::int32_t pos[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        int const i = base + u * Block;
        pos[u]      = -1;
        if (i < live) {
          std::int32_t const slot = table[i];
          std::int32_t const s    = sel[i];
          pos[u]                  = slot == pending ? s : -1;
        }
      }
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        if (pos[u] < 0) { continue; }
        int const i             = base + u * Block;
        std::int32_t const slot = pos[u] >= len ? tail_slots[pos[u] - len] : *p.map.entry(r, p.group, pos[u]);
        table[i]                = slot;
        if constexpr (counts) {
          if (slot >= 0) {
            accumulate_selection(pool, slot, p.scores != nullptr ? p.scores[std::int64_t(b) * entries + i] : 0.f);
          }
        }
      }
    }
  }
  if constexpr (counts) {
    __syncthreads();
    for (int i = threadIdx.x; i < total; i += Block) {
      std::int32_t const slot = from(i);
      std::int32_t const pos  = pool.position[slot];
      pool.state[slot]        = Eviction::on_insert(take_selection(pool, slot, epoch, pos));
      lower_key_floor(pool, slot, Eviction::eviction_key(pool.state[slot], pos));
      if constexpr (uses_cache) { stale_cache |= bound.breaks(Eviction::eviction_key(pool.state[slot], pos), pos); }
    }
  }
  if constexpr (uses_cache) {
    if (__syncthreads_or(stale_cache) && threadIdx.x == 0) { invalidate_cache(pool.cache, r); }
  }
  if (threadIdx.x == 0 && flags != 0) { atomicOr(p.status, flags); }
  __syncthreads();  // shared state is reused by the next request of this block
}

template <class Eviction, class Budget, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block) allocate_kernel(resolve_params p, workspace_view w)
{
  using storage = std::conditional_t<Budget::kind == budget_kind::per_request, victim_storage<Block>, int>;
  __shared__ storage vs;
  wait_for_prerequisites();  // launched early (programmatic dependent launch)
  launch_dependents();       // the gather of resolve_and_retrieve waits for this grid
  std::uint32_t const epoch = *w.epoch;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.pool.epoch = epoch;
    if constexpr (Budget::kind == budget_kind::shared && Budget::reclaim != reclaim_order::none) {
      for (int i = 0; i < roster_words; ++i) { w.roster[i] = 0; }  // every block of the reclaim has ended
    }
  }
  int const batch          = *p.batch.size;
  rescan_stage const stage = rescan_stage::of_launch();
  for (int b = blockIdx.x; b < batch; b += gridDim.x) {
    allocate_request<Eviction, Budget, Block>(p, w, b, epoch, batch >= in_block_copy_batch, stage, vs);
  }
}

/**
 * The gather of `resolve_and_retrieve` (a dependent of allocate): small batches only —
 * from `in_block_copy_batch` requests on, each allocate block has copied its own rows,
 * overlapping the copies with the other requests' allocation.
 */
template <int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block, retrieve::blocks_per_sm)
  fetch_kernel(retrieve_params p, std::int32_t const* batch_size)
{
  wait_for_prerequisites();
  if (*batch_size >= in_block_copy_batch) { return; }
  retrieve::gather(p);
}

}  // namespace dhisparse::detail::resolve
