/**
 * @file bench/verify/verify.cu
 * @brief Verification kernels at serving scale: B = 512 requests, d = 8 drafts, vocabulary
 *        151 552, chain and tree, greedy and sampling with dense / candidate / one-hot q.
 *
 * Reports per configuration the median time, the bytes of p and q the kernel actually read
 * (its `bytes_read` counter, per repetition), that traffic per second against two HBM
 * limits measured in the same run (cudaMemcpy device→device, read + write counted, as in
 * BENCH.md; and a read-only streaming kernel), and the size of the full p and q tensors a
 * naive verifier would read. BENCH.md's target: reads of p and q at ≥ 50% of HBM
 * bandwidth. Every configuration runs with one CTA per request ("1 CTA") and, on devices
 * with thread-block clusters, with a cluster of `verify_cluster_ctas` CTAs per request
 * (the default there), one after the other in the same run.
 *
 * Synthetic distributions: per row, 32 "hot" tokens carry ~95% of the mass (logit boosts
 * 14, 13.65, …, over N(0, 1) noise logits); q shares the hot tokens with perturbed boosts,
 * so drafts are accepted at realistic rates. Drafts are sampled from q (Gumbel-max);
 * candidate q is q restricted to the 32 hot tokens.
 */
#include <dhisparse/status.hpp>
#include <dhisparse/verify.cuh>

#include <common/bench.cuh>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace dhisparse;

constexpr int hot_tokens = 32;

__host__ __device__ std::uint64_t mix(std::uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Approximately N(0, 1) from a hash (sum of four uniforms, rescaled).
__device__ float noise(std::uint64_t key)
{
  std::uint64_t const h = mix(key);
  float s               = 0.f;
  for (int i = 0; i < 4; ++i) { s += float((h >> (16 * i)) & 0xFFFF) * (1.f / 65536.f); }
  return (s - 2.f) * 1.7320508f;
}

__device__ int hot_id(int j, std::uint64_t row_key, int vocab)
{
  int const stratum = vocab / hot_tokens;
  return j * stratum + int(mix(row_key * 977 + j) % std::uint64_t(stratum));
}

__device__ float boost_of(int i, std::uint64_t row_key, int vocab, bool drafter)
{
  int const stratum = vocab / hot_tokens;
  int const j       = i / stratum;
  if (j >= hot_tokens || hot_id(j, row_key, vocab) != i) { return 0.f; }
  float b = 14.f - 0.35f * float(j);
  if (drafter) { b += 0.8f * noise(row_key * 31 + 7 + j); }
  return b;
}

/// Softmax of synthetic logits into one row per block: p (drafter = false) or q.
__global__ void make_rows(float* out, int vocab, std::uint64_t seed, bool drafter)
{
  std::uint64_t const row_key = blockIdx.x + 1;
  float* row                  = out + std::int64_t(blockIdx.x) * vocab;
  __shared__ float red[256];
  auto logit = [&](int i) {
    return noise(seed ^ (row_key << 20) ^ std::uint64_t(i)) + boost_of(i, row_key, vocab, drafter);
  };
  float m = -1e30f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) { m = fmaxf(m, logit(i)); }
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) { red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); }
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) { sum += expf(logit(i) - m); }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) { red[threadIdx.x] += red[threadIdx.x + s]; }
    __syncthreads();
  }
  sum = red[0];
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) { row[i] = expf(logit(i) - m) / sum; }
}

/// Candidate lists: the hot tokens of each q row with q renormalized over them.
__global__ void make_candidates(float const* q, std::int32_t* ids, float* probs, int vocab)
{
  std::uint64_t const row_key = blockIdx.x + 1;
  __shared__ float total;
  int const j = threadIdx.x;
  int const id = hot_id(j, row_key, vocab);
  float const v = q[std::int64_t(blockIdx.x) * vocab + id];
  if (j == 0) { total = 0.f; }
  __syncthreads();
  atomicAdd(&total, v);
  __syncthreads();
  ids[blockIdx.x * hot_tokens + j]   = id;
  probs[blockIdx.x * hot_tokens + j] = v / total;
}

/// Draft token of node m of request b: a sample of the q row of its parent (Gumbel-max
/// over the vocabulary), or of its candidate list.
__global__ void sample_drafts(float const* q, std::int32_t const* cand_ids, float const* cand_probs,
                              std::int32_t const* parent, std::int32_t* tokens, int rows_q, int vocab,
                              int nodes, int token_stride, int token_offset, std::uint64_t seed)
{
  int const b = blockIdx.x / nodes, m = blockIdx.x % nodes + 1;
  int const row = b * rows_q + parent[m];
  __shared__ float best_v[256];
  __shared__ int best_i[256];
  float bv = -1e30f;
  int bi   = 0;
  if (cand_ids) {
    if (threadIdx.x < hot_tokens) {
      float const u = (float(mix(seed ^ (std::uint64_t(blockIdx.x) << 8) ^ threadIdx.x) >> 40) + 0.5f) * 0x1p-24f;
      bv            = logf(cand_probs[row * hot_tokens + threadIdx.x]) - logf(-logf(u));
      bi            = cand_ids[row * hot_tokens + threadIdx.x];
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      float const u = (float(mix(seed ^ (std::uint64_t(blockIdx.x) << 24) ^ std::uint64_t(i)) >> 40) + 0.5f) * 0x1p-24f;
      float const v = logf(q[std::int64_t(row) * vocab + i]) - logf(-logf(u));
      if (v > bv) {
        bv = v;
        bi = i;
      }
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s && best_v[threadIdx.x + s] > best_v[threadIdx.x]) {
      best_v[threadIdx.x] = best_v[threadIdx.x + s];
      best_i[threadIdx.x] = best_i[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) { tokens[b * token_stride + m - token_offset] = best_i[0]; }
}

/// Read-only streaming bandwidth (GB/s): a reduction over `bytes` of device memory.
__global__ void read_stream(float4 const* data, std::int64_t n, float* sink)
{
  float acc = 0.f;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float4 const v = __ldcs(data + i);
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 1234.5f) { *sink = acc; }  // keeps the loads
}

double measure_read_gbps(std::size_t bytes, cudaStream_t stream)
{
  void* buf = nullptr;
  float* sink = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&buf, bytes));
  DHISPARSE_CUDA_TRY(cudaMalloc(&sink, sizeof(float)));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(buf, 0x3C, bytes, stream));
  int sms = 0;
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto ms = bench::time_ms(stream, 2, 10, [&](int) {
    read_stream<<<sms * 4, 512, 0, stream>>>(static_cast<float4 const*>(buf), std::int64_t(bytes / 16), sink);
  });
  cudaFree(buf);
  cudaFree(sink);
  return double(bytes) / (bench::median(ms) * 1e6);
}

struct config {
  char const* name;
  verify_rule rule;
  draft_topology topo;
  draft_distribution dist;
  bool validate_all;
};

}  // namespace

int main(int argc, char** argv)
{
  bench::options const opt = bench::options::parse(argc, argv);
  int const B = opt.quick ? 64 : 512, d = 8, V = 151552, R = d + 1;
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));

  std::printf("verify benchmark: B = %d, d = %d, V = %d, fp32 p and q, %d candidates, %s, %s\n", B, d, V,
              hot_tokens, bench::device_name().c_str(), bench::today().c_str());
  double const copy_gbps = bench::measure_d2d_copy_gbps(std::size_t(2) << 30, stream);
  double const read_gbps = measure_read_gbps(std::size_t(4) << 30, stream);
  std::printf("HBM: device-to-device copy %.0f GB/s (read + write), read-only stream %.0f GB/s\n", copy_gbps,
              read_gbps);

  // p and q: [B][d+1][V] each (chain q uses the first d rows of each request).
  std::size_t const elems = std::size_t(B) * R * V;
  float *p = nullptr, *q = nullptr, *cprobs = nullptr;
  std::int32_t *cids = nullptr, *chain_tokens = nullptr, *tree_tokens = nullptr, *cand_chain_tokens = nullptr,
               *cand_tree_tokens = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&p, elems * sizeof(float)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&q, elems * sizeof(float)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&cids, std::size_t(B) * R * hot_tokens * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&cprobs, std::size_t(B) * R * hot_tokens * sizeof(float)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&chain_tokens, std::size_t(B) * d * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&cand_chain_tokens, std::size_t(B) * d * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&tree_tokens, std::size_t(B) * R * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&cand_tree_tokens, std::size_t(B) * R * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(tree_tokens, 0, std::size_t(B) * R * sizeof(std::int32_t), stream));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(cand_tree_tokens, 0, std::size_t(B) * R * sizeof(std::int32_t), stream));
  make_rows<<<B * R, 256, 0, stream>>>(p, V, 0x1234, false);
  make_rows<<<B * R, 256, 0, stream>>>(q, V, 0x1234, true);
  make_candidates<<<B * R, hot_tokens, 0, stream>>>(q, cids, cprobs, V);

  // Tree of 8 drafts: 0 → {1, 2}, 1 → {3, 4}, 3 → {5, 6}, 5 → {7}, 7 → {8}.
  std::vector<std::int32_t> const tree_parent{-1, 0, 0, 1, 1, 3, 3, 5, 7};
  std::vector<std::int32_t> const fc{1, 3, -1, 5, -1, 7, -1, 8, -1}, ns{-1, 2, -1, 4, -1, 6, -1, -1, -1};
  std::vector<std::int32_t> chain_parent(R);
  for (int m = 0; m < R; ++m) { chain_parent[m] = m - 1; }
  std::vector<std::int32_t> first_child, next_sibling;
  for (int b = 0; b < B; ++b) {
    first_child.insert(first_child.end(), fc.begin(), fc.end());
    next_sibling.insert(next_sibling.end(), ns.begin(), ns.end());
  }
  std::int32_t *d_fc = nullptr, *d_ns = nullptr, *d_tree_parent = nullptr, *d_chain_parent = nullptr;
  auto upload = [&](std::int32_t*& dst, std::vector<std::int32_t> const& src) {
    DHISPARSE_CUDA_TRY(cudaMalloc(&dst, src.size() * sizeof(std::int32_t)));
    DHISPARSE_CUDA_TRY(cudaMemcpy(dst, src.data(), src.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  };
  upload(d_fc, first_child);
  upload(d_ns, next_sibling);
  upload(d_tree_parent, tree_parent);
  upload(d_chain_parent, chain_parent);
  // Chain q rows are rows 0..d-1 of the [B][d+1][V] buffer: request stride (d+1)·V.
  sample_drafts<<<B * d, 256, 0, stream>>>(q, nullptr, nullptr, d_chain_parent, chain_tokens, R, V, d, d, 1, 11);
  sample_drafts<<<B * d, 256, 0, stream>>>(q, nullptr, nullptr, d_tree_parent, tree_tokens, R, V, d, R, 0, 12);
  sample_drafts<<<B * d, 256, 0, stream>>>(q, cids, cprobs, d_chain_parent, cand_chain_tokens, R, V, d, d, 1, 13);
  sample_drafts<<<B * d, 256, 0, stream>>>(q, cids, cprobs, d_tree_parent, cand_tree_tokens, R, V, d, R, 0, 14);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  DHISPARSE_CUDA_TRY(cudaGetLastError());

  // One {seed, offset} and one byte counter per repetition.
  int const runs = opt.warmup + opt.reps;
  std::vector<std::uint64_t> rng_host;
  for (int i = 0; i < runs; ++i) {
    rng_host.push_back(0xC0FFEEull);
    rng_host.push_back(std::uint64_t(i) + 1);
  }
  std::uint64_t *rng = nullptr, *bytes = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&rng, rng_host.size() * sizeof(std::uint64_t)));
  DHISPARSE_CUDA_TRY(cudaMemcpy(rng, rng_host.data(), rng_host.size() * 8, cudaMemcpyHostToDevice));
  DHISPARSE_CUDA_TRY(cudaMalloc(&bytes, runs * sizeof(std::uint64_t)));
  std::int32_t *accepted = nullptr, *emitted = nullptr, *next = nullptr;
  std::uint32_t* status  = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&accepted, B * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&emitted, std::size_t(B) * R * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&next, B * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&status, sizeof(std::uint32_t)));

  std::vector<config> const configs = {
    {"chain greedy", verify_rule::greedy, draft_topology::chain, draft_distribution::dense, false},
    {"chain dense q", verify_rule::sampling, draft_topology::chain, draft_distribution::dense, false},
    {"chain candidate q", verify_rule::sampling, draft_topology::chain, draft_distribution::candidates, false},
    {"chain one-hot q", verify_rule::sampling, draft_topology::chain, draft_distribution::one_hot, false},
    {"tree greedy", verify_rule::greedy, draft_topology::tree, draft_distribution::dense, false},
    {"tree dense q", verify_rule::sampling, draft_topology::tree, draft_distribution::dense, false},
    {"tree candidate q", verify_rule::sampling, draft_topology::tree, draft_distribution::candidates, false},
    {"tree one-hot q", verify_rule::sampling, draft_topology::tree, draft_distribution::one_hot, false},
    {"chain dense q, validate_all", verify_rule::sampling, draft_topology::chain, draft_distribution::dense, true},
  };

  bench::json_report json("verify");
  json.set("gpu", bench::device_name());
  json.set("date", bench::today());
  json.set("batch", double(B));
  json.set("drafts", double(d));
  json.set("vocab", double(V));
  json.set("candidates", double(hot_tokens));
  json.set("hbm_copy_gbps", copy_gbps);
  json.set("hbm_read_gbps", read_gbps);

  // Kernel shapes: one CTA per request, a cluster per request where the device has them, and
  // for greedy rules the wide path (a workspace). DHISPARSE_VERIFY_SWEEP=1 adds the wide
  // path's longest chunk swept, graph replays, and the fixed cost of a call with an empty batch.
  bool cluster_device = false;
  {
    int device = 0, major = 0;
    DHISPARSE_CUDA_TRY(cudaGetDevice(&device));
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cluster_device = major >= 9;
  }
  bool const sweep      = std::getenv("DHISPARSE_VERIFY_SWEEP") != nullptr;
  bool const tail_sweep = std::getenv("DHISPARSE_VERIFY_TAIL") != nullptr;  // only the later-pass variants
  char const* only      = std::getenv("DHISPARSE_VERIFY_ONLY");               // configurations whose name holds it
  struct variant {
    std::string label;
    int ctas       = 1;      ///< ctas_per_request (the wide path: 0)
    bool wide      = false;  ///< with a workspace
    int max_chunk  = 0;      ///< wide: the longest chunk (0: the library's default)
    bool graph     = false;  ///< timed as replays of a captured graph
    bool empty     = false;  ///< device batch size 0 (the call's fixed cost)
    int ctas_per_sm = 0;     ///< wide: CTAs per SM of a depth launch (0: the library's)
    int unroll      = 0;     ///< wide: 16-byte loads in flight per thread, 4 or 8 (0: the library's)
    int cluster     = 0;     ///< sweep: a cluster of 2 or 4 CTAs per request, launched here
    bool tuned      = false; ///< one CTA per request launched here with `tuning` (and the workspace)
    detail::verify::pass_tuning tuning{};
  };
  std::size_t const ws_bytes = [&] {  // the sampling layout holds the greedy one
    verify_params shape;
    shape.rule       = verify_rule::sampling;
    shape.capacity   = B;
    shape.max_drafts = d;
    shape.vocab      = V;
    return verify_workspace_bytes(shape);
  }();
  void* workspace = nullptr;
  std::int32_t* zero_batch = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&workspace, ws_bytes));
  DHISPARSE_CUDA_TRY(cudaMalloc(&zero_batch, sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMemset(zero_batch, 0, sizeof(std::int32_t)));
  std::printf("wide greedy path: workspace %zu bytes, longest chunk %d elements, %d CTAs per depth, %d B of loads "
              "in flight per thread\n",
              ws_bytes, detail::verify::wide_max_chunk, detail::verify::wide_ctas(), 16 * detail::verify::wide_unroll);

  std::printf("\n%-48s %9s %9s %10s %10s %9s %9s %11s\n", "configuration", "time ms", "accepted", "read MB",
              "read GB/s", "of copy", "of read", "p+q MB");
  for (config const& c : configs) {
    if (only != nullptr && std::string(c.name).find(only) == std::string::npos) { continue; }
    bool const greedy = c.rule == verify_rule::greedy;
    std::vector<variant> variants{{"1 CTA", 1}};
    if (cluster_device) { variants.push_back({"cluster " + std::to_string(verify_cluster_ctas), verify_cluster_ctas}); }
    if (sweep && !greedy && cluster_device) {  // smaller clusters than the library's 8
      for (int const n : {2, 4}) {
        variant w{"cluster " + std::to_string(n) + " (sweep)", 0};
        w.cluster = n;
        variants.push_back(w);
      }
    }
    if ((sweep || tail_sweep) && !greedy) {  // the later passes (pass_tuning): neither, then shared
      {
        variant w{"1 CTA, neither", 1};
        w.tuned = true;
        variants.push_back(w);
      }
      // Shared passes (shared_pass.cuh): from pass 0, 1 (the second) or 2, 2 to 16 groups.
      for (auto const& [from, groups] :
           std::vector<std::pair<int, int>>{{1, 2}, {1, 3}, {1, 4}, {1, 6}, {1, 8}, {1, 16}, {0, 4}, {2, 4}}) {
        variant w{"1 CTA, shared from pass " + std::to_string(from) + ", " + std::to_string(groups) + " groups", 1};
        w.tuned               = true;
        w.tuning.share_from   = from;
        w.tuning.share_groups = groups;
        variants.push_back(w);
      }
    }
    if (greedy) {
      variants.push_back({"wide", 0, true});
      if (sweep) {
        for (int const chunk : {8192, 16384, 32768, 65536}) {
          variants.push_back({"wide, chunk <= " + std::to_string(chunk / 1024) + "K", 0, true, chunk});
        }
        for (int const unroll : {4, 8}) {
          variant w{"wide, " + std::to_string(unroll * 16) + " B in flight per thread", 0, true,
                    detail::verify::wide_max_chunk};
          w.unroll = unroll;
          variants.push_back(w);
        }
        {
          variant w{"wide, 8 CTAs/SM", 0, true, detail::verify::wide_max_chunk};
          w.ctas_per_sm = 8;
          variants.push_back(w);
        }
        if (cluster_device) {
          variants.push_back({"cluster " + std::to_string(verify_cluster_ctas) + ", graph", verify_cluster_ctas, false, 0, true});
        }
        variants.push_back({"wide, graph", 0, true, 0, true});
        variants.push_back({"wide, batch 0", 0, true, 0, false, true});
        variants.push_back({"wide, batch 0, graph", 0, true, 0, true, true});
      }
    }
    for (variant const& v : variants) {
      std::string const name = std::string(c.name) + " [" + v.label + "]";
      bool const tree = c.topo == draft_topology::tree;
      bool const cand = c.dist == draft_distribution::candidates;
      verify_params a;
      a.rule             = c.rule;
      a.topology         = c.topo;
      a.distribution     = c.dist;
      a.capacity         = B;
      a.max_drafts       = d;
      a.vocab            = V;
      a.num_candidates   = cand ? hot_tokens : 0;
      a.draft_tokens     = tree ? (cand ? cand_tree_tokens : tree_tokens) : (cand ? cand_chain_tokens : chain_tokens);
      a.first_child      = tree ? d_fc : nullptr;
      a.next_sibling     = tree ? d_ns : nullptr;
      a.p                = p;
      a.q                = c.dist == draft_distribution::dense ? q : nullptr;
      a.q_request_stride = std::int64_t(R) * V;
      a.candidate_ids    = cand ? cids : nullptr;  // chain rows 0..d-1 of [B][d+1][K]: rows_q = d,
      a.candidate_probs  = cand ? cprobs : nullptr;  // so chain candidates use a packed copy below
      a.validate_all     = c.validate_all;
      a.accepted         = accepted;
      a.emitted          = emitted;
      a.next_token       = next;
      a.status           = status;
      a.ctas_per_request = v.ctas;
      if (v.wide || !greedy) {  // sampling: the workspace lets the library share later passes
        a.workspace       = workspace;
        a.workspace_bytes = ws_bytes;
      }
      if (v.empty) { a.batch_size = zero_batch; }
      std::int32_t* chain_cids = nullptr;
      float* chain_cprobs      = nullptr;
      if (cand && !tree) {
        // Chain candidate rows are [B][d][K]: drop every request's last row.
        DHISPARSE_CUDA_TRY(cudaMalloc(&chain_cids, std::size_t(B) * d * hot_tokens * sizeof(std::int32_t)));
        DHISPARSE_CUDA_TRY(cudaMalloc(&chain_cprobs, std::size_t(B) * d * hot_tokens * sizeof(float)));
        DHISPARSE_CUDA_TRY(cudaMemcpy2D(chain_cids, std::size_t(d) * hot_tokens * 4, cids, std::size_t(R) * hot_tokens * 4,
                                        std::size_t(d) * hot_tokens * 4, B, cudaMemcpyDeviceToDevice));
        DHISPARSE_CUDA_TRY(cudaMemcpy2D(chain_cprobs, std::size_t(d) * hot_tokens * 4, cprobs,
                                        std::size_t(R) * hot_tokens * 4, std::size_t(d) * hot_tokens * 4, B,
                                        cudaMemcpyDeviceToDevice));
        a.candidate_ids   = chain_cids;
        a.candidate_probs = chain_cprobs;
      }
      if (c.dist == draft_distribution::dense && !tree) { a.q_request_stride = std::int64_t(R) * V; }
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(bytes, 0, runs * sizeof(std::uint64_t), stream));
      a.rng                     = rng;  // checked here; each repetition uses its own offset below
      a.bytes_read              = bytes;
      DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(a));
      // One call: verify_async, or for a chunk sweep the wide path's launcher itself with
      // the status cleared as verify_async clears it.
      auto call = [&](verify_params const& r) {
        if (v.cluster > 0) {
          DHISPARSE_EXPECTS(detail::verify::vector_width(r) == 4, "bench: the sweep needs 16-byte loads");
          DHISPARSE_CUDA_TRY(cudaMemsetAsync(r.status, 0, sizeof(std::uint32_t), stream));
          cudaLaunchAttribute attribute{};
          attribute.id               = cudaLaunchAttributeClusterDimension;
          attribute.val.clusterDim.x = unsigned(v.cluster);
          attribute.val.clusterDim.y = 1;
          attribute.val.clusterDim.z = 1;
          cudaLaunchConfig_t config{};
          config.gridDim  = dim3(unsigned(r.capacity * v.cluster));
          config.blockDim = dim3(detail::verify::block_threads);
          config.stream   = stream;
          config.attrs    = &attribute;
          config.numAttrs = 1;
          auto const l    = detail::verify::layout::of(r);
          detail::verify::pass_tuning const t{};
          detail::verify::pass_share const none{};
          DHISPARSE_CUDA_TRY(v.cluster == 2 ? cudaLaunchKernelEx(&config, detail::verify::verify_kernel<4, 2>, r, l, t, none)
                                            : cudaLaunchKernelEx(&config, detail::verify::verify_kernel<4, 4>, r, l, t, none));
        } else if (v.tuned) {
          DHISPARSE_CUDA_TRY(cudaMemsetAsync(r.status, 0, sizeof(std::uint32_t), stream));
          verify_params s   = r;
          s.workspace       = workspace;  // used only when the tuning shares passes
          s.workspace_bytes = ws_bytes;
          DHISPARSE_CUDA_TRY(detail::verify::vector_width(s) == 4 ? detail::verify::launch<4>(s, stream, v.tuning)
                                                                  : detail::verify::launch<1>(s, stream, v.tuning));
        } else if (v.max_chunk > 0) {
          DHISPARSE_EXPECTS(detail::verify::vector_width(r) == 4, "bench: the sweep needs 16-byte loads");
          DHISPARSE_CUDA_TRY(cudaMemsetAsync(r.status, 0, sizeof(std::uint32_t), stream));
          int const ctas = v.ctas_per_sm > 0 ? detail::verify::wide_ctas() / detail::verify::wide_ctas_per_sm * v.ctas_per_sm : 0;
          cudaError_t const launched = v.unroll != 8 ? detail::verify::launch_wide<4, 4>(r, stream, ctas, v.max_chunk)
                                                     : detail::verify::launch_wide<4, 8>(r, stream, ctas, v.max_chunk);
          DHISPARSE_CUDA_TRY(launched);
        } else {
          DHISPARSE_CUDA_TRY(verify_async(r, stream));
        }
      };
      std::vector<double> ms;
      std::vector<std::uint64_t> read(runs);
      if (v.graph) {  // greedy draws no random numbers: one capture, its byte counter shared by the replays
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        call(a);  // warm (first-call queries) outside the capture
        DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
        DHISPARSE_CUDA_TRY(cudaMemsetAsync(bytes, 0, sizeof(std::uint64_t), stream));
        DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        call(a);
        DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
        DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
        ms = bench::time_ms(stream, opt.warmup, opt.reps, [&](int) { DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream)); });
        std::uint64_t total = 0;
        DHISPARSE_CUDA_TRY(cudaMemcpy(&total, bytes, 8, cudaMemcpyDeviceToHost));
        for (auto& x : read) { x = total / std::uint64_t(runs); }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      } else {
        ms = bench::time_ms(stream, opt.warmup, opt.reps, [&](int rep) {
          verify_params r = a;
          r.rng           = rng + 2 * rep;
          r.bytes_read    = bytes + rep;
          call(r);
        });
        DHISPARSE_CUDA_TRY(cudaMemcpy(read.data(), bytes, runs * 8, cudaMemcpyDeviceToHost));
      }
      std::uint32_t bits = 0;
      DHISPARSE_CUDA_TRY(cudaMemcpy(&bits, status, sizeof bits, cudaMemcpyDeviceToHost));
      if (bits != 0) {  // the synthetic inputs are valid: a status bit is a bug, reported and skipped
        std::printf("%-48s status %#x: %s\n", name.c_str(), bits,
                    describe_status(bits, status_format::explained).c_str());
        cudaFree(chain_cids);
        cudaFree(chain_cprobs);
        continue;
      }
      std::vector<std::int32_t> acc(B);
      DHISPARSE_CUDA_TRY(cudaMemcpy(acc.data(), accepted, B * 4, cudaMemcpyDeviceToHost));
      double mean_acc = 0;
      for (int x : acc) { mean_acc += x; }
      mean_acc /= B;
      std::vector<double> gbps;
      double mean_bytes = 0;
      for (int i = 0; i < opt.reps; ++i) {
        gbps.push_back(double(read[opt.warmup + i]) / (ms[i] * 1e6));
        mean_bytes += double(read[opt.warmup + i]) / opt.reps;
      }
      double const med_ms = bench::median(ms), med_gbps = bench::median(gbps);
      double const rows_q = tree ? R : d;
      double const full   = double(B) * R * V * 4 + (c.dist == draft_distribution::dense ? double(B) * rows_q * V * 4 : 0);
      std::printf("%-48s %9.4f %9.2f %10.1f %10.0f %8.1f%% %8.1f%% %11.0f\n", name.c_str(), med_ms, mean_acc,
                  mean_bytes / 1e6, med_gbps, 100 * med_gbps / copy_gbps, 100 * med_gbps / read_gbps, full / 1e6);
      json.add_record();
      json.field("configuration", c.name);
      json.field("variant", v.label);
      json.field("ctas_per_request", double(v.ctas));
      json.field("wide", v.wide ? 1.0 : 0.0);
      json.field("max_chunk", double(v.wide ? (v.max_chunk > 0 ? v.max_chunk : detail::verify::wide_max_chunk) : 0));
      json.field("graph", v.graph ? 1.0 : 0.0);
      json.field("empty_batch", v.empty ? 1.0 : 0.0);
      json.field("ctas_per_sm", double(v.wide ? (v.ctas_per_sm > 0 ? v.ctas_per_sm : detail::verify::wide_ctas_per_sm) : 0));
      json.field("loads_in_flight_per_thread", double(v.wide ? (v.unroll > 0 ? v.unroll : detail::verify::wide_unroll) : 0));
      json.field("median_ms", med_ms);
      json.field("mean_accepted_last_rep", mean_acc);
      json.field("bytes_read_mean", mean_bytes);
      json.field("read_gbps_median", med_gbps);
      json.field("fraction_of_copy_bw", med_gbps / copy_gbps);
      json.field("fraction_of_read_bw", med_gbps / read_gbps);
      json.field("full_p_q_bytes", full);
      cudaFree(chain_cids);
      cudaFree(chain_cprobs);
    }
  }
  std::printf("\n'read' = bytes of p, q and candidate rows the kernel read (its bytes_read counter); 'p+q MB' = "
              "what reading every row would cost. Target (BENCH.md): read GB/s >= 50%% of HBM copy bandwidth.\n");
  json.write(opt.json_path);
  for (void* ptr : std::vector<void*>{p, q, cids, cprobs, chain_tokens, cand_chain_tokens, tree_tokens,
                                      cand_tree_tokens, d_fc, d_ns, d_tree_parent, d_chain_parent, rng, bytes,
                                      accepted, emitted, next, status, workspace, zero_batch}) {
    cudaFree(ptr);
  }
  cudaStreamDestroy(stream);
  return 0;
}
