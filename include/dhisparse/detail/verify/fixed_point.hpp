/**
 * @file detail/verify/fixed_point.hpp
 * @brief Exact integer arithmetic of the acceptance and sampling rules (plain C++, host
 *        and device).
 *
 * Probabilities enter as fp32 and are converted once, by truncation, to unsigned 2.62
 * fixed point (1.0 = 2^62). Everything after that is integer arithmetic: sums are
 * associative, so a block-wide reduction in any order gives the same bits as the host's
 * left-to-right loop, and the GPU and the host reference pick the same token for the same
 * random bits. docs/verify.md explains the choice.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/philox.hpp>

#include <cstdint>

namespace dhisparse::detail::verify {

/// Fraction bits of the fixed-point probabilities.
inline constexpr int fixed_bits = 62;
/// 1.0 in fixed point.
inline constexpr std::uint64_t fixed_one = std::uint64_t(1) << fixed_bits;

/**
 * @brief fp32 probability → fixed point, truncating; NaN, negative values and zero map to
 *        0, values ≥ 1 to `fixed_one` (such inputs also raise a status flag elsewhere).
 *
 * `x * 2^62` is exact in fp32 (a power-of-two scale), so the only rounding is the
 * truncation to an integer, which both sides perform identically. Inputs below 2^-62 are
 * truncated to 0.
 */
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t to_fixed(float x)
{
  if (!(x > 0.f)) { return 0; }
  if (x >= 1.f) { return fixed_one; }
#if defined(__CUDA_ARCH__)
  return __float2ull_rz(x * 0x1p62f);
#else
  return static_cast<std::uint64_t>(x * 0x1p62f);
#endif
}

/// Saturating addition (associative and commutative on unsigned values, so sums stay
/// order-independent even when invalid input makes them overflow).
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t sat_add(std::uint64_t a, std::uint64_t b)
{
  std::uint64_t const s = a + b;
  return s < a ? ~std::uint64_t(0) : s;
}

/// `a - b`, or 0 when `b > a`.
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t sub_floor0(std::uint64_t a, std::uint64_t b)
{
  return a > b ? a - b : 0;
}

/// `(s * q) >> 62` with a 128-bit intermediate, saturating: `s` (a mass) times `q` (a
/// fixed-point probability).
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t mul_fixed(std::uint64_t s, std::uint64_t q)
{
  std::uint64_t const hi = mulhi64(s, q);
  std::uint64_t const lo = s * q;
  if (hi >> fixed_bits) { return ~std::uint64_t(0); }
  return (hi << (64 - fixed_bits)) | (lo >> fixed_bits);
}

/**
 * @brief One step of the residual recursion R ← max(0, R − S·q): the unnormalized form of
 *        normalize(max(0, R/S − q)), the target distribution left after a rejected draft
 *        that was drawn from q (S = total mass of R).
 */
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t residual_step(std::uint64_t r,
                                                                        std::uint64_t mass,
                                                                        std::uint64_t q)
{
  return sub_floor0(r, mul_fixed(mass, q));
}

/**
 * @brief The acceptance test: accept with probability min(1, r / d), exactly up to 2^-64,
 *        from 64 random bits. With `d = S·q(x)` and `r = R(x)` this is
 *        min(1, (R(x)/S) / q(x)).
 */
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE bool accepts(std::uint64_t r, std::uint64_t d,
                                                         std::uint64_t bits)
{
  return mulhi64(d, bits) < r;
}

/// The inverse-CDF target in [0, mass): the sampled token is the smallest i whose
/// inclusive prefix sum of masses exceeds it.
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t sample_target(std::uint64_t mass,
                                                                        std::uint64_t bits)
{
  return mulhi64(mass, bits);
}

/// Elements of one sampling chunk: vocabularies are cut into chunks whose masses are kept
/// in shared memory; a chunk is 512·m elements with m chosen so there are ≤ `max_chunks`.
inline constexpr int chunk_unit = 512;
inline constexpr int max_chunks = 2048;

DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::int64_t chunk_length(std::int64_t vocab)
{
  std::int64_t const units = (vocab + chunk_unit - 1) / chunk_unit;
  std::int64_t const m     = (units + max_chunks - 1) / max_chunks;
  return chunk_unit * (m > 0 ? m : 1);
}

/// Chunks of a vocabulary of `vocab` tokens (≤ `max_chunks`).
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE int chunk_count(std::int64_t vocab)
{
  return int((vocab + chunk_length(vocab) - 1) / chunk_length(vocab));
}

}  // namespace dhisparse::detail::verify
