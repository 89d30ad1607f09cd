/**
 * @file detail/policy_traits.hpp
 * @brief Compile-time checks of the eviction and budget policy contracts
 *        (policy/lru.cuh and policy/static_budget.cuh document them).
 */
#pragma once

#include <cstdint>
#include <type_traits>

namespace dhisparse {

template <class P, class = void>
struct is_eviction_policy : std::false_type {};

template <class P>
struct is_eviction_policy<
  P,
  std::enable_if_t<
    std::is_same_v<decltype(P::on_insert(std::uint32_t{})), std::uint32_t> &&
    std::is_same_v<decltype(P::on_hit(std::uint32_t{}, std::uint32_t{})), std::uint32_t> &&
    std::is_same_v<decltype(P::eviction_key(std::uint32_t{}, std::int32_t{})), std::uint64_t>>>
  : std::true_type {};

/// True when `P` has the eviction policy hooks (see policy/lru.cuh).
template <class P>
inline constexpr bool is_eviction_policy_v = is_eviction_policy<P>::value;

template <class P, class = void>
struct is_budget_policy : std::false_type {};

template <class P>
struct is_budget_policy<
  P,
  std::enable_if_t<std::is_convertible_v<decltype(P::slots_per_request), std::int32_t>>>
  : std::true_type {};

/// True when `P` has the budget policy members (see policy/static_budget.cuh).
template <class P>
inline constexpr bool is_budget_policy_v = is_budget_policy<P>::value;

}  // namespace dhisparse
