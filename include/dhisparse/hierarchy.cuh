/**
 * @file hierarchy.cuh
 * @brief `kv_hierarchy`: the GPU/host KV hierarchy assembled from its components, with a
 *        small step API.
 *
 * ```
 * admit / reserve / release          host side, between steps (never inside a graph)
 * set_pool_limit / prewarm / reclaim host side, between steps: memory back to the engine,
 *                                    spare slots filled, a free reserve
 * set_batch                          host side: which requests, how many queries each; or
 * load_batch(batch)                  capturable: the same from device memory (request indices)
 * set_drafts(num_drafts, parents)    optional, capturable: per-request verify lengths and
 *                                    draft trees from device memory (query_positions)
 * for each layer group g:
 *   resolve(g, selections, K)        union, hits, pins, evictions or reclaim, tail slots, plan
 *   retrieve(g)                      missed rows host → slab, all layers of g
 *   for each layer l of g:
 *     model writes tail rows         into tail_slots(g), layer l of each slot
 *     attention(l)                   over slot_table(g) and layer_rows(g, l):
 *                                    attention_params(g, l) + queries, outputs, scale
 * commit(accepted)                   tails become committed (dirty), or are recycled; or
 * commit_verified(verify outputs)    the accepted path (tree nodes compacted onto positions)
 *                                    committed, the rest recycled, the draft ring kept in step
 * backup()                           dirty rows → host store; rows become clean
 * ```
 * Every step operation is stream-ordered, allocation-free, host-sync-free and launches
 * fixed shapes (the real batch size lives in device memory), so a whole step can be
 * captured in a CUDA graph once and replayed with new selections and batches.
 *
 * Load-adaptive residency: the budget policy gives every request a *floor* (slots it is
 * guaranteed in each group) and a *cap*. Admission refuses a request whose floor does not
 * fit beside the admitted ones, so a step never lacks a slot a floor promised. With
 * `adaptive_budget`, rows stay resident while the pool has free slots; when a step needs
 * more, a device-side reclaim releases clean optional rows at once (0 bytes move).
 *
 * Ordering contract: operations touch shared device state, so the caller orders them
 * (one stream, or events between streams): a resolve of a group is followed by retrieve
 * before attention reads its slots, and by exactly one commit before the group's next
 * resolve. Slot tables and miss plans are double-buffered by group parity: group g+1 may
 * be resolved and retrieved while group g attends. Misuse is defined, never corrupting
 * (docs/integration.md, "The step contract"): a commit keeps only tail rows every group
 * gave a slot, `set_batch` abandons a step left open, `release` mid-step takes the request
 * out of the step, and a commit recycles the tails of a resolve that was never committed.
 *
 * Devices: a hierarchy lives on `hierarchy_config::device`; every call that allocates,
 * launches or copies runs there whatever device the caller has current, and restores the
 * caller's device (detail/device_guard.cuh), so one process may drive one hierarchy per
 * GPU. Tensor-parallel ranks may share one host store (`hierarchy_config::shared_host`,
 * shared_host_store.cuh): one writer backs up and returns an event from `backup`, the
 * readers `wait_host` on it before their own (copy-free) backup.
 *
 * @tparam RowFormat row layout (see row_format.cuh)
 * @tparam Eviction  eviction policy (see policy/concepts.hpp)
 * @tparam Budget    budget policy (see policy/concepts.hpp)
 */
#pragma once

#include <dhisparse/backup.cuh>
#include <dhisparse/commit.cuh>
#include <dhisparse/detail/budget_ledger.hpp>
#include <dhisparse/detail/device_guard.cuh>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/hierarchy/kernels.cuh>
#include <dhisparse/detail/hierarchy/step_kernels.cuh>
#include <dhisparse/detail/nvtx.hpp>
#include <dhisparse/detail/request_table.hpp>
#include <dhisparse/sparse_attention_params.hpp>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host_store.cuh>
#include <dhisparse/shared_host_store.cuh>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/reclaim.cuh>
#include <dhisparse/release.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/resolve.cuh>
#include <dhisparse/retrieve.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse {

template <class RowFormat, class Eviction = policy::lru, class Budget = policy::static_budget<4096>>
class kv_hierarchy {
  static_assert(is_row_format_v<RowFormat>,
                "RowFormat must have `bytes` (a multiple of 16) and `name` (see row_format.cuh)");
  static_assert(is_complete_eviction_policy_v<Eviction>,
                "Eviction must provide the hooks of policy/concepts.hpp (derive from policy::eviction_defaults)");
  static_assert(is_budget_policy_v<Budget>, "Budget must provide kind, reclaim, floor and cap (see policy/concepts.hpp)");

  static constexpr bool per_request = Budget::kind == budget_kind::per_request;
  static constexpr bool reclaims    = Budget::kind == budget_kind::shared && Budget::reclaim != reclaim_order::none;

 public:
  using row_format      = RowFormat;
  using eviction_policy = Eviction;
  using budget_policy   = Budget;

  /// Plan entries one prewarm launch copies (longer ranges take several).
  static constexpr std::int32_t prewarm_chunk = 1 << 16;

  /**
   * @brief Allocates every device and host structure from `config.resources` (nullptr:
   *        `cudaMalloc`, `cudaHostAlloc`): `bytes_required(config)` bytes, no more.
   *        Initialisation is ordered on `stream` (and completed before returning); device
   *        memory is returned on `stream` at destruction, so it must outlive the hierarchy
   *        where the device resource is stream-ordered.
   *        Everything is allocated on `config.device` (-1: the current device, which
   *        `config().device` then names); `stream` must belong to that device.
   *        With `config.shared_host`, the host pages are the shared store's and the
   *        hierarchy is its writer or one of its readers (`shared_host_writer`).
   * @throws dhisparse::error naming the invalid field of `config`, a budget that does not
   *         fit it, a shared store of another shape or with a writer already, or a failed
   *         allocation
   */
  kv_hierarchy(hierarchy_config config, cudaStream_t stream)
    : kv_hierarchy(detail::device_guard{detail::chosen_device(config.device, "hierarchy_config.device")},
                   std::move(config), stream)
  {
  }

 private:
  /// The constructor, run with the hierarchy's device current (`on_device`, restored after).
  kv_hierarchy(detail::device_guard const& on_device, hierarchy_config&& config, cudaStream_t stream)
    : binding_{on_device.device()},
      config_{(config.device = on_device.device(), std::move(config))},
      ledger_{(detail::validate(config_), check_shared(config_), config_)},
      writer_{config_.shared_host_writer ? config_.shared_host.get() : nullptr},
      uploader_{detail::pinned_resource(config_.resources)},
      host_{make_store(config_, stream)},
      map_{config_.num_groups(), config_.map_page_positions, map_pages(config_), config_.max_requests,
           config_.max_context, stream, config_.resources}
  {
    int const groups               = config_.num_groups();
    device_memory_resource& device = detail::device_resource(config_.resources);
    std::vector<device_pool_ref> refs;
    for (int g = 0; g < groups; ++g) {
      device_pool_shape const shape = pool_shape(config_, ledger_, g);
      pools_.emplace_back(shape, config_.slab_memory.empty() ? nullptr : config_.slab_memory[g], stream,
                          config_.resources);
      refs.push_back(pools_.back().ref());
      if constexpr (reclaims) {
        std::int32_t const segments = reclaim_segments(config_);
        reclaim_memory_.emplace_back(reclaim_scratch_size(shape.num_slots, segments), device, stream);
        reclaim_memory_.back().fill_bytes(0, stream);
        reclaim_scratch_.push_back(make_reclaim_scratch(reclaim_memory_.back().data(), shape.num_slots, segments,
                                                        config_.reclaim_sample_slots));
      }
    }
    if constexpr (reclaims) {
      namespace rc    = detail::reclaim;
      reclaim_blocks_ = rc::resident_blocks(rc::resolve_reclaim_kernel<Eviction, rc::block_size>, rc::block_size);
      DHISPARSE_EXPECTS(reclaim_blocks_ > 0, "kv_hierarchy: no block of the reclaim kernel fits on the device");
    }
    device_arrays(config_, [&](auto member, std::size_t n) { detail::allocate(this->*member, n, device, stream); });
    uploader_.upload(pool_refs_.data(), refs.data(), refs.size() * sizeof(device_pool_ref), stream);
    uploader_.upload(layouts_.data(), host_.layouts().data(), groups * sizeof(group_layout), stream);

    batch_.fill_bytes(0, stream);
    requests_i32_.fill_bytes(0, stream);
    tail_slots_.fill_bytes(0xFF, stream);
    status_.fill_bytes(0, stream);
    step_queries_.fill_bytes(0xFF, stream);  // parents and positions -1 (depths: rewritten before use)
    // committed_rows(): 0 (nothing kept) for entries no commit has written, as the host
    // reference reports them.
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(const_cast<std::int32_t*>(committed_rows()), 0,
                                       std::size_t(config_.max_batch) * sizeof(std::int32_t), stream));
    commit_status_.fill_bytes(0, stream);
    workspace_bytes_ = resolve_workspace_size(config_.max_batch, config_.max_queries, config_.max_top_k,
                                              config_.max_context);
    order_at_    = order_workspace_offset(config_);
    order_bytes_ = config_.order_plans ? workspace_size(config_) - order_at_ : 0;
    for (int i = 0; i < 2; ++i) {
      slot_tables_[i].fill_bytes(0xFF, stream);
      plan_counts_[i].fill_bytes(0, stream);
      workspaces_[i].fill_bytes(0, stream);
    }
    status_host_ = detail::pinned_array<std::uint32_t>(1, detail::pinned_resource(config_.resources), nullptr);
    if (config_.shared_host_writer) {  // interprocess where the store is shared across processes
      cudaEvent_t e = nullptr;
      DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&e, config_.shared_host->writer_event_flags()));
      host_written_.reset(e);
      config_.shared_host->publish_writer_event(e);
    }
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

 public:

  /**
   * @brief Memory a hierarchy of `config` allocates, before constructing it: what the
   *        constructor asks `config.resources` for, to the byte (sizes as asked, before any
   *        rounding by the resource). Nothing is allocated after construction: `admit` and
   *        `reserve` take host pages and map pages from pools sized here (the host store's
   *        device page table is allocated whole, `[max_requests][max_context / P]`; only
   *        its host-side page lists grow, in ordinary heap memory).
   *
   * `device_bytes` holds the slabs (`slab_bytes`, 0 for caller slabs), the device pools'
   * metadata, the residency map, the page table and the step buffers; `pinned_bytes` the
   * host store's pages (with `host_memory::pinned`), the upload staging ring and a status
   * word. `host_store_bytes` reports the store's pages whatever their memory kind.
   * @throws dhisparse::error as the constructor does for an invalid configuration
   */
  static memory_footprint bytes_required(hierarchy_config const& config)
  {
    detail::validate(config);
    detail::budget_ledger<Budget> const ledger{config};
    memory_footprint f =
      config.shared_host != nullptr
        ? host_store::shared_bytes_required(config.host, config.max_requests, config.max_context)
        : host_store::bytes_required(config.host, config.group_layers, RowFormat::bytes, config.max_requests,
                                     config.max_context);
    f += residency_map::bytes_required(config.num_groups(), config.map_page_positions, map_pages(config),
                                       config.max_requests, config.max_context);
    for (int g = 0; g < config.num_groups(); ++g) {
      device_pool_shape const shape = pool_shape(config, ledger, g);
      f += device_pool::bytes_required(shape, !config.slab_memory.empty() && config.slab_memory[g] != nullptr);
      if constexpr (reclaims) { f.device_bytes += reclaim_scratch_size(shape.num_slots, reclaim_segments(config)); }
    }
    device_arrays(config, [&](auto member, std::size_t n) { f.device_bytes += detail::allocated_bytes(member, n); });
    f.pinned_bytes += detail::staging_uploader::ring_bytes + sizeof(std::uint32_t);  // ring, status word
    return f;
  }

  kv_hierarchy(kv_hierarchy&&) noexcept        = default;
  kv_hierarchy(kv_hierarchy const&)            = delete;
  kv_hierarchy& operator=(kv_hierarchy const&) = delete;
  /// Releases this hierarchy's memory on its own device, then takes over `o`.
  kv_hierarchy& operator=(kv_hierarchy&& o) noexcept
  {
    if (this != &o) {
      this->~kv_hierarchy();
      ::new (static_cast<void*>(this)) kv_hierarchy(std::move(o));
    }
    return *this;
  }
  /// Returns every allocation on the hierarchy's device; the caller's device is restored.
  ~kv_hierarchy() { binding_.enter_for_destruction(); }

  /// CUDA device ordinal the hierarchy runs on (`hierarchy_config::device`, resolved).
  [[nodiscard]] int device() const noexcept { return binding_.device(); }

  // ------------------------------------------------------------------------------------
  // Requests: host side, between steps.
  // ------------------------------------------------------------------------------------

  /**
   * @brief Admits a request whose first `length` positions are committed. Their rows must
   *        be written into the host store (`host_row`) before the first step that selects
   *        them: direct-to-host admission. Nothing is resident on the device yet (see
   *        `prewarm`).
   * @param capacity positions to back with storage (≥ length; default length + max_queries)
   * @throws dhisparse::error for a known id, lengths out of range, when the host store has
   *         too few free pages, or when the request's budget floor (which covers what it
   *         will write before the next backup) would not fit beside the admitted floors in
   *         every group's pool limit — nothing is changed then
   */
  void admit(request_id id, std::int32_t length, cudaStream_t stream, std::int64_t capacity = -1)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::admit");
    auto const on_device = binding_.enter();
    int const index      = requests_.check_admit(id, length, capacity);
    check_storage(id, index, capacity);
    ledger_.check(index, backed_capacity(index, capacity), "admit");
    if (host_.shared() != nullptr) { host_.hold(index, id, length, capacity, uploader_, stream); }
    requests_.insert(id);
    grow(index, capacity, stream);
    uploader_.upload_value(lengths() + index, length, stream);
    uploader_.upload_value(admitted() + index, std::int32_t{1}, stream);
  }

  /**
   * @brief Admits a request whose committed rows already lie in pages of the host store —
   *        an engine's host KV pool given as the store (`host_memory::caller`, its layout in
   *        `host_store_config::page_bytes` / `groups`) — and uses them where they are:
   *        positions [k P, (k + 1) P) are in page `pages[k]` (P = tokens_per_page). The
   *        pages must be free in the store (the engine's pool is the store's: pages it
   *        fills for a request it hands over here, and gets back as free pages with
   *        `release`). Capacity beyond them is backed with free pages as `admit` does.
   * @param pages     page indices of the store, host memory, at least ceil(length / P)
   * @param capacity  as `admit`; at least what the pages cover up to max_context
   * @throws dhisparse::error as `admit`, and for too few pages, a page outside the store,
   *         repeated, held by a request or released but not yet free — nothing is changed
   */
  void adopt(request_id id, std::int32_t length, std::int32_t const* pages, std::size_t num_pages,
             cudaStream_t stream, std::int64_t capacity = -1)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::adopt");
    auto const on_device = binding_.enter();
    DHISPARSE_EXPECTS(host_.shared() == nullptr, "adopt: not available with a shared host store");
    int const index        = requests_.check_admit(id, length, capacity);
    std::int64_t const tpp = config_.host.tokens_per_page;
    DHISPARSE_EXPECTS(pages != nullptr || num_pages == 0, "adopt: pages is null");
    DHISPARSE_EXPECTS(std::int64_t(num_pages) * tpp >= length,
                      "adopt: " + std::to_string(num_pages) + " pages cover " + std::to_string(num_pages * tpp) +
                        " positions, fewer than length (" + std::to_string(length) + ")");
    capacity = std::max(capacity, std::min<std::int64_t>(std::int64_t(num_pages) * tpp, config_.max_context));
    std::size_t const more = std::max<std::int64_t>(0, (capacity + tpp - 1) / tpp - std::int64_t(num_pages));
    DHISPARSE_EXPECTS(num_pages + more <= host_.free_pages(),
                      "host store exhausted: " + std::to_string(more) + " pages needed beside the " +
                        std::to_string(num_pages) + " adopted, " + std::to_string(host_.free_pages()) + " free");
    ledger_.check(index, backed_capacity(index, capacity), "adopt");
    host_.adopt(index, std::vector<std::int32_t>(pages, pages + num_pages), uploader_, stream);
    requests_.insert(id);
    grow(index, capacity, stream);
    uploader_.upload_value(lengths() + index, length, stream);
    uploader_.upload_value(admitted() + index, std::int32_t{1}, stream);
  }

  /**
   * @brief Backs positions [0, capacity) of a request with host pages and map pages, so
   *        that later steps can append tail rows up to there. All or nothing.
   * @throws dhisparse::error for an unknown id, capacity beyond max_context, an exhausted
   *         host store, or a floor that would no longer fit
   */
  void reserve(request_id id, std::int64_t capacity, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::reserve");
    auto const on_device = binding_.enter();
    int const index = requests_.index_of(id, "reserve");
    requests_.check_reserve(capacity);
    check_storage(id, index, capacity);
    ledger_.check(index, std::max(backed_capacity(index, capacity), host_.capacity(index)), "reserve");
    grow(index, capacity, stream);
  }

  /**
   * @brief Ends a request: its slots return to the free pools, its map and host pages to
   *        their pools (handed to a later admission once the stream passed this call, so
   *        a backup enqueued before it never writes into another request's pages). Valid
   *        at any time, also mid-step: a request of the current batch leaves the step — its
   *        entry gets 0 queries (resolve, commit and set_drafts skip it; its slot-table rows
   *        are stale and its attention outputs meaningless), its tail rows and its misses
   *        in the miss plans are dropped — and the other requests' step goes on. The
   *        device part is the launch-level `release_async` (release.cuh).
   * @throws dhisparse::error for an unknown id
   */
  void release(request_id id, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::release");
    auto const on_device = binding_.enter();
    int const index = requests_.index_of(id, "release");
    DHISPARSE_CUDA_TRY(release_async(release_args(index), stream));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(admitted() + index, 0, sizeof(std::int32_t), stream));
    map_.release(index, stream);
    host_.release(index, stream);
    ledger_.clear(index);
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

  /**
   * @brief The host-store rows of (id, group, layer) from position `first` to the end of
   *        its page, as a strided view (`host_row_run`): fill a page per call.
   * @throws dhisparse::error as `host_row`
   */
  [[nodiscard]] host_row_run host_rows(request_id id, int group, int layer, std::int64_t first) const
  {
    return host_.rows(requests_.index_of(id, "host_rows"), group, layer, first);
  }

  /**
   * @brief Writes the rows of positions [first, first + count) of (id, group, layer) into
   *        the host store from `source` — host or device memory, row k at
   *        `source + k × source_stride` — with one asynchronous copy per host page, ordered
   *        on `stream`: a bulk, direct-to-host admission (e.g. from an engine's prefill
   *        output). The rows must be written before the first step that selects them.
   * @throws dhisparse::error for an unknown id, positions beyond the request's capacity, a
   *         bad group or layer, a null source or a stride below the row size (nothing
   *         enqueued)
   */
  void write_host_rows(request_id id, int group, int layer, std::int64_t first, std::int64_t count,
                       void const* source, std::size_t source_stride, cudaStream_t stream) const
  {
    DHISPARSE_NVTX_RANGE("dhisparse::write_host_rows");
    auto const on_device = binding_.enter();
    host_.write_rows(requests_.index_of(id, "write_host_rows"), group, layer, first, count, source, source_stride,
                     stream);
  }

  /// The budget floor of request `id` (slots per group it is guaranteed).
  [[nodiscard]] std::int64_t floor(request_id id) const { return ledger_.floor(requests_.index_of(id, "floor")); }

  /// Sum of the floors of all admitted requests (slots per group).
  [[nodiscard]] std::int64_t floor_sum() const noexcept { return ledger_.floor_sum(); }

  // ------------------------------------------------------------------------------------
  // Pool memory: host side, between steps.
  // ------------------------------------------------------------------------------------

  /**
   * @brief Restricts group `group` to slots [0, limit) of its slab, so that an engine can
   *        use the rest of a caller-owned slab, or lifts the restriction. Lowering backs up
   *        every dirty row (all groups), releases optional rows in the budget's reclaim
   *        order until the rows fit (0 bytes over PCIe), and moves the rows still above the
   *        limit down on the device; raising hands the slots back to the free pool.
   *        Ordered on `stream`; the part above the limit is free for the engine once the
   *        stream reaches this point.
   * @throws dhisparse::error, changing nothing, for a limit outside [floor_sum(),
   *         device_slots_per_group]
   */
  void set_pool_limit(int group, std::int64_t limit, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::set_pool_limit");
    auto const on_device = binding_.enter();
    ledger_.check_limit(group, limit);
    if (limit < ledger_.limit(group)) { check_host_waited("set_pool_limit (lowering: backs rows up)"); }
    namespace hd                 = detail::hierarchy;
    std::int32_t const old_limit = std::int32_t(ledger_.limit(group));
    std::int32_t const lim       = std::int32_t(limit);
    device_pool_ref const pool   = pools_[group].ref();
    if (lim < old_limit) {
      back_up(stream);
      if constexpr (reclaims) { reclaim_to(group, old_limit - lim, 0, stream); }
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(pool.free_count, 0, sizeof(std::int32_t), stream));
      unsigned const blocks = launch_blocks(lim);
      hd::rebuild_free_kernel<hd::block_size><<<blocks, hd::block_size, 0, stream>>>(pool, lim);
      auto* moved = reinterpret_cast<std::int32_t*>(pool.keys);
      hd::move_down_kernel<hd::block_size>
        <<<launch_blocks(old_limit - lim), hd::block_size, 0, stream>>>(pool, map_.ref(), group, lim, old_limit, moved);
      hd::renumber_lists_kernel<hd::block_size><<<config_.max_requests, hd::block_size, 0, stream>>>(pool, lim, moved);
    } else if (lim > old_limit) {
      hd::grow_pool_kernel<hd::block_size>
        <<<launch_blocks(lim - old_limit), hd::block_size, 0, stream>>>(pool, old_limit, lim);
    }
    hd::set_limit_kernel<32><<<1, 32, 0, stream>>>(pool, old_limit, lim);
    DHISPARSE_CUDA_TRY(detail::check_launch(stream));
    ledger_.set_limit(group, limit);
  }

  /// Current pool limit of `group` (slots in use at most).
  [[nodiscard]] std::int64_t pool_limit(int group) const
  {
    requests_.check_group(group, "pool_limit");
    return ledger_.limit(group);
  }

  /**
   * @brief Shared budgets: releases optional rows of `group` (in the budget's reclaim order)
   *        until it has `free_slots` free slots, ordered on `stream`; 0 bytes move. Between
   *        steps only (no row is pinned then).
   */
  void reclaim(int group, std::int32_t free_slots, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::reclaim");
    auto const on_device = binding_.enter();
    requests_.check_group(group, "reclaim");
    if constexpr (reclaims) { reclaim_to(group, free_slots, 0, stream); }
  }

  /**
   * @brief Brings the most recent committed rows of request `id` — up to `count` per group —
   *        into free slots with one address-ordered gather per group, as far as free slots
   *        allow (never evicting; shared budgets keep `reclaim_low_watermark` slots free).
   *        Rows already resident are skipped. Ordered on `stream`, between steps.
   */
  void prewarm(request_id id, std::int32_t count, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::prewarm");
    auto const on_device = binding_.enter();
    int const index = requests_.index_of(id, "prewarm");
    DHISPARSE_EXPECTS(count >= 0, "prewarm: count must not be negative");
    for (int g = 0; g < config_.num_groups(); ++g) { prewarm_chunks(index, g, -1, count, stream); }
  }

  /**
   * @brief Like `prewarm`, for the committed positions [first, first + count) of one group.
   * @throws dhisparse::error for an unknown id, a bad group or a negative range
   */
  void prewarm_range(request_id id, int group, std::int32_t first, std::int32_t count, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::prewarm_range");
    auto const on_device = binding_.enter();
    int const index = requests_.index_of(id, "prewarm_range");
    requests_.check_group(group, "prewarm_range");
    DHISPARSE_EXPECTS(first >= 0 && count >= 0, "prewarm_range: first and count must not be negative");
    prewarm_chunks(index, group, first, count, stream);
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
    DHISPARSE_NVTX_RANGE("dhisparse::set_batch");
    auto const on_device = binding_.enter();
    auto const indices = requests_.batch_indices(ids, queries, count);
    // A step left open (resolved, not committed) is abandoned: its tail rows are recycled
    // and nothing is committed, so that no tail slot outlives the batch it was given to.
    commit_params abandon = commit_args(nullptr);
    abandon.mode          = commit_mode::abandon;
    DHISPARSE_CUDA_TRY(commit_async(abandon, stream));
    std::vector<std::int32_t> packed(1 + 2 * std::size_t(config_.max_batch), 0);
    packed[0] = count;
    std::copy(indices.begin(), indices.end(), packed.begin() + 1);
    std::copy(queries, queries + count, packed.begin() + 1 + config_.max_batch);
    uploader_.upload(batch_.data(), packed.data(), packed.size() * sizeof(std::int32_t), stream);
    batch_count_ = count;
    launch_drafts(nullptr, nullptr, stream);  // chains: parents q − 1, positions length + q
  }

  /**
   * @brief `set_batch` from device memory, so that a step captured once in a CUDA graph
   *        replays with a new batch: the engine writes the batch into `batch` before each
   *        replay (a stream-ordered copy, or mapped pinned memory it writes while no replay
   *        reads it), and the graph begins with this call. Like `set_batch`, a step left
   *        open is abandoned first and the entries get chains (`set_drafts` may follow).
   *        Capturable: three kernels, no host work, no synchronization.
   * @param batch device (or mapped pinned) `[1 + 2 max_batch]`, read when the stream gets
   *        here: the count, then max_batch request indices (`request_index(id)`), then
   *        max_batch query counts; entries from the count on are ignored. Not the
   *        hierarchy's own batch (`batch_ref()`).
   * Validated on the device, as the host reference's `load_batch` does: a count outside
   * [0, max_batch] is clamped; an entry whose index is not an admitted request, repeats an
   * earlier entry's index, or asks for queries outside [1, max_queries] takes no part in
   * the step (0 queries, as a request released mid-step); both raise
   * `status_invalid_batch`. `batch_count()` is not updated (the count lives on the device).
   * @throws dhisparse::error for a null `batch` (nothing enqueued)
   */
  void load_batch(std::int32_t const* batch, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::load_batch");
    auto const on_device = binding_.enter();
    DHISPARSE_EXPECTS(batch != nullptr, "load_batch: batch must not be null");
    commit_params abandon = commit_args(nullptr);
    abandon.mode          = commit_mode::abandon;
    DHISPARSE_CUDA_TRY(commit_async(abandon, stream));
    namespace hd = detail::hierarchy;
    hd::load_batch_params p{};
    p.source       = batch;
    p.batch        = batch_.data();
    p.admitted     = admitted();
    p.status       = status_.data();
    p.max_batch    = config_.max_batch;
    p.max_queries  = config_.max_queries;
    p.max_requests = config_.max_requests;
    hd::load_batch_kernel<hd::block_size><<<1, hd::block_size, 0, stream>>>(p);
    DHISPARSE_CUDA_TRY(detail::check_launch(stream));
    launch_drafts(nullptr, nullptr, stream);  // chains: parents q − 1, positions length + q
  }

  /**
   * @brief Sets the drafts of the current batch's next step from device memory, so that a
   *        captured step replays with new per-request verify lengths and trees: entry b gets
   *        1 + num_drafts[b] queries (query 0 the root, query j draft node j) and, with
   *        `parents`, a draft tree. Capturable (one kernel); call it after `set_batch` and
   *        before the step's first resolve. Positions (`query_positions`) follow: length +
   *        depth, so tree nodes of one depth share a position. Tail row j is still
   *        addressed as position length + j in selections (its query index: a query selects
   *        its own path's rows by their node indices, each ≤ its own), and
   *        `commit_verified` compacts the accepted path onto length, length + 1, …
   * @param num_drafts device `[max_batch]`: drafts of each entry, in [0, max_queries − 1]
   *        (the same array `verify_params::num_drafts` reads)
   * @param parents    device `[max_batch][max_queries]` or nullptr (chains): the parent query
   *        of each draft node j ≥ 1, in [0, j) (entry 0 of a row is ignored)
   * A bad count or tree raises `status_invalid_drafts` and gives that entry no drafts;
   * entries that left the step (released) stay out.
   * @throws dhisparse::error for a null `num_drafts` (nothing enqueued)
   */
  void set_drafts(std::int32_t const* num_drafts, std::int32_t const* parents, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::set_drafts");
    auto const on_device = binding_.enter();
    DHISPARSE_EXPECTS(num_drafts != nullptr, "set_drafts: num_drafts must not be null");
    launch_drafts(num_drafts, parents, stream);
  }

  /// Positions of the step's queries, device `[max_batch][max_queries]`: committed length +
  /// depth in the draft tree (chain: + q), -1 beyond an entry's queries. Written by
  /// `set_batch` and `set_drafts`, refreshed by every commit (new length, same tree).
  [[nodiscard]] std::int32_t const* query_positions() const noexcept { return query_positions_ptr(); }

  /// The step's draft tree, device `[max_batch][max_queries]`: the parent query of each
  /// query (-1 for the root and beyond an entry's queries).
  [[nodiscard]] std::int32_t const* query_parents() const noexcept { return step_queries_.data(); }

  /// Real batch size set by the last `set_batch` (not by `load_batch`: that count is read
  /// on the device; `batch_ref().size` holds the current one).
  [[nodiscard]] int batch_count() const noexcept { return batch_count_; }

  // ------------------------------------------------------------------------------------
  // The step: stream-ordered, allocation-free, host-sync-free, capturable.
  // ------------------------------------------------------------------------------------

  /**
   * @brief Resolves the selections of one layer group (see resolve.cuh).
   * @param selections device memory `[max_batch][max_queries][top_k]`, -1 = none, any order
   * @param top_k      K of this step, 1 ≤ top_k ≤ max_top_k; also the last dimension of
   *                   `slot_table(group)`
   * @param scores     optional device `[max_batch][max_queries][top_k]` indexer scores, for
   *                   eviction policies that use them (required when `needs_scores`)
   * @throws dhisparse::error for a bad group, top_k, null selections, or missing scores
   *         (nothing enqueued)
   */
  void resolve(int group, std::int32_t const* selections, int top_k, cudaStream_t stream,
               float const* scores = nullptr)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::resolve");
    auto const on_device = binding_.enter();
    resolve_rows(group, selections, top_k, stream, scores, false);
  }

  /**
   * @brief `resolve` and `retrieve` (all layers of the group) in one call: the rows are
   *        copied by the allocate blocks (batches of 16 or more) or by a gather launched
   *        as a programmatic dependent of allocate, so no launch gap separates them. The
   *        lowest latency when nothing needs to overlap the copy; `retrieve(g)` may still
   *        replay the plan (e.g. for a layer range).
   */
  void resolve_and_retrieve(int group, std::int32_t const* selections, int top_k, cudaStream_t stream,
                            float const* scores = nullptr)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::resolve_and_retrieve");
    auto const on_device = binding_.enter();
    resolve_rows(group, selections, top_k, stream, scores, true);
  }

 private:
  void resolve_rows(int group, std::int32_t const* selections, int top_k, cudaStream_t stream, float const* scores,
                    bool fetch)
  {
    requests_.check_resolve(group, selections, top_k);
    DHISPARSE_EXPECTS(!Eviction::needs_scores || scores != nullptr,
                      "resolve: the eviction policy needs per-selection scores (scores is null)");
    resolve_params p{};
    p.selections  = selections;
    p.scores      = scores;
    p.top_k       = top_k;
    p.group       = group;
    p.max_context = config_.max_context;
    p.layout      = host_.layout(group);
    p.batch       = batch_ref();
    p.pool        = pools_[group].ref();
    p.map         = map_.ref();
    p.host        = host_.ref();
    p.slot_table  = slot_tables_[group % 2].data();
    p.tail_slots  = tail_slots_.data() + std::size_t(group) * config_.max_batch * config_.max_queries;
    p.plan        = plan_ref(group);
    p.status      = status_.data();
    p.reclaim_low_watermark = config_.reclaim_low_watermark;
    p.reclaim_batch         = detail::reclaim_batch(config_);
    p.fetch_rows            = fetch;
    if constexpr (reclaims) {
      p.reclaim        = reclaim_scratch_[group];
      p.reclaim_blocks = config_.reclaim_blocks > 0 ? config_.reclaim_blocks : reclaim_blocks_;
    }
    DHISPARSE_CUDA_TRY(
      (resolve_async<Eviction, Budget>(p, workspaces_[group % 2].data(), workspace_bytes_, stream)));
    resolved_top_k_[std::size_t(group)] = top_k;
    plan_ordered_[std::size_t(group % 2)] = false;
  }

 public:

  /**
   * @brief Copies the rows missed by the last resolve of `group` into its slab, for the
   *        layers [layer_begin, layer_end) of the group (default: all).
   */
  void retrieve(int group, cudaStream_t stream, int layer_begin = 0, int layer_end = -1)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::retrieve");
    auto const on_device = binding_.enter();
    requests_.check_retrieve(group, layer_begin, layer_end);
    retrieve_params const args = retrieve_args(group, plan_ref(group), layer_begin, layer_end);
    bool& ordered              = plan_ordered_[std::size_t(group % 2)];
    if (config_.order_plans && !ordered) {  // the first retrieve of this plan orders it
      plan_order_params const order{plan_ref(group), host_.ref().base, host_.bytes(), config_.order_plans_min_entries};
      DHISPARSE_CUDA_TRY(retrieve_async(args, order, workspaces_[group % 2].data() + order_at_, order_bytes_, 0, stream));
      ordered = true;
      return;
    }
    DHISPARSE_CUDA_TRY(retrieve_async(args, 0, stream));
  }

  /**
   * @brief Commits the tail rows of the step in every group (see commit.cuh): entry b keeps
   *        tail rows 0 … accepted[b] − 1, cut at the first one without a slot in some group
   *        (`status_missing_tail`). Per entry, `committed_rows()` and `commit_status()` say
   *        what was kept and why not more.
   * @param accepted device `[max_batch]` tail rows to keep per batch entry, or nullptr to
   *                 keep all (plain decoding)
   */
  void commit(std::int32_t const* accepted, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::commit");
    auto const on_device = binding_.enter();
    DHISPARSE_CUDA_TRY(commit_async(commit_args(accepted), stream));
  }

  /**
   * @brief Commits a verified step straight from verification's outputs, on the device
   *        (see commit.cuh): entry b keeps its root row and the rows of its accepted drafts
   *        in path order (a tree path compacted onto length, length + 1, … by relabelling
   *        slots), cut at the first row without a slot in some group; everything else of
   *        the step is recycled; `v.emitted` / `v.next_token` are cut to the tokens whose
   *        rows were committed; a draft ring in `v` keeps the same path. Capturable.
   * @throws dhisparse::error naming a bad field of `v` (nothing enqueued)
   */
  void commit_verified(verified_step const& v, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::commit_verified");
    auto const on_device = binding_.enter();
    DHISPARSE_EXPECTS_NO_PROBLEM(verified_step_problem(v));
    commit_params p = commit_args(nullptr);
    p.mode          = commit_mode::verified;
    p.verified      = v;
    DHISPARSE_CUDA_TRY(commit_async(p, stream));
  }

  /// Per batch entry, device `[max_batch]`: the status bits the last commit raised for it
  /// (0: every row it asked for was kept; `status_missing_tail`, `status_invalid_accept_count`).
  [[nodiscard]] std::uint32_t const* commit_status() const noexcept { return commit_status_.data(); }

  /// Per batch entry, device `[max_batch]`: the tail rows the last commit kept (with
  /// `commit_verified`: the request's new tokens this step).
  [[nodiscard]] std::int32_t const* committed_rows() const noexcept
  {
    return step_queries_.data() + 3 * std::size_t(config_.max_batch) * config_.max_queries;
  }

  /**
   * @brief Copies every committed, not yet backed-up row to the host store (see
   *        backup.cuh); the rows become clean.
   *
   * With a shared host store (shared_host_store.cuh): the writer copies and records an
   * event after the copies, which it returns — every reader hands it to `wait_host` before
   * its own `backup`. A reader copies nothing: its committed rows (the same bytes the
   * writer copied) are marked clean, so a reader must have called `wait_host` since its
   * last backup.
   * @return the writer's event (valid until its next backup), nullptr otherwise
   * @throws dhisparse::error for a reader that did not call `wait_host` (nothing enqueued)
   */
  cudaEvent_t backup(cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::backup");
    auto const on_device = binding_.enter();
    check_host_waited("backup");
    back_up(stream);
    ++backups_;
    if (host_written_ != nullptr) {
      DHISPARSE_CUDA_TRY(cudaEventRecord(host_written_.get(), stream));
      config_.shared_host->count_writer_backup();  // after the record: a reader that sees the count waits for it
    }
    return host_written_.get();
  }

  /**
   * @brief A reader of a shared host store: orders the work enqueued on `stream` after
   *        this call (its next `backup` first) after `writer_backup`, the event the writer's
   *        `backup` returned (of any device). Capturable where the event's record is part
   *        of the same capture.
   * @throws dhisparse::error for a null event
   */
  void wait_host(cudaEvent_t writer_backup, cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::wait_host");
    auto const on_device = binding_.enter();
    DHISPARSE_EXPECTS(writer_backup != nullptr, "wait_host: writer_backup is null");
    DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(stream, writer_backup, 0));
    host_waited_ = true;
  }

  /**
   * @brief A reader of a shared host store, in this process or another (the store made by
   *        `shared_host_store::create` / `open`): waits on the host until the writer has
   *        done as many backups as this reader will have done with its next one, then orders
   *        the work enqueued on `stream` after this call (its next `backup` first) after the
   *        writer's event. Every rank backs up once per step, the readers after the writer.
   *        Not capturable (it waits on the host): capture the event form with external
   *        event nodes instead.
   * @throws dhisparse::error for the writer, or when the writer's backup does not come
   *         within `timeout` (naming both counts; nothing enqueued)
   */
  void wait_host(cudaStream_t stream, std::chrono::milliseconds timeout = std::chrono::seconds(60))
  {
    DHISPARSE_NVTX_RANGE("dhisparse::wait_host");
    auto const on_device = binding_.enter();
    DHISPARSE_EXPECTS(host_reader(), "wait_host(stream): only a reader of a shared host store waits for the writer");
    cudaEvent_t const written = config_.shared_host->await_writer_backups(backups_ + 1, timeout);
    DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(stream, written, 0));
    host_waited_ = true;
  }

  /// Whether this hierarchy reads a shared host store that another hierarchy backs up.
  [[nodiscard]] bool host_reader() const noexcept
  {
    return config_.shared_host != nullptr && !config_.shared_host_writer;
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
  /// Valid from `resolve` until `commit` / `commit_verified`, which consume them and set
  /// them back to -1: the model writes its tail rows in between.
  [[nodiscard]] std::int32_t const* tail_slots(int group) const
  {
    requests_.check_group(group, "tail_slots");
    return tail_slots_.data() + std::size_t(group) * config_.max_batch * config_.max_queries;
  }

  /// Rows of layer `layer` of `group` in the slab (attention input, tail row output).
  [[nodiscard]] layer_view layer_rows(int group, int layer) const
  {
    requests_.check_layer(group, layer, "layer_rows");
    return {pools_[group].slab() + std::size_t(layer) * RowFormat::bytes, pools_[group].group_row_bytes()};
  }

  /**
   * @brief Sparse attention arguments for layer `layer` of `group` over the slot table of
   *        the last resolve of `group`: `rows` / `row_stride` (the layer's rows in the
   *        slab), `num_slots` (the slab's slots), `slots` with its strides
   *        (`[max_batch][max_queries][top_k]`), `batch_size` (the real batch size in device
   *        memory), `batch` = max_batch, `num_queries` = max_queries and `top_k` = the K of
   *        that resolve. The engine adds `queries`, `out`, `lse` and their strides (e.g.
   *        `sparse_attention::set_contiguous_strides<fmt>(p)`, which leaves the slot strides
   *        as they are), `num_heads` and `softmax_scale`; `status` stays null (set it to
   *        `status()` to have invalid slots flagged in the hierarchy's word, as attention's
   *        own bit `sparse_attention::status_invalid_slot`). A query
   *        beyond an entry's Q_b has an empty selection (out 0, lse -inf); an entry that
   *        left the step (released mid-step) has stale rows: ignore its outputs. Valid
   *        until the next resolve of a group of the same parity. Host only, no launch.
   * @throws dhisparse::error for a bad group or layer, or a group not resolved yet
   */
  [[nodiscard]] sparse_attention::params attention_params(int group, int layer) const
  {
    requests_.check_layer(group, layer, "attention_params");
    int const top_k = resolved_top_k_[std::size_t(group)];
    DHISPARSE_EXPECTS(top_k > 0, "attention_params: group " + std::to_string(group) + " has not been resolved");
    layer_view const rows = layer_rows(group, layer);
    sparse_attention::params p{};
    p.rows              = rows.rows;
    p.row_stride        = rows.stride;
    p.num_slots         = std::int64_t(config_.device_slots_per_group);
    p.slots             = slot_tables_[group % 2].data();
    p.slot_stride_query = top_k;
    p.slot_stride_batch = std::int64_t(config_.max_queries) * top_k;
    p.batch_size        = batch_.data();
    p.batch             = config_.max_batch;
    p.num_queries       = config_.max_queries;
    p.top_k             = top_k;
    return p;
  }

  /// K of the last resolve of `group` (the last dimension of `slot_table(group)`); 0 before
  /// the first.
  [[nodiscard]] int resolved_top_k(int group) const
  {
    requests_.check_group(group, "resolved_top_k");
    return resolved_top_k_[std::size_t(group)];
  }

  /// Device view of the miss plan of the last resolve of `group`.
  [[nodiscard]] miss_plan_ref plan_ref(int group) const
  {
    return {plans_[group % 2].data(), plan_counts_[group % 2].data(), std::int32_t(config_.step_entries())};
  }

  /// Device view of one group's pool (slot metadata).
  [[nodiscard]] device_pool_ref pool_ref(int group) const
  {
    requests_.check_group(group, "pool_ref");
    return pools_[group].ref();
  }

  /// Device view of the batch (sizes, request indices, queries, lengths, budgets).
  [[nodiscard]] step_batch_ref batch_ref() const noexcept
  {
    return {batch_.data(), batch_.data() + 1, batch_.data() + 1 + config_.max_batch,
            lengths(),     capacities(),      floors(),
            caps(),        config_.max_batch, config_.max_queries};
  }

  /// Committed lengths, device `[max_requests]` indexed by `request_index` (updated by
  /// every commit on the device; read it asynchronously, or with `length_sync`).
  [[nodiscard]] std::int32_t const* committed_lengths() const noexcept { return lengths(); }

  /// The committed length of request `id` (positions 0 … length − 1); synchronizes
  /// `stream`. @throws dhisparse::error for an unknown id
  [[nodiscard]] std::int32_t length_sync(request_id id, cudaStream_t stream) const
  {
    auto const on_device = binding_.enter();
    int const index = requests_.index_of(id, "length_sync");
    std::int32_t length = 0;
    DHISPARSE_CUDA_TRY(
      cudaMemcpyAsync(&length, lengths() + index, sizeof length, cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return length;
  }

  /// Internal index of an admitted request (the value kernels see in `batch.requests`).
  [[nodiscard]] int request_index(request_id id) const { return requests_.index_of(id, "request_index"); }

  [[nodiscard]] hierarchy_config const& config() const noexcept { return config_; }
  [[nodiscard]] host_store const& store() const noexcept { return host_; }
  [[nodiscard]] residency_map const& map() const noexcept { return map_; }

  // ------------------------------------------------------------------------------------
  // Status and counters.
  // ------------------------------------------------------------------------------------

  /// Device address of the status word (see status.hpp), e.g. to copy it asynchronously.
  /// It holds the hierarchy's bits (`status_mask_hierarchy`); attention and a draft ring
  /// kept by `commit_verified` may OR their own bits into it too (`params::status`,
  /// `verified_step::ring_status`).
  [[nodiscard]] std::uint32_t* status() const noexcept { return status_.data(); }

  /// Reads the status word; synchronizes `stream`.
  [[nodiscard]] std::uint32_t status_sync(cudaStream_t stream) const
  {
    auto const on_device = binding_.enter();
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(status_host_.data(), status_.data(), sizeof(std::uint32_t),
                                       cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return *status_host_.data();
  }

  /// Clears the status word, ordered on `stream`.
  void clear_status(cudaStream_t stream)
  {
    DHISPARSE_NVTX_RANGE("dhisparse::clear_status");
    auto const on_device = binding_.enter();
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(status_.data(), 0, sizeof(std::uint32_t), stream));
  }

  /// Device address of the counters of `group` (see `group_counters`).
  [[nodiscard]] group_counters const* counters(int group) const
  {
    requests_.check_group(group, "counters");
    return pools_[group].ref().counters;
  }

  /**
   * @brief Copies the counters of `group` into `out` (host memory; pinned for a truly
   *        asynchronous copy) on `stream`: valid once the stream reaches this point.
   */
  void read_counters(int group, group_counters* out, cudaStream_t stream) const
  {
    DHISPARSE_NVTX_RANGE("dhisparse::read_counters");
    auto const on_device = binding_.enter();
    DHISPARSE_CUDA_TRY(
      cudaMemcpyAsync(out, counters(group), sizeof(group_counters), cudaMemcpyDeviceToHost, stream));
  }

  /**
   * @brief For a monitor on its own stream: makes `monitor_stream` wait for `after` (an
   *        event the engine recorded on the step stream, e.g. behind a commit or a backup),
   *        then copies the counters of `group` into `out` on `monitor_stream`. The step
   *        stream is never synchronized or blocked; synchronize `monitor_stream` (or an
   *        event recorded on it) before reading `out`. With `out` in pinned memory the copy
   *        is truly asynchronous. The copy shows every count of the work before `after`;
   *        work the step stream runs after `after` may already be partly counted (each
   *        counter only grows). Use `group_row_bytes(group)` with
   *        `group_counters::h2d_bytes` / `d2h_bytes` for the bytes moved.
   * @param after event recorded on the step stream, or nullptr: no wait (a snapshot of
   *        whatever the device has counted when the copy runs)
   */
  void read_counters(int group, group_counters* out, cudaStream_t monitor_stream, cudaEvent_t after) const
  {
    DHISPARSE_NVTX_RANGE("dhisparse::read_counters");
    auto const on_device = binding_.enter();
    requests_.check_group(group, "read_counters");
    if (after != nullptr) { DHISPARSE_CUDA_TRY(cudaStreamWaitEvent(monitor_stream, after, 0)); }
    DHISPARSE_CUDA_TRY(
      cudaMemcpyAsync(out, counters(group), sizeof(group_counters), cudaMemcpyDeviceToHost, monitor_stream));
  }

  /// Bytes of one row of `group` in its slab and the host store (all its layers): what one
  /// fetched or backed-up row moves over PCIe.
  [[nodiscard]] std::size_t group_row_bytes(int group) const
  {
    requests_.check_group(group, "group_row_bytes");
    return pools_[group].group_row_bytes();
  }

 private:
  /// The marking or copying part of `backup` (readers: after `wait_host`).
  void back_up(cudaStream_t stream)
  {
    backup_params p{};
    p.pools      = pool_refs_.data();
    p.layouts    = layouts_.data();
    p.host       = host_.ref();
    p.lengths    = lengths();
    p.num_groups = config_.num_groups();
    p.copy_rows  = !host_reader();
    DHISPARSE_CUDA_TRY(backup_async(p, config_.backup_blocks, stream));
    host_waited_ = false;
  }

  void check_host_waited(char const* what) const
  {
    DHISPARSE_EXPECTS(!host_reader() || host_waited_,
                      std::string(what) + ": a reader of a shared host store marks its rows clean only after "
                                          "wait_host(the writer's backup event) (shared_host_store.cuh)");
  }

  /// A shared store must describe the same pages as `c.host`, for rows of this format.
  static int check_shared(hierarchy_config const& c)
  {
    shared_host_store const* s = c.shared_host.get();
    if (s == nullptr) { return 0; }
    DHISPARSE_EXPECTS(s->row_bytes() == RowFormat::bytes, "hierarchy_config.shared_host: rows of " +
                                                            std::to_string(s->row_bytes()) + " bytes, the row format has " +
                                                            std::to_string(RowFormat::bytes));
    DHISPARSE_EXPECTS(s->group_layers() == c.group_layers,
                      "hierarchy_config.shared_host: its group_layers differ from the configuration's");
    DHISPARSE_EXPECTS(s->max_context() >= c.max_context,
                      "hierarchy_config.shared_host: its max_context is below the configuration's");
    host_store_config const& h = s->config();
    DHISPARSE_EXPECTS(h.capacity_pages == c.host.capacity_pages && h.tokens_per_page == c.host.tokens_per_page &&
                        h.page_bytes == c.host.page_bytes,
                      "hierarchy_config.host must describe the shared store (host = shared_host->config())");
    return 0;
  }

  static host_store make_store(hierarchy_config const& c, cudaStream_t stream)
  {
    if (c.shared_host != nullptr) { return host_store{c.shared_host, c.max_requests, stream, c.resources}; }
    return host_store{c.host, c.group_layers, RowFormat::bytes, c.max_requests, c.max_context, stream, c.resources};
  }

  /// The writer's registration with its shared store (one writer per store).
  class writer_registration {
   public:
    explicit writer_registration(shared_host_store* store) : store_{store}
    {
      if (store_ != nullptr) { store_->attach_writer(); }
    }
    writer_registration(writer_registration&& o) noexcept : store_{std::exchange(o.store_, nullptr)} {}
    writer_registration& operator=(writer_registration&&) = delete;
    ~writer_registration()
    {
      if (store_ != nullptr) { store_->detach_writer(); }
    }

   private:
    shared_host_store* store_ = nullptr;
  };

  struct event_destroy {
    void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
  };

  /// The device pool of `group` (the constructor and `bytes_required`).
  static device_pool_shape pool_shape(hierarchy_config const& c, detail::budget_ledger<Budget> const& ledger,
                                      int group)
  {
    device_pool_shape shape{};
    shape.num_slots       = std::int32_t(c.device_slots_per_group);
    shape.max_requests    = c.max_requests;
    shape.spare_capacity  = c.max_queries;
    shape.dirty_capacity  = c.max_batch * c.max_queries * c.backup_interval_steps;
    shape.group_row_bytes = std::size_t(c.group_layers[group]) * RowFormat::bytes;
    if constexpr (per_request) {
      shape.max_owned = ledger.cap_at(c.max_context);
      if constexpr (Eviction::search == victim_search::smallest_key) {
        shape.cache_capacity = std::clamp(shape.max_owned / 4, 1, detail::resolve::max_cache_entries);
      }
    }
    return shape;
  }
  static std::int32_t reclaim_segments(hierarchy_config const& c)
  {
    return Budget::reclaim == reclaim_order::fair_share ? c.max_requests : 1;
  }
  /// Resolve's workspace, then (with `order_plans`) `order_plan_async`'s, per parity.
  static std::size_t order_workspace_offset(hierarchy_config const& c)
  {
    std::size_t const resolve_bytes = resolve_workspace_size(c.max_batch, c.max_queries, c.max_top_k, c.max_context);
    return (resolve_bytes + 255) / 256 * 256;
  }
  static std::size_t workspace_size(hierarchy_config const& c)
  {
    if (!c.order_plans) { return resolve_workspace_size(c.max_batch, c.max_queries, c.max_top_k, c.max_context); }
    std::size_t page_bytes = 0;  // the store's address range, as the host store lays it out
    detail::make_group_layouts(c.host, c.group_layers, RowFormat::bytes, page_bytes);
    return order_workspace_offset(c) +
           order_plan_workspace_size(page_bytes * c.host.capacity_pages, std::int32_t(c.step_entries()));
  }

  /// Calls `f(member, elements)` for every device array of the hierarchy itself (not of its
  /// components): the constructor allocates them, `bytes_required` sums them.
  template <class F>
  static void device_arrays(hierarchy_config const& c, F&& f)
  {
    std::size_t const groups = std::size_t(c.num_groups());
    std::size_t const batch  = std::size_t(c.max_batch);
    f(&kv_hierarchy::pool_refs_, groups);
    f(&kv_hierarchy::layouts_, groups);
    f(&kv_hierarchy::batch_, 1 + 2 * batch);
    f(&kv_hierarchy::requests_i32_, 5 * std::size_t(c.max_requests));
    f(&kv_hierarchy::tail_slots_, groups * batch * c.max_queries);
    f(&kv_hierarchy::status_, 1);
    f(&kv_hierarchy::step_queries_, 3 * batch * c.max_queries + batch);
    f(&kv_hierarchy::commit_status_, batch);
    f(&kv_hierarchy::prewarm_plan_, std::size_t(prewarm_chunk));
    f(&kv_hierarchy::prewarm_count_, 1);
    f(&kv_hierarchy::slot_tables_, c.step_entries());  // two of each: double-buffered by group parity
    f(&kv_hierarchy::plans_, c.step_entries());
    f(&kv_hierarchy::plan_counts_, 1);
    f(&kv_hierarchy::workspaces_, workspace_size(c));
  }

  static std::size_t map_pages(hierarchy_config const& c)
  {
    std::size_t const tokens = c.host.capacity_pages * std::size_t(c.host.tokens_per_page);
    return (tokens + c.map_page_positions - 1) / c.map_page_positions + c.max_requests;
  }

  std::int32_t* lengths() const noexcept { return requests_i32_.data(); }
  std::int32_t* query_positions_ptr() const noexcept
  {
    return step_queries_.data() + 2 * std::size_t(config_.max_batch) * config_.max_queries;
  }

  /// The launch-level release of request `index`, leaving the current step (release.cuh).
  release_params release_args(int index) const
  {
    release_params p{};
    p.pools             = pool_refs_.data();
    p.num_groups        = config_.num_groups();
    p.num_slots         = std::int32_t(config_.device_slots_per_group);
    p.owned_lists       = per_request;
    p.map               = map_.ref();
    p.request           = index;
    p.batch_size        = batch_.data();
    p.batch_requests    = batch_.data() + 1;
    p.batch_queries     = batch_.data() + 1 + config_.max_batch;
    p.tail_slots        = tail_slots_.data();
    p.query_positions   = query_positions_ptr();
    p.max_batch         = config_.max_batch;
    p.max_queries       = config_.max_queries;
    p.plans[0]          = plan_ref(0);
    p.plans[1]          = plan_ref(1);
    p.host              = host_.ref();
    p.request_fields[0] = lengths();
    p.request_fields[1] = capacities();
    p.request_fields[2] = floors();
    p.request_fields[3] = caps();
    return p;
  }

  /// A plain commit of the current batch (outputs per entry, positions refreshed).
  commit_params commit_args(std::int32_t const* accepted) const
  {
    std::size_t const step = std::size_t(config_.max_batch) * config_.max_queries;
    commit_params p{};
    p.batch          = batch_ref();
    p.accepted       = accepted;
    p.pools          = pool_refs_.data();
    p.tail_slots     = tail_slots_.data();
    p.map            = map_.ref();
    p.num_groups     = config_.num_groups();
    p.status         = status_.data();
    p.mode           = commit_mode::plain;
    p.parents        = step_queries_.data();
    p.depths         = step_queries_.data() + step;
    p.positions      = query_positions_ptr();
    p.committed      = step_queries_.data() + 3 * step;
    p.request_status = commit_status_.data();
    return p;
  }

  /// The drafts kernel over the current batch (see detail/hierarchy/step_kernels.cuh).
  void launch_drafts(std::int32_t const* num_drafts, std::int32_t const* parents, cudaStream_t stream)
  {
    namespace hd           = detail::hierarchy;
    std::size_t const step = std::size_t(config_.max_batch) * config_.max_queries;
    hd::drafts_params p{};
    p.batch_size  = batch_.data();
    p.requests    = batch_.data() + 1;
    p.queries     = batch_.data() + 1 + config_.max_batch;
    p.lengths     = lengths();
    p.num_drafts  = num_drafts;
    p.parents_in  = parents;
    p.parents     = step_queries_.data();
    p.depths      = step_queries_.data() + step;
    p.positions   = query_positions_ptr();
    p.status      = status_.data();
    p.max_batch   = config_.max_batch;
    p.max_queries = config_.max_queries;
    unsigned const blocks = unsigned((config_.max_batch + hd::block_size - 1) / hd::block_size);
    hd::drafts_kernel<hd::block_size><<<blocks, hd::block_size, 0, stream>>>(p);
    DHISPARSE_CUDA_TRY(detail::check_launch(stream));
  }
  std::int32_t* capacities() const noexcept { return requests_i32_.data() + config_.max_requests; }
  std::int32_t* floors() const noexcept { return requests_i32_.data() + 2 * config_.max_requests; }
  std::int32_t* caps() const noexcept { return requests_i32_.data() + 3 * config_.max_requests; }
  /// 1 for an admitted request index, 0 otherwise (what `load_batch` validates against).
  std::int32_t* admitted() const noexcept { return requests_i32_.data() + 4 * config_.max_requests; }

  unsigned launch_blocks(std::int64_t work) const
  {
    return unsigned(std::clamp<std::int64_t>((work + detail::hierarchy::block_size - 1) / detail::hierarchy::block_size,
                                             1, 4 * detail::multiprocessor_count()));
  }

  /// Positions the host pages will back for a request asking for `capacity` (whole pages,
  /// up to max_context).
  std::int64_t backed_capacity(int index, std::int64_t capacity) const
  {
    std::int64_t const page   = config_.host.tokens_per_page;
    std::int64_t const pages  = (capacity + page - 1) / page;
    return std::max(host_.capacity(index), std::min<std::int64_t>(pages * page, config_.max_context));
  }

  /// Backs [0, capacity) with host pages (whole pages) and map pages, and sets the
  /// request's capacity and budget; the usable capacity is what the pages back, up to
  /// max_context.
  void grow(int index, std::int64_t capacity, cudaStream_t stream)
  {
    host_.grow(index, capacity, uploader_, stream);
    std::int32_t const backed =
      std::int32_t(std::min<std::int64_t>(host_.capacity(index), config_.max_context));
    map_.grow(index, backed, uploader_, stream);
    ledger_.set(index, backed);
    std::int32_t const values[2] = {std::int32_t(ledger_.floor(index)), ledger_.cap(index)};
    uploader_.upload_value(capacities() + index, backed, stream);
    uploader_.upload_value(floors() + index, values[0], stream);
    uploader_.upload_value(caps() + index, values[1], stream);
  }

  /// Throws before anything changes if the host store would run out. (The map's pool is
  /// sized from the host store's capacity plus one partial page per request, so it cannot
  /// run out first.)
  void check_storage(request_id id, int index, std::int64_t capacity) const
  {
    std::size_t const host_need = host_.shared() != nullptr ? host_.shared()->missing_pages(id, capacity)
                                                            : host_.missing_pages(index, capacity);
    DHISPARSE_EXPECTS(host_need <= host_.free_pages(),
                      "host store exhausted: " + std::to_string(host_need) + " pages needed, " +
                        std::to_string(host_.free_pages()) + " free");
  }

  retrieve_params retrieve_args(int group, miss_plan_ref plan, int layer_begin, int layer_end) const
  {
    retrieve_params p{};
    p.plan            = plan;
    p.slab            = pools_[group].slab();
    p.group_row_bytes = pools_[group].group_row_bytes();
    p.byte_begin      = std::size_t(layer_begin) * RowFormat::bytes;
    p.byte_end        = std::size_t(layer_end) * RowFormat::bytes;
    return p;
  }

  void reclaim_to(int group, std::int32_t free_slots, std::uint32_t pin_epoch, cudaStream_t stream)
  {
    reclaim_params p{};
    p.pool        = pools_[group].ref();
    p.map         = map_.ref();
    p.scratch     = reclaim_scratch_[group];
    p.group       = group;
    p.floors      = floors();
    p.order       = Budget::reclaim;
    p.pin_epoch   = pin_epoch;
    p.target_free = free_slots;
    p.blocks      = reclaim_blocks_;
    DHISPARSE_CUDA_TRY(reclaim_async<Eviction>(p, stream));
  }

  /// Prewarm of positions [first, first + count) of one group (first < 0: the last `count`
  /// committed positions), one chunk of the prewarm plan at a time, most recent first.
  void prewarm_chunks(int index, int group, std::int32_t first, std::int32_t count, cudaStream_t stream)
  {
    namespace hd = detail::hierarchy;
    hd::prewarm_params p{};
    p.pool        = pools_[group].ref();
    p.map         = map_.ref();
    p.host        = host_.ref();
    p.layout      = host_.layout(group);
    p.group       = group;
    p.request     = index;
    p.first       = first;
    p.count       = count;
    p.lengths     = lengths();
    p.caps        = caps();
    p.per_request = per_request;
    p.reserve     = reclaims ? config_.reclaim_low_watermark : 0;
    p.plan        = {prewarm_plan_.data(), prewarm_count_.data(), prewarm_chunk};
    for (p.chunk = 0; std::int64_t(p.chunk) * prewarm_chunk < count; ++p.chunk) {
      hd::prewarm_kernel<Eviction, hd::block_size><<<1, hd::block_size, 0, stream>>>(p);
      DHISPARSE_CUDA_TRY(detail::check_launch(stream));
      DHISPARSE_CUDA_TRY(retrieve_async(retrieve_args(group, p.plan, 0, config_.group_layers[group]), 0, stream));
    }
  }

  detail::device_binding binding_;  // first: destroyed last, after the members that free device memory
  hierarchy_config config_;
  detail::budget_ledger<Budget> ledger_;
  writer_registration writer_;
  detail::staging_uploader uploader_;
  host_store host_;
  residency_map map_;
  std::vector<device_pool> pools_;
  std::vector<detail::device_array<std::byte>> reclaim_memory_;
  std::vector<reclaim_scratch_ref> reclaim_scratch_;
  int reclaim_blocks_ = 0;
  detail::device_array<device_pool_ref> pool_refs_;
  detail::device_array<group_layout> layouts_;
  detail::device_array<std::int32_t> batch_;         // [1 + 2 max_batch]: size, requests, queries
  detail::device_array<std::int32_t> requests_i32_;  // [5][max_requests]: lengths, capacities, floors, caps, admitted
  detail::device_array<std::int32_t> tail_slots_;
  detail::device_array<std::uint32_t> status_;
  /// [3][max_batch][max_queries] + [max_batch]: the step's parents, depths, positions, then
  /// the rows the last commit kept per entry.
  detail::device_array<std::int32_t> step_queries_;
  detail::device_array<std::uint32_t> commit_status_;  // [max_batch]
  detail::device_array<miss_entry> prewarm_plan_;
  detail::device_array<std::int32_t> prewarm_count_;
  std::array<detail::device_array<std::int32_t>, 2> slot_tables_;
  std::array<detail::device_array<miss_entry>, 2> plans_;
  std::array<detail::device_array<std::int32_t>, 2> plan_counts_;
  std::array<detail::device_array<std::byte>, 2> workspaces_;
  std::size_t workspace_bytes_ = 0;        // resolve's part of each workspace
  std::size_t order_at_        = 0;        // order_plans: where its part starts, and its bytes
  std::size_t order_bytes_     = 0;
  std::array<bool, 2> plan_ordered_{};     // per parity: the plan was ordered since its resolve
  detail::pinned_array<std::uint32_t> status_host_;
  detail::request_table requests_{config_};
  int batch_count_ = 0;
  std::unique_ptr<CUevent_st, event_destroy> host_written_;  // shared store writer: recorded by backup
  bool host_waited_ = false;                                 // shared store reader: wait_host since backup
  std::uint64_t backups_ = 0;                                // `backup` calls (a reader's wait_host(stream) counts them)
  std::vector<int> resolved_top_k_ = std::vector<int>(std::size_t(config_.num_groups()), 0);  // per group
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
