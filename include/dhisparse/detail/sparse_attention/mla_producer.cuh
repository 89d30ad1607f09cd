/**
 * @file detail/sparse_attention/mla_producer.cuh
 * @brief The MLA kernel's producer warpgroup: gathers the selected rows of every tile into
 *        the two bf16 tile stages — bf16 rows with `cp.async`, FP8 rows dequantized through
 *        registers (alone, or half of every tile each in a two-CTA cluster) — and signals each
 *        filled stage on its full barrier.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/cluster.cuh>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mla_fp8_rows.cuh>
#include <dhisparse/detail/sparse_attention/mla_layout.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail::mla {

/**
 * @brief Producer, bf16 rows: warp w copies rows [16w, 16w + 16) of every tile, lane l its
 *        16-byte chunks l, l + 32, l + 64 (512 contiguous bytes of one row per instruction).
 *        Selection entries are read two tiles ahead, so their latency never sits between a
 *        stage becoming free and its copies.
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void produce_bf16(cta_work const& w, int warp, int lane)
{
  int const row0 = warp * 16;
  int const mine = lane < 16 ? row0 + lane : 0;
  int slot  = lane < 16 ? w.valid(w.entry(0, mine), true) : -1;  // this tile's slot ids
  int next  = lane < 16 ? w.entry(1, mine) : -1;                  // the next tile's entries
  for (int t = 0; t < w.n_tiles; ++t) {
    int const after = lane < 16 ? w.entry(t + 2, mine) : -1;
    if (t >= stages) { mbarrier_wait(w.empty_bar(t), cta_work::phase(t) ^ 1u); }
    std::uint32_t const dst = w.stage_addr(t);
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
      int const row_slot   = __shfl_sync(0xFFFFFFFFu, slot, i);
      bool const ok        = row_slot >= 0;
      std::byte const* src = w.row(ok ? row_slot : 0);
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        int const c = lane + 32 * j;
        if (c < row_chunks) { cp_async_16(dst + sw128_offset(row0 + i, c), src + 16 * c, ok); }
      }
    }
    cp_async_mbarrier_arrive(w.full_bar(t));
    slot = lane < 16 ? w.valid(next, true) : -1;
    next = after;
  }
  cp_async_wait<0>();
}

/// Bytes of dequantized rows one CTA of a two-CTA cluster receives from the other per tile
/// (32 rows x 512 bf16).
inline constexpr std::uint32_t crossover_bytes = (tile_n / 2) * value_dim * 2;

/**
 * @brief Producer, FP8 rows. Warp w copies the rope part of rows [16w, 16w + 16) with
 *        `cp.async` and dequantizes the latent part of its share of the rows: rows [n w,
 *        n w + n) with n = (64 - value_rows) / 4 (the value warpgroup dequantizes the last
 *        value_rows, see `value_share`), or with `Crossover` (two CTAs of a cluster
 *        computing the two head tiles of h_q = 128 over the same rows) rows
 *        [32 r + 8w, 32 r + 8w + 8) of CTA rank r, stored into both CTAs' stages — each CTA
 *        dequantizes half of every tile.
 *
 * The dequantized rows are handled in parts whose e4m3 bytes sit in registers. Without
 * `Crossover` the loads of a part for the next tile are issued as soon as the part is stored,
 * so they have the other parts' dequantization to land (the producer's path is the kernel's
 * critical one for FP8 rows); with it, after the whole tile (`one_batch`). Every
 * global load of a warp shares one scoreboard (ptxas), so the first read of any loaded
 * register waits for the newest load: entries are read only where such a wait happens anyway.
 * Lanes 0-15 hold the slot ids of the rope rows, lanes 16 + i those of the dequantized rows.
 */
template <bool Crossover>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void produce_fp8(cta_work const& w, int warp, int lane)
{
  constexpr int rows_per_warp = Crossover ? tile_n / 8 : (tile_n - value_rows<true, false>) / 4;
  // Two parts of 8 rows, else of 4: more parts mean more loads and no shorter waits.
  constexpr int part_rows = rows_per_warp == 16 ? 8 : 4;
  constexpr int parts     = rows_per_warp / part_rows;
  static_assert(rows_per_warp % part_rows == 0, "value_rows must leave the producer whole parts");
  // With `Crossover` (8 rows a warp) every part of the next tile is loaded after the tile is
  // stored: one load wait per tile pays there, not with 12 rows a warp.
  constexpr bool one_batch = Crossover;
  int const rank              = Crossover ? cluster_rank() : 0;
  int const rope0             = warp * 16;
  int const deq0              = (Crossover ? rank * (tile_n / 2) : 0) + warp * rows_per_warp;
  int const mine = lane < 16 ? rope0 + lane : (lane - 16 < rows_per_warp ? deq0 + lane - 16 : -1);
  int slot       = mine >= 0 ? w.valid(w.entry(0, mine), true) : -1;  // this tile's slot ids
  int next       = mine >= 0 ? w.entry(1, mine) : -1;                  // the next tile's entries
  // Lane l copies the rope of row 16w + l % 16, whose slot id lane l % 16 holds; shuffled a
  // tile ahead, so that the shuffle's latency is not on the producer's path.
  int rope_slot = __shfl_sync(0xFFFFFFFFu, slot, lane & 15);
  std::uint32_t const scales = w.smem_base + smem_layout::scales;
  float const* const scale_f = reinterpret_cast<float const*>(w.smem + smem_layout::scales);
  fp8_rows<part_rows> rows[parts];
  if (w.n_tiles > 0) {
#pragma unroll
    for (int k = 0; k < parts; ++k) { rows[k].load(w, slot, 16 + k * part_rows, deq0 + k * part_rows, lane, scales); }
  }
  // cp.async groups in flight at the top of iteration t: the scales of every part of tile t.
  for (int t = 0; t < w.n_tiles; ++t) {
    bool const more = t + 1 < w.n_tiles;
    int const after = mine >= 0 ? w.entry(t + 2, mine) : -1;
    if (t >= stages) { mbarrier_wait(w.empty_bar(t), cta_work::phase(t) ^ 1u); }
    std::uint32_t const dst    = w.stage_addr(t);
    unsigned char* const stage = w.smem + (dst - w.smem_base);
    std::uint32_t const peer_stage = Crossover ? peer_address(dst, rank ^ 1) : 0u;
    std::uint32_t const peer_full  = Crossover ? peer_address(smem_address(w.full_bar(t)), rank ^ 1) : 0u;
    // Rope: lane l copies 16-byte chunks 4 (l / 16) .. 4 (l / 16) + 3 of rope row 16w + l % 16
    // (consecutive chunks of one row differ only in the swizzled chunk bits).
    {
      bool const ok        = rope_slot >= 0;
      std::byte const* src = w.row(ok ? rope_slot : 0) + fp8_rope_offset + 64 * (lane >> 4);
      std::uint32_t const first = dst + sw128_offset(rope0 + (lane & 15), 64 + 4 * (lane >> 4));
#pragma unroll
      for (int k = 0; k < 4; ++k) { cp_async_16(first ^ std::uint32_t(k << 4), src + 16 * k, ok); }
    }
    cp_async_commit();
    int const next_slot = mine >= 0 ? w.valid(next, true) : -1;
    rope_slot           = __shfl_sync(0xFFFFFFFFu, next_slot, lane & 15);
#pragma unroll
    for (int k = 0; k < parts; ++k) {
      // In flight: scales of parts k.. of tile t, the rope, scales of parts ..k-1 of tile t + 1.
      if (!one_batch || k == 0) {
        cp_async_wait<one_batch ? 1 : parts>();  // part k's (with one_batch: every part's) scales
        __syncwarp();
      }
      rows[k].template store<Crossover>(stage, deq0 + k * part_rows, lane, scale_f, peer_stage, peer_full);
      if (!one_batch && k + 1 < parts) {
        __syncwarp();  // every lane has read part k's scales
        if (more) {
          rows[k].load(w, next_slot, 16 + k * part_rows, deq0 + k * part_rows, lane, scales);
        } else {
          cp_async_commit();  // an empty group keeps the counts
        }
      }
    }
    __syncwarp();  // every lane has read the scales of the parts still to be reloaded
    cp_async_wait<one_batch ? 0 : parts - 1>();  // the rope part
    fence_proxy_async();  // this thread's stores and copies, read by wgmma (async proxy)
    if (Crossover && warp == 0 && lane == 0) {
      mbarrier_arrive_expect_tx(w.full_bar(t), crossover_bytes);  // the peer's half of the tile
    } else {
      mbarrier_arrive(w.full_bar(t));
    }
    slot = next_slot;
    next = after;
    // The last part's (with one_batch: every part's) loads only after the arrival (whose
    // release could wait for them).
    if (more) {
#pragma unroll
      for (int k = one_batch ? 0 : parts - 1; k < parts; ++k) {
        rows[k].load(w, slot, 16 + k * part_rows, deq0 + k * part_rows, lane, scales);
      }
    }
  }
  cp_async_wait<0>();
}

}  // namespace dhisparse::sparse_attention::detail::mla

#endif  // __CUDACC__
