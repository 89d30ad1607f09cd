/**
 * @file detail/verify/cta.cuh
 * @brief One verification CTA: its size, its shared state, and the warp and block reductions
 *        every thread of it takes part in (every thread returns the result).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/detail/warp_reduce.cuh>
#include <dhisparse/verify_params.hpp>

#include <cstdint>

namespace dhisparse::detail::verify {

inline constexpr int block_threads = 256;
inline constexpr int block_warps   = block_threads / 32;
inline constexpr int max_nodes     = max_verify_drafts + 1;
inline constexpr int max_patches   = max_nodes > max_verify_candidates ? max_nodes : max_verify_candidates;
static_assert(max_verify_drafts <= block_threads, "one thread per draft node when probing");

/// One CTA's share of a row pass, read by the other CTAs of its request's cluster.
struct cluster_partial {
  std::uint64_t p, q, r;     ///< fixed-point masses of the CTA's slice
  float p_float, q_float;    ///< fp32 masses of the slice
  float best;                ///< argmax: the slice's largest value
  std::int32_t arg;          ///< argmax: its smallest index
};

/// Per-CTA state. ~40 KB: under the 48 KB of static shared memory.
struct shared_state {
  std::uint64_t chunk[max_chunks];        ///< mass of each chunk of the row of the last pass
  std::uint64_t node_p[max_nodes];        ///< P at node m's token, from its parent's p row
  std::uint64_t node_q[max_nodes];        ///< Q at node m's token, from its parent's q row
  std::uint64_t mass[max_nodes];          ///< S_0..S_k of the node being expanded
  std::uint64_t patch_p[max_patches];     ///< candidates: P at the candidate
  std::uint64_t patch_q[max_patches];     ///< candidates: Q of the candidate
  std::uint64_t patch_delta[max_patches]; ///< P − R_k at the token: what the residual removes
  std::int32_t patch_id[max_patches];     ///< candidate ids / removed one-hot tokens
  std::int32_t chunk_patches[max_patches]; ///< `locate`: the slots whose id is in the sampled chunk, in slot order
  std::int32_t token[max_nodes];
  std::int32_t first_child[max_nodes];
  std::int32_t next_sibling[max_nodes];
  std::int32_t parent[max_nodes];
  std::int32_t refs[max_nodes];
  std::int32_t out_tokens[max_nodes];
  std::int32_t out_nodes[max_nodes];
  std::uint64_t red[block_warps][3];
  float red_f[block_warps];
  std::int32_t red_i[block_warps];
  cluster_partial part;  ///< this CTA's share of the last pass (clusters only)
  std::uint64_t found_offset;
  std::int32_t found_chunk;
  std::int32_t found_token;
  std::uint32_t flags;
  std::int32_t job[5];        ///< shared passes: a claimed group, its row, k, dense, request
  std::uint32_t group_flags;  ///< shared passes: status bits of the group being run
};

// ---------------------------------------------------------------------------------------
// Warp / block reductions (every thread returns the result; the warp sums are
// detail/warp_reduce.cuh's)
// ---------------------------------------------------------------------------------------

/// (largest value, smallest index among ties) over the warp's lanes.
__device__ __forceinline__ void warp_argmax(float& best, std::int32_t& arg)
{
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float const ob        = __shfl_xor_sync(0xFFFFFFFFu, best, off);
    std::int32_t const oa = __shfl_xor_sync(0xFFFFFFFFu, arg, off);
    if (ob > best || (ob == best && oa < arg)) {
      best = ob;
      arg  = oa;
    }
  }
}

/// Sums three values over the block. Integer sums are exact (wrapping: see row_pass).
__device__ __forceinline__ void block_sum3(shared_state& sh, std::uint64_t& a, std::uint64_t& b,
                                           std::uint64_t& c)
{
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  c = warp_sum(c);
  if (lane == 0) {
    sh.red[warp][0] = a;
    sh.red[warp][1] = b;
    sh.red[warp][2] = c;
  }
  __syncthreads();
  a = b = c = 0;
#pragma unroll
  for (int w = 0; w < block_warps; ++w) {
    a += sh.red[w][0];
    b += sh.red[w][1];
    c += sh.red[w][2];
  }
  __syncthreads();
}

__device__ __forceinline__ float block_sum(shared_state& sh, float v)
{
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) { sh.red_f[warp] = v; }
  __syncthreads();
  v = 0.f;
#pragma unroll
  for (int w = 0; w < block_warps; ++w) { v += sh.red_f[w]; }
  __syncthreads();
  return v;
}

/// Exclusive prefix sum over the block (thread order).
__device__ __forceinline__ std::uint64_t block_exclusive_scan(shared_state& sh, std::uint64_t v)
{
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::uint64_t const inclusive = warp_inclusive_sum(v);
  if (lane == 31) { sh.red[warp][0] = inclusive; }
  __syncthreads();
  std::uint64_t before = 0;
  for (int w = 0; w < warp; ++w) { before += sh.red[w][0]; }
  __syncthreads();
  return before + inclusive - v;
}

__device__ __forceinline__ void raise(shared_state& sh, std::uint32_t bits)
{
  if (bits) { atomicOr(&sh.flags, bits); }
}

}  // namespace dhisparse::detail::verify
