/**
 * @file detail/sparse_attention/cluster.cuh
 * @brief Thread-block-cluster primitives (sm_90) for the MLA kernel's two-CTA mode: rank,
 *        the peer's shared-memory window, `st.async` into it, transaction and remote mbarrier
 *        arrivals and the cluster barrier. Elsewhere they compile to nothing (the launcher never picks the
 *        two-CTA mode there).
 *
 * Through libcu++'s `cuda::ptx` where it has the instruction with the same semantics and
 * the same code; inline PTX for `mapa` (not in `cuda::ptx`), `st.async` (see `st_async_16`)
 * and the remote arrival (see `mbarrier_arrive_remote`).
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cstdint>

#if defined(__CUDACC__)

#include <cuda/ptx>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DHISPARSE_SPARSE_ATTENTION_CLUSTER 1
#endif

namespace dhisparse::sparse_attention::detail {

/// Rank of this CTA in its cluster.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int cluster_rank()
{
  std::uint32_t r = 0;
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  r = cuda::ptx::get_sreg_cluster_ctarank();
#endif
  return int(r);
}

/// The shared::cluster address of CTA `rank`'s copy of this CTA's shared address `addr`.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t peer_address(std::uint32_t addr, int rank)
{
  std::uint32_t r = 0;
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
#else
  (void)addr;
  (void)rank;
#endif
  return r;
}

/// Asynchronous 16-byte store to a peer's shared memory (`addr`, shared::cluster) that
/// completes 16 bytes of transactions on the peer's mbarrier `bar` (same CTA as `addr`).
/// Inline PTX: `cuda::ptx::st_async` takes generic pointers, and generic peer pointers
/// (`__cluster_map_shared_rank`) put `mapa` and address conversions into the FP8 producer's
/// dequantization loop (24 more instructions in the cluster kernel, sm_90a).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void st_async_16(std::uint32_t addr, uint4 v, std::uint32_t bar)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                 addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
#else
  (void)addr;
  (void)v;
  (void)bar;
#endif
}

/// Arrives on this CTA's mbarrier `bar` and raises its expected transaction bytes by `bytes`
/// (release at CTA scope, the instruction's default).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             bar, bytes);
#else
  (void)bar;
  (void)bytes;
#endif
}

/// Arrives on a peer's mbarrier (`addr`, shared::cluster). Default (CTA-scope) release, as
/// CUTLASS's cluster barriers do: what the arrival publishes — "this thread is done reading
/// the stage" — needs no ordering of this thread's memory accesses beyond program order, and
/// the cluster-scope release costs a GPU-wide memory barrier per arrival. Inline PTX:
/// `cuda::ptx` has the shared::cluster arrival only as `.release.cluster` or `.relaxed.cluster`.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void mbarrier_arrive_remote(std::uint32_t addr)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
#else
  (void)addr;
#endif
}

/// Makes this thread's mbarrier initializations visible to the cluster.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void fence_mbarrier_init_cluster()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
#endif
}

/// Barrier of every thread of the cluster (release / acquire at cluster scope).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void cluster_sync()
{
#if defined(DHISPARSE_SPARSE_ATTENTION_CLUSTER)
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
#endif
}

}  // namespace dhisparse::sparse_attention::detail

#endif  // __CUDACC__
