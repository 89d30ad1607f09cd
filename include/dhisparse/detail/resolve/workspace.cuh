/**
 * @file detail/resolve/workspace.cuh
 * @brief Scratch of one resolve, carved from the caller's workspace, and small constants
 *        shared by its kernels.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <cstddef>
#include <cstdint>

namespace dhisparse::detail::resolve {

/// Slot-table value of an entry whose slot is assigned by `allocate` (a miss, or a tail
/// row of this step); never visible after resolve.
inline constexpr std::int32_t pending = -2;

/// Threads per request in the per-request kernel (`allocate`).
inline constexpr int block_size = 512;

/// Threads, and entries, of one `lookup` block (a tile; a request has several).
inline constexpr int lookup_block = 256;

/// `fetch_rows`: batches of at least this many requests copy their missed rows inside
/// their allocate blocks; smaller ones leave them to a device-wide gather.
inline constexpr int in_block_copy_batch = 16;

/// Most entries one request may have (Qmax × K).
inline constexpr std::int64_t max_request_entries = std::int64_t(block_size) * 32;

/**
 * Per-batch-entry results of `lookup` (its tiles add to them), read by `reclaim` and
 * `allocate`; `allocate` zeroes them again for the next resolve.
 */
struct request_need {
  std::int32_t misses;           ///< distinct committed rows to fetch
  std::int32_t tails;            ///< tail rows with storage (a prefix of the Q tails)
  std::int32_t hits;             ///< distinct resident rows selected
  std::int32_t tail_selections;  ///< entries that name a tail row (left pending)
};

/// Words of `workspace_view::roster` (reclaim::roster_word names them).
inline constexpr int roster_words = 3;

/**
 * @brief Views into the caller's workspace. The bitmaps must be zero before the first
 *        resolve (the owner clears the workspace once); every resolve leaves them zero.
 */
struct workspace_view {
  std::uint32_t* miss_bits;     ///< [max_batch][bitmap_words] one bit per missed position
  std::uint32_t* miss_words;    ///< [max_batch][summary_words] one bit per non-zero word above
  std::int32_t* misses;         ///< [max_batch][entries] missed positions, ascending
  std::int32_t* scratch;        ///< [max_batch][entries + max_queries] word lists, victims
  request_need* need;           ///< [max_batch], zero between resolves
  std::uint32_t* epoch;         ///< scalar: the epoch of this resolve
  std::uint32_t* roster;        ///< [roster_words] reclaim's team (reclaim::roster_word), zero between resolves
  std::int64_t bitmap_words;
  std::int64_t summary_words;
  std::int64_t entries;         ///< max_queries × top_k
};

inline std::size_t align_up(std::size_t v) { return (v + 255) & ~std::size_t{255}; }

/// Carves the views for the given shapes out of `workspace` (nullptr: only computes the
/// size, returned through `bytes`).
inline workspace_view carve(void* workspace, int max_batch, int max_queries, int top_k,
                            int max_context, std::size_t* bytes = nullptr)
{
  workspace_view v{};
  v.entries       = std::int64_t(max_queries) * top_k;
  v.bitmap_words  = (std::int64_t(max_context) + 31) / 32;
  v.summary_words = (v.bitmap_words + 31) / 32;
  std::size_t offset = 0;
  auto take          = [&](std::size_t n) {
    std::size_t const at = offset;
    offset += align_up(n);
    return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(workspace) + at);
  };
  std::size_t const b = std::size_t(max_batch);
  // What must stay zero between resolves comes first, at offsets that do not depend on
  // this call's top_k (calls with different K share the workspace).
  v.need       = reinterpret_cast<request_need*>(take(b * sizeof(request_need)));
  v.epoch      = reinterpret_cast<std::uint32_t*>(take((1 + roster_words) * sizeof(std::uint32_t)));
  v.roster     = v.epoch + 1;
  v.miss_bits  = reinterpret_cast<std::uint32_t*>(take(b * std::size_t(v.bitmap_words) * 4));
  v.miss_words = reinterpret_cast<std::uint32_t*>(take(b * std::size_t(v.summary_words) * 4));
  v.misses     = reinterpret_cast<std::int32_t*>(take(b * std::size_t(v.entries) * 4));
  v.scratch    = reinterpret_cast<std::int32_t*>(take(b * std::size_t(v.entries + max_queries) * 4));
  if (bytes != nullptr) { *bytes = offset; }
  return v;
}

}  // namespace dhisparse::detail::resolve
