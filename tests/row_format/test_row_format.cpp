// Row format traits and the reference conversions (host/row_format.hpp).
#include <dhisparse/host/row_format.hpp>
#include <dhisparse/row_format.cuh>

#include "random.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

using namespace dhisparse;

static_assert(row_format::mla_fp8_656::bytes == 656);
static_assert(row_format::mla_bf16_576::bytes == 1152);
static_assert(row_format::mha<8, 128, bf16>::bytes == 2 * 8 * 128 * 2);
static_assert(row_format::opaque<2624>::bytes == 2624);
static_assert(is_row_format_v<row_format::mla_fp8_656>);
static_assert(is_row_format_v<row_format::mha<1, 8, bf16>>);
static_assert(!is_row_format_v<int>);

TEST_CASE("fp8 e4m3: every finite code round-trips and known values decode", "[row_format]")
{
  for (int code = 0; code < 256; ++code) {
    fp8_e4m3 const x{std::uint8_t(code)};
    float const f = host::fp8_e4m3_to_float(x);
    if ((code & 0x7F) == 0x7F) {
      CHECK(std::isnan(f));
      continue;
    }
    if (code == 0x80) { continue; }  // -0 encodes back to +0's sign bit only through signbit
    CHECK(host::float_to_fp8_e4m3(f).bits == code);
  }
  CHECK(host::fp8_e4m3_to_float(fp8_e4m3{0x7E}) == 448.f);
  CHECK(host::fp8_e4m3_to_float(fp8_e4m3{0x38}) == 1.f);
  CHECK(host::fp8_e4m3_to_float(fp8_e4m3{0x01}) == std::ldexp(1.f, -9));
  CHECK(host::float_to_fp8_e4m3(1e6f).bits == 0x7E);    // saturates
  CHECK(host::float_to_fp8_e4m3(-1e6f).bits == 0xFE);
  // 1.0625 lies exactly between 1.0 (0x38) and 1.125 (0x39): ties to even → 0x38.
  CHECK(host::float_to_fp8_e4m3(1.0625f).bits == 0x38);
  CHECK(host::float_to_fp8_e4m3(1.1875f).bits == 0x3A);  // between 0x39 and 0x3A → even
}

TEST_CASE("bf16: round to nearest even", "[row_format]")
{
  CHECK(host::float_to_bf16(1.f).bits == 0x3F80);
  CHECK(host::bf16_to_float(bf16{0x3F80}) == 1.f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(host::float_to_bf16(1.f + std::ldexp(1.f, -8)).bits == 0x3F80);
  CHECK(host::float_to_bf16(1.f + 3 * std::ldexp(1.f, -8)).bits == 0x3F82);
  CHECK(std::isnan(host::bf16_to_float(host::float_to_bf16(NAN))));
}

TEMPLATE_TEST_CASE("quantize/dequantize of MLA rows stays within the format's precision",
                   "[row_format]", row_format::mla_fp8_656, row_format::mla_bf16_576)
{
  using F  = TestType;
  auto rng = test::seeded_engine("row_format");
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> in(576), out(576);
  std::vector<std::byte> row(F::bytes);
  for (int trial = 0; trial < 64; ++trial) {
    for (auto& v : in) { v = dist(rng); }
    host::quantize_row<F>(in.data(), row.data());
    host::dequantize_row<F>(row.data(), out.data());
    float scales[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (std::is_same_v<F, row_format::mla_fp8_656>) {
      std::memcpy(scales, row.data() + F::scale_offset, sizeof scales);
    }
    for (int i = 0; i < 576; ++i) {
      // e4m3 keeps 3 mantissa bits: relative error <= 2^-4, and below the normal range an
      // absolute error <= half the subnormal step (2^-10 of the tile's scale); bf16 keeps
      // 8 bits: relative error <= 2^-8.
      bool const fp8_part = std::is_same_v<F, row_format::mla_fp8_656> && i < 512;
      float const tol     = fp8_part ? std::fabs(in[i]) * 0.0625f + scales[i / 128] * 0x1p-10f
                                     : std::fabs(in[i]) * 0x1p-8f;
      INFO("element " << i << " in " << in[i] << " out " << out[i]);
      CHECK(std::fabs(out[i] - in[i]) <= tol);
    }
    if constexpr (std::is_same_v<F, row_format::mla_bf16_576>) {
      // bf16 values are fixed points of quantization: the row is reproduced bit for bit.
      std::vector<std::byte> again(F::bytes);
      host::quantize_row<F>(out.data(), again.data());
      CHECK(again == row);
    }
  }
}
