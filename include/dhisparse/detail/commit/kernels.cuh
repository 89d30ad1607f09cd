/**
 * @file detail/commit/kernels.cuh
 * @brief The kernel of `commit_async`: one block per (batch entry, group).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dhisparse {
namespace detail::commit {

inline constexpr int block_size = 32;

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) commit_kernel(commit_params p)
{
  int const b = blockIdx.x;
  int const g = blockIdx.y;
  if (b >= *p.batch.size) { return; }
  std::int32_t const r  = p.batch.requests[b];
  std::int32_t const nq = p.batch.queries[b];
  std::int32_t keep     = p.accepted != nullptr ? p.accepted[b] : nq;
  if (keep < 0 || keep > nq) {
    if (threadIdx.x == 0 && g == 0) { atomicOr(p.status, status_invalid_accept_count); }
    keep = 0;
  }
  device_pool_ref const pool = p.pools[g];
  std::int32_t* tails = p.tail_slots + (std::int64_t(g) * p.batch.max_batch + b) * p.batch.max_queries;
  for (int j = threadIdx.x; j < nq; j += BlockSize) {
    std::int32_t const slot = tails[j];
    if (slot < 0 || j >= keep) { continue; }
    tails[j]              = -1;
    std::int32_t const at = atomicAdd(pool.dirty_count, 1);
    if (at < pool.dirty_capacity) {
      pool.dirty_list[at] = slot;
    } else {
      atomicOr(p.status, status_dirty_list_overflow);  // stays dirty; backup scans for it
      *pool.dirty_overflow = 1;
    }
  }
  // Rejected tails become spare slots of the request, pushed in order (one thread: the
  // spare stack's order is part of what the host reference reproduces).
  if (threadIdx.x == 0) {
    std::int32_t* spare = pool.spare + std::int64_t(r) * pool.spare_capacity;
    for (int j = keep; j < nq; ++j) {
      std::int32_t const slot = tails[j];
      if (slot < 0) { continue; }
      tails[j]            = -1;
      std::int32_t* entry = p.map.entry(r, g, pool.position[slot]);
      if (entry != nullptr) { *entry = not_resident; }
      pool.position[slot] = -1;
      pool.dirty[slot]    = 0;
      std::int32_t const n = pool.spare_count[r];
      if (n < pool.spare_capacity) {  // always: a request never holds more than Qmax spares
        spare[n]              = slot;
        pool.spare_count[r] = n + 1;
      }
    }
  }
  if (g == 0 && threadIdx.x == 0) { p.batch.lengths[r] += keep; }
}

}  // namespace detail::commit

inline cudaError_t commit_async(commit_params const& params, cudaStream_t stream)
{
  namespace cm = detail::commit;
  if (params.num_groups <= 0 || params.batch.max_batch <= 0) { return cudaErrorInvalidValue; }
  dim3 const grid(unsigned(params.batch.max_batch), unsigned(params.num_groups));
  cm::commit_kernel<cm::block_size><<<grid, cm::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
