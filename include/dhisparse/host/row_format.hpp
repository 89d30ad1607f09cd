/**
 * @file host/row_format.hpp
 * @brief Reference conversions for row formats: bf16 and FP8 E4M3 scalars, and
 *        dequantize / quantize of whole rows (plain C++, no CUDA needed).
 *
 * These are the oracle that device kernels are tested against. Rounding matches CUDA's
 * conversions: float→bf16 rounds to nearest even; float→e4m3 rounds to nearest even
 * and saturates to ±448 (`__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`).
 */
#pragma once

#include <dhisparse/row_format.cuh>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace dhisparse::host {

/// @brief Exact widening of a bf16 bit pattern to float.
inline float bf16_to_float(bf16 x)
{
  std::uint32_t const bits = std::uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// @brief float → bf16, round to nearest even (NaN stays a quiet NaN).
inline bf16 float_to_bf16(float f)
{
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) { return bf16{std::uint16_t((bits >> 16) | 0x0040u)}; }
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return bf16{std::uint16_t(bits >> 16)};
}

/// @brief Exact widening of an FP8 E4M3 (e4m3fn) bit pattern to float.
inline float fp8_e4m3_to_float(fp8_e4m3 x)
{
  int const sign = (x.bits >> 7) & 1;
  int const exp  = (x.bits >> 3) & 0xF;
  int const man  = x.bits & 0x7;
  float v;
  if (exp == 0xF && man == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    v = std::ldexp(float(8 + man), exp - 10);  // (1 + man/8) * 2^(exp-7)
  }
  return sign ? -v : v;
}

/// @brief float → FP8 E4M3, round to nearest even, saturating to ±448; NaN → 0x7F.
inline fp8_e4m3 float_to_fp8_e4m3(float f)
{
  if (std::isnan(f)) { return fp8_e4m3{0x7F}; }
  std::uint8_t const sign = std::signbit(f) ? 0x80 : 0x00;
  float const a           = std::fabs(f);
  // The 127 finite non-negative codes 0x00..0x7E are ordered by value: binary-search the
  // two neighbours of `a` and pick the nearer one, ties to the even code.
  int lo = 0, hi = 0x7E;
  if (a >= fp8_e4m3_to_float(fp8_e4m3{0x7E})) { return fp8_e4m3{std::uint8_t(sign | 0x7E)}; }
  while (hi - lo > 1) {
    int const mid = (lo + hi) / 2;
    (fp8_e4m3_to_float(fp8_e4m3{std::uint8_t(mid)}) <= a ? lo : hi) = mid;
  }
  float const dlo = a - fp8_e4m3_to_float(fp8_e4m3{std::uint8_t(lo)});
  float const dhi = fp8_e4m3_to_float(fp8_e4m3{std::uint8_t(hi)}) - a;
  int const code  = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return fp8_e4m3{std::uint8_t(sign | code)};
}

/**
 * @brief Dequantizes one MLA row to its 576 float values (512 latent, then 64 rope).
 * @param row `F::bytes` bytes in format `F` (`mla_fp8_656` or `mla_bf16_576`)
 * @param out 576 floats
 */
template <class F>
void dequantize_row(std::byte const* row, float* out)
{
  if constexpr (std::is_same_v<F, row_format::mla_fp8_656>) {
    float scales[F::num_tiles];
    std::memcpy(scales, row + F::scale_offset, sizeof scales);
    for (int i = 0; i < F::nope_dim; ++i) {
      fp8_e4m3 const v{std::uint8_t(row[F::nope_offset + i])};
      out[i] = fp8_e4m3_to_float(v) * scales[i / F::tile_dim];
    }
    for (int j = 0; j < F::rope_dim; ++j) {
      bf16 v;
      std::memcpy(&v, row + F::rope_offset + j * sizeof(bf16), sizeof v);
      out[F::nope_dim + j] = bf16_to_float(v);
    }
  } else if constexpr (std::is_same_v<F, row_format::mla_bf16_576>) {
    for (int i = 0; i < F::dim; ++i) {
      bf16 v;
      std::memcpy(&v, row + i * sizeof(bf16), sizeof v);
      out[i] = bf16_to_float(v);
    }
  } else {
    static_assert(sizeof(F) == 0, "dequantize_row: F must be an MLA row format");
  }
}

/**
 * @brief Quantizes 576 float values (512 latent, 64 rope) into one MLA row.
 *
 * For `mla_fp8_656` each 128-value tile gets the scale `max|x| / 448` (1 for an all-zero
 * tile), so the largest value of a tile maps to the largest finite e4m3 value.
 */
template <class F>
void quantize_row(float const* in, std::byte* row)
{
  if constexpr (std::is_same_v<F, row_format::mla_fp8_656>) {
    float scales[F::num_tiles];
    for (int t = 0; t < F::num_tiles; ++t) {
      float amax = 0.f;
      for (int i = 0; i < F::tile_dim; ++i) {
        amax = std::max(amax, std::fabs(in[t * F::tile_dim + i]));
      }
      scales[t] = amax > 0.f ? amax / 448.f : 1.f;
      for (int i = 0; i < F::tile_dim; ++i) {
        int const e = t * F::tile_dim + i;
        row[F::nope_offset + e] = std::byte(float_to_fp8_e4m3(in[e] / scales[t]).bits);
      }
    }
    std::memcpy(row + F::scale_offset, scales, sizeof scales);
    for (int j = 0; j < F::rope_dim; ++j) {
      bf16 const v = float_to_bf16(in[F::nope_dim + j]);
      std::memcpy(row + F::rope_offset + j * sizeof(bf16), &v, sizeof v);
    }
  } else if constexpr (std::is_same_v<F, row_format::mla_bf16_576>) {
    for (int i = 0; i < F::dim; ++i) {
      bf16 const v = float_to_bf16(in[i]);
      std::memcpy(row + i * sizeof(bf16), &v, sizeof v);
    }
  } else {
    static_assert(sizeof(F) == 0, "quantize_row: F must be an MLA row format");
  }
}

}  // namespace dhisparse::host
