/**
 * @file draft_ring.cuh
 * @brief Window-bounded ring of the draft model's per-layer KV / context features, per
 *        request, entirely on the GPU.
 *
 * A drafter (DFlash-style block drafter with a sliding window, an MTP head, EAGLE) keeps
 * per request only the rows of its last W positions. The ring holds them in
 * B × W slots of `layers` rows each, so its memory is B · W · layers · row_bytes whatever
 * the context length. Each step, rows of new positions are appended (copied from a
 * staging buffer, or written in place by the drafter and then `advance`d), and the rows of
 * rejected draft positions are rolled back; both read their per-request counts from
 * device memory (e.g. the accepted counts written by `verify_async`), run in fixed shapes
 * and never synchronize, so they can be captured in a CUDA graph with the rest of a step.
 * A draft attention kernel reads the window through `draft_ring_ref` (position → slot
 * across the wrap).
 *
 * Bad per-request counts raise bits of `draft_ring_status` in a device word and leave that
 * request's ring unchanged; `draft_ring::check_status_sync` turns them into an exception.
 *
 * @code
 * dhisparse::draft_ring ring(B, 2048, draft_layers, row_bytes);
 * // drafter wrote d rows per request at ring.ref().append_slot(b, j):
 * ring.advance_async(d_drafted, d, nullptr, stream);
 * dhisparse::verify_async(v, stream);                        // writes v.accepted
 * ring.rollback_async(d_drafted, v.accepted, nullptr, stream);  // drop the rejected rows
 * @endcode
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/draft_ring_ref.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace dhisparse {

namespace detail::draft_ring {
/// The checks every operation makes: the view, and its status word.
inline std::string operation_problem(draft_ring_ref const& ring, std::uint32_t const* status)
{
  std::string problem = draft_ring_ref_problem(ring);
  if (problem.empty() && status == nullptr) { problem = "draft_ring: status is null"; }
  return problem;
}
}  // namespace detail::draft_ring

/// The arguments `draft_ring_append_async` checks: a message naming the first bad one, or empty.
inline std::string draft_ring_append_problem(draft_ring_ref const& ring, draft_ring_rows const& rows,
                                             std::int32_t const* counts, int max_count, std::uint32_t const* status)
{
  std::string const problem = detail::draft_ring::operation_problem(ring, status);
  if (!problem.empty()) { return problem; }
  if (counts == nullptr) { return "draft_ring: counts is null"; }
  if (max_count < 0) { return "draft_ring: max_count is negative"; }
  if (max_count > 0 && rows.rows == nullptr) { return "draft_ring: rows (the staging buffer) is null"; }
  auto const l = detail::draft_ring::rows_layout::of(rows, ring, max_count);
  if (reinterpret_cast<std::uintptr_t>(rows.rows) % 16 != 0 || l.layer % 16 != 0 || l.position % 16 != 0 ||
      l.request % 16 != 0) {
    return "draft_ring: rows (the staging buffer) or its strides are not multiples of 16 bytes";
  }
  return {};
}

/// The arguments `draft_ring_advance_async` checks: a message naming the first bad one, or empty.
inline std::string draft_ring_advance_problem(draft_ring_ref const& ring, std::int32_t const* counts, int max_count,
                                              std::uint32_t const* status)
{
  std::string const problem = detail::draft_ring::operation_problem(ring, status);
  if (!problem.empty()) { return problem; }
  if (counts == nullptr) { return "draft_ring: counts is null"; }
  if (max_count < 0) { return "draft_ring: max_count is negative"; }
  return {};
}

/// The arguments `draft_ring_rollback_async` checks: a message naming the first bad one, or empty.
inline std::string draft_ring_rollback_problem(draft_ring_ref const& ring, std::int32_t const* drafted,
                                               std::uint32_t const* status)
{
  std::string const problem = detail::draft_ring::operation_problem(ring, status);
  if (!problem.empty()) { return problem; }
  if (drafted == nullptr) { return "draft_ring: drafted is null"; }
  return {};
}

/// The arguments `draft_ring_keep_async` checks: a message naming the first bad one, or empty.
inline std::string draft_ring_keep_problem(draft_ring_ref const& ring, std::int32_t const* drafted,
                                           std::int32_t const* nodes, int nodes_stride, int entries,
                                           std::uint32_t const* status)
{
  std::string const problem = detail::draft_ring::operation_problem(ring, status);
  if (!problem.empty()) { return problem; }
  if (drafted == nullptr) { return "draft_ring: drafted is null"; }
  if (entries < 0) { return "draft_ring: entries is negative"; }
  if (nodes != nullptr && nodes_stride < 0) { return "draft_ring: nodes_stride is negative"; }
  return {};
}

/// The arguments `draft_ring_reset_async` checks: a message naming the first bad one, or empty.
inline std::string draft_ring_reset_problem(draft_ring_ref const& ring, std::int32_t const* requests, int count,
                                            std::uint32_t const* status)
{
  std::string const problem = detail::draft_ring::operation_problem(ring, status);
  if (!problem.empty()) { return problem; }
  if (count < 0) { return "draft_ring: count is negative"; }
  if (count > 0 && requests == nullptr) { return "draft_ring: requests is null"; }
  return {};
}

/**
 * @brief Appends `counts[b]` staged rows to each request's ring (asynchronous,
 *        graph-capturable). Positions end[b] .. end[b] + counts[b] − 1 get the staged rows
 *        0 .. counts[b] − 1; beyond `window` rows only the last `window` are kept.
 *
 * @param ring the ring (device memory)
 * @param rows staging buffer: `[capacity][max_count][layers][row_bytes]` or strided (bytes,
 *        multiples of 16, 16-byte aligned)
 * @param counts device `[capacity]`: rows per request, in [0, max_count]
 * @param max_count the most rows a request may append (size of the staging buffer)
 * @param batch_size device `[1]` or nullptr: requests ≥ it are skipped
 * @param status device word: ORed with `draft_ring_status` bits
 * @param stream the stream to run on
 * @return `cudaErrorInvalidValue` (nothing enqueued) when `draft_ring_append_problem` reports
 *         a problem, else the launch status
 */
inline cudaError_t draft_ring_append_async(draft_ring_ref const& ring, draft_ring_rows const& rows,
                                    std::int32_t const* counts, int max_count,
                                    std::int32_t const* batch_size, std::uint32_t* status,
                                    cudaStream_t stream);

/**
 * @brief Makes rows the drafter wrote in place (`ring.append_slot(b, j)`, j <
 *        counts[b]) part of each request's window: end and length advance.
 * @param ring the ring (device memory)
 * @param counts device `[capacity]`: rows written per request, in [0, max_count]
 * @param max_count upper bound of a count (larger counts are flagged and skipped)
 * @param batch_size device `[1]` or nullptr
 * @param status device word: ORed with `draft_ring_status` bits
 * @param stream the stream to run on
 * @return `cudaErrorInvalidValue` (nothing enqueued) when `draft_ring_advance_problem`
 *         reports a problem, else the launch status
 */
inline cudaError_t draft_ring_advance_async(draft_ring_ref const& ring, std::int32_t const* counts, int max_count,
                                     std::int32_t const* batch_size, std::uint32_t* status,
                                     cudaStream_t stream);

/**
 * @brief Rolls back the newest `drafted[b] − accepted[b]` positions of each request (the
 *        rejected drafts), across the wrap. Rolling back more rows than the ring holds
 *        raises `rollback_past_window` (the older rows were already overwritten) and
 *        empties it.
 * @param ring the ring (device memory)
 * @param drafted device `[capacity]`: rows added for this step's drafts
 * @param accepted device `[capacity]` or nullptr (0): rows to keep of them
 * @param batch_size device `[1]` or nullptr
 * @param status device word: ORed with `draft_ring_status` bits
 * @param stream the stream to run on
 * @return `cudaErrorInvalidValue` (nothing enqueued) when `draft_ring_rollback_problem`
 *         reports a problem, else the launch status
 */
inline cudaError_t draft_ring_rollback_async(draft_ring_ref const& ring, std::int32_t const* drafted,
                                      std::int32_t const* accepted, std::int32_t const* batch_size,
                                      std::uint32_t* status, cudaStream_t stream);

/**
 * @brief Keeps the rows of the drafts verification accepted and rolls back the others,
 *        for chains and trees (asynchronous, graph-capturable): of the newest `drafted[b]`
 *        rows of ring request `ring_index[b]` — row j belonging to draft node j + 1 — the
 *        rows of the nodes `nodes[b][0 .. kept[b])` (increasing, in [1, drafted[b]]; kept[b] at
 *        most `nodes_stride`, else `bad_path`) move,
 *        in that order, onto the first `kept[b]` of those positions; the others are rolled
 *        back. With `nodes` null the kept nodes are 1 … kept[b]: exactly `rollback(drafted,
 *        kept)`. Rows of a tree path move within the ring (one row copy per layer and moved
 *        node); a chain moves nothing.
 * @param ring the ring (device memory)
 * @param drafted device `[entries]`: rows the drafter added this step
 * @param kept device `[entries]` or nullptr (0): accepted drafts to keep
 * @param nodes device `[entries][nodes_stride]` or nullptr: the accepted nodes in path order
 *        (`verify_params::accepted_nodes`)
 * @param nodes_stride row length of `nodes` (verify's max_drafts)
 * @param ring_index device `[entries]` or nullptr (entry b is ring request b): the ring
 *        request of each entry; entries must name distinct requests
 * @param entries entries (host value; the grid)
 * @param batch_size device `[1]` or nullptr: entries ≥ it are skipped
 * @param status device word: ORed with `draft_ring_status` bits (`bad_count`, `bad_path` and
 *        `bad_request` skip that entry)
 * @param stream the stream to run on
 * @return `cudaErrorInvalidValue` (nothing enqueued) when `draft_ring_keep_problem` reports
 *         a problem, else the launch status
 */
inline cudaError_t draft_ring_keep_async(draft_ring_ref const& ring, std::int32_t const* drafted,
                                         std::int32_t const* kept, std::int32_t const* nodes, int nodes_stride,
                                         std::int32_t const* ring_index, int entries,
                                         std::int32_t const* batch_size, std::uint32_t* status,
                                         cudaStream_t stream);

/**
 * @brief Empties the rings of `count` requests (a request slot reused by a new request);
 *        the next row of requests[i] gets position start[i] (nullptr: 0). Each request may
 *        appear once.
 * @param ring the ring (device memory)
 * @param requests device `[count]` request indices
 * @param start device `[count]` or nullptr: first position of each new stream
 * @param count entries (host value)
 * @param status device word: ORed with `draft_ring_status` bits
 * @param stream the stream to run on
 * @return `cudaErrorInvalidValue` (nothing enqueued) when `draft_ring_reset_problem` reports
 *         a problem, else the launch status
 */
inline cudaError_t draft_ring_reset_async(draft_ring_ref const& ring, std::int32_t const* requests,
                                   std::int64_t const* start, int count, std::uint32_t* status,
                                   cudaStream_t stream);

/**
 * @brief Owning draft ring: the rows (own allocation or caller memory), the per-request
 *        end / length and a status word, on the current device. Move-only.
 */
class draft_ring {
 public:
  /// Bytes of the metadata of a ring of `capacity` requests: end (int64) and length per
  /// request, then the status word.
  static std::size_t meta_bytes(int capacity)
  {
    return std::size_t(capacity) * (sizeof(std::int64_t) + sizeof(std::int32_t)) + 16;
  }
  /// Bytes of the rows of a ring of this shape.
  static std::size_t rows_bytes(int capacity, int window, int layers, std::size_t row_bytes)
  {
    return std::size_t(capacity) * std::size_t(window) * std::size_t(layers) * row_bytes;
  }

  /**
   * @brief Allocates a ring for `capacity` requests of `window` slots of `layers` rows of
   *        `row_bytes` bytes; all requests start empty at position 0. Synchronizes the
   *        device once (zeroing the metadata).
   * @param rows caller memory for the rows (≥ `rows_bytes(…)`, 16-byte aligned, not
   *        freed by the ring) or nullptr to allocate it
   * @param rows_size bytes available at `rows`
   * @param resources where the metadata and (without `rows`) the rows come from (device
   *        memory, allocated and returned on the legacy default stream)
   * @throws dhisparse::error naming the bad argument, or on a failed allocation
   */
  draft_ring(int capacity, int window, int layers, std::size_t row_bytes, void* rows = nullptr,
             std::size_t rows_size = 0, memory_resources const& resources = {})
  {
    ref_.capacity  = capacity;
    ref_.window    = window;
    ref_.layers    = layers;
    ref_.row_bytes = std::int64_t(row_bytes);
    ref_.data      = static_cast<std::byte*>(rows);
    std::string problem = draft_ring_shape_problem(capacity, window, layers, ref_.row_bytes);
    if (problem.empty() && rows && rows_size < rows_bytes(capacity, window, layers, row_bytes)) {
      problem = "draft_ring: rows_size (" + std::to_string(rows_size) + ") is smaller than the ring (" +
                std::to_string(rows_bytes(capacity, window, layers, row_bytes)) + " bytes)";
    }
    if (problem.empty() && reinterpret_cast<std::uintptr_t>(rows) % 16 != 0) {
      problem = "draft_ring: rows (caller memory) is not 16-byte aligned";
    }
    DHISPARSE_EXPECTS_NO_PROBLEM(problem);
    device_memory_resource& device = detail::device_resource(resources);
    meta_ = detail::device_array<std::byte>(meta_bytes(capacity), device, nullptr);
    if (rows == nullptr && capacity > 0) {
      owned_rows_ = detail::device_array<std::byte>(rows_bytes(capacity, window, layers, row_bytes), device, nullptr);
      ref_.data   = owned_rows_.data();
      // Rows not yet drafted read as zeros (a copy of the whole ring then copies no
      // uninitialized memory; compute-sanitizer initcheck finding F16).
      DHISPARSE_CUDA_TRY(cudaMemset(owned_rows_.data(), 0, owned_rows_.bytes()));
    }
    ref_.end    = reinterpret_cast<std::int64_t*>(meta_.data());
    ref_.length = reinterpret_cast<std::int32_t*>(ref_.end + capacity);
    status_     = reinterpret_cast<std::uint32_t*>(ref_.length + capacity);
    DHISPARSE_CUDA_TRY(cudaMemset(meta_.data(), 0, meta_.bytes()));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  }

  /**
   * @brief Device memory a ring of this shape allocates: the metadata and, unless
   *        `caller_rows`, the rows (see `memory_footprint`).
   * @throws dhisparse::error naming the bad argument, as the constructor
   */
  static memory_footprint bytes_required(int capacity, int window, int layers, std::size_t row_bytes,
                                         bool caller_rows)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_shape_problem(capacity, window, layers, std::int64_t(row_bytes)));
    memory_footprint f{};
    f.device_bytes = meta_bytes(capacity);
    if (!caller_rows && capacity > 0) { f.device_bytes += rows_bytes(capacity, window, layers, row_bytes); }
    return f;
  }

  draft_ring(draft_ring&& o) noexcept { swap(o); }
  draft_ring& operator=(draft_ring&& o) noexcept
  {
    swap(o);
    return *this;
  }
  draft_ring(draft_ring const&)            = delete;
  draft_ring& operator=(draft_ring const&) = delete;
  ~draft_ring() = default;

  /// The view kernels read (device pointers).
  draft_ring_ref ref() const noexcept { return ref_; }
  /// Device status word the operations OR their `draft_ring_status` bits into.
  std::uint32_t* status() const noexcept { return status_; }
  /// Device memory held: rows plus metadata; independent of context length.
  std::size_t memory_bytes() const noexcept
  {
    return std::size_t(ref_.data_bytes()) + std::size_t(ref_.capacity) * 12 + 16;
  }

  /// `draft_ring_append_async` on this ring; throws naming a bad argument.
  void append_async(draft_ring_rows const& rows, std::int32_t const* counts, int max_count,
                    std::int32_t const* batch_size, cudaStream_t stream)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_append_problem(ref_, rows, counts, max_count, status_));
    DHISPARSE_CUDA_TRY(draft_ring_append_async(ref_, rows, counts, max_count, batch_size, status_, stream));
  }
  /// `draft_ring_advance_async` on this ring; throws naming a bad argument.
  void advance_async(std::int32_t const* counts, int max_count, std::int32_t const* batch_size,
                     cudaStream_t stream)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_advance_problem(ref_, counts, max_count, status_));
    DHISPARSE_CUDA_TRY(draft_ring_advance_async(ref_, counts, max_count, batch_size, status_, stream));
  }
  /// `draft_ring_rollback_async` on this ring; throws naming a bad argument.
  void rollback_async(std::int32_t const* drafted, std::int32_t const* accepted, std::int32_t const* batch_size,
                      cudaStream_t stream)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_rollback_problem(ref_, drafted, status_));
    DHISPARSE_CUDA_TRY(draft_ring_rollback_async(ref_, drafted, accepted, batch_size, status_, stream));
  }
  /// `draft_ring_keep_async` on this ring; throws naming a bad argument.
  void keep_async(std::int32_t const* drafted, std::int32_t const* kept, std::int32_t const* nodes, int nodes_stride,
                  std::int32_t const* ring_index, int entries, std::int32_t const* batch_size, cudaStream_t stream)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_keep_problem(ref_, drafted, nodes, nodes_stride, entries, status_));
    DHISPARSE_CUDA_TRY(draft_ring_keep_async(ref_, drafted, kept, nodes, nodes_stride, ring_index, entries,
                                             batch_size, status_, stream));
  }
  /// `draft_ring_reset_async` on this ring; throws naming a bad argument.
  void reset_async(std::int32_t const* requests, std::int64_t const* start, int count, cudaStream_t stream)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(draft_ring_reset_problem(ref_, requests, count, status_));
    DHISPARSE_CUDA_TRY(draft_ring_reset_async(ref_, requests, start, count, status_, stream));
  }

  /**
   * @brief Reads and clears the status word (synchronizes `stream`); throws
   *        `dhisparse::error` describing the bad arguments when it was not zero.
   */
  void check_status_sync(cudaStream_t stream)
  {
    std::uint32_t bits = 0;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&bits, status_, sizeof bits, cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(status_, 0, sizeof bits, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    DHISPARSE_EXPECTS(bits == 0, "draft_ring: invalid input: " + describe_status(bits, status_format::explained));
  }

 private:
  void swap(draft_ring& o) noexcept
  {
    std::swap(ref_, o.ref_);
    std::swap(status_, o.status_);
    std::swap(meta_, o.meta_);
    std::swap(owned_rows_, o.owned_rows_);
  }

  draft_ring_ref ref_{};
  std::uint32_t* status_ = nullptr;
  detail::device_array<std::byte> meta_;        // end, length per request; status word
  detail::device_array<std::byte> owned_rows_;  // empty with caller rows
};

}  // namespace dhisparse

#include <dhisparse/detail/draft_ring/kernels.cuh>

namespace dhisparse {

inline cudaError_t draft_ring_append_async(draft_ring_ref const& ring, draft_ring_rows const& rows,
                                           std::int32_t const* counts, int max_count,
                                           std::int32_t const* batch_size, std::uint32_t* status,
                                           cudaStream_t stream)
{
  if (!draft_ring_append_problem(ring, rows, counts, max_count, status).empty()) { return cudaErrorInvalidValue; }
  if (ring.capacity == 0) { return cudaSuccess; }
  auto const l = detail::draft_ring::rows_layout::of(rows, ring, max_count);
  detail::draft_ring::append_kernel<0><<<ring.capacity, detail::draft_ring::copy_threads, 0, stream>>>(
    ring, rows, l, counts, max_count, batch_size, status);
  return detail::check_launch(stream);
}

inline cudaError_t draft_ring_advance_async(draft_ring_ref const& ring, std::int32_t const* counts, int max_count,
                                            std::int32_t const* batch_size, std::uint32_t* status,
                                            cudaStream_t stream)
{
  if (!draft_ring_advance_problem(ring, counts, max_count, status).empty()) { return cudaErrorInvalidValue; }
  if (ring.capacity == 0) { return cudaSuccess; }
  int const t = detail::draft_ring::meta_threads;
  detail::draft_ring::advance_kernel<0><<<(ring.capacity + t - 1) / t, t, 0, stream>>>(ring, counts, max_count,
                                                                                      batch_size, status);
  return detail::check_launch(stream);
}

inline cudaError_t draft_ring_rollback_async(draft_ring_ref const& ring, std::int32_t const* drafted,
                                             std::int32_t const* accepted, std::int32_t const* batch_size,
                                             std::uint32_t* status, cudaStream_t stream)
{
  if (!draft_ring_rollback_problem(ring, drafted, status).empty()) { return cudaErrorInvalidValue; }
  if (ring.capacity == 0) { return cudaSuccess; }
  int const t = detail::draft_ring::meta_threads;
  detail::draft_ring::rollback_kernel<0><<<(ring.capacity + t - 1) / t, t, 0, stream>>>(ring, drafted, accepted,
                                                                                       batch_size, status);
  return detail::check_launch(stream);
}

inline cudaError_t draft_ring_keep_async(draft_ring_ref const& ring, std::int32_t const* drafted,
                                         std::int32_t const* kept, std::int32_t const* nodes, int nodes_stride,
                                         std::int32_t const* ring_index, int entries,
                                         std::int32_t const* batch_size, std::uint32_t* status,
                                         cudaStream_t stream)
{
  if (!draft_ring_keep_problem(ring, drafted, nodes, nodes_stride, entries, status).empty()) {
    return cudaErrorInvalidValue;
  }
  if (entries == 0 || ring.capacity == 0) { return cudaSuccess; }
  detail::draft_ring::keep_kernel<0><<<entries, detail::draft_ring::copy_threads, 0, stream>>>(
    ring, drafted, kept, nodes, nodes_stride, ring_index, entries, batch_size, status);
  return detail::check_launch(stream);
}

inline cudaError_t draft_ring_reset_async(draft_ring_ref const& ring, std::int32_t const* requests,
                                          std::int64_t const* start, int count, std::uint32_t* status,
                                          cudaStream_t stream)
{
  if (!draft_ring_reset_problem(ring, requests, count, status).empty()) { return cudaErrorInvalidValue; }
  if (count == 0) { return cudaSuccess; }
  int const t = detail::draft_ring::meta_threads;
  detail::draft_ring::reset_kernel<0><<<(count + t - 1) / t, t, 0, stream>>>(ring, requests, start, count, status);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
