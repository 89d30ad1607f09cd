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
 *   every reader calls `wait_host(event, its stream)` (or `wait_host(its stream)`, which
 *   finds the writer's backup of the same step itself) and then its own `backup` (which
 *   throws without that wait). A reader evicts only clean rows, so it fetches a committed
 *   row from the host only after the writer's copy of that row is ordered before.
 * * pages return to the free pages once every holder released the request and each
 *   holder's stream passed its release.
 *
 * The store is thread-safe: ranks driven from their own host threads may admit, reserve
 * and release concurrently.
 *
 * Across processes (one process per GPU): `create(name, …)` makes the store in a POSIX
 * shared-memory segment `/dev/shm/dhisparse.<name>` (a header, the page lists under a
 * process-shared robust mutex, the pages), which every process registers with CUDA
 * (mapped, portable); `open(name, …)` in the other processes waits for it and checks its
 * shape. The writer's event is then interprocess: its handle and a count of the writer's
 * backups live in the header, and a reader's `wait_host(stream)` waits (on the host) for
 * the writer's backup of the same step before it waits (on the stream) for the event. The
 * creator unlinks the name when its store is destroyed; the others keep their mappings.
 */
#pragma once

#include <dhisparse/detail/device_guard.cuh>
#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/detail/pinned_host_memory.cuh>
#include <dhisparse/detail/shared_page_lists.hpp>
#include <dhisparse/detail/shm_segment.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>

#include <cuda_runtime_api.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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
      lists_{std::in_place, (check(config, row_bytes), config.host.capacity_pages), config.host.tokens_per_page,
             config.max_context, max_ids(config)}
  {
    layouts_ = detail::make_group_layouts(config_, group_layers_, row_bytes_, page_bytes_);
    auto const on_device = detail::device_guard{device_};  // NUMA placement near this device
    memory_ = detail::pinned_host_memory(config_, page_bytes_ * config_.capacity_pages,
                                         detail::pinned_resource(config.resources));
  }

  /**
   * @brief Creates the store in the shared-memory segment `/dev/shm/dhisparse.<name>` for
   *        hierarchies in several processes (see the file comment): the pages of
   *        `config.host` (its `memory` and `caller_memory` are not used: the segment holds
   *        the pages), placed on the NUMA node of `config.device` as `config.host.numa_node`
   *        says, registered with CUDA in this process. The name is unlinked when the store
   *        is destroyed.
   * @throws dhisparse::error for an invalid configuration or name, a name in use, or a
   *         refused allocation or registration (nothing is left behind)
   */
  static std::shared_ptr<shared_host_store> create(std::string const& name, hierarchy_config const& config,
                                                   std::size_t row_bytes)
  {
    return std::shared_ptr<shared_host_store>(
      new shared_host_store(name, config, row_bytes, true, std::chrono::milliseconds(0)));
  }

  /**
   * @brief Opens the store another process created with `create(name, …)`: waits up to
   *        `timeout` for it to exist, checks that it has the shape `config` and `row_bytes`
   *        give (pages, page layout, max_context, max_requests), and registers its pages in
   *        this process.
   * @throws dhisparse::error after the timeout, or naming both shapes when they differ
   */
  static std::shared_ptr<shared_host_store> open(std::string const& name, hierarchy_config const& config,
                                                 std::size_t row_bytes,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(60))
  {
    return std::shared_ptr<shared_host_store>(new shared_host_store(name, config, row_bytes, false, timeout));
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
  /**
   * @brief Removes the segment `name` left behind by a creator that died (a later `create`
   *        of the name fails while it exists); true when there was one. Processes that
   *        mapped it keep their mappings. Do not call it while the creator lives.
   */
  static bool remove(std::string const& name) { return detail::shm_segment::remove(name); }

  ~shared_host_store()
  {
    for (cudaEvent_t e : opened_events_) { cudaEventDestroy(e); }
  }

  /// Whether the store lives in a shared-memory segment (`create` / `open`).
  [[nodiscard]] bool cross_process() const noexcept { return segment_.header() != nullptr; }

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
  [[nodiscard]] numa_binding const& numa() const noexcept { return numa_ ? *numa_ : memory_.numa(); }

  /// Pages no request holds (parked ones included).
  [[nodiscard]] std::size_t free_pages() const { return lists_->free_pages(); }
  /// Ranks holding request `id` (0: none; across processes: in every process).
  [[nodiscard]] int holders(request_id id) const { return lists_->holders(std::uint64_t(id)); }

  // ------------------------------------------------------------------------------------
  // Used by the ranks' host stores (host_store.cuh); all or nothing, thread-safe (the page
  // lists lock themselves).
  // ------------------------------------------------------------------------------------

  /// Pages `id` would take to cover [0, capacity).
  [[nodiscard]] std::size_t missing_pages(request_id id, std::int64_t capacity) const
  {
    return lists_->missing_pages(std::uint64_t(id), capacity);
  }
  /// One more rank holds `id` (see `detail::shared_page_lists::hold`); its page list.
  std::vector<std::int32_t> hold(request_id id, std::int32_t length, std::int64_t capacity)
  {
    return lists_->hold(std::uint64_t(id), length, capacity);
  }
  /// The page list of a held `id`, covering at least [0, capacity).
  std::vector<std::int32_t> grow(request_id id, std::int64_t capacity) { return lists_->grow(std::uint64_t(id), capacity); }
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
    lists_->drop(std::uint64_t(id), std::move(done));
  }

  /// One rank lets go of `id` with nothing in flight (a rank destroyed while holding it).
  void drop_now(request_id id) noexcept
  {
    try {
      lists_->drop(std::uint64_t(id), nullptr);
    } catch (...) {  // not held: nothing to let go of
    }
  }

  /**
   * Registers the one writer rank (across processes: in the segment; a writer whose
   * process died is replaced). @throws dhisparse::error when one is registered
   */
  void attach_writer()
  {
    std::lock_guard<std::mutex> lock{mutex_};
    DHISPARSE_EXPECTS(!writer_, "shared_host_store: a writer hierarchy is already attached (exactly one rank backs up)");
    if (cross_process()) {
      auto& pid          = segment_.header()->writer_pid;
      std::int32_t const me = std::int32_t(::getpid());
      std::int32_t seen  = 0;
      while (!pid.compare_exchange_strong(seen, me)) {
        DHISPARSE_EXPECTS(seen != me && !process_alive(seen),
                          "shared_host_store: a writer hierarchy is already attached (process " +
                            std::to_string(seen) + "; exactly one rank backs up)");
      }
    }
    writer_ = true;
  }
  void detach_writer() noexcept
  {
    std::lock_guard<std::mutex> lock{mutex_};
    if (cross_process() && writer_) {
      std::int32_t me = std::int32_t(::getpid());
      segment_.header()->writer_pid.compare_exchange_strong(me, 0);
    }
    writer_       = false;
    local_event_  = nullptr;
  }

  // ------------------------------------------------------------------------------------
  // The writer's hand-off to the readers (kv_hierarchy's backup and wait_host).
  // ------------------------------------------------------------------------------------

  /// The writer's event flags: interprocess across processes (then without timing).
  [[nodiscard]] unsigned writer_event_flags() const noexcept
  {
    return cudaEventDisableTiming | (cross_process() ? cudaEventInterprocess : 0u);
  }
  /// The writer hierarchy hands over the event its backups record (valid until it detaches).
  void publish_writer_event(cudaEvent_t e)
  {
    std::lock_guard<std::mutex> lock{mutex_};
    local_event_ = e;
    if (cross_process()) {
      cudaIpcEventHandle_t handle{};
      DHISPARSE_CUDA_TRY(cudaIpcGetEventHandle(&handle, e));
      static_assert(sizeof handle == detail::shm_header::handle_bytes);
      std::memcpy(segment_.header()->writer_event, &handle, sizeof handle);
      segment_.header()->event_generation.fetch_add(1, std::memory_order_release);
    }
  }
  /// The writer recorded its event after one more backup.
  void count_writer_backup() noexcept
  {
    if (cross_process()) {
      segment_.header()->writer_backups.fetch_add(1, std::memory_order_acq_rel);
    } else {
      local_backups_.fetch_add(1, std::memory_order_acq_rel);
    }
  }
  /// Backups the writer recorded so far (in any process).
  [[nodiscard]] std::uint64_t writer_backups() const noexcept
  {
    return cross_process() ? segment_.header()->writer_backups.load(std::memory_order_acquire)
                           : local_backups_.load(std::memory_order_acquire);
  }
  /**
   * Waits on the host until the writer recorded `n` backups, then returns its event (this
   * process's handle of it). @throws dhisparse::error after `timeout`, naming both counts
   */
  cudaEvent_t await_writer_backups(std::uint64_t n, std::chrono::milliseconds timeout)
  {
    auto const end = std::chrono::steady_clock::now() + timeout;
    for (auto pause = std::chrono::microseconds(20); writer_backups() < n;
         pause = std::min(2 * pause, std::chrono::microseconds(1000))) {
      DHISPARSE_EXPECTS(std::chrono::steady_clock::now() < end,
                        "wait_host: this reader waits for the writer's backup " + std::to_string(n) + ", the writer has done " +
                          std::to_string(writer_backups()) + " within " + std::to_string(timeout.count()) +
                          " ms (every rank backs up once per step, readers after the writer)");
      std::this_thread::sleep_for(pause);
    }
    std::lock_guard<std::mutex> lock{mutex_};
    if (!cross_process() || segment_.header()->writer_pid.load() == std::int32_t(::getpid())) {
      DHISPARSE_EXPECTS(local_event_ != nullptr, "wait_host: the writer hierarchy of this store is gone");
      return local_event_;
    }
    std::uint64_t const generation = segment_.header()->event_generation.load(std::memory_order_acquire);
    if (generation != opened_generation_) {  // a new writer (or its first event): open its handle
      cudaIpcEventHandle_t handle{};
      std::memcpy(&handle, segment_.header()->writer_event, sizeof handle);
      cudaEvent_t e = nullptr;
      DHISPARSE_CUDA_TRY(cudaIpcOpenEventHandle(&e, handle));
      opened_events_.push_back(e);  // kept: streams may still wait on the older ones
      opened_generation_ = generation;
    }
    return opened_events_.back();
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

  static bool process_alive(std::int32_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

  /// The shape a segment must have for `config` and `row_bytes`.
  static detail::shm_shape segment_shape(hierarchy_config const& c, std::size_t row_bytes, std::size_t page_bytes,
                                         std::vector<group_layout> const& layouts)
  {
    detail::shm_shape s{};
    s.capacity_pages  = c.host.capacity_pages;
    s.page_bytes      = page_bytes;
    s.row_bytes       = row_bytes;
    s.tokens_per_page = c.host.tokens_per_page;
    s.max_context     = c.max_context;
    s.max_ids         = max_ids(c);
    detail::shm_layout_hash h;
    for (int layers : c.group_layers) { h.add(std::uint64_t(layers)); }
    for (group_layout const& l : layouts) { h.add(l.page_offset).add(l.row_bytes); }
    s.layout_hash = h.value();
    return s;
  }

  /// `create` (`make`) or `open` the segment `name`.
  shared_host_store(std::string const& name, hierarchy_config const& config, std::size_t row_bytes, bool make,
                    std::chrono::milliseconds timeout)
    : config_{config.host},
      group_layers_{config.group_layers},
      row_bytes_{row_bytes},
      max_context_{config.max_context},
      device_{detail::chosen_device(config.device, "shared_host_store")}
  {
    check(config, row_bytes);
    layouts_ = detail::make_group_layouts(config_, group_layers_, row_bytes_, page_bytes_);
    detail::shm_shape const shape = segment_shape(config, row_bytes_, page_bytes_, layouts_);
    std::size_t const pages_bytes = page_bytes_ * config_.capacity_pages;
    std::size_t const lists_bytes = detail::shared_page_lists::state_bytes(config_.capacity_pages, shape.max_ids);
    auto const on_device          = detail::device_guard{device_};
    numa_binding numa{};
    numa.requested = config_.numa_node;
    if (make) {
      segment_ = detail::shm_segment::create(name, detail::shm_segment::layout(shape, lists_bytes, pages_bytes));
      numa     = bind_pages(config_.numa_node);  // before any page is touched
    } else {
      segment_ = detail::shm_segment::open(name, shape, timeout);
      numa.reason = "placed by the process that created the store";
    }
    detail::shm_layout const& at = segment_.layout();
    lists_.emplace(segment_.at(at.lists_offset), std::size_t(at.lists_bytes), config_.capacity_pages,
                   config_.tokens_per_page, config.max_context, shape.max_ids, make, true);
    host_store_config pages = config_;  // the segment's pages, registered in this process
    pages.memory                   = host_memory::caller;
    pages.caller_memory            = segment_.at(at.pages_offset);
    pages.caller_bytes             = pages_bytes;
    pages.caller_memory_registered = false;
    memory_ = detail::pinned_host_memory(pages, pages_bytes);
    numa.first_page_node = memory_.numa().first_page_node;
    numa_ = numa;
    if (make) { segment_.publish(); }
  }

  /// The creator binds the segment's pages to the NUMA node `requested` chooses.
  numa_binding bind_pages(int requested)
  {
    numa_binding b{};
    b.requested      = requested;
    auto const where = detail::numa::choose_node(requested, "/sys", detail::pinned_host_memory::current_pci_bus_id());
    b.reason         = where.reason;
    if (where.node >= 0) {
      detail::shm_layout const& at = segment_.layout();
      int const err = detail::numa::bind_preferred(segment_.at(at.pages_offset), at.segment_bytes - at.pages_offset,
                                                   where.node);
      if (err != 0) {
        b.reason += "; " + detail::numa::refused("mbind", err) + ", not bound";
      } else {
        b.node = where.node;
      }
    }
    return b;
  }

  host_store_config config_;
  std::vector<int> group_layers_;
  std::size_t row_bytes_ = 0;
  int max_context_       = 0;
  int device_            = 0;
  std::size_t page_bytes_ = 0;
  std::vector<group_layout> layouts_;
  mutable std::mutex mutex_;
  detail::shm_segment segment_;  // across processes: holds the lists' state and the pages
  std::optional<detail::shared_page_lists> lists_;
  detail::pinned_host_memory memory_;
  std::optional<numa_binding> numa_;  // across processes: the creator's binding
  bool writer_ = false;
  cudaEvent_t local_event_ = nullptr;           // the writer's event, when its hierarchy is in this process
  std::atomic<std::uint64_t> local_backups_{0};  // in one process: the writer's backups
  std::vector<cudaEvent_t> opened_events_;      // across processes: the writer events opened here
  std::uint64_t opened_generation_ = 0;
};

}  // namespace dhisparse
