/**
 * @file detail/retrieve/order.cuh
 * @brief `order_plan_async`: a miss plan sorted in place by host address on the device.
 *
 * Four kernels, each launched as a programmatic dependent of the one before, each reading
 * the entry count on the device (and returning at once below `min_entries`):
 *
 * 1. histogram — entries per bucket, a bucket being a 2^shift-byte range of the host range
 *    (at most `max_buckets` of them, plus one for entries outside the range);
 * 2. scan — one block turns the counts into bucket starts and zeroes the counts again
 *    (so the workspace is ready for the next call without a memset);
 * 3. scatter — each entry to its bucket (atomic cursor: arrival order within a bucket);
 * 4. rank — each entry's exact rank in its bucket by (address, slot, position), then back
 *    into the plan at bucket start + rank.
 *
 * Why not `cub::DeviceRadixSort`: it takes the item count on the host, so inside a captured
 * step it would sort the plan's whole capacity (B × Q × K entries) every time, also when 1%
 * of them are used; this costs in proportion to the entries plus one scan of the buckets.
 */
#pragma once

#include <dhisparse/retrieve.cuh>  // which includes this file (at the bottom of detail/retrieve/kernels.cuh)
#include <dhisparse/detail/retrieve/kernels.cuh>
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/dependent_launch.cuh>
#include <dhisparse/detail/device_info.cuh>
#include <dhisparse/error.cuh>

#include <cub/block/block_scan.cuh>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {
namespace detail::plan_order {

inline constexpr int block_size            = 256;
inline constexpr int scan_threads          = 1024;
inline constexpr int scan_items            = 16;  ///< counters per scan thread and tile
inline constexpr std::uint32_t tile        = scan_threads * scan_items;
inline constexpr std::size_t max_buckets   = std::size_t{1} << 15;  ///< in the host range
inline constexpr std::uint32_t max_ranked  = 4096;  ///< larger buckets stay in arrival order

/// Bucket geometry and workspace layout for a host range and a plan capacity.
struct shape {
  int shift              = 4;  ///< bucket = (address - base) >> shift
  std::uint32_t buckets  = 0;  ///< in the range, plus one for everything else (the last)
  std::uint32_t padded   = 0;  ///< buckets rounded up to whole scan tiles
  std::size_t counts_off = 0;  ///< uint32 [padded]: entries per bucket, zero between calls
  std::size_t starts_off = 0;  ///< uint32 [padded]: bucket starts, then cursors
  std::size_t stage_off  = 0;  ///< miss_entry [capacity]: entries grouped by bucket
  std::size_t bytes      = 0;

  static shape of(std::size_t host_bytes, std::int32_t capacity)
  {
    shape s;
    if (host_bytes == 0) { return s; }
    while (((host_bytes - 1) >> s.shift) >= max_buckets) { ++s.shift; }
    s.buckets    = std::uint32_t(((host_bytes - 1) >> s.shift) + 2);
    s.padded     = (s.buckets + tile - 1) / tile * tile;
    s.counts_off = 0;
    s.starts_off = std::size_t(s.padded) * 4;
    s.stage_off  = s.starts_off + std::size_t(s.padded) * 4;
    s.bytes      = s.stage_off + std::size_t(std::max(capacity, 0)) * sizeof(miss_entry);
    return s;
  }
};

/// Grid-invariant arguments of the four kernels.
struct order_args {
  miss_entry* entries;  ///< the plan (input of histogram and scatter, output of rank)
  std::int32_t const* count;
  std::int32_t capacity;
  std::int32_t min_entries;
  std::uintptr_t base;
  std::size_t bytes;
  int shift;
  std::uint32_t buckets;
  std::uint32_t padded;
  std::uint32_t* counts;
  std::uint32_t* starts;
  miss_entry* stage;

  /// Entries to order, 0 when the plan is below `min_entries`.
  DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::int64_t entries_to_order() const
  {
    std::int64_t const n     = *count < capacity ? *count : capacity;  // (no std:: in device code:
    std::int64_t const least = min_entries > 2 ? min_entries : 2;      //  consumers need no flags)
    return n >= least ? n : 0;
  }
  DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t bucket(miss_entry const& e) const
  {
    auto const a = reinterpret_cast<std::uintptr_t>(e.src);
    if (e.src == nullptr || a < base || a - base >= bytes) { return buckets - 1; }
    return std::uint32_t((a - base) >> shift);
  }
};

/// The order the rank kernel produces: address, then slot, then position.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool before(miss_entry const& a, miss_entry const& b)
{
  auto const x = reinterpret_cast<std::uintptr_t>(a.src);
  auto const y = reinterpret_cast<std::uintptr_t>(b.src);
  if (x != y) { return x < y; }
  if (a.slot != b.slot) { return a.slot < b.slot; }
  return a.position < b.position;
}

DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::int64_t first_index() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) histogram_kernel(order_args a)
{
  wait_for_prerequisites();
  launch_dependents();
  std::int64_t const n = a.entries_to_order();
  for (std::int64_t i = first_index(); i < n; i += grid_threads()) { atomicAdd(a.counts + a.bucket(a.entries[i]), 1u); }
}

template <int Threads>
DHISPARSE_KERNEL void __launch_bounds__(Threads) scan_kernel(order_args a)
{
  using scan = cub::BlockScan<std::uint32_t, Threads>;
  __shared__ typename scan::TempStorage temp;
  wait_for_prerequisites();
  launch_dependents();
  if (a.entries_to_order() == 0) { return; }
  std::uint32_t running = 0;
  for (std::uint32_t t = 0; t < a.padded; t += Threads * scan_items) {
    std::uint32_t const first = t + threadIdx.x * scan_items;
    std::uint32_t items[scan_items];
    auto* counts = reinterpret_cast<uint4*>(a.counts + first);
#pragma unroll
    for (int k = 0; k < scan_items / 4; ++k) {
      uint4 const c    = counts[k];
      items[4 * k]     = c.x;
      items[4 * k + 1] = c.y;
      items[4 * k + 2] = c.z;
      items[4 * k + 3] = c.w;
      counts[k]        = make_uint4(0, 0, 0, 0);
    }
    std::uint32_t total = 0;
    scan(temp).ExclusiveSum(items, items, total);
    auto* starts = reinterpret_cast<uint4*>(a.starts + first);
#pragma unroll
    for (int k = 0; k < scan_items / 4; ++k) {
      starts[k] = make_uint4(running + items[4 * k], running + items[4 * k + 1], running + items[4 * k + 2],
                             running + items[4 * k + 3]);
    }
    running += total;
    __syncthreads();  // temp is reused by the next tile
  }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) scatter_kernel(order_args a)
{
  wait_for_prerequisites();
  launch_dependents();
  std::int64_t const n = a.entries_to_order();
  for (std::int64_t i = first_index(); i < n; i += grid_threads()) {
    miss_entry const e = a.entries[i];
    a.stage[atomicAdd(a.starts + a.bucket(e), 1u)] = e;
  }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) rank_kernel(order_args a)
{
  wait_for_prerequisites();
  launch_dependents();
  std::int64_t const n = a.entries_to_order();
  for (std::int64_t i = first_index(); i < n; i += grid_threads()) {
    miss_entry const e     = a.stage[i];
    std::uint32_t const b  = a.bucket(e);
    std::uint32_t const lo = b == 0 ? 0 : a.starts[b - 1];  // the scatter left each start at
    std::uint32_t const hi = a.starts[b];                   // its bucket's end
    if (hi - lo > max_ranked) {
      a.entries[i] = e;
      continue;
    }
    std::uint32_t rank = 0;
    for (std::uint32_t j = lo; j < hi; ++j) {
      miss_entry const f = a.stage[j];
      rank += before(f, e) || (!before(e, f) && j < std::uint32_t(i));
    }
    a.entries[lo + rank] = e;
  }
}

/// Threads of the entry-parallel kernels: enough for the plan's capacity, at most a few
/// blocks per SM (grid-stride beyond).
inline unsigned entry_blocks(std::int32_t capacity)
{
  std::int64_t const need = (std::int64_t(std::max(capacity, 1)) + block_size - 1) / block_size;
  return unsigned(std::min<std::int64_t>(need, std::int64_t(multiprocessor_count()) * 4));
}

}  // namespace detail::plan_order

inline std::size_t order_plan_workspace_size(std::size_t host_bytes, std::int32_t capacity)
{
  return detail::plan_order::shape::of(host_bytes, capacity).bytes;
}

inline std::string plan_order_problem(plan_order_params const& params, void const* workspace,
                                      std::size_t workspace_bytes)
{
  if (params.plan.entries == nullptr || params.plan.count == nullptr) {
    return "order_plan: plan.entries / plan.count are null";
  }
  if (params.plan.capacity < 0) { return "order_plan: plan.capacity is negative"; }
  if (params.host_bytes == 0) { return "order_plan: host_bytes is 0 (an empty host range)"; }
  if (workspace == nullptr) { return "order_plan: workspace is null"; }
  if (reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0) { return "order_plan: workspace is not 16-byte aligned"; }
  std::size_t const need = order_plan_workspace_size(params.host_bytes, params.plan.capacity);
  if (workspace_bytes < need) {
    return "order_plan: workspace_bytes (" + std::to_string(workspace_bytes) + ") is below order_plan_workspace_size (" +
           std::to_string(need) + ")";
  }
  return {};
}

inline cudaError_t order_plan_async(plan_order_params const& params, void* workspace, std::size_t workspace_bytes,
                                    cudaStream_t stream)
{
  namespace po = detail::plan_order;
  if (!plan_order_problem(params, workspace, workspace_bytes).empty()) { return cudaErrorInvalidValue; }
  po::shape const s = po::shape::of(params.host_bytes, params.plan.capacity);
  auto* ws = static_cast<std::byte*>(workspace);
  po::order_args a{};
  a.entries     = params.plan.entries;
  a.count       = params.plan.count;
  a.capacity    = params.plan.capacity;
  a.min_entries = params.min_entries;
  a.base        = reinterpret_cast<std::uintptr_t>(params.host_base);
  a.bytes       = params.host_bytes;
  a.shift       = s.shift;
  a.buckets     = s.buckets;
  a.padded      = s.padded;
  a.counts      = reinterpret_cast<std::uint32_t*>(ws + s.counts_off);
  a.starts      = reinterpret_cast<std::uint32_t*>(ws + s.starts_off);
  a.stage       = reinterpret_cast<miss_entry*>(ws + s.stage_off);
  unsigned const blocks = po::entry_blocks(params.plan.capacity);
  cudaError_t e = detail::launch_dependent(po::histogram_kernel<po::block_size>, blocks, po::block_size, stream, a);
  if (e == cudaSuccess) {
    e = detail::launch_dependent(po::scan_kernel<po::scan_threads>, 1, po::scan_threads, stream, a);
  }
  if (e == cudaSuccess) {
    e = detail::launch_dependent(po::scatter_kernel<po::block_size>, blocks, po::block_size, stream, a);
  }
  if (e == cudaSuccess) {
    e = detail::launch_dependent(po::rank_kernel<po::block_size>, blocks, po::block_size, stream, a);
  }
  if (e != cudaSuccess) { return e; }
  return detail::check_launch(stream);
}

inline cudaError_t retrieve_async(retrieve_params const& params, plan_order_params const& order, void* workspace,
                                  std::size_t workspace_bytes, int blocks, cudaStream_t stream)
{
  if (!retrieve_params_problem(params).empty() || order.plan.entries != params.plan.entries ||
      order.plan.count != params.plan.count) {
    return cudaErrorInvalidValue;
  }
  cudaError_t const ordered = order_plan_async(order, workspace, workspace_bytes, stream);
  if (ordered != cudaSuccess) { return ordered; }
  return retrieve_async(params, blocks, stream);
}

}  // namespace dhisparse
