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
 *
 * This file holds the kernel entry: setup, the score and value warpgroups' tile loops and
 * the epilogue. The parts it calls: `mla_layout.cuh` (tile shape, register budgets,
 * shared-memory layout, `cta_work`), `mla_producer.cuh` (the producer role),
 * `mla_fp8_rows.cuh` (FP8 dequantization, also the value warpgroup's share),
 * `mla_products.cuh` (the tile products) and `mla_consumer.cuh` (hand-overs between the
 * consumers, stage release, output store). Tuning history: docs/sparse_attention.md.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/cluster.cuh>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mla_consumer.cuh>
#include <dhisparse/detail/sparse_attention/mla_fp8_rows.cuh>
#include <dhisparse/detail/sparse_attention/mla_layout.cuh>
#include <dhisparse/detail/sparse_attention/mla_producer.cuh>
#include <dhisparse/detail/sparse_attention/mla_products.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>
#include <dhisparse/sparse_attention_params.hpp>

#include <cstdint>

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

