/**
 * @file examples/torch/mla_hierarchy.hpp
 * @brief One instantiation of dhisparse for the PyTorch extension: a `kv_hierarchy` of
 *        FP8 MLA rows (`row_format::mla_fp8_656`, LRU eviction, `adaptive_budget<>`) and
 *        sparse attention over it, behind plain pointers and `cudaStream_t`.
 *
 * The kernels are compiled once, by nvcc, in mla_hierarchy.cu; this header includes no
 * kernel code and no PyTorch header, so the extension's glue (dhisparse_torch.cpp) is
 * compiled by the host compiler against it, and mla_hierarchy.cu by nvcc without PyTorch's
 * headers. Every call forwards to the `kv_hierarchy` call of the same name
 * (docs/integration.md); what is added here is attention with a workspace sized once and
 * taken from the same memory resource as the hierarchy.
 */
#pragma once

#include <dhisparse/group_counters.hpp>
#include <dhisparse/hierarchy_config.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dhisparse_torch {

/// What the extension's constructor sets; every other field of `hierarchy_config` keeps
/// its default (backup every step or up to 4 steps apart, 64 tokens per host page, pinned
/// host store from the pinned resource).
struct mla_shape {
  std::vector<int> group_layers;       ///< layers of each layer group
  int max_requests = 0;
  int max_batch    = 0;                ///< padded batch of a step (the capture size)
  int max_queries  = 1;                ///< queries per request per step
  int max_top_k    = 0;                ///< longest selection (K) a step may use
  int max_context  = 0;
  std::int64_t device_slots_per_group = 0;
  std::size_t host_capacity_pages     = 0;  ///< host store pages (64 positions each)
  int num_heads = 16;                  ///< attention query heads (MLA: 16, 32, 64 or 128)
};

/**
 * @brief `kv_hierarchy<mla_fp8_656, lru, adaptive_budget<>>` plus sparse attention over it.
 *        Move-only. Host-side calls throw `dhisparse::error` (a `std::runtime_error`).
 */
class mla_hierarchy {
 public:
  static constexpr std::size_t row_bytes = 656;  ///< one FP8 MLA row (512 e4m3, 4 fp32 scales, 64 bf16)
  static constexpr int query_dim         = 576;  ///< bf16 elements of a query head
  static constexpr int value_dim         = 512;  ///< bf16 elements of an output head

  /// The hierarchy configuration of `shape`, allocating from `resources`.
  static dhisparse::hierarchy_config make_config(mla_shape const& shape, dhisparse::memory_resources resources);

  /**
   * @brief What construction takes from the resources, to the byte: the hierarchy's
   *        `bytes_required` plus the attention workspace (device). Uses the current
   *        device's SM count (the workspace depends on it).
   */
  static dhisparse::memory_footprint bytes_required(mla_shape const& shape);

  /// Allocates everything from `resources` (nullptr members: cudaMalloc / cudaHostAlloc),
  /// ordered on `stream`, for the current device. Device memory is returned on `stream` at
  /// destruction.
  mla_hierarchy(mla_shape const& shape, dhisparse::memory_resources resources, cudaStream_t stream);
  ~mla_hierarchy();
  mla_hierarchy(mla_hierarchy&&) noexcept;
  mla_hierarchy& operator=(mla_hierarchy&&) noexcept;

  // ---- requests and batches: host side, between steps (never inside a graph) --------------
  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity, cudaStream_t stream);
  /// Rows [first, first + count) of (id, group, layer) from `source` (host or device
  /// memory, row k at source + k × stride), one async copy per host page on `stream`.
  void write_host_rows(std::uint64_t id, int group, int layer, std::int64_t first, std::int64_t count,
                       void const* source, std::size_t stride, cudaStream_t stream);
  /// Copies rows [first, first + count) of (id, group, layer) out of the host store into
  /// `out` (host memory, `row_bytes` apart). A plain host copy: the caller synchronizes
  /// the backup that wrote them first.
  void read_host_rows(std::uint64_t id, int group, int layer, std::int64_t first, std::int64_t count,
                      void* out) const;
  void set_batch(std::uint64_t const* ids, std::int32_t const* queries, int count, cudaStream_t stream);
  void release(std::uint64_t id, cudaStream_t stream);
  [[nodiscard]] bool contains(std::uint64_t id) const;
  /// Committed length of `id`; synchronizes `stream`.
  [[nodiscard]] std::int32_t length_sync(std::uint64_t id, cudaStream_t stream) const;

  // ---- the step: stream-ordered, allocation-free, capturable ------------------------------
  /// selections: device `[max_batch][max_queries][top_k]`, -1 = none, any order.
  void resolve(int group, std::int32_t const* selections, int top_k, cudaStream_t stream);
  void retrieve(int group, cudaStream_t stream);
  /**
   * @brief Sparse attention of layer `layer` of `group` over the slot table of its last
   *        resolve. queries: device bf16 `[max_batch][max_queries][num_heads][576]`; out:
   *        bf16 `[max_batch][max_queries][num_heads][512]`; lse: float
   *        `[max_batch][max_queries][num_heads]` or nullptr. Entries beyond the real batch
   *        are left untouched. Invalid slots are flagged in the status word.
   */
  void attention(int group, int layer, void const* queries, void* out, float* lse, float softmax_scale,
                 cudaStream_t stream);
  /// accepted: device `[max_batch]` tail rows to keep, or nullptr (keep all).
  void commit(std::int32_t const* accepted, cudaStream_t stream);
  void backup(cudaStream_t stream);

  // ---- device views (valid while this object lives) ----------------------------------------
  /// `[max_batch][max_queries]`, -1 = none; reset to -1 by commit.
  [[nodiscard]] std::int32_t const* tail_slots(int group) const;
  /// `[max_batch][max_queries][resolved_top_k(group)]`; groups of one parity share a buffer.
  [[nodiscard]] std::int32_t const* slot_table(int group) const;
  [[nodiscard]] int resolved_top_k(int group) const;
  /// Row of slot s of layer `layer` of `group`: `layer_rows(group, layer) + s * group_row_bytes(group)`.
  [[nodiscard]] std::byte* layer_rows(int group, int layer) const;
  [[nodiscard]] std::size_t group_row_bytes(int group) const;
  [[nodiscard]] dhisparse::group_counters const* counters(int group) const;
  [[nodiscard]] std::int32_t const* committed_rows() const;   ///< `[max_batch]`
  [[nodiscard]] std::uint32_t const* commit_status() const;   ///< `[max_batch]`

  // ---- host reads (synchronize `stream`) ----------------------------------------------------
  [[nodiscard]] dhisparse::group_counters read_counters_sync(int group, cudaStream_t stream) const;
  [[nodiscard]] std::uint32_t status_sync(cudaStream_t stream) const;
  [[nodiscard]] static std::string describe_status(std::uint32_t status);

  [[nodiscard]] dhisparse::hierarchy_config const& config() const;
  [[nodiscard]] int num_heads() const;
  [[nodiscard]] std::size_t attention_workspace_bytes() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dhisparse_torch
