/**
 * @file detail/reclaim/kernels.cuh
 * @brief The reclaim kernels (see reclaim.cuh for the contract).
 *
 * One launch, barriers of its team of blocks (`team`: the whole cooperative grid of
 * `reclaim_async`, or the blocks of resolve's launch that joined) between the passes:
 * 0. (global order) a bound on the keys worth reading: the first blocks build a histogram
 *    of the keys of a strided sample of slots (one per thread; barriers among themselves
 *    only) and block 0 publishes the key below which the sample holds the rows to release
 *    with a margin; the other blocks wait for that one word (no grid barrier);
 * 1. candidates: every clean, unpinned, non-empty slot below the pool limit whose key is at
 *    most the bound (all of them when fewer than needed are), with its eviction key (kept in
 *    `pool.keys`) and its tie-break (position, request); up to the bound, only the slots
 *    whose key floor (four slots a floor) lies at or under it are read (`collect_floored`);
 * 2. targets: one segment (global order) or one per request (fair share: water filling
 *    over owned − floor);
 * 3. per segment, a radix select of its target count: 8-bit digits of the key (only the
 *    bits where keys differ), then of the tie-break among the rows of the threshold key.
 *    Global order, when the bits where keys differ and those where tie-breaks differ fit
 *    in 64: one select over (key, tie-break) packed into one word (left in `pool.keys`),
 *    11-bit digits, one grid barrier per digit — every block picks the digit itself from
 *    the grid's histogram, kept in three rotating buffers so that none is cleared while
 *    read;
 * 4. release: unmap, free, push onto the free stack; the last block to finish puts the
 *    scratch back to zero (a counter, not a barrier).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/resolve/victims.cuh>
#include <dhisparse/detail/resolve/workspace.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/reclaim.cuh>
#include <dhisparse/step_batch.cuh>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/atomic>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {
namespace detail::reclaim {

inline constexpr int block_size = 512;

/// What a segment still has to decide.
enum segment_mode : std::int32_t {
  mode_none   = 0,  ///< releases nothing
  mode_all    = 1,  ///< releases every candidate
  mode_key    = 2,  ///< selecting the threshold key
  mode_le_key = 3,  ///< releases every candidate with key ≤ the threshold key
  mode_tie    = 4,  ///< selecting the threshold tie-break among the threshold key
};
enum segment_field : int { f_target, f_remaining, f_mode, f_eligible, f_ties, f_fields = 6 };
enum scalar_index : int {
  s_candidates, s_key_min, s_key_max, s_tie_min, s_tie_max, s_any_tie, s_ties, s_rest,
  s_bound,        ///< the sampled key bound (global order)
  s_sampled,      ///< 1 once block 0 has published `s_bound`
  s_sample_sync,  ///< two barrier counters of the sampling blocks
  s_done = s_sample_sync + 2,  ///< blocks that finished reading the scratch (the last one clears it)
  s_team_sync,                 ///< the team's barrier counter (`team::sync`)
  s_scalars = 16
};

/// Bins of the sampled key histogram (`scratch.sample`).
inline constexpr int sample_bins = 4096;

/// Global order's packed select: digit width and bins.
inline constexpr int select_digit_bits = 11;
inline constexpr int select_radix      = 1 << select_digit_bits;

/// Digit counts: [2][segments][256] (per-segment select), at least [3][select_radix]
/// (global order).
DHISPARSE_HOST_DEVICE inline std::size_t hist_entries(std::int32_t segments)
{
  std::size_t const per_segment = std::size_t(segments) * 2 * 256;
  return per_segment > 3 * select_radix ? per_segment : 3 * select_radix;
}

inline std::size_t scratch_bytes(std::int32_t num_slots, std::int32_t segments, reclaim_scratch_ref* out,
                                 void* memory)
{
  std::size_t offset = 0;
  auto take          = [&](std::size_t n) {
    std::size_t const at = offset;
    offset += resolve::align_up(n);
    return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(memory) + at);
  };
  reclaim_scratch_ref s{};
  s.candidates = reinterpret_cast<std::int32_t*>(take(std::size_t(num_slots) * 4));
  s.ties       = reinterpret_cast<std::int32_t*>(take(std::size_t(num_slots) * 4));
  s.hist       = reinterpret_cast<std::uint32_t*>(take(hist_entries(segments) * 4));
  s.segment    = reinterpret_cast<std::int32_t*>(take(std::size_t(segments) * f_fields * 4));
  s.prefix     = reinterpret_cast<std::uint64_t*>(take(std::size_t(segments) * 2 * 8));
  s.scalars    = reinterpret_cast<std::uint64_t*>(take(s_scalars * 8));
  s.sample     = reinterpret_cast<std::uint32_t*>(take((sample_bins + 4) * 4));
  s.segments   = segments;
  if (out != nullptr) { *out = s; }
  return offset;
}

/// A slot reclaim may release: owned, holding a row, backed up, not selected in `pin_epoch`.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool eligible(std::int32_t owner, std::int32_t position, std::uint32_t dirty,
                                                     std::uint32_t touched, std::uint32_t pin_epoch)
{
  return owner >= 0 && position >= 0 && dirty == 0 && (pin_epoch == 0 || touched != pin_epoch);
}

/// Warp-aggregated `atomicAdd(counter, 1)` for the lanes where `pred` holds; returns the
/// lane's index. All 32 lanes call it.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int warp_append(int* counter, bool pred)
{
  unsigned const ballot = __ballot_sync(0xFFFFFFFFu, pred);
  int const lane        = threadIdx.x & 31;
  int base              = 0;
  if (lane == 0 && ballot != 0) { base = atomicAdd(counter, __popc(ballot)); }
  base = __shfl_sync(0xFFFFFFFFu, base, 0);
  return base + __popc(ballot & ((1u << lane) - 1));
}

/**
 * Block-aggregated `atomicAdd(counter, 1)` for the threads where `pred` holds (one atomic
 * per block and call, not per warp: a pool-wide pass would otherwise queue hundreds of
 * thousands of atomics on one address); returns the thread's index. Every thread of the
 * block calls it.
 */
template <int Block>
DHISPARSE_DEVICE int block_append(int* counter, bool pred)
{
  using scan = cub::BlockScan<int, Block>;
  __shared__ typename scan::TempStorage temp;
  __shared__ int base;
  int rank = 0, total = 0;
  scan(temp).ExclusiveSum(int(pred), rank, total);
  if (threadIdx.x == 0) { base = total > 0 ? atomicAdd(counter, total) : 0; }
  __syncthreads();
  int const at = base + rank;
  __syncthreads();  // base and temp are reused by the next call
  return at;
}

/// `atomicAdd(counter + index, amount)` once per distinct index among the converged lanes
/// that call it (rows of one request, digits of one bin, are often many in one warp).
template <class T>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void aggregated_add(T* counter, unsigned index, T amount)
{
  unsigned const peers  = __match_any_sync(__activemask(), index);
  int const leader      = __ffs(peers) - 1;
  if (int(threadIdx.x & 31) == leader) { atomicAdd(counter + index, amount * T(__popc(peers))); }
}

/**
 * Fair share: per request, how many rows to give. Water level X: the largest level at
 * which Σ min(eligible_r, max(0, excess_r − X)) ≥ want; everyone gives its amount at X + 1,
 * the remainder goes one row each to the requests that give more at X, lowest index first.
 * One block.
 */
template <int Block>
DHISPARSE_DEVICE void fair_targets(reclaim_params const& p, int want)
{
  using reduce = cub::BlockReduce<long long, Block>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ long long total;
  __shared__ int remainder;
  std::int32_t* seg   = p.scratch.segment;
  int const n         = p.scratch.segments;
  auto const excess   = [&](int r) { return (long long)p.pool.owned_count[r] - p.floors[r]; };
  auto const give     = [&](int r, long long level) {
    long long const e = seg[r * f_fields + f_eligible];
    long long const x = excess(r) - level;
    return x <= 0 ? 0 : (x < e ? x : e);
  };
  auto const sum_at = [&](long long level) {
    long long mine = 0;
    for (int r = threadIdx.x; r < n; r += Block) { mine += give(r, level); }
    long long const s = reduce(temp).Sum(mine);
    if (threadIdx.x == 0) { total = s; }
    __syncthreads();
    return total;
  };
  // Binary search the largest level with sum ≥ want (sum is non-increasing in the level).
  long long lo = -(1ll << 33), hi = 1ll << 33;  // sum(lo) ≥ want is checked by the caller
  while (hi - lo > 1) {
    long long const mid = lo + (hi - lo) / 2;
    if (sum_at(mid) >= want) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  long long const base = sum_at(lo + 1);
  if (threadIdx.x == 0) { remainder = int(want - base); }
  __syncthreads();
  // The margin (requests giving one more at lo than at lo + 1) gets the remainder in index order.
  using scan = cub::BlockScan<int, Block>;
  __shared__ typename scan::TempStorage scan_temp;
  int taken = 0;
  for (int start = 0; start < n; start += Block) {
    int const r      = start + int(threadIdx.x);
    bool const margin = r < n && give(r, lo) > give(r, lo + 1);
    int rank = 0, count = 0;
    scan(scan_temp).ExclusiveSum(int(margin), rank, count);
    if (r < n) {
      int const t = int(give(r, lo + 1)) + (margin && taken + rank < remainder ? 1 : 0);
      int const e = seg[r * f_fields + f_eligible];
      seg[r * f_fields + f_target]    = t;
      seg[r * f_fields + f_remaining] = t;
      seg[r * f_fields + f_mode]      = t == 0 ? mode_none : (t >= e ? mode_all : mode_key);
    }
    taken += count;
    __syncthreads();
  }
}

/// A candidate's fields beyond its key, loaded only for a slot whose key is in range
/// (`in_range`; where the key is the state, its position too); otherwise values that make
/// it ineligible.
template <class Eviction>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void load_fields(device_pool_ref const& pool, bool in_range, std::int32_t slot,
                                                        std::int32_t& pos, std::int32_t& owner, std::uint32_t& dirty,
                                                        std::uint32_t& touched)
{
  owner   = -1;
  dirty   = 1;
  touched = 0;
  if (!in_range) { return; }
  if constexpr (key_is_state_v<Eviction>) { pos = pool.position[slot]; }
  owner   = pool.owner[slot];
  dirty   = pool.dirty[slot];
  touched = pool.touched[slot];
}

/// Candidates a warp of `collect` stages in shared memory before it appends them.
inline constexpr int warp_stage = 256;

/// Shared memory the phases take in turn, each after a block barrier: a sampling block's
/// histogram, the warps' candidate stages, the packed select's histogram.
template <int Block>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE unsigned* phase_shared()
{
  constexpr int stages = Block / 32 * warp_stage;
  constexpr int words  = sample_bins > stages ? (sample_bins > select_radix ? sample_bins : select_radix)
                                              : (stages > select_radix ? stages : select_radix);
  __shared__ unsigned buffer[words];
  return buffer;
}

/// Whether a global-order reclaim samples for a key bound (uniform over the grid): a sample
/// is configured and the rows to release are a small part of the pool (otherwise most rows
/// go anyway and the bound would only cost).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool samples(reclaim_params const& p, int want, std::int32_t limit)
{
  return p.order == reclaim_order::global && p.scratch.sample_slots > 0 && limit > 0 &&
         std::int64_t(want) * 4 <= limit;
}

/// Barrier of the team's first `blocks` blocks on `counter` (zero before; counts to
/// `blocks`). Every member of a team is resident (see `team`), so the wait ends.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void subset_sync(unsigned long long& counter, unsigned blocks)
{
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> c(counter);
    c.fetch_add(1, cuda::memory_order_acq_rel);
    while (c.load(cuda::memory_order_acquire) < blocks) { __nanosleep(32); }
  }
  __syncthreads();
}

/**
 * The blocks that run one reclaim together, numbered 0 … size − 1: every block of a
 * cooperative launch (`reclaim_async`), or the blocks of resolve's reclaim launch that
 * had started when its team was formed (`join_team`). Every member is resident, so its
 * barrier ends whatever else the device runs. A member's rank and the team's size stay
 * fixed for the whole reclaim (a candidate is read in every pass by the thread that read
 * it first).
 */
struct team {
  unsigned rank;                  ///< this block's index in the team
  unsigned size;                  ///< blocks in the team
  unsigned long long* arrivals;   ///< barrier counter (scratch scalar, zero before the reclaim)

  /// Barrier of the team's blocks; their writes before it are visible to all after it.
  DHISPARSE_DEVICE void sync() const
  {
    __syncthreads();
    if (threadIdx.x == 0) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> c(*arrivals);
      __threadfence();
      unsigned long long const target = (c.fetch_add(1, cuda::memory_order_acq_rel) / size + 1) * size;
      while (c.load(cuda::memory_order_acquire) < target) { __nanosleep(32); }
      __threadfence();
    }
    __syncthreads();
  }
};

/// Words of resolve's team roster (`resolve::workspace_view::roster`): zero before the
/// reclaim launch, zeroed again by allocate, which follows it.
enum roster_word : int { r_tickets, r_size, r_want, r_words };
static_assert(r_words == resolve::roster_words);
inline constexpr std::uint32_t roster_sealed = 1u << 31;

/// How long the first block of resolve's reclaim waits for the others' tickets before it
/// seals the team (SM clock cycles, ≈ 16 µs): they all make the same check at once when
/// every block is resident, so it seals when the last ticket is taken, well before.
inline constexpr long long team_wait_cycles = 1 << 15;

/**
 * Forms resolve's reclaim team without ever waiting unboundedly for a block that has not
 * started: every block that needs the reclaim takes a ticket; the block with ticket 0
 * seals the roster once every block of the grid has taken one, or after
 * `team_wait_cycles` — the tickets taken until then are the team — and publishes its size
 * and its `want`; a block whose ticket comes after the seal leaves. The members that wait
 * for the seal wait for a block that is running. False in a block that is not a member; a
 * member gets its rank and the team's `want`.
 */
template <int Block>
DHISPARSE_DEVICE bool join_team(std::uint32_t* roster, unsigned long long* arrivals, int& want, team& members)
{
  __shared__ unsigned rank, size;
  __shared__ int agreed;
  if (threadIdx.x == 0) {
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> tickets(roster[r_tickets]);
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> published(roster[r_size]);
    std::uint32_t const ticket = tickets.fetch_add(1, cuda::memory_order_acq_rel);
    rank                       = ticket;
    size                       = 0;
    if ((ticket & roster_sealed) == 0) {
      if (ticket == 0) {
        long long const start = clock64();
        while (tickets.load(cuda::memory_order_relaxed) < gridDim.x && clock64() - start < team_wait_cycles) {
          __nanosleep(64);
        }
        std::uint32_t const taken = tickets.fetch_or(roster_sealed, cuda::memory_order_acq_rel);  // ≥ 1
        roster[r_want]            = std::uint32_t(want);
        published.store(taken, cuda::memory_order_release);
        size = taken;
      } else {
        std::uint32_t seen = 0;
        while ((seen = published.load(cuda::memory_order_acquire)) == 0) { __nanosleep(32); }
        size = seen;
      }
      agreed = int(roster[r_want]);
    }
  }
  __syncthreads();
  if (size == 0) { return false; }
  members = team{rank, size, arrivals};
  want    = agreed;
  return true;
}

/// The bound block 0 publishes (`sample_bound`), in every thread of a block that waits for it.
DHISPARSE_DEVICE inline std::uint64_t await_bound(reclaim_params const& p)
{
  auto* scalars = reinterpret_cast<unsigned long long*>(p.scratch.scalars);
  __shared__ std::uint64_t published;
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> flag(scalars[s_sampled]);
    while (flag.load(cuda::memory_order_acquire) == 0) { __nanosleep(64); }
    published = scalars[s_bound];
  }
  __syncthreads();
  return published;
}

/// Block 0 of `sample_bound`: the last key of the first histogram bin at which the sample's
/// running count reaches `rank` (bins of 2^shift keys from `lo`); ~0 when none does or the
/// key would not fit in 64 bits.
template <int Block>
DHISPARSE_DEVICE std::uint64_t rank_bound(reclaim_params const& p, std::int64_t rank, std::uint64_t lo, int shift)
{
  using scan = cub::BlockScan<unsigned, Block>;
  __shared__ typename scan::TempStorage temp;
  __shared__ int found;
  constexpr int per_thread = sample_bins / Block;
  static_assert(sample_bins % Block == 0);
  unsigned bins[per_thread], sum = 0;
#pragma unroll
  for (int b = 0; b < per_thread; ++b) {
    bins[b] = __ldcg(p.scratch.sample + threadIdx.x * per_thread + b);
    sum += bins[b];
  }
  unsigned before = 0;
  scan(temp).ExclusiveSum(sum, before);
  if (threadIdx.x == 0) { found = sample_bins; }
  __syncthreads();
  if (before < rank && before + sum >= rank) {
    int b = 0;
    while (before + bins[b] < rank) { before += bins[b++]; }
    found = int(threadIdx.x) * per_thread + b;
  }
  __syncthreads();
  std::uint64_t const width = std::uint64_t(found + 1) << shift;
  bool const fits           = found < sample_bins && shift < 52 && width - 1 <= ~0ull - lo;
  return fits ? lo + (width - 1) : ~0ull;
}

/**
 * Global order: a key bound such that, by a strided sample of `sample_slots` slots, the
 * eligible rows with key ≤ bound outnumber `want` with a margin (~0: no useful bound — the
 * sample says too few are eligible; a sample too small to estimate the rank gives its
 * largest key), in every block. The first blocks sample one slot per thread and build the
 * key range, then a histogram over it in `scratch.sample`, with barriers among themselves
 * only; block 0 places the rank and publishes the bound, which the other blocks wait for —
 * no grid barrier. Exactness does not depend on it (see `run`). Where the key is the
 * state (LRU) a sampled slot loads its state alone and counts when it holds a row
 * (`free_slot_state` otherwise): the rows that are not eligible — dirty or selected this
 * step, the newest — have the largest keys, far from the bound, which lies among the
 * oldest. Other policies load the five fields.
 */
template <class Eviction, int Block>
DHISPARSE_DEVICE std::uint64_t sample_bound(reclaim_params const& p, int want, std::int32_t limit, team const& t)
{
  auto const& pool     = p.pool;
  auto* scalars        = reinterpret_cast<unsigned long long*>(p.scratch.scalars);
  std::int64_t const n = min(std::int64_t(min(limit, p.scratch.sample_slots)), std::int64_t(t.size) * Block);
  auto const samplers  = unsigned((n + Block - 1) / Block);
  if (t.rank >= samplers) { return await_bound(p); }
  // Expected sampled rows among the `want` released, and a margin of ~4 standard deviations.
  double const expected = double(want) * double(n) / double(limit);
  auto const rank       = std::int64_t(expected + 4.0 * sqrt(expected) + 8.0);
  auto* range           = reinterpret_cast<unsigned long long*>(p.scratch.sample + sample_bins);
  std::int64_t const i  = std::int64_t(t.rank) * Block + threadIdx.x;
  bool ok               = false;
  std::uint64_t key     = 0;
  if (i < n) {
    auto const slot = std::int32_t(i * limit / n);
    if constexpr (key_is_state_v<Eviction>) {
      policy_state const state = pool.state[slot];
      ok                       = state != free_slot_state;
      key                      = Eviction::eviction_key(state, -1);
    } else {  // every field loaded at once: one round trip, not one per test
      std::int32_t const owner  = pool.owner[slot], pos = pool.position[slot];
      std::uint32_t const dirty = pool.dirty[slot], touched = pool.touched[slot];
      policy_state const state  = pool.state[slot];
      ok                        = eligible(owner, pos, dirty, touched, p.pin_epoch);
      key                       = Eviction::eviction_key(state, pos);
    }
  }
  __shared__ unsigned long long block_lo, block_hi;
  unsigned* const local = phase_shared<Block>();
  if (threadIdx.x == 0) {
    block_lo = ~0ull;
    block_hi = 0;
  }
  for (int b = threadIdx.x; b < sample_bins; b += Block) { local[b] = 0; }
  __syncthreads();
  std::uint64_t lo = ok ? key : ~0ull, hi = ok ? key : 0;
  warp_min_max(lo, hi);
  if ((threadIdx.x & 31) == 0 && lo <= hi) {
    atomicMin(&block_lo, lo);
    atomicMax(&block_hi, hi);
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_lo <= block_hi) {
    atomicMax(range, ~block_lo);
    atomicMax(range + 1, block_hi);
  }
  subset_sync(scalars[s_sample_sync], samplers);
  lo                  = ~__ldcg(range);
  hi                  = __ldcg(range + 1);
  std::uint64_t bound = ~0ull;  // no eligible row sampled
  if (lo <= hi) {
    // LRU keys crowd into a few bins (rows touched in one step share one): counted in
    // shared memory first, warp-aggregated.
    int const shift = max(0, resolve::bit_width(hi - lo) - 12);
    if (ok) { aggregated_add(local, unsigned((key - lo) >> shift), 1u); }
    __syncthreads();
    for (int b = threadIdx.x; b < sample_bins; b += Block) {
      if (local[b] != 0) { atomicAdd(p.scratch.sample + b, local[b]); }
    }
    subset_sync(scalars[s_sample_sync + 1], samplers);
    if (t.rank == 0) { bound = rank >= n ? hi : rank_bound<Block>(p, rank, lo, shift); }
  }
  if (t.rank != 0) { return await_bound(p); }
  if (threadIdx.x == 0) {
    scalars[s_bound] = bound;
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(scalars[s_sampled])
      .store(1, cuda::memory_order_release);
  }
  return bound;
}

/// One item of a warp's candidate pass; every lane calls it, `ok` where its slot is eligible:
/// the slot goes to the warp's stage at `stage_end` (lane order), its key to `pool.keys`,
/// its key and tie-break into the thread's bounds. Returns how many lanes staged.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int stage_candidate(device_pool_ref const& pool, bool ok, std::int32_t slot,
                                                           std::uint64_t key, std::int32_t pos, std::int32_t owner,
                                                           int owner_bits, std::int32_t* stage_end,
                                                           std::uint64_t& kmin, std::uint64_t& kmax,
                                                           std::uint64_t& tmin, std::uint64_t& tmax)
{
  unsigned const ballot = __ballot_sync(0xFFFFFFFFu, ok);
  if (ok) {
    std::uint64_t const tie = (std::uint64_t(pos) << owner_bits) | std::uint64_t(owner);
    pool.keys[slot]         = key;
    stage_end[__popc(ballot & ((1u << (threadIdx.x & 31)) - 1))] = slot;
    kmin = min(kmin, key);
    kmax = max(kmax, key);
    tmin = min(tmin, tie);
    tmax = max(tmax, tie);
  }
  return __popc(ballot);
}

/// Appends the warp's `staged` candidates to `out[…]`, counting them in `*counter` (one
/// atomic), and empties the stage; every lane calls it.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void flush_stage(std::int32_t const* stage, int& staged, int* counter,
                                                        std::int32_t* out)
{
  int const lane = int(threadIdx.x & 31);
  int at         = 0;
  if (lane == 0 && staged > 0) { at = atomicAdd(counter, staged); }
  at = __shfl_sync(0xFFFFFFFFu, at, 0);
  __syncwarp();
  for (int i = lane; i < staged; i += 32) { out[at + i] = stage[i]; }
  __syncwarp();
  staged = 0;
}

/**
 * Appends to `s.candidates[base + …]` (counting in `*counter`) every eligible slot whose
 * key lies in (key_lo, key_hi] — key_lo exclusive only when `above` — leaving its key in
 * `pool.keys`; folds keys and tie-breaks into the thread's bounds. Each thread reads
 * `Items` slots' states (and positions, where the key needs them) before deciding; the
 * slots in range then load their other fields at once, one round trip for all of them
 * (free slots are out of range by their state, `free_slot_state`, or by their position,
 * so only rows pay it); each warp stages its candidates in shared memory and appends them
 * with one atomic when its stage fills, so the pass has no block barrier and, when few
 * slots qualify, almost no global atomic.
 */
template <class Eviction, int Block, int Items>
DHISPARSE_DEVICE void collect(reclaim_params const& p, std::int32_t limit, std::uint64_t key_lo, bool above,
                              std::uint64_t key_hi, int* counter, int base, int owner_bits, std::uint64_t& kmin,
                              std::uint64_t& kmax, std::uint64_t& tmin, std::uint64_t& tmax, team const& t)
{
  static_assert(32 * Items <= warp_stage);
  auto* const stage = reinterpret_cast<std::int32_t(*)[warp_stage]>(phase_shared<Block>());
  auto const& pool = p.pool;
  auto const& s    = p.scratch;
  bool const fair  = p.order == reclaim_order::fair_share;
  std::int32_t* mine_stage = stage[threadIdx.x / 32];
  int staged               = 0;  // warp-uniform
  std::int64_t const stride = std::int64_t(t.size) * Block * Items;
  for (std::int64_t tile = std::int64_t(t.rank) * Block * Items; tile < limit; tile += stride) {
    std::int32_t slot[Items], pos[Items];
    policy_state state[Items];
#pragma unroll
    for (int k = 0; k < Items; ++k) {
      std::int64_t const at = tile + std::int64_t(k) * Block + threadIdx.x;
      slot[k]               = at < limit ? std::int32_t(at) : -1;
      // A key known from the state alone is tested first: most slots are then decided
      // after 8 bytes, and only those in the key range load their position.
      pos[k]                = slot[k] >= 0 && !key_is_state_v<Eviction> ? pool.position[slot[k]] : -1;
      state[k]              = slot[k] >= 0 ? pool.state[slot[k]] : policy_state{};
    }
    std::uint64_t key[Items];
    bool in_range[Items];
    std::int32_t owner[Items];
    std::uint32_t dirty[Items], touched[Items];
#pragma unroll
    for (int k = 0; k < Items; ++k) {
      key[k]      = Eviction::eviction_key(state[k], pos[k]);
      in_range[k] = slot[k] >= 0 && key[k] <= key_hi && (!above || key[k] > key_lo) &&
                    (key_is_state_v<Eviction> || pos[k] >= 0);
      load_fields<Eviction>(pool, in_range[k], slot[k], pos[k], owner[k], dirty[k], touched[k]);
    }
#pragma unroll
    for (int k = 0; k < Items; ++k) {
      bool const ok = in_range[k] && eligible(owner[k], pos[k], dirty[k], touched[k], p.pin_epoch);
      staged += stage_candidate(pool, ok, slot[k], key[k], pos[k], owner[k], owner_bits, mine_stage + staged, kmin,
                                kmax, tmin, tmax);
      if (fair && ok) { aggregated_add(s.segment + f_eligible, unsigned(owner[k] * f_fields), 1); }
    }
    if (staged > warp_stage - 32 * Items) { flush_stage(mine_stage, staged, counter, s.candidates + base); }
  }
  flush_stage(mine_stage, staged, counter, s.candidates + base);
}

/// Key floors (`device_pool_ref::key_floor`) each lane of `collect_floored` reads per pass.
inline constexpr int floors_per_lane = 4;

/**
 * `collect` of the slots whose key is at most `key_hi` (< ~0: the sampled bound), through
 * the pool's key floors: each pass of a warp reads the floors of `floors_per_lane` units of
 * 32 consecutive chunks of 2^key_floor_shift slots (coalesced, 4 bytes per chunk), lists the
 * chunks whose floor is at most `key_hi` in shared memory, and its lanes take the listed
 * chunks one each:
 * the chunk's states (one 32-byte sector) and floor are loaded at once, the floor is raised
 * to the least key found (so that floors left low by hits since are tight again), and the
 * slots in range load their other fields. A chunk whose floor lies above the bound holds
 * no row in range (every row's key is at least its floor), so it is not read. Same
 * candidates, keys in `pool.keys` and bounds as `collect` with (0, key_hi].
 */
template <class Eviction, int Block>
DHISPARSE_DEVICE void collect_floored(reclaim_params const& p, std::int32_t limit, std::uint64_t key_hi,
                                      int* counter, int owner_bits, std::uint64_t& kmin, std::uint64_t& kmax,
                                      std::uint64_t& tmin, std::uint64_t& tmax, team const& t)
{
  constexpr int per_chunk = 1 << key_floor_shift;
  static_assert(32 * per_chunk <= warp_stage && 32 * floors_per_lane <= 256);
  auto* const stage = reinterpret_cast<std::int32_t(*)[warp_stage]>(phase_shared<Block>());
  __shared__ std::uint8_t listed_chunks[Block / 32][32 * floors_per_lane];
  auto const& pool = p.pool;
  auto const& s    = p.scratch;
  int const lane   = int(threadIdx.x & 31);
  int const warp   = int(threadIdx.x / 32);
  std::int32_t* mine_stage = stage[warp];
  std::uint8_t* mine_list  = listed_chunks[warp];
  int staged               = 0;  // warp-uniform
  // 32-bit indices: a chunk's first slot is below the limit.
  int const chunks = int((std::int64_t(limit) + per_chunk - 1) >> key_floor_shift);
  // Units of 32 chunks, a warp's units of one pass `warps` units apart: rows in range
  // crowd into some ranges of slots (the oldest rows into the lowest slots, which the free
  // stack hands out first), and a warp's listed chunks cost it a round trip per 32.
  int const units = (chunks + 31) / 32;
  int const warps = int(t.size) * (Block / 32);
  for (int first = int(t.rank) * (Block / 32) + warp; first < units; first += warps * floors_per_lane) {
    // 1. The floors of the warp's units; the chunks that may hold a key in range are listed.
    auto const chunk_of = [&](int k, int in_unit) { return (first + k * warps) * 32 + in_unit; };
    std::uint32_t floors[floors_per_lane];
#pragma unroll
    for (int k = 0; k < floors_per_lane; ++k) {
      int const c = chunk_of(k, lane);
      floors[k]   = c < chunks ? pool.key_floor[c] : ~0u;
    }
    int listed = 0;
#pragma unroll
    for (int k = 0; k < floors_per_lane; ++k) {
      bool const open       = std::uint64_t(floors[k]) <= key_hi && chunk_of(k, lane) < chunks;
      unsigned const ballot = __ballot_sync(0xFFFFFFFFu, open);
      if (open) { mine_list[listed + __popc(ballot & ((1u << lane) - 1))] = std::uint8_t(k * 32 + lane); }
      listed += __popc(ballot);
    }
    __syncwarp();
    // 2. A listed chunk a lane: states and floor at once, then the fields of the slots in range.
    for (int at = 0; at < listed; at += 32) {
      int const entry     = at + lane < listed ? mine_list[at + lane] : -1;
      int const listed_at = entry >= 0 ? chunk_of(entry / 32, entry % 32) << key_floor_shift : -1;
      int const in_pool   = listed_at >= 0 ? min(per_chunk, limit - listed_at) : 0;  // slots below the limit
      std::int32_t slot[per_chunk], pos[per_chunk];
      policy_state state[per_chunk];
      std::uint32_t const old_floor = in_pool > 0 ? pool.key_floor[listed_at >> key_floor_shift] : 0u;
#pragma unroll
      for (int u = 0; u < per_chunk; ++u) {
        slot[u]  = u < in_pool ? listed_at + u : -1;
        pos[u]   = slot[u] >= 0 && !key_is_state_v<Eviction> ? pool.position[slot[u]] : -1;
        state[u] = slot[u] >= 0 ? pool.state[slot[u]] : free_slot_state;
      }
      std::uint64_t key[per_chunk];
      bool in_range[per_chunk];
      std::uint32_t least = ~0u;
#pragma unroll
      for (int u = 0; u < per_chunk; ++u) {
        key[u]         = Eviction::eviction_key(state[u], pos[u]);
        bool const row = slot[u] >= 0 && (key_is_state_v<Eviction> || pos[u] >= 0);
        least          = row ? min(least, key_floor_of(key[u])) : least;
        in_range[u]    = row && key[u] <= key_hi;
      }
      if (in_pool > 0 && least != old_floor) { pool.key_floor[listed_at >> key_floor_shift] = least; }
      std::int32_t owner[per_chunk];
      std::uint32_t dirty[per_chunk], touched[per_chunk];
#pragma unroll
      for (int u = 0; u < per_chunk; ++u) {
        load_fields<Eviction>(pool, in_range[u], slot[u], pos[u], owner[u], dirty[u], touched[u]);
      }
#pragma unroll
      for (int u = 0; u < per_chunk; ++u) {
        bool const ok = in_range[u] && eligible(owner[u], pos[u], dirty[u], touched[u], p.pin_epoch);
        staged += stage_candidate(pool, ok, slot[u], key[u], pos[u], owner[u], owner_bits, mine_stage + staged, kmin,
                                  kmax, tmin, tmax);
      }
      if (staged > warp_stage - 32 * per_chunk) { flush_stage(mine_stage, staged, counter, s.candidates); }
    }
    __syncwarp();  // the list is rewritten by the next pass
  }
  flush_stage(mine_stage, staged, counter, s.candidates);
}

/// Tie-break of a row: lower position first, then lower request index.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint64_t tie_of(device_pool_ref const& pool, std::int32_t slot,
                                                            int owner_bits)
{
  return (std::uint64_t(pool.position[slot]) << owner_bits) | std::uint64_t(pool.owner[slot]);
}

/**
 * Global order, (key, tie-break) packed into one word of `bits` bits (key − key_lo above
 * the `tie_bits` of tie − tie_lo; unique per row): returns the t-th smallest packed value
 * of the n candidates, leaving every candidate's packed value in `pool.keys`. Digits of
 * `select_digit_bits` bits (a 30-bit word in 3 passes), one grid barrier per digit: every
 * block adds its counts to the grid's histogram of the digit, and after the barrier each
 * block picks the digit itself from it (all pick the same). The histograms rotate over
 * three buffers of `scratch.hist`: the one of digit i is cleared after the barrier of
 * digit i − 1 — every block read it before that barrier, none adds to it before the next —
 * so the buffers are zero again when the select ends except the last one, which
 * `reset_scratch` clears.
 */
template <int Block>
DHISPARSE_DEVICE std::uint64_t select_packed(reclaim_params const& p, int n, int t, int bits, std::uint64_t key_lo,
                                             int tie_bits, std::uint64_t tie_lo, int owner_bits, team const& blocks)
{
  auto const& pool = p.pool;
  auto const& s    = p.scratch;
  std::int64_t const threads = std::int64_t(blocks.size) * Block;
  std::int64_t const first   = std::int64_t(blocks.rank) * Block + threadIdx.x;
  constexpr int per_thread   = select_radix / Block;
  static_assert(select_radix % Block == 0);
  using scan = cub::BlockScan<unsigned, Block>;
  __shared__ typename scan::TempStorage temp;
  unsigned* const hist = phase_shared<Block>();
  __shared__ std::uint64_t prefix;
  __shared__ int remaining;
  if (threadIdx.x == 0) {
    prefix    = 0;
    remaining = t;
  }
  int const digits = (bits + select_digit_bits - 1) / select_digit_bits;
  for (int digit = 0; digit < digits; ++digit) {
    int const shift = (digits - 1 - digit) * select_digit_bits;
    for (int i = threadIdx.x; i < select_radix; i += Block) { hist[i] = 0; }
    __syncthreads();
    std::uint64_t const above = prefix;
    int const rem             = remaining;
    for (std::int64_t c = first; c < n; c += threads) {
      std::int32_t const slot = s.candidates[c];
      std::uint64_t v;
      if (digit == 0) {  // this thread reads candidate c in every digit and in release
        std::uint64_t const key  = __ldcg(reinterpret_cast<unsigned long long const*>(pool.keys) + slot);
        std::uint64_t const high = tie_bits >= 64 ? 0 : (key - key_lo) << tie_bits;
        v                        = high | (tie_of(pool, slot, owner_bits) - tie_lo);
        pool.keys[slot]          = v;
      } else {
        v = pool.keys[slot];
      }
      if (shift + select_digit_bits < 64 && ((v ^ above) >> (shift + select_digit_bits)) != 0) { continue; }
      aggregated_add(hist, unsigned(v >> shift) & unsigned(select_radix - 1), 1u);
    }
    __syncthreads();
    std::uint32_t* h = s.hist + (digit % 3) * select_radix;
    for (int i = threadIdx.x; i < select_radix; i += Block) {
      if (hist[i] != 0) { atomicAdd(h + i, hist[i]); }
    }
    blocks.sync();
    if (blocks.rank == 0) {
      for (int i = threadIdx.x; i < select_radix; i += Block) { s.hist[((digit + 2) % 3) * select_radix + i] = 0; }
    }
    // The digit where the running count reaches `rem`, and the count below it.
    unsigned bins[per_thread], sum = 0;
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      bins[i] = __ldcg(h + threadIdx.x * per_thread + i);
      sum += bins[i];
    }
    unsigned before = 0;
    scan(temp).ExclusiveSum(sum, before);
    if (before < unsigned(rem) && before + sum >= unsigned(rem)) {  // exactly one thread
      int i = 0;
      while (before + bins[i] < unsigned(rem)) { before += bins[i++]; }
      prefix |= std::uint64_t(int(threadIdx.x) * per_thread + i) << shift;
      remaining = rem - int(before);
    }
    __syncthreads();
  }
  return prefix;
}

/// Releases every candidate c < n for which `take(slot, owner)` holds: unmap, free, push
/// onto the free stack, count. Candidate c is read by the thread that read it in the select.
template <int Block, class Take>
DHISPARSE_DEVICE void release_candidates(reclaim_params const& p, int n, team const& t, Take const& take_of)
{
  auto const& pool = p.pool;
  auto const& s    = p.scratch;
  std::int64_t const threads = std::int64_t(t.size) * Block;
  int released = 0;
  for (std::int64_t base = std::int64_t(t.rank) * Block; base < n; base += threads) {
    std::int64_t const c = base + threadIdx.x;
    bool take            = false;
    std::int32_t slot = -1, owner = -1;
    if (c < n) {
      slot  = s.candidates[c];
      owner = pool.owner[slot];
      take  = take_of(slot, owner);
    }
    int const at = block_append<Block>(pool.free_count, take);
    if (take) {
      *p.map.entry(owner, p.group, pool.position[slot]) = not_resident;
      pool.owner[slot]    = -1;
      pool.position[slot] = -1;
      pool.state[slot]    = free_slot_state;
      pool.touched[slot]  = 0;
      pool.free_stack[at] = slot;
      aggregated_add(pool.owned_count, unsigned(owner), -1);
      ++released;
    }
  }
  __shared__ int block_released;
  if (threadIdx.x == 0) { block_released = 0; }
  __syncthreads();
  if (released != 0) { atomicAdd(&block_released, released); }
  __syncthreads();
  if (threadIdx.x == 0 && block_released != 0) {
    atomicAdd(&pool.counters->reclaimed_rows, static_cast<unsigned long long>(block_released));
  }
}

/**
 * Called by every block once it no longer reads the scratch: the last block to arrive puts
 * it back to zero for the next reclaim and counts the reclaim — a counter, not a grid
 * barrier. The per-segment selects clear their histograms as they go; the packed select's
 * last buffer is cleared here.
 */
template <int Block>
DHISPARSE_DEVICE void reset_scratch(reclaim_params const& p, team const& t)
{
  auto const& s = p.scratch;
  auto* scalars = reinterpret_cast<unsigned long long*>(s.scalars);
  __shared__ bool last;
  __syncthreads();  // every thread of the block is done with the scratch
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(scalars + s_done, 1ull) == t.size - 1;
  }
  __syncthreads();
  if (!last) { return; }
  __threadfence();
  for (std::int64_t i = threadIdx.x; i < std::int64_t(s.segments) * f_fields; i += Block) { s.segment[i] = 0; }
  for (int i = threadIdx.x; i < 3 * select_radix; i += Block) { s.hist[i] = 0; }
  if (threadIdx.x < s_scalars) { scalars[threadIdx.x] = 0; }
  for (int i = threadIdx.x; i < sample_bins + 4; i += Block) { s.sample[i] = 0; }
  if (threadIdx.x == 0) { atomicAdd(&p.pool.counters->reclaims, 1ull); }
}

template <class Eviction, int Block>
DHISPARSE_DEVICE void run(reclaim_params const& p, int want, team const& blocks)
{
  auto const& pool = p.pool;
  auto const& s    = p.scratch;
  bool const fair  = p.order == reclaim_order::fair_share;
  int const owner_bits = max(1, resolve::bit_width(std::uint64_t(max(pool.max_requests - 1, 1))));
  std::int64_t const threads = std::int64_t(blocks.size) * Block;
  std::int64_t const first   = std::int64_t(blocks.rank) * Block + threadIdx.x;
  auto* count                = reinterpret_cast<int*>(s.scalars + s_candidates);
  auto* scalars              = reinterpret_cast<unsigned long long*>(s.scalars);
  __shared__ unsigned hist[256];
  __shared__ unsigned long long kmin, kmax, tmin, tmax;
  if (threadIdx.x == 0) {
    kmin = tmin = ~0ull;
    kmax = tmax = 0;
  }
  __syncthreads();

  // 0.–1. Candidates (their keys cached in pool.keys), with the bounds of keys and ties:
  // in global order first those up to the sampled bound; when fewer than `want` are, the
  // rest too (counted apart, after the barrier, so that every block takes the same branch).
  // The select below then runs over a superset of the rows it releases either way.
  std::int32_t const limit = *pool.limit;
  std::uint64_t my_kmin = ~0ull, my_kmax = 0, my_tmin = ~0ull, my_tmax = 0;
  auto const publish_bounds = [&] {  // folds into the grid's bounds (monotone: may repeat)
    warp_min_max(my_kmin, my_kmax);
    warp_min_max(my_tmin, my_tmax);
    if ((threadIdx.x & 31) == 0) {
      atomicMin(&kmin, my_kmin);
      atomicMax(&kmax, my_kmax);
      atomicMin(&tmin, my_tmin);
      atomicMax(&tmax, my_tmax);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // minima are kept complemented, so that zero is "none yet"
      atomicMax(scalars + s_key_min, ~kmin);
      atomicMax(scalars + s_key_max, kmax);
      atomicMax(scalars + s_tie_min, ~tmin);
      atomicMax(scalars + s_tie_max, tmax);
    }
  };
  std::uint64_t const bound = samples(p, want, limit) ? sample_bound<Eviction, Block>(p, want, limit, blocks) : ~0ull;
  if (bound != ~0ull) {
    collect_floored<Eviction, Block>(p, limit, bound, count, owner_bits, my_kmin, my_kmax, my_tmin, my_tmax, blocks);
  } else {
    collect<Eviction, Block, 4>(p, limit, 0, false, bound, count, 0, owner_bits, my_kmin, my_kmax, my_tmin, my_tmax,
                                blocks);
  }
  publish_bounds();
  blocks.sync();
  if (bound != ~0ull) {
    int const in_bound = __ldcg(count);  // nothing appends to *count any more
    if (in_bound < want) {
      collect<Eviction, Block, 4>(p, limit, bound, true, ~0ull, reinterpret_cast<int*>(s.scalars + s_rest), in_bound,
                                  owner_bits, my_kmin, my_kmax, my_tmin, my_tmax, blocks);
      publish_bounds();
      blocks.sync();
    }
  }

  int const n = *count + *reinterpret_cast<int const*>(s.scalars + s_rest);
  std::uint64_t const key_lo = ~scalars[s_key_min], key_hi = scalars[s_key_max];
  std::uint64_t const tie_lo = ~scalars[s_tie_min], tie_hi = scalars[s_tie_max];

  // Global order with (key, tie-break) in one word: one select, one barrier per digit.
  if (!fair) {
    int const packed_key_bits = n > 0 ? resolve::bit_width(key_lo ^ key_hi) : 0;
    int const packed_tie_bits = n > 0 ? resolve::bit_width(tie_lo ^ tie_hi) : 0;
    if (packed_key_bits + packed_tie_bits <= 64) {
      int const t = min(want, n);
      std::uint64_t threshold = ~0ull;  // every candidate when t = n
      if (t < n) {
        threshold = select_packed<Block>(p, n, t, packed_key_bits + packed_tie_bits, key_lo, packed_tie_bits, tie_lo,
                                         owner_bits, blocks);
      }
      release_candidates<Block>(p, n, blocks, [&](std::int32_t slot, std::int32_t) {
        return t >= n || pool.keys[slot] <= threshold;
      });
      reset_scratch<Block>(p, blocks);
      return;
    }
  }

  // 2. Targets.
  if (blocks.rank == 0) {
    if (fair) {
      fair_targets<Block>(p, want);
    } else if (threadIdx.x == 0) {
      int const t = min(want, n);
      s.segment[f_target]    = t;
      s.segment[f_remaining] = t;
      s.segment[f_eligible]  = n;
      s.segment[f_mode]      = t == 0 ? mode_none : (t >= n ? mode_all : mode_key);
    }
  }
  int const key_bits         = (resolve::bit_width(key_lo ^ key_hi) + 7) / 8 * 8;
  int const tie_bits         = (resolve::bit_width(tie_lo ^ tie_hi) + 7) / 8 * 8;
  std::uint64_t const key_base = key_bits >= 64 ? 0 : key_lo & (~0ull << key_bits);
  std::uint64_t const tie_base = tie_bits >= 64 ? 0 : tie_lo & (~0ull << tie_bits);
  for (std::int64_t g = first; g < s.segments; g += threads) {
    s.prefix[2 * g]     = key_base;
    s.prefix[2 * g + 1] = tie_base;
  }
  blocks.sync();

  // 3. Radix select per segment: key digits, then tie-break digits.
  auto const segment_of = [&](std::int32_t slot) { return fair ? pool.owner[slot] : 0; };
  int pass = 0;
  for (int level = 0; level < 2; ++level) {
    int const bits = level == 0 ? key_bits : tie_bits;
    for (int shift = bits - 8; shift >= 0; shift -= 8, ++pass) {
      std::uint32_t* h = s.hist + std::size_t(pass & 1) * s.segments * 256;
      if (!fair) {
        for (int i = threadIdx.x; i < 256; i += Block) { hist[i] = 0; }
        __syncthreads();
      }
      int const active_mode = level == 0 ? mode_key : mode_tie;
      std::int32_t const* list = level == 0 ? s.candidates : s.ties;
      std::int64_t const m     = level == 0 ? n : *reinterpret_cast<int const*>(scalars + s_ties);
      for (std::int64_t c = first; c < m; c += threads) {
        std::int32_t const slot = list[c];
        int const g             = segment_of(slot);
        if (s.segment[g * f_fields + f_mode] != active_mode) { continue; }
        std::uint64_t const key = pool.keys[slot];
        std::uint64_t v         = key;
        if (level == 1) {
          if (key != s.prefix[2 * g]) { continue; }
          v = tie_of(pool, slot, owner_bits);
        }
        if (((v ^ s.prefix[2 * g + level]) >> shift >> 8) != 0) { continue; }
        unsigned const d = unsigned(v >> shift) & 255u;
        if (fair) {
          aggregated_add(h, unsigned(g) * 256u + d, 1u);
        } else {
          aggregated_add(hist, d, 1u);
        }
      }
      if (!fair) {
        __syncthreads();
        for (int i = threadIdx.x; i < 256; i += Block) {
          if (hist[i] != 0) { atomicAdd(h + i, hist[i]); }
        }
      }
      blocks.sync();
      if (threadIdx.x < 32) {
        for (int g = int(blocks.rank); g < s.segments; g += int(blocks.size)) {
          std::int32_t* rec = s.segment + g * f_fields;
          if (rec[f_mode] != active_mode) { continue; }
          unsigned* gh = h + std::size_t(g) * 256;
          int rem      = rec[f_remaining];
          int const d  = resolve::pick_digit(gh, rem);
          unsigned const in_digit = gh[d];
          __syncwarp();
          for (int i = threadIdx.x; i < 256; i += 32) { gh[i] = 0; }
          if (threadIdx.x == 0) {
            s.prefix[2 * g + level] |= std::uint64_t(d) << shift;
            rec[f_remaining] = rem;
            rec[f_ties]      = int(in_digit);
          }
        }
      }
      blocks.sync();
    }
    if (level == 0) {
      // Threshold key found: release all its rows, or select among them by tie-break.
      for (std::int64_t g = first; g < s.segments; g += threads) {
        std::int32_t* rec = s.segment + g * f_fields;
        if (rec[f_mode] != mode_key) { continue; }
        int const ties = key_bits > 0 ? rec[f_ties] : rec[f_eligible];
        rec[f_mode]    = rec[f_remaining] == ties ? mode_le_key : mode_tie;
        if (rec[f_mode] == mode_tie) { atomicOr(reinterpret_cast<int*>(scalars + s_any_tie), 1); }
      }
      blocks.sync();
      if (scalars[s_any_tie] == 0) { break; }
      // The tie-break passes read only the candidates at their segment's threshold key.
      auto* ties = reinterpret_cast<int*>(scalars + s_ties);
      for (std::int64_t base = std::int64_t(blocks.rank) * Block; base < n; base += threads) {
        std::int64_t const c = base + threadIdx.x;
        std::int32_t slot    = -1;
        bool tied            = false;
        if (c < n) {
          slot        = s.candidates[c];
          int const g = segment_of(slot);
          tied        = s.segment[g * f_fields + f_mode] == mode_tie && pool.keys[slot] == s.prefix[2 * g];
        }
        int const at = block_append<Block>(ties, tied);
        if (tied) { s.ties[at] = slot; }
      }
      blocks.sync();
    }
  }

  // 4. Release.
  release_candidates<Block>(p, n, blocks, [&](std::int32_t slot, std::int32_t owner) {
    int const g               = fair ? owner : 0;
    std::int32_t const* rec   = s.segment + g * f_fields;
    std::uint64_t const key   = pool.keys[slot];
    std::uint64_t const kstar = s.prefix[2 * g];
    switch (rec[f_mode]) {
      case mode_all: return true;
      case mode_le_key: return key <= kstar;
      case mode_tie: return key < kstar || (key == kstar && tie_of(pool, slot, owner_bits) <= s.prefix[2 * g + 1]);
      default: return false;
    }
  });

  // 5. Scratch back to zero for the next reclaim.
  reset_scratch<Block>(p, blocks);
}

/// Explicit reclaim: up to `target_free` free slots.
template <class Eviction, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block, 2) reclaim_kernel(reclaim_params p)
{
  int const want = p.target_free - *p.pool.free_count;
  auto* const arrivals = reinterpret_cast<unsigned long long*>(p.scratch.scalars) + s_team_sync;
  if (want > 0) { run<Eviction, Block>(p, want, team{blockIdx.x, gridDim.x, arrivals}); }
}

/// Reclaim inside resolve, a programmatic dependent of lookup (not a cooperative launch:
/// those are not started early): when the step's new rows would leave fewer than
/// `low_watermark` free slots, the blocks that have started by then release what the rows
/// need plus `batch_extra`; otherwise every block returns after the check.
template <class Eviction, int Block>
DHISPARSE_KERNEL void __launch_bounds__(Block, 2)
  resolve_reclaim_kernel(reclaim_params p, resolve::request_need const* need, std::uint32_t const* epoch,
                         std::uint32_t* roster, step_batch_ref batch, std::int32_t low_watermark,
                         std::int32_t batch_extra)
{
  using reduce = cub::BlockReduce<long long, Block>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ long long short_by;
  launch_dependents();       // allocate waits for this grid on the device
  wait_for_prerequisites();  // lookup's needs and epoch
  int const size = *batch.size;
  long long mine = 0;
  for (int b = threadIdx.x; b < size; b += Block) {
    int const spares = p.pool.spare_count[batch.requests[b]];
    mine += max(0, need[b].misses + need[b].tails - spares);
  }
  long long const sum = reduce(temp).Sum(mine);
  // One read of the free count for the block: a block that starts late may read it while a
  // team releases rows, and its threads must agree on whether to join.
  if (threadIdx.x == 0) { short_by = sum + low_watermark - *p.pool.free_count; }
  __syncthreads();
  if (short_by <= 0) { return; }
  int want = int(min(short_by + batch_extra, (long long)p.pool.num_slots));
  team members{};
  if (!join_team<Block>(roster, reinterpret_cast<unsigned long long*>(p.scratch.scalars) + s_team_sync, want,
                        members)) {
    return;
  }
  p.pin_epoch = *epoch;
  run<Eviction, Block>(p, want, members);
}

/// Blocks of `kernel` that fit on the current device at once (a cooperative launch's
/// most; resolve's reclaim launches as many, so that every block can join its team).
template <class Kernel>
int resident_blocks(Kernel kernel, int block)
{
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms * per_sm;
}

}  // namespace detail::reclaim

inline std::size_t reclaim_scratch_size(std::int32_t num_slots, std::int32_t segments)
{
  return detail::reclaim::scratch_bytes(num_slots, segments, nullptr, nullptr);
}

inline reclaim_scratch_ref make_reclaim_scratch(void* memory, std::int32_t num_slots, std::int32_t segments,
                                                std::int32_t sample_slots)
{
  reclaim_scratch_ref s{};
  detail::reclaim::scratch_bytes(num_slots, segments, &s, memory);
  s.sample_slots = sample_slots;
  return s;
}

inline std::string reclaim_params_problem(reclaim_params const& params)
{
  if (params.order == reclaim_order::none) { return "reclaim: order is reclaim_order::none"; }
  if (params.scratch.candidates == nullptr) { return "reclaim: scratch.candidates is null"; }
  if (params.order == reclaim_order::fair_share && params.scratch.segments < params.pool.max_requests) {
    return "reclaim: scratch.segments (" + std::to_string(params.scratch.segments) + ") is below pool.max_requests (" +
           std::to_string(params.pool.max_requests) + "), as a fair share needs";
  }
  return {};
}

template <class Eviction>
cudaError_t reclaim_async(reclaim_params const& params, cudaStream_t stream)
{
  static_assert(is_eviction_policy_v<Eviction>, "Eviction: see policy/concepts.hpp");
  namespace rc = detail::reclaim;
  if (!reclaim_params_problem(params).empty()) { return cudaErrorInvalidValue; }
  auto kernel      = rc::reclaim_kernel<Eviction, rc::block_size>;
  int const blocks = params.blocks > 0 ? params.blocks : rc::resident_blocks(kernel, rc::block_size);
  if (blocks <= 0) { return cudaErrorInvalidConfiguration; }
  reclaim_params p = params;
  void* args[]     = {&p};
  cudaError_t const status = cudaLaunchCooperativeKernel(reinterpret_cast<void const*>(kernel), dim3(unsigned(blocks)),
                                                         dim3(rc::block_size), args, 0, stream);
  return status != cudaSuccess ? status : detail::check_launch(stream);
}

}  // namespace dhisparse
