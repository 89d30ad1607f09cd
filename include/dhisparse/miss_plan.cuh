/**
 * @file miss_plan.cuh
 * @brief The miss plan: what resolve produces and retrieve consumes.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dhisparse {

/// Copy one group row (all layers of a group) from the host store into a device slot.
struct miss_entry {
  std::byte const* src;   ///< device-accessible address of the group row in the host store
  std::int32_t slot;      ///< destination slot of the group's slab
  std::int32_t position;  ///< the row's position (diagnostics)
};
static_assert(sizeof(miss_entry) == 16);

/// Device view of a plan: entries [0, *count) of `entries`.
struct miss_plan_ref {
  miss_entry* entries;   ///< [capacity]
  std::int32_t* count;   ///< scalar, written by resolve
  std::int32_t capacity;
};
static_assert(std::is_trivially_copyable_v<miss_plan_ref>);

}  // namespace dhisparse
