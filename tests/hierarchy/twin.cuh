/**
 * @file twin.cuh
 * @brief The GPU hierarchy and its host reference driven side by side, compared after
 *        every resolve: status, slot tables (validity, ownership, exact bytes), tail slots,
 *        per-request misses, resident sets (so every eviction and reclaim decision), the
 *        counters, and the slot accounting (free + owned = limit, no slot twice).
 */
#pragma once

#include <dhisparse/hierarchy.cuh>
#include <dhisparse/host/hierarchy.hpp>

#include "gpu_test.cuh"
#include "workload.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace dhisparse::test {

/// Test-side "model": writes the staged tail rows into the tail slots of a group.
template <int Dummy = 0>
__global__ void write_tails_kernel(std::byte* slab, std::size_t group_row_bytes, std::int32_t const* tail_slots,
                                   std::byte const* rows, int entries)
{
  int const e = blockIdx.x;
  if (e >= entries) { return; }
  std::int32_t const slot = tail_slots[e];
  if (slot < 0) { return; }
  for (std::size_t i = threadIdx.x; i < group_row_bytes; i += blockDim.x) {
    slab[std::size_t(slot) * group_row_bytes + i] = rows[std::size_t(e) * group_row_bytes + i];
  }
}

/// Smaller traces under compute-sanitizer (DHISPARSE_TEST_SMALL=1).
inline int test_scale() { return std::getenv("DHISPARSE_TEST_SMALL") != nullptr ? 1 : 4; }

struct stream_guard {
  cudaStream_t s{};
  stream_guard() { DHISPARSE_CUDA_TRY(cudaStreamCreate(&s)); }
  ~stream_guard() { cudaStreamDestroy(s); }
};

/// How selections are handed to resolve: as an indexer emits them, or sorted.
struct selection_style {
  bool shuffle    = false;  ///< random order within each query
  bool duplicates = false;  ///< some positions listed twice
  bool holes      = false;  ///< -1 entries scattered among the valid ones
};

template <class Row, class Eviction, class Budget>
class twin {
 public:
  using gpu_type = kv_hierarchy<Row, Eviction, Budget>;
  using ref_type = host::kv_hierarchy<Row, Eviction, Budget>;

  twin(hierarchy_config const& c, std::uint64_t salt, cudaStream_t stream)
    : config_{c}, salt_{salt}, stream_{stream}, gpu_{c, stream}, ref_{c}
  {
    auto const on_device      = detail::device_guard{gpu_.device()};  // the test's buffers beside the hierarchy
    std::size_t const entries = c.step_entries();
    d_selections_             = device_vector<std::int32_t>(entries);
    d_scores_                 = device_vector<float>(entries);
    d_accepted_               = device_vector<std::int32_t>(std::size_t(c.max_batch));
    for (int l : c.group_layers) {
      d_tail_rows_.emplace_back(std::size_t(c.max_batch) * c.max_queries * l * Row::bytes);
    }
  }

  gpu_type& gpu() { return gpu_; }
  ref_type& ref() { return ref_; }
  std::map<std::uint64_t, std::int32_t>& lengths() { return lengths_; }
  device_vector<std::int32_t>& d_selections() { return d_selections_; }
  device_vector<std::int32_t>& d_accepted() { return d_accepted_; }
  std::vector<std::uint64_t> const& batch() const { return batch_; }
  selection_style& style() { return style_; }

  /**
   * Runs an operation that may be refused on both sides: both must refuse (with a
   * dhisparse::error) or both succeed. Returns whether they succeeded.
   */
  template <class GpuOp, class RefOp>
  static bool same_outcome(GpuOp&& gpu_op, RefOp&& ref_op)
  {
    std::string gpu_error, ref_error;
    try {
      gpu_op();
    } catch (dhisparse::error const& e) {
      gpu_error = e.what();
    }
    try {
      ref_op();
    } catch (dhisparse::error const& e) {
      ref_error = e.what();
    }
    INFO("gpu: " << gpu_error << " | reference: " << ref_error);
    REQUIRE(gpu_error.empty() == ref_error.empty());
    return gpu_error.empty();
  }

  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    gpu_.admit(request_id{id}, length, stream_, capacity);
    ref_.admit(request_id{id}, length, capacity);
    admitted(id, length);
  }

  /// Adopts the host pages `pages` (their rows already written, in the caller memory both
  /// sides read) for `id` on both sides.
  void adopt(std::uint64_t id, std::int32_t length, std::vector<std::int32_t> const& pages, std::int64_t capacity)
  {
    gpu_.adopt(request_id{id}, length, pages.data(), pages.size(), stream_, capacity);
    ref_.adopt(request_id{id}, length, pages.data(), pages.size(), capacity);
    lengths_[id] = length;
    focus_[id]   = length / 2;
  }

  /// Admits on both sides unless both refuse; a refusal must change nothing.
  bool try_admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    std::int64_t const floors = gpu_.floor_sum();
    std::size_t const pages   = gpu_.store().free_pages();
    if (!same_outcome([&] { gpu_.admit(request_id{id}, length, stream_, capacity); },
                      [&] { ref_.admit(request_id{id}, length, capacity); })) {
      REQUIRE(!gpu_.contains(request_id{id}));
      REQUIRE(gpu_.floor_sum() == floors);
      REQUIRE(gpu_.store().free_pages() == pages);
      return false;
    }
    admitted(id, length);
    return true;
  }

  /// Reserves on both sides unless both refuse.
  bool try_reserve(std::uint64_t id, std::int64_t capacity)
  {
    return same_outcome([&] { gpu_.reserve(request_id{id}, capacity, stream_); },
                        [&] { ref_.reserve(request_id{id}, capacity); });
  }

  /// The prefill rows of an admitted request, written into both host stores.
  void admitted(std::uint64_t id, std::int32_t length)
  {
    for (std::int32_t p = 0; p < length; ++p) {
      for (int g = 0; g < config_.num_groups(); ++g) {
        for (int l = 0; l < config_.group_layers[g]; ++l) {
          truth_row(salt_, id, g, l, p, gpu_.host_row(request_id{id}, g, l, p), Row::bytes);
          truth_row(salt_, id, g, l, p, ref_.host_row(request_id{id}, g, l, p), Row::bytes);
        }
      }
    }
    lengths_[id] = length;
    focus_[id]   = length / 2;
  }

  void release(std::uint64_t id)
  {
    gpu_.release(request_id{id}, stream_);
    ref_.release(request_id{id});
    lengths_.erase(id);
  }

  void set_batch(std::vector<std::uint64_t> const& ids, std::vector<std::int32_t> const& queries)
  {
    batch_   = ids;
    queries_ = queries;
    std::vector<request_id> rid;
    for (auto id : ids) { rid.push_back(request_id{id}); }
    gpu_.set_batch(rid.data(), queries.data(), int(ids.size()), stream_);
    ref_.set_batch(rid.data(), queries.data(), int(ids.size()));
  }

  /// The batch loaded from device memory (`load_batch`): entries whose request repeats an
  /// earlier entry's take no part in the step (0 queries on both sides).
  void load_batch(std::vector<std::uint64_t> const& ids, std::vector<std::int32_t> const& queries)
  {
    std::vector<std::int32_t> raw(1 + 2 * std::size_t(config_.max_batch), 0);
    raw[0]   = std::int32_t(ids.size());
    batch_   = ids;
    queries_ = queries;
    for (std::size_t b = 0; b < ids.size(); ++b) {
      raw[1 + b]                     = gpu_.request_index(request_id{ids[b]});
      raw[1 + config_.max_batch + b] = queries[b];
      if (std::find(ids.begin(), ids.begin() + std::ptrdiff_t(b), ids[b]) != ids.begin() + std::ptrdiff_t(b)) {
        queries_[b] = 0;
      }
    }
    device_vector<std::int32_t> d_raw(raw);
    gpu_.load_batch(d_raw.data(), stream_);
    ref_.load_batch(raw.data());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));  // d_raw is freed here
  }

  void set_pool_limit(int group, std::int64_t limit)
  {
    gpu_.set_pool_limit(group, limit, stream_);
    ref_.set_pool_limit(group, limit);
    check_pool(group);
    check_resident_bytes(group);
  }

  void reclaim(int group, std::int32_t free_slots)
  {
    gpu_.reclaim(group, free_slots, stream_);
    ref_.reclaim(group, free_slots);
    check_pool(group);
  }

  void prewarm(std::uint64_t id, std::int32_t count)
  {
    gpu_.prewarm(request_id{id}, count, stream_);
    ref_.prewarm(request_id{id}, count);
    for (int g = 0; g < config_.num_groups(); ++g) {
      check_pool(g);
      check_resident_bytes(g);
    }
  }

  /// Host-side tail rows of every batch entry for group g, staged for the GPU model.
  void stage_tails(int g)
  {
    std::size_t const grb = std::size_t(config_.group_layers[g]) * Row::bytes;
    std::vector<std::byte> rows(std::size_t(config_.max_batch) * config_.max_queries * grb);
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      for (int j = 0; j < queries_[b]; ++j) {
        auto const row =
          truth_group_row(salt_, batch_[b], g, config_.group_layers[g], Row::bytes, lengths_[batch_[b]] + j);
        std::copy(row.begin(), row.end(), rows.begin() + (b * config_.max_queries + j) * grb);
      }
    }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_tail_rows_[g].data(), rows.data(), rows.size(), cudaMemcpyHostToDevice,
                                       stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    ref_tail_rows_[g] = std::move(rows);
  }

  /// Stages `rows` ([max_batch][max_queries][group row], host memory) as group g's tail rows
  /// on both sides, instead of the truth of position length + j that `stage_tails` stages.
  void stage_tail_rows(int g, std::vector<std::byte> rows)
  {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_tail_rows_[g].data(), rows.data(), rows.size(), cudaMemcpyHostToDevice,
                                       stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    ref_tail_rows_[g] = std::move(rows);
  }

  /// Enqueues the GPU model's tail writes for group g (capturable).
  void write_tails_gpu(int g)
  {
    auto const on_device = detail::device_guard{gpu_.device()};  // a launch needs the stream's device current
    auto const view      = gpu_.layer_rows(g, 0);
    int const entries = config_.max_batch * config_.max_queries;
    write_tails_kernel<<<entries, 128, 0, stream_>>>(view.rows, view.stride, gpu_.tail_slots(g),
                                                     d_tail_rows_[g].data(), entries);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }

  void write_tails_ref(int g)
  {
    auto const view  = ref_.layer_rows(g, 0);
    auto const& rows = ref_tail_rows_[g];
    for (int e = 0; e < config_.max_batch * config_.max_queries; ++e) {
      std::int32_t const slot = ref_.tail_slots(g)[e];
      if (slot < 0) { continue; }
      std::copy_n(rows.begin() + std::size_t(e) * view.stride, view.stride, view.rows + std::size_t(slot) * view.stride);
    }
  }

  /// Random selections for every batch entry and query, in the twin's selection style.
  std::vector<std::int32_t> make_selections(std::mt19937_64& rng, int top_k)
  {
    std::vector<std::int32_t> sel(std::size_t(config_.max_batch) * config_.max_queries * top_k, -1);
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      std::int32_t& focus    = focus_[batch_[b]];
      std::int32_t const len = lengths_[batch_[b]];
      focus                  = std::clamp<std::int32_t>(focus + std::int32_t(rng() % 61) - 30, 0, len);
      for (int q = 0; q < queries_[b]; ++q) {
        std::int32_t* query = sel.data() + (b * config_.max_queries + q) * top_k;
        make_selection(rng, len, q, top_k, focus, query);
        restyle(rng, query, top_k);
      }
    }
    return sel;
  }

  /// Random scores (same shape), for policies that use them.
  std::vector<float> make_scores(std::mt19937_64& rng, std::size_t n)
  {
    std::vector<float> s(n);
    std::normal_distribution<float> d(0.f, 2.f);
    for (auto& v : s) { v = d(rng); }
    return s;
  }

  /// Resolve + retrieve of group g on both sides, compared.
  void resolve(int g, std::vector<std::int32_t> const& sel, int top_k)
  {
    d_selections_.upload_prefix(sel);
    float const* d_scores = nullptr;
    std::vector<float> scores;
    if constexpr (Eviction::needs_scores || Eviction::counts_selections) {
      scores = make_scores(score_rng_, sel.size());
      d_scores_.upload_prefix(scores);
      d_scores = d_scores_.data();
    }
    bool ordered = false;        // the GPU plan was sorted by host address (order_plans)
    if (fuse_rng_() % 2 == 0) {  // both paths: resolve then retrieve, and the fused launch
      gpu_.resolve(g, d_selections_.data(), top_k, stream_, d_scores);
      int const layers = config_.group_layers[g];
      if (layers > 1 && fuse_rng_() % 3 == 0) {  // layer 0, then the rest: one plan, two copies
        gpu_.retrieve(g, stream_, 0, 1);
        gpu_.retrieve(g, stream_, 1, layers);
      } else {
        gpu_.retrieve(g, stream_);
      }
      ordered = config_.order_plans;
    } else {
      gpu_.resolve_and_retrieve(g, d_selections_.data(), top_k, stream_, d_scores);
    }
    ref_.resolve(g, sel.data(), top_k, scores.empty() ? nullptr : scores.data());
    ref_.retrieve(g);
    compare(g, sel, top_k, ordered);
  }

  /// One eager step over all groups; `accepted` = null keeps every tail.
  void step(std::mt19937_64& rng, int top_k, std::vector<std::int32_t> const* accepted, bool backup)
  {
    for (int g = 0; g < config_.num_groups(); ++g) {
      resolve(g, make_selections(rng, top_k), top_k);
      stage_tails(g);
      write_tails_gpu(g);
      write_tails_ref(g);
    }
    finish_step(accepted, backup);
  }

  void finish_step(std::vector<std::int32_t> const* accepted, bool backup)
  {
    if (accepted != nullptr) {
      d_accepted_.upload_prefix(*accepted);
      gpu_.commit(d_accepted_.data(), stream_);
      ref_.commit(accepted->data());
    } else {
      gpu_.commit(nullptr, stream_);
      ref_.commit(nullptr);
    }
    if (backup) {
      gpu_backup();
      ref_.backup();
    }
    advance_lengths(accepted);
    REQUIRE(gpu_.status_sync(stream_) == ref_.status());
    for (int g = 0; g < config_.num_groups(); ++g) {
      check_counters(g);
      check_pool(g);
    }
  }

  /**
   * The (resolve, retrieve, model writes its tails) part of a step, every group, captured
   * once in a CUDA graph over fixed selection buffers and replayed with new selections;
   * commit and backup stay the caller's. `fused`: resolve_and_retrieve instead.
   */
  class layers_graph {
   public:
    layers_graph(twin& t, int top_k, bool fused = false) : t_{t}, top_k_{top_k}
    {
      int const groups = t.config_.num_groups();
      for (int g = 0; g < groups; ++g) { d_sel_.emplace_back(t.config_.step_entries()); }
      DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(t.stream_, cudaStreamCaptureModeThreadLocal));
      for (int g = 0; g < groups; ++g) {
        if (fused) {
          t.gpu_.resolve_and_retrieve(g, d_sel_[g].data(), top_k, t.stream_);
        } else {
          t.gpu_.resolve(g, d_sel_[g].data(), top_k, t.stream_);
          t.gpu_.retrieve(g, t.stream_);
        }
        t.write_tails_gpu(g);
      }
      DHISPARSE_CUDA_TRY(cudaStreamEndCapture(t.stream_, &graph_));
      DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec_, graph_, 0));
    }
    layers_graph(layers_graph const&)            = delete;
    layers_graph& operator=(layers_graph const&) = delete;
    ~layers_graph()
    {
      cudaGraphExecDestroy(exec_);
      cudaGraphDestroy(graph_);
    }

    /// One replay with fresh selections, compared group by group with the reference.
    void replay(std::mt19937_64& rng)
    {
      int const groups = t_.config_.num_groups();
      std::vector<std::vector<std::int32_t>> sel;
      for (int g = 0; g < groups; ++g) {
        sel.push_back(t_.make_selections(rng, top_k_));
        d_sel_[g].upload_prefix(sel.back());
        t_.stage_tails(g);
      }
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec_, t_.stream_));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(t_.stream_));
      for (int g = 0; g < groups; ++g) {
        t_.ref_.resolve(g, sel[g].data(), top_k_);
        t_.ref_.retrieve(g);
        t_.compare(g, sel[g], top_k_);
        t_.write_tails_ref(g);
      }
    }

   private:
    twin& t_;
    int top_k_;
    std::vector<device_vector<std::int32_t>> d_sel_;
    cudaGraph_t graph_{};
    cudaGraphExec_t exec_{};
  };

  /// The committed lengths after a commit (an invalid count keeps nothing).
  void advance_lengths(std::vector<std::int32_t> const* accepted)
  {
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      std::int32_t keep = accepted != nullptr ? (*accepted)[b] : queries_[b];
      if (keep < 0 || keep > queries_[b]) { keep = 0; }
      lengths_[batch_[b]] += keep;
    }
  }

  /// GPU and reference agree on everything observable after resolve + retrieve of g.
  /// `ordered`: the plan went through `order_plans`' sort (host address order is checked).
  void compare(int g, std::vector<std::int32_t> const& sel, int top_k, bool ordered = false)
  {
    REQUIRE(gpu_.status_sync(stream_) == ref_.status());
    std::size_t const entries = std::size_t(config_.max_batch) * config_.max_queries * top_k;
    std::vector<std::int32_t> table(entries);
    DHISPARSE_CUDA_TRY(cudaMemcpy(table.data(), gpu_.slot_table(g), entries * 4, cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> tails(std::size_t(config_.max_batch) * config_.max_queries);
    DHISPARSE_CUDA_TRY(cudaMemcpy(tails.data(), gpu_.tail_slots(g), tails.size() * 4, cudaMemcpyDeviceToHost));
    auto const pool = download_pool(g);
    std::int32_t plan_count = 0;
    auto const plan         = gpu_.plan_ref(g);
    DHISPARSE_CUDA_TRY(cudaMemcpy(&plan_count, plan.count, 4, cudaMemcpyDeviceToHost));
    std::vector<miss_entry> plan_entries(std::size_t(std::max(plan_count, 0)));
    DHISPARSE_CUDA_TRY(cudaMemcpy(plan_entries.data(), plan.entries, plan_entries.size() * sizeof(miss_entry),
                                  cudaMemcpyDeviceToHost));

    std::int32_t const* ref_table = ref_.slot_table(g);
    int const layers              = config_.group_layers[g];
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      std::int32_t const len   = lengths_[batch_[b]];
      std::int32_t const index = gpu_.request_index(request_id{batch_[b]});
      for (int q = 0; q < config_.max_queries; ++q) {
        for (int k = 0; k < top_k; ++k) {
          std::size_t const i = (b * config_.max_queries + q) * top_k + k;
          INFO("group " << g << " entry b=" << b << " q=" << q << " k=" << k << " position " << sel[i]);
          REQUIRE((table[i] >= 0) == (ref_table[i] >= 0));
          if (table[i] < 0) { continue; }
          REQUIRE(table[i] < pool.num_slots);
          REQUIRE(pool.owner[table[i]] == index);  // never another request's row
          if (sel[i] >= len) {                     // a tail row of this step
            REQUIRE(table[i] == tails[b * config_.max_queries + (sel[i] - len)]);
            continue;
          }
          REQUIRE(pool.position[table[i]] == sel[i]);
          auto const want = truth_group_row(salt_, batch_[b], g, layers, Row::bytes, sel[i]);
          REQUIRE(std::memcmp(pool.slab.data() + std::size_t(table[i]) * pool.row_bytes, want.data(), want.size()) ==
                  0);
        }
      }
      for (int j = 0; j < config_.max_queries; ++j) {
        REQUIRE((tails[b * config_.max_queries + j] >= 0) == (ref_.tail_slots(g)[b * config_.max_queries + j] >= 0));
      }
    }
    // Misses: the same positions per request, each once, from the right host row.
    std::map<int, std::multiset<std::int32_t>> gpu_miss, ref_miss;
    for (auto const& e : plan_entries) {
      REQUIRE(e.slot >= 0);
      REQUIRE(e.src != nullptr);
      gpu_miss[pool.owner[e.slot]].insert(e.position);
    }
    for (auto const& m : ref_.misses(g)) { ref_miss[m.request].insert(m.position); }
    REQUIRE(gpu_miss == ref_miss);
    if (ordered && plan_count >= config_.order_plans_min_entries) {
      auto const by_address = [](miss_entry const& a, miss_entry const& b) {
        return std::tie(a.src, a.slot, a.position) < std::tie(b.src, b.slot, b.position);
      };
      REQUIRE(std::is_sorted(plan_entries.begin(), plan_entries.end(), by_address));
    }
    check_residency(g, pool);
    check_resident_bytes(g, pool);
  }

  /// The same positions resident per request: every eviction and reclaim decision matches.
  void check_residency(int g) { check_residency(g, download_pool(g)); }

  /// Every resident committed row holds its exact bytes (prewarm, relocation, retrieve).
  void check_resident_bytes(int g) { check_resident_bytes(g, download_pool(g)); }

  /// Slot accounting: free + owned = limit; no slot twice; nothing at or above the limit.
  void check_pool(int g)
  {
    auto const p             = gpu_.pool_ref(g);
    std::int32_t const limit = download_scalar(p.limit);
    std::int32_t const free  = download_scalar(p.free_count);
    REQUIRE(limit == gpu_.pool_limit(g));
    auto const owner = download(p.owner, std::size_t(p.num_slots));
    auto const stack = download(p.free_stack, std::size_t(std::max(free, 0)));
    auto const owned = download(p.owned_count, std::size_t(config_.max_requests));
    std::int64_t owned_slots = 0;
    for (std::int32_t s = 0; s < p.num_slots; ++s) {
      if (owner[s] >= 0) {
        REQUIRE(s < limit);
        ++owned_slots;
      }
    }
    std::set<std::int32_t> distinct(stack.begin(), stack.end());
    REQUIRE(distinct.size() == stack.size());
    for (std::int32_t s : stack) {
      REQUIRE(s >= 0);
      REQUIRE(s < limit);
      REQUIRE(owner[s] == -1);
    }
    REQUIRE(owned_slots + free == limit);
    REQUIRE(std::accumulate(owned.begin(), owned.end(), std::int64_t{0}) == owned_slots);
    // Every row's eviction key is at least its slot's key floor (reclaim skips the slots
    // whose floor lies above its bound).
    auto const position = download(p.position, std::size_t(p.num_slots));
    auto const state    = download(p.state, std::size_t(p.num_slots));
    auto const chunks   = std::size_t((p.num_slots + (1 << key_floor_shift) - 1) >> key_floor_shift);
    auto const floors   = download(p.key_floor, chunks);
    for (std::int32_t s = 0; s < p.num_slots; ++s) {
      if (owner[s] < 0 || position[s] < 0) { continue; }
      INFO("slot " << s << " position " << position[s]);
      std::uint32_t const least = floors[std::size_t(s >> key_floor_shift)];
      REQUIRE(key_floor_of(Eviction::eviction_key(state[s], position[s])) >= least);
    }
    REQUIRE(owned_slots == ref_.owned_slots(g));
    REQUIRE(free == ref_.free_slots(g));
    // Per request: the same slots owned, the same spare slots.
    auto const spares = download(p.spare_count, std::size_t(config_.max_requests));
    for (auto const& [id, len] : lengths_) {
      std::int32_t const r = gpu_.request_index(request_id{id});
      INFO("request " << id << " group " << g);
      REQUIRE(owned[std::size_t(r)] == ref_.owned_slots(request_id{id}, g));
      REQUIRE(spares[std::size_t(r)] == ref_.spare_slots(request_id{id}, g));
    }
  }

  void check_counters(int g)
  {
    group_counters got{};
    gpu_.read_counters(g, &got, stream_);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    auto const& want = ref_.counters(g);
    REQUIRE(got.selected_rows == want.selected_rows);
    REQUIRE(got.fetched_rows == want.fetched_rows);
    REQUIRE(got.tail_rows == want.tail_rows);
    REQUIRE(got.evicted_rows == want.evicted_rows);
    REQUIRE(got.reclaimed_rows == want.reclaimed_rows);
    REQUIRE(got.reclaims == want.reclaims);
    REQUIRE(got.prewarmed_rows == want.prewarmed_rows);
    // A reader of a shared host store copies nothing: its writer backs the rows up.
    REQUIRE(got.backed_up_rows == (gpu_.host_reader() ? 0 : want.backed_up_rows));
  }

  /// A reader of a shared host store: the event its backups wait for (the writer's last
  /// `backup`), set before each step that backs up.
  void wait_host_before_backup(cudaEvent_t writer_backup) { host_event_ = writer_backup; }
  /// The event the last backup returned (a writer's; nullptr otherwise).
  cudaEvent_t last_backup() const { return last_backup_; }

  /// The GPU side's backup; a reader first waits for its writer's.
  void gpu_backup()
  {
    if (gpu_.host_reader()) { gpu_.wait_host(host_event_, stream_); }
    last_backup_ = gpu_.backup(stream_);
  }

  /// After a final backup: every committed row of every live request reads back exactly
  /// from the GPU's host store.
  void check_host_store()
  {
    gpu_backup();
    ref_.backup();
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    for (auto const& [id, len] : lengths_) {
      for (std::int32_t p = 0; p < len; ++p) {
        for (int g = 0; g < config_.num_groups(); ++g) {
          auto const want = truth_group_row(salt_, id, g, config_.group_layers[g], Row::bytes, p);
          INFO("request " << id << " group " << g << " position " << p);
          REQUIRE(std::memcmp(gpu_.host_row(request_id{id}, g, 0, p), want.data(), want.size()) == 0);
        }
      }
    }
  }

 private:
  struct pool_copy {
    std::int32_t num_slots;
    std::size_t row_bytes;
    std::vector<std::int32_t> owner, position;
    std::vector<std::byte> slab;
  };

  template <class T>
  static std::vector<T> download(T const* p, std::size_t n)
  {
    std::vector<T> v(n);
    if (n > 0) { DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost)); }
    return v;
  }
  template <class T>
  static T download_scalar(T const* p)
  {
    return download(p, 1)[0];
  }

  pool_copy download_pool(int g)
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    auto const p = gpu_.pool_ref(g);
    pool_copy c{p.num_slots, p.group_row_bytes, download(p.owner, std::size_t(p.num_slots)),
                download(p.position, std::size_t(p.num_slots)),
                download(p.slab, std::size_t(p.num_slots) * p.group_row_bytes)};
    return c;
  }

  void check_residency(int g, pool_copy const& pool)
  {
    std::map<int, std::vector<std::int32_t>> gpu_res;
    for (std::int32_t s = 0; s < pool.num_slots; ++s) {
      if (pool.owner[s] >= 0 && pool.position[s] >= 0) { gpu_res[pool.owner[s]].push_back(pool.position[s]); }
    }
    for (auto const& [id, len] : lengths_) {
      auto gres = gpu_res[gpu_.request_index(request_id{id})];
      std::sort(gres.begin(), gres.end());
      INFO("request " << id << " group " << g);
      REQUIRE(gres == ref_.resident_positions(request_id{id}, g));
    }
  }

  void check_resident_bytes(int g, pool_copy const& pool)
  {
    std::map<int, std::uint64_t> id_of;
    for (auto const& [id, len] : lengths_) { id_of[gpu_.request_index(request_id{id})] = id; }
    for (std::int32_t s = 0; s < pool.num_slots; ++s) {
      if (pool.owner[s] < 0 || pool.position[s] < 0) { continue; }
      auto const it = id_of.find(pool.owner[s]);
      REQUIRE(it != id_of.end());
      if (pool.position[s] >= lengths_[it->second]) { continue; }  // a tail row not yet written
      auto const want =
        truth_group_row(salt_, it->second, g, config_.group_layers[g], Row::bytes, pool.position[s]);
      INFO("slot " << s << " request " << it->second << " position " << pool.position[s]);
      REQUIRE(std::memcmp(pool.slab.data() + std::size_t(s) * pool.row_bytes, want.data(), want.size()) == 0);
    }
  }

  /// Shuffles, duplicates and punches -1 holes into one query's sorted selection.
  void restyle(std::mt19937_64& rng, std::int32_t* query, int top_k)
  {
    int n = 0;
    while (n < top_k && query[n] >= 0) { ++n; }
    if (style_.duplicates && n > 1) {
      for (int k = n; k < top_k && k < n + 3; ++k) { query[k] = query[rng() % n]; }
      n = std::min(top_k, n + 3);
      for (int i = 0; i < 3 && n > 1; ++i) { query[rng() % n] = query[rng() % n]; }
    }
    if (style_.holes) {
      for (int i = 0; i < 3 && n > 0; ++i) { query[rng() % n] = -1; }
    }
    if (style_.shuffle) { std::shuffle(query, query + top_k, rng); }
  }

  hierarchy_config config_;
  std::uint64_t salt_;
  cudaStream_t stream_;
  gpu_type gpu_;
  ref_type ref_;
  selection_style style_{};
  std::mt19937_64 score_rng_{12345};
  std::mt19937_64 fuse_rng_{54321};
  device_vector<std::int32_t> d_selections_, d_accepted_;
  device_vector<float> d_scores_;
  std::vector<device_vector<std::byte>> d_tail_rows_;  // per group
  std::map<int, std::vector<std::byte>> ref_tail_rows_;
  std::map<std::uint64_t, std::int32_t> lengths_, focus_;
  std::vector<std::uint64_t> batch_;
  std::vector<std::int32_t> queries_;
  cudaEvent_t host_event_  = nullptr;
  cudaEvent_t last_backup_ = nullptr;
};

}  // namespace dhisparse::test
