/**
 * @file detail/verify/cluster.cuh
 * @brief The CTAs of one request's thread-block cluster (sm_90): which CTA reads which
 *        slice of a row, and the exchanges that give every CTA the request's totals, chunk
 *        masses, argmax and status bits.
 *
 * Every CTA of a cluster walks the same request with the same control flow (the decisions
 * depend only on values every CTA holds identically); a row pass is split between them and
 * combined here. Each exchange is: this CTA's share into its shared memory, cluster
 * barrier, every CTA reads all shares in rank order (so float sums have the same bits
 * everywhere; the fixed-point sums are exact in any order), cluster barrier (no CTA
 * overwrites a share, or exits, while another may still read it). With `Ctas` = 1 every
 * function is a no-op and the kernel is the one-CTA kernel. Elsewhere than sm_90+ the
 * cluster functions compile to CTA-local stand-ins; the launcher never starts a cluster
 * there.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/cta.cuh>
#include <dhisparse/detail/verify/row_pass.cuh>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#define DHISPARSE_VERIFY_CLUSTER 1
#endif

namespace dhisparse::detail::verify {

/// Rank of this CTA in its request's cluster (0 for one CTA per request).
template <int Ctas>
__device__ __forceinline__ int cluster_rank()
{
#if defined(DHISPARSE_VERIFY_CLUSTER)
  if constexpr (Ctas > 1) { return int(cooperative_groups::this_cluster().block_rank()); }
#endif
  return 0;
}

/// Barrier of every thread of the cluster (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync()
{
#if defined(DHISPARSE_VERIFY_CLUSTER)
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

/// CTA `rank`'s copy of `x`, an object in this CTA's shared memory.
template <class T>
__device__ __forceinline__ T const& peer(T const& x, int rank)
{
#if defined(DHISPARSE_VERIFY_CLUSTER)
  return *cooperative_groups::this_cluster().map_shared_rank(&x, rank);
#else
  (void)rank;
  return x;
#endif
}

/// The CTA whose warps compute chunk `c` of a pass: warp w of CTA r takes chunks
/// (r·block_warps + w) + i·Ctas·block_warps, so each step of the CTAs reads adjacent chunks.
template <int Ctas>
__device__ __forceinline__ int chunk_owner(int c)
{
  return (c / block_warps) % Ctas;
}

/**
 * @brief After a row pass: the request's totals into `s` (its `flags`, per thread, stay
 *        this CTA's) and the masses of every chunk into `sh.chunk`.
 */
template <int Ctas>
__device__ __forceinline__ void combine_pass(shared_state& sh, pass_sums& s, int nchunks, int rank)
{
  if constexpr (Ctas > 1) {
    if (threadIdx.x == 0) { sh.part = cluster_partial{s.p, s.q, s.r, s.p_float, s.q_float, 0.f, 0}; }
    cluster_sync();
    pass_sums t;
    t.flags = s.flags;
#pragma unroll
    for (int r = 0; r < Ctas; ++r) {
      cluster_partial const& o = peer(sh.part, r);
      t.p += o.p;
      t.q += o.q;
      t.r += o.r;
      t.p_float += o.p_float;
      t.q_float += o.q_float;
    }
    // Chunks of the other CTAs; another CTA reads only the chunks this one computed.
    for (int c = int(threadIdx.x); c < nchunks; c += block_threads) {
      int const owner = chunk_owner<Ctas>(c);
      if (owner != rank) { sh.chunk[c] = peer(sh.chunk[c], owner); }
    }
    cluster_sync();
    s = t;
  } else {
    (void)sh, (void)s, (void)nchunks, (void)rank;
  }
}

/// After an argmax over this CTA's slice: the request's (largest value, smallest index).
template <int Ctas>
__device__ __forceinline__ void combine_argmax(shared_state& sh, float& best, std::int32_t& arg)
{
  if constexpr (Ctas > 1) {
    if (threadIdx.x == 0) {
      sh.part.best = best;
      sh.part.arg  = arg;
    }
    cluster_sync();
#pragma unroll
    for (int r = 0; r < Ctas; ++r) {
      cluster_partial const& o = peer(sh.part, r);
      float const ob           = o.best;
      std::int32_t const oa    = o.arg;
      if (ob > best || (ob == best && oa < arg)) {
        best = ob;
        arg  = oa;
      }
    }
    cluster_sync();
  } else {
    (void)sh, (void)best, (void)arg;
  }
}

/// The status bits raised so far by any CTA of the request. Call after a `__syncthreads`.
template <int Ctas>
__device__ __forceinline__ std::uint32_t request_flags(shared_state& sh)
{
  if constexpr (Ctas > 1) {
    cluster_sync();
    std::uint32_t f = 0;
#pragma unroll
    for (int r = 0; r < Ctas; ++r) { f |= peer(sh.flags, r); }
    cluster_sync();
    return f;
  } else {
    return sh.flags;
  }
}

}  // namespace dhisparse::detail::verify
