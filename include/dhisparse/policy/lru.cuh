/**
 * @file policy/lru.cuh
 * @brief Least-recently-used eviction: the row whose last selection is oldest goes first
 *        (HiSparse's policy). The contract of eviction policies is in policy/concepts.hpp.
 */
#pragma once

#include <dhisparse/policy/concepts.hpp>

namespace dhisparse::policy {

/// @brief Least recently used first; ties within one step broken by the lower position.
/// State = epoch of the last selection (or insertion); key = state.
struct lru : eviction_defaults {};

}  // namespace dhisparse::policy
