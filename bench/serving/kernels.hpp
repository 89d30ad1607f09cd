/**
 * @file bench/serving/kernels.hpp
 * @brief The serving benchmark's own device work (everything that is not the library):
 *        row contents, the selection gather from recorded templates, the indexer
 *        stand-in, tail-row writes, step accounting and the constructed p / q of the
 *        speculative modes. Launch wrappers only; the kernels live in kernels.cu, compiled
 *        once. Every launch is stream-ordered and reads the batch from device memory, so
 *        it can be captured in a CUDA graph.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse::bench::serving {

/// splitmix64 finalizer.
DHISPARSE_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Every byte of row contents is masked with this: FP8 e4m3 values below 2 in magnitude
/// (never NaN), finite fp32 tile scales below 1, bf16 rope values below 2.
inline constexpr std::uint64_t row_byte_mask = 0xBFBFBFBFBFBFBFBFull;

/// Bytes of one stored row (FP8-656 MLA) and its 8-byte words.
inline constexpr int row_bytes = 656;
inline constexpr int row_words = row_bytes / 8;

/**
 * @brief Word `w` of the row of (request r, group g, layer l, position p): what the
 *        "model" writes as that row, on the host (prefill) and on the device (tail rows).
 *        A function of the coordinates only, so every mode stores the same bytes.
 */
DHISPARSE_HOST_DEVICE inline std::uint64_t row_word(int r, int g, int l, std::int32_t p, int w, std::uint64_t salt)
{
  // r < 2^16, g and l < 2^8, p < 2^32: distinct coordinates give distinct keys.
  std::uint64_t const key = (std::uint64_t(std::uint32_t(l) & 0xFFu) << 56) ^ (std::uint64_t(std::uint32_t(g) & 0xFFu) << 48) ^
                            (std::uint64_t(std::uint32_t(r) & 0xFFFFu) << 32) ^ std::uint64_t(std::uint32_t(p));
  return mix64(mix64(key ^ salt) + std::uint64_t(w)) & row_byte_mask;
}

/// Dimensions of one index key / index query head (DSA lightning indexer: 128).
inline constexpr int index_dim = 128;
/// Index heads the indexer stand-in is compiled for.
inline constexpr int index_heads_supported[] = {32, 64};

/// Bits of the benchmark's own status word.
enum bench_status_bit : std::uint32_t {
  bench_template_exhausted = 1u << 0,  ///< a request ran past its selection template
  bench_attention_status   = 1u << 1,  ///< sparse attention flagged an invalid slot
  bench_verify_status      = 1u << 2,  ///< verify flagged invalid input
};

/// Fills `words` 8-byte words with mix64(seed + i) & and_mask | or_mask.
void launch_fill_words(std::uint64_t* p, std::size_t words, std::uint64_t seed, std::uint64_t and_mask,
                       std::uint64_t or_mask, cudaStream_t stream);

/**
 * @brief Selections of one layer group for the step: entry (b, q) gets the template row of
 *        position length_b + q of request b (template `b % templates`, started at
 *        `start[template]`). Rows of queries beyond Q_b are -1; a position past the
 *        template sets `bench_template_exhausted` and gives an empty selection.
 * @param rows device [templates][template_groups][tokens][top_k]
 * @param start device [templates]: position of each template's row 0
 * @param out device [max_batch][max_queries][top_k]
 */
void launch_gather_selections(step_batch_ref batch, std::int32_t const* rows, std::int32_t const* start,
                              int templates, int template_groups, int group, std::int64_t tokens, int top_k,
                              std::int32_t* out, std::uint32_t* status, cudaStream_t stream);

/// Allows the indexer stand-in's kernels their shared memory; call once before capture.
void prepare_indexer(int heads, int max_queries);

/**
 * @brief Indexer stand-in, scores: for every query (b, q) and every position t ≤ length_b
 *        + Q_b of request b, score = Σ_h w_h · relu(q_h · k_t) over `heads` heads of 128
 *        int8 dimensions (int8 tensor cores, as the FP8 DSA indexer: the same bytes per
 *        key and the same multiply-adds). One block per multiprocessor; each takes the
 *        same share of (request, key) work from a prefix over the batch, streams 512-key
 *        tiles through shared memory (cp.async) and keeps every query head of a group of up
 *        to 512 / heads queries staged; reads no key past a request's own keys.
 * @param keys device int8 [..][128]; request b's keys start at row key_base[b]
 * @param queries device int8 [max_batch][max_queries][heads][128]
 * @param weights device float [heads]
 * @param scores device float [max_batch][max_queries][score_stride]
 * @param index_stride positions per index key (1: DSA, a key per position; s > 1: a
 *        compressed indexer with one key per s positions)
 * @param max_tokens most positions a request may have (unused: the grid does not depend on it)
 */
void launch_indexer_scores(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                           std::int8_t const* queries, float const* weights, int heads, int index_stride,
                           float* scores, std::int64_t score_stride, std::int32_t max_tokens, cudaStream_t stream);

/**
 * @brief Indexer stand-in, top-K: an exact radix select of the K best scores of every
 *        query (b, q) over its keys up to its own position, by a cluster of up to 8 blocks
 *        (three histogram rounds of 11, 11 and 10 bits, then compaction). Entry (b, q) gets
 *        every key index scoring above the K-th best and as many equal to it as K needs, in
 *        no particular order; -1 past the row's keys when it has fewer than K. The output is
 *        the cost of a real top-K; the step's selections come from the workload.
 * @param out device int32 [max_batch][max_queries][top_k]; rows of padding entries untouched
 */
void launch_indexer_topk(step_batch_ref batch, float const* scores, std::int64_t score_stride, int index_stride,
                         int top_k, std::int32_t* out, cudaStream_t stream);

/// The previous scores kernel (one warp per 16 keys, keys read straight from global
/// memory), kept as bench_indexer --old's baseline; same arguments and results.
void launch_indexer_scores_baseline(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                                    std::int8_t const* queries, float const* weights, int heads, int index_stride,
                                    float* scores, std::int64_t score_stride, std::int32_t max_tokens,
                                    cudaStream_t stream);

/// The previous top-K pass (one block per (b, q), an 11-bit threshold bin, not exact),
/// kept as bench_indexer --old's baseline.
void launch_indexer_topk_baseline(step_batch_ref batch, float const* scores, std::int64_t score_stride,
                                  int index_stride, int top_k, std::int32_t* out, cudaStream_t stream);

/// The model's tail rows of layer `layer` of `group`: row_word contents into the tail slots.
void launch_write_tail_rows(step_batch_ref batch, std::int32_t const* tail_slots, std::byte* rows,
                            std::size_t stride, int group, int layer, std::uint64_t salt, cudaStream_t stream);

/// kept[b] = min(accepted[b] + 1, Q_b): the verified token's own row plus the accepted drafts.
void launch_kept_from_accepted(step_batch_ref batch, std::int32_t const* accepted, std::int32_t* kept,
                               cudaStream_t stream);

/**
 * @brief Tokens emitted by the step (Σ kept, or Σ Q_b when `kept` is null): added to
 *        `*total`, stored at step_tokens[*step_index % capacity], then ++*step_index.
 */
void launch_count_tokens(step_batch_ref batch, std::int32_t const* kept, unsigned long long* total,
                         std::int32_t* step_tokens, std::int32_t* step_index, int capacity, cudaStream_t stream);

/// *dst |= (*src != 0 ? bit : 0).
void launch_or_status(std::uint32_t const* src, std::uint32_t* dst, std::uint32_t bit, cudaStream_t stream);

/// *out (at step_index % capacity) += an order-independent hash of `bytes` bytes (a multiple of 8).
void launch_hash(void const* data, std::size_t bytes, unsigned long long* out, std::int32_t const* step_index,
                 int capacity, cudaStream_t stream);

/**
 * @brief The union's saving (docs/serving.md), probed before resolve of `group`: for every
 *        selected committed position of every query of the step that the residency map
 *        says is not resident, counts[0] += 1 the first time any query of its request
 *        selects it this step (the rows one resolve of the union fetches) and counts[1] +=
 *        1 the first time each query selects it (what Q separate resolves, one per query,
 *        would fetch). Exact for any order and duplicates; at most 8 queries.
 * @param marks device [requests][mark_stride] scratch, zeroed once before the first probe
 * @param mark_stride positions per request in `marks` (≥ the longest committed length)
 * @param epoch device word, incremented by this call (tells the probes apart; zeroed with marks)
 * @param counts device [2], accumulated
 */
void launch_union_probe(step_batch_ref batch, residency_map_ref map, int group, std::int32_t const* selections,
                        int top_k, std::uint32_t* marks, std::int64_t mark_stride, std::uint32_t* epoch,
                        unsigned long long* counts, cudaStream_t stream);

/// Draft tokens [requests][drafts], distinct per row.
void launch_draft_tokens(std::int32_t* tokens, int requests, int drafts, int vocab, cudaStream_t stream);

/**
 * @brief Target distributions p [requests][drafts + 1][vocab]: row i < drafts puts
 *        `p_draft[i]` on draft token i and spreads the rest uniformly; the bonus row is uniform.
 * @param p_draft device float [drafts]
 */
void launch_build_p(float* p, int requests, int drafts, int vocab, float const* p_draft,
                    std::int32_t const* draft_tokens, cudaStream_t stream);

/**
 * @brief DFlash2-like candidate lists [requests][drafts][candidates]: the draft token first
 *        with probability q_draft, then candidates - 1 other ids sharing 1 - q_draft.
 */
void launch_build_candidates(std::int32_t* ids, float* probs, int requests, int drafts, int candidates, int vocab,
                             std::int32_t const* draft_tokens, float q_draft, cudaStream_t stream);

}  // namespace dhisparse::bench::serving
