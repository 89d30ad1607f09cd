/**
 * @file detail/sparse_attention/mla_kernel.cuh
 * @brief Sparse MLA attention kernel (DeepSeek / GLM DSA): queries of 576 (512 latent +
 *        64 rope), one shared latent row per selected token, values = the 512 latent values.
 *
 * One CTA computes 64 query heads of one (b, q) over one split of its selection, 64
 * selected rows per tile, with warp-specialized roles:
 *
 * - producers (warps 8-11): gather the selected rows of upcoming tiles with 16-byte `cp.async`
 *   (zero fill for -1 / invalid entries) — straight into the 128-byte-swizzled operand tile
 *   (bf16 rows, two stages) or into a raw staging tile (FP8 rows) — and signals each tile's
 *   completion through an mbarrier (`cp.async.mbarrier.arrive`); they never block the
 *   consumers, whatever the memory system's queueing. On sm_90a the producer warpgroup
 *   hands its registers to the consumers (`setmaxnreg`: 40 vs 232 per thread);
 * - consumers (warps 0-7, two warpgroups): FP8 rows are first dequantized to bf16 with the
 *   per-128 tile scales; S = Q K^T: warpgroup g computes the 64 x 32 scores of tile columns
 *   [32g, 32g + 32) (36 `wgmma` m64n32k16 on sm_90a, `mma.sync` m16n8k16 otherwise), scaled
 *   into the log2 domain, masked to -inf for empty entries; online softmax with the row
 *   maxima of both halves exchanged through shared memory; P (bf16) to shared memory;
 *   O += P V: warpgroup g owns output columns [256g, 256g + 256) (128 fp32 accumulators a
 *   thread) and multiplies P (64 x 64) by the same tile read as V (MN-major operand).
 *
 * Shared memory (bf16 rows): Q 72 KiB + 2 x 72 KiB tiles + P 8 KiB + reductions = 226 KiB;
 * FP8 rows: Q + one bf16 tile + one raw 41 KiB tile + P = 195 KiB. One CTA per SM.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>
#include <dhisparse/detail/sparse_attention/params.hpp>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse::sparse_attention::detail::mla {

inline constexpr int tile_m         = 64;   ///< query heads per CTA
inline constexpr int consumers      = 256;  ///< two warpgroups
inline constexpr int producers      = 128;  ///< one warpgroup gathering rows
inline constexpr int threads        = consumers + producers;
inline constexpr int producer_registers = 40;   ///< setmaxnreg budgets (sm_90a)
inline constexpr int consumer_registers = 232;  ///< 256 x 232 + 128 x 40 <= 64 Ki
inline constexpr int consumer_barrier = 1;  ///< named barrier of the consumer warps
inline constexpr int dim            = 576;  ///< query / key width
inline constexpr int value_dim      = 512;  ///< value / output width
inline constexpr int row_chunks     = dim * 2 / 16;      ///< 16-byte chunks of a bf16 row (72)
inline constexpr int block_bytes    = tile_n * 128;      ///< 64 rows x 64 bf16 columns
inline constexpr int tile_bytes     = 9 * block_bytes;   ///< 64 rows x 576 bf16 (72 KiB)
inline constexpr int fp8_row_bytes  = 656;
inline constexpr int fp8_row_chunks = fp8_row_bytes / 16;  ///< 41
inline constexpr int p_bytes        = tile_m * tile_n * 2;

/// Byte offsets of the shared-memory regions (from a 1024-byte aligned base).
template <bool Fp8>
struct smem_layout {
  static constexpr int q   = 0;
  static constexpr int kv  = tile_bytes;                  ///< bf16: 2 stages; FP8: 1
  static constexpr int raw = Fp8 ? 2 * tile_bytes : 0;    ///< FP8 only: 64 raw rows
  static constexpr int p   = Fp8 ? (raw + tile_n * fp8_row_bytes + 1023) / 1024 * 1024
                                 : 3 * tile_bytes;
  static constexpr int red   = p + p_bytes;               ///< float max[2][64], sum[2][64]
  static constexpr int bars  = red + 4 * 64 * 4;          ///< mbarriers: full[2], empty[2]
  static constexpr int bytes = bars + 4 * 8;
  static constexpr int alloc = bytes + 1024;              ///< + slack to align the base
};
static_assert(smem_layout<false>::alloc <= 232448, "MLA bf16 tiles exceed 227 KiB");
static_assert(smem_layout<true>::alloc <= 232448, "MLA FP8 tiles exceed 227 KiB");

#if defined(__CUDACC__)

/// Two e4m3 values (low byte first) times `scale` → packed bf16x2.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t e4m3x2_to_bf16x2(std::uint32_t two, float scale)
{
  __half2_raw const raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu),
                                                     __NV_E4M3);
  float2 const f = __half22float2(__half2(raw));
  return pack_bf16x2(f.x * scale, f.y * scale);
}

/// S[64 x 32] = Q[64 x 576] K[32g .. 32g+32)^T for warpgroup `wg`; accumulator layout of
/// `wgmma` m64n32 (= four m16n8 tiles per warp, warp w owning rows 16w .. 16w + 16).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void qk_product(float (&s)[16], std::uint32_t q_addr,
                                                      std::uint32_t kv_addr, int wg, int warp, int lane)
{
#pragma unroll
  for (int i = 0; i < 16; ++i) { s[i] = 0.f; }
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  (void)warp;
  (void)lane;
  std::uint32_t const b_addr = kv_addr + std::uint32_t(wg) * 32 * 128;
  fence_registers(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < dim / 16; ++kk) {
    std::uint32_t const k_off = std::uint32_t((kk >> 2) * block_bytes + (kk & 3) * 32);
    wgmma_m64n32k16_ss(s, sw128_descriptor(q_addr + k_off, 16, 1024),
                       sw128_descriptor(b_addr + k_off, 16, 1024), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(s);
#else
  int const a_row  = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  int const b_row  = wg * 32 + (lane & 7) + (lane >> 4) * 8;
  int const a_half = lane >> 4;
  int const b_half = (lane >> 3) & 1;
#pragma unroll 4
  for (int kk = 0; kk < dim / 16; ++kk) {
    std::uint32_t a[4];
    ldmatrix_x4<false>(a, q_addr + sw128_offset(a_row, 2 * kk + a_half));
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      std::uint32_t b[4];
      ldmatrix_x4<false>(b, kv_addr + sw128_offset(b_row + 16 * jj, 2 * kk + b_half));
      mma_bf16_16816(&s[8 * jj], a, b[0], b[1]);
      mma_bf16_16816(&s[8 * jj + 4], a, b[2], b[3]);
    }
  }
#endif
}

/// O[64 x 256g .. 256g+256) += P[64 x 64] V[64 x 256g .. 256g+256) for warpgroup `wg`;
/// V is the tile's first 512 columns read MN-major.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void pv_product(float (&o)[128], std::uint32_t p_addr,
                                                      std::uint32_t kv_addr, int wg, int warp, int lane)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_WGMMA)
  (void)warp;
  (void)lane;
  std::uint32_t const v_addr = kv_addr + std::uint32_t(wg) * 4 * block_bytes;
  fence_registers(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < tile_n / 16; ++kk) {
    wgmma_m64n256k16_ss_bt(o, sw128_descriptor(p_addr + kk * 32, 16, 1024),
                           sw128_descriptor(v_addr + kk * 16 * 128, block_bytes, 1024), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(o);
#else
  int const a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  int const v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < tile_n / 16; ++kk) {
    std::uint32_t a[4];
    ldmatrix_x4<false>(a, p_addr + sw128_offset(a_row, 2 * kk + (lane >> 4)));
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      std::uint32_t b[4];
      ldmatrix_x4<true>(b, kv_addr + sw128_offset(16 * kk + v_row, wg * 32 + 2 * jj + (lane >> 4)));
      mma_bf16_16816(&o[8 * jj], a, b[0], b[1]);
      mma_bf16_16816(&o[8 * jj + 4], a, b[2], b[3]);
    }
  }
#endif
}

/// Barrier among the two consumer warpgroups (the producer warp never joins it).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void consumer_sync()
{
  named_barrier_sync(consumer_barrier, consumers);
}

/// Online softmax and both products for one tile already in shared memory at `kv_addr`;
/// bit c of `valid` tells whether column 32 * wg + c of the tile holds a selected row.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void attend_tile(std::uint32_t q_addr, std::uint32_t kv_addr,
                                                       std::uint32_t p_addr, unsigned char* p_smem,
                                                       std::uint32_t valid, float* red_max,
                                                       float scale_log2, float (&o)[128],
                                                       float (&m_row)[2], float (&l_row)[2], int wg,
                                                       int warp, int lane)
{
  float s[16];
  qk_product(s, q_addr, kv_addr, wg, warp, lane);

  // Scale into the log2 domain; empty entries (zero-filled rows) get -inf.
  int const col0 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    bool const v0 = (valid >> (col0 + 8 * j)) & 1u;
    bool const v1 = (valid >> (col0 + 8 * j + 1)) & 1u;
    s[4 * j + 0]  = v0 ? s[4 * j + 0] * scale_log2 : -INFINITY;
    s[4 * j + 1]  = v1 ? s[4 * j + 1] * scale_log2 : -INFINITY;
    s[4 * j + 2]  = v0 ? s[4 * j + 2] * scale_log2 : -INFINITY;
    s[4 * j + 3]  = v1 ? s[4 * j + 3] * scale_log2 : -INFINITY;
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j + 0], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
  }
  int const r0 = warp * 16 + (lane >> 2);
  if ((lane & 3) == 0) {
    red_max[wg * 64 + r0]     = mx[0];
    red_max[wg * 64 + r0 + 8] = mx[1];
  }
  consumer_sync();
  float m_use[2], alpha[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float const other = red_max[(wg ^ 1) * 64 + r0 + 8 * i];
    float const m_new = fmaxf(m_row[i], fmaxf(mx[i], other));
    m_use[i]          = m_new == -INFINITY ? 0.f : m_new;  // no valid entry yet: p = 0
    alpha[i]          = exp2f(m_row[i] - m_use[i]);
    m_row[i]          = m_new;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s[4 * j + 0] = exp2f(s[4 * j + 0] - m_use[0]);
    s[4 * j + 1] = exp2f(s[4 * j + 1] - m_use[0]);
    s[4 * j + 2] = exp2f(s[4 * j + 2] - m_use[1]);
    s[4 * j + 3] = exp2f(s[4 * j + 3] - m_use[1]);
    sum[0] += s[4 * j + 0] + s[4 * j + 1];
    sum[1] += s[4 * j + 2] + s[4 * j + 3];
  }
  l_row[0] = l_row[0] * alpha[0] + sum[0];
  l_row[1] = l_row[1] * alpha[1] + sum[1];
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
  // P (bf16) → shared memory, 64 rows x 64 columns, 128-byte swizzle (K-major A operand).
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int const chunk         = wg * 4 + j;
    std::uint32_t const off = std::uint32_t(((chunk ^ (r0 & 7)) << 4) + 4 * (lane & 3));
    *reinterpret_cast<std::uint32_t*>(p_smem + r0 * 128 + off) =
      pack_bf16x2(s[4 * j + 0], s[4 * j + 1]);
    *reinterpret_cast<std::uint32_t*>(p_smem + (r0 + 8) * 128 + off) =
      pack_bf16x2(s[4 * j + 2], s[4 * j + 3]);
  }
  fence_proxy_async();
  consumer_sync();
  pv_product(o, p_addr, kv_addr, wg, warp, lane);
}

#endif  // __CUDACC__

}  // namespace dhisparse::sparse_attention::detail::mla

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail {

/**
 * @brief Sparse MLA attention: grid = batch x splits x num_queries x head tiles (head tile
 *        fastest, so the CTAs reading the same rows run side by side and share them in L2).
 * @tparam Fp8 rows in `mla_fp8_656` (true) or `mla_bf16_576` (false) format
 */
template <bool Fp8>
DHISPARSE_KERNEL void __launch_bounds__(mla::threads, 1) mla_attention_kernel(kernel_args const a)
{
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  using layout = mla::smem_layout<Fp8>;
  extern __shared__ __align__(1024) unsigned char smem_dynamic[];
  std::uint32_t const dyn_addr  = smem_address(smem_dynamic);
  std::uint32_t const smem_base = (dyn_addr + 1023u) & ~1023u;
  unsigned char* const smem     = smem_dynamic + (smem_base - dyn_addr);

  params const& p = a.p;
  int const tid   = int(threadIdx.x);
  int const lane  = tid & 31;
  int const warp  = (tid >> 5) & 3;
  int const wg    = tid >> 7;

  block_coords const coords = decode_block(a);
  int const head_tile       = coords.unit;
  int const q               = coords.q;
  int const split           = coords.split;
  int const b               = coords.b;
  if (b >= real_batch(p)) { return; }

  int const tile_begin = split * a.tiles_per_split;
  int const n_tiles    = min(a.tiles_per_split, a.num_tiles - tile_begin);
  std::int32_t const* selection =
    p.slots + std::int64_t(b) * p.slot_stride_batch + std::int64_t(q) * p.slot_stride_query;
  bf16 const* query =
    p.queries + std::int64_t(b) * p.query_stride_batch + std::int64_t(q) * p.query_stride_query;

  float* const red_max = reinterpret_cast<float*>(smem + layout::red);  // [2][64]
  float* const red_sum = red_max + 128;                                 // [2][64]
  std::uint32_t const q_addr    = smem_base + layout::q;
  std::uint32_t const kv_addr   = smem_base + layout::kv;
  std::uint32_t const p_addr    = smem_base + layout::p;
  std::uint32_t const full_bar  = smem_base + layout::bars;       // + 8 * stage
  std::uint32_t const empty_bar = smem_base + layout::bars + 16;  // + 8 * stage
  constexpr int stages          = Fp8 ? 1 : 2;

  if (tid == 0) {
    for (int st = 0; st < stages; ++st) {
      mbarrier_init(full_bar + 8 * st, mla::producers);   // every producer thread (cp.async)
      mbarrier_init(empty_bar + 8 * st, mla::consumers);  // every consumer thread
    }
  }
  // Queries of this head tile (heads beyond num_heads are zero), copied by every thread.
  for (int i = tid; i < mla::tile_m * mla::row_chunks; i += mla::threads) {
    int const r  = i / mla::row_chunks;
    int const c  = i - r * mla::row_chunks;
    int const h  = head_tile * mla::tile_m + r;
    bool const ok = h < p.num_heads;
    bf16 const* src = ok ? query + std::int64_t(h) * p.query_stride_head + c * 8 : query;
    cp_async_16(q_addr + sw128_offset(r, c), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();  // Q and the mbarriers are ready

  if (tid >= mla::consumers) {
    // Producers: warp w gathers rows [16w, 16w + 16) of a tile, lane l its 16-byte chunks
    // l, l + 32, l + 64 (512 contiguous bytes of one row per warp instruction).
    set_max_registers<false, mla::producer_registers>();
    int const row0 = ((tid - mla::consumers) >> 5) * 16;
    for (int t = 0; t < n_tiles; ++t) {
      int const st = Fp8 ? 0 : (t & 1);
      if (t >= stages) { mbarrier_wait(empty_bar + 8 * st, std::uint32_t((t / stages - 1) & 1)); }
      int const my_slot =
        lane < 16 ? load_slot(p, selection, (tile_begin + t) * tile_n + row0 + lane, true) : -1;
      std::uint32_t const dst =
        Fp8 ? smem_base + layout::raw : kv_addr + std::uint32_t(st) * mla::tile_bytes;
#pragma unroll 4
      for (int i = 0; i < 16; ++i) {
        int const r          = row0 + i;
        int const slot       = __shfl_sync(0xFFFFFFFFu, my_slot, i);
        bool const ok        = slot >= 0;
        std::byte const* src = p.rows + (ok ? std::size_t(slot) * p.row_stride : 0);
        if constexpr (!Fp8) {
#pragma unroll
          for (int j = 0; j < 3; ++j) {
            int const c = lane + 32 * j;
            if (c < mla::row_chunks) { cp_async_16(dst + sw128_offset(r, c), src + 16 * c, ok); }
          }
        } else {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            int const c = lane + 32 * j;
            if (c < mla::fp8_row_chunks) {
              cp_async_16(dst + std::uint32_t(r * mla::fp8_row_bytes + 16 * c), src + 16 * c, ok);
            }
          }
        }
      }
      cp_async_mbarrier_arrive(full_bar + 8 * st);
    }
    cp_async_wait<0>();
    return;
  }
  set_max_registers<true, mla::consumer_registers>();

  // Consumers. Validity of this warpgroup's 32 columns of a tile: one slot id per lane,
  // read one tile ahead.
  auto column_slot = [&](int t) {
    return load_slot(p, selection, (tile_begin + t) * tile_n + wg * 32 + lane, false);
  };
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) { o[i] = 0.f; }
  float m_row[2] = {-INFINITY, -INFINITY};
  float l_row[2] = {0.f, 0.f};
  int slot_next  = n_tiles > 0 ? column_slot(0) : -1;

  for (int t = 0; t < n_tiles; ++t) {
    std::uint32_t const valid = __ballot_sync(0xFFFFFFFFu, slot_next >= 0);
    if (t + 1 < n_tiles) { slot_next = column_slot(t + 1); }
    if constexpr (!Fp8) {
      int const st = t & 1;
      mbarrier_wait(full_bar + 8 * st, std::uint32_t((t >> 1) & 1));
      fence_proxy_async();  // the producer's cp.async writes, read by wgmma (async proxy)
      mla::attend_tile(q_addr, kv_addr + st * mla::tile_bytes, p_addr, smem + layout::p, valid,
                       red_max, a.scale_log2, o, m_row, l_row, wg, warp, lane);
      mbarrier_arrive(empty_bar + 8 * st);  // this thread's reads of the stage are complete
    } else {
      unsigned char const* raw = smem + layout::raw;
      mbarrier_wait(full_bar, std::uint32_t(t & 1));
      mla::consumer_sync();  // every consumer is done with the bf16 tile t - 1
      // Dequantize: 64 rows x 64 units of 8 latent values, then copy the bf16 rope part.
#pragma unroll 4
      for (int j = 0; j < tile_n * 64 / mla::consumers; ++j) {
        int const i  = tid + mla::consumers * j;
        int const r  = i >> 6;
        int const u  = i & 63;
        unsigned char const* row = raw + r * mla::fp8_row_bytes;
        uint2 const v  = *reinterpret_cast<uint2 const*>(row + 8 * u);
        float const sc = *reinterpret_cast<float const*>(row + 512 + 4 * (u >> 4));
        uint4 w;
        w.x = mla::e4m3x2_to_bf16x2(v.x, sc);
        w.y = mla::e4m3x2_to_bf16x2(v.x >> 16, sc);
        w.z = mla::e4m3x2_to_bf16x2(v.y, sc);
        w.w = mla::e4m3x2_to_bf16x2(v.y >> 16, sc);
        *reinterpret_cast<uint4*>(smem + layout::kv + sw128_offset(r, u)) = w;
      }
      for (int i = tid; i < tile_n * 8; i += mla::consumers) {
        int const r = i >> 3;
        int const c = i & 7;
        *reinterpret_cast<uint4*>(smem + layout::kv + sw128_offset(r, 64 + c)) =
          *reinterpret_cast<uint4 const*>(raw + r * mla::fp8_row_bytes + 528 + 16 * c);
      }
      mbarrier_arrive(empty_bar);  // the raw tile may be refilled
      fence_proxy_async();
      mla::consumer_sync();  // the bf16 tile t is complete
      mla::attend_tile(q_addr, kv_addr, p_addr, smem + layout::p, valid, red_max, a.scale_log2, o,
                       m_row, l_row, wg, warp, lane);
    }
  }

  // Row sums: the quad's columns, then both warpgroups (same order in both: deterministic).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_row[i] += __shfl_xor_sync(0xFFFFFFFFu, l_row[i], 1);
    l_row[i] += __shfl_xor_sync(0xFFFFFFFFu, l_row[i], 2);
  }
  int const r0 = warp * 16 + (lane >> 2);
  if ((lane & 3) == 0) {
    red_sum[wg * 64 + r0]     = l_row[0];
    red_sum[wg * 64 + r0 + 8] = l_row[1];
  }
  mla::consumer_sync();

  int const col = wg * 256 + 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int const r       = r0 + 8 * i;
    float const l_tot = red_sum[r] + red_sum[64 + r];
    float const inv   = l_tot > 0.f ? 1.f / l_tot : 0.f;
    float const lse   = l_tot > 0.f ? (m_row[i] + log2f(l_tot)) * ln_2 : -INFINITY;
    if (a.num_splits == 1) {
      int const h = head_tile * mla::tile_m + r;
      if (h < p.num_heads) {
        bf16* out = p.out + std::int64_t(b) * p.out_stride_batch + std::int64_t(q) * p.out_stride_query +
                    std::int64_t(h) * p.out_stride_head + col;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<std::uint32_t*>(out + 8 * j) =
            pack_bf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
        if (wg == 0 && (lane & 3) == 0 && p.lse != nullptr) {
          p.lse[std::int64_t(b) * p.lse_stride_batch + std::int64_t(q) * p.lse_stride_query + h] = lse;
        }
      }
    } else {
      std::int64_t const part =
        ((std::int64_t(b) * p.num_queries + q) * a.units_per_query + head_tile) * a.num_splits + split;
      float* out = a.partial_out + (part * mla::tile_m + r) * mla::value_dim + col;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(out + 8 * j) =
          make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
      if (wg == 0 && (lane & 3) == 0) { a.partial_lse[part * mla::tile_m + r] = lse; }
    }
  }
#else
  (void)a;
#endif
}

}  // namespace dhisparse::sparse_attention::detail

#endif  // __CUDACC__
