/**
 * @file detail/verify/kernels.cuh
 * @brief CUDA kernels of speculative verification: one CTA per request.
 *
 * A CTA walks its request's draft (chain or tree) exactly as `host::verify` does, with
 * every thread taking the same decisions from shared memory. Acceptance tests only need
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
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>
#include <dhisparse/verify_params.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse::detail::verify {

template <int Vec>
DHISPARSE_KERNEL void __launch_bounds__(block_threads, 4) verify_kernel(verify_params a, layout l)
{
  __shared__ shared_state sh;
  int batch = a.batch_size ? *a.batch_size : a.capacity;
  if (batch < 0 || batch > a.capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) { atomicOr(a.status, verify_status::bad_batch_size); }
    batch = batch < 0 ? 0 : a.capacity;
  }
  request_block<Vec> r(a, l, sh, int(blockIdx.x));
  if (int(blockIdx.x) >= batch) {
    r.write_padding();
  } else {
    r.run();
  }
}

/// Launches the verification kernel with `Vec`-wide loads (see `vector_width`).
template <int Vec>
cudaError_t launch(verify_params const& a, cudaStream_t stream)
{
  if (a.capacity == 0) { return cudaSuccess; }
  verify_kernel<Vec><<<a.capacity, block_threads, 0, stream>>>(a, layout::of(a));
  return check_launch(stream);
}

/// Single-thread kernel: rng[1] += increment (a template, so that it may be defined in a header).
template <int Unused>
DHISPARSE_KERNEL void advance_rng_offset_kernel(std::uint64_t* rng, std::uint64_t increment)
{
  rng[1] += increment;
}

}  // namespace dhisparse::detail::verify
