/**
 * @file verify.cuh
 * @brief Speculative verification: which drafted tokens the target accepts, and the
 *        target's token after them.
 *
 * Rules (`verify_rule`, `draft_topology`, `draft_distribution`):
 * - greedy, chain or tree: accept while the draft equals the target's argmax; then emit the
 *   target's argmax. Output = plain greedy decoding of the target, exactly.
 * - sampling, chain: accept draft x_i with probability min(1, p_i(x_i)/q_i(x_i)); at the
 *   first rejection sample from normalize(max(0, p_i − q_i)); if all are accepted sample
 *   the bonus from p_n. q is dense, a candidate list, or one-hot (a deterministic draft).
 * - sampling, tree: at each node the children are tried in sibling order against what is
 *   left of the target distribution (recursive rejection sampling); children drawn i.i.d.
 *   from a dense / candidate q (SpecInfer), or chosen deterministically (one-hot, EAGLE).
 * All are exactly distribution-preserving (docs/verify.md; tests/verify check it
 * statistically). Randomness is Philox4x32-10 with {seed, offset} read from device memory,
 * so a captured CUDA graph replays with a new offset; the host reference
 * (`dhisparse/host/verify.hpp`) draws the same numbers and produces identical outputs.
 *
 * Per-request counts, a device-side batch size and fixed launch shapes make every call
 * capturable in a graph. Invalid per-request input raises bits of `verify_status` in a
 * device word and empties that request's outputs; it never yields a wrong token silently.
 *
 * @code
 * dhisparse::verify_params v;
 * v.rule = dhisparse::verify_rule::sampling;  v.distribution = dhisparse::draft_distribution::dense;
 * v.capacity = B;  v.max_drafts = d;  v.vocab = V;  v.num_drafts = d_num;   // device [B]
 * v.draft_tokens = d_drafts;  v.p = d_p;  v.q = d_q;  v.rng = d_seed_offset;
 * v.accepted = d_acc;  v.emitted = d_out;  v.next_token = d_next;  v.status = d_status;
 * DHISPARSE_CUDA_TRY(dhisparse::verify_async(v, stream));
 * DHISPARSE_CUDA_TRY(dhisparse::advance_rng_offset_async(d_seed_offset, 1, stream));
 * @endcode
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/tuning.hpp>
#include <dhisparse/verify_params.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace dhisparse {

namespace detail::verify {
template <int Vec>
cudaError_t launch(verify_params const& a, cudaStream_t stream, pass_tuning const& tuning);
inline int vector_width(verify_params const& a);
}  // namespace detail::verify

/**
 * @brief Verifies a batch of drafts on `stream` (asynchronous, allocation-free,
 *        graph-capturable).
 *
 * Clears `*a.status`, then runs one CTA per request (`a.capacity` CTAs), or on sm_90 and
 * later a cluster of `verify_cluster_ctas` CTAs per request that split every full-row pass
 * (`a.ctas_per_request` chooses; the outputs are the same). Greedy verification from p
 * with a workspace (`a.workspace`, `verify_workspace_bytes`) and `a.ctas_per_request` = 0
 * takes the wide greedy path instead: a prologue, then one launch per depth of the
 * accepted paths (`a.max_drafts` + 1 launches) whose rows are argmaxed by the whole GPU at
 * once — the same outputs, in less time where a few requests accept long paths
 * (docs/verify.md). Sampling over trees with dense q and a workspace: a request's later
 * passes are cut into groups of chunks that CTAs done with their own requests read beside
 * it (the same outputs; `detail::verify::library_tuning`). Requests at or past
 * `*a.batch_size` get empty outputs without reading their inputs.
 *
 * @param a device pointers and shapes (see `verify_params`)
 * @param stream the stream to run on
 * @return `cudaErrorInvalidValue` when `verify_params_problem(a)` reports a problem (call
 *         it for the message), `cudaErrorNotSupported` when `a.ctas_per_request` asks for a
 *         cluster the device or the build cannot run, otherwise the launch status
 */
inline cudaError_t verify_async(verify_params const& a, cudaStream_t stream)
{
  if (!verify_params_problem(a).empty()) { return cudaErrorInvalidValue; }
  cudaError_t const cleared = cudaMemsetAsync(a.status, 0, sizeof(std::uint32_t), stream);
  if (cleared != cudaSuccess) { return cleared; }
  detail::verify::pass_tuning const tuning = detail::verify::library_tuning(a);
  return detail::verify::vector_width(a) == 4 ? detail::verify::launch<4>(a, stream, tuning)
                                              : detail::verify::launch<1>(a, stream, tuning);
}

/**
 * @brief Adds `increment` to the offset word (`rng[1]`) in device memory, on `stream`, so
 *        that the next verification (or the next replay of a graph holding both) draws
 *        fresh numbers.
 * @param rng device {seed, offset}
 * @param increment added to the offset; one per verify call suffices
 * @param stream the stream to run on
 */
inline cudaError_t advance_rng_offset_async(std::uint64_t* rng, std::uint64_t increment,
                                            cudaStream_t stream);

/**
 * @brief Reads a status word written by `verify_async` (synchronizes `stream`) and throws
 *        `dhisparse::error` naming the arguments at fault when it is not zero.
 * @param status device pointer to the word
 * @param stream the stream the verification ran on
 */
inline void check_verify_status_sync(std::uint32_t const* status, cudaStream_t stream)
{
  std::uint32_t bits = 0;
  DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&bits, status, sizeof bits, cudaMemcpyDeviceToHost, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  DHISPARSE_EXPECTS(bits == 0, "verify: invalid input: " + describe_status(bits, status_format::explained));
}

}  // namespace dhisparse

/**
 * @brief Explicitly instantiates the verification launchers (and thereby the kernels);
 *        use in exactly one `.cu` file at namespace scope: `DHISPARSE_VERIFY_INSTANTIATE();`.
 */
#define DHISPARSE_VERIFY_INSTANTIATE()                                                        \
  template cudaError_t dhisparse::detail::verify::launch<1>(dhisparse::verify_params const&, \
                                                            cudaStream_t,                     \
                                                            dhisparse::detail::verify::pass_tuning const&); \
  template cudaError_t dhisparse::detail::verify::launch<4>(dhisparse::verify_params const&, \
                                                            cudaStream_t,                     \
                                                            dhisparse::detail::verify::pass_tuning const&)

/**
 * @brief Declares the instantiation made elsewhere (`DHISPARSE_VERIFY_INSTANTIATE`), so
 *        that translation units calling `verify_async` do not compile the kernels again:
 *        `DHISPARSE_VERIFY_EXTERN();` after the include.
 */
#define DHISPARSE_VERIFY_EXTERN()                                                                    \
  extern template cudaError_t dhisparse::detail::verify::launch<1>(dhisparse::verify_params const&, \
                                                                   cudaStream_t,                     \
                                                                   dhisparse::detail::verify::pass_tuning const&); \
  extern template cudaError_t dhisparse::detail::verify::launch<4>(dhisparse::verify_params const&, \
                                                                   cudaStream_t,                     \
                                                                   dhisparse::detail::verify::pass_tuning const&)

#include <dhisparse/detail/verify/kernels.cuh>

namespace dhisparse {
inline cudaError_t advance_rng_offset_async(std::uint64_t* rng, std::uint64_t increment,
                                            cudaStream_t stream)
{
  detail::verify::advance_rng_offset_kernel<0><<<1, 1, 0, stream>>>(rng, increment);
  return detail::check_launch(stream);
}
}  // namespace dhisparse
