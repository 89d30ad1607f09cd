/**
 * @file bench/serving/kernels.cu
 * @brief The serving benchmark's own kernels (see kernels.hpp for what each one does).
 */
#include "kernels.hpp"

#include <dhisparse/error.cuh>

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstdint>

namespace dhisparse::bench::serving {
namespace {

__global__ void fill_words_kernel(std::uint64_t* p, std::size_t words, std::uint64_t seed, std::uint64_t and_mask,
                                  std::uint64_t or_mask)
{
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    p[i] = (mix64(seed + i) & and_mask) | or_mask;
  }
}

/// One block per (b, q) entry of the padded batch.
__global__ void gather_selections_kernel(step_batch_ref batch, std::int32_t const* rows, std::int32_t const* start,
                                         int templates, int template_groups, int group, std::int64_t tokens,
                                         int top_k, std::int32_t* out, std::uint32_t* status)
{
  int const max_q = batch.max_queries;
  int const b     = blockIdx.x / max_q;
  int const q     = blockIdx.x % max_q;
  if (b >= *batch.size) { return; }  // padding: resolve does not read these rows
  std::int32_t* dst = out + std::int64_t(blockIdx.x) * top_k;
  std::int32_t const* src = nullptr;
  if (q < batch.queries[b]) {
    int const tmpl          = b % templates;
    std::int64_t const t    = std::int64_t(batch.lengths[batch.requests[b]]) + q - start[tmpl];
    if (t >= 0 && t < tokens) {
      src = rows + ((std::int64_t(tmpl) * template_groups + group % template_groups) * tokens + t) * top_k;
    } else if (threadIdx.x == 0) {
      atomicOr(status, bench_template_exhausted);
    }
  }
  if (src != nullptr && top_k % 4 == 0) {
    auto const* s4 = reinterpret_cast<int4 const*>(src);
    auto* d4       = reinterpret_cast<int4*>(dst);
    for (int i = threadIdx.x; i < top_k / 4; i += blockDim.x) { d4[i] = s4[i]; }
  } else {
    for (int i = threadIdx.x; i < top_k; i += blockDim.x) { dst[i] = src != nullptr ? src[i] : -1; }
  }
}

// ---------------------------------------------------------------------------------------
// Indexer stand-in, scores: int8 tensor cores (mma.sync m16n8k32) over key tiles that
// cp.async stages in shared memory.
//
// Work is cut into units: (request b, query group, 512 consecutive keys). Each block takes a
// contiguous range of units (the same share of keys for every block, whatever the lengths:
// a prefix over the batch, computed by every block, places them), so the grid is one block
// per multiprocessor. Within a unit, warp w owns keys [64 w, 64 w + 64): four m-tiles of 16
// keys whose A fragments stay in registers while the warp walks every (query, 8-head) n-tile
// of the group; each B fragment feeds 16 mma. Each warp streams its own keys through a ring
// of `Stages` shared-memory stages (cp.async, 16 B per copy, coalesced, zero-filled past the
// request's last key so no key beyond it is read); the block synchronizes only to restage
// the queries when its unit moves to another request or query group.
//
// The k order of the dot products is permuted so that each thread's A and B fragments are
// 32 contiguous bytes of its row (two 16-B shared loads): thread (gid, tig) holds bytes
// [32 tig, 32 tig + 32) of its key rows gid, gid + 8 and of query head gid; word 2s is its
// k-step-s low half, word 2s + 1 the high half. A and B use the same permutation, so every
// dot product is the same integer sum. Rows are 128 B, their 16-B chunks XOR-swizzled by
// the row's parity (conflict-free 16-B loads for the quarter-warp pairs of rows).
//
// The accumulators start at the bits of 12582912.0f (1.5 * 2^23): the int32 sum 0x4B400000
// + dot, with |dot| ≤ 2^21, is the float 12582912 + dot exactly, so relu and the conversion
// are two float operations (max, subtract) instead of a slow int-to-float conversion.
// ---------------------------------------------------------------------------------------
constexpr int scores_warps       = 8;
constexpr int scores_threads     = scores_warps * 32;
constexpr int warp_keys          = 64;                       // 4 m-tiles of 16 keys
constexpr int unit_keys          = scores_warps * warp_keys;  // keys of one unit
constexpr int key_stage_bytes    = warp_keys * index_dim;     // one warp's stage: 8 KB
constexpr int max_staged_heads   = 512;                       // query heads staged at once (64 KB)
constexpr std::int32_t magic_bits = 0x4B400000;               // 12582912.0f
constexpr float magic_float       = 12582912.0f;

__device__ __forceinline__ void cp_async_16(void* smem, void const* gmem, int src_bytes)
{
  auto const s = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait()
{
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/// Byte offset of 16-B chunk `chunk` of 128-B row `row` in a swizzled tile.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * index_dim + ((chunk ^ (row & 1)) << 4); }

/// Shared-memory layout of the scores kernel (dynamic), for `group` staged queries.
struct scores_layout {
  int group;              ///< queries staged at once
  int stages;             ///< key stages per warp
  std::size_t queries;    ///< offset: int8 [group * heads][128], swizzled
  std::size_t prefix;     ///< offset: int32 [max_batch + 1] units before entry b
  std::size_t ntok;       ///< offset: int32 [max_batch] keys of entry b
  std::size_t bytes;      ///< total
};

scores_layout make_scores_layout(int heads, int max_queries, int max_batch, int stages)
{
  scores_layout l{};
  l.group   = std::max(1, std::min(max_queries, max_staged_heads / heads));
  l.stages  = stages;
  l.queries = std::size_t(stages) * scores_warps * key_stage_bytes;
  l.prefix  = l.queries + std::size_t(l.group) * heads * index_dim;
  l.ntok    = l.prefix + (std::size_t(max_batch) + 1) * sizeof(std::int32_t);
  l.bytes   = l.ntok + std::size_t(max_batch) * sizeof(std::int32_t);
  return l;
}

/// Where unit u lies: entry b (prefix[b] ≤ u < prefix[b + 1]) by binary search.
__device__ __forceinline__ int entry_of(std::int32_t const* prefix, int size, std::int32_t u)
{
  int lo = 0, hi = size - 1;
  while (lo < hi) {
    int const mid = (lo + hi + 1) / 2;
    if (prefix[mid] <= u) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__device__ __forceinline__ void mma_s8_16816(int (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                             std::uint32_t a3, std::uint32_t b0, std::uint32_t b1)
{
  asm volatile(
    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
    : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// relu of the dot product held (offset by magic_float) in an accumulator.
__device__ __forceinline__ float relu_of(int c) { return fmaxf(__int_as_float(c), magic_float) - magic_float; }

template <int Heads, int Stages>
__global__ void __launch_bounds__(scores_threads, 1)
  indexer_scores_kernel(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                        std::int8_t const* queries, float const* weights, int index_stride, float* scores,
                        std::int64_t score_stride, scores_layout layout)
{
  extern __shared__ __align__(128) unsigned char smem[];
  auto* prefix   = reinterpret_cast<std::int32_t*>(smem + layout.prefix);
  auto* ntok_of  = reinterpret_cast<std::int32_t*>(smem + layout.ntok);
  auto* staged_q = smem + layout.queries;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const gid = lane >> 2, tig = lane & 3;
  int const size  = *batch.size;
  int const max_q = batch.max_queries;
  int const group = layout.group;

  // Units of every entry: ceil(Q_b / group) query groups x ceil(keys / unit_keys) chunks.
  if (warp == 0) {
    std::int32_t running = 0;
    for (int base = 0; base < size; base += 32) {
      int const b       = base + lane;
      std::int32_t units = 0;
      if (b < size) {
        int const nq          = batch.queries[b];
        std::int32_t const nt = (batch.lengths[batch.requests[b]] + nq + index_stride - 1) / index_stride;
        ntok_of[b]            = nt;
        units                 = ((nq + group - 1) / group) * ((nt + unit_keys - 1) / unit_keys);
      }
      std::int32_t v = units;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        std::int32_t const t = __shfl_up_sync(0xFFFFFFFFu, v, o);
        if (lane >= o) { v += t; }
      }
      if (b < size) { prefix[b + 1] = running + v; }
      running += __shfl_sync(0xFFFFFFFFu, v, 31);
    }
    if (lane == 0) { prefix[0] = 0; }
  }
  // Weights of this thread's two heads in every n-tile.
  float2 w[Heads / 8];
#pragma unroll
  for (int nt = 0; nt < Heads / 8; ++nt) {
    w[nt] = make_float2(__ldg(weights + nt * 8 + tig * 2), __ldg(weights + nt * 8 + tig * 2 + 1));
  }
  __syncthreads();
  if (size <= 0) { return; }
  std::int32_t const total = prefix[size];
  std::int32_t const begin = std::int32_t(std::int64_t(total) * blockIdx.x / gridDim.x);
  std::int32_t const end   = std::int32_t(std::int64_t(total) * (blockIdx.x + 1) / gridDim.x);

  unsigned char* const my_stages = smem + std::size_t(warp) * Stages * key_stage_bytes;

  // Issues the copies of this warp's keys of unit u into stage `slot` (an empty group past the range).
  auto issue = [&](std::int32_t u, int slot) {
    if (u < end) {
      int const b             = entry_of(prefix, size, u);
      std::int32_t const nt   = ntok_of[b];
      std::int32_t const chunks = (nt + unit_keys - 1) / unit_keys;
      std::int32_t const t0   = ((u - prefix[b]) % chunks) * unit_keys + warp * warp_keys;
      std::int8_t const* src  = keys + key_base[b] * index_dim;
      unsigned char* dst      = my_stages + slot * key_stage_bytes;
#pragma unroll
      for (int i = 0; i < key_stage_bytes / 16 / 32; ++i) {
        int const idx   = i * 32 + lane;
        int const row   = idx / 8, chunk = idx % 8;
        bool const real = t0 + row < nt;
        cp_async_16(dst + swizzled(row, chunk), real ? src + (std::int64_t(t0 + row) * index_dim + chunk * 16) : src,
                    real ? 16 : 0);
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) { issue(begin + s, s); }

  int staged_b = -1, staged_g = -1;
  int slot     = 0;
  int const sw = gid & 1;  // the parity of every row this thread reads
  for (std::int32_t u = begin; u < end; ++u) {
    issue(u + Stages - 1, slot == 0 ? Stages - 1 : slot - 1);
    int const b               = entry_of(prefix, size, u);
    std::int32_t const nt     = ntok_of[b];
    std::int32_t const chunks = (nt + unit_keys - 1) / unit_keys;
    int const g               = (u - prefix[b]) / chunks;
    std::int32_t const t0     = ((u - prefix[b]) % chunks) * unit_keys + warp * warp_keys;
    int const nq              = min(group, batch.queries[b] - g * group);
    if (b != staged_b || g != staged_g) {  // the same for the whole block
      __syncthreads();  // every warp is done with the previous queries
      auto const* src = reinterpret_cast<int4 const*>(queries + ((std::int64_t(b) * max_q + g * group) * Heads) * index_dim);
#pragma unroll 8
      for (int i = threadIdx.x; i < nq * Heads * (index_dim / 16); i += scores_threads) {
        int const row = i / (index_dim / 16), chunk = i % (index_dim / 16);
        *reinterpret_cast<int4*>(staged_q + swizzled(row, chunk)) = __ldg(src + i);
      }
      __syncthreads();
      staged_b = b, staged_g = g;
    }
    cp_async_wait<Stages - 1>();
    __syncwarp();
    if (t0 < nt) {
      unsigned char const* tile = my_stages + slot * key_stage_bytes;
      std::uint32_t a[4][2][8];  // [m-tile][row gid / gid + 8][word]
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned char const* row = tile + (mt * 16 + h * 8 + gid) * index_dim;
          uint4 const x0 = *reinterpret_cast<uint4 const*>(row + (((tig * 2) ^ sw) << 4));
          uint4 const x1 = *reinterpret_cast<uint4 const*>(row + (((tig * 2 + 1) ^ sw) << 4));
          a[mt][h][0] = x0.x, a[mt][h][1] = x0.y, a[mt][h][2] = x0.z, a[mt][h][3] = x0.w;
          a[mt][h][4] = x1.x, a[mt][h][5] = x1.y, a[mt][h][6] = x1.z, a[mt][h][7] = x1.w;
        }
      }
      for (int q = 0; q < nq; ++q) {
        float acc[4][2] = {};
#pragma unroll
        for (int n = 0; n < Heads / 8; ++n) {
          unsigned char const* head = staged_q + (q * Heads + n * 8 + gid) * index_dim;
          uint4 const y0 = *reinterpret_cast<uint4 const*>(head + (((tig * 2) ^ sw) << 4));
          uint4 const y1 = *reinterpret_cast<uint4 const*>(head + (((tig * 2 + 1) ^ sw) << 4));
          std::uint32_t const bw[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
          int c[4][4];
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) { c[mt][0] = c[mt][1] = c[mt][2] = c[mt][3] = magic_bits; }
#pragma unroll
          for (int s = 0; s < 4; ++s) {
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
              mma_s8_16816(c[mt], a[mt][0][2 * s], a[mt][1][2 * s], a[mt][0][2 * s + 1], a[mt][1][2 * s + 1],
                           bw[2 * s], bw[2 * s + 1]);
            }
          }
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            acc[mt][0] = fmaf(w[n].y, relu_of(c[mt][1]), fmaf(w[n].x, relu_of(c[mt][0]), acc[mt][0]));
            acc[mt][1] = fmaf(w[n].y, relu_of(c[mt][3]), fmaf(w[n].x, relu_of(c[mt][2]), acc[mt][1]));
          }
        }
        // Sum over the quad (tig) as a reduce-scatter: lane tig ends with the two rows of m-tile
        // (tig >> 1) + 2 (tig & 1), keys gid and gid + 8.
        bool const t0_bit = (tig & 1) != 0, t1_bit = (tig & 2) != 0;
        float r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float const keep = t0_bit ? acc[2 + j / 2][j % 2] : acc[j / 2][j % 2];
          float const send = t0_bit ? acc[j / 2][j % 2] : acc[2 + j / 2][j % 2];
          r[j]             = keep + __shfl_xor_sync(0xFFFFFFFFu, send, 1);
        }
        float sum[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float const keep = t1_bit ? r[2 + j] : r[j];
          float const send = t1_bit ? r[j] : r[2 + j];
          sum[j]           = keep + __shfl_xor_sync(0xFFFFFFFFu, send, 2);
        }
        int const mt          = (tig >> 1) + 2 * (tig & 1);
        std::int32_t const t  = t0 + mt * 16 + gid;
        float* out            = scores + (std::int64_t(b) * max_q + g * group + q) * score_stride;
        if (t < nt) { out[t] = sum[0]; }
        if (t + 8 < nt) { out[t + 8] = sum[1]; }
      }
    }
    __syncwarp();  // the stage is read: the next issue may overwrite it
    slot = slot + 1 == Stages ? 0 : slot + 1;
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------
// Indexer stand-in, top-K: an exact radix select of the K best scores of every query by a
// cluster of blocks (distributed shared memory, no scratch in device memory). Each block
// caches its slice of the row as order-preserving keys in shared memory, then three rounds
// (11, 11, 10 bits) histogram the keys that match the prefix found so far; every block sums
// the cluster's histograms and picks the same digit. The output holds every key above the
// K-th best and as many equal to it as K needs (-1 past the row's keys when it has fewer).
// ---------------------------------------------------------------------------------------
constexpr int topk_threads      = 512;
constexpr int topk_bins         = 2048;
constexpr int topk_cache_floats       = 20 * 1024;  // 80 KB per block: two blocks per multiprocessor
constexpr int topk_cache_floats_alone = 48 * 1024;  // 192 KB: when the grid has a block per multiprocessor at most
constexpr int topk_max_cluster  = 8;
constexpr int topk_unroll       = 8;  // loads in flight per thread when a scan reads device memory

/**
 * Calls visit(at, valid, key) for every index at < len of the slice, warp by warp: each
 * warp takes chunks of 32 * topk_unroll consecutive indices and fetches all of a chunk's
 * keys (fetch(at)) before visiting them, so that loads from device memory overlap. Every
 * lane of a warp makes the same calls (valid says whether `at` is in the slice), so visit
 * may use warp-wide intrinsics.
 */
template <class Fetch, class Visit>
__device__ __forceinline__ void scan_slice(int len, Fetch fetch, Visit visit)
{
  int const lane = threadIdx.x % 32;
  for (int base = int(threadIdx.x / 32) * 32 * topk_unroll; base < len; base += topk_threads * topk_unroll) {
    std::uint32_t keys[topk_unroll];
#pragma unroll
    for (int j = 0; j < topk_unroll; ++j) {
      int const at = base + j * 32 + lane;
      keys[j]      = at < len ? fetch(at) : 0u;
    }
#pragma unroll
    for (int j = 0; j < topk_unroll; ++j) {
      int const at = base + j * 32 + lane;
      visit(at, at < len, keys[j]);
    }
  }
}

/// Float → unsigned with the same order.
__device__ __forceinline__ std::uint32_t order_key(float f)
{
  std::uint32_t const u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(topk_threads)
  indexer_topk_kernel(step_batch_ref batch, float const* scores, std::int64_t score_stride, int index_stride,
                      int top_k, std::int32_t* out, int cache_floats)
{
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ std::uint32_t cache[];
  __shared__ __align__(16) std::uint32_t hist[2][topk_bins];
  __shared__ std::uint32_t found_digit, found_above, counts[2], taken[2];
  __shared__ typename cub::BlockScan<std::uint32_t, topk_threads>::TempStorage scan_storage;
  int const rank    = int(cluster.block_rank());
  int const ranks   = int(cluster.num_blocks());
  int const row     = int(blockIdx.x) / ranks;
  int const max_q   = batch.max_queries;
  int const b       = row / max_q;
  int const q       = row % max_q;
  if (b >= *batch.size || q >= batch.queries[b]) { return; }  // the whole cluster
  std::int32_t const n = (batch.lengths[batch.requests[b]] + q + index_stride) / index_stride;  // keys up to its position
  float const* s       = scores + std::int64_t(row) * score_stride;
  std::int32_t* dst    = out + std::int64_t(row) * top_k;
  if (n <= top_k) {
    for (int i = rank * topk_threads + int(threadIdx.x); i < top_k; i += ranks * topk_threads) { dst[i] = i < n ? i : -1; }
    return;
  }
  std::int32_t const lo  = std::int32_t(std::int64_t(n) * rank / ranks);
  std::int32_t const len = std::int32_t(std::int64_t(n) * (rank + 1) / ranks) - lo;
  int const cached       = min(len, cache_floats);
  auto const from_memory = [&](int i) { return order_key(__ldg(s + lo + i)); };
  auto const key_at      = [&](int i) { return i < cached ? cache[i] : from_memory(i); };
  int const lane         = threadIdx.x % 32;
  std::uint32_t prefix = 0, mask = 0, k = std::uint32_t(top_k);
  int shift = 21;
  std::uint32_t digits = 2048u;
  std::uint32_t* h     = hist[0];
  // Adds the keys that match the prefix to histogram h, one atomic per distinct digit of a warp.
  auto const count_digit = [&](bool valid, std::uint32_t key) {
    bool const take = valid && (key & mask) == prefix;
    if (!__any_sync(0xFFFFFFFFu, take)) { return; }
    std::uint32_t const d     = take ? (key >> shift) & (digits - 1) : 0xFFFFFFFFu;
    std::uint32_t const peers = __match_any_sync(0xFFFFFFFFu, d);
    if (take && lane == __ffs(peers) - 1) { atomicAdd(&h[d], std::uint32_t(__popc(peers))); }
  };
  for (int i = threadIdx.x; i < topk_bins; i += topk_threads) { hist[0][i] = 0; }
  __syncthreads();
  // The first round's histogram comes with the cache fill.
  scan_slice(cached, from_memory, [&](int at, bool valid, std::uint32_t key) {
    if (valid) { cache[at] = key; }
    count_digit(valid, key);
  });
  scan_slice(len - cached, [&](int i) { return from_memory(cached + i); },
             [&](int, bool valid, std::uint32_t key) { count_digit(valid, key); });

#pragma unroll 1
  for (int round = 0; round < 3; ++round) {
    shift  = round == 0 ? 21 : round == 1 ? 10 : 0;
    digits = round == 2 ? 1024u : 2048u;
    h      = hist[round & 1];
    if (round > 0) {
      for (int i = threadIdx.x; i < topk_bins; i += topk_threads) { h[i] = 0; }
      __syncthreads();  // also orders the cache fill before the second round's scan
      scan_slice(len, key_at, [&](int, bool valid, std::uint32_t key) { count_digit(valid, key); });
    }
    cluster.sync();  // every block's histogram is complete
    // Bins from the top: thread t owns bins digits - 1 - 4t (mine[0]) .. digits - 4 - 4t (mine[3]),
    // one 16-B word of every block's histogram.
    std::uint32_t mine[4] = {0, 0, 0, 0};
    int const word = int(digits / 4) - 1 - int(threadIdx.x);
#pragma unroll
    for (int r = 0; r < topk_max_cluster; ++r) {
      if (r < ranks && word >= 0) {
        uint4 const v = reinterpret_cast<uint4 const*>(cluster.map_shared_rank(h, r))[word];
        mine[0] += v.w, mine[1] += v.z, mine[2] += v.y, mine[3] += v.x;
      }
    }
    std::uint32_t const own = mine[0] + mine[1] + mine[2] + mine[3];
    std::uint32_t above = 0;
    cub::BlockScan<std::uint32_t, topk_threads>(scan_storage).ExclusiveSum(own, above);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (above < k && above + mine[j] >= k) {
        found_digit = std::uint32_t(int(digits) - 1 - 4 * int(threadIdx.x) - j);
        found_above = above;
      }
      above += mine[j];
    }
    __syncthreads();
    prefix |= found_digit << shift;
    mask |= (digits - 1) << shift;
    k -= found_above;
    __syncthreads();  // found_* are read before the next round writes them
  }
  // prefix is the K-th best key: take every key above it and k of those equal to it.
  if (threadIdx.x < 2) { counts[threadIdx.x] = 0, taken[threadIdx.x] = 0; }
  __syncthreads();
  std::uint32_t above_here = 0, equal_here = 0;
  scan_slice(len, key_at, [&](int, bool valid, std::uint32_t key) {
    above_here += valid && key > prefix;
    equal_here += valid && key == prefix;
  });
  atomicAdd(&counts[0], above_here);
  atomicAdd(&counts[1], equal_here);
  cluster.sync();  // counts complete in every block
  std::uint32_t above_before = 0, equal_before = 0;
  for (int r = 0; r < rank; ++r) {
    above_before += cluster.map_shared_rank(counts, r)[0];
    equal_before += cluster.map_shared_rank(counts, r)[1];
  }
  std::uint32_t const above_total = std::uint32_t(top_k) - k;
  scan_slice(len, key_at, [&](int at, bool valid, std::uint32_t key) {
    bool const above          = valid && key > prefix;
    bool const equal          = valid && key == prefix;
    unsigned const above_mask = __ballot_sync(0xFFFFFFFFu, above);
    unsigned const equal_mask = __ballot_sync(0xFFFFFFFFu, equal);
    std::uint32_t above_base = 0, equal_base = 0;
    if (lane == 0 && above_mask != 0) { above_base = atomicAdd(&taken[0], std::uint32_t(__popc(above_mask))); }
    if (lane == 0 && equal_mask != 0) { equal_base = atomicAdd(&taken[1], std::uint32_t(__popc(equal_mask))); }
    above_base              = __shfl_sync(0xFFFFFFFFu, above_base, 0);
    equal_base              = __shfl_sync(0xFFFFFFFFu, equal_base, 0);
    unsigned const lower    = (1u << lane) - 1u;
    if (above) { dst[above_before + above_base + __popc(above_mask & lower)] = lo + at; }
    if (equal) {
      std::uint32_t const e = equal_before + equal_base + __popc(equal_mask & lower);
      if (e < k) { dst[above_total + e] = lo + at; }
    }
  });
  cluster.sync();  // no block leaves while another may still read its counts
}

// ---------------------------------------------------------------------------------------
// The previous indexer stand-in (baseline for bench_indexer --old): one warp per 16 keys,
// A fragments loaded from global memory, one block per (b, q) for the top-K pass.
// ---------------------------------------------------------------------------------------
constexpr int baseline_threads         = 128;
constexpr int baseline_tokens_per_block = 2048;
constexpr int baseline_query_pitch              = index_dim + 16;  // bytes per staged head: no bank conflicts

template <int Heads>
__global__ void __launch_bounds__(baseline_threads)
  indexer_scores_baseline_kernel(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                        std::int8_t const* queries, float const* weights, int index_stride, float* scores,
                        std::int64_t score_stride)
{
  extern __shared__ int4 staged[];
  int const b = blockIdx.y;
  if (b >= *batch.size) { return; }
  int const num_q           = batch.queries[b];
  int const max_q           = batch.max_queries;
  std::int32_t const ntok   = (batch.lengths[batch.requests[b]] + num_q + index_stride - 1) / index_stride;  // keys
  std::int32_t const first  = std::int32_t(blockIdx.x) * baseline_tokens_per_block;
  if (first >= ntok) { return; }

  // The queries of request b, one head per row of baseline_query_pitch bytes.
  auto const* src = reinterpret_cast<int4 const*>(queries + std::int64_t(b) * max_q * Heads * index_dim);
  int const rows  = num_q * Heads;
  for (int i = threadIdx.x; i < rows * (index_dim / 16); i += blockDim.x) {
    int const row = i / (index_dim / 16), chunk = i % (index_dim / 16);
    staged[row * (baseline_query_pitch / 16) + chunk] = src[i];
  }
  __syncthreads();
  auto const* sq = reinterpret_cast<std::int8_t const*>(staged);

  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const gid = lane >> 2, tig = lane & 3;
  std::int8_t const* request_keys = keys + key_base[b] * index_dim;
  for (int tile = warp; tile < baseline_tokens_per_block / 16; tile += baseline_threads / 32) {
    std::int32_t const t0 = first + tile * 16;
    if (t0 >= ntok) { break; }
    std::uint32_t a[4][4];
    std::int8_t const* r0 = request_keys + std::int64_t(t0 + gid) * index_dim;
    std::int8_t const* r1 = r0 + 8 * index_dim;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[k][0] = __ldg(reinterpret_cast<std::uint32_t const*>(r0 + k * 32 + tig * 4));
      a[k][1] = __ldg(reinterpret_cast<std::uint32_t const*>(r1 + k * 32 + tig * 4));
      a[k][2] = __ldg(reinterpret_cast<std::uint32_t const*>(r0 + k * 32 + 16 + tig * 4));
      a[k][3] = __ldg(reinterpret_cast<std::uint32_t const*>(r1 + k * 32 + 16 + tig * 4));
    }
    for (int q = 0; q < num_q; ++q) {
      float lo = 0.f, hi = 0.f;
#pragma unroll 2
      for (int n = 0; n < Heads / 8; ++n) {
        int c[4]               = {0, 0, 0, 0};
        std::int8_t const* qb = sq + (q * Heads + n * 8 + gid) * baseline_query_pitch;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          std::uint32_t const b0 = *reinterpret_cast<std::uint32_t const*>(qb + k * 32 + tig * 4);
          std::uint32_t const b1 = *reinterpret_cast<std::uint32_t const*>(qb + k * 32 + 16 + tig * 4);
          mma_s8_16816(c, a[k][0], a[k][1], a[k][2], a[k][3], b0, b1);
        }
        float const w0 = __ldg(weights + n * 8 + tig * 2);
        float const w1 = __ldg(weights + n * 8 + tig * 2 + 1);
        lo += w0 * fmaxf(float(c[0]), 0.f) + w1 * fmaxf(float(c[1]), 0.f);
        hi += w0 * fmaxf(float(c[2]), 0.f) + w1 * fmaxf(float(c[3]), 0.f);
      }
      lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
      lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
      hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 1);
      hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 2);
      if (tig == 0) {
        float* out = scores + (std::int64_t(b) * max_q + q) * score_stride;
        if (t0 + gid < ntok) { out[t0 + gid] = lo; }
        if (t0 + gid + 8 < ntok) { out[t0 + gid + 8] = hi; }
      }
    }
  }
}

constexpr int baseline_topk_threads = 512;
constexpr int baseline_topk_bins    = 2048;

/// One block per (b, q): histogram of the top 11 bits of the (non-negative) scores, the
/// threshold bin of the K-th best, then compaction of everything above it.
__global__ void __launch_bounds__(baseline_topk_threads)
  indexer_topk_baseline_kernel(step_batch_ref batch, float const* scores, std::int64_t score_stride, int index_stride,
                      int top_k, std::int32_t* out)
{
  __shared__ int hist[baseline_topk_bins];
  __shared__ int threshold;
  __shared__ int taken;
  int const max_q = batch.max_queries;
  int const b     = blockIdx.x / max_q;
  int const q     = blockIdx.x % max_q;
  if (b >= *batch.size || q >= batch.queries[b]) { return; }
  std::int32_t const n = (batch.lengths[batch.requests[b]] + q + index_stride) / index_stride;  // keys up to its position
  float const* s       = scores + std::int64_t(blockIdx.x) * score_stride;
  for (int i = threadIdx.x; i < baseline_topk_bins; i += blockDim.x) { hist[i] = 0; }
  if (threadIdx.x == 0) { taken = 0; }
  __syncthreads();
  for (std::int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    atomicAdd(&hist[(__float_as_uint(s[i]) >> 20) & (baseline_topk_bins - 1)], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int cum = 0, bin = baseline_topk_bins - 1;
    for (; bin > 0; --bin) {
      cum += hist[bin];
      if (cum >= top_k) { break; }
    }
    threshold = bin;
  }
  __syncthreads();
  std::int32_t* dst = out + std::int64_t(blockIdx.x) * top_k;
  for (std::int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    int const bin = int((__float_as_uint(s[i]) >> 20) & (baseline_topk_bins - 1));
    if (bin >= threshold) {
      int const at = atomicAdd(&taken, 1);
      if (at < top_k) { dst[at] = i; }
    }
  }
}

/// One warp per (b, q) tail row.
__global__ void write_tail_rows_kernel(step_batch_ref batch, std::int32_t const* tail_slots, std::byte* rows,
                                       std::size_t stride, int group, int layer, std::uint64_t salt)
{
  int const max_q   = batch.max_queries;
  int const warp    = int((blockIdx.x * std::size_t(blockDim.x) + threadIdx.x) / 32);
  int const lane    = threadIdx.x % 32;
  if (warp >= batch.max_batch * max_q) { return; }
  int const b = warp / max_q, q = warp % max_q;
  if (b >= *batch.size || q >= batch.queries[b]) { return; }
  std::int32_t const slot = tail_slots[warp];
  if (slot < 0) { return; }
  std::int32_t const position = batch.lengths[batch.requests[b]] + q;
  auto* dst = reinterpret_cast<std::uint64_t*>(rows + std::size_t(slot) * stride);
  for (int w = lane; w < row_words; w += 32) { dst[w] = row_word(b, group, layer, position, w, salt); }
}

__global__ void kept_from_accepted_kernel(step_batch_ref batch, std::int32_t const* accepted, std::int32_t* kept)
{
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < batch.max_batch; b += gridDim.x * blockDim.x) {
    kept[b] = b < *batch.size ? min(max(accepted[b], 0) + 1, batch.queries[b]) : 0;
  }
}

__global__ void count_tokens_kernel(step_batch_ref batch, std::int32_t const* kept, unsigned long long* total,
                                    std::int32_t* step_tokens, std::int32_t* step_index, int capacity)
{
  __shared__ int sum;
  if (threadIdx.x == 0) { sum = 0; }
  __syncthreads();
  int local = 0;
  for (int b = threadIdx.x; b < *batch.size; b += blockDim.x) { local += kept != nullptr ? kept[b] : batch.queries[b]; }
  atomicAdd(&sum, local);
  __syncthreads();
  if (threadIdx.x == 0) {
    step_tokens[*step_index % capacity] = sum;
    *step_index += 1;
    *total += static_cast<unsigned long long>(sum);
  }
}

__global__ void or_status_kernel(std::uint32_t const* src, std::uint32_t* dst, std::uint32_t bit)
{
  if (*src != 0) { atomicOr(dst, bit); }
}

__global__ void hash_kernel(std::uint64_t const* data, std::size_t words, unsigned long long* out,
                            std::int32_t const* step_index, int capacity)
{
  unsigned long long h = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    h += mix64(data[i] ^ mix64(i));
  }
  for (int o = 16; o > 0; o /= 2) { h += __shfl_xor_sync(0xFFFFFFFFu, h, o); }
  if (threadIdx.x % 32 == 0) { atomicAdd(out + (*step_index % capacity), h); }
}

__global__ void draft_tokens_kernel(std::int32_t* tokens, int requests, int drafts, int vocab)
{
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < requests * drafts; i += gridDim.x * blockDim.x) {
    tokens[i] = int((mix64(std::uint64_t(i) * 7919u + 17u)) % std::uint64_t(vocab));
  }
}

__global__ void build_p_kernel(float* p, int requests, int drafts, int vocab, float const* p_draft,
                               std::int32_t const* draft_tokens)
{
  std::int64_t const n = std::int64_t(requests) * (drafts + 1) * vocab;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int const v          = int(i % vocab);
    std::int64_t const r = i / vocab;
    int const row        = int(r % (drafts + 1));
    int const b          = int(r / (drafts + 1));
    float value          = 1.0f / float(vocab);
    if (row < drafts) {
      float const px = p_draft[row];
      value          = v == draft_tokens[b * drafts + row] ? px : (1.0f - px) / float(vocab - 1);
    }
    p[i] = value;
  }
}

__global__ void build_candidates_kernel(std::int32_t* ids, float* probs, int requests, int drafts, int candidates,
                                        int vocab, std::int32_t const* draft_tokens, float q_draft)
{
  int const n = requests * drafts * candidates;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int const j      = i % candidates;
    int const row    = i / candidates;  // b * drafts + position
    int const x      = draft_tokens[row];
    ids[i]   = int((std::int64_t(x) + std::int64_t(j) * 7919) % vocab);  // distinct for j < vocab / 7919
    probs[i] = j == 0 ? q_draft : (1.0f - q_draft) / float(candidates - 1);
  }
}

/// See launch_union_probe. Marks: bits 8..31 the epoch that wrote the word, bits 0..7 the
/// queries of that epoch that selected the position.
__global__ void union_probe_kernel(step_batch_ref batch, residency_map_ref map, int group,
                                   std::int32_t const* selections, int top_k, std::uint32_t* marks,
                                   std::int64_t mark_stride, std::uint32_t const* epoch, unsigned long long* counts)
{
  std::int64_t const per_entry = std::int64_t(batch.max_queries) * top_k;
  std::int64_t const n         = std::int64_t(batch.max_batch) * per_entry;
  std::uint32_t const now      = *epoch & 0xFFFFFFu;
  int const size               = *batch.size;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int const b = int(i / per_entry);
    int const q = int(i / top_k % batch.max_queries);
    if (b >= size || q >= batch.queries[b]) { continue; }
    std::int32_t const r        = batch.requests[b];
    std::int32_t const position = selections[i];
    if (position < 0 || position >= batch.lengths[r] || position >= mark_stride) { continue; }  // tails: not fetched
    std::int32_t const* entry = map.entry(r, group, position);
    if (entry != nullptr && *entry >= 0) { continue; }  // resident: a hit for every query
    std::uint32_t* word     = marks + std::int64_t(r) * mark_stride + position;
    std::uint32_t const bit = 1u << q;
    std::uint32_t old       = *word;
    for (;;) {
      std::uint32_t const next = (old >> 8) == now ? (old | bit) : ((now << 8) | bit);
      if (next == old) { break; }  // this query selected it before (a duplicate entry)
      std::uint32_t const seen = atomicCAS(word, old, next);
      if (seen == old) { break; }
      old = seen;
    }
    bool const first_of_step  = (old >> 8) != now;
    bool const first_of_query = first_of_step || (old & bit) == 0;
    if (first_of_step) { atomicAdd(counts + 0, 1ull); }
    if (first_of_query) { atomicAdd(counts + 1, 1ull); }
  }
}

__global__ void bump_epoch_kernel(std::uint32_t* epoch) { ++*epoch; }

unsigned grid_for(std::size_t work, unsigned threads)
{
  return unsigned(std::clamp<std::size_t>((work + threads - 1) / threads, 1, 65535 * 8));
}

}  // namespace

void launch_fill_words(std::uint64_t* p, std::size_t words, std::uint64_t seed, std::uint64_t and_mask,
                       std::uint64_t or_mask, cudaStream_t stream)
{
  if (words == 0) { return; }
  fill_words_kernel<<<grid_for(words, 256), 256, 0, stream>>>(p, words, seed, and_mask, or_mask);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_gather_selections(step_batch_ref batch, std::int32_t const* rows, std::int32_t const* start,
                              int templates, int template_groups, int group, std::int64_t tokens, int top_k,
                              std::int32_t* out, std::uint32_t* status, cudaStream_t stream)
{
  unsigned const blocks = unsigned(batch.max_batch * batch.max_queries);
  gather_selections_kernel<<<blocks, 128, 0, stream>>>(batch, rows, start, templates, template_groups, group, tokens,
                                                       top_k, out, status);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

namespace {
int device_attribute(cudaDeviceAttr attr)
{
  int dev = 0, value = 0;
  DHISPARSE_CUDA_TRY(cudaGetDevice(&dev));
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&value, attr, dev));
  return value;
}

template <class Kernel>
void allow_shared(Kernel kernel, int bytes)
{
  DHISPARSE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

std::size_t baseline_smem(int heads, int max_queries)
{
  return std::size_t(max_queries) * heads * baseline_query_pitch;
}
}  // namespace

void prepare_indexer(int heads, int max_queries)
{
  if (heads != 32 && heads != 64) { throw error("indexer stand-in: index heads must be 32 or 64"); }
  int const optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  allow_shared(indexer_scores_kernel<32, 2>, optin);
  allow_shared(indexer_scores_kernel<32, 3>, optin);
  allow_shared(indexer_scores_kernel<64, 2>, optin);
  allow_shared(indexer_scores_kernel<64, 3>, optin);
  allow_shared(indexer_topk_kernel, topk_cache_floats_alone * int(sizeof(float)));
  int const baseline = int(baseline_smem(heads, max_queries));
  if (baseline <= optin) {
    allow_shared(heads == 32 ? indexer_scores_baseline_kernel<32> : indexer_scores_baseline_kernel<64>, baseline);
  }
}

void launch_indexer_scores(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                           std::int8_t const* queries, float const* weights, int heads, int index_stride,
                           float* scores, std::int64_t score_stride, std::int32_t max_tokens, cudaStream_t stream)
{
  (void)max_tokens;  // the grid is one block per multiprocessor whatever the lengths
  DHISPARSE_EXPECTS(heads == 32 || heads == 64, "indexer stand-in: index heads must be 32 or 64");
  DHISPARSE_EXPECTS(index_stride >= 1, "indexer stand-in: index_stride must be at least 1");
  if (batch.max_batch <= 0 || batch.max_queries <= 0) { return; }
  auto const optin        = std::size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  scores_layout layout    = make_scores_layout(heads, batch.max_queries, batch.max_batch, 3);
  if (layout.bytes > optin) { layout = make_scores_layout(heads, batch.max_queries, batch.max_batch, 2); }
  DHISPARSE_EXPECTS(layout.bytes <= optin, "indexer stand-in: the batch's prefix does not fit in shared memory");
  unsigned const grid = unsigned(device_attribute(cudaDevAttrMultiProcessorCount));
  auto const args     = [&](auto kernel) {
    kernel<<<grid, scores_threads, layout.bytes, stream>>>(batch, keys, key_base, queries, weights, index_stride,
                                                           scores, score_stride, layout);
  };
  if (heads == 32) {
    layout.stages == 3 ? args(indexer_scores_kernel<32, 3>) : args(indexer_scores_kernel<32, 2>);
  } else {
    layout.stages == 3 ? args(indexer_scores_kernel<64, 3>) : args(indexer_scores_kernel<64, 2>);
  }
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_indexer_topk(step_batch_ref batch, float const* scores, std::int64_t score_stride, int index_stride,
                         int top_k, std::int32_t* out, cudaStream_t stream)
{
  DHISPARSE_EXPECTS(top_k >= 1, "indexer stand-in: top_k must be at least 1");
  int const rows = batch.max_batch * batch.max_queries;
  if (rows <= 0) { return; }
  // Blocks per row: enough to fill the chip twice over and to cache each slice in shared memory.
  int const sms = device_attribute(cudaDevAttrMultiProcessorCount);
  int ranks     = 1;
  while (ranks < topk_max_cluster &&
         (std::int64_t(rows) * ranks < 2 * sms || (score_stride + ranks - 1) / ranks > topk_cache_floats)) {
    ranks *= 2;
  }
  bool const alone = std::int64_t(rows) * ranks <= sms;  // few rows: a larger cache costs no occupancy
  int const cache  = int(std::min<std::int64_t>(alone ? topk_cache_floats_alone : topk_cache_floats,
                                                (score_stride + ranks - 1) / ranks));
  cudaLaunchAttribute attribute[1];
  attribute[0].id               = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = unsigned(ranks);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim          = dim3(unsigned(rows * ranks));
  config.blockDim         = dim3(topk_threads);
  config.dynamicSmemBytes = std::size_t(cache) * sizeof(float);
  config.stream           = stream;
  config.attrs            = attribute;
  config.numAttrs         = 1;
  DHISPARSE_CUDA_TRY(
    cudaLaunchKernelEx(&config, indexer_topk_kernel, batch, scores, score_stride, index_stride, top_k, out, cache));
}

void launch_indexer_scores_baseline(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                                    std::int8_t const* queries, float const* weights, int heads, int index_stride,
                                    float* scores, std::int64_t score_stride, std::int32_t max_tokens,
                                    cudaStream_t stream)
{
  std::int32_t const max_keys = (max_tokens + index_stride - 1) / index_stride;
  dim3 const grid(unsigned((max_keys + baseline_tokens_per_block - 1) / baseline_tokens_per_block),
                  unsigned(batch.max_batch));
  std::size_t const smem = baseline_smem(heads, batch.max_queries);
  if (heads == 32) {
    indexer_scores_baseline_kernel<32><<<grid, baseline_threads, smem, stream>>>(
      batch, keys, key_base, queries, weights, index_stride, scores, score_stride);
  } else {
    indexer_scores_baseline_kernel<64><<<grid, baseline_threads, smem, stream>>>(
      batch, keys, key_base, queries, weights, index_stride, scores, score_stride);
  }
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_indexer_topk_baseline(step_batch_ref batch, float const* scores, std::int64_t score_stride,
                                  int index_stride, int top_k, std::int32_t* out, cudaStream_t stream)
{
  unsigned const blocks = unsigned(batch.max_batch * batch.max_queries);
  indexer_topk_baseline_kernel<<<blocks, baseline_topk_threads, 0, stream>>>(batch, scores, score_stride,
                                                                             index_stride, top_k, out);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_write_tail_rows(step_batch_ref batch, std::int32_t const* tail_slots, std::byte* rows,
                            std::size_t stride, int group, int layer, std::uint64_t salt, cudaStream_t stream)
{
  std::size_t const threads = std::size_t(batch.max_batch) * batch.max_queries * 32;
  write_tail_rows_kernel<<<grid_for(threads, 256), 256, 0, stream>>>(batch, tail_slots, rows, stride, group, layer,
                                                                     salt);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_kept_from_accepted(step_batch_ref batch, std::int32_t const* accepted, std::int32_t* kept,
                               cudaStream_t stream)
{
  kept_from_accepted_kernel<<<grid_for(std::size_t(batch.max_batch), 256), 256, 0, stream>>>(batch, accepted, kept);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_count_tokens(step_batch_ref batch, std::int32_t const* kept, unsigned long long* total,
                         std::int32_t* step_tokens, std::int32_t* step_index, int capacity, cudaStream_t stream)
{
  count_tokens_kernel<<<1, 256, 0, stream>>>(batch, kept, total, step_tokens, step_index, capacity);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_or_status(std::uint32_t const* src, std::uint32_t* dst, std::uint32_t bit, cudaStream_t stream)
{
  or_status_kernel<<<1, 1, 0, stream>>>(src, dst, bit);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_hash(void const* data, std::size_t bytes, unsigned long long* out, std::int32_t const* step_index,
                 int capacity, cudaStream_t stream)
{
  std::size_t const words = bytes / 8;
  hash_kernel<<<std::min(grid_for(words, 256), 1024u), 256, 0, stream>>>(static_cast<std::uint64_t const*>(data),
                                                                          words, out, step_index, capacity);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_union_probe(step_batch_ref batch, residency_map_ref map, int group, std::int32_t const* selections,
                        int top_k, std::uint32_t* marks, std::int64_t mark_stride, std::uint32_t* epoch,
                        unsigned long long* counts, cudaStream_t stream)
{
  DHISPARSE_EXPECTS(batch.max_queries <= 8, "union probe: at most 8 queries per request");
  bump_epoch_kernel<<<1, 1, 0, stream>>>(epoch);
  std::size_t const n = std::size_t(batch.max_batch) * batch.max_queries * top_k;
  union_probe_kernel<<<std::min(grid_for(n, 256), 4096u), 256, 0, stream>>>(batch, map, group, selections, top_k,
                                                                              marks, mark_stride, epoch, counts);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_draft_tokens(std::int32_t* tokens, int requests, int drafts, int vocab, cudaStream_t stream)
{
  draft_tokens_kernel<<<grid_for(std::size_t(requests) * drafts, 256), 256, 0, stream>>>(tokens, requests, drafts,
                                                                                         vocab);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_build_p(float* p, int requests, int drafts, int vocab, float const* p_draft,
                    std::int32_t const* draft_tokens, cudaStream_t stream)
{
  std::size_t const n = std::size_t(requests) * (drafts + 1) * vocab;
  build_p_kernel<<<grid_for(n, 256), 256, 0, stream>>>(p, requests, drafts, vocab, p_draft, draft_tokens);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_build_candidates(std::int32_t* ids, float* probs, int requests, int drafts, int candidates, int vocab,
                             std::int32_t const* draft_tokens, float q_draft, cudaStream_t stream)
{
  std::size_t const n = std::size_t(requests) * drafts * candidates;
  build_candidates_kernel<<<grid_for(n, 256), 256, 0, stream>>>(ids, probs, requests, drafts, candidates, vocab,
                                                                 draft_tokens, q_draft);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

}  // namespace dhisparse::bench::serving
