/**
 * @file sparse_attention.cuh
 * @brief Sparse attention over slot tables: MLA decode / verification (bf16 and FP8-656
 *        rows) and MHA / GQA, reading the KV rows straight from the hierarchy's slabs.
 *
 * Every query (b, q) attends to the rows named by its own selection
 * `slots[b][q][0 .. top_k)` (-1 = none); see `sparse_attention::params` for the exact
 * semantics, shapes and strides. The call is stream-ordered, allocation-free, host-sync-free
 * and has fixed launch shapes for fixed `params` shapes (the real batch size may live in
 * device memory), so it can be captured in a CUDA graph.
 *
 * @code
 * namespace sa = dhisparse::sparse_attention;
 * using fmt = dhisparse::row_format::mla_fp8_656;
 * sa::params p;
 * p.batch = 128; p.num_queries = 4; p.num_heads = 64; p.top_k = 2048;
 * sa::set_contiguous_strides<fmt>(p);
 * p.queries = q; p.rows = slab + layer * 656; p.row_stride = layers_in_group * 656;
 * p.num_slots = slots_in_slab; p.slots = slot_table; p.out = out; p.lse = lse;
 * p.softmax_scale = 1.f / std::sqrt(576.f);
 * std::size_t bytes = sa::workspace_size<fmt>(p);   // 0 unless split-K is used
 * // … allocate `bytes` once (reuse across steps) …
 * cudaError_t err = sa::run<fmt>(p, workspace, bytes, stream);
 * // or, with the device facts gathered once at start-up:
 * sa::plan<fmt> const plan;                       // per device
 * err = sa::run(plan, p, workspace, bytes, stream);
 * @endcode
 *
 * Kernels (see docs/sparse_attention.md): MLA uses `wgmma` where the translation unit is
 * compiled for sm_90a and `mma.sync` otherwise (same tiles, same results up to rounding);
 * its tiles need 227 KiB of shared memory per block (sm_90); FP8 rows with 128 heads run
 * as two-CTA clusters that dequantize each tile once. MHA / GQA uses `mma.sync` and
 * runs on sm_80 and newer. Results are deterministic: the same inputs and launch shape
 * give bit-identical outputs (no atomics in any reduction; split-K partials are merged in
 * split order).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace dhisparse::sparse_attention {

/**
 * @brief Bytes of workspace `run` needs for `p` on a device with `num_sms` multiprocessors
 *        (0 when no split-K is used). Reads only the shape of `p` (`batch`, `num_queries`,
 *        `top_k`, `num_heads`, `num_splits`): pointers and strides may still be unset.
 *        Throws `dhisparse::error` on a bad shape (`shape_problem`).
 * @tparam RowFormat `row_format::mla_bf16_576`, `row_format::mla_fp8_656` or
 *         `row_format::mha<KvHeads, 128, bf16>`
 */
template <class RowFormat>
std::size_t workspace_size(params const& p, int num_sms);

/**
 * @brief As above, for the current device (queries its SM count; no synchronization).
 *        Call it on the device `run` will use.
 */
template <class RowFormat>
std::size_t workspace_size(params const& p);

/**
 * @brief The number of split-K partitions `run` uses for `p` on `num_sms` multiprocessors.
 * @tparam RowFormat as for `workspace_size`
 */
template <class RowFormat>
int num_splits(params const& p, int num_sms);

/**
 * @brief Sparse attention of every (b, q, head) over its selection; asynchronous on `stream`.
 *
 * Rows b >= `*p.batch_size` (when given) are skipped: their outputs are left untouched.
 * When `p.num_splits` (or the automatic choice for small B x Q x heads) splits the
 * selection, a second kernel merges the splits; both run on `stream`.
 *
 * @tparam RowFormat as for `workspace_size`
 * @param p arguments; device pointers
 * @param workspace device scratch of at least `workspace_size<RowFormat>(p)` bytes, 16-byte
 *        aligned (may be null when that size is 0); must not be used concurrently by another
 *        call
 * @param workspace_bytes size of `workspace`
 * @param stream stream the kernels are launched on
 * @return `cudaErrorInvalidValue` for arguments `params_problem<RowFormat>` rejects or a workspace
 *         that is missing / too small / misaligned (nothing is launched), the launch error
 *         otherwise (`cudaSuccess` on success). Never throws.
 */
template <class RowFormat>
cudaError_t run(params const& p, void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

/**
 * @brief What `run` needs to know about a device, gathered once: its SM count, compute
 *        capability and whether the FP8 cluster kernel can run there; constructing it also
 *        sets the kernels' shared-memory attributes on that device. Create one per device
 *        (and row format) at start-up, then call `run(plan, p, …)` every step: nothing is
 *        queried or set per call. Trivially copyable; valid until the device is reset.
 *        (`run(p, …)` without a plan uses one cached per device and row format.)
 * @tparam RowFormat as for `workspace_size`
 */
template <class RowFormat>
class plan {
 public:
  /// For the current device. @throws dhisparse::error when the device cannot be queried or
  /// an attribute cannot be set (a device below sm_80 gives a plan `run` refuses)
  plan();

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] int num_sms() const noexcept { return num_sms_; }
  [[nodiscard]] int compute_major() const noexcept { return major_; }
  /// FP8 rows with 128 heads run as two-CTA clusters (sm_90 and a kernel built for it).
  [[nodiscard]] bool clusters() const noexcept { return clusters_; }

  /// An empty plan (no device; `run` refuses it), to be filled by `make`.
  explicit plan(std::nullptr_t) noexcept {}

  /// Fills `out` for the current device without throwing (what the cached plan uses).
  static cudaError_t make(plan& out) noexcept;

 private:
  int device_  = -1;
  int num_sms_ = 0;
  int major_   = 0;
  bool clusters_ = false;
};

/// Bytes of workspace `run(pl, p, …)` needs (the plan's SM count; no device query).
template <class RowFormat>
std::size_t workspace_size(plan<RowFormat> const& pl, params const& p);

/**
 * @brief `run` with the device facts of `pl` (which must be for the current device): no
 *        device query and no attribute call per launch. Same arguments, results and errors
 *        as `run(p, workspace, workspace_bytes, stream)`; never throws. Capturable.
 */
template <class RowFormat>
cudaError_t run(plan<RowFormat> const& pl, params const& p, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream);

}  // namespace dhisparse::sparse_attention

/**
 * @brief Explicitly instantiates `sparse_attention::run` (both forms) and `plan` (and thereby
 *        the kernels) for one row format; use in exactly one `.cu` file at namespace scope, e.g.
 *        `DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(dhisparse::row_format::mla_fp8_656)`.
 */
#define DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(...)                                     \
  template class dhisparse::sparse_attention::plan<__VA_ARGS__>;                        \
  template cudaError_t dhisparse::sparse_attention::run<__VA_ARGS__>(                   \
    dhisparse::sparse_attention::plan<__VA_ARGS__> const&,                              \
    dhisparse::sparse_attention::params const&, void*, std::size_t, cudaStream_t);      \
  template cudaError_t dhisparse::sparse_attention::run<__VA_ARGS__>(                   \
    dhisparse::sparse_attention::params const&, void*, std::size_t, cudaStream_t)

/**
 * @brief Declares the explicit instantiation made elsewhere, so that translation units
 *        that include this header do not compile the kernels again.
 */
#define DHISPARSE_SPARSE_ATTENTION_EXTERN(...)                                          \
  extern template class dhisparse::sparse_attention::plan<__VA_ARGS__>;                 \
  extern template cudaError_t dhisparse::sparse_attention::run<__VA_ARGS__>(            \
    dhisparse::sparse_attention::plan<__VA_ARGS__> const&,                              \
    dhisparse::sparse_attention::params const&, void*, std::size_t, cudaStream_t);      \
  extern template cudaError_t dhisparse::sparse_attention::run<__VA_ARGS__>(            \
    dhisparse::sparse_attention::params const&, void*, std::size_t, cudaStream_t)

#include <dhisparse/detail/sparse_attention/launch.cuh>
