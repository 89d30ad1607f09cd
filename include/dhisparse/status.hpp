/**
 * @file status.hpp
 * @brief The device status word: kernels never trap on bad input, they treat the bad
 *        entry as empty and set a bit here that the host can read (plain C++).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {

namespace detail {

/// One bit of a status word and what it means.
struct status_text {
  std::uint32_t bit;
  char const* text;
};

/// The texts of the bits set in `bits`, in table order, joined by `separator`.
template <std::size_t N>
std::string join_set_bits(std::uint32_t bits, status_text const (&table)[N], char const* separator)
{
  std::string out;
  for (auto const& e : table) {
    if (bits & e.bit) { out += (out.empty() ? "" : separator) + std::string(e.text); }
  }
  return out;
}

}  // namespace detail

/// Bits of the status word kept in device memory by `kv_hierarchy` (and by the reference).
enum status_bit : std::uint32_t {
  /// A selection entry was out of range (negative other than -1, or beyond the causal
  /// limit of its query); it was treated as empty. (Order, duplicates and -1 padding
  /// anywhere are valid.)
  status_invalid_selection = 1u << 0,
  /// A request needed more slots than its budget allows even after evicting every
  /// evictable slot; the rows left without a slot appear as -1 in the slot table.
  status_budget_exceeded = 1u << 1,
  /// The device pool had no free slot where the budget allowed one.
  status_pool_exhausted = 1u << 2,
  /// A tail position lies beyond the capacity reserved for its request (`reserve`).
  status_capacity_exceeded = 1u << 3,
  /// More rows were committed than the dirty list holds between two backups; the extra
  /// rows stay resident and dirty (never evicted) until the next backup finds them with a
  /// scan of the pool.
  status_dirty_list_overflow = 1u << 4,
  /// An accepted count passed to `commit` was outside [0, queries of the request], or one
  /// passed to `commit_verified` outside [0, drafts of the request], or its accepted nodes
  /// do not form a path of the step's draft tree; the request's tail was rejected entirely.
  status_invalid_accept_count = 1u << 5,
  /// resolve found a tail position still held by the tail of an earlier resolve that was
  /// never committed (every resolve of a group must be followed by one `commit`); the
  /// request got no new tail rows.
  status_uncommitted_tail = 1u << 6,
  /// `commit` / `commit_verified` reached a tail row to keep that has no slot in some group
  /// (resolve refused it for capacity, budget or pool, or the group was not resolved since
  /// the last commit): the request was committed up to that row and not beyond.
  status_missing_tail = 1u << 7,
  /// `set_drafts` found a draft count outside [0, max_queries − 1] or a parent link that
  /// does not point to an earlier query of the request; that request drafts nothing this
  /// step (one query).
  status_invalid_drafts = 1u << 8,
};

/// Human-readable list of the bits set in `status` ("ok" when none).
inline std::string describe_status(std::uint32_t status)
{
  if (status == 0) { return "ok"; }
  static constexpr detail::status_text names[] = {
    {status_invalid_selection, "invalid_selection"},
    {status_budget_exceeded, "budget_exceeded"},
    {status_pool_exhausted, "pool_exhausted"},
    {status_capacity_exceeded, "capacity_exceeded"},
    {status_dirty_list_overflow, "dirty_list_overflow"},
    {status_invalid_accept_count, "invalid_accept_count"},
    {status_uncommitted_tail, "uncommitted_tail"},
    {status_missing_tail, "missing_tail"},
    {status_invalid_drafts, "invalid_drafts"},
  };
  std::string out     = detail::join_set_bits(status, names, "|");
  std::uint32_t known = 0;
  for (auto const& e : names) { known |= e.bit; }
  if (status & ~known) { out += (out.empty() ? "" : "|") + std::string("unknown"); }
  return out;
}

}  // namespace dhisparse
