/**
 * @file detail/sparse_attention/kernel_common.cuh
 * @brief What every sparse attention kernel shares: the kernel argument block (user
 *        arguments + launch plan), the real batch size, slot validation and the
 *        128-byte XOR swizzle of shared-memory tiles.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/status.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dhisparse::sparse_attention::detail {

/// Selected slots per tile: one shared-memory stage holds the rows of this many entries.
inline constexpr int tile_n = 64;

/// log2(e) and ln(2): scores are kept in the log2 domain (`exp2`), LSE is reported in ln.
inline constexpr float log2_e = 1.4426950408889634f;
inline constexpr float ln_2   = 0.6931471805599453f;

/// How far (log2 domain) a tile's score maximum may exceed the running maximum before the
/// online softmax moves it. Below that the probabilities are exp2(s - m) ≤ 2^8 — harmless in
/// fp32 sums and in bf16 P, whose precision is relative — and the accumulators need no
/// rescaling; as the running maximum of a row quickly approaches its final value, nearly every
/// tile after the first then skips the rescale (FlashAttention-4's conditional rescaling).
inline constexpr float max_slack_log2 = 8.f;

/**
 * @brief Grid-invariant arguments of the attention kernels, passed by value.
 *
 * A "unit" is the work of one CTA for one (b, q, split): an MLA head tile of 64 heads, or
 * an MHA (KV head, 16-head tile) pair. With `num_splits > 1` every CTA writes a normalized
 * fp32 partial output and its LSE; the combine kernel merges the splits in order.
 */
struct kernel_args {
  params p;
  float scale_log2     = 0.f;  ///< softmax_scale * log2(e)
  int num_tiles        = 0;    ///< ceil(top_k / tile_n)
  int tiles_per_split  = 0;    ///< tiles handled by one split (the last one may get fewer)
  int num_splits       = 1;    ///< split-K partitions (every one non-empty)
  int units_per_query  = 0;    ///< units per (b, q)
  int rows_per_unit    = 0;    ///< query heads per unit (64 MLA, 16 MHA)
  int group            = 0;    ///< query heads per KV head (MLA: num_heads)
  int m_tiles          = 0;    ///< units per KV head
  float* partial_out   = nullptr;  ///< [b][q][unit][split][rows_per_unit][value_dim]
  float* partial_lse   = nullptr;  ///< [b][q][unit][split][rows_per_unit]
};
static_assert(std::is_trivially_copyable_v<kernel_args>);

#if defined(__CUDACC__)

/// 2^x on the special-function unit alone (`ex2.approx.ftz`): `exp2f` wraps the same
/// instruction in range fix-ups for subnormal results, i.e. probabilities below 2^-126 of the
/// row maximum, which the softmax may as well flush to zero. Three instructions fewer per score.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE float exp2_approx(float x)
{
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The running maximum (log2 domain) after a tile with maximum `tile_max`: moved only when
/// the tile's exceeds it by more than `max_slack_log2` (always from -inf to a finite one).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE float next_running_max(float running, float tile_max)
{
  return tile_max > running + max_slack_log2 ? tile_max : running;
}

/// Batch rows to compute: `*batch_size` clamped to [0, batch], or `batch`.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int real_batch(params const& p)
{
  if (p.batch_size == nullptr) { return p.batch; }
  int const n = *p.batch_size;
  return n < 0 ? 0 : (n > p.batch ? p.batch : n);
}

/// What one CTA computes: unit (fastest in the grid), query, split and batch row.
struct block_coords {
  int unit;
  int q;
  int split;
  int b;
};

/// Decodes `blockIdx.x` of a grid of batch x splits x num_queries x units_per_query.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE block_coords decode_block(kernel_args const& a)
{
  int block = int(blockIdx.x);
  block_coords c;
  c.unit  = block % a.units_per_query;
  block  /= a.units_per_query;
  c.q     = block % a.p.num_queries;
  block  /= a.p.num_queries;
  c.split = block % a.num_splits;
  c.b     = block / a.num_splits;
  return c;
}

/// The slot id a selection entry names, or -1 when it is -1 or invalid (in which case
/// `report` flags `*status`).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int check_slot(int entry, std::int64_t num_slots, std::uint32_t* status,
                                                      bool report)
{
  if (entry >= 0 && entry < num_slots) { return entry; }
  if (entry != -1 && report && status != nullptr) { atomicOr(status, status_invalid_slot); }
  return -1;
}

/**
 * @brief Reads selection entry `k` (of `top_k`); returns the slot id, or -1 when the entry
 *        is past the end, -1, or invalid (in which case `report` flags `*status`).
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int load_slot(params const& p, std::int32_t const* selection,
                                                     int k, bool report)
{
  return k < p.top_k ? check_slot(selection[k], p.num_slots, p.status, report) : -1;
}

/**
 * @brief Byte offset of 16-byte chunk `chunk` of row `row` in a tile stored as blocks of
 *        64 rows x 128 bytes (one block per 64 bf16 columns), each 16-byte chunk XOR-swizzled
 *        by `row % 8`: the `wgmma` 128-byte swizzle, also conflict-free for `ldmatrix`.
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t sw128_offset(int row, int chunk)
{
  return std::uint32_t((chunk >> 3) * 8192 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

#endif  // __CUDACC__

}  // namespace dhisparse::sparse_attention::detail
