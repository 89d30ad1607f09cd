/**
 * @file detail/sparse_attention/mla_products.cuh
 * @brief The MLA consumers' tile products on one warpgroup — S = Q Kᵀ and O += P V — with
 *        `wgmma` (sm_90a) or `mma.sync` m16n8k16 + `ldmatrix` elsewhere (same accumulator
 *        and A-fragment layouts), and the online-softmax rescale of the accumulators.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/sparse_attention/kernel_common.cuh>
#include <dhisparse/detail/sparse_attention/mla_layout.cuh>
#include <dhisparse/detail/sparse_attention/mma.cuh>

#include <cstdint>

#if defined(__CUDACC__)

namespace dhisparse::sparse_attention::detail::mla {

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

}  // namespace dhisparse::sparse_attention::detail::mla

#endif  // __CUDACC__
