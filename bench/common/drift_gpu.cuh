/**
 * @file bench/common/drift_gpu.cuh
 * @brief The drift workload (drift.hpp) with scoring and top-K on the GPU, for large
 *        batches and contexts: the same selections and scores as the CPU version for the
 *        same configuration and seed.
 *
 * The host keeps the workload's state machine (a `drift_generator`: queries, jumps, tail
 * keys — O(B · Q · d) work per step); the device holds every request's keys and does the
 * O(B · Q · N · d) part. Per query: exact integer scores of the positions between sinks
 * and window as 64-bit rank keys (`drift_rank_key`), a segmented radix sort (descending)
 * of those keys, the best `top` positions sorted ascending by a second segmented sort,
 * then sinks + those + window written as the selection. Integer scores and totally
 * ordered keys make the result independent of the summation and sorting order.
 */
#pragma once

#include "drift.hpp"

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/error.cuh>

#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace dhisparse::bench {

/// One query's selection parts on the device (request b, query q = segment b · Q + q).
struct drift_segment {
  std::int32_t length;        ///< committed tokens of the request (query q sits at length + q)
  std::int32_t sink_end;      ///< sinks: [0, sink_end)
  std::int32_t window_begin;  ///< window: [window_begin, length + q]
  std::int32_t top;           ///< scored positions selected from [sink_end, window_begin)
};

namespace detail {

/// Places this step's tail keys: keys[b][length_b + q] = tails[b][q] (one block per segment).
template <class Key>
DHISPARSE_KERNEL void drift_tail_kernel(Key* keys, Key const* tails, drift_segment const* segments, int queries,
                                        std::int64_t capacity, int dim)
{
  int const s = blockIdx.x;
  int const b = s / queries;
  int const q = s % queries;
  Key* row    = keys + (std::int64_t(b) * capacity + segments[s].length + q) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) { row[i] = tails[std::int64_t(s) * dim + i]; }
}

/// Rank keys of the scored positions of segment blockIdx.y into ranks[s][0 .. window_begin - sink_end).
template <class Key>
DHISPARSE_KERNEL void drift_score_kernel(Key const* keys, Key const* queries, drift_segment const* segments,
                                         std::uint64_t* ranks, int num_queries, std::int64_t capacity, int dim)
{
  extern __shared__ unsigned char drift_shared[];
  Key* query              = reinterpret_cast<Key*>(drift_shared);
  int const s             = blockIdx.y;
  drift_segment const seg = segments[s];
  for (int i = threadIdx.x; i < dim; i += blockDim.x) { query[i] = queries[std::int64_t(s) * dim + i]; }
  __syncthreads();
  std::int32_t const p = seg.sink_end + std::int32_t(blockIdx.x * blockDim.x + threadIdx.x);
  if (p >= seg.window_begin) { return; }
  Key const* key = keys + (std::int64_t(s / num_queries) * capacity + p) * dim;
  ranks[std::int64_t(s) * capacity + (p - seg.sink_end)] = drift_rank_key(drift_dot(query, key, dim), p);
}

/// Positions of the `top` best rank keys of each segment: tops[s][i] (one block per segment).
template <class Rank>
DHISPARSE_KERNEL void drift_top_kernel(Rank const* sorted, drift_segment const* segments, std::int32_t* tops,
                                       std::int64_t capacity, int top_k)
{
  int const s = blockIdx.x;
  for (int i = threadIdx.x; i < segments[s].top; i += blockDim.x) {
    tops[std::int64_t(s) * top_k + i] = drift_rank_position(sorted[std::int64_t(s) * capacity + i]);
  }
}

/// The selection of segment blockIdx.x: sinks, ascending tops, window, -1; and scores.
template <class Key>
DHISPARSE_KERNEL void drift_select_kernel(Key const* keys, Key const* queries, drift_segment const* segments,
                                          std::int32_t const* tops, std::int32_t* selections, float* scores,
                                          int num_queries, std::int64_t capacity, int dim, int top_k)
{
  int const s             = blockIdx.x;
  drift_segment const seg = segments[s];
  std::int32_t const limit = seg.length + s % num_queries;
  Key const* query        = queries + std::int64_t(s) * dim;
  Key const* request_keys = keys + std::int64_t(s / num_queries) * capacity * dim;
  for (int e = threadIdx.x; e < top_k; e += blockDim.x) {
    std::int32_t p = -1;
    if (e < seg.sink_end) {
      p = e;
    } else if (e < seg.sink_end + seg.top) {
      p = tops[std::int64_t(s) * top_k + (e - seg.sink_end)];
    } else if (e - seg.sink_end - seg.top <= limit - seg.window_begin) {
      p = seg.window_begin + (e - seg.sink_end - seg.top);
    }
    selections[std::int64_t(s) * top_k + e] = p;
    if (scores != nullptr) {
      scores[std::int64_t(s) * top_k + e] =
        p < 0 ? 0.0f : float(drift_dot(query, request_keys + std::int64_t(p) * dim, dim)) * drift_score_unit;
    }
  }
}

}  // namespace detail

/**
 * @brief The drift workload with its O(B · Q · N · d) part on the GPU.
 *
 * Owns a `drift_generator` (the host state machine) and the device copies of every
 * request's keys, sized for `max_steps` steps. Move-only.
 */
class drift_generator_gpu {
 public:
  /**
   * @brief Builds the workload on the host and uploads the contexts.
   * @param config the workload (the same config and seed give the CPU version's trace)
   * @param max_steps steps the device key store must hold tail keys for
   * @param stream stream of the uploads; synchronized before this returns
   */
  drift_generator_gpu(drift_config const& config, int max_steps, cudaStream_t stream)
    : host_{config}, capacity_{std::int64_t(config.context) + std::int64_t(max_steps + 1) * config.queries}
  {
    DHISPARSE_EXPECTS(max_steps >= 0, "drift_generator_gpu: max_steps must be non-negative");
    int const segments = config.requests * config.queries;
    DHISPARSE_EXPECTS(std::int64_t(segments) * capacity_ <= std::numeric_limits<int>::max(),
                      "drift_generator_gpu: requests × queries × (context + steps) exceeds 2^31 sort items");
    std::size_t const row = std::size_t(config.dim);
    keys_    = dhisparse::detail::device_array<std::int16_t>(std::size_t(config.requests) * capacity_ * row);
    ranks_   = dhisparse::detail::device_array<std::uint64_t>(std::size_t(segments) * capacity_);
    sorted_  = dhisparse::detail::device_array<std::uint64_t>(std::size_t(segments) * capacity_);
    tops_    = dhisparse::detail::device_array<std::int32_t>(std::size_t(segments) * config.top_k);
    ordered_ = dhisparse::detail::device_array<std::int32_t>(std::size_t(segments) * config.top_k);
    // The step's block (segments, queries, tail keys, sort offsets): staged, one upload.
    step_bytes_ = align(sizeof(drift_segment) * segments) + 2 * align(sizeof(std::int16_t) * segments * row) +
                  align(sizeof(std::int32_t) * 4 * segments);
    step_ = dhisparse::detail::device_array<unsigned char>(step_bytes_);
    void* staging = nullptr;
    DHISPARSE_CUDA_TRY(cudaHostAlloc(&staging, step_bytes_, cudaHostAllocDefault));
    staging_.reset(static_cast<unsigned char*>(staging));
    cudaEvent_t event = nullptr;
    DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    uploaded_.reset(event);

    // Temporary storage of both sorts, sized once for the largest shapes.
    auto const* offsets   = reinterpret_cast<std::int32_t const*>(step_.data() + offsets_offset());
    std::size_t rank_temp = 0, top_temp = 0;
    DHISPARSE_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, rank_temp, ranks_.data(), sorted_.data(), int(ranks_.size()), segments, offsets, offsets + segments));
    DHISPARSE_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, top_temp, tops_.data(), ordered_.data(),
                                                               int(tops_.size()), segments, offsets,
                                                               offsets + segments));
    temp_ = dhisparse::detail::device_array<unsigned char>(std::max(rank_temp, top_temp));

    for (int b = 0; b < config.requests; ++b) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(keys_.data() + std::size_t(b) * capacity_ * row, host_.keys(b),
                                         std::size_t(host_.length(b)) * row * sizeof(std::int16_t),
                                         cudaMemcpyHostToDevice, stream));
    }
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  /**
   * @brief One step: draws the queries on the host, then scores and selects on the GPU.
   * @param selections device int32 [B][Q][K] (out), as `drift_generator::next`
   * @param scores device float [B][Q][K] (out) or nullptr
   * @param stream the stream of every launch and copy (not synchronized)
   */
  void next(std::int32_t* selections, float* scores, cudaStream_t stream)
  {
    auto const& c      = host_.config();
    int const segments = c.requests * c.queries;
    std::size_t const row = std::size_t(c.dim);
    for (int b = 0; b < c.requests; ++b) {
      DHISPARSE_EXPECTS(host_.length(b) + c.queries <= capacity_,
                        "drift_generator_gpu::next: more steps than max_steps");
    }
    host_.begin_step();
    // The staging block is reused once the previous step's upload completed.
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(uploaded_.get()));
    auto* seg     = reinterpret_cast<drift_segment*>(staging_.get());
    auto* queries = reinterpret_cast<std::int16_t*>(staging_.get() + queries_offset());
    auto* tails   = reinterpret_cast<std::int16_t*>(staging_.get() + tails_offset());
    auto* offsets = reinterpret_cast<std::int32_t*>(staging_.get() + offsets_offset());
    for (int b = 0; b < c.requests; ++b) {
      for (int q = 0; q < c.queries; ++q) {
        int const s       = b * c.queries + q;
        std::int32_t const length = host_.length(b);
        auto const bounds = host_.selection_bounds(length + q);
        seg[s]            = drift_segment{length, bounds.sink_end, bounds.window_begin, bounds.top};
        std::memcpy(queries + s * row, host_.step_query(b, q), row * sizeof(std::int16_t));
        std::memcpy(tails + s * row, host_.keys(b) + std::size_t(length + q) * row, row * sizeof(std::int16_t));
        offsets[s]                = std::int32_t(s * capacity_);
        offsets[segments + s]     = std::int32_t(s * capacity_ + (bounds.window_begin - bounds.sink_end));
        offsets[2 * segments + s] = s * c.top_k;
        offsets[3 * segments + s] = s * c.top_k + bounds.top;
      }
    }
    unsigned char* dev = step_.data();
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(dev, staging_.get(), step_bytes_, cudaMemcpyHostToDevice, stream));
    DHISPARSE_CUDA_TRY(cudaEventRecord(uploaded_.get(), stream));
    auto const* d_seg     = reinterpret_cast<drift_segment const*>(dev);
    auto const* d_queries = reinterpret_cast<std::int16_t const*>(dev + queries_offset());
    auto const* d_tails   = reinterpret_cast<std::int16_t const*>(dev + tails_offset());
    auto const* d_offsets = reinterpret_cast<std::int32_t const*>(dev + offsets_offset());

    detail::drift_tail_kernel<<<segments, 64, 0, stream>>>(keys_.data(), d_tails, d_seg, c.queries, capacity_, c.dim);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    std::int32_t most = 0;
    for (int s = 0; s < segments; ++s) { most = std::max(most, seg[s].window_begin - seg[s].sink_end); }
    constexpr int threads = 256;
    if (most > 0) {
      dim3 const grid((most + threads - 1) / threads, segments);
      detail::drift_score_kernel<<<grid, threads, row * sizeof(std::int16_t), stream>>>(
        keys_.data(), d_queries, d_seg, ranks_.data(), c.queries, capacity_, c.dim);
      DHISPARSE_CUDA_TRY(cudaGetLastError());
    }
    std::size_t temp_bytes = temp_.size();
    DHISPARSE_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeysDescending(
      temp_.data(), temp_bytes, ranks_.data(), sorted_.data(), int(ranks_.size()), segments, d_offsets,
      d_offsets + segments, 0, 64, stream));
    detail::drift_top_kernel<<<segments, threads, 0, stream>>>(sorted_.data(), d_seg, tops_.data(), capacity_, c.top_k);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    temp_bytes = temp_.size();
    DHISPARSE_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeys(temp_.data(), temp_bytes, tops_.data(),
                                                               ordered_.data(), int(tops_.size()), segments,
                                                               d_offsets + 2 * segments, d_offsets + 3 * segments,
                                                               0, 32, stream));
    detail::drift_select_kernel<<<segments, threads, 0, stream>>>(keys_.data(), d_queries, d_seg, ordered_.data(),
                                                                  selections, scores, c.queries, capacity_, c.dim,
                                                                  c.top_k);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }

  /// @brief Ends the step on the host, as `drift_generator::commit`.
  void commit(std::int32_t const* accepted = nullptr) { host_.commit(accepted); }

  /// @brief The host state machine (lengths, configuration).
  [[nodiscard]] drift_generator const& host() const noexcept { return host_; }

 private:
  struct pinned_free {
    void operator()(unsigned char* p) const noexcept { cudaFreeHost(p); }
  };
  struct event_destroy {
    void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
  };
  static std::size_t align(std::size_t bytes) { return (bytes + 255) & ~std::size_t{255}; }
  std::size_t segments() const { return std::size_t(host_.config().requests) * host_.config().queries; }
  std::size_t queries_offset() const { return align(sizeof(drift_segment) * segments()); }
  std::size_t tails_offset() const
  {
    return queries_offset() + align(sizeof(std::int16_t) * segments() * host_.config().dim);
  }
  std::size_t offsets_offset() const
  {
    return tails_offset() + align(sizeof(std::int16_t) * segments() * host_.config().dim);
  }

  drift_generator host_;
  std::int64_t capacity_;  // positions per request in the device key store
  dhisparse::detail::device_array<std::int16_t> keys_;      // [B][capacity][d]
  dhisparse::detail::device_array<std::uint64_t> ranks_;    // [B·Q][capacity]
  dhisparse::detail::device_array<std::uint64_t> sorted_;   // [B·Q][capacity], best first
  dhisparse::detail::device_array<std::int32_t> tops_;      // [B·Q][K]
  dhisparse::detail::device_array<std::int32_t> ordered_;   // [B·Q][K], ascending
  dhisparse::detail::device_array<unsigned char> temp_;
  dhisparse::detail::device_array<unsigned char> step_;     // the step's uploaded block
  std::size_t step_bytes_ = 0;
  std::unique_ptr<unsigned char, pinned_free> staging_;
  std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_destroy> uploaded_;
};

}  // namespace dhisparse::bench
