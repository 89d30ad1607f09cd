/**
 * @file bench/serving/kernels.cu
 * @brief The serving benchmark's own kernels (see kernels.hpp for what each one does).
 */
#include "kernels.hpp"

#include <dhisparse/error.cuh>

#include <algorithm>
#include <cstdint>

namespace dhisparse::bench::serving {
namespace {

__global__ void fill_words_kernel(std::uint64_t* p, std::size_t words, std::uint64_t seed, std::uint64_t and_mask,
                                  std::uint64_t or_mask)
{
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    p[i] = (mix64(seed + i) & and_mask) | or_mask;
  }
}

/// One block per (b, q) entry of the padded batch.
__global__ void gather_selections_kernel(step_batch_ref batch, std::int32_t const* rows, std::int32_t const* start,
                                         int templates, int template_groups, int group, std::int64_t tokens,
                                         int top_k, std::int32_t* out, std::uint32_t* status)
{
  int const max_q = batch.max_queries;
  int const b     = blockIdx.x / max_q;
  int const q     = blockIdx.x % max_q;
  if (b >= *batch.size) { return; }  // padding: resolve does not read these rows
  std::int32_t* dst = out + std::int64_t(blockIdx.x) * top_k;
  std::int32_t const* src = nullptr;
  if (q < batch.queries[b]) {
    int const tmpl          = b % templates;
    std::int64_t const t    = std::int64_t(batch.lengths[batch.requests[b]]) + q - start[tmpl];
    if (t >= 0 && t < tokens) {
      src = rows + ((std::int64_t(tmpl) * template_groups + group % template_groups) * tokens + t) * top_k;
    } else if (threadIdx.x == 0) {
      atomicOr(status, bench_template_exhausted);
    }
  }
  if (src != nullptr && top_k % 4 == 0) {
    auto const* s4 = reinterpret_cast<int4 const*>(src);
    auto* d4       = reinterpret_cast<int4*>(dst);
    for (int i = threadIdx.x; i < top_k / 4; i += blockDim.x) { d4[i] = s4[i]; }
  } else {
    for (int i = threadIdx.x; i < top_k; i += blockDim.x) { dst[i] = src != nullptr ? src[i] : -1; }
  }
}

// ---------------------------------------------------------------------------------------
// Indexer stand-in: int8 tensor cores (mma.sync m16n8k32), one warp per 16 positions.
// ---------------------------------------------------------------------------------------
constexpr int indexer_threads         = 128;
constexpr int indexer_tokens_per_block = 2048;
constexpr int query_pitch              = index_dim + 16;  // bytes per staged head: no bank conflicts

__device__ __forceinline__ void mma_s8(int (&c)[4], std::uint32_t const (&a)[4], std::uint32_t b0, std::uint32_t b1)
{
  asm volatile(
    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
    : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int Heads>
__global__ void __launch_bounds__(indexer_threads)
  indexer_scores_kernel(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                        std::int8_t const* queries, float const* weights, int index_stride, float* scores,
                        std::int64_t score_stride)
{
  extern __shared__ int4 staged[];
  int const b = blockIdx.y;
  if (b >= *batch.size) { return; }
  int const num_q           = batch.queries[b];
  int const max_q           = batch.max_queries;
  std::int32_t const ntok   = (batch.lengths[batch.requests[b]] + num_q + index_stride - 1) / index_stride;  // keys
  std::int32_t const first  = std::int32_t(blockIdx.x) * indexer_tokens_per_block;
  if (first >= ntok) { return; }

  // The queries of request b, one head per row of query_pitch bytes.
  auto const* src = reinterpret_cast<int4 const*>(queries + std::int64_t(b) * max_q * Heads * index_dim);
  int const rows  = num_q * Heads;
  for (int i = threadIdx.x; i < rows * (index_dim / 16); i += blockDim.x) {
    int const row = i / (index_dim / 16), chunk = i % (index_dim / 16);
    staged[row * (query_pitch / 16) + chunk] = src[i];
  }
  __syncthreads();
  auto const* sq = reinterpret_cast<std::int8_t const*>(staged);

  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const gid = lane >> 2, tig = lane & 3;
  std::int8_t const* request_keys = keys + key_base[b] * index_dim;
  for (int tile = warp; tile < indexer_tokens_per_block / 16; tile += indexer_threads / 32) {
    std::int32_t const t0 = first + tile * 16;
    if (t0 >= ntok) { break; }
    std::uint32_t a[4][4];
    std::int8_t const* r0 = request_keys + std::int64_t(t0 + gid) * index_dim;
    std::int8_t const* r1 = r0 + 8 * index_dim;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[k][0] = __ldg(reinterpret_cast<std::uint32_t const*>(r0 + k * 32 + tig * 4));
      a[k][1] = __ldg(reinterpret_cast<std::uint32_t const*>(r1 + k * 32 + tig * 4));
      a[k][2] = __ldg(reinterpret_cast<std::uint32_t const*>(r0 + k * 32 + 16 + tig * 4));
      a[k][3] = __ldg(reinterpret_cast<std::uint32_t const*>(r1 + k * 32 + 16 + tig * 4));
    }
    for (int q = 0; q < num_q; ++q) {
      float lo = 0.f, hi = 0.f;
#pragma unroll 2
      for (int n = 0; n < Heads / 8; ++n) {
        int c[4]               = {0, 0, 0, 0};
        std::int8_t const* qb = sq + (q * Heads + n * 8 + gid) * query_pitch;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          std::uint32_t const b0 = *reinterpret_cast<std::uint32_t const*>(qb + k * 32 + tig * 4);
          std::uint32_t const b1 = *reinterpret_cast<std::uint32_t const*>(qb + k * 32 + 16 + tig * 4);
          mma_s8(c, a[k], b0, b1);
        }
        float const w0 = __ldg(weights + n * 8 + tig * 2);
        float const w1 = __ldg(weights + n * 8 + tig * 2 + 1);
        lo += w0 * fmaxf(float(c[0]), 0.f) + w1 * fmaxf(float(c[1]), 0.f);
        hi += w0 * fmaxf(float(c[2]), 0.f) + w1 * fmaxf(float(c[3]), 0.f);
      }
      lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
      lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
      hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 1);
      hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 2);
      if (tig == 0) {
        float* out = scores + (std::int64_t(b) * max_q + q) * score_stride;
        if (t0 + gid < ntok) { out[t0 + gid] = lo; }
        if (t0 + gid + 8 < ntok) { out[t0 + gid + 8] = hi; }
      }
    }
  }
}

constexpr int topk_threads = 512;
constexpr int topk_bins    = 2048;

/// One block per (b, q): histogram of the top 11 bits of the (non-negative) scores, the
/// threshold bin of the K-th best, then compaction of everything above it.
__global__ void __launch_bounds__(topk_threads)
  indexer_topk_kernel(step_batch_ref batch, float const* scores, std::int64_t score_stride, int index_stride,
                      int top_k, std::int32_t* out)
{
  __shared__ int hist[topk_bins];
  __shared__ int threshold;
  __shared__ int taken;
  int const max_q = batch.max_queries;
  int const b     = blockIdx.x / max_q;
  int const q     = blockIdx.x % max_q;
  if (b >= *batch.size || q >= batch.queries[b]) { return; }
  std::int32_t const n = (batch.lengths[batch.requests[b]] + q + index_stride) / index_stride;  // keys up to its position
  float const* s       = scores + std::int64_t(blockIdx.x) * score_stride;
  for (int i = threadIdx.x; i < topk_bins; i += blockDim.x) { hist[i] = 0; }
  if (threadIdx.x == 0) { taken = 0; }
  __syncthreads();
  for (std::int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    atomicAdd(&hist[(__float_as_uint(s[i]) >> 20) & (topk_bins - 1)], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int cum = 0, bin = topk_bins - 1;
    for (; bin > 0; --bin) {
      cum += hist[bin];
      if (cum >= top_k) { break; }
    }
    threshold = bin;
  }
  __syncthreads();
  std::int32_t* dst = out + std::int64_t(blockIdx.x) * top_k;
  for (std::int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    int const bin = int((__float_as_uint(s[i]) >> 20) & (topk_bins - 1));
    if (bin >= threshold) {
      int const at = atomicAdd(&taken, 1);
      if (at < top_k) { dst[at] = i; }
    }
  }
}

/// One warp per (b, q) tail row.
__global__ void write_tail_rows_kernel(step_batch_ref batch, std::int32_t const* tail_slots, std::byte* rows,
                                       std::size_t stride, int group, int layer, std::uint64_t salt)
{
  int const max_q   = batch.max_queries;
  int const warp    = int((blockIdx.x * std::size_t(blockDim.x) + threadIdx.x) / 32);
  int const lane    = threadIdx.x % 32;
  if (warp >= batch.max_batch * max_q) { return; }
  int const b = warp / max_q, q = warp % max_q;
  if (b >= *batch.size || q >= batch.queries[b]) { return; }
  std::int32_t const slot = tail_slots[warp];
  if (slot < 0) { return; }
  std::int32_t const position = batch.lengths[batch.requests[b]] + q;
  auto* dst = reinterpret_cast<std::uint64_t*>(rows + std::size_t(slot) * stride);
  for (int w = lane; w < row_words; w += 32) { dst[w] = row_word(b, group, layer, position, w, salt); }
}

__global__ void kept_from_accepted_kernel(step_batch_ref batch, std::int32_t const* accepted, std::int32_t* kept)
{
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < batch.max_batch; b += gridDim.x * blockDim.x) {
    kept[b] = b < *batch.size ? min(max(accepted[b], 0) + 1, batch.queries[b]) : 0;
  }
}

__global__ void count_tokens_kernel(step_batch_ref batch, std::int32_t const* kept, unsigned long long* total,
                                    std::int32_t* step_tokens, std::int32_t* step_index, int capacity)
{
  __shared__ int sum;
  if (threadIdx.x == 0) { sum = 0; }
  __syncthreads();
  int local = 0;
  for (int b = threadIdx.x; b < *batch.size; b += blockDim.x) { local += kept != nullptr ? kept[b] : batch.queries[b]; }
  atomicAdd(&sum, local);
  __syncthreads();
  if (threadIdx.x == 0) {
    step_tokens[*step_index % capacity] = sum;
    *step_index += 1;
    *total += static_cast<unsigned long long>(sum);
  }
}

__global__ void or_status_kernel(std::uint32_t const* src, std::uint32_t* dst, std::uint32_t bit)
{
  if (*src != 0) { atomicOr(dst, bit); }
}

__global__ void hash_kernel(std::uint64_t const* data, std::size_t words, unsigned long long* out,
                            std::int32_t const* step_index, int capacity)
{
  unsigned long long h = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    h += mix64(data[i] ^ mix64(i));
  }
  for (int o = 16; o > 0; o /= 2) { h += __shfl_xor_sync(0xFFFFFFFFu, h, o); }
  if (threadIdx.x % 32 == 0) { atomicAdd(out + (*step_index % capacity), h); }
}

__global__ void draft_tokens_kernel(std::int32_t* tokens, int requests, int drafts, int vocab)
{
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < requests * drafts; i += gridDim.x * blockDim.x) {
    tokens[i] = int((mix64(std::uint64_t(i) * 7919u + 17u)) % std::uint64_t(vocab));
  }
}

__global__ void build_p_kernel(float* p, int requests, int drafts, int vocab, float const* p_draft,
                               std::int32_t const* draft_tokens)
{
  std::int64_t const n = std::int64_t(requests) * (drafts + 1) * vocab;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int const v          = int(i % vocab);
    std::int64_t const r = i / vocab;
    int const row        = int(r % (drafts + 1));
    int const b          = int(r / (drafts + 1));
    float value          = 1.0f / float(vocab);
    if (row < drafts) {
      float const px = p_draft[row];
      value          = v == draft_tokens[b * drafts + row] ? px : (1.0f - px) / float(vocab - 1);
    }
    p[i] = value;
  }
}

__global__ void build_candidates_kernel(std::int32_t* ids, float* probs, int requests, int drafts, int candidates,
                                        int vocab, std::int32_t const* draft_tokens, float q_draft)
{
  int const n = requests * drafts * candidates;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int const j      = i % candidates;
    int const row    = i / candidates;  // b * drafts + position
    int const x      = draft_tokens[row];
    ids[i]   = int((std::int64_t(x) + std::int64_t(j) * 7919) % vocab);  // distinct for j < vocab / 7919
    probs[i] = j == 0 ? q_draft : (1.0f - q_draft) / float(candidates - 1);
  }
}

/// See launch_union_probe. Marks: bits 8..31 the epoch that wrote the word, bits 0..7 the
/// queries of that epoch that selected the position.
__global__ void union_probe_kernel(step_batch_ref batch, residency_map_ref map, int group,
                                   std::int32_t const* selections, int top_k, std::uint32_t* marks,
                                   std::int64_t mark_stride, std::uint32_t const* epoch, unsigned long long* counts)
{
  std::int64_t const per_entry = std::int64_t(batch.max_queries) * top_k;
  std::int64_t const n         = std::int64_t(batch.max_batch) * per_entry;
  std::uint32_t const now      = *epoch & 0xFFFFFFu;
  int const size               = *batch.size;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int const b = int(i / per_entry);
    int const q = int(i / top_k % batch.max_queries);
    if (b >= size || q >= batch.queries[b]) { continue; }
    std::int32_t const r        = batch.requests[b];
    std::int32_t const position = selections[i];
    if (position < 0 || position >= batch.lengths[r] || position >= mark_stride) { continue; }  // tails: not fetched
    std::int32_t const* entry = map.entry(r, group, position);
    if (entry != nullptr && *entry >= 0) { continue; }  // resident: a hit for every query
    std::uint32_t* word     = marks + std::int64_t(r) * mark_stride + position;
    std::uint32_t const bit = 1u << q;
    std::uint32_t old       = *word;
    for (;;) {
      std::uint32_t const next = (old >> 8) == now ? (old | bit) : ((now << 8) | bit);
      if (next == old) { break; }  // this query selected it before (a duplicate entry)
      std::uint32_t const seen = atomicCAS(word, old, next);
      if (seen == old) { break; }
      old = seen;
    }
    bool const first_of_step  = (old >> 8) != now;
    bool const first_of_query = first_of_step || (old & bit) == 0;
    if (first_of_step) { atomicAdd(counts + 0, 1ull); }
    if (first_of_query) { atomicAdd(counts + 1, 1ull); }
  }
}

__global__ void bump_epoch_kernel(std::uint32_t* epoch) { ++*epoch; }

unsigned grid_for(std::size_t work, unsigned threads)
{
  return unsigned(std::clamp<std::size_t>((work + threads - 1) / threads, 1, 65535 * 8));
}

}  // namespace

void launch_fill_words(std::uint64_t* p, std::size_t words, std::uint64_t seed, std::uint64_t and_mask,
                       std::uint64_t or_mask, cudaStream_t stream)
{
  if (words == 0) { return; }
  fill_words_kernel<<<grid_for(words, 256), 256, 0, stream>>>(p, words, seed, and_mask, or_mask);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_gather_selections(step_batch_ref batch, std::int32_t const* rows, std::int32_t const* start,
                              int templates, int template_groups, int group, std::int64_t tokens, int top_k,
                              std::int32_t* out, std::uint32_t* status, cudaStream_t stream)
{
  unsigned const blocks = unsigned(batch.max_batch * batch.max_queries);
  gather_selections_kernel<<<blocks, 128, 0, stream>>>(batch, rows, start, templates, template_groups, group, tokens,
                                                       top_k, out, status);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

namespace {
std::size_t indexer_smem(int heads, int max_queries)
{
  return std::size_t(max_queries) * heads * query_pitch;
}
}  // namespace

void prepare_indexer(int heads, int max_queries)
{
  int const bytes = int(indexer_smem(heads, max_queries));
  if (heads == 32) {
    DHISPARSE_CUDA_TRY(cudaFuncSetAttribute(indexer_scores_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  } else if (heads == 64) {
    DHISPARSE_CUDA_TRY(cudaFuncSetAttribute(indexer_scores_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  } else {
    throw error("indexer stand-in: index heads must be 32 or 64");
  }
}

void launch_indexer_scores(step_batch_ref batch, std::int8_t const* keys, std::int64_t const* key_base,
                           std::int8_t const* queries, float const* weights, int heads, int index_stride,
                           float* scores, std::int64_t score_stride, std::int32_t max_tokens, cudaStream_t stream)
{
  std::int32_t const max_keys = (max_tokens + index_stride - 1) / index_stride;
  dim3 const grid(unsigned((max_keys + indexer_tokens_per_block - 1) / indexer_tokens_per_block),
                  unsigned(batch.max_batch));
  std::size_t const smem = indexer_smem(heads, batch.max_queries);
  if (heads == 32) {
    indexer_scores_kernel<32><<<grid, indexer_threads, smem, stream>>>(batch, keys, key_base, queries, weights,
                                                                       index_stride, scores, score_stride);
  } else {
    indexer_scores_kernel<64><<<grid, indexer_threads, smem, stream>>>(batch, keys, key_base, queries, weights,
                                                                       index_stride, scores, score_stride);
  }
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_indexer_topk(step_batch_ref batch, float const* scores, std::int64_t score_stride, int index_stride,
                         int top_k, std::int32_t* out, cudaStream_t stream)
{
  unsigned const blocks = unsigned(batch.max_batch * batch.max_queries);
  indexer_topk_kernel<<<blocks, topk_threads, 0, stream>>>(batch, scores, score_stride, index_stride, top_k, out);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_write_tail_rows(step_batch_ref batch, std::int32_t const* tail_slots, std::byte* rows,
                            std::size_t stride, int group, int layer, std::uint64_t salt, cudaStream_t stream)
{
  std::size_t const threads = std::size_t(batch.max_batch) * batch.max_queries * 32;
  write_tail_rows_kernel<<<grid_for(threads, 256), 256, 0, stream>>>(batch, tail_slots, rows, stride, group, layer,
                                                                     salt);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_kept_from_accepted(step_batch_ref batch, std::int32_t const* accepted, std::int32_t* kept,
                               cudaStream_t stream)
{
  kept_from_accepted_kernel<<<grid_for(std::size_t(batch.max_batch), 256), 256, 0, stream>>>(batch, accepted, kept);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_count_tokens(step_batch_ref batch, std::int32_t const* kept, unsigned long long* total,
                         std::int32_t* step_tokens, std::int32_t* step_index, int capacity, cudaStream_t stream)
{
  count_tokens_kernel<<<1, 256, 0, stream>>>(batch, kept, total, step_tokens, step_index, capacity);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_or_status(std::uint32_t const* src, std::uint32_t* dst, std::uint32_t bit, cudaStream_t stream)
{
  or_status_kernel<<<1, 1, 0, stream>>>(src, dst, bit);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_hash(void const* data, std::size_t bytes, unsigned long long* out, std::int32_t const* step_index,
                 int capacity, cudaStream_t stream)
{
  std::size_t const words = bytes / 8;
  hash_kernel<<<std::min(grid_for(words, 256), 1024u), 256, 0, stream>>>(static_cast<std::uint64_t const*>(data),
                                                                          words, out, step_index, capacity);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_union_probe(step_batch_ref batch, residency_map_ref map, int group, std::int32_t const* selections,
                        int top_k, std::uint32_t* marks, std::int64_t mark_stride, std::uint32_t* epoch,
                        unsigned long long* counts, cudaStream_t stream)
{
  DHISPARSE_EXPECTS(batch.max_queries <= 8, "union probe: at most 8 queries per request");
  bump_epoch_kernel<<<1, 1, 0, stream>>>(epoch);
  std::size_t const n = std::size_t(batch.max_batch) * batch.max_queries * top_k;
  union_probe_kernel<<<std::min(grid_for(n, 256), 4096u), 256, 0, stream>>>(batch, map, group, selections, top_k,
                                                                              marks, mark_stride, epoch, counts);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_draft_tokens(std::int32_t* tokens, int requests, int drafts, int vocab, cudaStream_t stream)
{
  draft_tokens_kernel<<<grid_for(std::size_t(requests) * drafts, 256), 256, 0, stream>>>(tokens, requests, drafts,
                                                                                         vocab);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_build_p(float* p, int requests, int drafts, int vocab, float const* p_draft,
                    std::int32_t const* draft_tokens, cudaStream_t stream)
{
  std::size_t const n = std::size_t(requests) * (drafts + 1) * vocab;
  build_p_kernel<<<grid_for(n, 256), 256, 0, stream>>>(p, requests, drafts, vocab, p_draft, draft_tokens);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

void launch_build_candidates(std::int32_t* ids, float* probs, int requests, int drafts, int candidates, int vocab,
                             std::int32_t const* draft_tokens, float q_draft, cudaStream_t stream)
{
  std::size_t const n = std::size_t(requests) * drafts * candidates;
  build_candidates_kernel<<<grid_for(n, 256), 256, 0, stream>>>(ids, probs, requests, drafts, candidates, vocab,
                                                                 draft_tokens, q_draft);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
}

}  // namespace dhisparse::bench::serving
