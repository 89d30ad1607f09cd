/**
 * @file policy/score_ema.cuh
 * @brief Evict the rows the indexer scores lowest: each row keeps an exponential moving
 *        average of the scores of its selections, aged linearly for every step it is not
 *        selected. Needs per-selection scores in resolve (`needs_scores`).
 *
 * With ema e last updated at epoch t, the aged priority at epoch T is e − A·(T − t);
 * comparing rows at any T compares e + A·t, so the key is `e + A·t` (a double, ordered as
 * an integer) and does not change while the row is not selected. EMA weight α = Num/Den.
 * Only IEEE additions and multiplications (no contraction), so the host reference and the
 * GPU agree bit for bit.
 *
 * State: bits 0–31 = ema (float), bits 32–63 = epoch of the last selection.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

#include <cstdint>
#include <cstring>

namespace dhisparse::policy {

/// @brief Score EMA with weight Num/Den and aging of `AgingMilli`/1000 score units per
/// step (see the file comment).
template <int Num = 1, int Den = 4, int AgingMilli = 10>
struct score_ema : eviction_defaults {
  static_assert(Den > 0 && Num > 0 && Num <= Den, "score_ema: 0 < Num/Den <= 1");
  static_assert(AgingMilli >= 0, "score_ema: AgingMilli must not be negative");
  static constexpr bool needs_scores      = true;
  static constexpr bool counts_selections = true;

  DHISPARSE_HOST_DEVICE static float mul(float a, float b) noexcept
  {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
  }
  DHISPARSE_HOST_DEVICE static float add(float a, float b) noexcept
  {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
  }
  DHISPARSE_HOST_DEVICE static policy_state pack(float ema, std::uint32_t epoch) noexcept
  {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &ema, sizeof bits);
    return (policy_state{epoch} << 32) | bits;
  }
  DHISPARSE_HOST_DEVICE static float ema_of(policy_state s) noexcept
  {
    std::uint32_t const bits = std::uint32_t(s);
    float e                  = 0.f;
    std::memcpy(&e, &bits, sizeof e);
    return e;
  }
  DHISPARSE_HOST_DEVICE static policy_state on_insert(selection_context c) noexcept
  {
    return pack(c.selections > 0 ? c.score : 0.f, c.epoch);
  }
  DHISPARSE_HOST_DEVICE static policy_state on_hit(policy_state s, selection_context c) noexcept
  {
    float const alpha = float(Num) / float(Den);
    return pack(add(mul(alpha, c.score), mul(1.f - alpha, ema_of(s))), c.epoch);
  }
  DHISPARSE_HOST_DEVICE static std::uint64_t eviction_key(policy_state s, std::int32_t) noexcept
  {
    double const aging = double(AgingMilli) / 1000.0;
#if defined(__CUDA_ARCH__)
    double const key = __dadd_rn(double(ema_of(s)), __dmul_rn(aging, double(s >> 32)));
#else
    double const key = double(ema_of(s)) + aging * double(s >> 32);
#endif
    std::uint64_t bits = 0;
    std::memcpy(&bits, &key, sizeof bits);
    // Order doubles as unsigned integers: flip all bits of negatives, the sign of positives.
    return (bits >> 63) != 0 ? ~bits : bits | (std::uint64_t{1} << 63);
  }
};

}  // namespace dhisparse::policy
