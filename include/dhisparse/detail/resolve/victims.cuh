/**
 * @file detail/resolve/victims.cuh
 * @brief Victim search of per-request budgets (a request at its cap evicts its own rows),
 *        block-wide, exact: the GPU evicts the rows the host reference evicts.
 *
 * Smallest-key policies use the request's *victim cache*: the C smallest (key, position)
 * of its rows, sorted, found by the last scan. Invariant while the cache is valid: every
 * row of the request whose current (key, position) is at most the cache's last entry is
 * in the cache with that key (keys change only when a row is selected or inserted; those
 * places invalidate the cache when a new key falls below its last entry). A step needing
 * n victims walks the cache from its head: entries whose row changed since are dropped,
 * pinned or dirty rows are kept for later steps, the first n others are the victims. Only
 * when the cache runs out is the owned list scanned again (a radix select of the C
 * smallest, then a sort of those), so a step needing a few victims costs a few entries.
 * The rescan's first pass gathers every row's key once and keeps it in shared memory
 * (`rescan_stage`); the select's levels and the compaction read it there.
 *
 * The CLOCK policy (`victim_search::sweep`) walks the owned list from the request's hand
 * instead, in chunks of a block: each chunk's decisions (spare a referenced row by clearing
 * its bit, evict an unreferenced one) are made in parallel and cut at the n-th victim, which
 * is exactly the sequential sweep.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/resolve/common.cuh>
#include <dhisparse/detail/resolve/workspace.cuh>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <cstddef>
#include <cstdint>

namespace dhisparse::detail::resolve {

/// Largest victim cache (entries per request) the rescan sorts in one block.
inline constexpr int max_cache_entries = 1024;

/// Lexicographic (key, position) order.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool key_less(std::uint64_t ka, std::int32_t pa, std::uint64_t kb,
                                                     std::int32_t pb)
{
  return ka < kb || (ka == kb && pa < pb);
}

/// Entries a thread reads per pass of the victim scans, their loads issued together: the
/// owned list is read through two levels of indirection (slot, then the slot's metadata),
/// so one entry per thread and iteration would leave the passes bound by latency.
inline constexpr int scan_unroll = 8;

/// Index of the highest set bit + 1 (0 for 0).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int bit_width(std::uint64_t v) { return 64 - __clzll(v); }

/**
 * Radix-selects the digit where the running count of `hist` (256 bins) reaches
 * `remaining`; returns it and lowers `remaining` by the counts of the smaller digits. One
 * warp calls it; every lane gets the result.
 */
DHISPARSE_DEVICE inline int pick_digit(unsigned const* hist, int& remaining)
{
  int const lane = threadIdx.x & 31;
  unsigned local[8];
  unsigned sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    local[i] = hist[lane * 8 + i];
    sum += local[i];
  }
  unsigned const incl    = warp_inclusive_sum(sum);
  unsigned const excl    = incl - sum;
  bool const here        = excl < unsigned(remaining) && incl >= unsigned(remaining);
  unsigned const ballot  = __ballot_sync(0xFFFFFFFFu, here);
  int const owner        = ballot != 0 ? __ffs(ballot) - 1 : 31;
  int digit              = 0;
  unsigned before        = 0;
  if (lane == owner) {
    unsigned acc = excl;
    int d        = 0;
    while (d < 7 && acc + local[d] < unsigned(remaining)) { acc += local[d++]; }
    digit  = lane * 8 + d;
    before = acc;
  }
  digit     = __shfl_sync(0xFFFFFFFFu, digit, owner);
  before    = __shfl_sync(0xFFFFFFFFu, before, owner);
  remaining -= int(before);
  return digit;
}

/**
 * Block-wide radix select of one level: among the values `value(i, v)` yields (true: a
 * candidate), narrows `prefix` (whose bits above `bits` are fixed) digit by digit to the
 * value where the running count reaches `remaining`, which it lowers by the count of
 * smaller values.
 */
template <int Block, class Value>
DHISPARSE_DEVICE void block_radix_level(int n, int bits, Value value, std::uint64_t& prefix, int& remaining)
{
  __shared__ unsigned hist[256];
  __shared__ std::uint64_t shared_prefix;
  __shared__ int shared_remaining;
  // The caller's threads may still be reading its shared results (block_threshold's tie
  // count and bounds before the tie-break level): thread 0 publishes this level's start
  // only after them. racecheck reported that read against this write (late-backup case of
  // test_hierarchy_gpu, deep rescans that take the tie-break passes).
  __syncthreads();
  if (threadIdx.x == 0) {
    shared_prefix    = prefix;
    shared_remaining = remaining;
  }
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += Block) { hist[i] = 0; }
    __syncthreads();
    std::uint64_t const want = shared_prefix;
    for (int base = threadIdx.x; base < n; base += Block * scan_unroll) {
      std::uint64_t v[scan_unroll];
      bool ok[scan_unroll];
#pragma unroll
      for (int u = 0; u < scan_unroll; ++u) {
        int const i = base + u * Block;
        v[u]        = 0;
        ok[u]       = i < n && value(i, v[u]);
      }
#pragma unroll
      for (int u = 0; u < scan_unroll; ++u) {
        if (ok[u] && ((v[u] ^ want) >> shift >> 8) == 0) { atomicAdd(&hist[(v[u] >> shift) & 255], 1u); }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      int rem     = shared_remaining;
      int const d = pick_digit(hist, rem);
      if (threadIdx.x == 0) {
        shared_prefix |= std::uint64_t(d) << shift;
        shared_remaining = rem;
      }
    }
    __syncthreads();  // hist and the prefix are read before the next digit rewrites them
  }
  __syncthreads();
  prefix    = shared_prefix;
  remaining = shared_remaining;
  __syncthreads();
}

/**
 * Block-wide: of the candidates i in [0, n) for which `get(i, key, tie)` returns true,
 * finds (K, T) such that `want` of them have (key, tie) ≤ (K, T) — (key, tie) pairs are
 * distinct and more than `want` candidates exist. `kmin`, `kmax` bound their keys. When at
 * least `enough` candidates have a key below the key where the count reaches `want`, those
 * are taken (T = all ties of K, K the key before): whole keys, and no tie-break passes.
 */
template <int Block, class Get>
DHISPARSE_DEVICE void block_threshold(int n, int want, int enough, std::uint64_t kmin, std::uint64_t kmax, Get get,
                                      std::uint64_t& out_key, std::uint32_t& out_tie)
{
  __shared__ int ties;
  __shared__ std::uint32_t tmin, tmax;
  if (threadIdx.x == 0) {
    ties = 0;
    tmin = 0xFFFFFFFFu;
    tmax = 0;
  }
  int const key_bits = (bit_width(kmin ^ kmax) + 7) / 8 * 8;
  std::uint64_t key_star = key_bits >= 64 ? 0 : kmin & (~std::uint64_t{0} << key_bits);
  int remaining          = want;
  block_radix_level<Block>(
    n, key_bits,
    [&](int i, std::uint64_t& v) {
      std::uint32_t tie = 0;
      return get(i, v, tie);
    },
    key_star, remaining);
  if (want - remaining >= enough) {  // at least `enough` below key_star, so key_star > kmin
    out_key = key_star - 1;
    out_tie = 0xFFFFFFFFu;
    return;
  }
  // The tie-break among the rows with the threshold key (per thread, then per warp).
  int my_ties           = 0;
  std::uint64_t my_tmin = 0xFFFFFFFFu, my_tmax = 0;
  for (int base = threadIdx.x; base < n; base += Block * scan_unroll) {
    std::uint64_t key[scan_unroll];
    std::uint32_t tie[scan_unroll];
    bool ok[scan_unroll];
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) {
      int const i = base + u * Block;
      key[u]      = 0;
      tie[u]      = 0;
      ok[u]       = i < n && get(i, key[u], tie[u]);
    }
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) {
      if (ok[u] && key[u] == key_star) {
        ++my_ties;
        my_tmin = min(my_tmin, std::uint64_t(tie[u]));
        my_tmax = max(my_tmax, std::uint64_t(tie[u]));
      }
    }
  }
  warp_min_max(my_tmin, my_tmax);
  my_ties = warp_sum(my_ties);
  if ((threadIdx.x & 31) == 0 && my_ties > 0) {
    atomicAdd(&ties, my_ties);
    atomicMin(&tmin, std::uint32_t(my_tmin));
    atomicMax(&tmax, std::uint32_t(my_tmax));
  }
  __syncthreads();
  out_key = key_star;
  if (remaining == ties) {
    out_tie = 0xFFFFFFFFu;
    return;
  }
  int const tie_bits    = (bit_width(std::uint64_t(tmin ^ tmax)) + 7) / 8 * 8;
  std::uint64_t tie_star = tie_bits >= 32 ? 0 : tmin & (~0u << tie_bits);
  block_radix_level<Block>(
    n, tie_bits,
    [&](int i, std::uint64_t& v) {
      std::uint64_t key = 0;
      std::uint32_t tie = 0;
      bool const ok     = get(i, key, tie) && key == key_star;
      v                 = tie;
      return ok;
    },
    tie_star, remaining);
  out_tie = std::uint32_t(tie_star);
}

/// Shared memory of the per-request victim search.
template <int Block>
struct victim_storage {
  static constexpr int per_thread = max_cache_entries / Block;
  using sort = cub::BlockRadixSort<std::uint64_t, Block, per_thread, int>;
  using scan = cub::BlockScan<int, Block>;
  union {
    typename sort::TempStorage sort;
    typename scan::TempStorage scan;
  } temp;
  std::uint64_t key[max_cache_entries];
  std::int32_t slot[max_cache_entries];
  std::int32_t position[max_cache_entries];
  std::uint64_t kmin, kmax;
  int count, cut, taken;
  std::int32_t max_position;
  // The cache walk's loop control, read by thread 0 and published to the block, so that
  // every thread leaves the loops together.
  int rounds, cache_count, cache_head, stop;
  std::uint64_t after_key;
  std::int32_t after_pos;
};

/**
 * The rescan's first rows' keys and positions, kept in shared memory between its passes:
 * the launch's dynamic shared memory, 12 bytes a row (rows past it are read from the pool
 * again in each pass). The first pass gathers each row's position and state through its
 * slot — scattered loads of a 32-byte sector each for 4 or 8 useful bytes, all through the
 * one SM that runs the request — and the select's levels and the compaction would gather
 * them again.
 */
struct rescan_stage {
  std::uint64_t* key;
  std::int32_t* position;
  int rows;

  /// Bytes of dynamic shared memory that stage `rows` rows.
  DHISPARSE_HOST_DEVICE static constexpr std::size_t bytes(int rows)
  {
    return std::size_t(rows) * (sizeof(std::uint64_t) + sizeof(std::int32_t));
  }

#if defined(__CUDACC__)
  /// The stage this launch's dynamic shared memory holds.
  DHISPARSE_DEVICE static rescan_stage of_launch()
  {
    extern __shared__ __align__(16) unsigned char rescan_stage_memory[];
    unsigned size = 0;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(size));
    int const rows = int(size / bytes(1));
    return {reinterpret_cast<std::uint64_t*>(rescan_stage_memory),
            reinterpret_cast<std::int32_t*>(rescan_stage_memory + std::size_t(rows) * sizeof(std::uint64_t)), rows};
  }
#endif
};

/**
 * Fills request r's victim cache with the C smallest (key, position) of its rows — or of
 * those above (`after_key`, `after_pos`) when `deep` — sorted. Block-wide. Each row's key
 * is kept in `stage` (its first rows) or in `pool.keys[slot]` (the rest) for the later passes.
 */
template <class Eviction, int Block>
DHISPARSE_DEVICE void rescan(device_pool_ref const& pool, std::int32_t r, bool deep, std::uint64_t after_key,
                             std::int32_t after_pos, rescan_stage const& stage, victim_storage<Block>& s)
{
  victim_cache_ref const& cache = pool.cache;
  std::int32_t const n          = pool.owned_count[r];
  std::int32_t const* owned     = pool.owned + std::int64_t(r) * pool.max_owned;
  int const capacity            = cache.capacity;
  if (threadIdx.x == 0) {
    s.kmin         = ~std::uint64_t{0};
    s.kmax         = 0;
    s.count        = 0;
    s.taken        = 0;
    s.max_position = 0;
  }
  __syncthreads();
  // Every row's key (staged, or kept in pool.keys), and the range of the candidates' keys.
  int mine              = 0;
  std::uint64_t my_kmin = ~std::uint64_t{0}, my_kmax = 0;
  for (int base = threadIdx.x; base < n; base += Block * scan_unroll) {
    std::int32_t slot[scan_unroll], pos[scan_unroll];
    policy_state state[scan_unroll];
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) { slot[u] = base + u * Block < n ? owned[base + u * Block] : -1; }
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) {
      pos[u] = -1;
      if (slot[u] >= 0) {
        pos[u]   = pool.position[slot[u]];
        state[u] = pool.state[slot[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) {
      int const i             = base + u * Block;
      std::uint64_t const key = pos[u] >= 0 ? Eviction::eviction_key(state[u], pos[u]) : 0;
      if (i < stage.rows) {
        stage.key[i]      = key;
        stage.position[i] = pos[u];
      } else if (pos[u] >= 0) {
        pool.keys[slot[u]] = key;
      }
      if (pos[u] < 0) { continue; }
      if (deep && !key_less(after_key, after_pos, key, pos[u])) { continue; }
      ++mine;
      my_kmin = min(my_kmin, key);
      my_kmax = max(my_kmax, key);
    }
  }
  warp_min_max(my_kmin, my_kmax);
  mine = warp_sum(mine);
  if ((threadIdx.x & 31) == 0 && mine > 0) {
    atomicAdd(&s.count, mine);
    atomicMin(reinterpret_cast<unsigned long long*>(&s.kmin), my_kmin);
    atomicMax(reinterpret_cast<unsigned long long*>(&s.kmax), my_kmax);
  }
  __syncthreads();
  int const total = s.count;
  auto const get  = [&](int i, std::uint64_t& key, std::uint32_t& tie) {
    std::int32_t pos = -1;
    if (i < stage.rows) {
      pos = stage.position[i];
      key = stage.key[i];
    } else {
      std::int32_t const slot = owned[i];
      pos                     = pool.position[slot];
      key                     = pool.keys[slot];  // beside the position: one round trip
    }
    tie = std::uint32_t(pos);
    return pos >= 0 && (!deep || key_less(after_key, after_pos, key, pos));
  };
  std::uint64_t tkey = ~std::uint64_t{0};
  std::uint32_t ttie = 0xFFFFFFFFu;
  // At least half a cache of whole keys, else exactly a full one.
  if (total > capacity) { block_threshold<Block>(n, capacity, max(1, capacity / 2), s.kmin, s.kmax, get, tkey, ttie); }
  // Compact the chosen rows (in any order: they are sorted next; (key, position) pairs are
  // distinct), then sort them by (key, position). Each warp reserves its iteration's entries
  // with one shared atomic: no block scan and no barrier per iteration.
  int const lane           = int(threadIdx.x) & 31;
  std::int32_t my_position = 0;
  for (int base = threadIdx.x; base - lane < n; base += Block * scan_unroll) {
    std::uint64_t key[scan_unroll];
    std::uint32_t tie[scan_unroll];
    bool take[scan_unroll];
    int count = 0;
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) {
      int const i = base + u * Block;
      key[u]      = 0;
      tie[u]      = 0;
      take[u]     = i < n && get(i, key[u], tie[u]) && (key[u] < tkey || (key[u] == tkey && tie[u] <= ttie));
      count += int(take[u]);
    }
    int offset = warp_inclusive_sum(count);
    int start  = 0;
    if (lane == 31 && offset > 0) { start = atomicAdd(&s.taken, offset); }
    offset += __shfl_sync(0xFFFFFFFFu, start, 31) - count;
#pragma unroll
    for (int u = 0; u < scan_unroll; ++u) {
      if (!take[u]) { continue; }
      s.key[offset]      = key[u];
      s.position[offset] = std::int32_t(tie[u]);
      s.slot[offset]     = owned[base + u * Block];
      my_position        = max(my_position, std::int32_t(tie[u]));
      ++offset;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { my_position = max(my_position, __shfl_xor_sync(0xFFFFFFFFu, my_position, o)); }
  if (lane == 0) { atomicMax(&s.max_position, my_position); }
  __syncthreads();
  int const m        = s.taken;
  int constexpr per  = victim_storage<Block>::per_thread;
  std::uint64_t k[per];
  int v[per];
  // Sort by (key, position): one radix sort of ((key − min) << position bits | position)
  // when that fits 64 bits (LRU's keys span a few hundred epochs), else by position and
  // then, stably, by key. The chosen keys are at most the threshold's: only their bits.
  int const key_bits = bit_width(min(s.kmax, tkey) - s.kmin);
  int const pos_bits = max(1, bit_width(std::uint64_t(s.max_position)));
  bool const packed  = key_bits + pos_bits <= 64;
#pragma unroll
  for (int j = 0; j < per; ++j) {
    int const e = int(threadIdx.x) * per + j;
    v[j]        = e;
    if (e >= m) {
      k[j] = ~std::uint64_t{0};
    } else if (packed) {
      k[j] = ((s.key[e] - s.kmin) << pos_bits) | std::uint64_t(std::uint32_t(s.position[e]));
    } else {
      k[j] = std::uint64_t(std::uint32_t(s.position[e]));
    }
  }
  typename victim_storage<Block>::sort(s.temp.sort).Sort(k, v, 0, packed ? key_bits + pos_bits : 32);
  if (!packed) {
    __syncthreads();
#pragma unroll
    for (int j = 0; j < per; ++j) { k[j] = v[j] < m ? s.key[v[j]] - s.kmin : ~std::uint64_t{0}; }
    typename victim_storage<Block>::sort(s.temp.sort).Sort(k, v, 0, key_bits);
  }
  std::int64_t const base = std::int64_t(r) * capacity;
#pragma unroll
  for (int j = 0; j < per; ++j) {
    int const e = int(threadIdx.x) * per + j;
    if (e < m) {
      cache.slot[base + e]     = s.slot[v[j]];
      cache.position[base + e] = s.position[v[j]];
      cache.key[base + e]      = s.key[v[j]];
    }
  }
  if (threadIdx.x == 0) {
    cache.head[r]  = 0;
    cache.count[r] = m;
    cache.flags[r] = 1u | (total <= capacity ? 2u : 0u);
  }
  __syncthreads();
}

/**
 * Walks request r's victim cache from its head, appending up to `need - found` victims to
 * `victims` (each gets `touched = epoch`, so later searches of this step skip it). Pinned
 * and dirty rows stay in the cache; changed rows are dropped. Returns the new `found`.
 * Sets `exhausted` when the cache ran out first. Block-wide.
 */
template <class Eviction, int Block>
DHISPARSE_DEVICE int walk_cache(device_pool_ref const& pool, std::int32_t r, std::uint32_t epoch, int need,
                                int found, std::int32_t* victims, bool& exhausted, victim_storage<Block>& s)
{
  victim_cache_ref const& cache = pool.cache;
  std::int64_t const base       = std::int64_t(r) * cache.capacity;
  if (threadIdx.x == 0) {
    s.cache_count = cache.count[r];
    s.cache_head  = cache.head[r];
  }
  __syncthreads();
  int const count = s.cache_count;
  int at          = s.cache_head;
  int kept        = 0;  // blocked entries, buffered in s.key/slot/position
  bool overflow                 = false;
  while (found < need && at < count) {
    int const e       = at + int(threadIdx.x);
    bool valid = false, blocked = false;
    std::int32_t slot = -1, pos = -1;
    std::uint64_t key = 0;
    if (e < count) {
      slot  = cache.slot[base + e];
      pos   = cache.position[base + e];
      key   = cache.key[base + e];
      valid = pool.owner[slot] == r && pool.position[slot] == pos &&
              Eviction::eviction_key(pool.state[slot], pos) == key;
      blocked = valid && (pool.touched[slot] == epoch || pool.dirty[slot] != 0);
    }
    bool const victim = valid && !blocked;
    int rank = 0, total = 0;
    typename victim_storage<Block>::scan(s.temp.scan).ExclusiveSum(int(victim), rank, total);
    int const take = min(total, need - found);
    if (threadIdx.x == 0) { s.cut = min(Block, count - at); }
    __syncthreads();
    // Taking the last victim needed ends the chunk right after it.
    if (victim && take > 0 && rank == take - 1 && take == need - found) { s.cut = int(threadIdx.x) + 1; }
    __syncthreads();
    int const cut = s.cut;
    bool const consumed = int(threadIdx.x) < cut;
    if (consumed && victim && rank < take) {
      victims[found + rank] = slot;
      pool.touched[slot]    = epoch;
    }
    int krank = 0, ktotal = 0;
    __syncthreads();
    typename victim_storage<Block>::scan(s.temp.scan).ExclusiveSum(int(consumed && blocked), krank, ktotal);
    if (consumed && blocked) {
      int const at_kept = kept + krank;
      if (at_kept < max_cache_entries) {
        s.key[at_kept]      = key;
        s.slot[at_kept]     = slot;
        s.position[at_kept] = pos;
      }
    }
    kept += ktotal;
    overflow |= kept > max_cache_entries;
    found += take;
    at += cut;
    __syncthreads();
  }
  // Kept entries go back right before the unconsumed ones (inside the consumed range).
  int const head = at - min(kept, max_cache_entries);
  for (int i = threadIdx.x; i < kept && i < max_cache_entries; i += Block) {
    cache.slot[base + head + i]     = s.slot[i];
    cache.position[base + head + i] = s.position[i];
    cache.key[base + head + i]      = s.key[i];
  }
  if (threadIdx.x == 0) {
    cache.head[r] = head;
    if (overflow) { cache.flags[r] = 0; }
  }
  exhausted = found < need;
  __syncthreads();
  return found;
}

/**
 * Smallest-key victims of request r: the cache, rescanned when invalid, and scanned
 * deeper (past its last entry) when pinned and dirty rows fill it. Block-wide; returns the
 * number of victims found (fewer than `need` only when the request has no more).
 */
template <class Eviction, int Block>
DHISPARSE_DEVICE int smallest_key_victims(device_pool_ref const& pool, std::int32_t r, std::uint32_t epoch,
                                          int need, std::int32_t* victims, rescan_stage const& stage,
                                          victim_storage<Block>& s)
{
  victim_cache_ref const& cache = pool.cache;
  int found                     = 0;
  bool deep                     = false;
  std::uint64_t after_key       = 0;
  std::int32_t after_pos        = 0;
  if (threadIdx.x == 0) {
    s.rounds = pool.owned_count[r] / cache.capacity + 2;
    s.stop   = (cache.flags[r] & 1u) == 0 ? 2 : 0;  // 2: rescan first
  }
  __syncthreads();
  int const rounds = s.rounds;
  for (int round = 0; round < rounds && found < need; ++round) {
    if (s.stop == 2 || deep) { rescan<Eviction, Block>(pool, r, deep, after_key, after_pos, stage, s); }
    bool exhausted = false;
    found          = walk_cache<Eviction, Block>(pool, r, epoch, need, found, victims, exhausted, s);
    if (threadIdx.x == 0) {
      int const last = cache.count[r] - 1;
      s.stop         = !exhausted || (cache.flags[r] & 2u) != 0 || last < 0;
      if (!s.stop) {
        s.after_key = cache.key[std::int64_t(r) * cache.capacity + last];
        s.after_pos = cache.position[std::int64_t(r) * cache.capacity + last];
      }
    }
    __syncthreads();
    if (s.stop) { break; }
    after_key = s.after_key;
    after_pos = s.after_pos;
    deep      = true;
    __syncthreads();
  }
  if (deep && threadIdx.x == 0) { cache.flags[r] = 0; }  // a deep cache lacks the rows below it
  __syncthreads();
  return found;
}

/**
 * CLOCK victims of request r: the hand sweeps its owned list, at most twice around.
 * Block-wide; returns the number of victims found.
 */
template <class Eviction, int Block>
DHISPARSE_DEVICE int sweep_victims(device_pool_ref const& pool, std::int32_t r, std::uint32_t epoch, int need,
                                   std::int32_t* victims, victim_storage<Block>& s)
{
  std::int32_t const n = pool.owned_count[r];
  if (n == 0 || need == 0) { return 0; }
  std::int32_t const* owned = pool.owned + std::int64_t(r) * pool.max_owned;
  int hand                  = pool.hand[r] % n;
  int found                 = 0;
  int const limit           = 2 * n;
  for (int steps = 0; found < need && steps < limit;) {
    int const chunk = min(Block, min(n, limit - steps));
    int const i     = int(threadIdx.x);
    bool usable = false, referenced = false;
    std::int32_t slot = -1;
    if (i < chunk) {
      slot                   = owned[(hand + i) % n];
      std::int32_t const pos = pool.position[slot];
      usable     = pos >= 0 && pool.touched[slot] != epoch && pool.dirty[slot] == 0;
      referenced = usable && Eviction::referenced(pool.state[slot]);
    }
    bool const victim = usable && !referenced;
    int rank = 0, total = 0;
    typename victim_storage<Block>::scan(s.temp.scan).ExclusiveSum(int(victim), rank, total);
    int const take = min(total, need - found);
    if (threadIdx.x == 0) { s.cut = chunk; }
    __syncthreads();
    if (victim && take > 0 && rank == take - 1 && take == need - found) { s.cut = i + 1; }
    __syncthreads();
    int const cut = s.cut;
    if (i < cut) {
      if (referenced) {
        pool.state[slot] = Eviction::clear_reference(pool.state[slot]);
        lower_key_floor(pool, slot, Eviction::eviction_key(pool.state[slot], pool.position[slot]));
      }
      if (victim && rank < take) {
        victims[found + rank] = slot;
        pool.touched[slot]    = epoch;
      }
    }
    found += take;
    hand = (hand + cut) % n;
    steps += cut;
    __syncthreads();
  }
  if (threadIdx.x == 0) { pool.hand[r] = hand; }
  return found;
}

}  // namespace dhisparse::detail::resolve
