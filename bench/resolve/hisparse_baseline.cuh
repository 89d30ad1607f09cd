/**
 * @file bench/resolve/hisparse_baseline.cuh
 * @brief The baseline of the resolve benchmark: a HiSparse-style fused swap-in kernel (one
 *        CTA per request, LRU order array, shared-memory hash of the top-K, warp-per-row
 *        copy from mapped pinned host memory), written for the benchmark after SGLang's
 *        `load_cache_to_device_buffer` and made as fast as that design allows.
 *
 * ## State (device memory, allocated by the caller; H = hot slots per request)
 * * `buffer_rows`   [num_requests][H][row_bytes]: the hot buffer of one layer;
 * * `slot_position` [num_requests][H] int32: position a slot holds, -1 = empty;
 * * `lru`           [num_requests][H] int32: the request's slots, least recently used
 *   first (a permutation of 0 … H − 1; start with 0 … H − 1 and all slots empty).
 *
 * ## One launch = one step of one layer, grid = batch, one CTA per batch entry
 * Batch entry b serves request r = requests[b] (distinct within a launch) of length
 * n = lengths[b]; position n − 1 is the token this step writes. Phases of the CTA:
 * 1. hash: the valid top-K positions (0 ≤ p < n; anything else is padding) and the newest
 *    position n − 1 go into a shared-memory open-addressing table (power-of-two capacity
 *    ≥ 2K, Knuth multiplicative hash, linear probing, 64-bit atomicCAS of position | entry);
 * 2. scan: every slot, walked in LRU order, looks up its position; a found one is a hit;
 *    one `cub::BlockScan` ranks hits and non-hits and the order array is rewritten in place;
 * 3. misses: a second scan ranks the missing top-K entries (k ascending); miss i takes
 *    victim i (the i-th least recently used non-hit), the newest position (when neither
 *    resident nor selected) the victim after them; `slot_position` and `slot_table` are set;
 * 4. copy: every missed row but the newest is read from the host store with 16-byte
 *    loads, each warp owning the misses m ≡ warp (mod warps) and keeping `Unroll` loads
 *    per lane in flight across them, and stored into its victim slot.
 * LRU semantics (exactly those of `hisparse_reference.hpp`): new order = [stale non-hits
 * in old order][victims in miss order][hits in old order].
 *
 * ## Differences from SGLang's kernel, all in its favour or neutral
 * * It is one layer of one request per CTA, as theirs; the newest token takes an LRU slot
 *   (their earlier kernel does that; the current one keeps it in a reserved extra slot,
 *   which misses when the next step selects it: one more copy per step for them).
 * * Copies keep several rows in flight per warp instead of one, which matters when a
 *   single CTA carries the whole batch (B = 1).
 * * No "whole context fits in the buffer" shortcut: the benchmark's contexts never fit.
 * * The slot table holds global buffer rows (r × H + slot), what attention reads.
 *
 * Measured (H200, 2026-12-03, baseline_selfcheck): K = 2048, H = 4096, 656-byte rows,
 * 1024 threads: 23.7 / 33.8 µs at B = 1 with 1% / 14% misses, 101 / 1054 µs at B = 128
 * (SGLang's kernel: 25.6 / 55.5 / 118 / 1213). At B = 1 the CTA spends ≈ 12 µs before
 * any copy (clock64 per phase: loads and set-up 1.6, table build 3.6, lookups and scan
 * 4.4, the rest 2.3) — the place to look if a faster baseline is wanted; B = 128 with
 * 14% misses moves rows at 23 GB/s, the zero-copy rate of this page-scattered layout.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/host_store.cuh>

#include <cub/block/block_scan.cuh>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse::bench::hisparse {

/**
 * @brief Compile-time shape of one instantiation of the swap-in kernel.
 * @tparam BlockThreads threads per CTA (one CTA per request)
 * @tparam MaxTopK      largest top-K a launch may use
 * @tparam MaxHotSlots  largest buffer (slots per request) a launch may use
 * @tparam Unroll       16-byte loads each lane keeps in flight while copying
 */
template <int BlockThreads = 1024, int MaxTopK = 2048, int MaxHotSlots = 4096, int Unroll = 4>
struct kernel_config {
  static constexpr int block_threads = BlockThreads;
  static constexpr int max_top_k     = MaxTopK;
  static constexpr int max_hot_slots = MaxHotSlots;
  static constexpr int unroll        = Unroll;

  static_assert(BlockThreads % 32 == 0 && BlockThreads <= 1024, "BlockThreads: whole warps, at most 1024");
  static_assert(MaxTopK % BlockThreads == 0, "MaxTopK must be a multiple of BlockThreads");
  static_assert(MaxHotSlots % BlockThreads == 0, "MaxHotSlots must be a multiple of BlockThreads");
  static_assert(MaxHotSlots <= 32768, "slots are kept as int16 in shared memory");
  static_assert(MaxTopK >= 2, "the hash table holds at least 4 buckets");
  static_assert(Unroll >= 1, "Unroll must be positive");
};

/// Arguments of one swap-in launch. Grid-invariant, passed by value.
struct swap_in_params {
  std::int32_t const* top_k;     ///< [batch][top_k] positions, any order; -1 (or out of range) = none
  std::int32_t const* requests;  ///< [batch] request of each batch entry, distinct
  std::int32_t const* lengths;   ///< [batch] length n of the entry's request (n − 1 = newest)

  host_store_ref host;       ///< the host store: mapped pinned pages, same addressing as the library
  group_layout layout;       ///< this layer group's placement in a host page
  std::size_t layer_offset;  ///< byte offset of this layer's row inside a group row (multiple of 16)

  std::byte* buffer_rows;       ///< [num_requests][hot_slots][row_bytes]
  std::int32_t* slot_position;  ///< [num_requests][hot_slots], -1 = empty
  std::int32_t* lru;            ///< [num_requests][hot_slots], least recently used first

  std::int32_t* slot_table;   ///< out [batch][top_k]: buffer row r × hot_slots + slot, -1 = padding
  std::int32_t* newest_slot;  ///< out [batch]: buffer row reserved for position n − 1 (-1 if n < 1)
  std::int32_t* copied_rows;  ///< out [batch]: rows copied from the host (may be nullptr)

  std::int32_t batch;
  std::int32_t top_k_count;  ///< K, 1 ≤ K ≤ MaxTopK
  std::int32_t hot_slots;    ///< H, K + 1 ≤ H ≤ MaxHotSlots; num_requests × H < 2^31
  std::size_t row_bytes;     ///< a multiple of 16
};

namespace detail {

inline constexpr unsigned long long hash_empty = ~0ull;

constexpr int pow2_at_least(int n)
{
  int p = 1;
  while (p < n) { p *= 2; }
  return p;
}

/// Home bucket of a position: Knuth's multiplicative hash, top bits.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t hash_home(std::int32_t position, int shift)
{
  return (std::uint32_t(position) * 2654435761u) >> shift;
}

/// Inserts position → entry; returns whether the position was new. A repeated position
/// keeps its smallest entry.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool hash_insert(unsigned long long* table, std::uint32_t mask, int shift,
                                                        std::int32_t position, int entry)
{
  unsigned long long const word = (static_cast<unsigned long long>(std::uint32_t(position)) << 32) | std::uint32_t(entry);
  for (std::uint32_t h = hash_home(position, shift);; h = (h + 1) & mask) {
    unsigned long long const old = atomicCAS(&table[h], hash_empty, word);
    if (old == hash_empty) { return true; }
    if (std::uint32_t(old >> 32) == std::uint32_t(position)) {
      atomicMin(&table[h], word);
      return false;
    }
  }
}

/// Entry of a position, -1 when absent.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int hash_find(unsigned long long const* table, std::uint32_t mask, int shift,
                                                     std::int32_t position)
{
  for (std::uint32_t h = hash_home(position, shift);; h = (h + 1) & mask) {
    unsigned long long const w = table[h];
    if (w == hash_empty) { return -1; }
    if (std::uint32_t(w >> 32) == std::uint32_t(position)) { return int(std::uint32_t(w)); }
  }
}

/// Shared memory of one CTA.
template <class Config>
struct swap_in_storage {
  static constexpr int hash_capacity = pow2_at_least(2 * Config::max_top_k);
  union {
    unsigned long long hash[hash_capacity];     // phases 1–2: position | entry
    std::byte const* source[Config::max_top_k];  // phases 3–4: host row of miss m, nullptr = no copy
  } u;
  std::int16_t entry_slot[Config::max_top_k + 1];  // slot of a hit entry (K = the newest), -1
  std::int16_t victim[Config::max_top_k + 1];      // slot of victim i
  typename cub::BlockScan<int, Config::block_threads, cub::BLOCK_SCAN_WARP_SCANS>::TempStorage scan;
  int required;       // distinct required positions
  int newest_entry;   // hash entry of the newest position (K when not selected), -1 = none
  int newest_missed;  // the newest position is a selected entry that missed
};

template <class Config>
DHISPARSE_KERNEL void __launch_bounds__(Config::block_threads) swap_in_kernel(swap_in_params p)
{
  constexpr int threads = Config::block_threads;
  constexpr int warps   = threads / 32;
  constexpr int items_k = Config::max_top_k / threads;
  constexpr int items_h = Config::max_hot_slots / threads;
  using scan_t          = cub::BlockScan<int, threads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ swap_in_storage<Config> s;

  int const tid = int(threadIdx.x);
  int const b   = int(blockIdx.x);
  int const K   = p.top_k_count;
  int const H   = p.hot_slots;
  std::int32_t const r      = p.requests[b];
  std::int32_t const length = p.lengths[b];
  std::int32_t const newest = length - 1;  // -1: no token this step
  std::int64_t const state_base = std::int64_t(r) * H;
  std::int32_t* const lru           = p.lru + state_base;
  std::int32_t* const slot_position = p.slot_position + state_base;
  // Capacity 2^(32 − shift) ≥ max(2K, 4) > K + 1 entries: a probe always meets an empty bucket.
  int const shift          = __clz(max(2 * K - 1, 3));
  std::uint32_t const mask = 0xFFFFFFFFu >> shift;

  // Global loads first: the selection (blocked: thread t owns entries t·items_k + j), the
  // order array (thread t owns order indices t·items_h + j) and the positions of those
  // slots. None depends on shared memory, so their latency overlaps the table's set-up.
  // Every order entry is read here, before any thread rewrites the array (phase 2).
  std::int32_t position[items_k];
#pragma unroll
  for (int j = 0; j < items_k; ++j) {
    int const k          = tid * items_k + j;
    std::int32_t const q = k < K ? p.top_k[std::int64_t(b) * K + k] : -1;
    position[j]          = (q >= 0 && q < length) ? q : -1;
  }
  std::int32_t slot[items_h];
#pragma unroll
  for (int j = 0; j < items_h; ++j) {
    int const i = tid * items_h + j;
    slot[j]     = i < H ? lru[i] : -1;
  }
  std::int32_t held[items_h];
#pragma unroll
  for (int j = 0; j < items_h; ++j) { held[j] = slot[j] >= 0 ? slot_position[slot[j]] : -1; }

  // Phase 0: empty table and entries.
  for (std::uint32_t i = tid; i <= mask; i += threads) { s.u.hash[i] = hash_empty; }
  for (int i = tid; i <= K; i += threads) { s.entry_slot[i] = -1; }
  if (tid == 0) {
    s.required      = 0;
    s.newest_missed = 0;
  }
  __syncthreads();

  // Phase 1: the required positions into the table.
  int fresh = 0;
#pragma unroll
  for (int j = 0; j < items_k; ++j) {
    if (position[j] >= 0) { fresh += hash_insert(s.u.hash, mask, shift, position[j], tid * items_k + j); }
  }
  if (tid == threads - 1 && newest >= 0) { fresh += hash_insert(s.u.hash, mask, shift, newest, K); }
  fresh = __reduce_add_sync(0xFFFFFFFFu, fresh);
  if ((tid & 31) == 0 && fresh > 0) { atomicAdd(&s.required, fresh); }
  __syncthreads();

  // Phase 2: hits in LRU order, ranked by one block scan; the order array is rewritten in
  // place (all of it was read before the set-up's barrier).
  if (tid == 0) { s.newest_entry = newest >= 0 ? hash_find(s.u.hash, mask, shift, newest) : -1; }
  int hit[items_h];
#pragma unroll
  for (int j = 0; j < items_h; ++j) {
    int const e = held[j] >= 0 ? hash_find(s.u.hash, mask, shift, held[j]) : -1;
    hit[j]      = e >= 0;
    if (e >= 0) { s.entry_slot[e] = std::int16_t(slot[j]); }
  }
  int hit_rank[items_h];
  int hits = 0;
  scan_t(s.scan).ExclusiveSum(hit, hit_rank, hits);
  int const victims = s.required - hits;
  int const stale   = H - hits - victims;  // non-hits that stay
#pragma unroll
  for (int j = 0; j < items_h; ++j) {
    int const i = tid * items_h + j;
    if (i >= H) { continue; }
    int to;
    if (hit[j]) {
      to = H - hits + hit_rank[j];
    } else {
      int const n = i - hit_rank[j];  // rank among non-hits
      if (n < victims) {
        s.victim[n] = std::int16_t(slot[j]);
        to          = stale + n;
      } else {
        to = n - victims;
      }
    }
    lru[to] = slot[j];
  }
  __syncthreads();

  // Phase 3: missing entries, in selection order, take the victims.
  int miss[items_k];
#pragma unroll
  for (int j = 0; j < items_k; ++j) { miss[j] = position[j] >= 0 && s.entry_slot[tid * items_k + j] < 0; }
  int miss_rank[items_k];
  int misses = 0;
  scan_t(s.scan).ExclusiveSum(miss, miss_rank, misses);
  int const newest_entry = s.newest_entry;
#pragma unroll
  for (int j = 0; j < items_k; ++j) {
    int const k = tid * items_k + j;
    if (k >= K) { continue; }
    std::int32_t out = -1;
    if (position[j] >= 0) {
      int local = s.entry_slot[k];
      if (miss[j]) {
        int const m = miss_rank[j];
        // m ≥ victims only when a row repeats a position (a broken precondition): no slot.
        local       = m < victims ? s.victim[m] : -1;
        std::byte const* src = nullptr;
        if (local >= 0) {
          slot_position[local] = position[j];
          if (position[j] != newest) {
            src = p.host.group_row(r, position[j], p.layout);
            if (src != nullptr) { src += p.layer_offset; }
          }
        }
        s.u.source[m] = src;
      }
      if (local >= 0) { out = std::int32_t(state_base + local); }
      if (k == newest_entry) {
        p.newest_slot[b] = out;
        s.newest_missed  = miss[j];
      }
    }
    p.slot_table[std::int64_t(b) * K + k] = out;
  }
  if (tid == 0) {
    if (newest_entry < 0) {
      p.newest_slot[b] = -1;
    } else if (newest_entry == K) {
      int local = s.entry_slot[K];
      if (local < 0 && misses < victims) {
        local                = s.victim[misses];
        slot_position[local] = newest;
      }
      p.newest_slot[b] = local >= 0 ? std::int32_t(state_base + local) : -1;
    }
  }
  __syncthreads();

  // Phase 4: copy. Warp w owns misses w, w + warps, …; its lanes walk the 16-byte vectors
  // of all those rows as one sequence, `Unroll` loads in flight per lane.
  if (tid == 0 && p.copied_rows != nullptr) { p.copied_rows[b] = misses - s.newest_missed; }
  int const warp    = tid / 32;
  int const lane    = tid % 32;
  int const vectors = int(p.row_bytes / 16);
  int const rows    = misses > warp ? (misses - 1 - warp) / warps + 1 : 0;
  int const total   = rows * vectors;
  std::byte* const buffer = p.buffer_rows + std::size_t(state_base) * p.row_bytes;
  for (int base = lane; base < total; base += 32 * Config::unroll) {
    int4 v[Config::unroll];
    int4* dst[Config::unroll];
#pragma unroll
    for (int u = 0; u < Config::unroll; ++u) {
      int const idx = base + 32 * u;
      dst[u]        = nullptr;
      if (idx < total) {
        int const row = idx / vectors;
        int const vec = idx - row * vectors;
        int const m   = warp + row * warps;
        std::byte const* const src = s.u.source[m];
        if (src != nullptr) {
          v[u]   = __ldg(reinterpret_cast<int4 const*>(src) + vec);
          dst[u] = reinterpret_cast<int4*>(buffer + std::size_t(s.victim[m]) * p.row_bytes) + vec;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < Config::unroll; ++u) {
      if (dst[u] != nullptr) { __stcg(dst[u], v[u]); }
    }
  }
}

}  // namespace detail

/**
 * @brief Enqueues one swap-in step (one kernel, grid = batch) on `stream`; no allocation,
 *        no host synchronisation.
 * @tparam Config a `kernel_config`
 * @return cudaErrorInvalidValue for shapes outside the configuration (K < 1, K > MaxTopK,
 *         H < K + 1, H > MaxHotSlots, rows or host offsets not multiples of 16, null
 *         pointers), else the launch status
 */
template <class Config = kernel_config<>>
cudaError_t swap_in_async(swap_in_params const& p, cudaStream_t stream)
{
  bool const shapes_ok = p.batch >= 0 && p.top_k_count >= 1 && p.top_k_count <= Config::max_top_k &&
                         p.hot_slots >= p.top_k_count + 1 && p.hot_slots <= Config::max_hot_slots;
  bool const rows_ok = p.row_bytes > 0 && p.row_bytes % 16 == 0 && p.layer_offset % 16 == 0 &&
                       p.layout.page_offset % 16 == 0 && p.layout.row_bytes % 16 == 0 &&
                       p.host.page_bytes % 16 == 0 && p.layer_offset + p.row_bytes <= p.layout.row_bytes;
  bool const pointers_ok = p.top_k != nullptr && p.requests != nullptr && p.lengths != nullptr &&
                           p.buffer_rows != nullptr && p.slot_position != nullptr && p.lru != nullptr &&
                           p.slot_table != nullptr && p.newest_slot != nullptr;
  if (!shapes_ok || !rows_ok || !pointers_ok) { return cudaErrorInvalidValue; }
  if (p.batch == 0) { return cudaSuccess; }
  detail::swap_in_kernel<Config><<<p.batch, Config::block_threads, 0, stream>>>(p);
  return dhisparse::detail::check_launch(stream);
}

}  // namespace dhisparse::bench::hisparse
