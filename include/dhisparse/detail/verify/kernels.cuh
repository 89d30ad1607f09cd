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
#include <dhisparse/detail/philox.hpp>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/verify_params.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse::detail::verify {

inline constexpr int block_threads = 256;
inline constexpr int block_warps   = block_threads / 32;
inline constexpr int max_nodes     = max_verify_drafts + 1;
inline constexpr int max_patches   = max_nodes > max_verify_candidates ? max_nodes : max_verify_candidates;
static_assert(max_verify_drafts <= block_threads, "one thread per draft node when probing");

/// Per-CTA state. ~39 KB: under the 48 KB of static shared memory.
struct shared_state {
  std::uint64_t chunk[max_chunks];        ///< mass of each chunk of the row of the last pass
  std::uint64_t node_p[max_nodes];        ///< P at node m's token, from its parent's p row
  std::uint64_t node_q[max_nodes];        ///< Q at node m's token, from its parent's q row
  std::uint64_t mass[max_nodes];          ///< S_0..S_k of the node being expanded
  std::uint64_t patch_p[max_patches];     ///< candidates: P at the candidate
  std::uint64_t patch_q[max_patches];     ///< candidates: Q of the candidate
  std::uint64_t patch_delta[max_patches]; ///< P − R_k at the token: what the residual removes
  std::int32_t patch_id[max_patches];     ///< candidate ids / removed one-hot tokens
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
  std::uint64_t found_offset;
  std::int32_t found_chunk;
  std::int32_t found_token;
  std::uint32_t flags;
};

// ---------------------------------------------------------------------------------------
// Warp / block reductions (every thread returns the result)
// ---------------------------------------------------------------------------------------

__device__ __forceinline__ std::uint64_t warp_sum(std::uint64_t v)
{
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) { v += __shfl_xor_sync(0xFFFFFFFFu, v, off); }
  return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) { v += __shfl_xor_sync(0xFFFFFFFFu, v, off); }
  return v;
}

/// Inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ std::uint64_t warp_inclusive_scan(std::uint64_t v)
{
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    std::uint64_t const o = __shfl_up_sync(0xFFFFFFFFu, v, off);
    if (lane >= off) { v += o; }
  }
  return v;
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
  std::uint64_t const inclusive = warp_inclusive_scan(v);
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

// ---------------------------------------------------------------------------------------
// Element arithmetic of a pass
// ---------------------------------------------------------------------------------------

/// An element clamped to [0, 1], NaN → 0 (fmaxf returns the non-NaN operand).
__device__ __forceinline__ float clamp01(float x) { return fminf(fmaxf(x, 0.f), 1.f); }

/// Fixed point of an element; equals `to_fixed` for every input.
__device__ __forceinline__ std::uint64_t fixed_of(float x) { return __float2ull_rz(clamp01(x) * 0x1p62f); }

/// Status bits of an element, computed only off the fast path.
__device__ __forceinline__ std::uint32_t element_flags(float x, bool is_q)
{
  return (x >= 0.f && x <= 1.f) ? 0u : probability_flags(x, is_q);
}

/// R_k at one element: P minus, for each earlier rejection s, S_s·Q (floored at 0).
__device__ __forceinline__ std::uint64_t residual_at(std::uint64_t P, std::uint64_t Q, int k,
                                                     std::uint64_t const* mass)
{
  if (k == 1) { return sub_floor0(P, Q); }  // S_0 is 1: the chain case, one subtraction
  for (int s = 0; s < k; ++s) { P = residual_step(P, mass[s], Q); }
  return P;
}

/// Accumulators of one pass.
struct pass_sums {
  std::uint64_t p = 0, q = 0, r = 0;  ///< fixed-point masses of p, q and R_k
  float p_float = 0.f, q_float = 0.f;  ///< sums of the same clamped values in fp32: wrap-around guard
  std::uint32_t flags = 0;
};

/// Streaming 16-byte / 4-byte loads that do not keep the row in L1 or L2. A 512-element
/// unit is read in two halves of `loads` vectors per lane (bounded register use).
template <int Vec>
struct row_loader;

template <>
struct row_loader<4> {
  static constexpr int loads = 2;  // per lane per half unit: 2 × float4
  __device__ static std::int64_t index(std::int64_t unit, int j, int lane) { return unit + j * 128 + lane * 4; }
  __device__ static void load(float const* row, std::int64_t i, std::int64_t vocab, float (&v)[4])
  {
    if (i < vocab) {
      float4 const x = __ldcs(reinterpret_cast<float4 const*>(row + i));
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
      v[0] = v[1] = v[2] = v[3] = 0.f;
    }
  }
};

template <>
struct row_loader<1> {
  static constexpr int loads = 8;  // per lane per half unit: 8 scalars
  __device__ static std::int64_t index(std::int64_t unit, int j, int lane) { return unit + j * 32 + lane; }
  __device__ static void load(float const* row, std::int64_t i, std::int64_t vocab, float (&v)[1])
  {
    v[0] = i < vocab ? __ldcs(row + i) : 0.f;
  }
};
static_assert(2 * row_loader<4>::loads * 4 * 32 == chunk_unit && 2 * row_loader<1>::loads * 32 == chunk_unit);

/**
 * @brief One pass over a row: the mass of every chunk of R_k into `sh.chunk`, the totals
 *        of p, q and R_k, and the element status bits (per thread).
 *
 * `Mode` 0: R = P (no q read; candidate / one-hot corrections are applied to the chunk
 * masses afterwards); 1: R = max(0, P − Q), the chain case (k = 1, S_0 = 1); 2: k ≥ 1
 * rejections at a tree node, R_k by the recursion with the masses in `sh.mass`.
 * Integer sums wrap (cheaper than saturating); a wrap needs a row mass ≥ 4, which the
 * fp32 sums of the same clamped values expose (flagged as not normalized, as the host's
 * saturated mass is), so such a request's outputs are discarded.
 */
template <int Vec, int Mode>
__device__ __noinline__ pass_sums row_pass_impl(shared_state& sh, float const* prow, float const* qrow, int k,
                                   std::int64_t vocab)
{
  using loader           = row_loader<Vec>;
  constexpr bool with_q  = Mode != 0;
  int const lane         = threadIdx.x & 31;
  int const warp         = threadIdx.x >> 5;
  std::int64_t const len = chunk_length(vocab);
  int const nchunks      = int((vocab + len - 1) / len);
  pass_sums s;
  for (int c = warp; c < nchunks; c += block_warps) {
    std::uint64_t csum = 0;
    for (std::int64_t unit = c * len; unit < (c + 1) * len; unit += chunk_unit) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float pv[loader::loads][Vec];
        float qv[loader::loads][Vec];
#pragma unroll
        for (int j = 0; j < loader::loads; ++j) {
          std::int64_t const i = loader::index(unit, half * loader::loads + j, lane);
          loader::load(prow, i, vocab, pv[j]);
          if constexpr (with_q) { loader::load(qrow, i, vocab, qv[j]); }
        }
#pragma unroll
        for (int j = 0; j < loader::loads; ++j) {
#pragma unroll
          for (int e = 0; e < Vec; ++e) {
            float const x = pv[j][e];
            s.flags |= element_flags(x, false);
            float const xc = clamp01(x);
            s.p_float += xc;
            std::uint64_t const P = __float2ull_rz(xc * 0x1p62f);
            s.p += P;
            std::uint64_t R = P;
            if constexpr (with_q) {
              float const y = qv[j][e];
              s.flags |= element_flags(y, true);
              float const yc = clamp01(y);
              s.q_float += yc;
              std::uint64_t const Q = __float2ull_rz(yc * 0x1p62f);
              s.q += Q;
              if constexpr (Mode == 1) {
                R = sub_floor0(P, Q);
              } else {
                for (int r = 0; r < k; ++r) { R = residual_step(R, sh.mass[r], Q); }
              }
            }
            csum += R;
          }
        }
      }
    }
    csum = warp_sum(csum);
    if (lane == 0) { sh.chunk[c] = csum; }
    s.r += csum;
  }
  // After warp_sum every lane holds its warp's R mass; keep lane 0's share only.
  if (lane != 0) { s.r = 0; }
  block_sum3(sh, s.p, s.q, s.r);
  s.p_float = block_sum(sh, s.p_float);
  if constexpr (with_q) { s.q_float = block_sum(sh, s.q_float); }
  return s;
}

/// A pass over p alone (`DenseQ` false) or over p and q with k rejections.
template <int Vec, bool DenseQ>
__device__ pass_sums row_pass(shared_state& sh, float const* prow, float const* qrow, int k,
                              std::int64_t vocab)
{
  if constexpr (!DenseQ) {
    return row_pass_impl<Vec, 0>(sh, prow, qrow, k, vocab);
  } else {
    return k == 1 ? row_pass_impl<Vec, 1>(sh, prow, qrow, k, vocab)
                  : row_pass_impl<Vec, 2>(sh, prow, qrow, k, vocab);
  }
}

/// Status bits of a pass's row masses (p, and q when it was read).
__device__ __forceinline__ std::uint32_t mass_flags(pass_sums const& s, bool with_q, float tolerance)
{
  std::uint32_t f = 0;
  if (!(s.p_float <= 2.f) || !mass_is_one(s.p, tolerance)) { f |= verify_status::p_not_normalized; }
  if (with_q && (!(s.q_float <= 2.f) || !mass_is_one(s.q, tolerance))) {
    f |= verify_status::q_not_normalized;
  }
  return f;
}

// ---------------------------------------------------------------------------------------
// The request
// ---------------------------------------------------------------------------------------

/// Whether a call can use 16-byte loads (every row start 16-byte aligned, V % 4 == 0).
inline int vector_width(verify_params const& a)
{
  layout const l = layout::of(a);
  auto aligned   = [](void const* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  bool ok        = a.vocab % 4 == 0;
  if (a.p) { ok = ok && aligned(a.p) && l.p_row % 4 == 0 && l.p_request % 4 == 0; }
  if (a.rule == verify_rule::sampling && a.distribution == draft_distribution::dense && a.q) {
    ok = ok && aligned(a.q) && l.q_row % 4 == 0 && l.q_request % 4 == 0;
  }
  return ok ? 4 : 1;
}

/**
 * @brief One request, walked by one CTA. Every thread runs the same control flow on
 *        values read from shared memory after a barrier; shared memory is written by one
 *        thread between two barriers.
 */
template <int Vec>
class request_block {
 public:
  __device__ request_block(verify_params const& a, layout const& l, shared_state& sh, int b)
    : a_{a}, l_{l}, sh_{sh}, b_{b}, chunk_len_{chunk_length(a.vocab)},
      nchunks_{int((a.vocab + chunk_len_ - 1) / chunk_len_)}
  {
  }

  __device__ void run()
  {
    int const n = a_.num_drafts ? a_.num_drafts[b_] : a_.max_drafts;
    if (threadIdx.x == 0) { sh_.flags = 0; }
    __syncthreads();
    int len = 0;
    if (n < 0 || n > a_.max_drafts) {
      if (threadIdx.x == 0) { raise(sh_, verify_status::bad_num_drafts); }
    } else if (load_structure(n)) {
      probe(n);
      if (a_.validate_all) { validate_rows(n); }
      __syncthreads();
      bool const valid = sh_.flags == 0;
      __syncthreads();  // every thread has read the flags before the walk may raise more
      if (valid) { len = a_.rule == verify_rule::greedy ? walk_greedy() : walk_sampling(); }
    }
    __syncthreads();
    write_outputs(len, sh_.flags, false);
  }

  /// Outputs of a padding request (index ≥ batch size): empty, status 0.
  __device__ void write_padding() { write_outputs(0, 0, true); }

 private:
  __device__ float const* p_row(int m) const { return a_.p + b_ * l_.p_request + m * l_.p_row; }
  __device__ float const* q_row(int m) const { return a_.q + b_ * l_.q_request + m * l_.q_row; }
  __device__ std::int64_t candidate_base(int m) const
  {
    return (b_ * l_.rows_q + m) * std::int64_t(a_.num_candidates);
  }

  /// Node tokens and links into shared memory; checks a tree's links. Uniform result.
  __device__ bool load_structure(int n)
  {
    int const d     = a_.max_drafts;
    bool const tree = a_.topology == draft_topology::tree;
    for (int m = threadIdx.x; m <= n; m += block_threads) { sh_.refs[m] = 0; }
    __syncthreads();
    std::uint32_t f = 0;
    for (int m = threadIdx.x; m <= n; m += block_threads) {
      if (tree) {
        std::int64_t const base = std::int64_t(b_) * (d + 1);
        auto link               = [&](std::int32_t v) {
          if (v == -1) { return -1; }
          if (v <= m || v > d) {
            f |= verify_status::bad_tree;
            return -1;
          }
          if (v > n) { return -1; }  // pruned by num_drafts
          atomicAdd(&sh_.refs[v], 1);
          return int(v);
        };
        sh_.first_child[m]  = link(a_.first_child[base + m]);
        sh_.next_sibling[m] = m > 0 ? link(a_.next_sibling[base + m]) : -1;
        sh_.token[m]        = m > 0 ? a_.draft_tokens[base + m] : -1;
        sh_.parent[m]       = -1;
      } else {
        sh_.first_child[m]  = m < n ? m + 1 : -1;
        sh_.next_sibling[m] = -1;
        sh_.parent[m]       = m - 1;
        sh_.token[m]        = m > 0 ? a_.draft_tokens[std::int64_t(b_) * d + m - 1] : -1;
      }
    }
    raise(sh_, f);
    __syncthreads();
    if (!tree) { return true; }
    f = 0;
    for (int m = threadIdx.x + 1; m <= n; m += block_threads) {
      if (sh_.refs[m] != 1) { f |= verify_status::bad_tree; }
    }
    raise(sh_, f);
    __syncthreads();
    if (sh_.flags & verify_status::bad_tree) { return false; }
    for (int m = threadIdx.x; m <= n; m += block_threads) {
      for (int c = sh_.first_child[m]; c != -1; c = sh_.next_sibling[c]) { sh_.parent[c] = m; }
    }
    __syncthreads();
    return true;
  }

  /// p and q at every draft token, all nodes at once (the acceptance tests need nothing
  /// else); token ids are checked here.
  __device__ void probe(int n)
  {
    bool const sampling = a_.rule == verify_rule::sampling;
    std::uint32_t f     = 0;
    for (int m = threadIdx.x + 1; m <= n; m += block_threads) {
      std::int32_t const x = sh_.token[m];
      if (x < 0 || x >= a_.vocab) {
        f |= verify_status::bad_draft_token;
        sh_.node_p[m] = 0;
        sh_.node_q[m] = 0;
        continue;
      }
      if (!sampling) { continue; }
      int const par  = sh_.parent[m];
      float const pv = p_row(par)[x];
      f |= probability_flags(pv, false);
      sh_.node_p[m] = to_fixed(pv);
      if (a_.distribution == draft_distribution::dense) {
        float const qv = q_row(par)[x];
        f |= probability_flags(qv, true);
        std::uint64_t const Q = to_fixed(qv);
        if (Q == 0) { f |= verify_status::draft_not_in_q; }
        sh_.node_q[m] = Q;
      } else if (a_.distribution == draft_distribution::one_hot) {
        sh_.node_q[m] = fixed_one;
      }
    }
    raise(sh_, f);
    if (sampling && a_.distribution == draft_distribution::candidates) {
      int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      int const K    = a_.num_candidates;
      for (int m = warp + 1; m <= n; m += block_warps) {
        std::int32_t const x = sh_.token[m];
        if (x < 0 || x >= a_.vocab) { continue; }
        std::int64_t const base = candidate_base(sh_.parent[m]);
        int found               = -1;
        for (int j0 = 0; j0 < K && found < 0; j0 += 32) {
          int const j             = j0 + lane;
          std::int32_t const id   = j < K ? a_.candidate_ids[base + j] : -1;
          unsigned const matches  = __ballot_sync(0xFFFFFFFFu, id == x);
          if (matches) { found = j0 + __ffs(int(matches)) - 1; }
        }
        if (lane == 0) {
          std::uint64_t Q   = 0;
          std::uint32_t fq  = 0;
          if (found >= 0) {
            float const qv = a_.candidate_probs[base + found];
            fq |= probability_flags(qv, true);
            Q = to_fixed(qv);
          }
          if (Q == 0) { fq |= verify_status::draft_not_in_q; }
          sh_.node_q[m] = Q;
          raise(sh_, fq);
        }
      }
    }
    __syncthreads();
  }

  /// `validate_all`: every row the request could use, read and checked in full.
  __device__ void validate_rows(int n)
  {
    if (a_.rule == verify_rule::greedy) {
      if (a_.target_tokens) {
        std::uint32_t f = 0;
        for (int m = threadIdx.x; m <= n; m += block_threads) {
          std::int32_t const t = a_.target_tokens[std::int64_t(b_) * (a_.max_drafts + 1) + m];
          if (t < 0 || t >= a_.vocab) { f |= verify_status::bad_target_token; }
        }
        raise(sh_, f);
      } else {
        for (int m = 0; m <= n; ++m) { block_argmax(m); }
      }
      return;
    }
    for (int m = 0; m <= n; ++m) { check_row(p_row(m), false); }
    for (int m = 0; m <= n; ++m) {
      if (sh_.first_child[m] == -1) { continue; }
      if (a_.distribution == draft_distribution::dense) {
        check_row(q_row(m), true);
      } else if (a_.distribution == draft_distribution::candidates) {
        load_candidates(m, 0);
        bytes_ += 8ull * std::uint64_t(a_.num_candidates);
      }
    }
  }

  /// Element and mass checks of one p or q row (a pass whose results are dropped).
  __device__ void check_row(float const* row, bool is_q)
  {
    pass_sums const s = row_pass<Vec, false>(sh_, row, nullptr, 0, a_.vocab);
    std::uint32_t f   = s.flags;
    if (threadIdx.x == 0) { f |= mass_flags(s, false, a_.sum_tolerance); }
    raise(sh_, is_q ? f << 3 : f);  // p bits → the matching q bits
    bytes_ += 4ull * std::uint64_t(a_.vocab);
  }

  /// Greedy: argmax of a row (largest value, smallest index among ties, NaN skipped).
  __device__ __noinline__ std::int32_t block_argmax(int row)
  {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float const* p = p_row(row);
    float best     = -__int_as_float(0x7F800000);
    std::int32_t arg = 0x7FFFFFFF;
    std::uint32_t f  = 0;
    auto consider    = [&](float x, std::int32_t i) {
      if (x != x) {
        f |= verify_status::p_not_finite;
      } else if (x > best || (x == best && i < arg)) {
        best = x;
        arg  = i;
      }
    };
    constexpr int unroll   = 4;
    std::int64_t const V   = a_.vocab;
    std::int64_t const step = std::int64_t(block_threads) * Vec;
    for (std::int64_t base = std::int64_t(threadIdx.x) * Vec; base < V; base += unroll * step) {
      float v[unroll][Vec];
#pragma unroll
      for (int u = 0; u < unroll; ++u) { row_loader<Vec>::load(p, base + u * step, V, v[u]); }
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
#pragma unroll
        for (int e = 0; e < Vec; ++e) {
          std::int64_t const i = base + u * step + e;
          if (i < V) { consider(v[u][e], std::int32_t(i)); }
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      float const ob        = __shfl_xor_sync(0xFFFFFFFFu, best, off);
      std::int32_t const oa = __shfl_xor_sync(0xFFFFFFFFu, arg, off);
      if (ob > best || (ob == best && oa < arg)) {
        best = ob;
        arg  = oa;
      }
    }
    if (lane == 0) {
      sh_.red_f[warp] = best;
      sh_.red_i[warp] = arg;
    }
    raise(sh_, f);
    __syncthreads();
    best = sh_.red_f[0];
    arg  = sh_.red_i[0];
    for (int w = 1; w < block_warps; ++w) {
      if (sh_.red_f[w] > best || (sh_.red_f[w] == best && sh_.red_i[w] < arg)) {
        best = sh_.red_f[w];
        arg  = sh_.red_i[w];
      }
    }
    __syncthreads();
    bytes_ += 4ull * std::uint64_t(a_.vocab);
    return arg == 0x7FFFFFFF ? -1 : arg;
  }

  __device__ int walk_greedy()
  {
    int cur = 0, len = 0;
    for (;;) {
      std::int32_t t;
      if (a_.target_tokens) {
        t = a_.target_tokens[std::int64_t(b_) * (a_.max_drafts + 1) + cur];
        if (t < 0 || t >= a_.vocab) {
          if (threadIdx.x == 0) { raise(sh_, verify_status::bad_target_token); }
          t = -1;
        }
      } else {
        t = block_argmax(cur);
      }
      int c = sh_.first_child[cur];
      while (c != -1 && sh_.token[c] != t) { c = sh_.next_sibling[c]; }
      if (threadIdx.x == 0) {
        sh_.out_tokens[len] = t;
        if (c != -1 && t >= 0) { sh_.out_nodes[len] = c; }
      }
      ++len;
      if (c == -1 || t < 0) { return len; }
      cur = c;
    }
  }

  /**
   * @brief Candidate row of node `row` into the patch arrays, checked; each slot's delta
   *        is P − R_k at its id (what k rejections remove there). Returns the slot count.
   */
  __device__ int load_candidates(int row, int k)
  {
    int const K             = a_.num_candidates;
    std::int64_t const base = candidate_base(row);
    std::uint32_t f         = 0;
    std::uint64_t qmass     = 0;
    float qfloat            = 0.f;
    __syncthreads();  // earlier readers of the patch arrays are done
    for (int j = threadIdx.x; j < K; j += block_threads) {
      std::int32_t id = a_.candidate_ids[base + j];
      std::uint64_t Q = 0, P = 0;
      if (id != -1 && (id < 0 || id >= a_.vocab)) {
        f |= verify_status::bad_candidates;
        id = -1;
      }
      if (id != -1) {
        float const pr = a_.candidate_probs[base + j];
        f |= probability_flags(pr, true);
        Q = to_fixed(pr);
        qmass += Q;
        qfloat += clamp01(pr);
        P = to_fixed(p_row(row)[id]);
      }
      sh_.patch_id[j] = id;
      sh_.patch_q[j]  = Q;
      sh_.patch_p[j]  = P;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < K; j += block_threads) {
      std::int32_t const id = sh_.patch_id[j];
      if (id != -1) {
        for (int i = 0; i < j; ++i) {
          if (sh_.patch_id[i] == id) { f |= verify_status::bad_candidates; }
        }
      }
      std::uint64_t R = sh_.patch_p[j];
      for (int s = 0; s < k; ++s) { R = residual_step(R, sh_.mass[s], sh_.patch_q[j]); }
      sh_.patch_delta[j] = sh_.patch_p[j] - R;
    }
    std::uint64_t unused0 = 0, unused1 = 0;
    block_sum3(sh_, qmass, unused0, unused1);
    qfloat = block_sum(sh_, qfloat);
    if (threadIdx.x == 0 && (!(qfloat <= 2.f) || !mass_is_one(qmass, a_.sum_tolerance))) {
      f |= verify_status::q_not_normalized;
    }
    raise(sh_, f);
    __syncthreads();
    return K;
  }

  /**
   * @brief Mass of R_k over the row of node `row`; leaves the chunk masses of R_k in
   *        shared memory for `locate`. `removed`: one-hot tokens already in the patch
   *        arrays (their delta is their whole P).
   */
  __device__ std::uint64_t residual_mass(int row, int k, int removed)
  {
    bool const dense_q = a_.distribution == draft_distribution::dense && k > 0;
    bool const cands   = a_.distribution == draft_distribution::candidates && k > 0;
    patches_           = cands ? load_candidates(row, k) : removed;
    pass_sums const s  = dense_q ? row_pass<Vec, true>(sh_, p_row(row), q_row(row), k, a_.vocab)
                                 : row_pass<Vec, false>(sh_, p_row(row), nullptr, 0, a_.vocab);
    std::uint32_t f    = s.flags;
    if (threadIdx.x == 0) { f |= mass_flags(s, dense_q, a_.sum_tolerance); }
    raise(sh_, f);
    bytes_ += 4ull * std::uint64_t(a_.vocab) * (dense_q ? 2u : 1u) +
              (cands ? 8ull * std::uint64_t(a_.num_candidates) : 0ull);
    std::uint64_t total = s.r;
    if (patches_ > 0) {
      std::uint64_t removed_mass = 0, unused0 = 0, unused1 = 0;
      for (int j = threadIdx.x; j < patches_; j += block_threads) {
        std::int32_t const id    = sh_.patch_id[j];
        std::uint64_t const dl   = sh_.patch_delta[j];
        if (id >= 0 && dl > 0) {
          atomicAdd(reinterpret_cast<unsigned long long*>(&sh_.chunk[id / chunk_len_]),
                    static_cast<unsigned long long>(0ull - dl));
          removed_mass += dl;
        }
      }
      block_sum3(sh_, removed_mass, unused0, unused1);
      total -= removed_mass;
    }
    dense_q_ = dense_q;
    k_       = k;
    return total;
  }

  /// R_k at token i of the row of the last `residual_mass` (the chunk re-read).
  __device__ std::uint64_t residual_element(float const* prow, float const* qrow, std::int64_t i) const
  {
    std::uint64_t P = fixed_of(prow[i]);
    if (dense_q_) { return residual_at(P, fixed_of(qrow[i]), k_, sh_.mass); }
    for (int j = 0; j < patches_; ++j) {
      if (sh_.patch_id[j] == i) { P = sub_floor0(P, sh_.patch_delta[j]); }
    }
    return P;
  }

  /// Inverse-CDF sample from the chunk masses of the last `residual_mass`.
  __device__ std::int32_t locate(int row, std::uint64_t total, std::uint64_t bits)
  {
    std::uint64_t const target = sample_target(total, bits);
    if (threadIdx.x == 0) {
      sh_.found_chunk = -1;
      sh_.found_token = -1;
    }
    int const per = (nchunks_ + block_threads - 1) / block_threads;
    int const c0  = min(int(threadIdx.x) * per, nchunks_);
    int const c1  = min(c0 + per, nchunks_);
    std::uint64_t local = 0;
    for (int c = c0; c < c1; ++c) { local += sh_.chunk[c]; }
    std::uint64_t const before = block_exclusive_scan(sh_, local);
    if (local > 0 && target >= before && target - before < local) {
      std::uint64_t acc = before;
      for (int c = c0; c < c1; ++c) {
        if (target - acc < sh_.chunk[c]) {
          sh_.found_chunk  = c;
          sh_.found_offset = target - acc;
          break;
        }
        acc += sh_.chunk[c];
      }
    }
    __syncthreads();
    int const chunk = sh_.found_chunk;
    if (chunk >= 0 && threadIdx.x < 32) {
      int const lane          = threadIdx.x;
      float const* prow       = p_row(row);
      float const* qrow       = dense_q_ ? q_row(row) : nullptr;
      std::int64_t const span = chunk_len_ / 32;
      std::int64_t const i0   = min(std::int64_t(chunk) * chunk_len_ + lane * span, std::int64_t(a_.vocab));
      std::int64_t const i1   = min(i0 + span, std::int64_t(a_.vocab));
      std::uint64_t sum       = 0;
      for (std::int64_t i = i0; i < i1; ++i) { sum += residual_element(prow, qrow, i); }
      std::uint64_t const inclusive = warp_inclusive_scan(sum);
      std::uint64_t const offset    = sh_.found_offset;
      std::uint64_t acc             = inclusive - sum;
      if (sum > 0 && offset >= acc && offset - acc < sum) {
        for (std::int64_t i = i0; i < i1; ++i) {
          acc += residual_element(prow, qrow, i);
          if (acc > offset) {
            sh_.found_token = std::int32_t(i);
            break;
          }
        }
      }
    }
    __syncthreads();
    std::int32_t const t = sh_.found_token;
    if (chunk >= 0) {
      std::int64_t const len = min(chunk_len_, std::int64_t(a_.vocab) - std::int64_t(chunk) * chunk_len_);
      bytes_ += std::uint64_t(len) * 4u * (dense_q_ ? 2u : 1u);
    }
    if (t < 0 && threadIdx.x == 0) { raise(sh_, verify_status::p_not_normalized); }
    return t;
  }

  __device__ int walk_sampling()
  {
    std::uint64_t const seed   = a_.rng[0];
    std::uint64_t const offset = a_.rng[1];
    bool const one_hot         = a_.distribution == draft_distribution::one_hot;
    if (threadIdx.x == 0) { sh_.mass[0] = fixed_one; }
    __syncthreads();
    std::uint32_t event = 0;
    int cur = 0, len = 0;
    for (;;) {
      int masses = 1, rejected = 0, removed = 0, accepted = -1;
      std::uint64_t onehot_mass = fixed_one;
      for (int c = sh_.first_child[cur]; c != -1; c = sh_.next_sibling[c]) {
        std::int32_t const x  = sh_.token[c];
        std::uint64_t const P = sh_.node_p[c];
        std::uint64_t const Q = sh_.node_q[c];
        std::uint64_t R = P, D;
        if (one_hot) {
          for (int j = 0; j < removed; ++j) {
            if (sh_.patch_id[j] == x) { R = 0; }
          }
          D = onehot_mass;
        } else {
          if (masses <= rejected) {
            std::uint64_t const S = residual_mass(cur, rejected, 0);
            if (threadIdx.x == 0) { sh_.mass[masses] = S; }
            __syncthreads();
            ++masses;
          }
          for (int s = 0; s < rejected; ++s) { R = residual_step(R, sh_.mass[s], Q); }
          D = mul_fixed(sh_.mass[rejected], Q);
        }
        std::uint64_t const bits = philox_u64(seed, offset, std::uint32_t(b_), event++);
        if (accepts(R, D, bits)) {
          accepted = c;
          break;
        }
        ++rejected;
        if (one_hot && R > 0) {
          __syncthreads();
          if (threadIdx.x == 0) {
            sh_.patch_id[removed]    = x;
            sh_.patch_delta[removed] = R;
          }
          __syncthreads();
          ++removed;
          onehot_mass = sub_floor0(onehot_mass, R);
        }
      }
      if (accepted >= 0) {
        if (threadIdx.x == 0) {
          sh_.out_tokens[len] = sh_.token[accepted];
          sh_.out_nodes[len]  = accepted;
        }
        ++len;
        cur = accepted;
        continue;
      }
      // Every child rejected, or a leaf: sample from what is left of p.
      std::uint64_t const bits = philox_u64(seed, offset, std::uint32_t(b_), event++);
      int k                    = one_hot ? 0 : rejected;
      std::uint64_t total      = residual_mass(cur, k, one_hot ? removed : 0);
      if (total == 0 && patches_ + k > 0) {
        k     = 0;  // degenerate residual (q covers p up to rounding): sample from p
        total = residual_mass(cur, 0, 0);
      }
      std::int32_t t = -1;
      if (total == 0) {
        if (threadIdx.x == 0) { raise(sh_, verify_status::p_not_normalized); }
      } else {
        t = locate(cur, total, bits);
      }
      if (threadIdx.x == 0) { sh_.out_tokens[len] = t; }
      return len + 1;
    }
  }

  __device__ void write_outputs(int len, std::uint32_t flags, bool padding)
  {
    bool const ok       = !padding && flags == 0 && len > 0;
    int const width     = a_.max_drafts + 1;
    std::int64_t const b = b_;
    for (int j = threadIdx.x; j < width; j += block_threads) {
      a_.emitted[b * width + j] = ok && j < len ? sh_.out_tokens[j] : -1;
    }
    if (a_.accepted_nodes) {
      for (int j = threadIdx.x; j < a_.max_drafts; j += block_threads) {
        a_.accepted_nodes[b * a_.max_drafts + j] = ok && j < len - 1 ? sh_.out_nodes[j] : -1;
      }
    }
    if (threadIdx.x == 0) {
      a_.accepted[b]   = ok ? len - 1 : 0;
      a_.next_token[b] = ok ? sh_.out_tokens[len - 1] : -1;
      if (a_.request_status) { a_.request_status[b] = flags; }
      if (flags) { atomicOr(a_.status, flags); }
      if (ok && a_.bytes_read) {
        atomicAdd(reinterpret_cast<unsigned long long*>(a_.bytes_read),
                  static_cast<unsigned long long>(bytes_));
      }
    }
  }

  verify_params const& a_;
  layout const& l_;
  shared_state& sh_;
  int b_;
  std::int64_t chunk_len_;
  int nchunks_;
  int patches_   = 0;
  int k_         = 0;
  bool dense_q_  = false;
  std::uint64_t bytes_ = 0;
};

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
