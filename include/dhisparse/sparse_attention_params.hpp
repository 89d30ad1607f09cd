/**
 * @file sparse_attention_params.hpp
 * @brief Arguments of sparse attention over slot tables, shared by the CUDA kernels
 *        (`dhisparse/sparse_attention.cuh`) and the host reference
 *        (`dhisparse/host/sparse_attention.hpp`). Plain C++: no CUDA needed to include it.
 *
 * The types here are public (namespace `dhisparse::sparse_attention`); they live in a
 * plain-C++ header so that the reference backend, compiled without CUDA, takes the very
 * same argument struct as the device entry point.
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse::sparse_attention {

/// Largest supported `top_k` (selection length per query; union selections included).
inline constexpr int max_top_k = 1 << 16;

/// Largest number of split-K partitions of one selection.
inline constexpr int max_splits = 32;

/**
 * @brief What a row format means to attention: query / value widths and the layout kind.
 *
 * Specialized for `row_format::mla_bf16_576`, `row_format::mla_fp8_656` (MLA: one shared
 * latent KV row per token, query width 576 = 512 latent + 64 rope, value = the 512 latent
 * values) and `row_format::mha<KvHeads, 128, bf16>` (MHA / GQA: K and V of every KV head).
 * `supported` is false for every other format.
 *
 * @tparam RowFormat a row format (`dhisparse::row_format::…`)
 */
template <class RowFormat>
struct format_traits {
  static constexpr bool supported = false;
};

/// MLA, bf16 rows (1152 B).
template <>
struct format_traits<row_format::mla_bf16_576> {
  static constexpr bool supported = true;
  static constexpr bool is_mla    = true;
  static constexpr bool is_fp8    = false;
  static constexpr int query_dim  = 576;  ///< elements per query head (512 latent + 64 rope)
  static constexpr int value_dim  = 512;  ///< elements per output head
  static constexpr int kv_heads   = 1;
};

/// MLA, FP8 rows with per-128 tile scales (656 B).
template <>
struct format_traits<row_format::mla_fp8_656> {
  static constexpr bool supported = true;
  static constexpr bool is_mla    = true;
  static constexpr bool is_fp8    = true;
  static constexpr int query_dim  = 576;
  static constexpr int value_dim  = 512;
  static constexpr int kv_heads   = 1;
};

/// MHA / GQA, bf16 K and V of `KvHeads` heads of 128 elements.
template <int KvHeads>
struct format_traits<row_format::mha<KvHeads, 128, bf16>> {
  static constexpr bool supported = true;
  static constexpr bool is_mla    = false;
  static constexpr bool is_fp8    = false;
  static constexpr int query_dim  = 128;
  static constexpr int value_dim  = 128;
  static constexpr int kv_heads   = KvHeads;
};

/**
 * @brief Arguments of one sparse attention call (one layer, one step).
 *
 * All pointers are device pointers for `sparse_attention::run` and host pointers for
 * `host::sparse_attention`. Strides are in elements unless named `_bytes`/`row_stride`.
 * Shapes below use `query_dim` / `value_dim` of the row format (`format_traits`).
 *
 * Semantics, per (b, q, h) with b < real batch size:
 * `s_k = softmax_scale * <queries[b][q][h], K(slots[b][q][k])>` over the valid entries k,
 * `out[b][q][h] = sum_k softmax(s)_k * V(slots[b][q][k])`, `lse[b][q][h] = log(sum_k exp(s_k))`.
 * An entry is valid when it is a slot id in `[0, num_slots)`; -1 means "none". Every query
 * has its own selection (causality among the Q tail rows is carried by the selections;
 * there is no extra mask). Duplicated slot ids in one selection count as many times as
 * they appear. A query with no valid entry gets `out = 0` and `lse = -inf`.
 */
struct params {
  // --- queries -------------------------------------------------------------------------
  bf16 const* queries = nullptr;        ///< [batch][num_queries][num_heads][query_dim]
  std::int64_t query_stride_batch = 0;  ///< elements between consecutive b
  std::int64_t query_stride_query = 0;  ///< elements between consecutive q
  std::int64_t query_stride_head  = 0;  ///< elements between consecutive heads

  // --- KV rows (owned elsewhere: the hierarchy's slab of this layer) -------------------
  std::byte const* rows = nullptr;  ///< row of slot 0 for this layer; slot s at rows + s * row_stride
  std::size_t row_stride = 0;       ///< bytes between consecutive slots (multiple of 16, >= row bytes, < 4 GiB)
  std::int64_t num_slots = 0;       ///< slots addressable through `rows`; ids outside are invalid

  // --- selections ----------------------------------------------------------------------
  std::int32_t const* slots = nullptr;  ///< [batch][num_queries][top_k], -1 = none
  std::int64_t slot_stride_batch = 0;   ///< elements between consecutive b
  std::int64_t slot_stride_query = 0;   ///< elements between consecutive q (top_k contiguous)
  /// Real batch size (one int32), nullable: rows b >= *batch_size are skipped and their
  /// outputs left untouched; nullptr means every b < batch is computed. Lets a CUDA graph
  /// be captured once for a padded batch.
  std::int32_t const* batch_size = nullptr;

  // --- outputs -------------------------------------------------------------------------
  bf16* out = nullptr;                ///< [batch][num_queries][num_heads][value_dim]
  std::int64_t out_stride_batch = 0;  ///< elements
  std::int64_t out_stride_query = 0;
  std::int64_t out_stride_head  = 0;
  float* lse = nullptr;               ///< [batch][num_queries][num_heads], natural log; nullable
  std::int64_t lse_stride_batch = 0;  ///< elements
  std::int64_t lse_stride_query = 0;  ///< elements (heads contiguous)
  std::uint32_t* status = nullptr;    ///< nullable; `status_invalid_slot` (status.hpp, bit 10) is OR-ed in

  // --- shape ---------------------------------------------------------------------------
  int batch       = 0;  ///< padded batch size B (grid shape)
  int num_queries = 1;  ///< Q: 1 for decode, 1 + d for verification of d draft tokens
  int num_heads   = 0;  ///< query heads h_q (MLA: 16, 32, 64 or 128; MHA: multiple of kv heads)
  int top_k       = 0;  ///< K: selection length per query, 1 .. max_top_k
  float softmax_scale = 0.f;  ///< multiplies q·k before the softmax
  /// Split-K partitions of each selection: 0 chooses from the device's SM count (so that
  /// small batches still fill the GPU); n > 0 forces min(n, tiles of the selection).
  int num_splits = 0;
};

/**
 * @brief Fills the strides of `p` for dense, contiguous tensors of the shapes given by
 *        `p.num_queries`, `p.num_heads`, `p.top_k` and the row format.
 * @tparam RowFormat a supported row format
 */
template <class RowFormat>
void set_contiguous_strides(params& p)
{
  using traits = format_traits<RowFormat>;
  static_assert(traits::supported, "set_contiguous_strides: unsupported row format");
  p.query_stride_head  = traits::query_dim;
  p.query_stride_query = std::int64_t(p.num_heads) * traits::query_dim;
  p.query_stride_batch = std::int64_t(p.num_queries) * p.query_stride_query;
  p.out_stride_head    = traits::value_dim;
  p.out_stride_query   = std::int64_t(p.num_heads) * traits::value_dim;
  p.out_stride_batch   = std::int64_t(p.num_queries) * p.out_stride_query;
  p.lse_stride_query   = p.num_heads;
  p.lse_stride_batch   = std::int64_t(p.num_queries) * p.num_heads;
  p.slot_stride_query  = p.top_k;
  p.slot_stride_batch  = std::int64_t(p.num_queries) * p.top_k;
}

namespace detail {
inline bool aligned_to(void const* ptr, std::size_t bytes)
{
  return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
}
}  // namespace detail

/**
 * @brief The checks of `params_problem` that concern the call's shape only (`batch`,
 *        `num_queries`, `top_k`, `num_heads`, `num_splits`): what `workspace_size` and
 *        `num_splits` need, so that a binding can size the workspace before it has buffers.
 * @tparam RowFormat the row format of `rows`
 */
template <class RowFormat>
std::string shape_problem(params const& p)
{
  using traits = format_traits<RowFormat>;
  static_assert(traits::supported,
                "sparse_attention: RowFormat must be mla_bf16_576, mla_fp8_656 or "
                "mha<KvHeads, 128, bf16>");
  auto const str = [](auto v) { return std::to_string(v); };
  if (p.batch < 0) { return "sparse_attention: batch (" + str(p.batch) + ") is negative"; }
  if (p.num_queries < 1) { return "sparse_attention: num_queries (" + str(p.num_queries) + ") must be >= 1"; }
  if (p.top_k < 1 || p.top_k > max_top_k) {
    return "sparse_attention: top_k (" + str(p.top_k) + ") must be in [1, " + str(max_top_k) + "]";
  }
  if constexpr (traits::is_mla) {
    if (p.num_heads != 16 && p.num_heads != 32 && p.num_heads != 64 && p.num_heads != 128) {
      return "sparse_attention: num_heads (" + str(p.num_heads) + ") must be 16, 32, 64 or 128 for MLA";
    }
  } else {
    if (p.num_heads < traits::kv_heads || p.num_heads % traits::kv_heads != 0) {
      return "sparse_attention: num_heads (" + str(p.num_heads) + ") must be a positive multiple of the " +
             str(traits::kv_heads) + " KV heads";
    }
  }
  if (p.num_splits < 0 || p.num_splits > max_splits) {
    return "sparse_attention: num_splits (" + str(p.num_splits) + ") must be in [0, " + str(max_splits) + "]";
  }
  return {};
}

/**
 * @brief Checks the host-side arguments; returns an empty string when they are valid,
 *        otherwise a message naming the first bad argument ("sparse_attention: …"). `run`
 *        returns `cudaErrorInvalidValue` when it reports a problem.
 *
 * Checked: non-null `queries`, `rows`, `slots`, `out`; `batch >= 0`, `num_queries >= 1`,
 * `1 <= top_k <= max_top_k`; `num_heads` (MLA: 16, 32, 64 or 128; MHA: a positive multiple
 * of the KV heads); `row_stride` a multiple of 16, at least the row bytes and below 4 GiB; 16-byte
 * aligned `rows` and `queries` with query strides that keep every query head 16-byte
 * aligned; 4-byte aligned `out` with even output strides; non-negative strides and
 * `num_slots`; a finite `softmax_scale`; `0 <= num_splits <= max_splits`.
 * Device data (slot ids, `*batch_size`) is not read here: invalid slot ids are treated as
 * empty by the kernel and flagged in `*status`.
 *
 * @tparam RowFormat the row format of `rows`
 */
template <class RowFormat>
std::string params_problem(params const& p)
{
  auto const str = [](auto v) { return std::to_string(v); };  // RowFormat is checked by shape_problem
  if (p.queries == nullptr) { return "sparse_attention: queries is null"; }
  if (p.rows == nullptr) { return "sparse_attention: rows is null"; }
  if (p.slots == nullptr) { return "sparse_attention: slots is null"; }
  if (p.out == nullptr) { return "sparse_attention: out is null"; }
  if (auto shape = shape_problem<RowFormat>(p); !shape.empty()) { return shape; }
  if (p.row_stride % row_alignment != 0 || p.row_stride < RowFormat::bytes || p.row_stride > 0xFFFFFFF0u) {
    return "sparse_attention: row_stride (" + str(p.row_stride) + ") must be a multiple of 16, >= " +
           str(RowFormat::bytes) + " (row bytes) and below 4 GiB";
  }
  if (!detail::aligned_to(p.rows, row_alignment)) { return "sparse_attention: rows is not 16-byte aligned"; }
  if (!detail::aligned_to(p.queries, 16)) { return "sparse_attention: queries is not 16-byte aligned"; }
  if (p.query_stride_batch % 8 || p.query_stride_query % 8 || p.query_stride_head % 8) {
    return "sparse_attention: query strides must be multiples of 8 elements (16 bytes)";
  }
  if (!detail::aligned_to(p.out, 4)) { return "sparse_attention: out is not 4-byte aligned"; }
  if (p.out_stride_batch % 2 || p.out_stride_query % 2 || p.out_stride_head % 2) {
    return "sparse_attention: out strides must be even";
  }
  if (p.query_stride_batch < 0 || p.query_stride_query < 0 || p.query_stride_head < 0 ||
      p.out_stride_batch < 0 || p.out_stride_query < 0 || p.out_stride_head < 0 ||
      p.lse_stride_batch < 0 || p.lse_stride_query < 0 || p.slot_stride_batch < 0 ||
      p.slot_stride_query < 0) {
    return "sparse_attention: strides must be non-negative";
  }
  if (p.num_slots < 0) { return "sparse_attention: num_slots (" + str(p.num_slots) + ") is negative"; }
  if (!std::isfinite(p.softmax_scale)) { return "sparse_attention: softmax_scale is not finite"; }
  return {};
}

/**
 * @brief Throws `dhisparse::error` naming the first bad argument (see `params_problem`).
 * @tparam RowFormat the row format of `rows`
 */
template <class RowFormat>
void validate(params const& p)
{
  DHISPARSE_EXPECTS_NO_PROBLEM(params_problem<RowFormat>(p));
}

/// Deprecated name of `params_problem`.
template <class RowFormat>
[[deprecated("use sparse_attention::params_problem")]] std::string check(params const& p)
{
  return params_problem<RowFormat>(p);
}

}  // namespace dhisparse::sparse_attention
