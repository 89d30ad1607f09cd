/**
 * @file hierarchy.cuh
 * @brief `kv_hierarchy`: the GPU/host KV hierarchy assembled from its components, with a
 *        small step API.
 *
 * ```
 * admit / reserve / release          host side, between steps (never inside a graph)
 * set_batch                          host side: which requests, how many queries each
 * for each layer group g:
 *   resolve(g, selections, K)        union, hits, pins, evictions, tail slots, miss plan
 *   retrieve(g)                      missed rows host → slab, all layers of g
 *   for each layer l of g:
 *     model writes tail rows         into tail_slots(g), layer l of each slot
 *     attention(l)                   over slot_table(g) and layer_rows(g, l)
 * commit(accepted)                   tails become committed (dirty), or are recycled
 * backup()                           dirty rows → host store; rows become clean
 * ```
 * Every step operation is stream-ordered, allocation-free, host-sync-free and launches
 * fixed shapes (the real batch size lives in device memory), so a whole step can be
 * captured in a CUDA graph once and replayed with new selections and batches.
 *
 * Ordering contract: operations touch shared device state, so the caller orders them
 * (one stream, or events between streams): a resolve of a group is followed by retrieve
 * before attention reads its slots, by exactly one commit before the group's next
 * resolve, and a release comes after the request's last step. Slot tables and miss plans
 * are double-buffered by group parity: group g+1 may be resolved and retrieved while
 * group g attends.
 *
 * @tparam RowFormat row layout (see row_format.cuh)
 * @tparam Eviction  eviction policy (see policy/lru.cuh)
 * @tparam Budget    budget policy (see policy/static_budget.cuh)
 */
#pragma once

#include <dhisparse/backup.cuh>
#include <dhisparse/commit.cuh>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/hierarchy/kernels.cuh>
#include <dhisparse/detail/policy_traits.hpp>
#include <dhisparse/detail/request_table.hpp>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host_store.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/resolve.cuh>
#include <dhisparse/retrieve.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dhisparse {

template <class RowFormat, class Eviction = policy::lru,
          class Budget = policy::static_budget<4096>>
class kv_hierarchy {
  static_assert(is_row_format_v<RowFormat>,
                "RowFormat must have `bytes` (a multiple of 16) and `name` (see row_format.cuh)");
  static_assert(is_eviction_policy_v<Eviction>,
                "Eviction must provide on_insert, on_hit and eviction_key (see policy/lru.cuh)");
  static_assert(is_budget_policy_v<Budget>,
                "Budget must provide slots_per_request (see policy/static_budget.cuh)");

 public:
  using row_format      = RowFormat;
  using eviction_policy = Eviction;
  using budget_policy   = Budget;

  /**
   * @brief Allocates every device and host structure; initialisation is ordered on
   *        `stream` (and completed before returning).
   * @throws dhisparse::error naming the invalid field of `config`, or a failed allocation
   */
  kv_hierarchy(hierarchy_config config, cudaStream_t stream)
    : config_{std::move(config)},
      host_{(detail::validate(config_, Budget::slots_per_request), config_.host),
            config_.group_layers, RowFormat::bytes, config_.max_requests, config_.max_context,
            stream},
      map_{config_.num_groups(), config_.map_page_positions, map_pages(config_),
           config_.max_requests, config_.max_context, stream}
  {
    int const groups = config_.num_groups();
    std::int32_t const dirty_capacity =
      config_.max_batch * config_.max_queries * config_.backup_interval_steps;
    std::vector<device_pool_ref> refs;
    for (int g = 0; g < groups; ++g) {
      pools_.emplace_back(std::int32_t(config_.device_slots_per_group),
                          std::size_t(config_.group_layers[g]) * RowFormat::bytes,
                          config_.max_requests, Budget::slots_per_request, dirty_capacity,
                          config_.slab_memory.empty() ? nullptr : config_.slab_memory[g], stream);
      refs.push_back(pools_.back().ref());
    }
    pool_refs_ = detail::device_array<device_pool_ref>(groups);
    layouts_   = detail::device_array<group_layout>(groups);
    uploader_.upload(pool_refs_.data(), refs.data(), refs.size() * sizeof(device_pool_ref), stream);
    uploader_.upload(layouts_.data(), host_.layouts().data(), groups * sizeof(group_layout), stream);

    std::size_t const entries = config_.step_entries();
    batch_      = detail::device_array<std::int32_t>(1 + 2 * std::size_t(config_.max_batch));
    lengths_    = detail::device_array<std::int32_t>(config_.max_requests);
    capacities_ = detail::device_array<std::int32_t>(config_.max_requests);
    tail_slots_ = detail::device_array<std::int32_t>(std::size_t(groups) * config_.max_batch *
                                                     config_.max_queries);
    status_     = detail::device_array<std::uint32_t>(1);
    batch_.fill_bytes(0, stream);
    lengths_.fill_bytes(0, stream);
    capacities_.fill_bytes(0, stream);
    tail_slots_.fill_bytes(0xFF, stream);
    status_.fill_bytes(0, stream);
    workspace_bytes_ = resolve_workspace_size(config_.max_batch, config_.max_queries,
                                              config_.max_top_k, Budget::slots_per_request);
    for (int i = 0; i < 2; ++i) {
      slot_tables_[i] = detail::device_array<std::int32_t>(entries);
      slot_tables_[i].fill_bytes(0xFF, stream);
      plans_[i]       = detail::device_array<miss_entry>(entries);
      plan_counts_[i] = detail::device_array<std::int32_t>(1);
      plan_counts_[i].fill_bytes(0, stream);
      workspaces_[i]  = detail::device_array<std::byte>(workspace_bytes_);
    }
    std::uint32_t* pinned = nullptr;
    DHISPARSE_CUDA_TRY(cudaHostAlloc(&pinned, sizeof(std::uint32_t), cudaHostAllocDefault));
    status_host_.reset(pinned);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  kv_hierarchy(kv_hierarchy&&) noexcept            = default;
  kv_hierarchy& operator=(kv_hierarchy&&) noexcept = default;
  kv_hierarchy(kv_hierarchy const&)                = delete;
  kv_hierarchy& operator=(kv_hierarchy const&)     = delete;
  ~kv_hierarchy()                                  = default;

  // ------------------------------------------------------------------------------------
  // Requests: host side, between steps.
  // ------------------------------------------------------------------------------------

  /**
   * @brief Admits a request whose first `length` positions are committed. Their rows must
   *        be written into the host store (`host_row`) before the first step that selects
   *        them: direct-to-host admission. Nothing is resident on the device yet.
   * @param capacity positions to back with storage (≥ length; default length + max_queries)
   * @throws dhisparse::error for a known id, lengths out of range, or when the host store
   *         has too few free pages (nothing is changed then)
   */
  void admit(request_id id, std::int32_t length, cudaStream_t stream, std::int64_t capacity = -1)
  {
    int const index = requests_.check_admit(id, length, capacity);
    check_storage(index, capacity);
    requests_.insert(id);
    grow(index, capacity, stream);
    uploader_.upload_value(lengths_.data() + index, length, stream);
  }

  /**
   * @brief Backs positions [0, capacity) of a request with host pages and map pages, so
   *        that later steps can append tail rows up to there. All or nothing.
   * @throws dhisparse::error for an unknown id, capacity beyond max_context, or an
   *         exhausted host store
   */
  void reserve(request_id id, std::int64_t capacity, cudaStream_t stream)
  {
    int const index = requests_.index_of(id, "reserve");
    requests_.check_reserve(capacity);
    check_storage(index, capacity);
    grow(index, capacity, stream);
  }

  /**
   * @brief Ends a request: its slots return to the free pools, its map and host pages to
   *        their pools. Call after the request's last step completed (its host pages may
   *        be handed to the next admission at once).
   * @throws dhisparse::error for an unknown id
   */
  void release(request_id id, cudaStream_t stream)
  {
    int const index = requests_.index_of(id, "release");
    namespace hd    = detail::hierarchy;
    hd::release_slots_kernel<hd::block_size>
      <<<config_.num_groups(), hd::block_size, 0, stream>>>(pool_refs_.data(), index);
    DHISPARSE_CUDA_TRY(detail::check_launch(stream));
    residency_map_ref const map = map_.ref();
    hd::clear_map_kernel<hd::block_size>
      <<<map.max_pages_per_request, hd::block_size, 0, stream>>>(map, index);
    DHISPARSE_CUDA_TRY(detail::check_launch(stream));
    map_.release(index, stream);
    host_.release(index, stream);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(lengths_.data() + index, 0, sizeof(std::int32_t), stream));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(capacities_.data() + index, 0, sizeof(std::int32_t), stream));
    requests_.erase(id);
  }

  /// Whether `id` is admitted.
  [[nodiscard]] bool contains(request_id id) const { return requests_.contains(id); }

  /// Admitted requests.
  [[nodiscard]] std::size_t num_requests() const noexcept { return requests_.size(); }

  /**
   * @brief Host address of the row of (request, group, layer, position) in the host store.
   *        Prefill rows are written here; committed rows can be read back here once
   *        `backup` completed.
   * @throws dhisparse::error for an unknown id or an index out of range
   */
  [[nodiscard]] std::byte* host_row(request_id id, int group, int layer, std::int64_t position) const
  {
    return host_.row(requests_.index_of(id, "host_row"), group, layer, position);
  }

  // ------------------------------------------------------------------------------------
  // Batch: host side, between steps.
  // ------------------------------------------------------------------------------------

  /**
   * @brief Sets the requests of the next step(s) and their query counts (1 for plain
   *        decoding, 1 + drafts when verifying). Ordered on `stream`; entries beyond
   *        `count` up to max_batch are padding.
   * @throws dhisparse::error for count > max_batch, unknown or repeated ids, queries
   *         outside [1, max_queries]
   */
  void set_batch(request_id const* ids, std::int32_t const* queries, int count, cudaStream_t stream)
  {
    auto const indices = requests_.batch_indices(ids, queries, count);
    std::vector<std::int32_t> packed(1 + 2 * std::size_t(config_.max_batch), 0);
    packed[0] = count;
    std::copy(indices.begin(), indices.end(), packed.begin() + 1);
    std::copy(queries, queries + count, packed.begin() + 1 + config_.max_batch);
    uploader_.upload(batch_.data(), packed.data(), packed.size() * sizeof(std::int32_t), stream);
    batch_count_ = count;
  }

  /// Real batch size set by the last `set_batch`.
  [[nodiscard]] int batch_count() const noexcept { return batch_count_; }

  // ------------------------------------------------------------------------------------
  // The step: stream-ordered, allocation-free, host-sync-free, capturable.
  // ------------------------------------------------------------------------------------

  /**
   * @brief Resolves the selections of one layer group (see resolve.cuh).
   * @param selections device memory `[max_batch][max_queries][top_k]`, -1 = none
   * @param top_k      K of this step, 1 ≤ top_k ≤ max_top_k; also the last dimension of
   *                   `slot_table(group)`
   * @throws dhisparse::error for a bad group, top_k or null selections (nothing enqueued)
   */
  void resolve(int group, std::int32_t const* selections, int top_k, cudaStream_t stream)
  {
    requests_.check_resolve(group, selections, top_k);
    resolve_params p{};
    p.selections  = selections;
    p.top_k       = top_k;
    p.group       = group;
    p.slot_budget = Budget::slots_per_request;
    p.layout      = host_.layout(group);
    p.batch       = batch_ref();
    p.pool        = pools_[group].ref();
    p.map         = map_.ref();
    p.host        = host_.ref();
    p.slot_table  = slot_tables_[group % 2].data();
    p.tail_slots  = tail_slots_.data() + std::size_t(group) * config_.max_batch * config_.max_queries;
    p.plan        = plan_ref(group);
    p.status      = status_.data();
    DHISPARSE_CUDA_TRY(resolve_async<Eviction>(p, workspaces_[group % 2].data(), workspace_bytes_, stream));
  }

  /**
   * @brief Copies the rows missed by the last resolve of `group` into its slab, for the
   *        layers [layer_begin, layer_end) of the group (default: all).
   */
  void retrieve(int group, cudaStream_t stream, int layer_begin = 0, int layer_end = -1)
  {
    requests_.check_retrieve(group, layer_begin, layer_end);
    retrieve_params p{};
    p.plan            = plan_ref(group);
    p.slab            = pools_[group].slab();
    p.group_row_bytes = pools_[group].group_row_bytes();
    p.byte_begin      = std::size_t(layer_begin) * RowFormat::bytes;
    p.byte_end        = std::size_t(layer_end) * RowFormat::bytes;
    DHISPARSE_CUDA_TRY(retrieve_async(p, 0, stream));
  }

  /**
   * @brief Commits the tail rows of the step in every group (see commit.cuh).
   * @param accepted device `[max_batch]` tail rows to keep per batch entry, or nullptr to
   *                 keep all (plain decoding)
   */
  void commit(std::int32_t const* accepted, cudaStream_t stream)
  {
    commit_params p{};
    p.batch      = batch_ref();
    p.accepted   = accepted;
    p.pools      = pool_refs_.data();
    p.tail_slots = tail_slots_.data();
    p.map        = map_.ref();
    p.num_groups = config_.num_groups();
    p.status     = status_.data();
    DHISPARSE_CUDA_TRY(commit_async(p, stream));
  }

  /// Copies every committed, not yet backed-up row to the host store (see backup.cuh).
  void backup(cudaStream_t stream)
  {
    backup_params p{};
    p.pools      = pool_refs_.data();
    p.layouts    = layouts_.data();
    p.host       = host_.ref();
    p.num_groups = config_.num_groups();
    DHISPARSE_CUDA_TRY(backup_async(p, 0, stream));
  }

  // ------------------------------------------------------------------------------------
  // Views.
  // ------------------------------------------------------------------------------------

  /// Slot table of the last resolve of `group`: device `[max_batch][max_queries][top_k]`.
  [[nodiscard]] std::int32_t const* slot_table(int group) const
  {
    requests_.check_group(group, "slot_table");
    return slot_tables_[group % 2].data();
  }

  /// Tail slots of the last resolve of `group`: device `[max_batch][max_queries]`, -1 = none.
  [[nodiscard]] std::int32_t const* tail_slots(int group) const
  {
    requests_.check_group(group, "tail_slots");
    return tail_slots_.data() + std::size_t(group) * config_.max_batch * config_.max_queries;
  }

  /// Rows of layer `layer` of `group` in the slab (attention input, tail row output).
  [[nodiscard]] layer_view layer_rows(int group, int layer) const
  {
    requests_.check_layer(group, layer, "layer_rows");
    return {pools_[group].slab() + std::size_t(layer) * RowFormat::bytes,
            pools_[group].group_row_bytes()};
  }

  /// Device view of the miss plan of the last resolve of `group`.
  [[nodiscard]] miss_plan_ref plan_ref(int group) const
  {
    return {plans_[group % 2].data(), plan_counts_[group % 2].data(),
            std::int32_t(config_.step_entries())};
  }

  /// Device view of one group's pool (slot metadata).
  [[nodiscard]] device_pool_ref pool_ref(int group) const
  {
    requests_.check_group(group, "pool_ref");
    return pools_[group].ref();
  }

  /// Device view of the batch (sizes, request indices, queries, lengths).
  [[nodiscard]] step_batch_ref batch_ref() const noexcept
  {
    return {batch_.data(),    batch_.data() + 1,  batch_.data() + 1 + config_.max_batch,
            lengths_.data(),  capacities_.data(), config_.max_batch,
            config_.max_queries};
  }

  /// Internal index of an admitted request (the value kernels see in `batch.requests`).
  [[nodiscard]] int request_index(request_id id) const { return requests_.index_of(id, "request_index"); }

  [[nodiscard]] hierarchy_config const& config() const noexcept { return config_; }
  [[nodiscard]] host_store const& store() const noexcept { return host_; }
  [[nodiscard]] residency_map const& map() const noexcept { return map_; }

  // ------------------------------------------------------------------------------------
  // Status.
  // ------------------------------------------------------------------------------------

  /// Device address of the status word (see status.hpp), e.g. to copy it asynchronously.
  [[nodiscard]] std::uint32_t* status() const noexcept { return status_.data(); }

  /// Reads the status word; synchronizes `stream`.
  [[nodiscard]] std::uint32_t status_sync(cudaStream_t stream) const
  {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(status_host_.get(), status_.data(), sizeof(std::uint32_t),
                                       cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return *status_host_;
  }

  /// Clears the status word, ordered on `stream`.
  void clear_status(cudaStream_t stream)
  {
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(status_.data(), 0, sizeof(std::uint32_t), stream));
  }

 private:
  static std::size_t map_pages(hierarchy_config const& c)
  {
    std::size_t const tokens = c.host.capacity_pages * std::size_t(c.host.tokens_per_page);
    return (tokens + c.map_page_positions - 1) / c.map_page_positions + c.max_requests;
  }

  /// Backs [0, capacity) with host pages (whole pages) and map pages; the usable capacity
  /// is what the pages back, up to max_context.
  void grow(int index, std::int64_t capacity, cudaStream_t stream)
  {
    host_.grow(index, capacity, uploader_, stream);
    std::int32_t const backed =
      std::int32_t(std::min<std::int64_t>(host_.capacity(index), config_.max_context));
    map_.grow(index, backed, uploader_, stream);
    uploader_.upload_value(capacities_.data() + index, backed, stream);
  }

  /// Throws before anything changes if the host store would run out. (The map's pool is
  /// sized from the host store's capacity plus one partial page per request, so it cannot
  /// run out first.)
  void check_storage(int index, std::int64_t capacity) const
  {
    std::size_t const host_need = host_.missing_pages(index, capacity);
    DHISPARSE_EXPECTS(host_need <= host_.free_pages(),
                      "host store exhausted: " + std::to_string(host_need) + " pages needed, " +
                        std::to_string(host_.free_pages()) + " free");
  }

  hierarchy_config config_;
  detail::staging_uploader uploader_;
  host_store host_;
  residency_map map_;
  std::vector<device_pool> pools_;
  detail::device_array<device_pool_ref> pool_refs_;
  detail::device_array<group_layout> layouts_;
  detail::device_array<std::int32_t> batch_;  // [1 + 2 max_batch]: size, requests, queries
  detail::device_array<std::int32_t> lengths_;
  detail::device_array<std::int32_t> capacities_;
  detail::device_array<std::int32_t> tail_slots_;
  detail::device_array<std::uint32_t> status_;
  std::array<detail::device_array<std::int32_t>, 2> slot_tables_;
  std::array<detail::device_array<miss_entry>, 2> plans_;
  std::array<detail::device_array<std::int32_t>, 2> plan_counts_;
  std::array<detail::device_array<std::byte>, 2> workspaces_;
  std::size_t workspace_bytes_   = 0;
  struct pinned_deleter {
    void operator()(std::uint32_t* p) const noexcept { cudaFreeHost(p); }
  };
  std::unique_ptr<std::uint32_t, pinned_deleter> status_host_;
  detail::request_table requests_{config_};
  int batch_count_ = 0;
};

}  // namespace dhisparse

/**
 * @brief Explicit instantiation control for `kv_hierarchy` (and the kernels its members
 *        instantiate). Put `DHISPARSE_INSTANTIATE_KV_HIERARCHY(row, eviction, budget);` in
 *        one `.cu` file and `DHISPARSE_DECLARE_KV_HIERARCHY(row, eviction, budget);` in the
 *        others that use it, so the kernels are compiled once.
 */
#define DHISPARSE_DECLARE_KV_HIERARCHY(...) extern template class ::dhisparse::kv_hierarchy<__VA_ARGS__>
#define DHISPARSE_INSTANTIATE_KV_HIERARCHY(...) template class ::dhisparse::kv_hierarchy<__VA_ARGS__>
