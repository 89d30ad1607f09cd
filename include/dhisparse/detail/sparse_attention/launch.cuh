/**
 * @file detail/sparse_attention/launch.cuh
 * @brief Launch plan (split-K choice, workspace layout) and the launch-level functions
 *        declared in `dhisparse/sparse_attention.cuh`.
 */
#pragma once

#include <dhisparse/sparse_attention.cuh>  // this file is included at its bottom
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/combine_kernel.cuh>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mha_kernel.cuh>
#include <dhisparse/detail/sparse_attention/mla_kernel.cuh>
#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace dhisparse::sparse_attention {
namespace detail {

/// Kernel arguments (without workspace pointers) and sizes of one call.
struct launch_plan {
  kernel_args args;
  std::int64_t units            = 0;  ///< batch x num_queries x units_per_query
  std::size_t partial_out_elems = 0;  ///< floats of partial outputs in the workspace
  std::size_t workspace_bytes   = 0;  ///< 0 unless num_splits > 1
};

/**
 * @brief Chooses tiles, units and splits. Automatic splits: as many as keep every split's
 *        CTAs within one wave (`num_sms` x CTAs per SM / CTAs without split), at most
 *        `max_splits` and the number of tiles; no split is empty.
 */
template <class RowFormat>
launch_plan make_plan(params const& p, int num_sms)
{
  using traits = format_traits<RowFormat>;
  launch_plan plan{};
  kernel_args& a = plan.args;
  a.p            = p;
  a.scale_log2   = p.softmax_scale * log2_e;
  a.num_tiles    = (p.top_k + tile_n - 1) / tile_n;
  int ctas_per_sm = 1;
  if constexpr (traits::is_mla) {
    a.rows_per_unit   = mla::tile_m;
    a.group           = p.num_heads;
    a.m_tiles         = (p.num_heads + mla::tile_m - 1) / mla::tile_m;
    a.units_per_query = a.m_tiles;
  } else {
    a.rows_per_unit   = mha::tile_m;
    a.group           = p.num_heads / traits::kv_heads;
    a.m_tiles         = (a.group + mha::tile_m - 1) / mha::tile_m;
    a.units_per_query = traits::kv_heads * a.m_tiles;
    ctas_per_sm       = 2;
  }
  plan.units = std::int64_t(p.batch) * p.num_queries * a.units_per_query;
  int splits = p.num_splits;
  if (splits == 0) {
    std::int64_t const capacity = std::int64_t(num_sms) * ctas_per_sm;
    splits = plan.units > 0 ? int(std::clamp<std::int64_t>(capacity / plan.units, 1, max_splits)) : 1;
  }
  splits            = std::max(1, std::min(splits, a.num_tiles));
  a.tiles_per_split = (a.num_tiles + splits - 1) / splits;
  a.num_splits      = (a.num_tiles + a.tiles_per_split - 1) / a.tiles_per_split;
  if (a.num_splits > 1) {
    std::size_t const parts = std::size_t(plan.units) * a.num_splits * a.rows_per_unit;
    plan.partial_out_elems  = parts * traits::value_dim;
    plan.workspace_bytes    = plan.partial_out_elems * sizeof(float) + (parts * sizeof(float) + 15) / 16 * 16;
  }
  return plan;
}

/// SM count and compute capability major of the current device.
inline cudaError_t current_device_shape(int& num_sms, int& major)
{
  int device         = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  return status;
}

}  // namespace detail

template <class RowFormat>
std::size_t workspace_size(params const& p, int num_sms)
{
  DHISPARSE_EXPECTS_NO_PROBLEM(shape_problem<RowFormat>(p));
  DHISPARSE_EXPECTS(num_sms > 0, "sparse_attention::workspace_size: num_sms must be positive");
  return detail::make_plan<RowFormat>(p, num_sms).workspace_bytes;
}

template <class RowFormat>
std::size_t workspace_size(params const& p)
{
  int num_sms = 0;
  int major   = 0;
  DHISPARSE_CUDA_TRY(detail::current_device_shape(num_sms, major));
  return workspace_size<RowFormat>(p, num_sms);
}

template <class RowFormat>
int num_splits(params const& p, int num_sms)
{
  DHISPARSE_EXPECTS_NO_PROBLEM(shape_problem<RowFormat>(p));
  DHISPARSE_EXPECTS(num_sms > 0, "sparse_attention::num_splits: num_sms must be positive");
  return detail::make_plan<RowFormat>(p, num_sms).args.num_splits;
}

template <class RowFormat>
cudaError_t plan<RowFormat>::make(plan& out) noexcept
{
  using traits       = format_traits<RowFormat>;
  plan result{nullptr};
  cudaError_t status = cudaGetDevice(&result.device_);
  if (status == cudaSuccess) { status = detail::current_device_shape(result.num_sms_, result.major_); }
  if (status != cudaSuccess) { return status; }
  if (result.major_ >= 8) {
    if constexpr (traits::is_mla) {
      constexpr int smem = detail::mla::smem_layout::alloc;
      if constexpr (traits::is_fp8) {
        auto* crossover = &detail::mla_attention_kernel<true, true>;
        cudaFuncAttributes attributes{};
        if (result.major_ >= 9) {
          if (cudaFuncGetAttributes(&attributes, crossover) == cudaSuccess) {
            result.clusters_ = attributes.binaryVersion >= 90;
          } else {
            cudaGetLastError();  // a failed query only means: no clusters
          }
        }
        if (result.clusters_) {
          status = cudaFuncSetAttribute(crossover, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
          if (status != cudaSuccess) { return status; }
        }
      }
      status = cudaFuncSetAttribute(&detail::mla_attention_kernel<traits::is_fp8, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    } else {
      status = cudaFuncSetAttribute(&detail::mha_attention_kernel<detail::mha::head_dim>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, detail::mha::smem_bytes);
    }
    if (status != cudaSuccess) { return status; }
  }
  out = result;
  return cudaSuccess;
}

template <class RowFormat>
plan<RowFormat>::plan()
{
  DHISPARSE_CUDA_TRY(make(*this));
}

namespace detail {

/// The plan of the current device for `RowFormat`, made on first use per device (what
/// `run` without a plan uses). Never throws.
template <class RowFormat>
cudaError_t cached_plan(plan<RowFormat>& out) noexcept
{
  constexpr int max_devices = 64;
  struct entry {
    std::once_flag once;
    plan<RowFormat> value{nullptr};
    cudaError_t status = cudaSuccess;
  };
  int device         = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) { return status; }
  if (device < 0 || device >= max_devices) { return plan<RowFormat>::make(out); }
  static std::array<entry, max_devices> cache;
  entry& e = cache[std::size_t(device)];
  try {
    std::call_once(e.once, [&e] { e.status = plan<RowFormat>::make(e.value); });
  } catch (...) {
    return plan<RowFormat>::make(out);
  }
  if (e.status != cudaSuccess) { return e.status; }
  out = e.value;
  return cudaSuccess;
}

}  // namespace detail

template <class RowFormat>
std::size_t workspace_size(plan<RowFormat> const& pl, params const& p)
{
  return workspace_size<RowFormat>(p, pl.num_sms());
}

template <class RowFormat>
cudaError_t run(params const& p, void* workspace, std::size_t workspace_bytes, cudaStream_t stream)
{
  if (!params_problem<RowFormat>(p).empty()) { return cudaErrorInvalidValue; }
  if (p.batch == 0) { return cudaSuccess; }
  plan<RowFormat> pl{nullptr};
  cudaError_t const status = detail::cached_plan(pl);
  if (status != cudaSuccess) { return status; }
  return run(pl, p, workspace, workspace_bytes, stream);
}

template <class RowFormat>
cudaError_t run(plan<RowFormat> const& pl, params const& p, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream)
{
  using traits = format_traits<RowFormat>;
  if (!params_problem<RowFormat>(p).empty()) { return cudaErrorInvalidValue; }
  if (p.batch == 0) { return cudaSuccess; }
  if (pl.num_sms() <= 0) { return cudaErrorInvalidValue; }
  if (pl.compute_major() < 8) { return cudaErrorInvalidDevice; }
  cudaError_t status = cudaSuccess;

  detail::launch_plan const plan = detail::make_plan<RowFormat>(p, pl.num_sms());
  detail::kernel_args a          = plan.args;
  if (a.num_splits > 1) {
    if (workspace == nullptr || workspace_bytes < plan.workspace_bytes ||
        !detail::aligned_to(workspace, 16)) {
      return cudaErrorInvalidValue;
    }
    a.partial_out = static_cast<float*>(workspace);
    a.partial_lse = a.partial_out + plan.partial_out_elems;
  }
  std::int64_t const grid = plan.units * a.num_splits;
  if (grid > INT_MAX || std::int64_t(p.batch) * p.num_queries * p.num_heads > INT_MAX) {
    return cudaErrorInvalidValue;
  }

  if constexpr (traits::is_mla) {
    constexpr int smem = detail::mla::smem_layout::alloc;
    bool clustered     = false;
    if constexpr (traits::is_fp8) {
      // h_q = 128: the two head tiles of a (b, q, split) are neighbours in the grid and run as
      // a cluster that dequantizes each tile once (half in each CTA) — on a device with
      // clusters, with the kernel built for one (the plan checked both).
      auto* crossover = &detail::mla_attention_kernel<true, true>;
      clustered       = a.units_per_query == 2 && pl.clusters();
      if (clustered) {
        cudaLaunchAttribute cluster{};
        cluster.id               = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = 2;
        cluster.val.clusterDim.y = 1;
        cluster.val.clusterDim.z = 1;
        cudaLaunchConfig_t config{};
        config.gridDim          = dim3(unsigned(grid));
        config.blockDim         = dim3(detail::mla::threads);
        config.dynamicSmemBytes = smem;
        config.stream           = stream;
        config.attrs            = &cluster;
        config.numAttrs         = 1;
        status                  = cudaLaunchKernelEx(&config, crossover, a);
        if (status != cudaSuccess) { return status; }
      }
    }
    if (!clustered) {
      auto* kernel = &detail::mla_attention_kernel<traits::is_fp8, false>;
      kernel<<<unsigned(grid), detail::mla::threads, smem, stream>>>(a);
    }
  } else {
    constexpr int smem = detail::mha::smem_bytes;
    auto* kernel       = &detail::mha_attention_kernel<detail::mha::head_dim>;
    kernel<<<unsigned(grid), detail::mha::threads, smem, stream>>>(a, RowFormat::k_offset,
                                                                   RowFormat::v_offset);
  }
  status = cudaGetLastError();
  if (status != cudaSuccess) { return status; }
  if (a.num_splits > 1) {
    unsigned const combine_grid = unsigned(std::int64_t(p.batch) * p.num_queries * p.num_heads);
    detail::combine_splits_kernel<traits::value_dim>
      <<<combine_grid, traits::value_dim / 4, 0, stream>>>(a);
  }
  return ::dhisparse::detail::check_launch(stream);
}

}  // namespace dhisparse::sparse_attention
