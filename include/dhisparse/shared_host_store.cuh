/**
 * @file shared_host_store.cuh
 * @brief One host store serving several hierarchies: the tensor-parallel ranks of one
 *        data-parallel replica, which all hold the same latent KV.
 *
 * The store owns the pinned pages (mapped and portable, so every device reads them
 * zero-copy) and one page allocator keyed by request id. Each hierarchy built with it
 * (`hierarchy_config::shared_host`) keeps its own device page table, filled with the
 * pages the shared allocator chose; `host_store_ref` of every rank addresses the same
 * bytes. Exactly one hierarchy is the *writer* (`hierarchy_config::shared_host_writer`):
 * its `backup` copies committed rows into the pages; the *readers* only read them
 * (retrieve, prewarm), and their `backup` marks their committed rows clean without
 * copying, once `wait_host` ordered it after the writer's backup.
 *
 * Contract (docs/integration.md, "Tensor-parallel ranks sharing a host store"):
 * * every rank admits the same request ids with the same length and capacity, reserves
 *   and releases them alike, and commits the same rows (the model computes the same
 *   latent KV on every rank). Checked: a length that differs from the first admission's
 *   (`admit` throws, nothing changes). Not checkable on the host: the bytes and accepted
 *   lengths of each step (they live on the devices).
 * * prefill rows are written once (by any rank, `write_host_rows` / `host_row`) before any
 *   rank's first step that selects them.
 * * per step: the writer's `backup(stream)` returns an event recorded after the copies;
 *   every reader calls `wait_host(event, its stream)` and then its own `backup` (which
 *   throws without that wait). A reader evicts only clean rows, so it fetches a committed
 *   row from the host only after the writer's copy of that row is ordered before.
 * * pages return to the free pages once every holder released the request and each
 *   holder's stream passed its release.
 *
 * The store is thread-safe: ranks driven from their own host threads may admit, reserve
 * and release concurrently. Across processes it is not available yet (see
 * docs/integration.md for what it would take: CUDA IPC of the pages and events).
 */
#pragma once

#include <dhisparse/detail/device_guard.cuh>
#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/detail/pinned_host_memory.cuh>
#include <dhisparse/detail/shared_page_lists.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dhisparse {

/**
 * @brief Host store pages and page allocator shared by several hierarchies (see the file
 *        comment). Hand it to each rank's `hierarchy_config::shared_host`.
 */
class shared_host_store {
 public:
  /**
   * @brief Allocates the pages of `config.host` for hierarchies of `config`'s shape
   *        (group layers, max_context) and rows of `row_bytes`, from
   *        `config.resources.pinned`, placed on the NUMA node of `config.device` (-1: the
   *        current device).
   * @throws dhisparse::error on an invalid configuration or a failed allocation
   */
  shared_host_store(hierarchy_config const& config, std::size_t row_bytes)
    : config_{config.host},
      group_layers_{config.group_layers},
      row_bytes_{row_bytes},
      max_context_{config.max_context},
      device_{detail::chosen_device(config.device, "shared_host_store")},
      lists_{(check(config, row_bytes), config.host.capacity_pages), config.host.tokens_per_page, config.max_context,
             max_ids(config)}
  {
    layouts_ = detail::make_group_layouts(config_, group_layers_, row_bytes_, page_bytes_);
    auto const on_device = detail::device_guard{device_};  // NUMA placement near this device
    memory_ = detail::pinned_host_memory(config_, page_bytes_ * config_.capacity_pages,
                                         detail::pinned_resource(config.resources));
  }

  /**
   * @brief Memory the constructor allocates: the pages (`pinned_bytes` with
   *        host_memory::pinned, `host_store_bytes` always). Each rank's hierarchy adds its
   *        own device page table (`kv_hierarchy::bytes_required`).
   */
  static memory_footprint bytes_required(hierarchy_config const& config, std::size_t row_bytes)
  {
    check(config, row_bytes);
    std::size_t page_bytes = 0;
    detail::make_group_layouts(config.host, config.group_layers, row_bytes, page_bytes);
    memory_footprint f{};
    f.host_store_bytes =
      detail::pinned_host_memory::mapped_size(config.host.memory, page_bytes * config.host.capacity_pages);
    if (config.host.memory == host_memory::pinned) { f.pinned_bytes = f.host_store_bytes; }
    return f;
  }

  shared_host_store(shared_host_store const&)            = delete;
  shared_host_store& operator=(shared_host_store const&) = delete;

  [[nodiscard]] host_store_config const& config() const noexcept { return config_; }
  [[nodiscard]] std::vector<int> const& group_layers() const noexcept { return group_layers_; }
  [[nodiscard]] std::size_t row_bytes() const noexcept { return row_bytes_; }
  [[nodiscard]] int max_context() const noexcept { return max_context_; }
  /// The device whose NUMA node the pages were placed near.
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] std::vector<group_layout> const& layouts() const noexcept { return layouts_; }
  /// Host address of page 0.
  [[nodiscard]] std::byte* host() const noexcept { return memory_.host(); }
  [[nodiscard]] numa_binding const& numa() const noexcept { return memory_.numa(); }

  /// Pages no request holds (parked ones included).
  [[nodiscard]] std::size_t free_pages() const { return lists_.free_pages(); }
  /// Ranks holding request `id` (0: none).
  [[nodiscard]] int holders(request_id id) const { return lists_.holders(std::uint64_t(id)); }

  // ------------------------------------------------------------------------------------
  // Used by the ranks' host stores (host_store.cuh); all or nothing, thread-safe (the page
  // lists lock themselves).
  // ------------------------------------------------------------------------------------

  /// Pages `id` would take to cover [0, capacity).
  [[nodiscard]] std::size_t missing_pages(request_id id, std::int64_t capacity) const
  {
    return lists_.missing_pages(std::uint64_t(id), capacity);
  }
  /// One more rank holds `id` (see `detail::shared_page_lists::hold`); its page list.
  std::vector<std::int32_t> hold(request_id id, std::int32_t length, std::int64_t capacity)
  {
    return lists_.hold(std::uint64_t(id), length, capacity);
  }
  /// The page list of a held `id`, covering at least [0, capacity).
  std::vector<std::int32_t> grow(request_id id, std::int64_t capacity) { return lists_.grow(std::uint64_t(id), capacity); }
  /**
   * One rank releases `id`: an event recorded on `stream` (a stream of the current device)
   * tells when that rank is done with the pages (inside a stream capture: at once).
   */
  void drop(request_id id, cudaStream_t stream)
  {
    detail::release_token done;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) {
      cudaEvent_t e = nullptr;
      DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      std::shared_ptr<CUevent_st> event{e, [](cudaEvent_t x) { cudaEventDestroy(x); }};
      DHISPARSE_CUDA_TRY(cudaEventRecord(e, stream));
      done = [event](bool wait) {
        cudaError_t const status = wait ? cudaEventSynchronize(event.get()) : cudaEventQuery(event.get());
        if (status == cudaErrorNotReady) { return false; }
        if (status != cudaSuccess) { detail::throw_cuda_error(status, "cudaEventQuery", __FILE__, __LINE__); }
        return true;
      };
    }
    lists_.drop(std::uint64_t(id), std::move(done));
  }

  /// One rank lets go of `id` with nothing in flight (a rank destroyed while holding it).
  void drop_now(request_id id) noexcept
  {
    try {
      lists_.drop(std::uint64_t(id), nullptr);
    } catch (...) {  // not held: nothing to let go of
    }
  }

  /// Registers the one writer rank. @throws dhisparse::error when one is registered
  void attach_writer()
  {
    std::lock_guard<std::mutex> lock{mutex_};
    DHISPARSE_EXPECTS(!writer_, "shared_host_store: a writer hierarchy is already attached (exactly one rank backs up)");
    writer_ = true;
  }
  void detach_writer() noexcept
  {
    std::lock_guard<std::mutex> lock{mutex_};
    writer_ = false;
  }

 private:
  static std::size_t check(hierarchy_config const& c, std::size_t row_bytes)
  {
    DHISPARSE_EXPECTS(row_bytes > 0 && row_bytes % row_alignment == 0,
                      "shared_host_store: row_bytes must be a positive multiple of 16");
    DHISPARSE_EXPECTS(!c.group_layers.empty(), "shared_host_store: group_layers is empty");
    DHISPARSE_EXPECTS(detail::is_power_of_two(c.host.tokens_per_page),
                      "shared_host_store: host.tokens_per_page must be a power of two");
    DHISPARSE_EXPECTS(c.max_context > 0, "shared_host_store: max_context must be positive");
    return c.host.capacity_pages;
  }

  /// Request ids held or parked at once: every rank's requests, and as many released ones
  /// whose streams have not passed their release yet.
  static std::int32_t max_ids(hierarchy_config const& c) { return 2 * std::max(c.max_requests, 1) + 64; }

  host_store_config config_;
  std::vector<int> group_layers_;
  std::size_t row_bytes_ = 0;
  int max_context_       = 0;
  int device_            = 0;
  std::size_t page_bytes_ = 0;
  std::vector<group_layout> layouts_;
  mutable std::mutex mutex_;
  detail::shared_page_lists lists_;
  detail::pinned_host_memory memory_;
  bool writer_ = false;
};

}  // namespace dhisparse
