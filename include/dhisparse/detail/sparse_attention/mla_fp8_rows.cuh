/**
 * @file detail/sparse_attention/mla_fp8_rows.cuh
 * @brief Dequantization of `mla_fp8_656` rows into a bf16 tile stage: e4m3 → bf16 with the
 *        per-128 tile scales, the register-held parts of rows a warp dequantizes per tile
 *        (`fp8_rows`, also stored into the peer CTA's stage in a two-CTA cluster), and the
 *        value warpgroup's share of every tile (`value_share`).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/cluster.cuh>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mla_layout.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail::mla {

/// Two e4m3 values (low byte first) times `scale` → packed bf16x2.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t e4m3x2_to_bf16x2(std::uint32_t two, float scale)
{
  __half2_raw const raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu),
                                                     __NV_E4M3);
  float2 const f = __half22float2(__half2(raw));
  return pack_bf16x2(f.x * scale, f.y * scale);
}

/// Eight e4m3 values times `scale` → one 16-byte chunk of bf16.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE uint4 e4m3x8_to_bf16x8(uint2 v, float scale)
{
  return make_uint4(e4m3x2_to_bf16x2(v.x, scale), e4m3x2_to_bf16x2(v.x >> 16, scale),
                    e4m3x2_to_bf16x2(v.y, scale), e4m3x2_to_bf16x2(v.y >> 16, scale));
}

/// One part of the FP8 rows a producer warp dequantizes per tile (`Rows` of them), lane l
/// holding e4m3 bytes [8l, 8l + 8) and [256 + 8l, 256 + 8l + 8) of each in registers; the
/// rows' four tile scales go to shared memory (registers are the producer's scarcest resource).
template <int Rows>
struct fp8_rows {
  static_assert(Rows <= 8 && (Rows & (Rows - 1)) == 0, "rows of a part: a power of two up to 8");
  uint2 lo[Rows];
  uint2 hi[Rows];

  /// Issues the loads of tile rows [first_row, first_row + Rows), whose slot ids lanes
  /// `first_lane` .. `first_lane + Rows - 1` of `slot` hold (-1: zeros); their scales are one
  /// committed `cp.async` group to `scales` (float[64][4], the tile's rows).
  DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void load(cta_work const& w, int slot, int first_lane, int first_row,
                                                   int lane, std::uint32_t scales)
  {
    std::byte const* const lane_rows = w.rows + 8 * lane;  // slot id → address: one wide multiply-add
#pragma unroll
    for (int i = 0; i < Rows; ++i) {
      int const s = __shfl_sync(0xFFFFFFFFu, slot, first_lane + i);
      load_global_8x2(lo[i], hi[i], lane_rows + std::uint64_t(std::uint32_t(max(s, 0))) * w.row_stride, s);
    }
    if (lane >= first_lane && lane < first_lane + Rows) {
      cp_async_16(scales + 16 * (first_row + lane - first_lane), w.row(slot >= 0 ? slot : 0) + 512, slot >= 0);
    }
    cp_async_commit();
  }

  /// Dequantizes the rows into the stage (e4m3 → f16, exact → f32 × tile scale → bf16): chunk
  /// l of a row (values 8l .. 8l + 8, tile scale l / 16) and chunk 32 + l. With `Crossover`
  /// every chunk also goes to the peer CTA's stage (`peer_stage`), completing on its full
  /// barrier `peer_full`.
  template <bool Crossover>
  DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void store(unsigned char* stage, int first_row, int lane, float const* scale,
                                                    std::uint32_t peer_stage, std::uint32_t peer_full) const
  {
    // first_row is a multiple of Rows (≤ 8), so row first_row + i swizzles its chunks by
    // (first_row % 8) ^ i: the offsets are the first row's, XOR i in the chunk bits, + 128 i.
    std::uint32_t const first_lo = sw128_offset(first_row, lane);
#pragma unroll
    for (int i = 0; i < Rows; ++i) {
      int const r         = first_row + i;
      uint4 const v_lo    = e4m3x8_to_bf16x8(lo[i], scale[4 * r + (lane >> 4)]);
      uint4 const v_hi    = e4m3x8_to_bf16x8(hi[i], scale[4 * r + 2 + (lane >> 4)]);
      std::uint32_t const off_lo = (first_lo ^ std::uint32_t(i << 4)) + 128u * i;
      std::uint32_t const off_hi = off_lo + 4 * block_bytes;  // chunk 32 + lane
      *reinterpret_cast<uint4*>(stage + off_lo) = v_lo;
      *reinterpret_cast<uint4*>(stage + off_hi) = v_hi;
      if constexpr (Crossover) {
        st_async_16(peer_stage + off_lo, v_lo, peer_full);
        st_async_16(peer_stage + off_hi, v_hi, peer_full);
      }
    }
  }
};

/**
 * @brief The value warpgroup's share of the FP8 dequantization: warp w of it dequantizes rows
 *        [64 - 4 Rows + Rows w, + Rows) of every tile, the rows' e4m3 bytes loaded into
 *        registers one tile ahead. The stage of tile t is filled while the score warpgroup
 *        computes tile t - 1's scores and softmax, the time the value warpgroup otherwise
 *        waits; the full barrier of a stage counts the value warpgroup's threads too.
 */
template <int Rows>
struct value_share {
  fp8_rows<Rows> data;  ///< the rows of the next tile to fill
  int row0;             ///< this warp's first row of a tile
  int mine;             ///< tile row whose slot id this lane holds (lanes 0 .. Rows - 1), or -1
  int next;             ///< selection entry of the tile after the loaded one

  /// Issues the loads of tile 0's rows.
  DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void begin(cta_work const& w, int warp, int lane)
  {
    row0           = tile_n - 4 * Rows + warp * Rows;
    mine           = lane < Rows ? row0 + lane : -1;
    int const slot = mine >= 0 ? w.valid(w.entry(0, mine), false) : -1;  // the producer reports
    next           = mine >= 0 ? w.entry(1, mine) : -1;
    if (w.n_tiles > 0) { data.load(w, slot, 0, row0, lane, w.smem_base + smem_layout::scales); }
  }

  /// Dequantizes the loaded rows into tile t's stage once it is free, arrives on its full
  /// barrier and issues the loads of tile t + 1's rows.
  DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void fill(cta_work const& w, int t, int lane)
  {
    if (t >= stages) { mbarrier_wait(w.empty_bar(t), cta_work::phase(t) ^ 1u); }
    cp_async_wait<0>();  // the rows' scales
    __syncwarp();
    std::uint32_t const dst = w.stage_addr(t);
    data.template store<false>(w.smem + (dst - w.smem_base), row0, lane,
                               reinterpret_cast<float const*>(w.smem + smem_layout::scales), 0u, 0u);
    __syncwarp();  // every lane has read the scales before they are reloaded
    fence_proxy_async();
    mbarrier_arrive(w.full_bar(t));
    if (t + 1 < w.n_tiles) {
      // Global loads share one scoreboard: `next` is read here, after the rows loaded with it
      // were used, and reloaded here, so that nothing waits for the new rows before the next fill.
      int const slot = mine >= 0 ? w.valid(next, false) : -1;
      next           = mine >= 0 ? w.entry(t + 2, mine) : -1;
      data.load(w, slot, 0, row0, lane, w.smem_base + smem_layout::scales);
    }
  }
};

}  // namespace dhisparse::sparse_attention::detail::mla

#endif  // __CUDACC__
