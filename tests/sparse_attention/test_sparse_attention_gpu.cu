// Sparse attention kernels (sparse_attention.cuh) against the host reference
// (host/sparse_attention.hpp) on random problems with fresh seeds.
//
// Built twice: for sm_90a (the wgmma path of the MLA kernel) and for plain sm_90 (the
// mma.sync path). Tests tagged [small] are the reduced set run under compute-sanitizer.
//
// Tolerances (per output head: ||out - ref||_2 / ||ref||_2, ref = exact double reference):
// - bf16 rows (MLA and MHA): the kernel's inputs are exact; Q·K accumulates in fp32
//   (relative error ~1e-6); the probabilities are rounded to bf16 for P·V (2^-9 relative,
//   random sign) and the output is rounded to bf16 (2^-9): expected ~3e-3 per head, bound
//   1e-2. LSE: fp32 sums and exp2 (~1e-5 absolute), bound 2e-3.
// - FP8 rows: the kernel dequantizes e4m3 x scale to bf16 (one more 2^-9 rounding of every
//   K and V element, where the reference keeps the fp32 product). With the test data (tile
//   magnitudes 0.5..2, scale up to 3/sqrt(576)) a logit moves by up to ~1e-2, so the bound
//   is 2.5e-2 for the output and 2.5e-2 absolute for the LSE.
// A wrong tile, row, scale or mask gives errors of order 1 (and unwritten outputs stay NaN).
#include <dhisparse/host/sparse_attention.hpp>
#include <dhisparse/sparse_attention.cuh>

#include "gpu_test.cuh"
#include "problem.hpp"
#include "random.hpp"

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

using namespace dhisparse;
namespace sa = dhisparse::sparse_attention;
using mla_bf16 = row_format::mla_bf16_576;
using mla_fp8  = row_format::mla_fp8_656;
using gqa8     = row_format::mha<8, 128, bf16>;
using mqa1     = row_format::mha<1, 128, bf16>;

// Instantiations confined to this file (the integrator pattern of CONVENTIONS.md).
DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mla_bf16_576);
DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mla_fp8_656);
DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mha<8, 128, bf16>);
DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mha<1, 128, bf16>);

namespace {

template <class F>
struct tolerance {
  static constexpr double out = sa::format_traits<F>::is_fp8 ? 2.5e-2 : 1e-2;
  static constexpr double lse = sa::format_traits<F>::is_fp8 ? 2.5e-2 : 2e-3;
};

/// A problem uploaded to the device, outputs poisoned (0xFF bytes: NaN).
template <class F>
struct device_problem {
  test::attention_problem<F> const& host;
  test::device_vector<std::byte> slab;
  test::device_vector<bf16> queries;
  test::device_vector<std::int32_t> slots;
  test::device_vector<bf16> out;
  test::device_vector<float> lse;
  test::device_vector<std::uint32_t> status;
  test::device_vector<std::byte> workspace;
  sa::params p;

  explicit device_problem(test::attention_problem<F> const& pb)
    : host{pb}, slab{pb.slab}, queries{pb.queries}, slots{pb.slots}, out{pb.out_elems()},
      lse{pb.lse_elems()}, status{std::vector<std::uint32_t>{0u}}
  {
    p            = pb.params();
    p.queries    = queries.data();
    p.rows       = slab.data() + pb.rows_offset();
    p.slots      = slots.data();
    p.out        = out.data();
    p.lse        = lse.data();
    p.status     = status.data();
    workspace    = test::device_vector<std::byte>(sa::workspace_size<F>(p));
    poison();
  }
  void poison()
  {
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }
  void run()
  {
    REQUIRE(sa::run<F>(p, workspace.data(), workspace.size(), nullptr) == cudaSuccess);
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  }
};

/// Compares the device outputs of rows b < `real_batch` with the exact reference; rows
/// beyond must still hold the poison bytes.
template <class F>
void compare(device_problem<F>& dp, int real_batch)
{
  using traits  = sa::format_traits<F>;
  auto const& s = dp.host.shape;
  auto const hp = dp.host.params();
  std::vector<bf16> const out  = dp.out.download();
  std::vector<float> const lse = dp.lse.download();
  std::vector<double> ref(std::size_t(s.num_heads) * traits::value_dim);
  std::vector<double> ref_lse(std::size_t(s.num_heads));
  double worst_out = 0, worst_lse = 0;
  int bad_empty = 0, nan_count = 0, untouched_bad = 0, heads = 0;
  for (int b = 0; b < s.batch; ++b) {
    for (int q = 0; q < s.num_queries; ++q) {
      std::size_t const base = (std::size_t(b) * s.num_queries + q) * s.num_heads;
      if (b >= real_batch) {
        for (std::size_t i = base * traits::value_dim; i < (base + s.num_heads) * traits::value_dim; ++i) {
          untouched_bad += out[i].bits != 0xFFFF;
        }
        for (int h = 0; h < s.num_heads; ++h) {
          std::uint32_t bits;
          std::memcpy(&bits, &lse[base + h], 4);
          untouched_bad += bits != 0xFFFFFFFFu;
        }
        continue;
      }
      host::sparse_attention_exact<F>(hp, b, q, ref.data(), ref_lse.data());
      for (int h = 0; h < s.num_heads; ++h, ++heads) {
        bf16 const* o      = &out[(base + h) * traits::value_dim];
        double const* r    = &ref[std::size_t(h) * traits::value_dim];
        float const l      = lse[base + h];
        if (std::isinf(ref_lse[h])) {  // empty selection: exact zeros and -inf
          bool ok = std::isinf(l) && l < 0;
          for (int d = 0; d < traits::value_dim; ++d) { ok = ok && o[d].bits == 0; }
          bad_empty += !ok;
          continue;
        }
        double num = 0, den = 0;
        for (int d = 0; d < traits::value_dim; ++d) {
          double const v = host::bf16_to_float(o[d]);
          nan_count += std::isnan(v);
          num += (v - r[d]) * (v - r[d]);
          den += r[d] * r[d];
        }
        nan_count += std::isnan(l);
        worst_out = std::max(worst_out, std::sqrt(num / std::max(den, 1e-30)));
        worst_lse = std::max(worst_lse, std::fabs(double(l) - ref_lse[h]) / std::max(1.0, std::fabs(ref_lse[h])));
      }
    }
  }
  INFO("heads " << heads << ": worst relative L2 error " << worst_out << " (bound " << tolerance<F>::out
                << "), worst LSE error " << worst_lse << " (bound " << tolerance<F>::lse << ")");
  CHECK(nan_count == 0);
  CHECK(bad_empty == 0);
  CHECK(untouched_bad == 0);
  CHECK(worst_out <= tolerance<F>::out);
  CHECK(worst_lse <= tolerance<F>::lse);
}

template <class F>
void check_case(test::attention_shape const& shape, char const* what, float logit_scale = 1.f)
{
  auto rng = test::seeded_engine(what);
  auto pb  = test::make_problem<F>(rng, shape);
  pb.softmax_scale *= logit_scale;
  device_problem<F> dp(pb);
  INFO(what << ": B=" << shape.batch << " Q=" << shape.num_queries << " H=" << shape.num_heads
            << " K=" << shape.top_k << " splits=" << dp.p.num_splits << " (used "
            << sa::num_splits<F>(dp.p, 132) << " on 132 SMs), layers=" << pb.layers
            << ", softmax scale " << pb.softmax_scale);
  dp.run();
  compare(dp, shape.batch);
  CHECK(dp.status.download()[0] == 0u);
}

}  // namespace

TEMPLATE_TEST_CASE("MLA sparse attention matches the host reference (small)", "[mla][small]", mla_bf16,
                   mla_fp8)
{
  check_case<TestType>({2, 2, 16, 100, 0}, "mla small decode/verify");
  check_case<TestType>({1, 1, 128, 130, 3}, "mla small split-K, two head tiles");
}

TEMPLATE_TEST_CASE("MLA sparse attention matches the host reference", "[mla]", mla_bf16, mla_fp8)
{
  // Every h_q; Q = 1 and Q > 1; K below, at and above a tile, not a multiple of 64, the
  // production 2048 and an 8192 union; automatic and forced splits.
  check_case<TestType>({3, 1, 16, 200, 0}, "mla h16");
  check_case<TestType>({2, 3, 32, 64, 0}, "mla h32 verify");
  check_case<TestType>({2, 1, 64, 2048, 1}, "mla h64 K2048 no split");
  check_case<TestType>({2, 1, 64, 2048, 0}, "mla h64 K2048 auto split");
  check_case<TestType>({1, 3, 128, 333, 0}, "mla h128 verify");
  check_case<TestType>({2, 2, 128, 1000, 7}, "mla h128 split 7");
  check_case<TestType>({1, 1, 16, 8192, 32}, "mla h16 K8192 split 32");
  check_case<TestType>({4, 2, 64, 7, 0}, "mla K < tile");
}

namespace {

/// Thread (c, j) dequantizes chunk c (codes 8c .. 8c + 8) with scale j as the FP8 producer does.
__global__ void dequantize_codes(uint2 const* codes, float const* scales, uint4* out)
{
  out[blockIdx.x * 32 + threadIdx.x] = sa::detail::mla::e4m3x8_to_bf16x8(codes[threadIdx.x], scales[blockIdx.x]);
}

}  // namespace

TEST_CASE("FP8 dequantization of every e4m3 code is the rounded product", "[mla][small]")
{
  // Every code (NaN codes included) times edge-case and fresh log-uniform scales of both
  // signs: bit for bit float(e4m3) * scale rounded to bf16, as the reference rounds it.
  auto rng = test::seeded_engine("fp8 dequantization");
  std::vector<float> scales = {1.f, 0.f, -0.f, 0x1p-126f, 1e-30f, 0.0078125f, 127.99f, 3e4f, 1e30f};
  std::uniform_real_distribution<float> exponent(-60.f, 60.f);
  for (int i = 0; i < 119; ++i) { scales.push_back((i % 2 ? -1.f : 1.f) * std::exp2(exponent(rng))); }
  std::vector<uint2> codes(32);
  for (int c = 0; c < 256; ++c) { reinterpret_cast<std::uint8_t*>(codes.data())[c] = std::uint8_t(c); }

  int const n = int(scales.size());
  test::device_vector<uint2> d_codes(codes);
  test::device_vector<float> d_scales(scales);
  test::device_vector<bf16> out(std::size_t(n) * 256);
  out.fill_bytes(0xFF);
  dequantize_codes<<<n, 32>>>(d_codes.data(), d_scales.data(), reinterpret_cast<uint4*>(out.data()));
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  auto const got = out.download();

  int wrong = 0, nan_wrong = 0;
  for (int j = 0; j < n; ++j) {
    for (int code = 0; code < 256; ++code) {
      float const value   = host::fp8_e4m3_to_float(fp8_e4m3{std::uint8_t(code)});
      bf16 const expected = host::float_to_bf16(value * scales[j]);
      bf16 const actual   = got[std::size_t(j) * 256 + code];
      if (std::isnan(value)) {
        nan_wrong += !std::isnan(host::bf16_to_float(actual));
      } else {
        wrong += actual.bits != expected.bits;
      }
    }
  }
  INFO(n << " scales x 256 codes");
  CHECK(wrong == 0);
  CHECK(nan_wrong == 0);
}

TEMPLATE_TEST_CASE("MHA / GQA sparse attention matches the host reference", "[mha][small]", gqa8, mqa1)
{
  if constexpr (std::is_same_v<TestType, gqa8>) {
    check_case<TestType>({2, 2, 8, 77, 0}, "mha (group 1)");
    check_case<TestType>({2, 1, 64, 1024, 0}, "gqa group 8");
    check_case<TestType>({1, 2, 64, 300, 3}, "gqa group 8 split 3");
  } else {
    check_case<TestType>({2, 2, 16, 129, 0}, "mqa group 16");
    check_case<TestType>({2, 1, 40, 700, 0}, "mqa group 40 (partial head tile)");
  }
}

TEMPLATE_TEST_CASE("row maxima that rise by more than 2^8 after the first tile", "[mla][mha][small]", mla_bf16,
                   gqa8)
{
  // The running maximum moves only when a tile raises it by more than 2^8 (log2 domain,
  // `max_slack_log2`); the logits of the other cases span a few units, so after the first
  // tile they only exercise the probabilities above 1 of a stale maximum. Logits 16x larger
  // (a standard deviation of roughly 10 to 90 in log2 units) make later tiles move it and
  // rescale too. bf16 rows only: their inputs are exact, whereas FP8 rows' bf16 rounding of
  // the dequantized values moves such logits by ~0.2 (the FP8 tolerance assumes ~0.01); the
  // softmax code is the same for both.
  check_case<TestType>({2, 1, 64, 640, 1}, "large logits", 16.f);
  if constexpr (!std::is_same_v<TestType, gqa8>) {
    check_case<TestType>({1, 2, 128, 400, 2}, "large logits, two head tiles, split 2", 16.f);
  }
}

TEMPLATE_TEST_CASE("rows beyond the device batch size are untouched", "[mla][small]", mla_bf16, mla_fp8)
{
  for (int heads : {32, 128}) {  // 128: FP8 rows run as two-CTA clusters
    for (int splits : {1, 3}) {
      auto rng = test::seeded_engine("batch_size");
      auto pb  = test::make_problem<TestType>(rng, {4, 2, heads, 150, splits});
      device_problem<TestType> dp(pb);
      test::device_vector<std::int32_t> batch_size(std::vector<std::int32_t>{2});
      dp.p.batch_size = batch_size.data();
      dp.run();
      INFO("heads " << heads << ", splits " << splits);
      compare(dp, 2);
    }
  }
}

TEST_CASE("invalid slot ids are treated as empty and flagged", "[mla][mha][small]")
{
  auto rng = test::seeded_engine("invalid ids");
  auto pb  = test::make_problem<mla_bf16>(rng, {2, 1, 16, 90, 0});
  pb.slots[1]  = std::int32_t(pb.num_slots);  // one past the slab
  pb.slots[2]  = -2;
  pb.slots[95] = std::numeric_limits<std::int32_t>::max();
  device_problem<mla_bf16> dp(pb);
  dp.run();
  CHECK(dp.status.download()[0] == sa::status_invalid_slot);
  // The reference skips the same entries (and reports the same bit).
  compare(dp, 2);

  auto pm = test::make_problem<gqa8>(rng, {1, 1, 8, 40, 0});
  pm.slots[0] = -100;
  device_problem<gqa8> dm(pm);
  dm.run();
  CHECK(dm.status.download()[0] == sa::status_invalid_slot);
  compare(dm, 1);
}

TEMPLATE_TEST_CASE("results are bit-identical across runs", "[mla][mha][small]", mla_bf16, mla_fp8, gqa8)
{
  for (int splits : {1, 4}) {
    auto rng = test::seeded_engine("determinism");
    int const heads = std::is_same_v<TestType, mla_fp8> ? 128 : 64;  // FP8: the cluster kernel
    auto pb  = test::make_problem<TestType>(rng, {2, 2, heads, 300, splits});
    device_problem<TestType> dp(pb);
    dp.run();
    auto const out1 = dp.out.download();
    auto const lse1 = dp.lse.download();
    dp.poison();
    dp.run();
    auto const out2 = dp.out.download();
    auto const lse2 = dp.lse.download();
    INFO("splits " << splits);
    CHECK(std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(bf16)) == 0);
    CHECK(std::memcmp(lse1.data(), lse2.data(), lse1.size() * sizeof(float)) == 0);
  }
}

TEMPLATE_TEST_CASE("an output with padded rows and a 4-byte aligned base gets the same values", "[mla][small]",
                   mla_bf16, mla_fp8)
{
  // Contiguous outputs are written with 16-byte stores; this layout needs the 4-byte path.
  using traits = sa::format_traits<TestType>;
  for (int splits : {1, 3}) {
    auto rng = test::seeded_engine("padded output");
    auto pb  = test::make_problem<TestType>(rng, {2, 2, 64, 200, splits});
    device_problem<TestType> dp(pb);
    dp.run();
    auto const dense = dp.out.download();

    int const pad = 2;  // elements after every head row
    std::int64_t const pitch = traits::value_dim + pad;
    test::device_vector<bf16> padded(std::size_t(2 * 2 * 64) * std::size_t(pitch) + 2);
    padded.fill_bytes(0xFF);
    dp.p.out              = padded.data() + 2;  // 4-byte aligned, not 16
    dp.p.out_stride_head  = pitch;
    dp.p.out_stride_query = 64 * pitch;
    dp.p.out_stride_batch = 2 * 64 * pitch;
    dp.run();
    auto const got = padded.download();
    int mismatched = 0, overwritten = 0;
    for (std::size_t row = 0; row < std::size_t(2 * 2 * 64); ++row) {
      for (std::int64_t d = 0; d < pitch; ++d) {
        std::uint16_t const bits = got[2 + row * std::size_t(pitch) + std::size_t(d)].bits;
        if (d < traits::value_dim) {
          mismatched += bits != dense[row * traits::value_dim + std::size_t(d)].bits;
        } else {
          overwritten += bits != 0xFFFF;
        }
      }
    }
    INFO("splits " << splits);
    CHECK(mismatched == 0);
    CHECK(overwritten == 0);
    CHECK((got[0].bits == 0xFFFF && got[1].bits == 0xFFFF));
  }
}

TEST_CASE("a captured CUDA graph replays with new selections and batch size", "[graph][small]")
{
  auto rng = test::seeded_engine("graph");
  auto pb  = test::make_problem<mla_fp8>(rng, {3, 2, 128, 200, 2});  // a cluster launch, captured
  device_problem<mla_fp8> dp(pb);
  test::device_vector<std::int32_t> batch_size(std::vector<std::int32_t>{3});
  dp.p.batch_size = batch_size.data();

  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaError_t const launched = sa::run<mla_fp8>(dp.p, dp.workspace.data(), dp.workspace.size(), stream);
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  REQUIRE(launched == cudaSuccess);
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));

  DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  {
    INFO("first replay");
    compare(dp, 3);
  }

  // New selections (reversed order, one more entry dropped) and a smaller batch: the same
  // inputs launched directly, then through the graph.
  std::reverse(pb.slots.begin(), pb.slots.end());
  pb.slots[0] = -1;
  dp.slots.upload(pb.slots);
  batch_size.upload({2});
  dp.poison();
  REQUIRE(sa::run<mla_fp8>(dp.p, dp.workspace.data(), dp.workspace.size(), stream) == cudaSuccess);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  {
    INFO("direct launch with the replay's inputs");
    compare(dp, 2);
  }
  dp.poison();
  DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  {
    INFO("second replay");
    compare(dp, 2);
  }

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("run rejects bad arguments without launching", "[errors][small]")
{
  auto rng = test::seeded_engine("bad arguments");
  auto pb  = test::make_problem<mla_bf16>(rng, {1, 1, 16, 256, 4});
  device_problem<mla_bf16> dp(pb);
  REQUIRE(dp.workspace.size() > 0);  // 4 forced splits need a workspace

  sa::params p = dp.p;
  p.queries    = nullptr;
  CHECK(sa::run<mla_bf16>(p, dp.workspace.data(), dp.workspace.size(), nullptr) == cudaErrorInvalidValue);
  // Sizing reads the shape only: a binding sizes the workspace before it has buffers.
  p.rows  = nullptr;
  p.slots = nullptr;
  p.out   = nullptr;
  CHECK(sa::workspace_size<mla_bf16>(p) == dp.workspace.size());
  CHECK(sa::num_splits<mla_bf16>(p, 132) == sa::num_splits<mla_bf16>(dp.p, 132));
  p            = dp.p;
  p.num_heads  = 48;
  CHECK(sa::run<mla_bf16>(p, dp.workspace.data(), dp.workspace.size(), nullptr) == cudaErrorInvalidValue);
  CHECK_THROWS_AS(sa::workspace_size<mla_bf16>(p), dhisparse::error);
  p            = dp.p;
  p.top_k      = sa::max_top_k + 1;
  CHECK(sa::run<mla_bf16>(p, dp.workspace.data(), dp.workspace.size(), nullptr) == cudaErrorInvalidValue);
  p            = dp.p;
  p.row_stride = mla_bf16::bytes + 8;
  CHECK(sa::run<mla_bf16>(p, dp.workspace.data(), dp.workspace.size(), nullptr) == cudaErrorInvalidValue);
  // Workspace missing, too small or misaligned.
  CHECK(sa::run<mla_bf16>(dp.p, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  CHECK(sa::run<mla_bf16>(dp.p, dp.workspace.data(), dp.workspace.size() - 16, nullptr) ==
        cudaErrorInvalidValue);
  test::device_vector<std::byte> larger(dp.workspace.size() + 16);
  CHECK(sa::run<mla_bf16>(dp.p, larger.data() + 4, larger.size() - 4, nullptr) == cudaErrorInvalidValue);
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  // Nothing was launched: the outputs still hold the poison.
  for (auto v : dp.out.download()) { REQUIRE(v.bits == 0xFFFF); }
  CHECK(cudaGetLastError() == cudaSuccess);
}
