/**
 * @file tests/sparse_attention/problem.hpp
 * @brief Random sparse attention problems for the host and GPU tests: non-zero queries and
 *        rows, slabs with several layers per slot (only one of them is the layer under test,
 *        the others are NaN bytes), and slot tables with duplicate-free random selections,
 *        overlapping selections across the queries of a request, -1 padding (scattered and
 *        trailing) and empty selections.
 */
#pragma once

#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/host/row_format.hpp>
#include <dhisparse/row_format.cuh>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace dhisparse::test {

/// Shape of a random problem.
struct attention_shape {
  int batch       = 1;
  int num_queries = 1;
  int num_heads   = 16;
  int top_k       = 64;
  int num_splits  = 0;
};

/// Host data of one problem; `params()` points into it (outputs left null).
template <class RowFormat>
struct attention_problem {
  using traits = sparse_attention::format_traits<RowFormat>;
  attention_shape shape;
  std::int64_t num_slots = 0;
  int layers             = 1;  ///< rows of a slot (layer group); stride = layers * row bytes
  int layer              = 0;  ///< the layer attended to
  float softmax_scale    = 0.f;
  std::vector<std::byte> slab;        ///< num_slots * row_stride
  std::vector<bf16> queries;          ///< [batch][queries][heads][query_dim]
  std::vector<std::int32_t> slots;    ///< [batch][queries][top_k]

  std::size_t row_stride() const { return std::size_t(layers) * RowFormat::bytes; }
  std::size_t rows_offset() const { return std::size_t(layer) * RowFormat::bytes; }

  /// Arguments with host pointers into this problem (out, lse, status, batch_size null).
  sparse_attention::params params() const
  {
    sparse_attention::params p;
    p.batch       = shape.batch;
    p.num_queries = shape.num_queries;
    p.num_heads   = shape.num_heads;
    p.top_k       = shape.top_k;
    p.num_splits  = shape.num_splits;
    sparse_attention::set_contiguous_strides<RowFormat>(p);
    p.queries       = queries.data();
    p.rows          = slab.data() + rows_offset();
    p.row_stride    = row_stride();
    p.num_slots     = num_slots;
    p.slots         = slots.data();
    p.softmax_scale = softmax_scale;
    return p;
  }
  std::size_t out_elems() const
  {
    return std::size_t(shape.batch) * shape.num_queries * shape.num_heads * traits::value_dim;
  }
  std::size_t lse_elems() const { return std::size_t(shape.batch) * shape.num_queries * shape.num_heads; }
};

namespace detail {

inline float normal(std::mt19937_64& rng) { return std::normal_distribution<float>(0.f, 1.f)(rng); }

/// One random row of format `F` (values never all zero; FP8 tiles of varied magnitude).
template <class F>
void random_row(std::mt19937_64& rng, std::byte* row)
{
  using traits = sparse_attention::format_traits<F>;
  if constexpr (traits::is_mla) {
    float values[F::dim];
    std::uniform_real_distribution<float> magnitude(0.5f, 2.f);
    for (int t = 0; t < F::dim / 64; ++t) {
      float const m = magnitude(rng);
      for (int i = 0; i < 64; ++i) { values[t * 64 + i] = m * normal(rng); }
    }
    host::quantize_row<F>(values, row);
  } else {
    std::size_t const n = F::bytes / sizeof(bf16);
    for (std::size_t i = 0; i < n; ++i) {
      bf16 const v = host::float_to_bf16(normal(rng));
      std::memcpy(row + i * sizeof(bf16), &v, sizeof v);
    }
  }
}

/// `count` distinct slot ids from [0, num_slots) in random order (partial Fisher-Yates).
inline std::vector<std::int32_t> distinct_slots(std::mt19937_64& rng, std::int64_t num_slots, int count)
{
  std::vector<std::int32_t> all(static_cast<std::size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  for (int i = 0; i < count; ++i) {
    std::uniform_int_distribution<std::int64_t> pick(i, num_slots - 1);
    std::swap(all[std::size_t(i)], all[std::size_t(pick(rng))]);
  }
  all.resize(std::size_t(count));
  return all;
}

}  // namespace detail

/**
 * @brief A random problem. Selections: the first query of a request draws K distinct
 *        slots; each further query replaces about 15% of them by other distinct slots and
 *        is shuffled (the overlap of consecutive verify positions). Each selection is then
 *        padded at random: none, about 30% scattered -1, a trailing run of -1, or (for the
 *        last (b, q) of problems with at least two selections) entirely -1.
 */
template <class F>
attention_problem<F> make_problem(std::mt19937_64& rng, attention_shape const& shape)
{
  using traits = sparse_attention::format_traits<F>;
  attention_problem<F> pb;
  pb.shape     = shape;
  pb.num_slots = std::int64_t(shape.top_k) * 2 + 37;
  std::uniform_int_distribution<int> layers(1, 3);
  pb.layers = layers(rng);
  pb.layer  = std::uniform_int_distribution<int>(0, pb.layers - 1)(rng);
  // Scale so that logits span several units: the online softmax has to rescale.
  pb.softmax_scale =
    std::uniform_real_distribution<float>(0.5f, 3.f)(rng) / std::sqrt(float(traits::query_dim));

  // Slab: every layer but the one under test is 0xFF (NaN in bf16, fp8 and fp32).
  pb.slab.assign(std::size_t(pb.num_slots) * pb.row_stride(), std::byte{0xFF});
  for (std::int64_t s = 0; s < pb.num_slots; ++s) {
    detail::random_row<F>(rng, pb.slab.data() + std::size_t(s) * pb.row_stride() + pb.rows_offset());
  }
  pb.queries.resize(std::size_t(shape.batch) * shape.num_queries * shape.num_heads * traits::query_dim);
  for (auto& v : pb.queries) { v = host::float_to_bf16(detail::normal(rng)); }

  int const k = shape.top_k;
  pb.slots.assign(std::size_t(shape.batch) * shape.num_queries * k, -1);
  std::uniform_int_distribution<int> style(0, 2);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (int b = 0; b < shape.batch; ++b) {
    std::vector<std::int32_t> base = detail::distinct_slots(rng, pb.num_slots, k);
    for (int q = 0; q < shape.num_queries; ++q) {
      std::vector<std::int32_t> sel = base;
      if (q > 0) {
        // Replace ~15% by slots not in `base` (kept distinct), then shuffle.
        std::vector<char> used(std::size_t(pb.num_slots), 0);
        for (auto s : base) { used[std::size_t(s)] = 1; }
        std::uniform_int_distribution<std::int64_t> any(0, pb.num_slots - 1);
        for (auto& s : sel) {
          if (unit(rng) < 0.15f) {
            std::int64_t c;
            do { c = any(rng); } while (used[std::size_t(c)]);
            used[std::size_t(c)] = 1;
            s = std::int32_t(c);
          }
        }
        std::shuffle(sel.begin(), sel.end(), rng);
      }
      switch (style(rng)) {
        case 1:
          for (auto& s : sel) { s = unit(rng) < 0.3f ? -1 : s; }
          break;
        case 2: {
          int const keep = std::uniform_int_distribution<int>(1, k)(rng);
          std::fill(sel.begin() + keep, sel.end(), -1);
          break;
        }
        default: break;
      }
      bool const last = b == shape.batch - 1 && q == shape.num_queries - 1;
      if (last && shape.batch * shape.num_queries >= 2) { std::fill(sel.begin(), sel.end(), -1); }
      std::copy(sel.begin(), sel.end(), pb.slots.begin() + (std::size_t(b) * shape.num_queries + q) * k);
    }
  }
  return pb;
}

}  // namespace dhisparse::test
