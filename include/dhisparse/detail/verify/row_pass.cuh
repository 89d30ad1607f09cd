/**
 * @file detail/verify/row_pass.cuh
 * @brief A pass over one vocabulary row of p (and q): element arithmetic in fixed point, the
 *        streaming loads, the per-chunk masses a sampling search re-reads, and the status
 *        bits of the row masses.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/cta.cuh>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/status.hpp>
#include <dhisparse/verify_params.hpp>

#include <cstdint>
#include <type_traits>

namespace dhisparse::detail::verify {

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

/// R_k at one element (k ≥ 1): P minus, for each earlier rejection s, S_s·Q (floored at
/// 0). S_0 is always 1 (`fixed_one`: the walk's nominal first mass), for which the step is
/// one subtraction (`mul_fixed(fixed_one, Q)` is Q), so only k − 1 steps multiply.
__device__ __forceinline__ std::uint64_t residual_at(std::uint64_t P, std::uint64_t Q, int k,
                                                     std::uint64_t const* mass)
{
  P = sub_floor0(P, Q);
  for (int s = 1; s < k; ++s) { P = residual_step(P, mass[s], Q); }
  return P;
}

/// Asks the memory system to bring `bytes` bytes at `ptr` (16-byte aligned, a multiple of
/// 16, inside one allocation) into L2 without waiting and without registers (sm_90 bulk
/// prefetch, `cp.async.bulk.prefetch.L2`); elsewhere a no-op. A hint: the loads that
/// follow read the same bytes whether or not it was honoured.
__device__ __forceinline__ void prefetch_l2(float const* ptr, std::int64_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(ptr)),
               "r"(static_cast<std::uint32_t>(bytes)));
#else
  (void)ptr, (void)bytes;
#endif
}

#ifndef DHISPARSE_VERIFY_PREFETCH_CHUNKS
/// Chunks of a row pass over p alone that each warp keeps prefetched into L2 ahead of the
/// chunk it loads (`prefetch_chunks_p`); 0, the default, turns the prefetch off: on the
/// H200 (2026-12-04, docs/benchmarks.md "verify") 2 chunks made 6 of 9 configurations
/// slower (chain dense q 53.7% → 49.3% of HBM bandwidth) and sped up only `validate_all`.
#define DHISPARSE_VERIFY_PREFETCH_CHUNKS 0
#endif

/// Chunks a warp of a pass over p alone keeps prefetched into L2 ahead of the chunk it
/// loads (2 KB each at V ≤ 1 M): with 256 threads × 64 bytes of loads in flight per CTA, a
/// CTA that reads a row alone (the last requests of a call, a long greedy path) is bound by
/// that latency; the prefetch keeps another 32 KB per CTA on its way to L2 (16 MB for 512
/// CTAs, a third of the H200's L2), so the loads hit L2. A pass over p and q prefetches
/// half as many chunks of each row (the same bytes). Prefetching needs 16-byte aligned
/// rows (`Vec` = 4).
inline constexpr int prefetch_chunks_p = DHISPARSE_VERIFY_PREFETCH_CHUNKS;
static_assert(prefetch_chunks_p >= 0, "DHISPARSE_VERIFY_PREFETCH_CHUNKS must be >= 0");

/// Accumulators of one pass.
struct pass_sums {
  std::uint64_t p = 0, q = 0, r = 0;  ///< fixed-point masses of p, q and R_k
  float p_float = 0.f, q_float = 0.f;  ///< sums of the same clamped values in fp32: wrap-around guard
  std::uint32_t flags = 0;
};

/// Streaming 16-byte / 4-byte loads that do not keep the row in L1 or L2: `per_unit`
/// vectors per lane cover a 512-element unit. A pass over p alone issues a unit's loads
/// at once (64 bytes in flight per thread); a pass over p and q issues them in two
/// batches of half a unit of each row (the same bytes, bounded register use).
template <int Vec>
struct row_loader;

template <>
struct row_loader<4> {
  static constexpr int per_unit = 4;  // per lane: 4 × float4
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
  static constexpr int per_unit = 16;  // per lane: 16 scalars
  __device__ static std::int64_t index(std::int64_t unit, int j, int lane) { return unit + j * 32 + lane; }
  __device__ static void load(float const* row, std::int64_t i, std::int64_t vocab, float (&v)[1])
  {
    v[0] = i < vocab ? __ldcs(row + i) : 0.f;
  }
};
static_assert(row_loader<4>::per_unit * 4 * 32 == chunk_unit && row_loader<1>::per_unit * 32 == chunk_unit);

/**
 * @brief One pass over chunks [c_lo, c_hi) of a row, or over the slice of CTA `rank` of
 *        `Ctas` (its chunks: `chunk_owner`, cluster.cuh): the mass of every chunk of R_k
 *        into `chunk_out` (`sh.chunk`, or a shared pass's array in global memory), the
 *        totals of p, q and R_k, and the element status bits (per thread).
 *
 * `Mode` 0: R = P (no q read; candidate / one-hot corrections are applied to the chunk
 * masses afterwards); 1: R = max(0, P − Q), the chain case (k = 1, S_0 = 1); 2: k ≥ 1
 * rejections at a tree node, R_k by the recursion with the masses in `sh.mass`.
 * Integer sums wrap (cheaper than saturating); a wrap needs a row mass ≥ 4, which the
 * fp32 sums of the same clamped values expose (flagged as not normalized, as the host's
 * saturated mass is), so such a request's outputs are discarded. With R = P (mode 0) the
 * p mass is the sum of the chunk masses (the same integers, wrapping identically), so it
 * is not accumulated a second time per element.
 */
template <int Vec, int Mode, int Ctas>
__device__ __noinline__ pass_sums row_pass_impl(shared_state& sh, float const* prow, float const* qrow, int k,
                                                std::int64_t vocab, int rank, int c_lo, int c_hi,
                                                std::uint64_t* chunk_out)
{
  using loader           = row_loader<Vec>;
  constexpr bool with_q  = Mode != 0;
  constexpr int batches  = with_q ? 2 : 1;  // load batches per unit
  constexpr int loads    = loader::per_unit / batches;
  int const lane         = threadIdx.x & 31;
  int const warp         = threadIdx.x >> 5;
  std::int64_t const len = chunk_length(vocab);
  int const first         = c_lo + rank * block_warps + warp;  // this warp's chunks: first + i·stride
  int const stride        = Ctas * block_warps;
  constexpr int ahead     = with_q ? (prefetch_chunks_p + 1) / 2 : prefetch_chunks_p;
  auto prefetch_chunk     = [&](int c) {
    if constexpr (Vec == 4) {
      if (ahead > 0 && lane == 0 && c < c_hi) {
        std::int64_t const start = c * len;
        std::int64_t const bytes = 4 * min(len, vocab - start);
        prefetch_l2(prow + start, bytes);
        if constexpr (with_q) { prefetch_l2(qrow + start, bytes); }
      }
    }
  };
  for (int i = 1; i <= ahead; ++i) { prefetch_chunk(first + i * stride); }
  pass_sums s;
  for (int c = first; c < c_hi; c += stride) {
    std::uint64_t csum = 0;
    for (std::int64_t unit = c * len; unit < (c + 1) * len; unit += chunk_unit) {
#pragma unroll
      for (int batch = 0; batch < batches; ++batch) {
        float pv[loads][Vec];
        float qv[loads][Vec];
#pragma unroll
        for (int j = 0; j < loads; ++j) {
          std::int64_t const i = loader::index(unit, batch * loads + j, lane);
          loader::load(prow, i, vocab, pv[j]);
          if constexpr (with_q) { loader::load(qrow, i, vocab, qv[j]); }
        }
        // The elements' arithmetic, with (`Checked`) or without the clamping and the status
        // bits: a batch whose values all lie in [+0, 1] — their bits as unsigned integers at
        // most 1.0f's, one max per element — needs neither (clamp01 is the identity there
        // and element_flags 0), so the common case costs ~6 instructions per element
        // instead of ~11 (the loop was issue- and latency-bound: 50% SM throughput at 44%
        // of DRAM bandwidth, Nsight Compute, H200).
        auto accumulate = [&](auto checked) {
          constexpr bool Checked = decltype(checked)::value;
#pragma unroll
          for (int j = 0; j < loads; ++j) {
#pragma unroll
            for (int e = 0; e < Vec; ++e) {
              float const x = pv[j][e];
              if constexpr (Checked) { s.flags |= element_flags(x, false); }
              float const xc = Checked ? clamp01(x) : x;
              s.p_float += xc;
              std::uint64_t const P = __float2ull_rz(xc * 0x1p62f);
              std::uint64_t R       = P;
              if constexpr (with_q) {  // (mode 0: R = P, so Σ P is the sum of the chunk masses)
                s.p += P;
                float const y = qv[j][e];
                if constexpr (Checked) { s.flags |= element_flags(y, true); }
                float const yc = Checked ? clamp01(y) : y;
                s.q_float += yc;
                std::uint64_t const Q = __float2ull_rz(yc * 0x1p62f);
                s.q += Q;
                if constexpr (Mode == 1) {
                  R = sub_floor0(P, Q);
                } else {
                  R = residual_at(P, Q, k, sh.mass);
                }
              }
              csum += R;
            }
          }
        };
        std::uint32_t top = 0;  // largest bit pattern of the batch: ≤ 1.0f's iff all in [+0, 1]
#pragma unroll
        for (int j = 0; j < loads; ++j) {
#pragma unroll
          for (int e = 0; e < Vec; ++e) {
            top = max(top, __float_as_uint(pv[j][e]));
            if constexpr (with_q) { top = max(top, __float_as_uint(qv[j][e])); }
          }
        }
        if (top <= 0x3F800000u) {
          accumulate(std::false_type{});
        } else {
          accumulate(std::true_type{});
        }
      }
    }
    prefetch_chunk(c + (ahead + 1) * stride);  // chunk c's loads are done: keep `ahead` ahead
    csum = warp_sum(csum);
    if (lane == 0) { chunk_out[c] = csum; }
    s.r += csum;
  }
  // After warp_sum every lane holds its warp's R mass; keep lane 0's share only.
  if (lane != 0) { s.r = 0; }
  if constexpr (!with_q) { s.p = s.r; }  // the same integers as Σ P, wrapping identically
  block_sum3(sh, s.p, s.q, s.r);
  s.p_float = block_sum(sh, s.p_float);
  if constexpr (with_q) { s.q_float = block_sum(sh, s.q_float); }
  return s;
}

/// A pass over p alone (`DenseQ` false) or over p and q with k rejections; CTA `rank` of
/// `Ctas` reads its slice (the caller combines the CTAs' sums: `combine_pass`). By default
/// the whole row into `sh.chunk`; a group of a shared pass gives its chunks [c_lo, c_hi)
/// and where their masses go.
template <int Vec, bool DenseQ, int Ctas>
__device__ pass_sums row_pass(shared_state& sh, float const* prow, float const* qrow, int k,
                              std::int64_t vocab, int rank, int c_lo = 0, int c_hi = -1,
                              std::uint64_t* chunk_out = nullptr)
{
  if (c_hi < 0) { c_hi = chunk_count(vocab); }
  if (chunk_out == nullptr) { chunk_out = sh.chunk; }
  if constexpr (!DenseQ) {
    return row_pass_impl<Vec, 0, Ctas>(sh, prow, qrow, k, vocab, rank, c_lo, c_hi, chunk_out);
  } else {
    return k == 1 ? row_pass_impl<Vec, 1, Ctas>(sh, prow, qrow, k, vocab, rank, c_lo, c_hi, chunk_out)
                  : row_pass_impl<Vec, 2, Ctas>(sh, prow, qrow, k, vocab, rank, c_lo, c_hi, chunk_out);
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

}  // namespace dhisparse::detail::verify
