/**
 * @file detail/verify/wide.cuh
 * @brief The wide greedy path: greedy verification from p level by level, the rows of
 *        every request at one depth of its accepted path argmaxed together by the whole
 *        GPU, in the caller's workspace (`verify_params::workspace`).
 *
 * Greedy reads one row per visited node, in order: row m's argmax decides whether draft
 * m + 1 is accepted. Most requests stop after a row or two; with one CTA (or cluster) per
 * request the few long paths then run alone at the end of the call, one latency-bound row
 * after another. Here a prologue checks every request (`request_block::check_greedy`,
 * the per-request kernels' own checks) and makes depth 0's list: every valid request at
 * its root. Then one launch per depth L = 0 … max_drafts splits the rows of depth L into
 * chunks, one work item each, over a grid of every SM's resident CTAs. An item's argmax
 * (largest value, smallest index, NaN skipped and counted) is merged into its row's
 * packed 64-bit key with `atomicMax`; the CTA that completes a row (a counter per row,
 * fences: the "last block" pattern) decides it: the child carrying the argmax is appended
 * to depth L + 1's list, otherwise the request's outputs are written, exactly as
 * `request_block::write_outputs` writes them after the same walk. A depth with no rows
 * exits at once. Each depth is a programmatic dependent launch of the launch before
 * (dependent_launch.cuh): its CTAs are scheduled while that one finishes and wait on the
 * device, so no launch gap separates the depths. Every launch has a fixed shape and
 * reads its row count from the workspace, so a call is graph-capturable; the counters each
 * depth uses are reset by the launch before it (the prologue for depths 0 and 1), so the
 * workspace needs no initialization.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/dependent_launch.cuh>
#include <dhisparse/detail/device_info.cuh>
#include <dhisparse/detail/verify/cta.cuh>
#include <dhisparse/detail/verify/request_block.cuh>
#include <dhisparse/detail/verify/row_pass.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>
#include <dhisparse/verify_params.hpp>

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

namespace dhisparse::detail::verify {

/// Chunks of a row are whole multiples of this many elements: one vector of 4 per thread
/// of a CTA (so 16-byte loads never straddle two chunks).
inline constexpr int wide_unit = block_threads * 4;

/// CTAs of `wide_argmax_kernel` per SM: its `__launch_bounds__` minimum (≤ 64 registers
/// per thread, 80 bytes of shared memory), so all of a depth's CTAs are resident at once.
inline constexpr int wide_ctas_per_sm = 4;

#ifndef DHISPARSE_VERIFY_WIDE_CHUNK
/// Longest chunk of a row one CTA argmaxes as one work item, in elements (a multiple of
/// `wide_unit`); depths with few rows cut them shorter so that every CTA has an item.
/// Measured on the H200 at B = 512, d = 8, V = 151 552 (chain / tree greedy, ms, 128 bytes
/// in flight, 2026-12-04 night): 8K 0.273 / 0.313, 16K 0.243 / 0.269, 32K 0.229 / 0.259,
/// 64K 0.231 / 0.255.
#define DHISPARSE_VERIFY_WIDE_CHUNK 32768
#endif
inline constexpr int wide_max_chunk = DHISPARSE_VERIFY_WIDE_CHUNK;

/// 16-byte loads in flight per thread of a depth launch: 4 (64 bytes; with 4 CTAs of 256
/// threads, 64 KB per SM). 8 measured 3–4% slower on the H200 (2026-12-04 night: chain
/// greedy 0.2295 against 0.2210 ms, tree 0.2608 against 0.2520 ms, docs/benchmarks.md "verify").
inline constexpr int wide_unroll = 4;
static_assert(wide_max_chunk >= wide_unit && wide_max_chunk % wide_unit == 0,
              "DHISPARSE_VERIFY_WIDE_CHUNK must be a positive multiple of 1024");

/// The workspace, typed (offsets: `workspace_layout`, verify_params.hpp).
struct wide_workspace {
  unsigned long long* keys;      ///< [2][capacity] packed argmax of a row so far (`argmax_key`; 0: none)
  unsigned long long* progress;  ///< [2][capacity] chunks done (low 32 bits), chunks that held NaN (high 32)
  int2* entries;                 ///< [2][capacity] {request, node} of a row; request -1: none (depth 0 only)
  std::int32_t* counts;          ///< [max_drafts + 1] rows of depth L ≥ 1
  int capacity;

  static wide_workspace of(verify_params const& a)
  {
    workspace_layout const l = workspace_layout::of(a.capacity, a.max_drafts);
    auto* base               = static_cast<unsigned char*>(a.workspace);
    return {reinterpret_cast<unsigned long long*>(base + l.keys),
            reinterpret_cast<unsigned long long*>(base + l.progress), reinterpret_cast<int2*>(base + l.entries),
            reinterpret_cast<std::int32_t*>(base + l.counts), a.capacity};
  }

  /// Index of row `row` of depth `depth` in the per-row arrays.
  __device__ int slot(int depth, int row) const { return (depth & 1) * capacity + row; }
};

/**
 * @brief (value, index) of an argmax as one integer whose order is the argmax's: larger
 *        value first, then smaller index. The value's bits are mapped to an unsigned
 *        integer with the order of the floats (−0 as +0, which compares equal to it); the
 *        index is inverted. 0, below every pair, stands for "no element" (`arg` INT_MAX).
 */
__device__ __forceinline__ unsigned long long argmax_key(float best, std::int32_t arg)
{
  if (arg == INT_MAX) { return 0; }
  std::uint32_t u = best == 0.f ? 0u : __float_as_uint(best);
  u               = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | ~static_cast<std::uint32_t>(arg);
}

/// The index of a key made by `argmax_key`; -1 for none.
__device__ __forceinline__ std::int32_t argmax_index(unsigned long long key)
{
  return key == 0 ? -1 : std::int32_t(~static_cast<std::uint32_t>(key));
}

/// How the rows of a depth are cut into chunks; every CTA computes the same from the row
/// count. Chunks are at most `max_chunk` elements and, when the rows are few, as short as
/// needed (down to `wide_unit`) for `ctas` work items in all.
struct wide_split {
  std::int64_t length;  ///< elements per chunk, a multiple of `wide_unit` (a row's last chunk may be shorter)
  int chunks;           ///< chunks per row

  __device__ static wide_split of(int vocab, int rows, int ctas, int max_chunk)
  {
    int const units  = (vocab + wide_unit - 1) / wide_unit;
    int const most   = max(1, max_chunk / wide_unit);  // units per chunk at most
    int const fewest = (units + most - 1) / most;      // chunks per row at least
    int const want   = (ctas + rows - 1) / rows;       // chunks per row for an item per CTA
    int const chunks = min(max(want, fewest), units);
    int const per    = (units + chunks - 1) / chunks;
    return {std::int64_t(per) * wide_unit, (units + per - 1) / per};
  }
};

/// Elements [c0, c1) of a row: this thread's (largest value, smallest index), NaN skipped;
/// whether it saw NaN. Every thread of the CTA reads `Vec`-wide vectors: `Unroll` 16-byte
/// loads at once, or 16 scalar loads (more would spill).
template <int Vec, int Unroll>
__device__ __forceinline__ bool chunk_argmax(float const* p, std::int64_t c0, std::int64_t c1, float& best,
                                             std::int32_t& arg)
{
  constexpr int unroll    = Vec == 4 ? Unroll : 16;
  constexpr int step      = block_threads * Vec;
  bool nan                = false;
  best                    = -__int_as_float(0x7F800000);
  arg                     = INT_MAX;
  for (std::int64_t base = c0 + std::int64_t(threadIdx.x) * Vec; base < c1; base += unroll * step) {
    float v[unroll][Vec];
#pragma unroll
    for (int u = 0; u < unroll; ++u) { row_loader<Vec>::load(p, base + u * step, c1, v[u]); }
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
#pragma unroll
      for (int e = 0; e < Vec; ++e) {
        std::int64_t const i = base + u * step + e;
        float const x        = v[u][e];
        if (i < c1) {
          if (x != x) {
            nan = true;
          } else if (x > best || (x == best && i < arg)) {
            best = x;
            arg  = std::int32_t(i);
          }
        }
      }
    }
  }
  return nan;
}

/// What the decision about node `cur` of request b reads first: the request's count and,
/// in a chain, the token of node cur + 1 (in a tree: node cur's first child, as stored).
/// Loaded when a CTA starts an item of the row, so that the loads overlap the row's.
struct node_links {
  int n;              ///< nodes in play (num_drafts[b], or max_drafts)
  std::int32_t next;  ///< chain: token of node cur + 1 (-1 past max_drafts); tree: first_child[cur]
};

__device__ __forceinline__ node_links load_links(verify_params const& a, int b, int cur)
{
  int const d = a.max_drafts;
  node_links k;
  k.n = a.num_drafts ? a.num_drafts[b] : d;
  if (a.topology == draft_topology::chain) {
    k.next = cur < d ? a.draft_tokens[std::int64_t(b) * d + cur] : -1;
  } else {
    k.next = a.first_child[std::int64_t(b) * (d + 1) + cur];
  }
  return k;
}

/// The child of node `cur` of request b whose draft token is `t` (the first in sibling
/// order), or -1; `request_block::walk_greedy`'s choice. `k`: `load_links(a, b, cur)`. The
/// structure is valid (checked by the prologue); links to nodes past num_drafts are pruned
/// as `load_structure` prunes them.
__device__ __forceinline__ int child_with_token(verify_params const& a, int b, int cur, std::int32_t t,
                                                node_links k)
{
  if (a.topology == draft_topology::chain) { return cur < k.n && k.next == t ? cur + 1 : -1; }
  std::int64_t const base = std::int64_t(b) * (a.max_drafts + 1);
  auto link               = [&](std::int32_t v) { return v > k.n ? -1 : int(v); };
  for (int c = link(k.next); c != -1; c = link(a.next_sibling[base + c])) {
    if (a.draft_tokens[base + c] == t) { return c; }
  }
  return -1;
}

/**
 * @brief The outputs of request b whose walk ended at depth `depth` (`depth` accepted
 *        drafts, then the target's token t), or emptied when `flags` is not 0; what
 *        `request_block::write_outputs` writes after the same walk. The accepted path's
 *        entries before `depth` were written by the earlier depths. Every lane of one warp
 *        takes part.
 */
__device__ __forceinline__ void finish_request(verify_params const& a, int b, int depth, std::int32_t t,
                                               std::uint32_t flags)
{
  int const lane       = threadIdx.x & 31;
  bool const ok        = flags == 0;
  int const width      = a.max_drafts + 1;
  int const from       = ok ? depth : 0;
  std::int64_t const r = b;
  for (int j = from + lane; j < width; j += 32) { a.emitted[r * width + j] = ok && j == depth ? t : -1; }
  if (a.accepted_nodes) {
    for (int j = from + lane; j < a.max_drafts; j += 32) { a.accepted_nodes[r * a.max_drafts + j] = -1; }
  }
  if (lane == 0) {
    a.accepted[b]   = ok ? depth : 0;
    a.next_token[b] = ok ? t : -1;
    if (a.request_status) { a.request_status[b] = flags; }
    if (flags) { atomicOr(a.status, flags); }
    if (ok && a.bytes_read) {  // one full row per visited node, as block_argmax counts
      atomicAdd(reinterpret_cast<unsigned long long*>(a.bytes_read),
                static_cast<unsigned long long>(depth + 1) * 4ull * static_cast<unsigned long long>(a.vocab));
    }
  }
}

/**
 * @brief Prologue, one CTA per request: the request's checks (`request_block::check_greedy`;
 *        padding requests get empty outputs), its depth-0 row {b, root} or {-1, -1} for a
 *        request already finished, that row's key and counter cleared; CTA 0 clears the
 *        row counts of depths 1 … max_drafts.
 */
template <int Vec>
DHISPARSE_KERNEL void __launch_bounds__(block_threads) wide_prologue_kernel(verify_params a, layout l,
                                                                           wide_workspace w)
{
  __shared__ shared_state sh;
  launch_dependents();  // depth 0 may be scheduled now; it waits for this grid
  int const batch = batch_of(a, blockIdx.x == 0 && threadIdx.x == 0);
  int const b     = int(blockIdx.x);
  if (b == 0) {
    for (int depth = int(threadIdx.x) + 1; depth <= a.max_drafts; depth += block_threads) { w.counts[depth] = 0; }
  }
  pass_share const none{};
  request_block<Vec, 1> r(a, l, sh, b, 0, pass_tuning{}, none);
  bool valid = false;
  if (b >= batch) {
    r.write_padding();
  } else {
    valid = r.check_greedy();
  }
  if (threadIdx.x == 0) {
    w.entries[b]  = valid ? int2{b, 0} : int2{-1, -1};
    w.keys[b]     = 0;
    w.progress[b] = 0;
  }
}

/**
 * @brief Depth `depth`: every row of the depth (depth 0: the batch, from the prologue;
 *        later: `counts[depth]` rows appended by the launch before) cut into chunks
 *        (`wide_split`), the items spread over the grid. The CTA that completes a row
 *        appends the accepted child to depth + 1 (clearing that row's key and counter) or
 *        writes the request's outputs.
 *
 * One barrier per item: the warps' results go to a table of two halves, used by
 * alternate items; after the barrier warp 0 alone merges the item into its row, decides
 * and writes, while the other warps load their next item (they next meet warp 0 at the
 * next item's barrier, so neither half is rewritten while it is read).
 */
template <int Vec, int Unroll>
DHISPARSE_KERNEL void __launch_bounds__(block_threads, wide_ctas_per_sm)
  wide_argmax_kernel(verify_params a, layout l, wide_workspace w, int depth, int max_chunk)
{
  __shared__ float red_f[2][block_warps];
  __shared__ std::int32_t red_i[2][block_warps];
  wait_for_prerequisites();  // launched early: the launch before has completed from here on
  launch_dependents();       // the next depth may be scheduled; it waits for this grid
  int const rows = depth == 0 ? batch_of(a, false) : w.counts[depth];
  if (rows <= 0) { return; }
  wide_split const s       = wide_split::of(a.vocab, rows, int(gridDim.x), max_chunk);
  std::int64_t const items = std::int64_t(rows) * s.chunks;
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int half       = 0;
  for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    int const row   = int(item / s.chunks);
    int const chunk = int(item - std::int64_t(row) * s.chunks);
    int const slot  = w.slot(depth, row);
    int2 const e    = w.entries[slot];
    if (e.x < 0) { continue; }  // uniform: a request the prologue finished
    int const b           = e.x;
    std::int64_t const c0 = std::int64_t(chunk) * s.length;
    std::int64_t const c1 = min(c0 + s.length, std::int64_t(a.vocab));
    node_links links{};
    if (threadIdx.x == 0) { links = load_links(a, b, e.y); }  // in flight with the row's loads
    float best       = 0.f;
    std::int32_t arg = 0;
    bool const nan   = chunk_argmax<Vec, Unroll>(a.p + b * l.p_request + e.y * l.p_row, c0, c1, best, arg);
    warp_argmax(best, arg);
    if (lane == 0) {
      red_f[half][warp] = best;
      red_i[half][warp] = arg;
    }
    bool const any_nan = __syncthreads_or(nan) != 0;
    if (warp == 0) {
      int last                = 0;
      std::int32_t token      = -1;
      int child               = -1;
      std::uint32_t row_flags = 0;
      if (lane == 0) {
        for (int o = 1; o < block_warps; ++o) {
          if (red_f[half][o] > best || (red_f[half][o] == best && red_i[half][o] < arg)) {
            best = red_f[half][o];
            arg  = red_i[half][o];
          }
        }
        unsigned long long const key = argmax_key(best, arg);
        if (key != 0) { atomicMax(&w.keys[slot], key); }
        __threadfence();  // the key is merged before the row's counter says so
        unsigned long long const add  = 1ull + (any_nan ? 1ull << 32 : 0ull);
        unsigned long long const done = atomicAdd(&w.progress[slot], add) + add;
        last                          = int(done & 0xFFFFFFFFull) == s.chunks;
        if (last) {
          __threadfence();  // every other chunk's key before this read
          token     = argmax_index(atomicOr(&w.keys[slot], 0ull));
          row_flags = (done >> 32) != 0 ? verify_status::p_not_finite : 0u;
          child     = row_flags == 0 && token >= 0 ? child_with_token(a, b, e.y, token, links) : -1;
        }
      }
      if (__shfl_sync(0xFFFFFFFFu, last, 0)) {
        token     = __shfl_sync(0xFFFFFFFFu, token, 0);
        child     = __shfl_sync(0xFFFFFFFFu, child, 0);
        row_flags = __shfl_sync(0xFFFFFFFFu, row_flags, 0);
        if (child < 0) {
          finish_request(a, b, depth, token, row_flags);
        } else if (lane == 0) {
          a.emitted[std::int64_t(b) * (a.max_drafts + 1) + depth] = token;
          if (a.accepted_nodes) { a.accepted_nodes[std::int64_t(b) * a.max_drafts + depth] = child; }
          int const next        = atomicAdd(&w.counts[depth + 1], 1);  // child ≤ num_drafts: depth + 1 ≤ max_drafts
          int const next_slot   = w.slot(depth + 1, next);
          w.entries[next_slot]  = int2{b, child};
          w.keys[next_slot]     = 0;
          w.progress[next_slot] = 0;
        }
      }
    }
    half ^= 1;
  }
}

/// CTAs of a depth launch: `wide_ctas_per_sm` per SM of the current device.
inline int wide_ctas() { return multiprocessor_count() * wide_ctas_per_sm; }

/**
 * @brief Launches the wide greedy path (the call must be greedy from p with a workspace):
 *        the prologue, then one launch per depth 0 … max_drafts, each of `ctas` CTAs (0:
 *        `wide_ctas()`), with chunks of at most `max_chunk` elements (a multiple of
 *        `wide_unit`) and `Unroll` loads in flight per thread. `verify_async` uses the
 *        defaults; the others are for measurements (bench/verify).
 */
template <int Vec, int Unroll = wide_unroll>
cudaError_t launch_wide(verify_params const& a, cudaStream_t stream, int ctas = 0,
                        int max_chunk = wide_max_chunk)
{
  if (ctas <= 0) { ctas = wide_ctas(); }
  layout const l         = layout::of(a);
  wide_workspace const w = wide_workspace::of(a);
  wide_prologue_kernel<Vec><<<a.capacity, block_threads, 0, stream>>>(a, l, w);
  cudaError_t status = check_launch(stream);
  for (int depth = 0; depth <= a.max_drafts && status == cudaSuccess; ++depth) {
    status = launch_dependent(&wide_argmax_kernel<Vec, Unroll>, unsigned(ctas), block_threads, stream, a, l, w,
                              depth, max_chunk);
    if (status == cudaSuccess) { status = check_launch(stream); }
  }
  return status;
}

}  // namespace dhisparse::detail::verify
