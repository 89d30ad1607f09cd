/**
 * @file detail/sparse_attention/mla_kernel.cuh
 * @brief Sparse MLA attention kernel (DeepSeek / GLM DSA): queries of 576 (512 latent +
 *        64 rope), one shared latent row per selected token, values = the 512 latent values.
 *
 * One CTA computes 64 query heads of one (b, q) over one split of its selection, 64
 * selected rows per tile, with three warpgroups in fixed roles:
 *
 * - producer (warpgroup 2) fills two bf16 tile stages: bf16 rows are copied with 16-byte
 *   `cp.async` straight into the 128-byte-swizzled operand tile; FP8 rows are loaded into
 *   registers ahead of their use, dequantized with their per-128 tile scales and stored as
 *   bf16 (the rope part and the scales are copied with `cp.async`). Invalid / -1 entries
 *   become zero rows. Each filled stage is signalled through an mbarrier. With h_q = 128 and
 *   FP8 rows the two head tiles run as a cluster: each CTA dequantizes half of every tile
 *   into both CTAs' stages (`st.async`); otherwise the value warpgroup dequantizes 16 of the
 *   64 rows of every FP8 tile (`value_share`);
 * - score warpgroup (0): S = Q K^T over the whole 64 x 64 tile (36 `wgmma` m64n64k16, Q and
 *   K from shared memory), masking, online softmax (every row's 64 columns live in one quad
 *   of lanes: no cross-warp reduction), P (bf16) and the rescale factors to shared memory for
 *   the value warpgroup, then O[:, 0:256) += P V with P straight from registers;
 * - value warpgroup (1): rescales its accumulators and computes O[:, 256:512) += P V with
 *   P from shared memory — while the score warpgroup already computes the next tile's S.
 *
 * Both consumers read V as the first 512 columns of the same tile (MN-major operand): the
 * latent values are never copied. Where the translation unit is not compiled for sm_90a,
 * the same roles run on `mma.sync` m16n8k16 with `ldmatrix` (the `wgmma` accumulator and
 * A-register layouts are those of four m16n8 tiles per warp, so all other code is shared).
 *
 * At the end both consumers stage O / l in the (then free) tile stages and store whole
 * output rows with 16-byte stores (the accumulator layout gives 4-byte pieces of 8 rows per
 * instruction: half-used sectors and four times the store instructions).
 *
 * Shared memory: Q 72 KiB + 2 x 72 KiB tile stages + P 8 KiB + row statistics ≈ 226 KiB;
 * one CTA per SM.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/cluster.cuh>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>
#include <dhisparse/sparse_attention_params.hpp>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

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

/// Named barriers (id 0 is `__syncthreads`), each between the two consumer warpgroups.
inline constexpr int barrier_p_ready  = 1;  ///< score → value: P and the rescale factors are in shared memory
inline constexpr int barrier_p_free   = 2;  ///< value → score: P may be overwritten
inline constexpr int barrier_epilogue = 3;  ///< score → value: row sums are in shared memory
inline constexpr int barrier_output   = 4;  ///< both: the output tile is in shared memory

/// Rows of every FP8 tile that the value warpgroup dequantizes itself (the producer the other
/// 64 - value_rows): the producer's dequantization is the kernel's critical path for FP8 rows,
/// while the value warpgroup waits for the score warpgroup's softmax most of every tile (16
/// measured best; 32 overloads it). Only with `wgmma` (the value warpgroup needs registers
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

/// Adds `bytes` (a multiple of 16) to the start address of a shared-memory descriptor
/// (its low 14 bits hold the address / 16; shared-memory addresses stay below 2^18).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint64_t descriptor_plus(std::uint64_t desc, std::uint32_t bytes)
{
  return desc + (bytes >> 4);
}

/**
 * @brief S[64 x 64] = Q[64 x 576] K[64 x 576]^T on one warpgroup; accumulator layout of
 *        `wgmma` m64n64 (= eight m16n8 tiles per warp, warp w owning rows 16w .. 16w + 16).
 *        With `wgmma` the product is only issued (one committed group): `wgmma_wait` before
 *        reading `s`.
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void score_product(float (&s)[32], std::uint32_t q_addr,
                                                         std::uint32_t kv_addr, int warp, int lane)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  (void)warp;
  (void)lane;
  std::uint64_t const desc_q = sw128_descriptor(q_addr, 16, 1024);
  std::uint64_t const desc_k = sw128_descriptor(kv_addr, 16, 1024);
  fence_registers(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < dim / 16; ++kk) {
    std::uint32_t const k_off = std::uint32_t((kk >> 2) * block_bytes + (kk & 3) * 32);
    wgmma_m64n64k16_ss(s, descriptor_plus(desc_q, k_off), descriptor_plus(desc_k, k_off), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
#else
#pragma unroll
  for (int i = 0; i < 32; ++i) { s[i] = 0.f; }
  int const a_row  = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  int const b_row  = (lane & 7) + (lane >> 4) * 8;
  int const a_half = lane >> 4;
  int const b_half = (lane >> 3) & 1;
#pragma unroll 2
  for (int kk = 0; kk < dim / 16; ++kk) {
    std::uint32_t a[4];
    ldmatrix_x4<false>(a, q_addr + sw128_offset(a_row, 2 * kk + a_half));
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      std::uint32_t b[4];
      ldmatrix_x4<false>(b, kv_addr + sw128_offset(b_row + 16 * jj, 2 * kk + b_half));
      mma_bf16_16816(&s[8 * jj], a, b[0], b[1]);
      mma_bf16_16816(&s[8 * jj + 4], a, b[2], b[3]);
    }
  }
#endif
}

/**
 * @brief O[64 x 256] += P[64 x 64] V[64 x 256] for the value columns starting at 16-byte
 *        chunk `chunk0` (0: columns 0-255, 32: columns 256-511) of the tile at `kv_addr`.
 *
 * With `PInRegisters`, P comes from `p_frag` (A fragments: k-step kk in registers
 * 4 kk .. 4 kk + 3); otherwise from the swizzled P tile at `p_addr`. With `wgmma` the product
 * is only issued (one committed group): `wgmma_wait` before touching `o` or `p_frag`.
 */
template <bool PInRegisters>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void value_product(float (&o)[128], std::uint32_t const (&p_frag)[16],
                                                         std::uint32_t p_addr, std::uint32_t kv_addr,
                                                         int chunk0, int warp, int lane)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  (void)warp;
  (void)lane;
  std::uint64_t const desc_v = sw128_descriptor(kv_addr + std::uint32_t(chunk0 / 8) * block_bytes, block_bytes, 1024);
  std::uint64_t const desc_p = sw128_descriptor(p_addr, 16, 1024);
  fence_registers(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < tile_n / 16; ++kk) {
    std::uint64_t const v = descriptor_plus(desc_v, kk * 16 * 128);
    if constexpr (PInRegisters) {
      std::uint32_t const a[4] = {p_frag[4 * kk], p_frag[4 * kk + 1], p_frag[4 * kk + 2], p_frag[4 * kk + 3]};
      wgmma_m64n256k16_rs_bt(o, a, v);
    } else {
      wgmma_m64n256k16_ss_bt(o, descriptor_plus(desc_p, kk * 32), v);
    }
  }
  wgmma_commit();
#else
  int const a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  int const v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < tile_n / 16; ++kk) {
    std::uint32_t a[4];
    if constexpr (PInRegisters) {
#pragma unroll
      for (int i = 0; i < 4; ++i) { a[i] = p_frag[4 * kk + i]; }
    } else {
      ldmatrix_x4<false>(a, p_addr + sw128_offset(a_row, 2 * kk + (lane >> 4)));
    }
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      std::uint32_t b[4];
      ldmatrix_x4<true>(b, kv_addr + sw128_offset(16 * kk + v_row, chunk0 + 2 * jj + (lane >> 4)));
      mma_bf16_16816(&o[8 * jj], a, b[0], b[1]);
      mma_bf16_16816(&o[8 * jj + 4], a, b[2], b[3]);
    }
  }
#endif
}

/// O rows r0 (`alpha0`) and r0 + 8 (`alpha1`) of this thread *= the online-softmax rescale
/// factors; skipped by a warp whose factors are all 1 (its row maxima did not change).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void rescale(float (&o)[128], float alpha0, float alpha1)
{
  if (!__any_sync(0xFFFFFFFFu, alpha0 != 1.f || alpha1 != 1.f)) { return; }
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= alpha0;
    o[4 * j + 1] *= alpha0;
    o[4 * j + 2] *= alpha1;
    o[4 * j + 3] *= alpha1;
  }
}

/// Barrier among the two consumer warpgroups (the producer never joins one). Both sides of
/// every hand-over wait (`bar.sync`), none only arrives: the waiting costs nothing here (the
/// other side is idle until the hand-over anyway) and every access pair is then ordered by a
/// barrier both threads took part in, which `compute-sanitizer --tool racecheck` can follow.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void consumer_sync(int id) { named_barrier_sync(id, consumers); }

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
  DHISPARSE_DEVICE std::uint32_t full_bar(int t) const { return smem_base + smem_layout::bars + 8 * (t & 1); }
  DHISPARSE_DEVICE std::uint32_t empty_bar(int t) const
  {
    return smem_base + smem_layout::bars + 16 + 8 * (t & 1);
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
 * so they have the other parts' dequantization to land (loading a whole tile after the
 * previous one was stored left the load latency on the producer's path, which is the
 * kernel's critical one for FP8 rows); with it, after the whole tile (`one_batch`). Every
 * global load of a warp shares one scoreboard (ptxas), so the first read of any loaded
 * register waits for the newest load: entries are read only where such a wait happens anyway.
 * Lanes 0-15 hold the slot ids of the rope rows, lanes 16 + i those of the dequantized rows.
 */
template <bool Crossover>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void produce_fp8(cta_work const& w, int warp, int lane)
{
  constexpr int rows_per_warp = Crossover ? tile_n / 8 : (tile_n - value_rows<true, false>) / 4;
  // Two parts of 8 rows (4 or 8 parts measured slower: more loads, no shorter waits), else of 4.
  constexpr int part_rows = rows_per_warp == 16 ? 8 : 4;
  constexpr int parts     = rows_per_warp / part_rows;
  static_assert(rows_per_warp % part_rows == 0, "value_rows must leave the producer whole parts");
  // With `Crossover` (8 rows a warp) every part of the next tile is loaded after the tile is
  // stored: one load wait per tile measured faster there (-3 to -6%), slower with 12 rows.
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
    std::uint32_t const peer_full  = Crossover ? peer_address(w.full_bar(t), rank ^ 1) : 0u;
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

/// Copies `rows` rows of `RowBytes` from the output tile staged in shared memory (`pitch`
/// bytes apart) to global memory (`dst_pitch` bytes apart) in `Chunk`-byte pieces, consecutive
/// pieces to consecutive consumer threads (`tid` < `consumers`): whole rows per instruction.
template <int Chunk, int RowBytes>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void store_rows(unsigned char* dst, std::int64_t dst_pitch,
                                                      unsigned char const* src, int pitch, int rows, int tid)
{
  static_assert(Chunk == 16 || Chunk == 4, "16- or 4-byte pieces");
  using piece              = std::conditional_t<Chunk == 16, uint4, std::uint32_t>;
  constexpr int per_row    = RowBytes / Chunk;
  for (int c = tid; c < rows * per_row; c += consumers) {
    int const r = c / per_row;
    int const k = c - r * per_row;
    *reinterpret_cast<piece*>(dst + r * dst_pitch + Chunk * k) = *reinterpret_cast<piece const*>(src + r * pitch + Chunk * k);
  }
}

/// A consumer thread is done with tile t's stage (with `Crossover` the peer's producer
/// writes into it too, so the warp also arrives on the peer's empty barrier once).
template <bool Crossover>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void release_stage(cta_work const& w, int t, int lane)
{
  mbarrier_arrive(w.empty_bar(t));
  if constexpr (Crossover) {
    __syncwarp();
    if (lane == 0) { mbarrier_arrive_remote(peer_address(w.empty_bar(t), cluster_rank() ^ 1)); }
  }
}

#endif  // __CUDACC__

}  // namespace dhisparse::sparse_attention::detail::mla

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail {

/**
 * @brief Sparse MLA attention: grid = batch x splits x num_queries x head tiles (head tile
 *        fastest, so the CTAs reading the same rows run side by side and share them in L2).
 * @tparam Fp8 rows in `mla_fp8_656` (true) or `mla_bf16_576` (false) format
 * @tparam Crossover two head tiles per (b, q), launched as clusters of two CTAs that each
 *         dequantize half of every tile into both CTAs' stages (FP8 rows only)
 */
template <bool Fp8, bool Crossover>
DHISPARSE_KERNEL void __launch_bounds__(mla::threads, 1) mla_attention_kernel(kernel_args const a)
{
  static_assert(Fp8 || !Crossover, "two-CTA clusters share dequantized FP8 rows only");
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  using layout = mla::smem_layout;
  constexpr int value_rows = mla::value_rows<Fp8, Crossover>;
  using budget           = mla::register_budget<Fp8, value_rows>;
  extern __shared__ __align__(1024) unsigned char smem_dynamic[];
  std::uint32_t const dyn_addr  = smem_address(smem_dynamic);
  std::uint32_t const smem_base = (dyn_addr + 1023u) & ~1023u;
  unsigned char* const smem     = smem_dynamic + (smem_base - dyn_addr);

  params const& p = a.p;
  int const tid   = int(threadIdx.x);
  int const lane  = tid & 31;
  int const warp  = (tid >> 5) & 3;  // warp within its warpgroup
  int const role  = tid / mla::warpgroup;

  block_coords const coords = decode_block(a);
  int const head_tile       = coords.unit;
  int const q               = coords.q;
  int const split           = coords.split;
  int const b               = coords.b;
  if (b >= real_batch(p)) { return; }

  mla::cta_work w;
  w.selection  = p.slots + std::int64_t(b) * p.slot_stride_batch + std::int64_t(q) * p.slot_stride_query;
  w.rows       = p.rows;
  w.row_stride = std::uint32_t(p.row_stride);
  w.num_slots  = p.num_slots;
  w.status     = p.status;
  w.top_k      = p.top_k;
  w.tile_begin = split * a.tiles_per_split;
  w.n_tiles    = min(a.tiles_per_split, a.num_tiles - w.tile_begin);
  w.smem_base  = smem_base;
  w.smem       = smem;
  bf16 const* query =
    p.queries + std::int64_t(b) * p.query_stride_batch + std::int64_t(q) * p.query_stride_query;

  if (tid == 0) {
    for (int t = 0; t < mla::stages; ++t) {
      // every producer thread, and every value thread where it dequantizes rows too
      mbarrier_init(w.full_bar(t), mla::warpgroup * (value_rows > 0 ? 2 : 1));
      // every consumer thread, and with Crossover one thread per consumer warp of the peer
      mbarrier_init(w.empty_bar(t), mla::consumers + (Crossover ? mla::consumers / 32 : 0));
    }
    if constexpr (Crossover) { fence_mbarrier_init_cluster(); }
  }
  // Queries of this head tile (heads beyond num_heads are zero), copied by every thread.
  std::uint32_t const q_addr = smem_base + layout::q;
  for (int i = tid; i < mla::tile_m * mla::row_chunks; i += mla::threads) {
    int const r   = i / mla::row_chunks;
    int const c   = i - r * mla::row_chunks;
    int const h   = head_tile * mla::tile_m + r;
    bool const ok = h < p.num_heads;
    bf16 const* src = ok ? query + std::int64_t(h) * p.query_stride_head + c * 8 : query;
    cp_async_16(q_addr + sw128_offset(r, c), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();  // Q and the mbarriers are ready
  if constexpr (Crossover) { cluster_sync(); }  // ... in both CTAs before either writes into the other

  if (role == 2) {
    set_max_registers<(budget::producer > budget::launch), budget::producer>();
    if constexpr (Fp8) {
      mla::produce_fp8<Crossover>(w, warp, lane);
    } else {
      mla::produce_bf16(w, warp, lane);
    }
    if constexpr (Crossover) { cluster_sync(); }  // no CTA leaves while the other may write into it
    return;
  }

  // Consumers. Thread (warp, lane) holds rows r0 and r0 + 8 of its accumulators.
  float* const alpha_smem = reinterpret_cast<float*>(smem + layout::alpha);
  float* const sum_smem   = reinterpret_cast<float*>(smem + layout::row_sum);
  std::uint32_t const p_addr = smem_base + layout::p;
  int const r0               = warp * 16 + (lane >> 2);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) { o[i] = 0.f; }
  std::uint32_t p_frag[16];
  float m_row[2] = {-INFINITY, -INFINITY};  // score warpgroup only (log2 domain)
  float l_row[2] = {0.f, 0.f};

  if (role == 0) {
    set_max_registers<(budget::score > budget::launch), budget::score>();
    // Validity of the tile's 64 columns: lane l reads entries l and 32 + l, one tile ahead.
    int entry_lo = w.entry(0, lane);
    int entry_hi = w.entry(0, 32 + lane);
    for (int t = 0; t < w.n_tiles; ++t) {
      std::uint32_t const valid_lo = __ballot_sync(0xFFFFFFFFu, w.valid(entry_lo, false) >= 0);
      std::uint32_t const valid_hi = __ballot_sync(0xFFFFFFFFu, w.valid(entry_hi, false) >= 0);
      entry_lo = w.entry(t + 1, lane);
      entry_hi = w.entry(t + 1, 32 + lane);
      mbarrier_wait(w.full_bar(t), mla::cta_work::phase(t));
      fence_proxy_async();
      std::uint32_t const kv_addr = w.stage_addr(t);
      float s[32];
      mla::score_product(s, q_addr, kv_addr, warp, lane);
      wgmma_wait<0>();
      fence_registers(s);

      // Scale into the log2 domain; empty entries (zero rows) get -inf. Element 4j + e of
      // s is row r0 (e < 2) or r0 + 8, column 8j + 2 (lane % 4) + e % 2.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        std::uint32_t const bits = (j < 4 ? valid_lo : valid_hi) >> (8 * (j & 3) + 2 * (lane & 3));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& x = s[4 * j + e];
          x        = (bits >> (e & 1)) & 1u ? x * a.scale_log2 : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      }
      float alpha[2];
      float m_use[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i]             = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
        mx[i]             = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
        float const m_new = next_running_max(m_row[i], mx[i]);
        m_use[i]          = m_new == -INFINITY ? 0.f : m_new;  // no valid entry yet: p = 0
        alpha[i]          = exp2_approx(m_row[i] - m_use[i]);
        m_row[i]          = m_new;
      }
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[4 * j + e] = exp2_approx(s[4 * j + e] - m_use[e >> 1]);
          sum[e >> 1] += s[4 * j + e];
        }
        // A fragment of k-step j / 2: registers (row r0, row r0 + 8) of columns
        // 16 (j / 2) + 8 (j % 2) + 2 (lane % 4).
        p_frag[4 * (j >> 1) + 2 * (j & 1)]     = pack_bf16x2(s[4 * j + 0], s[4 * j + 1]);
        p_frag[4 * (j >> 1) + 2 * (j & 1) + 1] = pack_bf16x2(s[4 * j + 2], s[4 * j + 3]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) { l_row[i] = l_row[i] * alpha[i] + sum[i]; }
      mla::rescale(o, alpha[0], alpha[1]);
      // Hand P and the rescale factors to the value warpgroup once it is done with the last ones.
      if (t > 0) { mla::consumer_sync(mla::barrier_p_free); }
      unsigned char* const p_smem = smem + layout::p;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int const r = r0 + 8 * h;
          *reinterpret_cast<std::uint32_t*>(p_smem + r * 128 + ((j ^ (r & 7)) << 4) + 4 * (lane & 3)) =
            p_frag[4 * (j >> 1) + 2 * (j & 1) + h];
        }
      }
      if ((lane & 3) == 0) {
        alpha_smem[r0]     = alpha[0];
        alpha_smem[r0 + 8] = alpha[1];
      }
      fence_proxy_async();  // P is read by the value warpgroup's wgmma (async proxy)
      mla::consumer_sync(mla::barrier_p_ready);
      mla::value_product<true>(o, p_frag, p_addr, kv_addr, 0, warp, lane);
      wgmma_wait<0>();
      fence_registers(o);
      mla::release_stage<Crossover>(w, t, lane);
    }
    // Row sums of the quad's columns; published for the value warpgroup.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_row[i] += __shfl_xor_sync(0xFFFFFFFFu, l_row[i], 1);
      l_row[i] += __shfl_xor_sync(0xFFFFFFFFu, l_row[i], 2);
    }
    if ((lane & 3) == 0) {
      sum_smem[r0]     = l_row[0];
      sum_smem[r0 + 8] = l_row[1];
    }
    mla::consumer_sync(mla::barrier_epilogue);
  } else {
    set_max_registers<(budget::value > budget::launch), budget::value>();
    [[maybe_unused]] mla::value_share<(value_rows > 0 ? value_rows / 4 : 1)> share;
    if constexpr (value_rows > 0) {
      share.begin(w, warp, lane);
      for (int t = 0; t < min(w.n_tiles, mla::stages); ++t) { share.fill(w, t, lane); }
    }
    for (int t = 0; t < w.n_tiles; ++t) {
      mla::consumer_sync(mla::barrier_p_ready);
      mbarrier_wait(w.full_bar(t), mla::cta_work::phase(t));  // complete already; orders the tile's writes
      fence_proxy_async();
      mla::rescale(o, alpha_smem[r0], alpha_smem[r0 + 8]);
      mla::value_product<false>(o, p_frag, p_addr, w.stage_addr(t), 32, warp, lane);
      wgmma_wait<0>();
      fence_registers(o);
      mla::release_stage<Crossover>(w, t, lane);  // before the hand-over below, which waits for the next S
      if constexpr (value_rows > 0) {
        // Tile t + 2 goes into the stage just released, while the score warpgroup computes S.
        if (t + mla::stages < w.n_tiles) { share.fill(w, t + mla::stages, lane); }
      }
      if (t + 1 < w.n_tiles) { mla::consumer_sync(mla::barrier_p_free); }
    }
    mla::consumer_sync(mla::barrier_epilogue);
    l_row[0] = sum_smem[r0];
    l_row[1] = sum_smem[r0 + 8];
  }

  // Epilogue: O / l goes through shared memory (the stages are free once both consumers are
  // past their last tile), so that the global stores are whole rows: 16 bytes per lane where
  // the output allows it. Warpgroup `role` holds output columns [256 role, 256 role + 256).
  bool const partial = a.num_splits > 1;  // fp32 partial results for the combine kernel
  int const pitch    = partial ? mla::o_pitch_partial : mla::o_pitch;
  std::int64_t const part =
    ((std::int64_t(b) * p.num_queries + q) * a.units_per_query + head_tile) * a.num_splits + split;
  unsigned char* const o_smem = smem + layout::kv;
  int const col = role * 256 + 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int const r       = r0 + 8 * i;
    float const l_tot = l_row[i];
    float const inv   = l_tot > 0.f ? 1.f / l_tot : 0.f;
    unsigned char* const dst = o_smem + r * pitch;
    if (partial) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + 4 * (col + 8 * j)) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<std::uint32_t*>(dst + 2 * (col + 8 * j)) =
          pack_bf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
    }
    if (role == 0 && (lane & 3) == 0) {
      float const lse = l_tot > 0.f ? (m_row[i] + log2f(l_tot)) * ln_2 : -INFINITY;
      int const h     = head_tile * mla::tile_m + r;
      if (partial) {
        a.partial_lse[part * mla::tile_m + r] = lse;
      } else if (h < p.num_heads && p.lse != nullptr) {
        p.lse[std::int64_t(b) * p.lse_stride_batch + std::int64_t(q) * p.lse_stride_query + h] = lse;
      }
    }
  }
  mla::consumer_sync(mla::barrier_output);
  if (partial) {
    mla::store_rows<16, mla::value_dim * 4>(reinterpret_cast<unsigned char*>(a.partial_out + part * mla::tile_m * mla::value_dim),
                                            mla::value_dim * 4, o_smem, pitch, mla::tile_m, tid);
  } else {
    int const rows = min(mla::tile_m, p.num_heads - head_tile * mla::tile_m);
    auto* const out = reinterpret_cast<unsigned char*>(p.out + std::int64_t(b) * p.out_stride_batch +
                                                       std::int64_t(q) * p.out_stride_query +
                                                       std::int64_t(head_tile) * mla::tile_m * p.out_stride_head);
    std::int64_t const out_pitch = p.out_stride_head * 2;
    if ((reinterpret_cast<std::uintptr_t>(out) | std::uintptr_t(out_pitch)) % 16 == 0) {
      mla::store_rows<16, mla::value_dim * 2>(out, out_pitch, o_smem, pitch, rows, tid);
    } else {
      mla::store_rows<4, mla::value_dim * 2>(out, out_pitch, o_smem, pitch, rows, tid);
    }
  }
  if constexpr (Crossover) { cluster_sync(); }
#else
  (void)a;
#endif
}

}  // namespace dhisparse::sparse_attention::detail

#endif  // __CUDACC__
