/**
 * @file bench/serving/runner.cuh
 * @brief `run_mode<Budget>`: one (mode, concurrency) run of the serving benchmark with the
 *        library's real kernels (see docs/serving.md for the loop and what it stands for).
 *
 * The step, as captured (two graphs, so that the per-layer part and the once-per-step part
 * are timed apart):
 * ```
 * graph "layers"                                   (scaled by layers_full / layers_sim)
 *   set_drafts (spec)        each request's d_b from device memory
 *   backup                   side stream, joined before the first resolve (not resident)
 *   for each group g:
 *     gather selections      templates → [B][Q][K] by each request's committed length
 *     indexer stand-in       int8 tensor-core scores over every key, then a top-K pass
 *     resolve (+ retrieve)   fused / split / layered (layer 0 first, the rest on a side
 *                            stream while layer 0 attends)
 *     for each layer l of g:
 *       write tail rows      the "model's" new rows into tail_slots(g)
 *       sparse attention     over slot_table(g), layer_rows(g, l)
 *       dense stand-in       one bf16 GEMM of `dense_mb` weights over B·Q tokens
 * graph "step"                                     (counted once)
 *   drafter GEMM (spec)      `draft_mb` weights over B·Q tokens
 *   LM head GEMM             `lm_head_mb` weights over B·Q tokens
 *   verify (spec)            sampling, chain, constructed p / q, Philox offset advanced
 *   kept = accepted + 1, draft ring advance / rollback (spec)
 *   commit(kept or all)
 *   token accounting (+ output hashes in --check)
 * ```
 * Under the speculation controller (adaptive+spec, `--spec-length controller`) the two
 * graphs are captured once per step shape k = 0 … d (Q = 1 + k queries per request in
 * attention and the dense stand-ins: the longest chain of the step), each shape's cost is
 * measured before the timed steps, and before every timed step the host picks the chain
 * length with `speculation_controller::choose_shape` from the acceptance verify reported
 * two steps earlier and the shape costs (rescaled by the measured time of that step, so
 * they follow the load), uploads the d_b and replays that shape. The host never waits for
 * the step it launched last.
 */
#pragma once

#include "kernels.hpp"
#include "runner.hpp"

#include <dhisparse/draft_ring.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/group_counters.hpp>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/sparse_attention.cuh>
#include <dhisparse/speculation_controller.hpp>
#include <dhisparse/verify.cuh>

DHISPARSE_SPARSE_ATTENTION_EXTERN(dhisparse::row_format::mla_fp8_656);
DHISPARSE_VERIFY_EXTERN();

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace dhisparse::bench::serving {

namespace detail {

/// Events recorded between phases of an eager step; `ms()` sums the gaps by label.
class phase_timer {
 public:
  explicit phase_timer(cudaStream_t stream) : stream_{stream} { mark(""); }
  ~phase_timer()
  {
    for (auto& m : marks_) { cudaEventDestroy(m.second); }
  }
  phase_timer(phase_timer const&)            = delete;
  phase_timer& operator=(phase_timer const&) = delete;

  /// Closes the phase that ran since the previous mark and labels it.
  void mark(std::string const& label)
  {
    cudaEvent_t e = nullptr;
    DHISPARSE_CUDA_TRY(cudaEventCreate(&e));
    DHISPARSE_CUDA_TRY(cudaEventRecord(e, stream_));
    marks_.emplace_back(label, e);
  }

  /// Milliseconds per label (synchronizes), in first-seen order.
  std::vector<std::pair<std::string, double>> ms() const
  {
    std::vector<std::pair<std::string, double>> out;
    if (marks_.empty()) { return out; }
    DHISPARSE_CUDA_TRY(cudaEventSynchronize(marks_.back().second));
    for (std::size_t i = 1; i < marks_.size(); ++i) {
      float t = 0.f;
      DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&t, marks_[i - 1].second, marks_[i].second));
      auto it = std::find_if(out.begin(), out.end(), [&](auto const& p) { return p.first == marks_[i].first; });
      if (it == out.end()) {
        out.emplace_back(marks_[i].first, double(t));
      } else {
        it->second += double(t);
      }
    }
    return out;
  }

 private:
  cudaStream_t stream_;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
};

/// Owning CUDA event.
struct event {
  cudaEvent_t e = nullptr;
  explicit event(unsigned flags = cudaEventDisableTiming) { DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&e, flags)); }
  ~event() { cudaEventDestroy(e); }
  event(event const&)            = delete;
  event& operator=(event const&) = delete;
};

/// Owning graph and its executable.
struct graph {
  cudaGraph_t g      = nullptr;
  cudaGraphExec_t x  = nullptr;
  ~graph()
  {
    if (x != nullptr) { cudaGraphExecDestroy(x); }
    if (g != nullptr) { cudaGraphDestroy(g); }
  }
  template <class F>
  void capture(cudaStream_t stream, F&& work)
  {
    DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      work();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) { cudaGraphDestroy(broken); }
      throw;
    }
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &g));
    DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&x, g, 0));
  }
  void launch(cudaStream_t stream) const { DHISPARSE_CUDA_TRY(cudaGraphLaunch(x, stream)); }
};

inline group_counters sum_counters(std::vector<group_counters> const& v)
{
  group_counters s{};
  for (auto const& c : v) {
    s.selected_rows += c.selected_rows;
    s.fetched_rows += c.fetched_rows;
    s.tail_rows += c.tail_rows;
    s.evicted_rows += c.evicted_rows;
    s.reclaimed_rows += c.reclaimed_rows;
    s.reclaims += c.reclaims;
    s.prewarmed_rows += c.prewarmed_rows;
    s.backed_up_rows += c.backed_up_rows;
  }
  return s;
}

}  // namespace detail

template <class Budget>
run_result run_mode(scenario_setup const& su, device_buffers& db, run_config const& rc)
{
  using fmt       = row_format::mla_fp8_656;
  using hierarchy = kv_hierarchy<fmt, policy::lru, Budget>;
  namespace sa    = sparse_attention;
  constexpr bool resident   = std::is_same_v<Budget, policy::resident_budget>;
  constexpr bool per_request = Budget::kind == budget_kind::per_request;

  auto const t_setup = std::chrono::steady_clock::now();
  options const& opt = *su.opt;
  cudaStream_t const s    = db.stream;
  cudaStream_t const side = db.side;
  int const C  = rc.served;
  int const Q  = rc.queries;
  int const K  = su.sc.top_k;
  int const G  = su.groups;
  int const LG = su.sc.group_layers;
  selection_templates const& tp = *su.templates;

  run_result res;
  res.rc = rc;

  // ---- the hierarchy over the shared pinned host memory ----------------------------------
  hierarchy_config hc;
  hc.group_layers.assign(std::size_t(G), LG);
  hc.max_requests           = C;
  hc.max_batch              = C;
  hc.max_queries            = Q;
  hc.max_top_k              = K;
  hc.max_context            = su.max_capacity;
  hc.device_slots_per_group = su.pool_slots;
  hc.backup_interval_steps  = backup_interval_for(resident, su);
  hc.backup_blocks          = su.opt->backup_blocks;
  hc.order_plans            = su.opt->order_plans >= 0;
  hc.order_plans_min_entries = std::max(su.opt->order_plans, 0);
  hc.host.capacity_pages    = su.host_bytes / su.page_bytes;
  hc.host.tokens_per_page   = 64;
  hc.host.memory            = host_memory::caller;
  hc.host.caller_memory     = su.host_memory;
  hc.host.caller_bytes      = su.host_bytes;
  hc.host.caller_memory_registered = true;
  hierarchy h(hc, s);
  res.slab_bytes = std::size_t(G) * std::size_t(su.pool_slots) * LG * fmt::bytes;

  std::vector<request_id> ids;
  for (int r = 0; r < C; ++r) {
    ids.push_back(request_id(std::uint64_t(r) + 1));
    h.admit(ids.back(), su.len0[std::size_t(r)], s, std::int64_t(su.len0[std::size_t(r)]) + su.tokens_per_request);
  }
  if (su.check) {  // direct-to-host admission: the prefill rows, written where the store puts them
    for (int r = 0; r < C; ++r) {
      for (int g = 0; g < G; ++g) {
        for (int l = 0; l < LG; ++l) {
          for (std::int32_t p = 0; p < su.len0[std::size_t(r)]; ++p) {
            auto* row = reinterpret_cast<std::uint64_t*>(h.host_row(ids[std::size_t(r)], g, l, p));
            for (int w = 0; w < row_words; ++w) { row[w] = row_word(r, g, l, p, w, su.salt); }
          }
        }
      }
    }
  }
  // The state after prefill: resident holds everything, the static budget its most recent
  // H rows, the adaptive budget an equal share of the pool (most recent rows first).
  for (int r = 0; r < C; ++r) {
    std::int32_t const len = su.len0[std::size_t(r)];
    std::int32_t warm      = len;
    if constexpr (per_request) {
      warm = std::min<std::int32_t>(len, std::int32_t(Budget::slots_per_request));
    } else if constexpr (!resident) {
      warm = std::min<std::int32_t>(len, std::int32_t(0.95 * double(su.pool_slots) / C));
    }
    h.prewarm(ids[std::size_t(r)], warm, s);
  }
  std::vector<std::int32_t> const queries(std::size_t(C), Q);
  h.set_batch(ids.data(), queries.data(), C, s);
  step_batch_ref const batch = h.batch_ref();

  // ---- per-run state of the benchmark's own buffers ---------------------------------------
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(db.tokens_total.data(), 0, db.tokens_total.bytes(), s));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(db.step_tokens.data(), 0, db.step_tokens.bytes(), s));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(db.step_index.data(), 0, db.step_index.bytes(), s));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(db.bench_status.data(), 0, db.bench_status.bytes(), s));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(db.attn_status.data(), 0, db.attn_status.bytes(), s));
  DHISPARSE_CUDA_TRY(cudaMemsetAsync(db.hashes.data(), 0, db.hashes.bytes(), s));
  std::uint64_t const rng_init[2] = {opt.seed * 0x9E3779B97F4A7C15ull + 7, 0};
  DHISPARSE_CUDA_TRY(cudaMemcpyAsync(db.rng.data(), rng_init, sizeof rng_init, cudaMemcpyHostToDevice, s));

  int const outputs = su.check ? su.sc.layers_sim : 1;
  auto out_of_layer = [&](int layer) {
    return reinterpret_cast<bf16*>(db.attn_out.data() + (su.check ? std::size_t(layer) * db.attn_out_elems : 0));
  };

  sa::params ap;
  ap.batch       = C;
  ap.num_queries = Q;
  ap.num_heads   = su.sc.heads;
  ap.top_k       = K;
  sa::set_contiguous_strides<fmt>(ap);
  ap.queries       = reinterpret_cast<bf16 const*>(db.attn_queries.data());
  ap.softmax_scale = 1.f / std::sqrt(576.f);
  ap.batch_size    = batch.size;
  ap.num_slots     = su.pool_slots;
  ap.status        = db.attn_status.data();
  ap.lse           = db.attn_lse.data();
  ap.slots         = h.slot_table(0);
  ap.rows          = reinterpret_cast<std::byte const*>(h.layer_rows(0, 0).rows);
  ap.row_stride    = h.layer_rows(0, 0).stride;
  ap.out           = out_of_layer(0);
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(sa::params_problem<fmt>(ap));
    std::size_t const ws = sa::workspace_size<fmt>(ap);
    if (ws > db.attn_workspace.size()) {
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
      db.attn_workspace = device_array<std::byte>(ws);
    }
  }

  std::unique_ptr<draft_ring> ring;
  verify_params v{};
  int const D           = Q - 1;  // drafts of the longest chain
  bool const controlled = rc.spec && opt.spec_length == "controller" && !su.check;
  device_array<std::int32_t> num_drafts;  // [C] d_b of the coming step (controller)
  if (controlled) {
    num_drafts = device_array<std::int32_t>(std::size_t(C));
    std::vector<std::int32_t> const all(std::size_t(C), D);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(num_drafts.data(), all.data(), num_drafts.bytes(), cudaMemcpyHostToDevice, s));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
  }
  if (rc.spec) {
    ring = std::make_unique<draft_ring>(C, 256, 1, 256);
    v.rule         = verify_rule::sampling;
    v.topology     = draft_topology::chain;
    v.distribution = opt.draft_dist == "candidates" ? draft_distribution::candidates : draft_distribution::one_hot;
    v.capacity     = C;
    v.max_drafts   = Q - 1;
    v.vocab        = opt.vocab;
    v.num_candidates  = 16;
    v.batch_size      = batch.size;
    v.draft_tokens    = db.draft_tokens.data();
    v.p               = db.p.data();
    v.p_request_stride = std::int64_t(db.drafts + 1) * opt.vocab;
    v.candidate_ids   = db.cand_ids.data();
    v.candidate_probs = db.cand_probs.data();
    v.rng             = db.rng.data();
    v.accepted        = db.accepted.data();
    v.emitted         = db.emitted.data();
    v.next_token      = db.next_token.data();
    v.status          = db.verify_status.data();
    v.num_drafts      = controlled ? num_drafts.data() : nullptr;
    DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(v));
    DHISPARSE_EXPECTS(Q - 1 == db.drafts, "speculative run: queries must be 1 + drafts");
  }

  auto* x     = db.act_x.data();
  auto* y     = db.act_y.data();
  std::size_t const dense_elems = std::size_t(db.n_dense) * dense_hidden;
  auto sel_of = [&](int g) { return db.selections.data() + std::size_t(g) * su.max_c * su.qmax * K; };

  detail::event backup_fork, backup_done, fork_ev[8], join_ev[8];
  DHISPARSE_EXPECTS(G <= 8, "serving benchmark: at most 8 simulated layer groups");
  fetch_kind const fetch = su.fetch;

  // The union's saving (speculative runs, docs/serving.md): marks [C][max_capacity], an
  // epoch word and two counters, probed before every resolve of the probe steps only.
  bool const probe_union = rc.spec && opt.union_steps > 0 && Q <= 8 && !su.check;
  device_array<std::uint32_t> union_marks;
  device_array<unsigned long long> union_counts;
  if (probe_union) {
    union_marks  = device_array<std::uint32_t>(std::size_t(C) * std::size_t(su.max_capacity) + 1);
    union_counts = device_array<unsigned long long>(2);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(union_marks.data(), 0, union_marks.bytes(), s));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(union_counts.data(), 0, union_counts.bytes(), s));
  }

  // The per-layer part of a step whose longest chain has `k` drafts (queries 1 + k in
  // attention and the dense stand-in). `serial`: everything on the main stream (phase
  // timing). `probe`: the union probe before each resolve (never in a timed or captured step).
  auto layers_part = [&](detail::phase_timer* pt, bool serial, bool probe, int k) {
    auto mark = [&](char const* label) {
      if (pt != nullptr) { pt->mark(label); }
    };
    int const M    = C * (1 + k);  // tokens through the dense stand-in
    ap.num_queries = 1 + k;        // strides stay those of Q queries
    if (controlled) { h.set_drafts(num_drafts.data(), nullptr, s); }
    bool backup_forked = false;
    if constexpr (!resident) {
      if (serial) {
        h.backup(s);
        mark("backup");
      } else {
        DHISPARSE_CUDA_TRY(cudaEventRecord(backup_fork.e, s));
        DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(side, backup_fork.e, 0));
        h.backup(side);
        DHISPARSE_CUDA_TRY(cudaEventRecord(backup_done.e, side));
        backup_forked = true;
      }
    }
    for (int g = 0; g < G; ++g) {
      std::int32_t* sel = sel_of(g);
      launch_gather_selections(batch, tp.rows.data(), tp.start_dev.data(), tp.count, tp.groups, g, tp.tokens, K, sel,
                               db.bench_status.data(), s);
      if (opt.indexer) {
        launch_indexer_scores(batch, db.index_keys.data(), db.key_base.data(), db.index_queries.data(),
                              db.index_weights.data(), su.index_heads, su.index_stride, db.index_scores.data(),
                              db.score_stride, std::int32_t(su.max_capacity + su.qmax), s);
        launch_indexer_topk(batch, db.index_scores.data(), db.score_stride, su.index_stride, K, db.topk_out.data(), s);
      }
      if (backup_forked) {
        DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(s, backup_done.e, 0));
        backup_forked = false;
      }
      mark("select+indexer");
      if (probe) {
        launch_union_probe(batch, h.map().ref(), g, sel, K, union_marks.data() + 1, su.max_capacity,
                           union_marks.data(), union_counts.data(), s);
      }
      bool layered_join = false;
      switch (fetch) {
        case fetch_kind::fused: h.resolve_and_retrieve(g, sel, K, s); break;
        case fetch_kind::split:
          h.resolve(g, sel, K, s);
          h.retrieve(g, s);
          break;
        case fetch_kind::layered:
          h.resolve(g, sel, K, s);
          h.retrieve(g, s, 0, 1);
          if (serial) {
            h.retrieve(g, s, 1, LG);
          } else {
            DHISPARSE_CUDA_TRY(cudaEventRecord(fork_ev[g].e, s));
            DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(side, fork_ev[g].e, 0));
            h.retrieve(g, side, 1, LG);
            DHISPARSE_CUDA_TRY(cudaEventRecord(join_ev[g].e, side));
            layered_join = true;
          }
          break;
      }
      mark("resolve+fetch");
      std::int32_t const* tails = h.tail_slots(g);
      for (int l = 0; l < LG; ++l) {
        int const layer     = g * LG + l;
        layer_view const lv = h.layer_rows(g, l);
        launch_write_tail_rows(batch, tails, lv.rows, lv.stride, g, l, su.salt, s);
        if (layered_join && l == 1) {
          DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(s, join_ev[g].e, 0));
          layered_join = false;
        }
        ap.rows       = lv.rows;
        ap.row_stride = lv.stride;
        ap.slots      = h.slot_table(g);
        ap.out        = out_of_layer(layer);
        DHISPARSE_CUDA_TRY((sa::run<fmt>(ap, db.attn_workspace.data(), db.attn_workspace.size(), s)));
        mark("tail+attention");
        db.gemm.run(db.dense_w.data() + std::size_t(layer) * dense_elems, db.n_dense, dense_hidden, x, M, y, s);
        mark("dense");
      }
      if (layered_join) { DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(s, join_ev[g].e, 0)); }
    }
  };

  // The once-per-step part.
  auto step_part = [&](detail::phase_timer* pt, int k) {
    int const M = C * (1 + k);
    // The drafter proposes this step's chains (none in a step without drafts).
    if (rc.spec && k > 0) { db.gemm.run(db.draft_w.data(), db.n_draft, dense_hidden, x, M, y, s); }
    db.gemm.run(db.lm_w.data(), db.n_lm, dense_hidden, x, M, y, s);
    if (pt != nullptr) { pt->mark("lm-head+drafter"); }
    if (rc.spec) {
      DHISPARSE_CUDA_TRY(verify_async(v, s));
      launch_or_status(db.verify_status.data(), db.bench_status.data(), bench_verify_status, s);
      DHISPARSE_CUDA_TRY(advance_rng_offset_async(db.rng.data(), 1, s));
      launch_kept_from_accepted(batch, db.accepted.data(), db.kept.data(), s);
      ring->advance_async(batch.queries, Q, batch.size, s);
      ring->rollback_async(batch.queries, db.kept.data(), batch.size, s);
      h.commit(db.kept.data(), s);
    } else {
      h.commit(nullptr, s);
    }
    if (su.check) {
      for (int layer = 0; layer < outputs; ++layer) {
        launch_hash(out_of_layer(layer), std::size_t(C) * Q * su.sc.heads * 512 * sizeof(bf16), db.hashes.data(),
                    db.step_index.data(), su.hash_capacity, s);
      }
    }
    launch_count_tokens(batch, rc.spec ? db.kept.data() : nullptr, db.tokens_total.data(), db.step_tokens.data(),
                        db.step_index.data(), su.hash_capacity, s);
    launch_or_status(db.attn_status.data(), db.bench_status.data(), bench_attention_status, s);
    if (pt != nullptr) { pt->mark("verify+commit"); }
  };

  // ---- one eager step (lazy initialisation of cuBLAS and the kernels), then capture -----
  layers_part(nullptr, false, false, D);
  step_part(nullptr, D);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
  res.setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count();

  // Step shapes: k = 0 … D under the controller (the longest chain of the step), else D.
  int const first_shape = controlled ? 0 : D;
  std::vector<detail::graph> g_layers(std::size_t(D + 1)), g_step(std::size_t(D + 1));
  for (int k = first_shape; k <= D; ++k) {
    g_layers[std::size_t(k)].capture(s, [&] { layers_part(nullptr, false, false, k); });
    g_step[std::size_t(k)].capture(s, [&] { step_part(nullptr, k); });
  }
  auto replay = [&](int k) {
    g_layers[std::size_t(k)].launch(s);
    g_step[std::size_t(k)].launch(s);
  };
  for (int i = 0; i < opt.warmup; ++i) { replay(D); }

  struct snapshot {
    std::vector<group_counters> counters;
    unsigned long long tokens = 0;
    std::int32_t step         = 0;
  };
  auto take = [&]() {
    snapshot sn;
    sn.counters.resize(std::size_t(G));
    for (int g = 0; g < G; ++g) { h.read_counters(g, &sn.counters[std::size_t(g)], s); }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&sn.tokens, db.tokens_total.data(), sizeof sn.tokens, cudaMemcpyDeviceToHost, s));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&sn.step, db.step_index.data(), sizeof sn.step, cudaMemcpyDeviceToHost, s));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
    return sn;
  };
  double const scale = double(su.sc.layers_full) / double(su.sc.layers_sim);
  auto set_all_drafts = [&](int k) {
    std::vector<std::int32_t> const all(std::size_t(C), k);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(num_drafts.data(), all.data(), num_drafts.bytes(), cudaMemcpyHostToDevice, s));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
  };

  // ---- the controller's step costs: every shape timed with every request at k drafts ----
  speculation_settings spec_settings;
  spec_settings.max_drafts = D;
  std::vector<double> shape_cost;  // full-model ms per step shape, followed during the run
  if (controlled) {
    detail::event t0(cudaEventDefault), t1(cudaEventDefault), t2(cudaEventDefault);
    res.shape_ms.assign(std::size_t(D + 1), 0.0);
    for (int k = 0; k <= D; ++k) {
      set_all_drafts(k);
      replay(k);  // untimed: the shape's first replay
      for (int i = 0; i < opt.calibration_steps; ++i) {
        DHISPARSE_CUDA_TRY(cudaEventRecord(t0.e, s));
        g_layers[std::size_t(k)].launch(s);
        DHISPARSE_CUDA_TRY(cudaEventRecord(t1.e, s));
        g_step[std::size_t(k)].launch(s);
        DHISPARSE_CUDA_TRY(cudaEventRecord(t2.e, s));
        DHISPARSE_CUDA_TRY(cudaEventSynchronize(t2.e));
        float a = 0.f, b = 0.f;
        DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&a, t0.e, t1.e));
        DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&b, t1.e, t2.e));
        res.shape_ms[std::size_t(k)] += (double(a) * scale + double(b)) / opt.calibration_steps;
      }
    }
    shape_cost     = res.shape_ms;
    res.controlled = true;
    res.shape_steps.assign(std::size_t(D + 1), 0);
  }
  speculation_controller controller(C, spec_settings);

  snapshot const before = take();

  // Host side of the controller: d_b chosen for step i from what verify accepted up to step
  // i − 2 (triple-buffered pinned copies), so the host never waits for the step it launched last.
  int const lag = 3;
  std::vector<dhisparse::detail::pinned_array<std::int32_t>> chosen, accepted_host;
  std::vector<std::unique_ptr<detail::event>> accepted_ready;
  std::vector<std::int32_t> entries(static_cast<std::size_t>(C));
  std::iota(entries.begin(), entries.end(), 0);  // batch entry b = request index b
  if (controlled) {
    for (int j = 0; j < lag; ++j) {
      chosen.emplace_back(std::size_t(C));
      accepted_host.emplace_back(std::size_t(C));
      accepted_ready.push_back(std::make_unique<detail::event>());
    }
  }
  long long drafts_chosen = 0;

  std::vector<cudaEvent_t> ev(std::size_t(opt.steps) * 3);
  for (auto& e : ev) { DHISPARSE_CUDA_TRY(cudaEventCreate(&e)); }
  auto step_full_ms = [&](int i) {  // a finished timed step, full model
    float a = 0.f, b = 0.f;
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&a, ev[3 * std::size_t(i)], ev[3 * std::size_t(i) + 1]));
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&b, ev[3 * std::size_t(i) + 1], ev[3 * std::size_t(i) + 2]));
    return double(a) * scale + double(b);
  };
  std::vector<int> shape_of(std::size_t(opt.steps), D);
  for (int i = 0; i < opt.steps; ++i) {
    int k = D;
    DHISPARSE_CUDA_TRY(cudaEventRecord(ev[3 * std::size_t(i)], s));
    if (controlled) {
      if (i >= lag - 1) {  // step i − 2 is done: its acceptance, and its time rescales the costs
        int const done = i - (lag - 1);
        int const j    = done % lag;
        DHISPARSE_CUDA_TRY(cudaEventSynchronize(accepted_ready[std::size_t(j)]->e));
        for (int b = 0; b < C; ++b) {
          controller.observe(b, chosen[std::size_t(j)].data()[b], accepted_host[std::size_t(j)].data()[b]);
        }
        double const ratio = step_full_ms(done) / shape_cost[std::size_t(shape_of[std::size_t(done)])];
        for (auto& c : shape_cost) { c *= 0.75 + 0.25 * ratio; }
      }
      std::int32_t* nd = chosen[std::size_t(i % lag)].data();
      controller.choose_shape(entries.data(), C, shape_cost.data(), D + 1, speculation_load{}, nd);
      k = *std::max_element(nd, nd + C);
      shape_of[std::size_t(i)] = k;
      for (int b = 0; b < C; ++b) { drafts_chosen += nd[b]; }
      ++res.shape_steps[std::size_t(k)];
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(num_drafts.data(), nd, num_drafts.bytes(), cudaMemcpyHostToDevice, s));
    }
    g_layers[std::size_t(k)].launch(s);
    DHISPARSE_CUDA_TRY(cudaEventRecord(ev[3 * std::size_t(i) + 1], s));
    g_step[std::size_t(k)].launch(s);
    DHISPARSE_CUDA_TRY(cudaEventRecord(ev[3 * std::size_t(i) + 2], s));
    if (controlled) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(accepted_host[std::size_t(i % lag)].data(), db.accepted.data(),
                                         std::size_t(C) * sizeof(std::int32_t), cudaMemcpyDeviceToHost, s));
      DHISPARSE_CUDA_TRY(cudaEventRecord(accepted_ready[std::size_t(i % lag)]->e, s));
    }
  }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
  snapshot const after = take();
  if (controlled) { res.shape_ms_end = shape_cost; }
  for (int i = 0; i < opt.steps; ++i) {
    float a = 0.f, b = 0.f;
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&a, ev[3 * std::size_t(i)], ev[3 * std::size_t(i) + 1]));
    DHISPARSE_CUDA_TRY(cudaEventElapsedTime(&b, ev[3 * std::size_t(i) + 1], ev[3 * std::size_t(i) + 2]));
    res.layers_ms.push_back(double(a));
    res.step_ms.push_back(double(b));
  }
  for (auto e : ev) { cudaEventDestroy(e); }
  if (controlled) {
    res.mean_drafts = double(drafts_chosen) / (double(opt.steps) * C);
    set_all_drafts(D);  // the eager steps below run the longest chains
  }

  // ---- eager, serialized steps with events between phases -------------------------------
  if (opt.phase_steps > 0) {
    detail::phase_timer pt(s);
    for (int i = 0; i < opt.phase_steps; ++i) {
      layers_part(&pt, true, false, D);
      step_part(&pt, D);
    }
    for (auto& [label, ms] : pt.ms()) { res.phases.emplace_back(label, ms / opt.phase_steps); }
  }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));

  // ---- what the timed steps did ------------------------------------------------------------
  auto const c0 = detail::sum_counters(before.counters);
  auto const c1 = detail::sum_counters(after.counters);
  res.tokens    = after.tokens - before.tokens;
  res.selected  = c1.selected_rows - c0.selected_rows;
  res.fetched   = c1.fetched_rows - c0.fetched_rows;
  res.evicted   = c1.evicted_rows - c0.evicted_rows;
  res.reclaimed = c1.reclaimed_rows - c0.reclaimed_rows;
  res.reclaims  = c1.reclaims - c0.reclaims;
  res.backed_up = c1.backed_up_rows - c0.backed_up_rows;
  res.prewarmed = c1.prewarmed_rows;
  double const group_row = double(LG) * double(fmt::bytes);
  res.h2d_bytes          = double(res.fetched) * group_row;
  res.d2h_bytes          = double(res.backed_up) * group_row;

  std::vector<std::int32_t> tokens(std::size_t(su.hash_capacity));
  DHISPARSE_CUDA_TRY(
    cudaMemcpy(tokens.data(), db.step_tokens.data(), tokens.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  for (int i = 0; i < opt.steps; ++i) {
    res.step_tokens.push_back(tokens[std::size_t((before.step + i) % su.hash_capacity)]);
  }
  if (su.check) {
    res.hashes.resize(std::size_t(su.hash_capacity));
    DHISPARSE_CUDA_TRY(cudaMemcpy(res.hashes.data(), db.hashes.data(), res.hashes.size() * sizeof(unsigned long long),
                                  cudaMemcpyDeviceToHost));
    res.all_step_tokens.assign(tokens.begin(), tokens.end());
  }
  // ---- the union's saving: eager steps with the probe, after everything above was read --
  if (probe_union) {
    group_counters before_probe[8], after_probe[8];
    for (int g = 0; g < G; ++g) { h.read_counters(g, &before_probe[g], s); }
    for (int i = 0; i < opt.union_steps; ++i) {
      layers_part(nullptr, true, true, D);
      step_part(nullptr, D);
    }
    for (int g = 0; g < G; ++g) { h.read_counters(g, &after_probe[g], s); }
    unsigned long long counts[2] = {0, 0};
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(counts, union_counts.data(), sizeof counts, cudaMemcpyDeviceToHost, s));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
    res.union_steps           = opt.union_steps;
    res.union_fetched         = counts[0];
    res.per_query_missed      = counts[1];
    for (int g = 0; g < G; ++g) { res.union_resolve_fetched += after_probe[g].fetched_rows - before_probe[g].fetched_rows; }
    if (res.union_resolve_fetched != res.union_fetched) {  // resolve fetches the union, exactly
      res.note += (res.note.empty() ? "" : "; ") + std::string("union probe ") + std::to_string(res.union_fetched) +
                  " rows, resolve fetched " + std::to_string(res.union_resolve_fetched);
    }
  }
  res.hierarchy_status = h.status_sync(s);
  DHISPARSE_CUDA_TRY(
    cudaMemcpy(&res.bench_status, db.bench_status.data(), sizeof res.bench_status, cudaMemcpyDeviceToHost));
  if (ring) {
    DHISPARSE_CUDA_TRY(cudaMemcpy(&res.ring_status, ring->status(), sizeof res.ring_status, cudaMemcpyDeviceToHost));
  }
  return res;
}

}  // namespace dhisparse::bench::serving
