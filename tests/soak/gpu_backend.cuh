/**
 * @file gpu_backend.cuh
 * @brief The soak driver's view of the GPU `kv_hierarchy`: every call ordered on one
 *        stream; a step's layers (resolve, retrieve, the model's tail writes) run eagerly —
 *        resolve then retrieve, or the fused resolve_and_retrieve — or as a replay of a
 *        CUDA graph captured once; commit and backup likewise, so that backups inside graph
 *        replays must reach the host store too. The views it hands the driver are copies
 *        of the device state after the step's layers, owner and position arrays included
 *        (`shows_slots`), and its accounting also checks the free stack.
 */
#pragma once

#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy.cuh>

#include "gpu_test.cuh"  // tests/common: device_vector
#include "twin.cuh"      // tests/hierarchy: write_tails_kernel, the test's "model"
#include "soak.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace dhisparse::test::soak {

/// Keeps the stream busy for about `cycles` clock cycles (so that what is enqueued behind it
/// is still in flight while the host goes on).
template <int Dummy = 0>
__global__ void stall_kernel(long long cycles)
{
  long long const start = clock64();
  while (clock64() - start < cycles) {}
}

/// How the GPU backend runs the parts of a step.
struct gpu_modes {
  bool graphs = true;  ///< replay captured graphs on some steps (those at top_k = max_top_k)
  std::uint64_t seed = 1;
};

template <class Row, class Eviction, class Budget>
class gpu_backend {
 public:
  using hierarchy_type = kv_hierarchy<Row, Eviction, Budget>;
  static constexpr std::size_t row_bytes = Row::bytes;
  static constexpr bool shared_budget    = Budget::kind == budget_kind::shared;
  static constexpr bool shows_slots      = true;

  gpu_backend(hierarchy_config const& c, cudaStream_t stream, gpu_modes modes)
    : stream_{stream}, h_{c, stream}, modes_{modes}, rng_{modes.seed ^ 0x6A09E667F3BCC908ull}
  {
    // Slot tables and miss plans are double-buffered by group parity: a graph over more
    // than two groups would leave only the last two groups' tables to check.
    DHISPARSE_EXPECTS(!modes.graphs || c.num_groups() <= 2, "soak gpu_backend: graphs need at most two groups");
    for (int g = 0; g < c.num_groups(); ++g) {
      std::size_t const grb = std::size_t(c.group_layers[g]) * Row::bytes;
      d_sel_.emplace_back(c.step_entries());
      d_scores_.emplace_back(c.step_entries());
      d_tails_.emplace_back(std::size_t(c.max_batch) * c.max_queries * grb);
    }
    d_accepted_ = device_vector<std::int32_t>(std::size_t(c.max_batch));
  }
  gpu_backend(gpu_backend const&)            = delete;
  gpu_backend& operator=(gpu_backend const&) = delete;
  ~gpu_backend()
  {
    for (auto* e : {&layers_exec_, &commit_exec_, &backup_exec_}) {
      if (*e != nullptr) { cudaGraphExecDestroy(*e); }
    }
  }

  hierarchy_type& hierarchy() { return h_; }
  [[nodiscard]] hierarchy_config const& config() const { return h_.config(); }
  /// Steps whose layers, commits and backups ran as graph replays.
  [[nodiscard]] std::int64_t graph_replays() const { return replays_; }

  void admit(request_id id, std::int32_t length, std::int64_t capacity) { h_.admit(id, length, stream_, capacity); }
  void reserve(request_id id, std::int64_t capacity) { h_.reserve(id, capacity, stream_); }
  void release(request_id id) { h_.release(id, stream_); }
  [[nodiscard]] bool contains(request_id id) const { return h_.contains(id); }
  [[nodiscard]] std::size_t num_requests() const { return h_.num_requests(); }
  [[nodiscard]] int request_index(request_id id) const { return h_.request_index(id); }
  [[nodiscard]] std::byte* host_row(request_id id, int g, int l, std::int64_t p) { return h_.host_row(id, g, l, p); }
  [[nodiscard]] std::size_t free_host_pages() const { return h_.store().free_pages(); }
  [[nodiscard]] std::int64_t floor_sum() const { return h_.floor_sum(); }
  [[nodiscard]] std::int64_t pool_limit(int g) const { return h_.pool_limit(g); }
  void set_pool_limit(int g, std::int64_t limit) { h_.set_pool_limit(g, limit, stream_); }
  void reclaim(int g, std::int32_t free_slots) { h_.reclaim(g, free_slots, stream_); }
  void prewarm(request_id id, std::int32_t count) { h_.prewarm(id, count, stream_); }

  void set_batch(std::vector<request_id> const& ids, std::vector<std::int32_t> const& queries)
  {
    h_.set_batch(ids.data(), queries.data(), int(ids.size()), stream_);
  }
  void resolve_only(int g, std::vector<std::int32_t> const&, int top_k)
  {
    h_.resolve(g, d_sel_.at(0).data(), top_k, stream_);
  }
  void retrieve_only(int g, int layer_begin, int layer_end) { h_.retrieve(g, stream_, layer_begin, layer_end); }

  /// Every group: resolve, retrieve, the model's tail writes; then copies of what they left.
  std::vector<group_view> layers(layer_inputs const& in)
  {
    hierarchy_config const& c = h_.config();
    int const groups          = c.num_groups();
    for (int g = 0; g < groups; ++g) {
      upload(d_sel_[g].data(), in.selections[g]);
      upload(d_scores_[g].data(), in.scores[g]);
      upload(d_tails_[g].data(), in.tail_rows[g]);
    }
    graph_step_ = modes_.graphs && in.top_k == c.max_top_k && rng_() % 2 == 0;
    std::vector<group_view> views(static_cast<std::size_t>(groups));
    if (graph_step_) {
      if (layers_exec_ == nullptr) {
        begin_capture();
        for (int g = 0; g < groups; ++g) { enqueue_layers(g, c.max_top_k, false); }
        layers_exec_ = end_capture();
      }
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(layers_exec_, stream_));
      ++replays_;
      for (int g = 0; g < groups; ++g) { views[g] = download_view(g, in.top_k); }
    } else {
      for (int g = 0; g < groups; ++g) {  // each group's table before the next-but-one reuses it
        enqueue_layers(g, in.top_k, rng_() % 2 == 0);
        views[g] = download_view(g, in.top_k);
      }
    }
    return views;
  }

  void commit(std::vector<std::int32_t> const* accepted)
  {
    if (accepted == nullptr) {
      h_.commit(nullptr, stream_);
      return;
    }
    upload(d_accepted_.data(), *accepted);
    if (graph_step_) {
      if (commit_exec_ == nullptr) {
        begin_capture();
        h_.commit(d_accepted_.data(), stream_);
        commit_exec_ = end_capture();
      }
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(commit_exec_, stream_));
    } else {
      h_.commit(d_accepted_.data(), stream_);
    }
  }
  void backup()
  {
    if (graph_step_) {
      if (backup_exec_ == nullptr) {
        begin_capture();
        h_.backup(stream_);
        backup_exec_ = end_capture();
      }
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(backup_exec_, stream_));
    } else {
      h_.backup(stream_);
    }
  }
  void sync() { DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_)); }
  /// Holds the stream for ~50 ms: work enqueued next is still in flight when the host
  /// goes on (the host backend has nothing in flight).
  void stall()
  {
    stall_kernel<<<1, 1, 0, stream_>>>(100'000'000LL);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }
  [[nodiscard]] std::uint32_t status() const { return h_.status_sync(stream_); }
  void clear_status() { h_.clear_status(stream_); }

  /// Owned + free as the device sees them, and the free stack's own consistency.
  [[nodiscard]] soak::accounting slots(int g) const
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    device_pool_ref const p = h_.pool_ref(g);
    soak::accounting a;
    std::int32_t const limit = download_one(p.limit);
    std::int32_t const free  = download_one(p.free_count);
    auto const owner         = download(p.owner, std::size_t(p.num_slots));
    auto const stack         = download(p.free_stack, std::size_t(std::clamp(free, 0, p.num_slots)));
    auto const owned_count   = download(p.owned_count, std::size_t(h_.config().max_requests));
    a.limit = limit;
    a.free  = free;
    std::int64_t owned_sum = 0;
    for (std::int32_t n : owned_count) { owned_sum += n; }
    for (std::int32_t s = 0; s < p.num_slots; ++s) {
      if (owner[std::size_t(s)] < 0) { continue; }
      ++a.owned;
      if (s >= limit && a.problem.empty()) { a.problem = "slot " + std::to_string(s) + " at or above the limit is owned"; }
    }
    std::set<std::int32_t> distinct;
    for (std::int32_t s : stack) {
      if (s < 0 || s >= limit || owner[std::size_t(s)] != -1 || !distinct.insert(s).second) {
        if (a.problem.empty()) { a.problem = "free stack entry " + std::to_string(s) + " is out of range, owned or repeated"; }
      }
    }
    if (owned_sum != a.owned && a.problem.empty()) {
      a.problem = "per-request owned counts sum to " + std::to_string(owned_sum) + ", the owner array holds " +
                  std::to_string(a.owned);
    }
    return a;
  }

 private:
  template <class T>
  void upload(T* device, std::vector<T> const& host)
  {
    if (!host.empty()) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream_));
    }
  }
  template <class T>
  std::vector<T> download(T const* device, std::size_t n) const
  {
    std::vector<T> host(n);
    if (n > 0) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    }
    return host;
  }
  template <class T>
  T download_one(T const* device) const
  {
    return download(device, 1)[0];
  }

  void enqueue_layers(int g, int top_k, bool fused)
  {
    float const* scores = Eviction::needs_scores || Eviction::counts_selections ? d_scores_[g].data() : nullptr;
    if (fused) {
      h_.resolve_and_retrieve(g, d_sel_[g].data(), top_k, stream_, scores);
    } else {
      h_.resolve(g, d_sel_[g].data(), top_k, stream_, scores);
      h_.retrieve(g, stream_);
    }
    layer_view const rows = h_.layer_rows(g, 0);
    int const entries     = h_.config().max_batch * h_.config().max_queries;
    write_tails_kernel<<<entries, 128, 0, stream_>>>(rows.rows, rows.stride, h_.tail_slots(g),
                                                         d_tails_[g].data(), entries);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }
  void begin_capture() { DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)); }
  cudaGraphExec_t end_capture()
  {
    cudaGraph_t graph{};
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec{};
    cudaError_t const e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    DHISPARSE_CUDA_TRY(e);
    return exec;
  }

  group_view download_view(int g, int top_k) const
  {
    hierarchy_config const& c = h_.config();
    device_pool_ref const p   = h_.pool_ref(g);
    group_view v;
    v.slot_table = download(h_.slot_table(g), std::size_t(c.max_batch) * c.max_queries * top_k);
    v.tail_slots = download(h_.tail_slots(g), std::size_t(c.max_batch) * c.max_queries);
    v.owner      = download(p.owner, std::size_t(p.num_slots));
    v.position   = download(p.position, std::size_t(p.num_slots));
    slabs_.resize(std::size_t(c.num_groups()));
    slabs_[g]   = download(p.slab, std::size_t(p.num_slots) * p.group_row_bytes);
    v.slab      = slabs_[g].data();
    v.row_bytes = p.group_row_bytes;
    v.num_slots = p.num_slots;
    return v;
  }

  cudaStream_t stream_;
  hierarchy_type h_;
  gpu_modes modes_;
  std::mt19937_64 rng_;
  std::vector<device_vector<std::int32_t>> d_sel_;
  std::vector<device_vector<float>> d_scores_;
  std::vector<device_vector<std::byte>> d_tails_;
  device_vector<std::int32_t> d_accepted_;
  mutable std::vector<std::vector<std::byte>> slabs_;  ///< the views' slab copies
  cudaGraphExec_t layers_exec_ = nullptr, commit_exec_ = nullptr, backup_exec_ = nullptr;
  bool graph_step_             = false;
  std::int64_t replays_        = 0;
};

}  // namespace dhisparse::test::soak
