/**
 * @file detail/sparse_attention/mha_kernel.cuh
 * @brief Sparse MHA / GQA attention kernel: K and V rows of `kv_heads` heads of 128 bf16,
 *        every query head attends with the KV head of its group.
 *
 * One CTA (4 warps) computes 16 query heads of one KV head (one "m tile" of its group) for
 * one (b, q) over one split of the selection. Per tile of 64 selected slots, the KV head's
 * K and V chunks (256 + 256 bytes per slot) are gathered with 16-byte `cp.async` into a
 * three-stage pipeline (two tiles in flight); warp w owns the 16 slots [16w, 16w + 16) of
 * every tile with its own online softmax state (`mma.sync` m16n8k16: Q fragments stay in
 * registers, P goes from the S accumulators straight into the A operand of P·V). The four
 * warps are merged at the end in a fixed order. The kernel is HBM-bound (a row is used by
 * `group` heads only), so `mma.sync` is enough here.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>
#include <dhisparse/sparse_attention_params.hpp>

#include <cstddef>
#include <cstdint>

namespace dhisparse::sparse_attention::detail::mha {

inline constexpr int threads     = 128;
inline constexpr int warps       = threads / 32;
inline constexpr int tile_m      = 16;   ///< query heads per CTA
inline constexpr int head_dim    = 128;
inline constexpr int stages      = 3;
inline constexpr int head_bytes  = head_dim * 2;              ///< K (or V) of one head and slot
inline constexpr int part_bytes  = tile_n * head_bytes;       ///< K (or V) of one tile: 16 KiB
inline constexpr int stage_bytes = 2 * part_bytes;            ///< K then V: 32 KiB
inline constexpr int valid_off   = stages * stage_bytes;      ///< int [stages][64]
inline constexpr int smem_bytes  = valid_off + stages * tile_n * 4;
inline constexpr int merge_pitch = head_dim + 8;              ///< floats per row when merging
static_assert(warps * tile_m * merge_pitch * 4 + 2 * warps * tile_m * 4 <= valid_off,
              "merge buffers must fit in the pipeline stages");

#if defined(__CUDACC__)
/// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` in a [64][256 B] part,
/// XOR-swizzled by `row % 8` (conflict-free `ldmatrix`).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint32_t sw256_offset(int row, int chunk)
{
  return std::uint32_t(row * head_bytes + ((chunk ^ (row & 7)) << 4));
}
#endif

}  // namespace dhisparse::sparse_attention::detail::mha

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail {

/**
 * @brief Sparse MHA / GQA attention: grid = batch x splits x num_queries x kv_heads x
 *        m_tiles (m tile fastest).
 * @tparam HeadDim elements per head (128)
 * @param k_offset byte offset of head 0's K in a row; head h's K at + h * 256
 * @param v_offset byte offset of head 0's V in a row
 */
template <int HeadDim>
DHISPARSE_KERNEL void __launch_bounds__(mha::threads) mha_attention_kernel(kernel_args const a,
                                                                         std::size_t k_offset,
                                                                         std::size_t v_offset)
{
  static_assert(HeadDim == mha::head_dim, "mha_attention_kernel: only head_dim 128 is built");
#if defined(DHISPARSE_SPARSE_ATTENTION_DEVICE_OK)
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint32_t const smem_base = smem_address(smem);
  params const& p = a.p;
  int const tid   = int(threadIdx.x);
  int const lane  = tid & 31;
  int const warp  = tid >> 5;

  block_coords const coords = decode_block(a);
  int const unit            = coords.unit;
  int const q               = coords.q;
  int const split           = coords.split;
  int const b               = coords.b;
  if (b >= real_batch(p)) { return; }
  int const kv_head   = unit / a.m_tiles;
  int const m_tile    = unit - kv_head * a.m_tiles;
  int const rows_here = min(mha::tile_m, a.group - m_tile * mha::tile_m);
  int const head0     = kv_head * a.group + m_tile * mha::tile_m;  // query head of row 0

  int const tile_begin = split * a.tiles_per_split;
  int const n_tiles    = min(a.tiles_per_split, a.num_tiles - tile_begin);
  std::int32_t const* selection =
    p.slots + std::int64_t(b) * p.slot_stride_batch + std::int64_t(q) * p.slot_stride_query;
  bf16 const* query =
    p.queries + std::int64_t(b) * p.query_stride_batch + std::int64_t(q) * p.query_stride_query;
  int* const valid = reinterpret_cast<int*>(smem + mha::valid_off);

  // Gather of one tile: 2 threads per slot, 8 K chunks and 8 V chunks each.
  int const load_row = tid >> 1;
  int const load_sub = tid & 1;
  std::size_t const k_head = k_offset + std::size_t(kv_head) * mha::head_bytes;
  std::size_t const v_head = v_offset + std::size_t(kv_head) * mha::head_bytes;
  auto issue_tile = [&](int t) {
    int const stage = t % mha::stages;
    int const slot  = load_slot(p, selection, (tile_begin + t) * tile_n + load_row, load_sub == 0);
    bool const ok   = slot >= 0;
    if (load_sub == 0) { valid[stage * tile_n + load_row] = ok ? 1 : 0; }
    std::byte const* src     = p.rows + (ok ? std::size_t(slot) * p.row_stride : 0);
    std::uint32_t const kdst = smem_base + stage * mha::stage_bytes;
    std::uint32_t const vdst = kdst + mha::part_bytes;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int const c = load_sub + 2 * j;
      cp_async_16(kdst + mha::sw256_offset(load_row, c), src + k_head + 16 * c, ok);
      cp_async_16(vdst + mha::sw256_offset(load_row, c), src + v_head + 16 * c, ok);
    }
  };

  if (n_tiles > 0) { issue_tile(0); }
  cp_async_commit();
  if (n_tiles > 1) { issue_tile(1); }
  cp_async_commit();

  // Q fragments (A operand of m16n8k16, rows = the 16 heads of this tile) from global.
  std::uint32_t qa[mha::head_dim / 16][4];
  {
    int const r0 = lane >> 2;
    int const c0 = 2 * (lane & 3);
    bf16 const* q0 = query + std::int64_t(head0 + r0) * p.query_stride_head;
    bf16 const* q1 = query + std::int64_t(head0 + r0 + 8) * p.query_stride_head;
    bool const ok0 = r0 < rows_here;
    bool const ok1 = r0 + 8 < rows_here;
#pragma unroll
    for (int kk = 0; kk < mha::head_dim / 16; ++kk) {
      qa[kk][0] = ok0 ? *reinterpret_cast<std::uint32_t const*>(q0 + 16 * kk + c0) : 0u;
      qa[kk][1] = ok1 ? *reinterpret_cast<std::uint32_t const*>(q1 + 16 * kk + c0) : 0u;
      qa[kk][2] = ok0 ? *reinterpret_cast<std::uint32_t const*>(q0 + 16 * kk + 8 + c0) : 0u;
      qa[kk][3] = ok1 ? *reinterpret_cast<std::uint32_t const*>(q1 + 16 * kk + 8 + c0) : 0u;
    }
  }

  float o[mha::head_dim / 2];
#pragma unroll
  for (int i = 0; i < mha::head_dim / 2; ++i) { o[i] = 0.f; }
  float m_row[2] = {-INFINITY, -INFINITY};
  float l_row[2] = {0.f, 0.f};
  int const k_row  = warp * 16 + (lane & 7) + (lane >> 4) * 8;        // ldmatrix rows of K
  int const v_row  = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix rows of V
  int const col0   = warp * 16 + 2 * (lane & 3);

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<1>();
    __syncthreads();  // tile t visible; every thread is done with tile t - 1
    if (t + 2 < n_tiles) { issue_tile(t + 2); }
    cp_async_commit();

    int const stage          = t % mha::stages;
    std::uint32_t const kbuf = smem_base + stage * mha::stage_bytes;
    std::uint32_t const vbuf = kbuf + mha::part_bytes;
    int const* vld           = valid + stage * tile_n;

    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < mha::head_dim / 16; ++kk) {
      std::uint32_t kb[4];
      ldmatrix_x4<false>(kb, kbuf + mha::sw256_offset(k_row, 2 * kk + ((lane >> 3) & 1)));
      mma_bf16_16816(&s[0], qa[kk], kb[0], kb[1]);
      mma_bf16_16816(&s[4], qa[kk], kb[2], kb[3]);
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      bool const v0 = vld[col0 + 8 * j] != 0;
      bool const v1 = vld[col0 + 8 * j + 1] != 0;
      s[4 * j + 0]  = v0 ? s[4 * j + 0] * a.scale_log2 : -INFINITY;
      s[4 * j + 1]  = v1 ? s[4 * j + 1] * a.scale_log2 : -INFINITY;
      s[4 * j + 2]  = v0 ? s[4 * j + 2] * a.scale_log2 : -INFINITY;
      s[4 * j + 3]  = v1 ? s[4 * j + 3] * a.scale_log2 : -INFINITY;
      mx[0]         = fmaxf(mx[0], fmaxf(s[4 * j + 0], s[4 * j + 1]));
      mx[1]         = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    float m_use[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i]             = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
      mx[i]             = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
      float const m_new = next_running_max(m_row[i], mx[i]);
      m_use[i]          = m_new == -INFINITY ? 0.f : m_new;
      alpha[i]          = exp2_approx(m_row[i] - m_use[i]);
      m_row[i]          = m_new;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[4 * j + 0] = exp2_approx(s[4 * j + 0] - m_use[0]);
      s[4 * j + 1] = exp2_approx(s[4 * j + 1] - m_use[0]);
      s[4 * j + 2] = exp2_approx(s[4 * j + 2] - m_use[1]);
      s[4 * j + 3] = exp2_approx(s[4 * j + 3] - m_use[1]);
    }
    l_row[0] = l_row[0] * alpha[0] + ((s[0] + s[1]) + (s[4] + s[5]));
    l_row[1] = l_row[1] * alpha[1] + ((s[2] + s[3]) + (s[6] + s[7]));
#pragma unroll
    for (int j = 0; j < mha::head_dim / 8; ++j) {
      o[4 * j + 0] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    std::uint32_t const pa[4] = {pack_bf16x2(s[0], s[1]), pack_bf16x2(s[2], s[3]),
                                 pack_bf16x2(s[4], s[5]), pack_bf16x2(s[6], s[7])};
#pragma unroll
    for (int jj = 0; jj < mha::head_dim / 16; ++jj) {
      std::uint32_t vb[4];
      ldmatrix_x4<true>(vb, vbuf + mha::sw256_offset(v_row, 2 * jj + (lane >> 4)));
      mma_bf16_16816(&o[8 * jj], pa, vb[0], vb[1]);
      mma_bf16_16816(&o[8 * jj + 4], pa, vb[2], vb[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are reused for merging the warps

  // Merge the four warps (each saw a quarter of every tile) in warp order.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_row[i] += __shfl_xor_sync(0xFFFFFFFFu, l_row[i], 1);
    l_row[i] += __shfl_xor_sync(0xFFFFFFFFu, l_row[i], 2);
  }
  float* const merge_o = reinterpret_cast<float*>(smem);  // [warps][16][merge_pitch]
  float* const merge_m = merge_o + mha::warps * mha::tile_m * mha::merge_pitch;  // [warps][16]
  float* const merge_l = merge_m + mha::warps * mha::tile_m;                     // [warps][16]
  {
    int const r0 = lane >> 2;
    float* const mo = merge_o + warp * mha::tile_m * mha::merge_pitch;
#pragma unroll
    for (int j = 0; j < mha::head_dim / 8; ++j) {
      int const c = 8 * j + 2 * (lane & 3);
      *reinterpret_cast<float2*>(mo + r0 * mha::merge_pitch + c)       = make_float2(o[4 * j], o[4 * j + 1]);
      *reinterpret_cast<float2*>(mo + (r0 + 8) * mha::merge_pitch + c) = make_float2(o[4 * j + 2], o[4 * j + 3]);
    }
    if ((lane & 3) == 0) {
      merge_m[warp * mha::tile_m + r0]     = m_row[0];
      merge_m[warp * mha::tile_m + r0 + 8] = m_row[1];
      merge_l[warp * mha::tile_m + r0]     = l_row[0];
      merge_l[warp * mha::tile_m + r0 + 8] = l_row[1];
    }
  }
  __syncthreads();

  int const r  = tid >> 3;       // 16 rows x 8 threads
  int const d0 = (tid & 7) * 16;  // 16 output columns each
  float m_max  = -INFINITY;
#pragma unroll
  for (int w = 0; w < mha::warps; ++w) { m_max = fmaxf(m_max, merge_m[w * mha::tile_m + r]); }
  float const m_use = m_max == -INFINITY ? 0.f : m_max;
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) { acc[i] = 0.f; }
  float l_tot = 0.f;
#pragma unroll
  for (int w = 0; w < mha::warps; ++w) {
    float const f = exp2_approx(merge_m[w * mha::tile_m + r] - m_use);
    l_tot += f * merge_l[w * mha::tile_m + r];
    float const* src = merge_o + (w * mha::tile_m + r) * mha::merge_pitch + d0;
#pragma unroll
    for (int i = 0; i < 16; ++i) { acc[i] += f * src[i]; }
  }
  float const inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
  float const lse = l_tot > 0.f ? (m_max + log2f(l_tot)) * ln_2 : -INFINITY;
  if (r >= rows_here) { return; }
  if (a.num_splits == 1) {
    int const h = head0 + r;
    bf16* out = p.out + std::int64_t(b) * p.out_stride_batch + std::int64_t(q) * p.out_stride_query +
                std::int64_t(h) * p.out_stride_head + d0;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      *reinterpret_cast<std::uint32_t*>(out + i) = pack_bf16x2(acc[i] * inv, acc[i + 1] * inv);
    }
    if ((tid & 7) == 0 && p.lse != nullptr) {
      p.lse[std::int64_t(b) * p.lse_stride_batch + std::int64_t(q) * p.lse_stride_query + h] = lse;
    }
  } else {
    std::int64_t const part =
      ((std::int64_t(b) * p.num_queries + q) * a.units_per_query + unit) * a.num_splits + split;
    float* out = a.partial_out + (part * mha::tile_m + r) * mha::head_dim + d0;
#pragma unroll
    for (int i = 0; i < 16; i += 4) {
      *reinterpret_cast<float4*>(out + i) =
        make_float4(acc[i] * inv, acc[i + 1] * inv, acc[i + 2] * inv, acc[i + 3] * inv);
    }
    if ((tid & 7) == 0) { a.partial_lse[part * mha::tile_m + r] = lse; }
  }
#else
  (void)a;
  (void)k_offset;
  (void)v_offset;
#endif
}

}  // namespace dhisparse::sparse_attention::detail

#endif  // __CUDACC__
