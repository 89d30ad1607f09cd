/**
 * @file detail/release/launch.cuh
 * @brief `release_async` (declared in `dhisparse/release.cuh`): the release kernels of
 *        `detail/hierarchy/kernels.cuh` and the leave-step kernels of
 *        `detail/hierarchy/step_kernels.cuh`, launched in order.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_info.cuh>
#include <dhisparse/detail/hierarchy/kernels.cuh>
#include <dhisparse/detail/hierarchy/step_kernels.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/release.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace dhisparse {

inline std::string release_params_problem(release_params const& p)
{
  if (p.pools == nullptr) { return "release: pools is null"; }
  if (p.num_groups <= 0) { return "release: num_groups must be positive"; }
  if (p.request < 0) { return "release: request (" + std::to_string(p.request) + ") is negative"; }
  if (p.num_slots < 0) { return "release: num_slots is negative"; }
  if (p.batch_size != nullptr) {  // the request leaves the step
    if (p.batch_requests == nullptr || p.batch_queries == nullptr || p.tail_slots == nullptr ||
        p.query_positions == nullptr) {
      return "release: batch_requests / batch_queries / tail_slots / query_positions are null (batch_size is given)";
    }
    if (p.max_batch <= 0 || p.max_queries <= 0) {
      return "release: max_batch and max_queries must be positive (batch_size is given)";
    }
  }
  return {};
}

inline cudaError_t release_async(release_params const& params, cudaStream_t stream)
{
  namespace hd = detail::hierarchy;
  release_params const& p = params;
  bool const leaves_step  = p.batch_size != nullptr;
  if (!release_params_problem(p).empty()) { return cudaErrorInvalidValue; }
  std::int64_t const wave = 4 * std::int64_t(detail::multiprocessor_count());
  auto const blocks_for   = [wave](std::int64_t work) {
    return unsigned(std::clamp<std::int64_t>((work + hd::block_size - 1) / hd::block_size, 1, wave));
  };
  cudaError_t status = cudaSuccess;
  if (leaves_step) {
    hd::leave_step_params ls{};
    ls.batch_size  = p.batch_size;
    ls.requests    = p.batch_requests;
    ls.queries     = p.batch_queries;
    ls.tail_slots  = p.tail_slots;
    ls.positions   = p.query_positions;
    ls.num_groups  = p.num_groups;
    ls.max_batch   = p.max_batch;
    ls.max_queries = p.max_queries;
    ls.request     = p.request;
    ls.plans[0]    = p.plans[0];
    ls.plans[1]    = p.plans[1];
    ls.host        = p.host;
    hd::leave_batch_kernel<hd::block_size><<<1, hd::block_size, 0, stream>>>(ls);
    std::int64_t const entries = std::max(p.plans[0].capacity, p.plans[1].capacity);
    if (entries > 0) {
      hd::leave_plans_kernel<hd::block_size><<<blocks_for(entries), hd::block_size, 0, stream>>>(ls);
    }
    if ((status = detail::check_launch(stream)) != cudaSuccess) { return status; }
  }
  unsigned const groups = unsigned(p.num_groups);
  hd::scrub_dirty_kernel<hd::block_size><<<groups, hd::block_size, 0, stream>>>(p.pools, p.request);
  if (p.owned_lists) {
    hd::release_owned_kernel<hd::block_size><<<groups, hd::block_size, 0, stream>>>(p.pools, p.request);
  } else {
    hd::release_scan_kernel<hd::block_size>
      <<<dim3(blocks_for(p.num_slots), groups), hd::block_size, 0, stream>>>(p.pools, p.request);
  }
  if ((status = detail::check_launch(stream)) != cudaSuccess) { return status; }
  if (p.map.max_pages_per_request > 0) {
    hd::clear_map_kernel<hd::block_size>
      <<<unsigned(p.map.max_pages_per_request), hd::block_size, 0, stream>>>(p.map, p.request);
    if ((status = detail::check_launch(stream)) != cudaSuccess) { return status; }
  }
  for (std::int32_t* field : p.request_fields) {
    if (field == nullptr) { continue; }
    status = cudaMemsetAsync(field + p.request, 0, sizeof(std::int32_t), stream);
    if (status != cudaSuccess) { return status; }
  }
  return cudaSuccess;
}

}  // namespace dhisparse
