/**
 * @file detail/draft_ring/kernels.cuh
 * @brief CUDA kernels of the draft ring: append (copies rows, one CTA per request) and the
 *        metadata-only advance / rollback / reset (one thread per request or entry).
 *
 * Every kernel has a fixed grid (capacity, or the reset count) and reads its per-request
 * counts from device memory, so a step's ring updates can be captured in a CUDA graph.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/draft_ring_ref.hpp>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse::detail::draft_ring {

inline constexpr int copy_threads = 256;
inline constexpr int meta_threads = 128;

/// The real batch size, clamped; block 0 / thread 0 reports an out-of-range value.
__device__ __forceinline__ int batch_of(std::int32_t const* batch_size, int capacity, std::uint32_t* status)
{
  int batch = batch_size ? *batch_size : capacity;
  if (batch < 0 || batch > capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) { atomicOr(status, draft_ring_status::bad_batch_size); }
    batch = batch < 0 ? 0 : capacity;
  }
  return batch;
}

/// Copies counts[b] staged rows of request b into its ring (only the last `window` of them
/// when more: the earlier ones would be overwritten by the same append), then advances.
template <int Unused>
DHISPARSE_KERNEL void __launch_bounds__(copy_threads)
  append_kernel(draft_ring_ref ring, draft_ring_rows src, rows_layout l, std::int32_t const* counts,
                int max_count, std::int32_t const* batch_size, std::uint32_t* status)
{
  int const b     = blockIdx.x;
  int const batch = batch_of(batch_size, ring.capacity, status);
  if (b >= batch) { return; }
  std::int32_t const count = counts[b];
  if (count < 0 || count > max_count) {
    if (threadIdx.x == 0) { atomicOr(status, draft_ring_status::bad_count); }
    return;
  }
  std::int64_t const end   = ring.end[b];
  std::int32_t const first = count > ring.window ? count - ring.window : 0;
  std::int64_t const vecs  = ring.row_bytes / 16;
  std::int64_t const total = std::int64_t(count - first) * ring.layers * vecs;
  for (std::int64_t t = threadIdx.x; t < total; t += copy_threads) {
    std::int64_t const v   = t % vecs;
    std::int64_t const rl  = t / vecs;
    int const layer        = int(rl % ring.layers);
    std::int32_t const j   = first + std::int32_t(rl / ring.layers);
    auto const* from       = reinterpret_cast<uint4 const*>(src.rows + b * l.request + j * l.position + layer * l.layer);
    auto* to               = reinterpret_cast<uint4*>(ring.row(layer, b, ring.slot(end + j)));
    to[v]                  = from[v];
  }
  __syncthreads();  // every thread has read `end` before it moves
  if (threadIdx.x == 0) {
    std::int64_t e   = end;
    std::int32_t len = ring.length[b];
    grow(e, len, count, ring.window);
    ring.end[b]    = e;
    ring.length[b] = len;
  }
}

/// Rows written in place at `append_slot(b, j)`, j < counts[b], become part of the ring.
template <int Unused>
DHISPARSE_KERNEL void advance_kernel(draft_ring_ref ring, std::int32_t const* counts, int max_count,
                                     std::int32_t const* batch_size, std::uint32_t* status)
{
  int const b     = blockIdx.x * blockDim.x + threadIdx.x;
  int const batch = batch_of(batch_size, ring.capacity, status);
  if (b >= batch) { return; }
  std::int32_t const count = counts[b];
  if (count < 0 || count > max_count) {
    atomicOr(status, draft_ring_status::bad_count);
    return;
  }
  std::int64_t e   = ring.end[b];
  std::int32_t len = ring.length[b];
  grow(e, len, count, ring.window);
  ring.end[b]    = e;
  ring.length[b] = len;
}

/// Removes the newest drafted[b] − accepted[b] rows (accepted may be null: 0).
template <int Unused>
DHISPARSE_KERNEL void rollback_kernel(draft_ring_ref ring, std::int32_t const* drafted,
                                      std::int32_t const* accepted, std::int32_t const* batch_size,
                                      std::uint32_t* status)
{
  int const b     = blockIdx.x * blockDim.x + threadIdx.x;
  int const batch = batch_of(batch_size, ring.capacity, status);
  if (b >= batch) { return; }
  std::int64_t const count = std::int64_t(drafted[b]) - (accepted ? accepted[b] : 0);
  std::int64_t e           = ring.end[b];
  std::int32_t len         = ring.length[b];
  std::uint32_t const bits = shrink(e, len, drafted[b] < 0 ? -1 : count);
  if (bits) { atomicOr(status, bits); }
  if (bits & draft_ring_status::bad_count) { return; }
  ring.end[b]    = e;
  ring.length[b] = len;
}

/**
 * One request's keep (`draft_ring_keep_async`), by a whole block: the kept nodes' rows move
 * in path order (k ascending: a row is read before the copy that may overwrite it), then
 * thread 0 rolls back the rest. Every thread of the block must call it. Returns the status
 * bits (the same value in every thread).
 */
__device__ inline std::uint32_t keep_rows_block(draft_ring_ref const& ring, int request, std::int32_t drafted,
                                                std::int32_t kept, std::int32_t const* nodes, std::int64_t max_nodes)
{
  std::uint32_t bits = check_keep(drafted, kept, nodes, max_nodes);
  std::int64_t const end    = ring.end[request];
  std::int32_t const length = ring.length[request];
  if (bits == 0 && drafted > end) { bits = draft_ring_status::bad_count; }
  if (bits != 0) { return bits; }
  std::int64_t const base = end - drafted;
  std::int64_t const vecs = ring.row_bytes / 16;
  for (std::int32_t k = 1; k <= kept && nodes != nullptr; ++k) {
    std::int64_t const from = base + nodes[k - 1] - 1, to = base + k - 1;
    if (from == to || to < end - length) { continue; }  // block-uniform
    for (std::int64_t t = threadIdx.x; t < vecs * ring.layers; t += blockDim.x) {
      int const layer = int(t / vecs);
      auto const* src = reinterpret_cast<uint4 const*>(ring.row(layer, request, ring.slot(from)));
      auto* dst       = reinterpret_cast<uint4*>(ring.row(layer, request, ring.slot(to)));
      dst[t % vecs]   = src[t % vecs];
    }
    __syncthreads();
  }
  __syncthreads();  // every thread has read end / length
  std::int64_t e   = end;
  std::int32_t len = length;
  bits             = shrink(e, len, std::int64_t(drafted) - kept);
  if (threadIdx.x == 0) {
    ring.end[request]    = e;
    ring.length[request] = len;
  }
  return bits;
}

/// Keeps the committed drafts' rows of each entry (see `draft_ring_keep_async`).
template <int Unused>
DHISPARSE_KERNEL void __launch_bounds__(copy_threads)
  keep_kernel(draft_ring_ref ring, std::int32_t const* drafted, std::int32_t const* kept, std::int32_t const* nodes,
              int nodes_stride, std::int32_t const* ring_index, int entries, std::int32_t const* batch_size,
              std::uint32_t* status)
{
  int const b = blockIdx.x;
  int n       = batch_size ? *batch_size : entries;
  if (n < 0 || n > entries) {
    if (b == 0 && threadIdx.x == 0) { atomicOr(status, draft_ring_status::bad_batch_size); }
    n = n < 0 ? 0 : entries;
  }
  if (b >= n) { return; }
  int const r = ring_index ? ring_index[b] : b;
  if (r < 0 || r >= ring.capacity) {
    if (threadIdx.x == 0) { atomicOr(status, draft_ring_status::bad_request); }
    return;
  }
  std::uint32_t const bits = keep_rows_block(ring, r, drafted[b], kept ? kept[b] : 0,
                                             nodes ? nodes + std::int64_t(b) * nodes_stride : nullptr, nodes_stride);
  if (bits != 0 && threadIdx.x == 0) { atomicOr(status, bits); }
}

/// Empties the listed requests; their next row gets position start[i] (null: 0).
template <int Unused>
DHISPARSE_KERNEL void reset_kernel(draft_ring_ref ring, std::int32_t const* requests,
                                   std::int64_t const* start, int count, std::uint32_t* status)
{
  int const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) { return; }
  std::int32_t const r = requests[i];
  if (r < 0 || r >= ring.capacity) {
    atomicOr(status, draft_ring_status::bad_request);
    return;
  }
  std::int64_t const s = start ? start[i] : 0;
  if (s < 0) {
    atomicOr(status, draft_ring_status::bad_start);
    return;
  }
  ring.end[r]    = s;
  ring.length[r] = 0;
}

}  // namespace dhisparse::detail::draft_ring
