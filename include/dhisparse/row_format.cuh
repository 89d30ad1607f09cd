/**
 * @file row_format.cuh
 * @brief Row formats: the fixed byte layout of one token's KV for one layer.
 *
 * A row format is a small traits struct. Every part of the library that moves rows
 * (host store, device pool, retrieval, backup) only needs `bytes`; kernels that interpret
 * rows (attention, dequantization) use the layout constants. The header is plain C++ so
 * the host reference backend shares it.
 *
 * Contract of a row format `F` (checked by `dhisparse::is_row_format_v<F>`):
 * - `static constexpr std::size_t bytes`: size of one row, a non-zero multiple of 16
 *   (every copy is done in 16-byte vectors; a row that breaks this fails to compile);
 * - `static constexpr const char* name`: printed by benchmarks and error messages.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dhisparse {

/// Storage of one bfloat16 value (bit pattern); convert with `host::bf16_to_float` or
/// reinterpret as `__nv_bfloat16` in device code.
struct bf16 {
  std::uint16_t bits;
};

/// Storage of one FP8 E4M3 (`e4m3fn`, as produced by `__nv_cvt_float_to_fp8`) value.
struct fp8_e4m3 {
  std::uint8_t bits;
};

/// Every row (and every row group) is copied with 16-byte vectors: rows must be a
/// multiple of this many bytes and every base address must be aligned to it.
inline constexpr std::size_t row_alignment = 16;

namespace row_format {

/**
 * @brief DeepSeek-V3.2 / GLM-5 FP8 MLA row, 656 bytes (the FlashMLA "FP8 KV" layout).
 *
 * | bytes     | content                                              |
 * |-----------|------------------------------------------------------|
 * | [0, 512)  | 512 e4m3 values of the latent ("nope") part          |
 * | [512,528) | 4 fp32 scales, one per tile of 128 latent values     |
 * | [528,656) | 64 bf16 values of the rotary ("rope") part            |
 *
 * Dequantized value i < 512 is `e4m3[i] * scale[i / 128]`; value 512 + j is `rope[j]`.
 */
struct mla_fp8_656 {
  static constexpr std::size_t bytes        = 656;
  static constexpr int nope_dim             = 512;
  static constexpr int rope_dim             = 64;
  static constexpr int tile_dim             = 128;
  static constexpr int num_tiles            = nope_dim / tile_dim;
  static constexpr int dim                  = nope_dim + rope_dim;  ///< dequantized elements
  static constexpr std::size_t nope_offset  = 0;
  static constexpr std::size_t scale_offset = nope_offset + nope_dim;
  static constexpr std::size_t rope_offset  = scale_offset + num_tiles * sizeof(float);
  static constexpr const char* name         = "mla_fp8_656";
  static_assert(rope_offset + rope_dim * sizeof(bf16) == bytes);
};

/**
 * @brief MLA row in bf16: 512 latent values followed by 64 rotary values, 1152 bytes.
 */
struct mla_bf16_576 {
  static constexpr std::size_t bytes       = 1152;
  static constexpr int nope_dim            = 512;
  static constexpr int rope_dim            = 64;
  static constexpr int dim                 = nope_dim + rope_dim;
  static constexpr std::size_t nope_offset = 0;
  static constexpr std::size_t rope_offset = nope_dim * sizeof(bf16);
  static constexpr const char* name        = "mla_bf16_576";
  static_assert(dim * sizeof(bf16) == bytes);
};

/**
 * @brief MHA / GQA row: K then V of `KvHeads` heads of `HeadDim` elements of type `T`.
 *
 * @tparam KvHeads number of KV heads stored per token
 * @tparam HeadDim elements per head
 * @tparam T element storage type (`dhisparse::bf16`, `dhisparse::fp8_e4m3`, `float`, …)
 */
template <int KvHeads, int HeadDim, class T = bf16>
struct mha {
  static_assert(KvHeads > 0 && HeadDim > 0, "mha: KvHeads and HeadDim must be positive");
  using element_type                    = T;
  static constexpr int kv_heads         = KvHeads;
  static constexpr int head_dim         = HeadDim;
  static constexpr std::size_t k_offset = 0;
  static constexpr std::size_t v_offset = std::size_t(KvHeads) * HeadDim * sizeof(T);
  static constexpr std::size_t bytes    = 2 * v_offset;
  static constexpr const char* name     = "mha";
  static_assert(bytes % row_alignment == 0,
                "mha: 2 * KvHeads * HeadDim * sizeof(T) must be a multiple of 16 bytes");
};

/**
 * @brief A row the library moves but never interprets (an engine's own layout).
 * @tparam Bytes row size, a non-zero multiple of 16
 */
template <std::size_t Bytes>
struct opaque {
  static_assert(Bytes > 0 && Bytes % row_alignment == 0,
                "opaque<Bytes>: row size must be a non-zero multiple of 16 bytes");
  static constexpr std::size_t bytes = Bytes;
  static constexpr const char* name  = "opaque";
};

}  // namespace row_format

/// True when `F` satisfies the row format contract (see the file comment).
template <class F, class = void>
struct is_row_format : std::false_type {};

template <class F>
struct is_row_format<F, std::void_t<decltype(F::bytes), decltype(F::name)>>
  : std::bool_constant<(F::bytes > 0) && (F::bytes % row_alignment == 0)> {};

template <class F>
inline constexpr bool is_row_format_v = is_row_format<F>::value;

}  // namespace dhisparse
