/**
 * @file detail/sparse_attention/mla_layout.cuh
 * @brief Shape of the sparse MLA kernel that all of its roles share: tile sizes and thread
 *        roles, the per-role register budgets, the shared-memory layout, and `cta_work` —
 *        the CTA's selection, rows, tile stages and stage barriers.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>  // DHISPARSE_SPARSE_ATTENTION_WGMMA

#include <cstddef>
#include <cstdint>

namespace dhisparse::sparse_attention::detail::mla {

inline constexpr int tile_m         = 64;   ///< query heads per CTA
inline constexpr int warpgroup      = 128;
inline constexpr int threads        = 3 * warpgroup;  ///< score, value, producer
inline constexpr int consumers      = 2 * warpgroup;  ///< score + value warpgroups
inline constexpr int stages         = 2;    ///< bf16 tile stages
inline constexpr int dim            = 576;  ///< query / key width
inline constexpr int value_dim      = 512;  ///< value / output width
inline constexpr int row_chunks     = dim * 2 / 16;      ///< 16-byte chunks of a bf16 row (72)
inline constexpr int block_bytes    = tile_n * 128;      ///< 64 rows x 64 bf16 columns
inline constexpr int tile_bytes     = 9 * block_bytes;   ///< 64 rows x 576 bf16 (72 KiB)
inline constexpr int fp8_row_bytes  = 656;               ///< 512 e4m3 + 4 fp32 scales + 64 bf16
inline constexpr int fp8_rope_offset = 528;
inline constexpr int p_bytes        = tile_m * tile_n * 2;
/// Row pitches of the output tile staged in the (then free) tile stages at the end: bf16 or
/// fp32 rows plus 16 / 32 bytes, so that the accumulator fragments store without bank conflicts.
inline constexpr int o_pitch         = value_dim * 2 + 16;
inline constexpr int o_pitch_partial = value_dim * 4 + 32;

/// Rows of every FP8 tile that the value warpgroup dequantizes itself (the producer the other
/// 64 - value_rows): the producer's dequantization is the kernel's critical path for FP8 rows,
/// while the value warpgroup waits for the score warpgroup's softmax most of every tile (more
/// than 16 overload it). Only with `wgmma` (the value warpgroup needs registers
/// beyond the launch allocation for them) and not with `Crossover` (the two CTAs split the
/// dequantization there instead).
template <bool Fp8, bool Crossover>
inline constexpr int value_rows =
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  Fp8 && !Crossover ? 16 : 0;
#else
  0;
#endif

/// Per-thread register budgets after `setmaxnreg` (sm_90a). They add up to the 504 a thread
/// of each warpgroup gets at launch (65536 / 384, rounded down to a multiple of 8). The score
/// warpgroup holds 128 output + 32 score accumulators and 16 P registers; with less, ptxas
/// serializes its `wgmma` (warning C7512). The value warpgroup holds 128 accumulators (and the
/// e4m3 bytes of its `ValueRows`, 4 registers per row of a warp), the FP8 producer the e4m3
/// bytes of its rows. Chosen with `ptxas -v`: no role spills and no C7512 for either format.
template <bool Fp8, int ValueRows>
struct register_budget {
  static constexpr int launch   = 168;
  static constexpr int score    = Fp8 ? 208 : 232;
  static constexpr int value    = (Fp8 ? 160 : 208) + ValueRows;
  static constexpr int producer = (Fp8 ? 136 : 64) - ValueRows;
  static_assert(score + value + producer == 3 * launch, "budgets must use the launch allocation");
};

/// Byte offsets of the shared-memory regions (from a 1024-byte aligned base).
struct smem_layout {
  static constexpr int q       = 0;
  static constexpr int kv      = tile_bytes;                    ///< `stages` tiles
  static constexpr int p       = kv + stages * tile_bytes;      ///< P, 64 x 64 bf16, swizzled
  static constexpr int alpha   = p + p_bytes;                   ///< float[64]: rescale factors
  static constexpr int row_sum = alpha + tile_m * 4;            ///< float[64]: final row sums
  static constexpr int scales  = row_sum + tile_m * 4;          ///< float[64][4]: FP8 tile scales
  static constexpr int bars    = scales + tile_n * 16;          ///< mbarriers: full[2], empty[2]
  static constexpr int bytes   = bars + 4 * 8;
  static constexpr int alloc   = bytes + 1024;                  ///< + slack to align the base
};
static_assert(smem_layout::alloc <= 232448, "MLA tiles exceed 227 KiB of shared memory");
static_assert(tile_m * o_pitch_partial <= stages * tile_bytes, "the output tile must fit in the stages");

#if defined(__CUDACC__)

/// What the CTA works on, shared by the three roles (copies of the kernel arguments it
/// needs: holding a pointer to them would move the arguments to local memory).
struct cta_work {
  std::int32_t const* selection;  ///< this (b, q)'s selection
  std::byte const* rows;          ///< row of slot 0
  std::uint32_t row_stride;       ///< bytes between slots
  std::int64_t num_slots;
  std::uint32_t* status;
  int top_k;
  int tile_begin;                 ///< first tile of this split
  int n_tiles;                    ///< tiles of this split
  std::uint32_t smem_base;        ///< shared-memory window address of the aligned base
  unsigned char* smem;            ///< generic pointer to the same base

  DHISPARSE_DEVICE std::uint32_t stage_addr(int t) const
  {
    return smem_base + smem_layout::kv + std::uint32_t(t & 1) * tile_bytes;
  }
  /// The full / empty mbarrier of tile t's stage, as the generic pointers `cuda::ptx` takes
  /// (formed from the shared-window address, into which the compiler folds them back).
  DHISPARSE_DEVICE std::uint64_t* full_bar(int t) const
  {
    return static_cast<std::uint64_t*>(__cvta_shared_to_generic(smem_base + smem_layout::bars + 8 * (t & 1)));
  }
  DHISPARSE_DEVICE std::uint64_t* empty_bar(int t) const
  {
    return static_cast<std::uint64_t*>(__cvta_shared_to_generic(smem_base + smem_layout::bars + 16 + 8 * (t & 1)));
  }
  /// Parity of the phase of stage t & 1 that tile t fills.
  DHISPARSE_DEVICE static std::uint32_t phase(int t) { return std::uint32_t((t >> 1) & 1); }
  /// Selection entry `row` of tile t as stored (-1 past the selection or the split). Loaded
  /// ahead of its use and checked with `valid` later, so the load's latency is hidden.
  DHISPARSE_DEVICE int entry(int t, int row) const
  {
    int const k = (tile_begin + t) * tile_n + row;
    return t < n_tiles && k < top_k ? selection[k] : -1;
  }
  /// The slot id an entry names, or -1 (empty or invalid; invalid ones flagged when `report`).
  DHISPARSE_DEVICE int valid(int entry, bool report) const { return check_slot(entry, num_slots, status, report); }
  /// Row of slot `slot` (≥ 0): one 32 x 32 → 64-bit multiply (`check` keeps the stride below 4 GiB).
  DHISPARSE_DEVICE std::byte const* row(int slot) const
  {
    return rows + std::uint64_t(std::uint32_t(slot)) * row_stride;
  }
};

#endif  // __CUDACC__

}  // namespace dhisparse::sparse_attention::detail::mla
