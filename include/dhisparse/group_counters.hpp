/**
 * @file group_counters.hpp
 * @brief What a layer group's step kernels count: selected, fetched, evicted, reclaimed,
 *        prewarmed and backed-up rows (plain C++; the GPU keeps them in device memory).
 */
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>

namespace dhisparse {

/// Counters of one layer group since construction. On the GPU they live in device memory
/// and are updated by the step's kernels (`kv_hierarchy::read_counters` copies them
/// without synchronizing the step stream); the host reference keeps the same numbers.
struct group_counters {
  unsigned long long selected_rows;   ///< distinct committed rows selected (hits + fetched)
  unsigned long long fetched_rows;    ///< rows copied host → device by the plan of resolve
  unsigned long long tail_rows;       ///< tail rows given a slot
  unsigned long long evicted_rows;    ///< rows evicted by a request at its cap
  unsigned long long reclaimed_rows;  ///< optional rows released by reclaim (0 bytes moved)
  unsigned long long reclaims;        ///< reclaim passes run
  unsigned long long prewarmed_rows;  ///< rows brought in by prewarm
  unsigned long long backed_up_rows;  ///< rows copied device → host by backup

  /// Fraction of selected rows that had to be fetched from the host store.
  [[nodiscard]] double fetch_fraction() const noexcept
  {
    return selected_rows == 0 ? 0.0 : double(fetched_rows) / double(selected_rows);
  }

  /**
   * @brief Bytes copied host → device: every fetched and prewarmed row, all layers of the
   *        group (`kv_hierarchy::group_row_bytes`). A `retrieve` that replays a plan again
   *        (e.g. a layer range after `resolve_and_retrieve`) copies again and is not counted.
   */
  [[nodiscard]] unsigned long long h2d_bytes(std::size_t group_row_bytes) const noexcept
  {
    return (fetched_rows + prewarmed_rows) * static_cast<unsigned long long>(group_row_bytes);
  }

  /// Bytes copied device → host by backup: every backed-up row, all layers of the group.
  [[nodiscard]] unsigned long long d2h_bytes(std::size_t group_row_bytes) const noexcept
  {
    return backed_up_rows * static_cast<unsigned long long>(group_row_bytes);
  }
};
static_assert(std::is_trivially_copyable_v<group_counters>);

/// The counters' names in field order, for bindings and monitoring (the struct is an array
/// of `unsigned long long` in that order).
inline constexpr char const* group_counter_names[] = {"selected_rows",  "fetched_rows", "tail_rows",
                                                      "evicted_rows",   "reclaimed_rows", "reclaims",
                                                      "prewarmed_rows", "backed_up_rows"};
static_assert(sizeof(group_counters) == std::size(group_counter_names) * sizeof(unsigned long long),
              "group_counter_names lists every field of group_counters");

}  // namespace dhisparse
