/**
 * @file draft_ring_ref.hpp
 * @brief The view of a draft ring, shared by the CUDA kernels (`dhisparse/draft_ring.cuh`)
 *        and the host reference (`dhisparse/host/draft_ring.hpp`), so it is plain C++. The
 *        types are public (namespace `dhisparse`); the ring's status bits,
 *        `draft_ring_status`, are in status.hpp.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/status.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse {

/**
 * @brief Non-owning view of a draft ring: per request a window of `window` slots, each
 *        slot holding one row per draft layer. Trivially copyable: pass it to kernels by
 *        value (device memory) or use it on the host (host memory, the reference).
 *
 * Request b holds the rows of logical positions [end[b] − length[b], end[b]); position x
 * lives in slot x mod window. A draft attention kernel reads the j-th oldest row held with
 * `row(layer, b, slot_of_index(b, j))`, j in [0, length[b]); a drafter writing its new
 * rows in place writes the j-th at `row(layer, b, append_slot(b, j))` and then calls
 * `advance`.
 */
struct draft_ring_ref {
  std::byte* data        = nullptr;  ///< [layers][capacity][window][row_bytes]
  std::int64_t* end      = nullptr;  ///< [capacity] position after the newest row
  std::int32_t* length   = nullptr;  ///< [capacity] rows held, ≤ window
  int capacity           = 0;        ///< B: requests
  int window             = 0;        ///< W: slots per request
  int layers             = 0;        ///< rows per slot (draft layers)
  std::int64_t row_bytes = 0;        ///< bytes of one row, a multiple of 16

  /// Slot of logical position `position` (≥ 0).
  DHISPARSE_HOST_DEVICE std::int32_t slot(std::int64_t position) const
  {
    return std::int32_t(position % window);
  }
  /// First byte of the row of `layer` in `slot` of `request`.
  DHISPARSE_HOST_DEVICE std::byte* row(int layer, int request, std::int32_t slot) const
  {
    return data + ((std::int64_t(layer) * capacity + request) * window + slot) * row_bytes;
  }
  /// Oldest position held by `request`.
  DHISPARSE_HOST_DEVICE std::int64_t first_position(int request) const
  {
    return end[request] - length[request];
  }
  /// Slot of the j-th oldest row held by `request`, j in [0, length[request]).
  DHISPARSE_HOST_DEVICE std::int32_t slot_of_index(int request, std::int32_t j) const
  {
    return slot(first_position(request) + j);
  }
  /// Slot that the j-th row appended next to `request` goes to.
  DHISPARSE_HOST_DEVICE std::int32_t append_slot(int request, std::int32_t j) const
  {
    return slot(end[request] + j);
  }
  /// Bytes of the rows (the bound on the ring's memory, whatever the context length).
  DHISPARSE_HOST_DEVICE std::int64_t data_bytes() const
  {
    return std::int64_t(layers) * capacity * window * row_bytes;
  }
};
static_assert(std::is_trivially_copyable_v<draft_ring_ref>);

/**
 * @brief Checks the shape of a ring: positive window and layers, rows a positive multiple
 *        of 16 bytes (rows are moved in 16-byte vectors). Returns a message naming the
 *        argument, or an empty string.
 */
inline std::string draft_ring_shape_problem(int capacity, int window, int layers, std::int64_t row_bytes)
{
  if (capacity < 0) { return "draft_ring: capacity is negative"; }
  if (window <= 0) { return "draft_ring: window must be positive"; }
  if (layers <= 0) { return "draft_ring: layers must be positive"; }
  if (row_bytes <= 0 || row_bytes % 16 != 0) {
    return "draft_ring: row_bytes (" + std::to_string(row_bytes) + ") must be a positive multiple of 16";
  }
  return {};
}

/// `draft_ring_shape_problem`, and the view's pointers: present, data 16-byte aligned.
inline std::string draft_ring_ref_problem(draft_ring_ref const& r)
{
  std::string const shape = draft_ring_shape_problem(r.capacity, r.window, r.layers, r.row_bytes);
  if (!shape.empty()) { return shape; }
  if (r.capacity > 0 && (r.data == nullptr || r.end == nullptr || r.length == nullptr)) {
    return "draft_ring: data / end / length are null";
  }
  if (reinterpret_cast<std::uintptr_t>(r.data) % 16 != 0) { return "draft_ring: data is not 16-byte aligned"; }
  return {};
}

/**
 * @brief Rows to append (a staging buffer the draft model or the target filled), per
 *        request `counts[b]` of them. Strides are in bytes; 0 means packed.
 */
struct draft_ring_rows {
  std::byte const* rows        = nullptr;  ///< [capacity][max_count][layers][row_bytes]
  std::int64_t request_stride  = 0;        ///< 0: max_count · position_stride
  std::int64_t position_stride = 0;        ///< 0: layers · layer_stride
  std::int64_t layer_stride    = 0;        ///< 0: row_bytes
};

namespace detail::draft_ring {

/// Strides of a `draft_ring_rows` with the zeros filled in.
struct rows_layout {
  std::int64_t request, position, layer;
  DHISPARSE_HOST_DEVICE static rows_layout of(draft_ring_rows const& r, draft_ring_ref const& ring,
                                              int max_count)
  {
    rows_layout l{};
    l.layer    = r.layer_stride ? r.layer_stride : ring.row_bytes;
    l.position = r.position_stride ? r.position_stride : ring.layers * l.layer;
    l.request  = r.request_stride ? r.request_stride : max_count * l.position;
    return l;
  }
};

/// Effect of an append / advance of `count` rows on (end, length).
DHISPARSE_HOST_DEVICE inline void grow(std::int64_t& end, std::int32_t& length, std::int32_t count, int window)
{
  end += count;
  std::int64_t const held = std::int64_t(length) + count;
  length                  = std::int32_t(held < window ? held : window);
}

/**
 * Checks a keep (`draft_ring_keep_async`): of the newest `drafted` rows, `kept` along
 * `nodes` (nullptr: nodes 1 … kept), a row of `max_nodes` entries (a longer path is
 * `bad_path`: it would be read past its row). Returns the status bits; non-zero means
 * skipped.
 */
DHISPARSE_HOST_DEVICE inline std::uint32_t check_keep(std::int32_t drafted, std::int32_t kept,
                                                      std::int32_t const* nodes, std::int64_t max_nodes)
{
  if (drafted < 0 || kept < 0 || kept > drafted) { return draft_ring_status::bad_count; }
  if (nodes != nullptr) {
    if (kept > max_nodes) { return draft_ring_status::bad_path; }
    std::int32_t previous = 0;
    for (std::int32_t k = 0; k < kept; ++k) {
      if (nodes[k] <= previous || nodes[k] > drafted) { return draft_ring_status::bad_path; }
      previous = nodes[k];
    }
  }
  return 0;
}

/// Effect of rolling back `count` rows; returns the status bits it raises.
DHISPARSE_HOST_DEVICE inline std::uint32_t shrink(std::int64_t& end, std::int32_t& length, std::int64_t count)
{
  if (count < 0 || count > end) { return draft_ring_status::bad_count; }
  end -= count;
  if (count > length) {
    length = 0;
    return draft_ring_status::rollback_past_window;
  }
  length -= std::int32_t(count);
  return 0;
}

}  // namespace detail::draft_ring
}  // namespace dhisparse
