/**
 * @file host/sparse_attention.hpp
 * @brief Reference sparse attention over slot tables (plain C++, no CUDA needed): the
 *        oracle the CUDA kernels are tested against, and a CPU fallback.
 *
 * Rows are dequantized exactly as `host::dequantize_row` does (fp8 value times its tile
 * scale, in float), and every dot product, the softmax and the weighted sum are computed in
 * double. `sparse_attention_exact` returns those doubles; `sparse_attention` applies the
 * device contract (bf16 output, fp32 LSE, rows b >= *batch_size untouched, status bit).
 */
#pragma once

#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/host/row_format.hpp>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace dhisparse::host {

namespace detail {

/// Key (`query_dim` floats) and value (`value_dim` floats) of KV head `kv_head` of one row.
template <class RowFormat>
void load_key_value(std::byte const* row, int kv_head, float* key, float* value)
{
  using traits = sparse_attention::format_traits<RowFormat>;
  if constexpr (traits::is_mla) {
    (void)kv_head;
    dequantize_row<RowFormat>(row, key);
    std::copy(key, key + traits::value_dim, value);
  } else {
    std::size_t const head_bytes = std::size_t(traits::query_dim) * sizeof(bf16);
    for (int i = 0; i < traits::query_dim; ++i) {
      bf16 k;
      bf16 v;
      std::memcpy(&k, row + RowFormat::k_offset + kv_head * head_bytes + i * sizeof(bf16), sizeof k);
      std::memcpy(&v, row + RowFormat::v_offset + kv_head * head_bytes + i * sizeof(bf16), sizeof v);
      key[i]   = bf16_to_float(k);
      value[i] = bf16_to_float(v);
    }
  }
}

/// Real batch size of a host call: `*batch_size` clamped to [0, batch], or `batch`.
inline int real_batch(sparse_attention::params const& p)
{
  if (p.batch_size == nullptr) { return p.batch; }
  return std::clamp(*p.batch_size, 0, p.batch);
}

}  // namespace detail

/**
 * @brief Exact (double) attention of every head of query (b, q).
 *
 * @tparam RowFormat a row format supported by `sparse_attention::format_traits`
 * @param p arguments with host pointers (`out`, `lse`, `batch_size` unused)
 * @param out `num_heads * value_dim` doubles, head-major
 * @param lse `num_heads` doubles (natural log; -inf when the selection has no valid entry)
 * @return the status bits for this selection (`status_invalid_slot` if an entry was
 *         neither -1 nor a slot id in [0, num_slots))
 */
template <class RowFormat>
std::uint32_t sparse_attention_exact(sparse_attention::params const& p, int b, int q, double* out,
                                     double* lse)
{
  using traits = sparse_attention::format_traits<RowFormat>;
  static_assert(traits::supported, "host::sparse_attention_exact: unsupported row format");
  constexpr int qd = traits::query_dim;
  constexpr int vd = traits::value_dim;

  std::int32_t const* selection = p.slots + b * p.slot_stride_batch + q * p.slot_stride_query;
  std::uint32_t status          = 0;
  std::vector<std::int64_t> chosen;
  for (int k = 0; k < p.top_k; ++k) {
    std::int32_t const s = selection[k];
    if (s >= 0 && s < p.num_slots) {
      chosen.push_back(s);
    } else if (s != -1) {
      status |= sparse_attention::status_invalid_slot;
    }
  }
  std::size_t const n = chosen.size();
  int const group     = p.num_heads / traits::kv_heads;
  std::vector<float> keys(n * qd);
  std::vector<float> values(n * vd);
  std::vector<double> scores(n);
  bf16 const* query = p.queries + b * p.query_stride_batch + q * p.query_stride_query;

  for (int kv_head = 0; kv_head < traits::kv_heads; ++kv_head) {
    for (std::size_t i = 0; i < n; ++i) {
      detail::load_key_value<RowFormat>(p.rows + chosen[i] * p.row_stride, kv_head, &keys[i * qd],
                                        &values[i * vd]);
    }
    for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      double* o = out + std::size_t(h) * vd;
      std::fill(o, o + vd, 0.0);
      if (n == 0) {
        lse[h] = -std::numeric_limits<double>::infinity();
        continue;
      }
      bf16 const* qh = query + h * p.query_stride_head;
      double m       = -std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < n; ++i) {
        double dot = 0.0;
        for (int d = 0; d < qd; ++d) { dot += double(bf16_to_float(qh[d])) * keys[i * qd + d]; }
        scores[i] = double(p.softmax_scale) * dot;
        m         = std::max(m, scores[i]);
      }
      double sum = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        double const e = std::exp(scores[i] - m);
        sum += e;
        for (int d = 0; d < vd; ++d) { o[d] += e * values[i * vd + d]; }
      }
      for (int d = 0; d < vd; ++d) { o[d] /= sum; }
      lse[h] = m + std::log(sum);
    }
  }
  return status;
}

/**
 * @brief Reference of `sparse_attention::run` with host pointers: writes `out` (bf16,
 *        round to nearest even) and `lse` (float, if non-null) for every b < real batch
 *        size, leaves the other rows untouched, ORs status bits into `*status` (if non-null).
 *        Throws `dhisparse::error` on arguments `sparse_attention::check` rejects.
 */
template <class RowFormat>
void sparse_attention(sparse_attention::params const& p)
{
  using traits = sparse_attention::format_traits<RowFormat>;
  sparse_attention::validate<RowFormat>(p);
  std::vector<double> out(std::size_t(p.num_heads) * traits::value_dim);
  std::vector<double> lse(std::size_t(p.num_heads));
  std::uint32_t status = 0;
  int const batch      = detail::real_batch(p);
  for (int b = 0; b < batch; ++b) {
    for (int q = 0; q < p.num_queries; ++q) {
      status |= sparse_attention_exact<RowFormat>(p, b, q, out.data(), lse.data());
      for (int h = 0; h < p.num_heads; ++h) {
        bf16* o = p.out + b * p.out_stride_batch + q * p.out_stride_query + h * p.out_stride_head;
        for (int d = 0; d < traits::value_dim; ++d) {
          o[d] = float_to_bf16(float(out[std::size_t(h) * traits::value_dim + d]));
        }
        if (p.lse != nullptr) {
          p.lse[b * p.lse_stride_batch + q * p.lse_stride_query + h] = float(lse[h]);
        }
      }
    }
  }
  if (p.status != nullptr) { *p.status |= status; }
}

}  // namespace dhisparse::host
