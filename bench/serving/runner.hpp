/**
 * @file bench/serving/runner.hpp
 * @brief What one (mode, concurrency) run of the serving benchmark needs and returns.
 *
 * The driver (serving.cu) builds a `scenario_setup` and the `device_buffers` once per
 * scenario, sized for the largest concurrency; `run_mode<Budget>` (runner.cuh, one
 * translation unit per budget) builds a fresh `kv_hierarchy` over the shared pinned host
 * memory, admits and prewarms the requests, captures the step in two CUDA graphs and
 * times it.
 */
#pragma once

#include "gemm.hpp"
#include "options.hpp"
#include "workload.hpp"

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse::bench::serving {

using dhisparse::detail::device_array;

/// Everything fixed for one scenario (shared by all its runs).
struct scenario_setup {
  scenario sc;
  options const* opt = nullptr;
  int max_c  = 0;   ///< largest concurrency of the sweep (after the host-memory cap)
  int qmax   = 1;   ///< 1, or 1 + drafts when a speculative mode runs
  int groups = 1;   ///< simulated layer groups
  std::int64_t tokens_per_request = 0;  ///< positions a request may grow by in one run
  std::vector<std::int32_t> len0;       ///< [max_c] committed length of request r at admission
  std::int32_t max_capacity = 0;        ///< largest len0 + tokens_per_request
  std::int64_t pool_slots   = 0;        ///< device slots per group (the scaled HBM budget for KV)
  std::size_t page_bytes    = 0;        ///< host store page: 64 tokens × simulated layers × 656 B
  std::size_t host_bytes    = 0;        ///< pinned host memory for the host store
  void* host_memory         = nullptr;  ///< pinned, mapped; shared by every run's host store
  fetch_kind fetch          = fetch_kind::fused;
  bool check                = false;    ///< hash the attention outputs of every step
  std::uint64_t salt        = 0;        ///< row contents (check mode)
  int hash_capacity         = 0;        ///< steps the hash / token arrays hold
  selection_templates const* templates = nullptr;
  int index_heads  = 64;
  int index_stride = 1;  ///< positions per index key
};

/// Device buffers shared by every run of a scenario (sized for max_c × qmax).
struct device_buffers {
  cudaStream_t stream = nullptr;
  cudaStream_t side   = nullptr;
  gemm_engine gemm;
  device_array<std::int32_t> selections;    ///< [groups][max_c][qmax][K]
  device_array<std::int8_t> index_keys;     ///< [rows][128]
  device_array<std::int64_t> key_base;      ///< [max_c] first key row of request b
  device_array<std::int8_t> index_queries;  ///< [max_c][qmax][index_heads][128]
  device_array<float> index_weights;        ///< [index_heads]
  device_array<float> index_scores;         ///< [max_c][qmax][score_stride]
  std::int64_t score_stride = 0;
  device_array<std::int32_t> topk_out;      ///< [max_c][qmax][K]
  device_array<std::uint16_t> attn_queries; ///< bf16 [max_c][qmax][heads][576]
  device_array<std::uint16_t> attn_out;     ///< bf16 [outputs][max_c][qmax][heads][512]
  std::size_t attn_out_elems = 0;           ///< elements of one output
  device_array<float> attn_lse;             ///< [max_c][qmax][heads]
  device_array<std::byte> attn_workspace;
  device_array<std::uint16_t> dense_w;      ///< bf16 [layers][n_dense][hidden]
  int n_dense = 0;
  device_array<std::uint16_t> lm_w;         ///< bf16 [n_lm][hidden]
  int n_lm = 0;
  device_array<std::uint16_t> draft_w;      ///< bf16 [n_draft][hidden]
  int n_draft = 0;
  device_array<std::uint16_t> act_x;        ///< bf16 [max_c · qmax][hidden]
  device_array<std::uint16_t> act_y;        ///< bf16 [max_c · qmax][max n]
  // speculation
  int drafts = 0;
  device_array<std::int32_t> draft_tokens;  ///< [max_c][drafts]
  device_array<float> p;                    ///< [max_c][drafts + 1][vocab]
  device_array<float> p_draft;              ///< [drafts] p(draft token) per position
  device_array<std::int32_t> cand_ids;      ///< [max_c][drafts][16]
  device_array<float> cand_probs;
  device_array<std::int32_t> accepted, emitted, next_token, kept;
  device_array<std::uint32_t> verify_status;
  device_array<std::uint64_t> rng;          ///< {seed, offset}
  // accounting
  device_array<unsigned long long> tokens_total;  ///< [1]
  device_array<std::int32_t> step_tokens;         ///< [hash_capacity]
  device_array<std::int32_t> step_index;          ///< [1]
  device_array<std::uint32_t> bench_status;       ///< [1] bench_status_bit
  device_array<std::uint32_t> attn_status;        ///< [1]
  device_array<unsigned long long> hashes;        ///< [hash_capacity]
};

/// One (mode, concurrency) run.
struct run_config {
  mode m         = mode::adaptive;
  int requested  = 0;  ///< concurrency of the sweep point
  int served     = 0;  ///< requests admitted and batched (resident: capped by HBM)
  int queries    = 1;  ///< Q per request and step
  bool spec      = false;
};

/// What a run measured.
struct run_result {
  run_config rc;
  std::vector<double> layers_ms;  ///< per timed step: the per-layer part (simulated layers)
  std::vector<double> step_ms;    ///< per timed step: the once-per-step part
  std::vector<int> step_tokens;   ///< per timed step: tokens emitted
  unsigned long long tokens = 0;  ///< tokens emitted in the timed steps
  unsigned long long selected = 0, fetched = 0, evicted = 0, reclaimed = 0, reclaims = 0, backed_up = 0,
                     prewarmed = 0;
  double h2d_bytes = 0.0, d2h_bytes = 0.0;  ///< over the timed steps
  /// Speculative runs, over `union_steps` eager steps after the timed ones (docs/serving.md):
  /// rows the union of a request's Q queries misses (what resolve fetches), the sum of each
  /// query's own misses (what Q separate resolves would fetch), and the fetched_rows
  /// counter over the same steps (equal to the first).
  int union_steps = 0;
  unsigned long long union_fetched = 0, per_query_missed = 0, union_resolve_fetched = 0;
  /// adaptive+spec under the speculation controller (docs/serving.md): the measured cost of
  /// a step whose longest chain has k drafts (before the timed steps, and as the controller
  /// had rescaled it by the last timed steps) and what it chose over the timed steps.
  bool controlled = false;
  std::vector<double> shape_ms;      ///< [d + 1] full-model ms per step, longest chain k drafts
  std::vector<double> shape_ms_end;  ///< [d + 1] the same after the timed steps' rescaling
  double mean_drafts = 0.0;          ///< drafts per request and timed step
  std::vector<int> shape_steps;     ///< [d + 1] timed steps whose longest chain had k drafts
  std::vector<std::pair<std::string, double>> phases;  ///< ms per step, eager and serialized
  std::vector<unsigned long long> hashes;              ///< check: per step, all layers' outputs
  std::vector<int> all_step_tokens;                    ///< check: tokens of every step
  std::uint32_t hierarchy_status = 0, bench_status = 0, ring_status = 0;
  std::size_t slab_bytes = 0;     ///< device pool bytes (all groups)
  double setup_s = 0.0;           ///< hierarchy build, admission, prewarm
  std::string note;
};

/// Positions a request is backed for, as the hierarchy rounds them (whole host pages).
inline std::int64_t backed_capacity(std::int64_t capacity, std::int64_t max_context, int tokens_per_page = 64)
{
  return std::min<std::int64_t>((capacity + tokens_per_page - 1) / tokens_per_page * tokens_per_page, max_context);
}

/// Budget floor of one request (slots per group), as admission counts it.
template <class Budget>
std::int64_t request_floor(std::int64_t backed, int queries, int top_k, int backup_interval)
{
  return Budget::floor(budget_inputs{backed, queries, top_k, backup_interval});
}

/// Backup interval of a mode: resident never backs up inside the run.
inline int backup_interval_for(bool resident, scenario_setup const& su)
{
  return resident ? su.hash_capacity + 2 : 1;
}

/// Runs one mode at one concurrency (runner.cuh; instantiated per budget in run_*.cu).
template <class Budget>
run_result run_mode(scenario_setup const& su, device_buffers& db, run_config const& rc);

}  // namespace dhisparse::bench::serving
