/**
 * @file detail/philox.hpp
 * @brief Counter-based random numbers (Philox4x32-10) and the exact integer helpers the
 *        sampling rules use; identical on host and device (plain C++).
 *
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) maps
 * a 128-bit counter and a 64-bit key to 128 random bits with no state, so a kernel can
 * draw the k-th number of any stream directly, and the host reference draws the very same
 * numbers. The constants and round function are those of Random123 and of CUDA's
 * `curand_Philox4x32_10`; the tests check Random123's known-answer vectors and compare
 * with cuRAND on the device.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cstdint>

namespace dhisparse::detail {

/// Four 32-bit words: a Philox counter or one Philox output block.
struct philox_block {
  std::uint32_t x, y, z, w;
};

/// High 32 bits of the 64-bit product `a * b`.
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b)
{
  return std::uint32_t((std::uint64_t(a) * b) >> 32);
}

/// High 64 bits of the 128-bit product `a * b` (exact, the same on host and device).
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b)
{
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  std::uint64_t const a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
  std::uint64_t const b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
  std::uint64_t const lo_lo = a_lo * b_lo;
  std::uint64_t const hi_lo = a_hi * b_lo;
  std::uint64_t const lo_hi = a_lo * b_hi;
  std::uint64_t const hi_hi = a_hi * b_hi;
  std::uint64_t const cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
  return hi_hi + (hi_lo >> 32) + (cross >> 32);
#endif
}

/**
 * @brief Philox4x32 with 10 rounds.
 * @param ctr 128-bit counter
 * @param key_lo low word of the 64-bit key
 * @param key_hi high word of the 64-bit key
 * @return 128 random bits
 */
DHISPARSE_HOST_DEVICE inline philox_block philox4x32_10(philox_block ctr, std::uint32_t key_lo,
                                                        std::uint32_t key_hi)
{
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t const hi0 = mulhi32(m0, ctr.x), lo0 = m0 * ctr.x;
    std::uint32_t const hi1 = mulhi32(m1, ctr.z), lo1 = m1 * ctr.z;
    ctr = philox_block{hi1 ^ ctr.y ^ key_lo, lo1, hi0 ^ ctr.w ^ key_hi, lo0};
    key_lo += w0;
    key_hi += w1;
  }
  return ctr;
}

/**
 * @brief The 64-bit random number number `event` of stream `stream` for one (seed,
 *        offset): counter = {event, stream, offset_lo, offset_hi}, key = seed; the result
 *        is words x (low) and y (high) of the output block.
 *
 * Verification uses `stream` = batch index and `event` = the draw's rank within the
 * request; engines advance `offset` once per verify call.
 */
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint64_t philox_u64(std::uint64_t seed,
                                                                     std::uint64_t offset,
                                                                     std::uint32_t stream,
                                                                     std::uint32_t event)
{
  philox_block const r = philox4x32_10(
    philox_block{event, stream, std::uint32_t(offset), std::uint32_t(offset >> 32)},
    std::uint32_t(seed), std::uint32_t(seed >> 32));
  return (std::uint64_t(r.y) << 32) | r.x;
}

/**
 * @brief Uniform float in [0, 1) from 32 random bits: the top 24 bits times 2^-24.
 *
 * Every value is a multiple of 2^-24 in [0, 1 - 2^-24], each with probability 2^-24, so
 * the result is never 1.0 (converting all 32 bits to float would round up to 1.0).
 */
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE float uniform_float(std::uint32_t bits)
{
  return float(bits >> 8) * 0x1p-24f;
}

}  // namespace dhisparse::detail
