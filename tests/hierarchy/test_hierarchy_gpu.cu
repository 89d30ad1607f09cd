// kv_hierarchy on the GPU against its host reference, step by step: the same hits,
// misses and evictions, exact bytes in every slot handed to attention, exact rows in the
// host store after backup; CUDA-graph replay; bad inputs.
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/host/hierarchy.hpp>

#include "gpu_test.cuh"
#include "random.hpp"
#include "workload.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

using namespace dhisparse;

namespace {

constexpr int budget = 512;
constexpr int K      = 128;

/// Test-side "model": writes the staged tail rows into the tail slots of a group.
template <int Dummy = 0>
__global__ void write_tails_kernel(std::byte* slab, std::size_t group_row_bytes,
                                   std::int32_t const* tail_slots, std::byte const* rows, int entries)
{
  int const e = blockIdx.x;
  if (e >= entries) { return; }
  std::int32_t const slot = tail_slots[e];
  if (slot < 0) { return; }
  for (std::size_t i = threadIdx.x; i < group_row_bytes; i += blockDim.x) {
    slab[std::size_t(slot) * group_row_bytes + i] = rows[std::size_t(e) * group_row_bytes + i];
  }
}

std::size_t test_scale()
{
  // Smaller traces under compute-sanitizer (DHISPARSE_TEST_SMALL=1).
  return std::getenv("DHISPARSE_TEST_SMALL") != nullptr ? 1 : 4;
}

hierarchy_config twin_config(int max_queries, host_memory memory)
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = 6;
  c.max_batch              = 6;
  c.max_queries            = max_queries;
  c.max_top_k              = K;
  c.max_context            = 8192;
  c.device_slots_per_group = 6 * budget + 64;
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 32;
  c.host.capacity_pages    = 6 * 8192 / 32;
  c.host.memory            = memory;
  return c;
}

/**
 * Runs the GPU hierarchy and the host reference side by side and compares them after
 * every resolve: status, slot-table validity, slot contents (truth bytes), tail slots,
 * per-request misses and resident sets.
 */
template <class Row>
class twin {
 public:
  using gpu_type = kv_hierarchy<Row, policy::lru, policy::static_budget<budget>>;
  using ref_type = host::kv_hierarchy<Row, policy::lru, policy::static_budget<budget>>;

  twin(hierarchy_config const& c, std::uint64_t salt, cudaStream_t stream)
    : config_{c}, salt_{salt}, stream_{stream}, gpu_{c, stream}, ref_{c}
  {
    std::size_t const entries = c.step_entries();
    d_selections_             = test::device_vector<std::int32_t>(entries);
    d_accepted_               = test::device_vector<std::int32_t>(std::size_t(c.max_batch));
    for (int l : c.group_layers) {
      d_tail_rows_.emplace_back(std::size_t(c.max_batch) * c.max_queries * l * Row::bytes);
    }
  }

  gpu_type& gpu() { return gpu_; }
  ref_type& ref() { return ref_; }

  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    gpu_.admit(request_id{id}, length, stream_, capacity);
    ref_.admit(request_id{id}, length, capacity);
    for (std::int32_t p = 0; p < length; ++p) {
      for (int g = 0; g < config_.num_groups(); ++g) {
        for (int l = 0; l < config_.group_layers[g]; ++l) {
          test::truth_row(salt_, id, g, l, p, gpu_.host_row(request_id{id}, g, l, p), Row::bytes);
          test::truth_row(salt_, id, g, l, p, ref_.host_row(request_id{id}, g, l, p), Row::bytes);
        }
      }
    }
    lengths_[id] = length;
  }

  void release(std::uint64_t id)
  {
    gpu_.release(request_id{id}, stream_);
    ref_.release(request_id{id});
    lengths_.erase(id);
  }

  void set_batch(std::vector<std::uint64_t> const& ids, std::vector<std::int32_t> const& queries)
  {
    batch_ = ids;
    queries_ = queries;
    std::vector<request_id> rid;
    for (auto id : ids) { rid.push_back(request_id{id}); }
    gpu_.set_batch(rid.data(), queries.data(), int(ids.size()), stream_);
    ref_.set_batch(rid.data(), queries.data(), int(ids.size()));
  }

  /// Host-side tail rows of batch entry b, query j, group g, staged for the GPU model.
  void stage_tails(int g)
  {
    std::size_t const grb = std::size_t(config_.group_layers[g]) * Row::bytes;
    std::vector<std::byte> rows(std::size_t(config_.max_batch) * config_.max_queries * grb);
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      for (int j = 0; j < queries_[b]; ++j) {
        auto const row = test::truth_group_row(salt_, batch_[b], g, config_.group_layers[g],
                                               Row::bytes, lengths_[batch_[b]] + j);
        std::copy(row.begin(), row.end(), rows.begin() + (b * config_.max_queries + j) * grb);
      }
    }
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_tail_rows_[g].data(), rows.data(), rows.size(),
                                       cudaMemcpyHostToDevice, stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    ref_tail_rows_[g] = std::move(rows);
  }

  /// Enqueues the GPU model's tail writes for group g (capturable).
  void write_tails_gpu(int g)
  {
    auto const view = gpu_.layer_rows(g, 0);
    int const entries = config_.max_batch * config_.max_queries;
    write_tails_kernel<<<entries, 128, 0, stream_>>>(view.rows, view.stride, gpu_.tail_slots(g),
                                                     d_tail_rows_[g].data(), entries);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }

  void write_tails_ref(int g)
  {
    auto const view       = ref_.layer_rows(g, 0);
    auto const& rows      = ref_tail_rows_[g];
    for (int e = 0; e < config_.max_batch * config_.max_queries; ++e) {
      std::int32_t const slot = ref_.tail_slots(g)[e];
      if (slot < 0) { continue; }
      std::copy_n(rows.begin() + std::size_t(e) * view.stride, view.stride,
                  view.rows + std::size_t(slot) * view.stride);
    }
  }

  /// Random selections for every batch entry and query.
  std::vector<std::int32_t> make_selections(std::mt19937_64& rng, int top_k)
  {
    std::vector<std::int32_t> sel(std::size_t(config_.max_batch) * config_.max_queries * top_k, -1);
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      std::int32_t& focus = focus_[batch_[b]];
      std::int32_t const len = lengths_[batch_[b]];
      focus = std::clamp<std::int32_t>(focus + std::int32_t(rng() % 61) - 30, 0, len);
      for (int q = 0; q < queries_[b]; ++q) {
        test::make_selection(rng, len, q, top_k, focus,
                             sel.data() + (b * config_.max_queries + q) * top_k);
      }
    }
    return sel;
  }

  /// One eager step over all groups; `accepted` = null keeps every tail.
  void step(std::mt19937_64& rng, int top_k, std::vector<std::int32_t> const* accepted, bool backup)
  {
    for (int g = 0; g < config_.num_groups(); ++g) {
      auto const sel = make_selections(rng, top_k);
      d_selections_.upload_prefix(sel);
      gpu_.resolve(g, d_selections_.data(), top_k, stream_);
      gpu_.retrieve(g, stream_);
      ref_.resolve(g, sel.data(), top_k);
      ref_.retrieve(g);
      compare(g, sel, top_k);
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
      gpu_.backup(stream_);
      ref_.backup();
    }
    advance_lengths(accepted);
    REQUIRE(gpu_.status_sync(stream_) == ref_.status());
  }

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
  void compare(int g, std::vector<std::int32_t> const& sel, int top_k)
  {
    REQUIRE(gpu_.status_sync(stream_) == ref_.status());
    std::size_t const entries = std::size_t(config_.max_batch) * config_.max_queries * top_k;
    std::vector<std::int32_t> table(entries);
    DHISPARSE_CUDA_TRY(cudaMemcpy(table.data(), gpu_.slot_table(g), entries * 4, cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> tails(std::size_t(config_.max_batch) * config_.max_queries);
    DHISPARSE_CUDA_TRY(cudaMemcpy(tails.data(), gpu_.tail_slots(g), tails.size() * 4, cudaMemcpyDeviceToHost));
    auto const pool = gpu_.pool_ref(g);
    std::vector<std::int32_t> owner(pool.num_slots), position(pool.num_slots);
    DHISPARSE_CUDA_TRY(cudaMemcpy(owner.data(), pool.owner, owner.size() * 4, cudaMemcpyDeviceToHost));
    DHISPARSE_CUDA_TRY(cudaMemcpy(position.data(), pool.position, position.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<std::byte> slab(std::size_t(pool.num_slots) * pool.group_row_bytes);
    DHISPARSE_CUDA_TRY(cudaMemcpy(slab.data(), pool.slab, slab.size(), cudaMemcpyDeviceToHost));
    std::int32_t plan_count = 0;
    auto const plan = gpu_.plan_ref(g);
    DHISPARSE_CUDA_TRY(cudaMemcpy(&plan_count, plan.count, 4, cudaMemcpyDeviceToHost));
    std::vector<miss_entry> plan_entries(std::size_t(std::max(plan_count, 0)));
    DHISPARSE_CUDA_TRY(cudaMemcpy(plan_entries.data(), plan.entries, plan_entries.size() * sizeof(miss_entry),
                                  cudaMemcpyDeviceToHost));

    std::int32_t const* ref_table = ref_.slot_table(g);
    int const layers = config_.group_layers[g];
    for (std::size_t b = 0; b < batch_.size(); ++b) {
      std::int32_t const len = lengths_[batch_[b]];
      for (int q = 0; q < config_.max_queries; ++q) {
        for (int k = 0; k < top_k; ++k) {
          std::size_t const i = (b * config_.max_queries + q) * top_k + k;
          INFO("group " << g << " entry b=" << b << " q=" << q << " k=" << k << " position " << sel[i]);
          REQUIRE((table[i] >= 0) == (ref_table[i] >= 0));
          if (table[i] < 0) { continue; }
          REQUIRE(table[i] < pool.num_slots);
          if (sel[i] >= len) {  // a tail row of this step
            REQUIRE(table[i] == tails[b * config_.max_queries + (sel[i] - len)]);
            continue;
          }
          auto const want = test::truth_group_row(salt_, batch_[b], g, layers, Row::bytes, sel[i]);
          REQUIRE(std::memcmp(slab.data() + std::size_t(table[i]) * pool.group_row_bytes, want.data(),
                              want.size()) == 0);
        }
      }
      for (int j = 0; j < config_.max_queries; ++j) {
        REQUIRE((tails[b * config_.max_queries + j] >= 0) ==
                (ref_.tail_slots(g)[b * config_.max_queries + j] >= 0));
      }
    }
    // Misses: the same positions per request.
    std::map<int, std::multiset<std::int32_t>> gpu_miss, ref_miss;
    for (auto const& e : plan_entries) {
      REQUIRE(e.slot >= 0);
      REQUIRE(e.src != nullptr);
      gpu_miss[owner[e.slot]].insert(e.position);
    }
    for (auto const& m : ref_.misses(g)) { ref_miss[m.request].insert(m.position); }
    REQUIRE(gpu_miss == ref_miss);
    // Residency: the same positions resident per request (the eviction order matches).
    std::map<int, std::vector<std::int32_t>> gpu_res;
    for (std::int32_t s = 0; s < pool.num_slots; ++s) {
      if (owner[s] >= 0 && position[s] >= 0) { gpu_res[owner[s]].push_back(position[s]); }
    }
    for (auto const& [id, len] : lengths_) {
      auto gres = gpu_res[gpu_.request_index(request_id{id})];
      std::sort(gres.begin(), gres.end());
      REQUIRE(gres == ref_.resident_positions(request_id{id}, g));
    }
  }

  /// After a final backup: every committed row of every live request reads back exactly
  /// from the GPU's host store.
  void check_host_store()
  {
    gpu_.backup(stream_);
    ref_.backup();
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    for (auto const& [id, len] : lengths_) {
      REQUIRE(gpu_.map().free_pages() > 0);
      for (std::int32_t p = 0; p < len; ++p) {
        for (int g = 0; g < config_.num_groups(); ++g) {
          auto const want = test::truth_group_row(salt_, id, g, config_.group_layers[g], Row::bytes, p);
          INFO("request " << id << " group " << g << " position " << p);
          REQUIRE(std::memcmp(gpu_.host_row(request_id{id}, g, 0, p), want.data(), want.size()) == 0);
        }
      }
    }
  }

  std::map<std::uint64_t, std::int32_t>& lengths() { return lengths_; }
  test::device_vector<std::int32_t>& d_selections() { return d_selections_; }
  test::device_vector<std::int32_t>& d_accepted() { return d_accepted_; }
  std::vector<std::uint64_t> const& batch() const { return batch_; }

 private:
  hierarchy_config config_;
  std::uint64_t salt_;
  cudaStream_t stream_;
  gpu_type gpu_;
  ref_type ref_;
  test::device_vector<std::int32_t> d_selections_, d_accepted_;
  std::vector<test::device_vector<std::byte>> d_tail_rows_;  // per group
  std::map<int, std::vector<std::byte>> ref_tail_rows_;
  std::map<std::uint64_t, std::int32_t> lengths_, focus_;
  std::vector<std::uint64_t> batch_;
  std::vector<std::int32_t> queries_;
};

struct stream_guard {
  cudaStream_t s{};
  stream_guard() { DHISPARSE_CUDA_TRY(cudaStreamCreate(&s)); }
  ~stream_guard() { cudaStreamDestroy(s); }
};

}  // namespace

TEMPLATE_TEST_CASE("GPU decode steps match the host reference exactly", "[hierarchy][gpu]",
                   row_format::mla_fp8_656, row_format::mla_bf16_576, row_format::opaque<64>)
{
  auto rng                 = test::seeded_engine("hierarchy gpu decode");
  std::uint64_t const salt = rng();
  stream_guard stream;
  host_memory const memory = GENERATE(host_memory::pinned, host_memory::huge_pages);
  twin<TestType> t(twin_config(1, memory), salt, stream.s);
  t.admit(101, 1500, 4000);
  t.admit(202, 90, 2000);
  t.admit(303, 2600, 4000);
  t.set_batch({101, 202, 303}, {1, 1, 1});
  int const steps = int(30 * test_scale());
  for (int s = 0; s < steps; ++s) { t.step(rng, K, nullptr, s % 2 == 1); }
  // Requests come and go: the released request's slots and pages are reused.
  t.release(202);
  t.admit(404, 700, 3000);
  t.set_batch({404, 101, 303}, {1, 1, 1});
  for (int s = 0; s < steps; ++s) { t.step(rng, K - 5 * (s % 3), nullptr, true); }
  t.check_host_store();
}

TEST_CASE("GPU verify steps (Q > 1) share misses and recycle rejected tails like the reference",
          "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu verify");
  std::uint64_t const salt = rng();
  stream_guard stream;
  twin<row_format::mla_fp8_656> t(twin_config(4, host_memory::pinned), salt, stream.s);
  t.admit(1, 1200, 4000);
  t.admit(2, 300, 4000);
  t.set_batch({1, 2}, {4, 2});
  int const steps = int(20 * test_scale());
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> accepted = {std::int32_t(rng() % 5), std::int32_t(rng() % 3)};
    t.step(rng, 64, &accepted, true);
  }
  t.check_host_store();
}

TEST_CASE("a step captured in CUDA graphs replays with new selections exactly",
          "[hierarchy][gpu][graph]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu graph");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto const config = twin_config(1, host_memory::pinned);
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  t.admit(1, 800, 4000);
  t.admit(2, 2000, 4000);
  t.admit(3, 50, 4000);
  t.set_batch({1, 2, 3}, {1, 1, 1});
  t.step(rng, K, nullptr, true);  // one eager step first

  // Fixed addresses: one selection buffer per group, refilled before every replay. Two
  // graphs, so that the comparison can look at the tail slots before commit consumes them:
  // (resolve, retrieve, model writes tails) for every group, then (commit, backup).
  int const groups = config.num_groups();
  std::vector<test::device_vector<std::int32_t>> d_sel;
  for (int g = 0; g < groups; ++g) { d_sel.emplace_back(config.step_entries()); }
  cudaGraph_t layers_graph{}, commit_graph{};
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
  for (int g = 0; g < groups; ++g) {
    t.gpu().resolve(g, d_sel[g].data(), K, stream.s);
    t.gpu().retrieve(g, stream.s);
    t.write_tails_gpu(g);
  }
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream.s, &layers_graph));
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
  t.gpu().commit(nullptr, stream.s);
  t.gpu().backup(stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream.s, &commit_graph));
  cudaGraphExec_t layers_exec{}, commit_exec{};
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&layers_exec, layers_graph, 0));
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&commit_exec, commit_graph, 0));

  int const steps = int(10 * test_scale());
  for (int s = 0; s < steps; ++s) {
    if (s == steps / 2) {  // a new batch between replays: the graph reads it from device memory
      t.set_batch({3, 1}, {1, 1});
    }
    std::vector<std::vector<std::int32_t>> sel;
    for (int g = 0; g < groups; ++g) {
      sel.push_back(t.make_selections(rng, K));
      d_sel[g].upload_prefix(sel.back());
      t.stage_tails(g);
    }
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(layers_exec, stream.s));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    for (int g = 0; g < groups; ++g) {
      t.ref().resolve(g, sel[g].data(), K);
      t.ref().retrieve(g);
      t.compare(g, sel[g], K);
      t.write_tails_ref(g);
    }
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(commit_exec, stream.s));
    t.ref().commit(nullptr);
    t.ref().backup();
    t.advance_lengths(nullptr);
    REQUIRE(t.gpu().status_sync(stream.s) == t.ref().status());
  }
  t.check_host_store();
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(layers_exec));
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(commit_exec));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(layers_graph));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(commit_graph));
}

TEST_CASE("GPU bad inputs: clear errors, flagged entries, nothing corrupted", "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu bad input");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config                  = twin_config(4, host_memory::pinned);
  config.host.capacity_pages   = 300;
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  auto& gpu = t.gpu();
  t.admit(1, 1000, 2000);
  t.admit(2, 500, 1000);
  t.set_batch({1, 2}, {1, 1});
  t.step(rng, K, nullptr, true);

  // Host-side checks throw before anything is enqueued.
  auto const& sel_buffer = t.d_selections();
  REQUIRE_THROWS_WITH(gpu.resolve(0, sel_buffer.data(), K + 1, stream.s), Catch::Contains("top_k"));
  REQUIRE_THROWS_WITH(gpu.resolve(2, sel_buffer.data(), K, stream.s), Catch::Contains("group 2"));
  REQUIRE_THROWS_WITH(gpu.resolve(0, nullptr, K, stream.s), Catch::Contains("selections"));
  REQUIRE_THROWS_WITH(gpu.retrieve(0, stream.s, 1, 3), Catch::Contains("layer range"));
  REQUIRE_THROWS_WITH(gpu.release(request_id{77}, stream.s), Catch::Contains("unknown request id 77"));
  REQUIRE_THROWS_WITH(gpu.admit(request_id{1}, 10, stream.s), Catch::Contains("already admitted"));
  REQUIRE_THROWS_WITH(gpu.admit(request_id{9}, 10, stream.s, 9000), Catch::Contains("capacity"));
  std::size_t const free_pages = gpu.store().free_pages();
  REQUIRE_THROWS_WITH(gpu.admit(request_id{9}, 8000, stream.s, 8100), Catch::Contains("host store exhausted"));
  REQUIRE_THROWS_WITH(gpu.reserve(request_id{2}, 8100, stream.s), Catch::Contains("host store exhausted"));
  REQUIRE(gpu.store().free_pages() == free_pages);
  REQUIRE(!gpu.contains(request_id{9}));
  request_id const dup[2]   = {request_id{1}, request_id{1}};
  std::int32_t const q2[2]  = {1, 1};
  std::int32_t const q_big  = 5;
  REQUIRE_THROWS_WITH(gpu.set_batch(dup, q2, 2, stream.s), Catch::Contains("appears twice"));
  REQUIRE_THROWS_WITH(gpu.set_batch(dup, &q_big, 1, stream.s), Catch::Contains("queries[0]"));
  REQUIRE_THROWS_WITH(gpu.set_batch(dup, q2, 7, stream.s), Catch::Contains("max_batch"));
  {
    hierarchy_config bad = config;
    bad.device_slots_per_group = 6 * budget - 1;
    using gpu_type = twin<row_format::mla_fp8_656>::gpu_type;
    REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("essential floors"));
    bad = config;
    std::byte* misaligned = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&misaligned, 64));
    bad.slab_memory = {misaligned + 8, misaligned + 8};
    REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("16-byte aligned"));
    cudaFree(misaligned);
  }

  // Device-side: corrupted selections are flagged and served as empty, identically on
  // both sides; the rest of the step is exact (compare checks every entry).
  for (int round = 0; round < 8; ++round) {
    for (int g = 0; g < config.num_groups(); ++g) {
      auto sel = t.make_selections(rng, K);
      std::size_t const per_b = std::size_t(config.max_queries) * K;
      switch (round % 4) {
        case 0: sel[5] = sel[4]; break;                          // duplicate
        case 1: std::swap(sel[per_b + 2], sel[per_b + 3]); break;  // unsorted
        case 2: sel[7] = 1 << 30; break;                         // out of range
        case 3: sel[per_b + 9] = -7; break;                      // negative
      }
      t.d_selections().upload_prefix(sel);
      gpu.resolve(g, t.d_selections().data(), K, stream.s);
      gpu.retrieve(g, stream.s);
      t.ref().resolve(g, sel.data(), K);
      t.ref().retrieve(g);
      REQUIRE((gpu.status_sync(stream.s) & status_invalid_selection) != 0);
      t.compare(g, sel, K);
      t.stage_tails(g);
      t.write_tails_gpu(g);
      t.write_tails_ref(g);
    }
    std::vector<std::int32_t> accepted = {round % 3 == 0 ? 3 : 1, 1};  // 3 > queries: invalid
    t.finish_step(&accepted, true);
    REQUIRE(((gpu.status_sync(stream.s) & status_invalid_accept_count) != 0) == (round % 3 == 0));
    gpu.clear_status(stream.s);
    t.ref().clear_status();
  }

  // Budget overflow (Q = 4 disjoint selections need more than the budget): flagged, and
  // every slot that was handed out is still exact.
  t.set_batch({1}, {4});
  auto sel = t.make_selections(rng, K);
  std::int32_t const len = t.lengths()[1];
  for (int q = 0; q < 4; ++q) {
    for (int k = 0; k < K; ++k) { sel[std::size_t(q) * K + k] = q * 240 + k; }  // 4 × 128 distinct
  }
  REQUIRE(len > 4 * 240);
  t.d_selections().upload_prefix(sel);
  gpu.resolve(0, t.d_selections().data(), K, stream.s);
  gpu.retrieve(0, stream.s);
  REQUIRE((gpu.status_sync(stream.s) & status_budget_exceeded) != 0);
  std::vector<std::int32_t> table(config.step_entries());
  DHISPARSE_CUDA_TRY(cudaMemcpy(table.data(), gpu.slot_table(0), std::size_t(config.max_queries) * K * 4,
                                cudaMemcpyDeviceToHost));
  auto const view = gpu.layer_rows(0, 0);
  int served = 0;
  for (int i = 0; i < config.max_queries * K; ++i) {
    if (table[i] < 0) { continue; }
    ++served;
    std::vector<std::byte> got(view.stride);
    DHISPARSE_CUDA_TRY(cudaMemcpy(got.data(), view.rows + std::size_t(table[i]) * view.stride, view.stride,
                                  cudaMemcpyDeviceToHost));
    REQUIRE(got == test::truth_group_row(salt, 1, 0, 2, row_format::mla_fp8_656::bytes, sel[i]));
  }
  REQUIRE(served > 0);
  REQUIRE(served < 4 * K);
  std::vector<std::int32_t> none = {0};
  t.d_accepted().upload_prefix(none);
  gpu.commit(t.d_accepted().data(), stream.s);
  // Committed rows are all intact in the host store.
  std::vector<std::int32_t> ref_none = {0};
  t.ref().commit(ref_none.data());
  t.check_host_store();
}

TEST_CASE("host store in caller memory; caller-owned slabs", "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu caller memory");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config = twin_config(1, host_memory::caller);
  std::size_t const page_bytes = std::size_t(config.host.tokens_per_page) * 3 * row_format::mla_fp8_656::bytes;
  std::size_t const bytes = page_bytes * config.host.capacity_pages;
  void* host = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  config.host.caller_memory = host;
  config.host.caller_bytes  = bytes;
  std::vector<void*> slabs;
  for (int g = 0; g < config.num_groups(); ++g) {
    void* p = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&p, std::size_t(config.device_slots_per_group) * config.group_layers[g] *
                                        row_format::mla_fp8_656::bytes));
    slabs.push_back(p);
  }
  config.slab_memory = slabs;
  {
    twin<row_format::mla_fp8_656> t(config, salt, stream.s);
    REQUIRE(t.gpu().layer_rows(0, 0).rows == slabs[0]);
    t.admit(1, 700, 2000);
    t.set_batch({1}, {1});
    for (int s = 0; s < 10; ++s) { t.step(rng, K, nullptr, true); }
    t.check_host_store();
    REQUIRE(t.gpu().host_row(request_id{1}, 0, 0, 0) >= static_cast<std::byte*>(host));
    REQUIRE(t.gpu().host_row(request_id{1}, 0, 0, 0) < static_cast<std::byte*>(host) + bytes);
  }
  for (void* p : slabs) { cudaFree(p); }
  std::free(host);
  auto bad                 = twin_config(1, host_memory::caller);
  bad.host.caller_memory   = nullptr;
  using gpu_type           = twin<row_format::mla_fp8_656>::gpu_type;
  REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("caller_memory"));
}

TEST_CASE("residency map memory stays under 1% of the KV it indexes", "[hierarchy][gpu]")
{
  // Scenario A-like: 128 requests × 100K tokens of 656-byte rows, one group per layer.
  stream_guard stream;
  int const requests = 128, context = 100'000, page = 1024;
  std::size_t const tokens = std::size_t(requests) * context;
  residency_map map(1, page, tokens / page + requests, requests, context, stream.s);
  double const kv = double(tokens) * row_format::mla_fp8_656::bytes;
  INFO("map bytes " << map.device_bytes() << " for " << kv << " bytes of KV");
  REQUIRE(double(map.device_bytes()) <= 0.01 * kv);
}
