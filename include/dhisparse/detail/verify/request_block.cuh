/**
 * @file detail/verify/request_block.cuh
 * @brief One request walked by one CTA or by each CTA of its cluster (`request_block`):
 *        probes, acceptance along the draft chain or tree, residual and bonus sampling,
 *        outputs; and `vector_width`.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/philox.hpp>
#include <dhisparse/detail/verify/cluster.cuh>
#include <dhisparse/detail/verify/cta.cuh>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/detail/verify/row_pass.cuh>
#include <dhisparse/detail/verify/shared_pass.cuh>
#include <dhisparse/detail/verify/tuning.hpp>
#include <dhisparse/status.hpp>
#include <dhisparse/verify_params.hpp>

#include <cstdint>

namespace dhisparse::detail::verify {

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

/// The call's batch size, `*a.batch_size` clamped to [0, capacity] (nullptr: capacity);
/// with `report`, an out-of-range value raises `bad_batch_size` in `*a.status`.
__device__ __forceinline__ int batch_of(verify_params const& a, bool report)
{
  int batch = a.batch_size ? *a.batch_size : a.capacity;
  if (batch < 0 || batch > a.capacity) {
    if (report) { atomicOr(a.status, verify_status::bad_batch_size); }
    batch = batch < 0 ? 0 : a.capacity;
  }
  return batch;
}

/**
 * @brief One request, walked by one CTA, or by each of the `Ctas` CTAs of its cluster
 *        (rank `rank`). Every thread runs the same control flow on values read from shared
 *        memory after a barrier; shared memory is written by one thread between two
 *        barriers. In a cluster every CTA walks the whole request and takes the same
 *        decisions: the full-row passes (argmax, row masses) are split between the CTAs
 *        and combined (cluster.cuh), everything else is computed in each CTA from the same
 *        inputs; rank 0 alone samples the final token and writes the outputs.
 */
template <int Vec, int Ctas>
class request_block {
 public:
  __device__ request_block(verify_params const& a, layout const& l, shared_state& sh, int b, int rank,
                           pass_tuning const& tuning, pass_share const& share)
    : a_{a}, l_{l}, sh_{sh}, b_{b}, rank_{rank}, tuning_{tuning}, share_{share}, chunk_len_{chunk_length(a.vocab)},
      nchunks_{chunk_count(a.vocab)}
  {
  }

  __device__ void run()
  {
    int const n = a_.num_drafts ? a_.num_drafts[b_] : a_.max_drafts;
    int len     = 0;
    if (load_request(n)) {
      if (a_.validate_all) { validate_rows(n); }
      __syncthreads();
      bool const valid = request_flags<Ctas>(sh_) == 0;
      __syncthreads();  // every thread has read the flags before the walk may raise more
      if (valid) { len = a_.rule == verify_rule::greedy ? walk_greedy() : walk_sampling(); }
    }
    __syncthreads();
    std::uint32_t const flags = request_flags<Ctas>(sh_);
    if (rank_ == 0) { write_outputs(len, flags, false); }
  }

  /// Outputs of a padding request (index ≥ batch size): empty, status 0.
  __device__ void write_padding()
  {
    if (rank_ == 0) { write_outputs(0, 0, true); }
  }

  /**
   * @brief The wide greedy path's checks of this request before its first row (wide.cuh;
   *        one CTA, `Ctas` = 1): the count, tree links and draft tokens, exactly as `run`
   *        checks them before a greedy walk. Returns true (every thread) when the request
   *        may be walked; otherwise writes its emptied outputs and status bits.
   */
  __device__ bool check_greedy()
  {
    int const n = a_.num_drafts ? a_.num_drafts[b_] : a_.max_drafts;
    load_request(n);
    __syncthreads();
    std::uint32_t const flags = sh_.flags;
    if (flags != 0) { write_outputs(0, flags, false); }
    return flags == 0;
  }

 private:
  /// Clears the status bits, then checks the count `n`, loads the structure and probes
  /// the drafted tokens. False (uniform) when the count or the tree links are unusable.
  __device__ bool load_request(int n)
  {
    if (threadIdx.x == 0) { sh_.flags = 0; }
    __syncthreads();
    if (n < 0 || n > a_.max_drafts) {
      if (threadIdx.x == 0) { raise(sh_, verify_status::bad_num_drafts); }
      return false;
    }
    if (!load_structure(n)) { return false; }
    probe(n);
    return true;
  }

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
    pass_sums s = row_pass<Vec, false, Ctas>(sh_, row, nullptr, 0, a_.vocab, rank_);
    combine_pass<Ctas>(sh_, s, nchunks_, rank_);
    std::uint32_t f = s.flags;
    if (threadIdx.x == 0) { f |= mass_flags(s, false, a_.sum_tolerance); }
    raise(sh_, is_q ? f << 3 : f);  // p bits → the matching q bits
    bytes_ += 4ull * std::uint64_t(a_.vocab);
  }

  /// Greedy: argmax of a row (largest value, smallest index among ties, NaN skipped); in a
  /// cluster each CTA takes every `Ctas`-th stretch of `block_threads · Vec` elements.
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
    constexpr int unroll    = 4;  // vectors per lane per step: 64 bytes with 16-byte loads
    std::int64_t const V    = a_.vocab;
    std::int64_t const step = std::int64_t(block_threads) * Vec * Ctas;
    // Threads u < unroll keep the next `prefetch_chunks_p` steps of this CTA's slice (piece
    // u of a step: block_threads · Vec elements at + u · step) on their way to L2.
    std::int64_t base = (std::int64_t(rank_) * block_threads + threadIdx.x) * Vec;
    std::int64_t ahead = std::int64_t(rank_) * block_threads * Vec + (int(threadIdx.x) + unroll) * step;
    auto prefetch_step = [&]() {  // the next step not yet prefetched (from step 1 on)
      if constexpr (Vec == 4 && prefetch_chunks_p > 0) {
        if (threadIdx.x < unroll && ahead < V) {
          prefetch_l2(p + ahead, 4 * min(std::int64_t(block_threads) * Vec, V - ahead));
        }
      }
      ahead += unroll * step;
    };
#pragma unroll
    for (int i = 1; i < prefetch_chunks_p; ++i) { prefetch_step(); }
    for (; base < V; base += unroll * step) {
      prefetch_step();
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
    warp_argmax(best, arg);
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
    combine_argmax<Ctas>(sh_, best, arg);
    bytes_ += 4ull * std::uint64_t(a_.vocab);  // the row, once: the cluster's CTAs read disjoint slices
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
    int const pass     = passes_++;
    pass_sums s;
    if (Ctas == 1 && share_.on() && pass >= tuning_.share_from) {
      s = shared_row_pass<Vec>(a_, l_, sh_, share_, b_, row, dense_q ? k : 0, dense_q, std::uint32_t(pass + 1));
    } else {
      s = dense_q ? row_pass<Vec, true, Ctas>(sh_, p_row(row), q_row(row), k, a_.vocab, rank_)
                  : row_pass<Vec, false, Ctas>(sh_, p_row(row), nullptr, 0, a_.vocab, rank_);
      combine_pass<Ctas>(sh_, s, nchunks_, rank_);
    }
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

  /// R_k at token i of the row of the last `residual_mass` (the chunk re-read), from p and
  /// q there; `patches` slots of `sh_.chunk_patches` hold every patch whose id is in the
  /// chunk of i.
  __device__ std::uint64_t residual_element(float p, float q, std::int64_t i, int patches) const
  {
    std::uint64_t P = fixed_of(p);
    if (dense_q_) { return residual_at(P, fixed_of(q), k_, sh_.mass); }
    for (int j = 0; j < patches; ++j) {
      int const slot = sh_.chunk_patches[j];
      if (sh_.patch_id[slot] == i) { P = sub_floor0(P, sh_.patch_delta[slot]); }
    }
    return P;
  }

  /**
   * @brief Warp 0: the smallest token i in [c0, c1) whose residual mass over [c0, i] exceeds
   *        `offset`, or -1. The warp reads the chunk in rounds of 32 consecutive elements
   *        (lane l: element l), issuing `batch` rounds' loads at once, and scans each round:
   *        a few load latencies per chunk, not one per element. Integer prefix sums are
   *        exact, so the token is the one a sequential scan finds.
   */
  __device__ __noinline__ std::int32_t search_chunk(int row, std::int64_t c0, std::int64_t c1, std::uint64_t offset,
                                                    int patches) const
  {
    constexpr int batch = 4;
    int const lane      = threadIdx.x & 31;
    float const* prow   = p_row(row);
    float const* qrow   = dense_q_ ? q_row(row) : nullptr;
    std::uint64_t acc   = 0;  // residual mass of [c0, base)
    for (std::int64_t base = c0; base < c1; base += 32 * batch) {
      float pv[batch], qv[batch];
#pragma unroll
      for (int j = 0; j < batch; ++j) {
        std::int64_t const i = base + j * 32 + lane;
        pv[j]                = i < c1 ? prow[i] : 0.f;
        qv[j]                = qrow != nullptr && i < c1 ? qrow[i] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < batch; ++j) {
        std::int64_t const i      = base + j * 32 + lane;
        std::uint64_t const r     = i < c1 ? residual_element(pv[j], qv[j], i, patches) : 0;
        std::uint64_t const incl  = acc + warp_inclusive_sum(r);
        unsigned const past       = __ballot_sync(0xFFFFFFFFu, incl > offset);
        if (past != 0) { return std::int32_t(base + j * 32 + __ffs(int(past)) - 1); }
        acc = __shfl_sync(0xFFFFFFFFu, incl, 31);
      }
    }
    return -1;
  }

  /// Warp 0: the patch slots whose id lies in [i0, i1), in slot order, into
  /// `sh_.chunk_patches` (so the element loop of `locate` tests those few, not all K).
  /// Returns their count (every lane).
  __device__ int chunk_patches(std::int64_t i0, std::int64_t i1)
  {
    int const lane = threadIdx.x & 31;
    int count      = 0;
    for (int j0 = 0; j0 < patches_; j0 += 32) {
      int const j           = j0 + lane;
      std::int32_t const id = j < patches_ ? sh_.patch_id[j] : -1;
      bool const in         = id >= i0 && id < i1;
      unsigned const inside = __ballot_sync(0xFFFFFFFFu, in);
      if (in) { sh_.chunk_patches[count + __popc(inside & ((1u << lane) - 1u))] = j; }
      count += __popc(inside);
    }
    __syncwarp();
    return count;
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
          if constexpr (Vec == 4 && prefetch_chunks_p > 0) {  // to L2 now: warp 0's loads below hit it
            std::int64_t const start = std::int64_t(c) * chunk_len_;
            std::int64_t const bytes = 4 * min(chunk_len_, std::int64_t(a_.vocab) - start);
            prefetch_l2(p_row(row) + start, bytes);
            if (dense_q_) { prefetch_l2(q_row(row) + start, bytes); }
          }
          break;
        }
        acc += sh_.chunk[c];
      }
    }
    __syncthreads();
    int const chunk = sh_.found_chunk;
    if (chunk >= 0 && threadIdx.x < 32) {
      std::int64_t const c0 = std::int64_t(chunk) * chunk_len_;
      std::int64_t const c1 = min(c0 + chunk_len_, std::int64_t(a_.vocab));
      int const patches     = dense_q_ ? 0 : chunk_patches(c0, c1);
      std::int32_t const t  = search_chunk(row, c0, c1, sh_.found_offset, patches);
      if (threadIdx.x == 0) { sh_.found_token = t; }
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
      } else if (rank_ == 0) {  // the last step: only the CTA that writes the outputs needs the token
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
  int rank_;  ///< of this CTA in the request's cluster (0 without one)
  pass_tuning tuning_;
  pass_share const& share_;  ///< shared passes (one CTA per request only; off: `on()` false)
  int passes_ = 0;  ///< sampling passes so far
  std::int64_t chunk_len_;
  int nchunks_;
  int patches_   = 0;
  int k_         = 0;
  bool dense_q_  = false;
  std::uint64_t bytes_ = 0;
};

}  // namespace dhisparse::detail::verify
