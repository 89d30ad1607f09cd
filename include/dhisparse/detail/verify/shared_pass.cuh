/**
 * @file detail/verify/shared_pass.cuh
 * @brief Shared row passes: a request's later sampling pass cut into groups of chunks that
 *        CTAs which have finished their own requests claim and read beside the request's
 *        CTA (one CTA per request; `pass_tuning::share_from`, tuning.hpp).
 *
 * Why: a tree node whose first draft was rejected needs a second pass over its rows (p and
 * q, 1.2 MB at V = 151 552) after its first; it runs when most other requests of the call
 * are done, its CTA alone on its SM and bound by its own loads' latency. The CTAs that
 * finished have nothing to do; here they read the pass's chunks instead.
 *
 * Protocol, per request b (state in the call's workspace, `workspace_layout`):
 * - the owner (b's CTA) writes the pass's descriptor (row, k, dense, the masses S_1..S_k−1),
 *   then publishes the claim word `gen << 16 | 0` (gen: the request's pass number, ≥ 1)
 *   and sets b's bit in the open bitmap;
 * - any CTA, the owner included, claims group g by a CAS that raises the word's count from
 *   g to g + 1 while the word still carries gen (the claim of the last group clears the open
 *   bit); it reads the descriptor, runs the group's chunks (`row_pass` over [c_g, c_g+1)),
 *   stores their masses and the group's sums, then counts the group in `done[b]` (release);
 * - the owner claims groups until none is left, waits until `done[b]` counts every group
 *   (acquire) and combines: chunk masses into its shared memory, sums in group order (the
 *   fixed-point sums are exact in any order; the fp32 guards see the same bits whoever ran
 *   a group), status bits ORed.
 * A claimed group is run by a resident CTA that waits for nothing, so the owner's wait ends.
 * Helpers (CTAs done with their own request, and padding CTAs) poll only while every CTA of
 * the grid has started (otherwise a polling CTA could hold the SM a waiting request needs)
 * and until every request of the batch has finished. The outputs are the bits of the
 * unshared pass: the same chunk masses, sums and flags.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/cta.cuh>
#include <dhisparse/detail/verify/row_pass.cuh>
#include <dhisparse/detail/verify/tuning.hpp>
#include <dhisparse/verify_params.hpp>

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

namespace dhisparse::detail::verify {

/// One group's share of a pass (`workspace_layout::partials`).
struct share_partial {
  std::uint64_t p, q, r;
  float p_float, q_float;
  std::uint32_t flags;
  std::uint32_t pad[3];
};
static_assert(sizeof(share_partial) == workspace_layout::partial_bytes);

/// Polls of a helper that found nothing to claim before it stops (a bound, not a timing:
/// helpers stop when every request has finished; this only ends a helper that is no use).
inline constexpr int share_idle_polls = 1 << 16;

/// The shared-pass state of one call in its workspace; `on()` false when passes are not
/// shared (no workspace, not a sampling rule, or `pass_tuning` leaves sharing off).
struct pass_share {
  std::uint32_t* control   = nullptr;  ///< started, finished, pad, pad, claim [capacity], done [capacity], open bits
  unsigned char* descs     = nullptr;
  std::uint64_t* chunks    = nullptr;  ///< [capacity][nchunks]
  share_partial* partials  = nullptr;  ///< [capacity][max_share_groups]
  std::size_t desc_bytes   = 0;
  std::size_t control_bytes = 0;
  int capacity = 0, nchunks = 0, groups = 0;

  static pass_share of(verify_params const& a, pass_tuning const& t)
  {
    pass_share s;
    if (!t.shares() || a.workspace == nullptr || a.rule != verify_rule::sampling || a.vocab <= 0) { return s; }
    workspace_layout const w = workspace_layout::of(a.capacity, a.max_drafts, a.vocab, true);
    auto* base               = static_cast<unsigned char*>(a.workspace);
    s.control                = reinterpret_cast<std::uint32_t*>(base + w.control);
    s.descs                  = base + w.descs;
    s.chunks                 = reinterpret_cast<std::uint64_t*>(base + w.chunks);
    s.partials               = reinterpret_cast<share_partial*>(base + w.partials);
    s.desc_bytes             = workspace_layout::desc_bytes(a.max_drafts);
    s.control_bytes          = w.control_bytes;
    s.capacity               = a.capacity;
    s.nchunks                = chunk_count(a.vocab);
    int g                    = t.share_groups < max_share_groups ? t.share_groups : max_share_groups;
    s.groups                 = g < s.nchunks ? g : s.nchunks;
    return s;
  }

  DHISPARSE_HOST_DEVICE bool on() const { return control != nullptr; }

  DHISPARSE_HOST_DEVICE std::uint32_t* started() const { return control; }
  DHISPARSE_HOST_DEVICE std::uint32_t* finished() const { return control + 1; }
  DHISPARSE_HOST_DEVICE std::uint32_t* claim(int b) const { return control + 4 + b; }
  DHISPARSE_HOST_DEVICE std::uint32_t* done(int b) const { return control + 4 + capacity + b; }
  DHISPARSE_HOST_DEVICE std::uint32_t* open(int word) const { return control + 4 + 2 * capacity + word; }
  __device__ std::int32_t* desc(int b) const { return reinterpret_cast<std::int32_t*>(descs + b * desc_bytes); }
  __device__ std::uint64_t* desc_masses(int b) const
  {
    return reinterpret_cast<std::uint64_t*>(descs + b * desc_bytes + 16);
  }
  __device__ std::uint64_t* chunk_masses(int b) const { return chunks + std::size_t(b) * nchunks; }
  __device__ share_partial* partial(int b, int g) const { return partials + std::size_t(b) * max_share_groups + g; }
  /// First chunk of group g (group `groups` is the end).
  DHISPARSE_HOST_DEVICE int chunk_begin(int g) const { return int(std::int64_t(g) * nchunks / groups); }
};

// ---------------------------------------------------------------------------------------
// The protocol's atomic steps (one thread of a CTA each; host and device, so that a host
// test can run them from many threads: tests/verify/test_share_protocol_host.cu)
// ---------------------------------------------------------------------------------------

template <class T>
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE cuda::atomic_ref<T, cuda::thread_scope_device> share_atomic(T* p)
{
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p);
}

/// The owner, after writing request b's descriptor: opens pass `gen` (≥ 1) to claims. No
/// group of b's previous pass is still running (the owner waited for all of them), so
/// nobody counts in `done[b]` before the claim word carries gen.
DHISPARSE_HOST_DEVICE inline void publish_pass(pass_share const& s, int b, std::uint32_t gen)
{
  share_atomic(s.done(b)).store(0u, cuda::memory_order_relaxed);
  share_atomic(s.claim(b)).store(gen << 16, cuda::memory_order_release);  // the descriptor before it
  share_atomic(s.open(b / 32)).fetch_or(1u << (b % 32), cuda::memory_order_relaxed);
}

/// Claims the next group of request b's pass `gen`; -1 when the word no longer carries gen
/// or every group is taken. The claim of the last group closes b's open bit. A successful
/// claim acquires the descriptor the owner wrote before `publish_pass`.
DHISPARSE_HOST_DEVICE inline int claim_group(pass_share const& s, int b, std::uint32_t gen)
{
  auto word         = share_atomic(s.claim(b));
  std::uint32_t cur = word.load(cuda::memory_order_relaxed);
  for (;;) {
    std::uint32_t const count = cur & 0xFFFFu;
    if ((cur >> 16) != gen || int(count) >= s.groups) { return -1; }
    if (word.compare_exchange_weak(cur, cur + 1, cuda::memory_order_acquire, cuda::memory_order_relaxed)) {
      if (int(count) + 1 == s.groups) { share_atomic(s.open(b / 32)).fetch_and(~(1u << (b % 32)), cuda::memory_order_relaxed); }
      return int(count);
    }
  }
}

/// After a group's chunk masses and sums are stored (by every thread of the CTA, fenced):
/// counts it done (release).
DHISPARSE_HOST_DEVICE inline void count_group_done(pass_share const& s, int b)
{
  share_atomic(s.done(b)).fetch_add(1u, cuda::memory_order_release);
}

/// Whether every group of request b's current pass is done (acquire: their stores are
/// visible after a true answer).
DHISPARSE_HOST_DEVICE inline bool pass_done(pass_share const& s, int b)
{
  return int(share_atomic(s.done(b)).load(cuda::memory_order_acquire)) >= s.groups;
}

/// A helper's check before each poll: stop when some CTA of the `grid` has not started
/// (polling could hold the SM it needs) or every request of the `batch` has finished.
DHISPARSE_HOST_DEVICE inline bool helpers_stop(pass_share const& s, int batch, unsigned grid)
{
  return share_atomic(s.started()).load(cuda::memory_order_relaxed) < grid ||
         int(share_atomic(s.finished()).load(cuda::memory_order_relaxed)) >= batch;
}

/// What a helper claimed: request b's group g of pass gen (g -1: nothing).
struct share_job {
  int b = -1, g = -1;
  std::uint32_t gen = 0;
};

/// A helper's search: the open requests below `batch`, from bitmap word `first` on
/// (neighbouring CTAs start apart), each claimed once at most.
DHISPARSE_HOST_DEVICE inline share_job find_group(pass_share const& s, int batch, unsigned first)
{
  share_job job;
  int const words = (batch + 31) / 32;
  for (int i = 0; i < words; ++i) {
    int const w        = int((first + unsigned(i)) % unsigned(words));
    std::uint32_t bits = share_atomic(s.open(w)).load(cuda::memory_order_relaxed);
    for (; bits != 0; bits &= bits - 1) {
      int b = 0;
      while (((bits >> b) & 1u) == 0) { ++b; }
      b += w * 32;
      if (b >= batch) { break; }
      std::uint32_t const gen = share_atomic(s.claim(b)).load(cuda::memory_order_relaxed) >> 16;
      if (gen == 0) { continue; }
      int const g = claim_group(s, b, gen);
      if (g >= 0) { return {b, g, gen}; }
    }
  }
  return job;
}

// ---------------------------------------------------------------------------------------
// The CTA's parts
// ---------------------------------------------------------------------------------------

/// ORs a thread's status bits into the group's (`sh.group_flags`).
__device__ __forceinline__ void raise_group(shared_state& sh, std::uint32_t bits)
{
  if (bits) { atomicOr(&sh.group_flags, bits); }
}

/// Every thread: group g of request b's pass over its row `row` (p, and q when `dense`,
/// with k rejections: the masses S_1..S_k−1 in `sh.mass`): chunk masses and the group's
/// sums into the workspace, then the group counted done.
template <int Vec>
__device__ __noinline__ void run_group(verify_params const& a, layout const& l, shared_state& sh, pass_share const& s, int b,
                          int row, int k, bool dense, int g)
{
  if (threadIdx.x == 0) { sh.group_flags = 0; }
  float const* prow   = a.p + b * l.p_request + row * l.p_row;
  int const c0        = s.chunk_begin(g);
  int const c1        = s.chunk_begin(g + 1);
  std::uint64_t* out  = s.chunk_masses(b);
  pass_sums const sum = dense ? row_pass<Vec, true, 1>(sh, prow, a.q + b * l.q_request + row * l.q_row, k, a.vocab,
                                                       0, c0, c1, out)
                              : row_pass<Vec, false, 1>(sh, prow, nullptr, 0, a.vocab, 0, c0, c1, out);
  raise_group(sh, sum.flags);
  __threadfence();  // this thread's chunk masses, before the group is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    share_partial* part = s.partial(b, g);
    part->p             = sum.p;
    part->q             = sum.q;
    part->r             = sum.r;
    part->p_float       = sum.p_float;
    part->q_float       = sum.q_float;
    part->flags         = sh.group_flags;
    count_group_done(s, b);
  }
}

/**
 * @brief The owner's shared pass over request b's row `row` (every thread; `gen` ≥ 1, the
 *        request's pass number): publishes it, runs groups until none is left, waits for
 *        the others' and combines. Returns what `row_pass` + `combine_pass` return for the
 *        whole row (flags: thread 0 holds them all) and leaves the chunk masses in
 *        `sh.chunk`.
 */
template <int Vec>
__device__ __noinline__ pass_sums shared_row_pass(verify_params const& a, layout const& l, shared_state& sh, pass_share const& s,
                                     int b, int row, int k, bool dense, std::uint32_t gen)
{
  if (threadIdx.x == 0) {
    std::int32_t* d = s.desc(b);
    d[0]            = row;
    d[1]            = k;
    d[2]            = dense ? 1 : 0;
    for (int j = 1; j < k; ++j) { s.desc_masses(b)[j] = sh.mass[j]; }
    publish_pass(s, b, gen);
  }
  for (;;) {
    if (threadIdx.x == 0) { sh.job[0] = claim_group(s, b, gen); }
    __syncthreads();
    int const g = sh.job[0];
    __syncthreads();  // read before thread 0 claims again
    if (g < 0) { break; }
    run_group<Vec>(a, l, sh, s, b, row, k, dense, g);
  }
  pass_sums sum;
  if (threadIdx.x == 0) {
    while (!pass_done(s, b)) { __nanosleep(64); }
    std::uint64_t p = 0, q = 0, r = 0;
    float pf = 0.f, qf = 0.f;
    std::uint32_t flags = 0;
    for (int g = 0; g < s.groups; ++g) {  // group order: the fp32 sums have the same bits every time
      share_partial const* part = s.partial(b, g);
      p += __ldcg(&part->p);
      q += __ldcg(&part->q);
      r += __ldcg(&part->r);
      pf += __ldcg(&part->p_float);
      qf += __ldcg(&part->q_float);
      flags |= __ldcg(&part->flags);
    }
    sh.red[0][0] = p, sh.red[0][1] = q, sh.red[0][2] = r;
    sh.red_f[0] = pf, sh.red_f[1] = qf;
    sum.flags   = flags;
  }
  __syncthreads();
  std::uint64_t const* masses = s.chunk_masses(b);
  for (int c = threadIdx.x; c < s.nchunks; c += block_threads) { sh.chunk[c] = __ldcg(masses + c); }
  sum.p       = sh.red[0][0];
  sum.q       = sh.red[0][1];
  sum.r       = sh.red[0][2];
  sum.p_float = sh.red_f[0];
  sum.q_float = sh.red_f[1];
  __syncthreads();  // sh.red is reused by the caller's reductions
  return sum;
}

/**
 * @brief Every thread of a CTA that has finished its own request (or has none): claims and
 *        runs groups of other requests' shared passes until every request of the batch
 *        has finished (`batch`), or at once when some CTA of the grid has not started.
 */
template <int Vec>
__device__ __noinline__ void help_shared_passes(verify_params const& a, layout const& l, shared_state& sh, pass_share const& s,
                                   int batch)
{
  for (int idle = 0; idle < share_idle_polls;) {
    if (threadIdx.x == 0) {
      share_job job;
      bool const stop = helpers_stop(s, batch, gridDim.x);
      if (!stop) { job = find_group(s, batch, blockIdx.x / 32); }
      if (job.g >= 0) {  // the claim (acquire) orders these reads after the owner's descriptor
        std::int32_t const* d = s.desc(job.b);
        int const k           = __ldcg(d + 1);
        sh.job[1]             = __ldcg(d);
        sh.job[2]             = k;
        sh.job[3]             = __ldcg(d + 2);
        for (int j = 1; j < k; ++j) { sh.mass[j] = __ldcg(s.desc_masses(job.b) + j); }
      }
      sh.job[0] = stop ? -2 : job.g;
      sh.job[4] = job.b;
    }
    __syncthreads();
    int const g = sh.job[0], b = sh.job[4], row = sh.job[1], k = sh.job[2];
    bool const dense = sh.job[3] != 0;
    __syncthreads();
    if (g == -2) { return; }
    if (g < 0) {
      ++idle;
      if (threadIdx.x == 0) { __nanosleep(256); }
      continue;
    }
    idle = 0;
    run_group<Vec>(a, l, sh, s, b, row, k, dense, g);
  }
}

}  // namespace dhisparse::detail::verify
