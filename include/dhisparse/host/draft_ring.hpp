/**
 * @file host/draft_ring.hpp
 * @brief Reference backend of the draft ring (plain C++, no CUDA needed): the same
 *        operations and status bits as `dhisparse::draft_ring`, on host memory, through the
 *        same `draft_ring_ref` view.
 */
#pragma once

#include <dhisparse/draft_ring_ref.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dhisparse::host {

/**
 * @brief Reference of one request's part of `draft_ring_keep_async` on a ring in host
 *        memory: of the newest `drafted` rows of ring request `request` (row j of them
 *        belongs to draft node j + 1), keeps those of `nodes[0 .. kept)` (increasing, in
 *        [1, drafted]; nullptr: nodes 1 … kept; a row of `max_nodes` entries), moved in path
 *        order onto the first `kept` of those positions, and rolls back the rest. Returns
 *        the `draft_ring_status` bits; with `bad_count` or `bad_path` nothing changes.
 */
inline std::uint32_t draft_ring_keep_rows(draft_ring_ref const& ring, int request, std::int32_t drafted,
                                          std::int32_t kept, std::int32_t const* nodes, std::int64_t max_nodes)
{
  std::uint32_t const bad = detail::draft_ring::check_keep(drafted, kept, nodes, max_nodes);
  if (bad != 0) { return bad; }
  std::int64_t end    = ring.end[request];
  std::int32_t length = ring.length[request];
  if (drafted > end) { return draft_ring_status::bad_count; }
  std::int64_t const base = end - drafted;  // position of the step's first drafted row
  for (std::int32_t k = 1; k <= kept && nodes != nullptr; ++k) {
    std::int64_t const from = base + nodes[k - 1] - 1, to = base + k - 1;
    if (from == to || to < end - length) { continue; }  // in place, or no longer held
    for (int layer = 0; layer < ring.layers; ++layer) {
      std::memmove(ring.row(layer, request, ring.slot(to)), ring.row(layer, request, ring.slot(from)),
                   std::size_t(ring.row_bytes));
    }
  }
  std::uint32_t const bits = detail::draft_ring::shrink(end, length, std::int64_t(drafted) - kept);
  ring.end[request]        = end;
  ring.length[request]     = length;
  return bits;
}

/**
 * @brief Host draft ring: rows, per-request end / length and a status word in host
 *        memory. Operations take host arrays and behave exactly like the kernels.
 */
class draft_ring {
 public:
  /**
   * @brief A ring for `capacity` requests of `window` slots of `layers` rows of
   *        `row_bytes` bytes, every request empty at position 0; the rows start filled
   *        with `fill`.
   * @throws dhisparse::error naming a bad argument
   */
  draft_ring(int capacity, int window, int layers, std::size_t row_bytes, std::byte fill = std::byte{0})
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_shape_problem(capacity, window, layers, std::int64_t(row_bytes)));
    rows_.assign(std::size_t(capacity) * window * layers * row_bytes, fill);
    end_.assign(capacity, 0);
    length_.assign(capacity, 0);
    ref_ = draft_ring_ref{rows_.data(), end_.data(), length_.data(), capacity, window, layers,
                          std::int64_t(row_bytes)};
  }
  draft_ring(draft_ring const&)            = delete;
  draft_ring& operator=(draft_ring const&) = delete;

  /// The view over host memory.
  draft_ring_ref const& ref() const noexcept { return ref_; }
  std::uint32_t status() const noexcept { return status_; }
  void clear_status() noexcept { status_ = 0; }
  /// The status word itself (e.g. for `verified_step::ring_status`).
  std::uint32_t* status_word() noexcept { return &status_; }
  std::vector<std::byte> const& rows() const noexcept { return rows_; }
  std::vector<std::int64_t> const& end() const noexcept { return end_; }
  std::vector<std::int32_t> const& length() const noexcept { return length_; }

  /// See `draft_ring_append_async` (host arrays).
  void append(draft_ring_rows const& rows, std::int32_t const* counts, int max_count, std::int32_t const* batch_size)
  {
    auto const l = detail::draft_ring::rows_layout::of(rows, ref_, max_count);
    for (int b = 0; b < batch(batch_size); ++b) {
      std::int32_t const count = counts[b];
      if (count < 0 || count > max_count) {
        status_ |= draft_ring_status::bad_count;
        continue;
      }
      for (std::int32_t j = std::max(0, count - ref_.window); j < count; ++j) {
        for (int layer = 0; layer < ref_.layers; ++layer) {
          std::memcpy(ref_.row(layer, b, ref_.slot(end_[b] + j)), rows.rows + b * l.request + j * l.position + layer * l.layer,
                      std::size_t(ref_.row_bytes));
        }
      }
      detail::draft_ring::grow(end_[b], length_[b], count, ref_.window);
    }
  }

  /// See `draft_ring_advance_async` (host arrays).
  void advance(std::int32_t const* counts, int max_count, std::int32_t const* batch_size)
  {
    for (int b = 0; b < batch(batch_size); ++b) {
      if (counts[b] < 0 || counts[b] > max_count) {
        status_ |= draft_ring_status::bad_count;
        continue;
      }
      detail::draft_ring::grow(end_[b], length_[b], counts[b], ref_.window);
    }
  }

  /// See `draft_ring_rollback_async` (host arrays).
  void rollback(std::int32_t const* drafted, std::int32_t const* accepted, std::int32_t const* batch_size)
  {
    for (int b = 0; b < batch(batch_size); ++b) {
      std::int64_t const count = drafted[b] < 0 ? -1 : std::int64_t(drafted[b]) - (accepted ? accepted[b] : 0);
      std::int64_t e           = end_[b];
      std::int32_t len         = length_[b];
      std::uint32_t const bits = detail::draft_ring::shrink(e, len, count);
      status_ |= bits;
      if (bits & draft_ring_status::bad_count) { continue; }
      end_[b]    = e;
      length_[b] = len;
    }
  }

  /// See `draft_ring_keep_async` (host arrays).
  void keep(std::int32_t const* drafted, std::int32_t const* kept, std::int32_t const* nodes, int nodes_stride,
            std::int32_t const* ring_index, int entries, std::int32_t const* batch_size)
  {
    int n = batch_size ? *batch_size : entries;
    if (n < 0 || n > entries) {
      status_ |= draft_ring_status::bad_batch_size;
      n = n < 0 ? 0 : entries;
    }
    for (int b = 0; b < n; ++b) {
      int const r = ring_index ? ring_index[b] : b;
      if (r < 0 || r >= ref_.capacity) {
        status_ |= draft_ring_status::bad_request;
        continue;
      }
      status_ |= draft_ring_keep_rows(ref_, r, drafted[b], kept ? kept[b] : 0,
                                      nodes ? nodes + std::int64_t(b) * nodes_stride : nullptr, nodes_stride);
    }
  }

  /// See `draft_ring_reset_async` (host arrays).
  void reset(std::int32_t const* requests, std::int64_t const* start, int count)
  {
    for (int i = 0; i < count; ++i) {
      std::int32_t const r = requests[i];
      if (r < 0 || r >= ref_.capacity) {
        status_ |= draft_ring_status::bad_request;
        continue;
      }
      std::int64_t const s = start ? start[i] : 0;
      if (s < 0) {
        status_ |= draft_ring_status::bad_start;
        continue;
      }
      end_[r]    = s;
      length_[r] = 0;
    }
  }

 private:
  int batch(std::int32_t const* batch_size)
  {
    int b = batch_size ? *batch_size : ref_.capacity;
    if (b < 0 || b > ref_.capacity) {
      status_ |= draft_ring_status::bad_batch_size;
      b = b < 0 ? 0 : ref_.capacity;
    }
    return b;
  }

  std::vector<std::byte> rows_;
  std::vector<std::int64_t> end_;
  std::vector<std::int32_t> length_;
  draft_ring_ref ref_{};
  std::uint32_t status_ = 0;
};

}  // namespace dhisparse::host
