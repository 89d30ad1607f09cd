// Host reference of sparse attention (host/sparse_attention.hpp) and argument checks
// (sparse_attention::params_problem / validate), compiled without CUDA.
#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/host/row_format.hpp>
#include <dhisparse/host/sparse_attention.hpp>

#include "problem.hpp"
#include "random.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace dhisparse;
namespace sa = dhisparse::sparse_attention;
using mla_bf16 = row_format::mla_bf16_576;
using mla_fp8  = row_format::mla_fp8_656;
using gqa8     = row_format::mha<8, 128, bf16>;

namespace {

/// Key and value of `kv_head` read with offsets computed here from the documented layout
/// (K of all heads, then V of all heads; MLA: dequantized 576 values, value = first 512).
template <class F>
void naive_row(std::byte const* row, int kv_head, std::vector<long double>& key,
               std::vector<long double>& value)
{
  using traits = sa::format_traits<F>;
  key.assign(traits::query_dim, 0.0L);
  value.assign(traits::value_dim, 0.0L);
  if constexpr (traits::is_mla) {
    float v[576];
    host::dequantize_row<F>(row, v);
    for (int d = 0; d < 576; ++d) { key[d] = v[d]; }
    for (int d = 0; d < 512; ++d) { value[d] = v[d]; }
  } else {
    int const dim = 128;
    for (int d = 0; d < dim; ++d) {
      std::uint16_t kb;
      std::uint16_t vb;
      std::memcpy(&kb, row + 2 * (kv_head * dim + d), 2);
      std::memcpy(&vb, row + 2 * (traits::kv_heads * dim + kv_head * dim + d), 2);
      key[d]   = host::bf16_to_float(bf16{kb});
      value[d] = host::bf16_to_float(bf16{vb});
    }
  }
}

/// Two-pass softmax in long double over the valid entries, by definition.
template <class F>
void naive_attention(sa::params const& p, int b, int q, int h, std::vector<long double>& out,
                     long double& lse)
{
  using traits = sa::format_traits<F>;
  int const kv_head = h / (p.num_heads / traits::kv_heads);
  std::vector<long double> logits;
  std::vector<std::vector<long double>> values;
  std::vector<long double> key, value;
  for (int k = 0; k < p.top_k; ++k) {
    std::int32_t const s = p.slots[b * p.slot_stride_batch + q * p.slot_stride_query + k];
    if (s < 0 || s >= p.num_slots) { continue; }
    naive_row<F>(p.rows + std::size_t(s) * p.row_stride, kv_head, key, value);
    long double dot = 0.0L;
    bf16 const* qh  = p.queries + b * p.query_stride_batch + q * p.query_stride_query + h * p.query_stride_head;
    for (int d = 0; d < traits::query_dim; ++d) { dot += host::bf16_to_float(qh[d]) * key[d]; }
    logits.push_back(p.softmax_scale * dot);
    values.push_back(value);
  }
  out.assign(traits::value_dim, 0.0L);
  if (logits.empty()) {
    lse = -std::numeric_limits<long double>::infinity();
    return;
  }
  long double total = 0.0L;
  for (auto l : logits) { total += std::exp(l); }
  for (std::size_t i = 0; i < logits.size(); ++i) {
    long double const w = std::exp(logits[i]) / total;
    for (int d = 0; d < traits::value_dim; ++d) { out[d] += w * values[i][d]; }
  }
  lse = std::log(total);
}

template <class F>
void check_reference_against_naive(test::attention_shape const& shape, char const* what)
{
  using traits = sa::format_traits<F>;
  auto rng     = test::seeded_engine(what);
  auto pb      = test::make_problem<F>(rng, shape);
  auto p       = pb.params();
  std::vector<double> out(std::size_t(shape.num_heads) * traits::value_dim);
  std::vector<double> lse(std::size_t(shape.num_heads));
  std::vector<long double> nout;
  long double nlse  = 0;
  double worst_out  = 0;
  double worst_lse  = 0;
  int empty_checked = 0;
  for (int b = 0; b < shape.batch; ++b) {
    for (int q = 0; q < shape.num_queries; ++q) {
      host::sparse_attention_exact<F>(p, b, q, out.data(), lse.data());
      for (int h = 0; h < shape.num_heads; ++h) {
        naive_attention<F>(p, b, q, h, nout, nlse);
        if (std::isinf(nlse)) {
          CHECK(std::isinf(lse[h]));
          CHECK(lse[h] < 0);
          for (int d = 0; d < traits::value_dim; ++d) { CHECK(out[h * traits::value_dim + d] == 0.0); }
          ++empty_checked;
          continue;
        }
        worst_lse = std::max(worst_lse, double(std::fabs(lse[h] - nlse)));
        for (int d = 0; d < traits::value_dim; ++d) {
          worst_out = std::max(worst_out, double(std::fabs(out[h * traits::value_dim + d] - nout[d])));
        }
      }
    }
  }
  INFO("max |out - naive| " << worst_out << ", max |lse - naive| " << worst_lse);
  // Both are double-or-better computations of the same sums: only summation order differs.
  CHECK(worst_out < 1e-9);
  CHECK(worst_lse < 1e-9);
  CHECK(empty_checked > 0);  // make_problem always includes an empty selection here
}

}  // namespace

TEST_CASE("reference matches a naive long-double computation", "[sparse_attention][host]")
{
  check_reference_against_naive<mla_bf16>({2, 2, 16, 70}, "mla_bf16 reference");
  check_reference_against_naive<mla_fp8>({2, 2, 16, 70}, "mla_fp8 reference");
  check_reference_against_naive<gqa8>({2, 2, 32, 70}, "gqa8 reference");
}

TEST_CASE("reference: single entry, duplicates, order and empty selections", "[sparse_attention][host]")
{
  auto rng = test::seeded_engine("reference properties");
  auto pb  = test::make_problem<mla_bf16>(rng, {1, 1, 16, 8});
  auto p   = pb.params();
  std::vector<double> out(16 * 512), lse(16), out2(16 * 512), lse2(16);

  // One valid entry: the output is exactly that row's value part, the LSE its logit.
  std::int32_t const a = pb.slots[0] >= 0 ? pb.slots[0] : 3;
  std::int32_t const c = a == 5 ? 6 : 5;
  std::vector<std::int32_t> sel{-1, a, -1, -1, -1, -1, -1, -1};
  p.slots = sel.data();
  host::sparse_attention_exact<mla_bf16>(p, 0, 0, out.data(), lse.data());
  float row[576];
  host::dequantize_row<mla_bf16>(p.rows + std::size_t(a) * p.row_stride, row);
  for (int h = 0; h < 16; ++h) {
    double dot = 0;
    for (int d = 0; d < 576; ++d) { dot += double(host::bf16_to_float(pb.queries[h * 576 + d])) * row[d]; }
    CHECK(lse[h] == Approx(p.softmax_scale * dot).epsilon(1e-12));
    for (int d = 0; d < 512; ++d) { CHECK(out[h * 512 + d] == Approx(row[d]).epsilon(1e-12)); }
  }

  // A duplicated entry counts twice: {a, a, c} has the LSE log(2 e^{s_a} + e^{s_c}).
  std::vector<std::int32_t> one_a{a, -1, -1, -1, -1, -1, -1, -1};
  std::vector<std::int32_t> one_c{c, -1, -1, -1, -1, -1, -1, -1};
  std::vector<std::int32_t> dup{a, -1, a, c, -1, -1, -1, -1};
  p.slots = one_a.data();
  host::sparse_attention_exact<mla_bf16>(p, 0, 0, out.data(), lse.data());
  p.slots = one_c.data();
  host::sparse_attention_exact<mla_bf16>(p, 0, 0, out2.data(), lse2.data());
  std::vector<double> la = lse, lc = lse2;
  p.slots = dup.data();
  host::sparse_attention_exact<mla_bf16>(p, 0, 0, out.data(), lse.data());
  // The logarithm of a sum near 1 carries an absolute (not a relative) rounding error of a
  // few 1e-16: an LSE near 0 needs a margin.
  for (int h = 0; h < 16; ++h) {
    CHECK(lse[h] == Approx(std::log(2 * std::exp(la[h]) + std::exp(lc[h]))).epsilon(1e-12).margin(1e-12));
  }

  // The order of a selection does not matter (up to summation order).
  std::vector<std::int32_t> rev(dup.rbegin(), dup.rend());
  p.slots = rev.data();
  host::sparse_attention_exact<mla_bf16>(p, 0, 0, out2.data(), lse2.data());
  for (int i = 0; i < 16 * 512; ++i) { CHECK(out2[i] == Approx(out[i]).margin(1e-12)); }

  // No valid entry: zeros and -inf.
  std::vector<std::int32_t> none(8, -1);
  p.slots = none.data();
  host::sparse_attention_exact<mla_bf16>(p, 0, 0, out.data(), lse.data());
  for (int h = 0; h < 16; ++h) { CHECK((std::isinf(lse[h]) && lse[h] < 0)); }
  for (double v : out) { CHECK(v == 0.0); }
}

TEST_CASE("reference: batch_size skips rows, invalid ids set the status bit", "[sparse_attention][host]")
{
  auto rng = test::seeded_engine("reference contract");
  auto pb  = test::make_problem<mla_fp8>(rng, {3, 1, 16, 40});
  // An out-of-range id and a negative id other than -1 in request 0: treated as empty.
  pb.slots[3] = std::int32_t(pb.num_slots);
  pb.slots[5] = -7;
  auto p      = pb.params();
  std::vector<bf16> out(pb.out_elems(), bf16{0x7FC1});
  std::vector<float> lse(pb.lse_elems(), 12345.f);
  std::int32_t batch_size = 1;
  std::uint32_t status    = 0;
  p.out        = out.data();
  p.lse        = lse.data();
  p.batch_size = &batch_size;
  p.status     = &status;
  host::sparse_attention<mla_fp8>(p);
  CHECK(status == sa::status_invalid_slot);
  // Rows b >= 1 untouched.
  for (std::size_t i = 16 * 512; i < out.size(); ++i) { CHECK(out[i].bits == 0x7FC1); }
  for (std::size_t i = 16; i < lse.size(); ++i) { CHECK(lse[i] == 12345.f); }
  // Row 0 equals the exact result with the bad entries removed.
  std::vector<double> ex(16 * 512), exl(16);
  pb.slots[3] = -1;
  pb.slots[5] = -1;
  CHECK(host::sparse_attention_exact<mla_fp8>(p, 0, 0, ex.data(), exl.data()) == 0u);
  for (int i = 0; i < 16 * 512; ++i) { CHECK(out[i].bits == host::float_to_bf16(float(ex[i])).bits); }
  for (int h = 0; h < 16; ++h) { CHECK(lse[h] == float(exl[h])); }
}

TEST_CASE("params_problem / validate name the bad argument", "[sparse_attention][host]")
{
  auto rng = test::seeded_engine("argument checks");
  auto pb  = test::make_problem<mla_bf16>(rng, {1, 1, 16, 16});
  auto good = pb.params();
  std::vector<bf16> out(pb.out_elems());
  good.out = out.data();
  CHECK(sa::params_problem<mla_bf16>(good).empty());
  CHECK_NOTHROW(sa::validate<mla_bf16>(good));

  struct bad_case {
    char const* expect;
    void (*mutate)(sa::params&);
  };
  bad_case const cases[] = {
    {"queries is null", [](sa::params& p) { p.queries = nullptr; }},
    {"rows is null", [](sa::params& p) { p.rows = nullptr; }},
    {"slots is null", [](sa::params& p) { p.slots = nullptr; }},
    {"out is null", [](sa::params& p) { p.out = nullptr; }},
    {"num_heads (48)", [](sa::params& p) { p.num_heads = 48; }},
    {"num_heads (256)", [](sa::params& p) { p.num_heads = 256; }},
    {"top_k (0)", [](sa::params& p) { p.top_k = 0; }},
    {"top_k (65537)", [](sa::params& p) { p.top_k = sa::max_top_k + 1; }},
    {"row_stride (1160)", [](sa::params& p) { p.row_stride = 1160; }},
    {"row_stride (1136)", [](sa::params& p) { p.row_stride = 1136; }},
    {"row_stride (4294967312)", [](sa::params& p) { p.row_stride = (std::size_t(1) << 32) + 16; }},
    {"rows is not 16-byte aligned", [](sa::params& p) { p.rows += 8; }},
    {"num_queries (0)", [](sa::params& p) { p.num_queries = 0; }},
    {"batch (-1)", [](sa::params& p) { p.batch = -1; }},
    {"query strides", [](sa::params& p) { p.query_stride_head = 580; }},
    {"out strides", [](sa::params& p) { p.out_stride_head = 513; }},
    {"softmax_scale", [](sa::params& p) { p.softmax_scale = std::numeric_limits<float>::infinity(); }},
    {"num_splits (33)", [](sa::params& p) { p.num_splits = 33; }},
    {"num_slots (-1)", [](sa::params& p) { p.num_slots = -1; }},
  };
  for (auto const& c : cases) {
    sa::params p = good;
    c.mutate(p);
    INFO(c.expect);
    CHECK_THAT(sa::params_problem<mla_bf16>(p), Catch::Contains(c.expect));
    CHECK_THROWS_AS(sa::validate<mla_bf16>(p), dhisparse::error);
    CHECK_THROWS_WITH(sa::validate<mla_bf16>(p), Catch::Contains(c.expect));
  }
  // MHA: heads must be a multiple of the KV heads.
  sa::params m = good;
  m.num_heads  = 12;
  m.row_stride = gqa8::bytes;
  m.query_stride_head = 128;
  CHECK_THAT(sa::params_problem<gqa8>(m), Catch::Contains("multiple of the 8 KV heads"));
  m.num_heads = 16;
  CHECK(sa::params_problem<gqa8>(m).empty());
}
