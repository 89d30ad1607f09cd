/**
 * @file detail/sparse_attention/combine_kernel.cuh
 * @brief Split-K combine: merges the normalized fp32 partial outputs and LSEs of the
 *        splits of one (b, q, head) into the bf16 output and the final LSE.
 *
 * `out = sum_s exp(lse_s - lse) * out_s` with `lse = log(sum_s exp(lse_s))`, splits taken
 * in order (deterministic). Splits without a valid entry have `lse_s = -inf` and weigh 0; if
 * every split is empty the output is 0 and the LSE -inf.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>
#include <dhisparse/sparse_attention_params.hpp>

#include <cstdint>

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail {

/**
 * @brief One CTA of `ValueDim / 4` threads per (b, q, head); grid = batch x num_queries x
 *        num_heads.
 * @tparam ValueDim output width (512 MLA, 128 MHA)
 */
template <int ValueDim>
DHISPARSE_KERNEL void __launch_bounds__(ValueDim / 4) combine_splits_kernel(kernel_args const a)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  params const& p = a.p;
  int block       = int(blockIdx.x);
  int const h     = block % p.num_heads;
  block          /= p.num_heads;
  int const q     = block % p.num_queries;
  int const b     = block / p.num_queries;
  if (b >= real_batch(p)) { return; }

  int const in_group = h % a.group;
  int const unit     = (h / a.group) * a.m_tiles + in_group / a.rows_per_unit;
  int const row      = in_group % a.rows_per_unit;
  std::int64_t const part0 =
    ((std::int64_t(b) * p.num_queries + q) * a.units_per_query + unit) * a.num_splits;

  float lse_max = -INFINITY;
  for (int s = 0; s < a.num_splits; ++s) {
    lse_max = fmaxf(lse_max, a.partial_lse[(part0 + s) * a.rows_per_unit + row]);
  }
  int const d = int(threadIdx.x) * 4;
  float4 acc  = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum   = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < a.num_splits; ++s) {
      std::int64_t const pr = (part0 + s) * a.rows_per_unit + row;
      float const w         = expf(a.partial_lse[pr] - lse_max);
      float4 const v        = *reinterpret_cast<float4 const*>(a.partial_out + pr * ValueDim + d);
      sum += w;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  }
  float const inv = sum > 0.f ? 1.f / sum : 0.f;
  bf16* out = p.out + std::int64_t(b) * p.out_stride_batch + std::int64_t(q) * p.out_stride_query +
              std::int64_t(h) * p.out_stride_head + d;
  *reinterpret_cast<std::uint32_t*>(out)     = pack_bf16x2(acc.x * inv, acc.y * inv);
  *reinterpret_cast<std::uint32_t*>(out + 2) = pack_bf16x2(acc.z * inv, acc.w * inv);
  if (threadIdx.x == 0 && p.lse != nullptr) {
    p.lse[std::int64_t(b) * p.lse_stride_batch + std::int64_t(q) * p.lse_stride_query + h] =
      sum > 0.f ? lse_max + logf(sum) : -INFINITY;
  }
#else
  (void)a;
#endif
}

}  // namespace dhisparse::sparse_attention::detail

#endif  // __CUDACC__
