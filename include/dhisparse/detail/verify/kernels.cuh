/**
 * @file detail/verify/kernels.cuh
 * @brief CUDA kernels of speculative verification: one CTA per request, or (sm_90+) a
 *        cluster of `verify_cluster_ctas` CTAs per request that split every row pass; and
 *        the launcher, which sends greedy verification from p with a workspace down the
 *        wide path (wide.cuh).
 *
 * A CTA walks its request's draft (chain or tree) exactly as `host::verify` does, with
 * every thread taking the same decisions from shared memory; in a cluster each CTA does,
 * and each reads its slice of every full row (cluster.cuh), so a request whose accepted
 * path needs a row after row has the bandwidth of `verify_cluster_ctas` CTAs. Acceptance tests only need
 * p and q at the drafted tokens, which are probed for every node in parallel up front; a
 * full pass over a vocabulary row happens only where the rule needs a distribution:
 * the argmax of greedy verification, the residual max(0, p − q) after a rejection, and
 * the bonus sample from p. A sampling pass keeps the fixed-point mass of every chunk of
 * the row in shared memory, so the inverse-CDF search re-reads only the one chunk that
 * holds the sampled token. docs/verify.md has the reasoning and the byte counts.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/cta.cuh>
#include <dhisparse/detail/verify/request_block.cuh>
#include <dhisparse/detail/verify/shared_pass.cuh>
#include <dhisparse/detail/verify/tuning.hpp>
#include <dhisparse/detail/verify/wide.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>
#include <dhisparse/verify_params.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdint>

namespace dhisparse::detail::verify {

/// One request per CTA (or per cluster of `Ctas`). With `share.on()` (one CTA per request:
/// shared_pass.cuh) a CTA that is done with its request, or has none, then helps run the
/// shared passes of the others.
template <int Vec, int Ctas>
DHISPARSE_KERNEL void __launch_bounds__(block_threads, 4)
  verify_kernel(verify_params a, layout l, pass_tuning tuning, pass_share share)
{
  __shared__ shared_state sh;
  if (share.on() && threadIdx.x == 0) { share_atomic(share.started()).fetch_add(1u, cuda::memory_order_relaxed); }
  int const batch = batch_of(a, blockIdx.x == 0 && threadIdx.x == 0);
  int const b = int(blockIdx.x) / Ctas;  // a cluster is Ctas consecutive CTAs
  request_block<Vec, Ctas> r(a, l, sh, b, cluster_rank<Ctas>(), tuning, share);
  if (b >= batch) {
    r.write_padding();
  } else {
    r.run();
  }
  if constexpr (Ctas == 1) {
    if (share.on()) {
      __syncthreads();
      if (b < batch && threadIdx.x == 0) { share_atomic(share.finished()).fetch_add(1u, cuda::memory_order_relaxed); }
      help_shared_passes<Vec>(a, l, sh, share, batch);
    }
  }
}

/**
 * @brief Whether this process can run `verify_kernel<Vec, verify_cluster_ctas>` on the
 *        current device as a cluster: the code chosen for the device was compiled for
 *        sm_90 or later (PTX JIT-compiled from an older virtual architecture has no cluster
 *        code). Queried once per device. A cluster of 8 is the portable size and one CTA
 *        needs one SM's share (37 KB of shared memory, 256 threads), so it always fits.
 */
template <int Vec>
bool clusters_available()
{
  constexpr int max_devices = 64;
  static std::array<std::atomic<int>, max_devices> cached{};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= max_devices) {
    cudaGetLastError();
    return false;
  }
  int known = cached[device].load(std::memory_order_relaxed);
  if (known == 0) {
    auto* kernel = &verify_kernel<Vec, verify_cluster_ctas>;
    cudaFuncAttributes attributes{};
    bool const yes = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90;
    cudaGetLastError();  // a failed query only means: no clusters
    known = yes ? 2 : 1;
    cached[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

/// True when the call takes the wide greedy path (wide.cuh): greedy from p, no
/// `validate_all`, a workspace, and the launcher's choice of kernel shape.
inline bool uses_wide_path(verify_params const& a)
{
  return a.rule == verify_rule::greedy && a.target_tokens == nullptr && !a.validate_all &&
         a.workspace != nullptr && a.ctas_per_request == 0;
}

/// Launches the verification kernels with `Vec`-wide loads (see `vector_width`). With a
/// workspace, greedy verification from p takes the wide path (`uses_wide_path`,
/// `launch_wide`); otherwise `a.ctas_per_request` CTAs per request. `tuning`: the
/// one-CTA kernel's later passes (tuning.hpp; `verify_async` passes the library's
/// defaults); shared passes need the workspace and one CTA per request. The default (0) is a
/// cluster where `clusters_available` for greedy verification that reads full rows (an
/// argmax per accepted position, one row after another: the cluster shortens the longest
/// chains, 0.49 → 0.34 ms on the H200 at B = 512, d = 8), one CTA otherwise: sampling
/// rules read fewer rows per request and lose more to the cluster's barriers and repeated
/// per-request work than they gain (dense q 0.25 → 0.55 ms, candidate q 0.20 → 0.74 ms;
/// docs/verify.md).
template <int Vec>
cudaError_t launch(verify_params const& a, cudaStream_t stream, pass_tuning const& tuning)
{
  if (a.capacity == 0) { return cudaSuccess; }
  if (uses_wide_path(a) && wide_ctas() > 0) { return launch_wide<Vec>(a, stream); }
  bool const fits = a.capacity <= INT_MAX / verify_cluster_ctas;
  bool cluster    = a.ctas_per_request == verify_cluster_ctas;
  if (cluster && !(fits && clusters_available<Vec>())) { return cudaErrorNotSupported; }
  if (a.ctas_per_request == 0) {
    bool const greedy_rows = a.rule == verify_rule::greedy && !(a.target_tokens && !a.validate_all);
    cluster                = greedy_rows && fits && clusters_available<Vec>();
  }
  if (!cluster) {
    pass_share const share = pass_share::of(a, tuning);
    if (share.on()) {
      cudaError_t const cleared = cudaMemsetAsync(share.control, 0, share.control_bytes, stream);
      if (cleared != cudaSuccess) { return cleared; }
    }
    verify_kernel<Vec, 1><<<a.capacity, block_threads, 0, stream>>>(a, layout::of(a), tuning, share);
    return check_launch(stream);
  }
  cudaLaunchAttribute attribute{};
  attribute.id               = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = verify_cluster_ctas;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim           = dim3(unsigned(a.capacity) * verify_cluster_ctas);
  config.blockDim          = dim3(block_threads);
  config.stream            = stream;
  config.attrs             = &attribute;
  config.numAttrs          = 1;
  cudaError_t const status = cudaLaunchKernelEx(&config, verify_kernel<Vec, verify_cluster_ctas>, a, layout::of(a), tuning,
                                                      pass_share{});
  if (status != cudaSuccess) { return status; }
  return check_launch(stream);
}

/// Single-thread kernel: rng[1] += increment (a template, so that it may be defined in a header).
template <int Unused>
DHISPARSE_KERNEL void advance_rng_offset_kernel(std::uint64_t* rng, std::uint64_t increment)
{
  rng[1] += increment;
}

}  // namespace dhisparse::detail::verify
