/**
 * @file host_store.cuh
 * @brief Pinned, paged host backing store: the source of truth for every committed row.
 *
 * Layout. The store is an array of pages; a page holds P consecutive positions of one
 * request for every layer of every group, group-major:
 *
 *     page = [group 0: P tokens × L0 layers × row bytes][group 1: P × L1 × row] …
 *
 * so the rows of one (request, group, position) for all layers of the group — one *group
 * row* — are contiguous: a miss of a group is one contiguous read, and consecutive
 * positions are consecutive group rows.
 *
 * Page tables. Each request (an index in [0, max_requests), assigned by the owner of the
 * store) has a host-side list of pages and a device-side table
 * `[max_requests][max_pages_per_request]` (-1 = none) that kernels read to address
 * host rows. `grow` appends pages, `release` returns them; both are host-side operations
 * between steps whose device-table updates are ordered on the given stream.
 *
 * Memory. Pages live in pinned host memory mapped into the device address space, so
 * kernels read and write rows directly (zero-copy): the pinned memory resource by default
 * (memory_resource.cuh; its default is `cudaHostAlloc`), transparent huge pages (`mmap` +
 * `madvise` + `cudaHostRegister`), or caller memory (`cudaHostRegister`). The device page
 * table comes from the device resource; `bytes_required` reports both before
 * construction. An engine's transfer layer can write prefill rows straight into host
 * pages (`row`) before the request's first step: direct-to-host admission.
 *
 * NUMA. On a machine with several NUMA nodes, pinned and huge-page stores prefer the node
 * closest to the current GPU (`host_store_config::numa_node`, detail/numa.hpp): huge pages
 * are `mbind`-ed before they are touched, the pinned resource runs under a thread policy
 * that prefers the node (which places what `cudaHostAlloc` touches). Where the system
 * refuses or there is one node, nothing is bound;
 * `numa()` says what happened and on which node the first page landed. A `kv_hierarchy`
 * constructs its store on its configured device (`hierarchy_config::device`), so the node
 * is the one closest to that device.
 *
 * Sharing. Tensor-parallel ranks hold the same KV: a `shared_host_store` owns the pages and
 * the page allocator once, and each rank's `host_store` (the second constructor) is a view
 * with a device page table of its own (shared_host_store.cuh).
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/numa.hpp>
#include <dhisparse/detail/page_table.cuh>
#include <dhisparse/detail/pinned_host_memory.cuh>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/shared_host_store.cuh>

#include <cuda_runtime_api.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dhisparse {

/// Consecutive positions of one (request, group, layer) inside one host page: row k is at
/// `first + k × stride` for k < `count` (the positions up to the page's end).
struct host_row_run {
  std::byte* first;    ///< host address of the first row
  std::size_t stride;  ///< bytes between two positions' rows (the group row: layers × row bytes)
  std::int64_t count;  ///< rows in this run
};

/**
 * @brief Trivially copyable device view of a `host_store` (passed to kernels by value).
 */
struct host_store_ref {
  std::byte* base;                 ///< device-accessible address of page 0
  std::int32_t const* page_table;  ///< [max_requests][max_pages_per_request], -1 = none
  std::int32_t max_pages_per_request;
  std::int32_t page_shift;  ///< log2(tokens per page)
  std::size_t page_bytes;

  /// Address of the group row of (request, position), or nullptr when no page backs it.
  DHISPARSE_HOST_DEVICE std::byte* group_row(std::int32_t request, std::int32_t position,
                                             group_layout layout) const
  {
    std::int32_t const page_index = position >> page_shift;
    if (position < 0 || page_index >= max_pages_per_request) { return nullptr; }
    std::int32_t const page =
      page_table[std::int64_t(request) * max_pages_per_request + page_index];
    if (page < 0) { return nullptr; }
    std::int32_t const in_page = position & ((1 << page_shift) - 1);
    return base + std::size_t(page) * page_bytes + layout.page_offset +
           std::size_t(in_page) * layout.row_bytes;
  }
};
static_assert(std::is_trivially_copyable_v<host_store_ref>);


/**
 * @brief Owning, move-only host backing store (see the file comment).
 */
class host_store {
 public:
  /**
   * @param config        capacity, page size and memory kind
   * @param group_layers  layers of each group
   * @param row_bytes     bytes of one row (the row format's `bytes`)
   * @param max_requests  request indices the page tables hold
   * @param max_context   positions a request may reach
   * @param stream        stream on which the device page table is initialised
   * @param resources     where the device page table and (host_memory::pinned) the pages
   *                      come from; see `bytes_required`
   * @throws dhisparse::error on invalid arguments or failed allocation
   */
  host_store(host_store_config const& config, std::vector<int> const& group_layers,
             std::size_t row_bytes, int max_requests, int max_context, cudaStream_t stream,
             memory_resources const& resources = {})
    : config_{config},
      row_bytes_{row_bytes},
      group_layers_{group_layers},
      layouts_{detail::make_group_layouts(config, group_layers, row_bytes, page_bytes_)},
      pages_{"host store", check(config, row_bytes, max_requests, max_context), max_requests,
             config.tokens_per_page, max_context, detail::device_resource(resources), stream}
  {
    while ((1 << page_shift_) < config.tokens_per_page) { ++page_shift_; }
    memory_ = detail::pinned_host_memory(config, page_bytes_ * config.capacity_pages,
                                         detail::pinned_resource(resources));
    host_base_   = memory_.host();
    device_base_ = memory_.device();
  }

  /**
   * @brief One rank's view of a store shared by several hierarchies (shared_host_store.cuh):
   *        the shared pages, mapped into the current device, and a device page table of its
   *        own, filled with the pages the shared allocator chose (`hold`, `grow`).
   * @param stream    stream of the current device on which the page table is initialised
   * @param resources where the device page table comes from
   * @throws dhisparse::error on invalid arguments or failed allocation
   */
  host_store(std::shared_ptr<shared_host_store> shared, int max_requests, cudaStream_t stream,
             memory_resources const& resources = {})
    : config_{shared_config(shared)},
      row_bytes_{shared->row_bytes()},
      group_layers_{shared->group_layers()},
      layouts_{shared->layouts()},
      pages_{"host store", check(config_, row_bytes_, max_requests, shared->max_context()), max_requests,
             config_.tokens_per_page, shared->max_context(), detail::device_resource(resources), stream},
      shared_{std::move(shared)},
      ids_(std::size_t(max_requests), request_id{})
  {
    page_bytes_ = shared_->page_bytes();
    while ((1 << page_shift_) < config_.tokens_per_page) { ++page_shift_; }
    host_base_ = shared_->host();
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_base_), host_base_, 0));
  }

  /**
   * @brief Memory a store of this shape allocates: the device page table
   *        `[max_requests][ceil(max_context / tokens_per_page)]` (fixed: `grow` only fills
   *        it; the host-side page lists are ordinary heap memory) and the pages.
   * @throws dhisparse::error on invalid arguments, as the constructor
   */
  static memory_footprint bytes_required(host_store_config const& config, std::vector<int> const& group_layers,
                                         std::size_t row_bytes, int max_requests, int max_context)
  {
    check(config, row_bytes, max_requests, max_context);
    std::size_t page_bytes = 0;
    detail::make_group_layouts(config, group_layers, row_bytes, page_bytes);
    memory_footprint f{};
    f.device_bytes = detail::page_table::device_bytes_for(max_requests, config.tokens_per_page, max_context);
    f.host_store_bytes = detail::pinned_host_memory::mapped_size(config.memory, page_bytes * config.capacity_pages);
    if (config.memory == host_memory::pinned) { f.pinned_bytes = f.host_store_bytes; }
    return f;
  }

  host_store(host_store&&) noexcept            = default;
  host_store& operator=(host_store&&) noexcept = default;
  host_store(host_store const&)                = delete;
  host_store& operator=(host_store const&)     = delete;
  /// A rank's view of a shared store lets go of the requests it still holds (the caller
  /// finished the work that uses them: destruction is not stream-ordered).
  ~host_store()
  {
    if (!shared_) { return; }
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      if (!pages_.pages(int(i)).empty()) { shared_->drop_now(ids_[i]); }
    }
  }

  /// Memory a rank's view of a shared store allocates: its device page table only.
  static memory_footprint shared_bytes_required(host_store_config const& config, int max_requests, int max_context)
  {
    memory_footprint f{};
    f.device_bytes = detail::page_table::device_bytes_for(max_requests, config.tokens_per_page, max_context);
    return f;
  }

  /// The store shared with other hierarchies, or nullptr when this store owns its pages.
  [[nodiscard]] shared_host_store* shared() const noexcept { return shared_.get(); }

  /// Bytes of one page (all groups, all layers, P tokens).
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] int tokens_per_page() const noexcept { return config_.tokens_per_page; }
  [[nodiscard]] std::size_t capacity_pages() const noexcept { return config_.capacity_pages; }
  [[nodiscard]] std::size_t free_pages() const { return shared_ ? shared_->free_pages() : pages_.free_pages(); }
  [[nodiscard]] int max_pages_per_request() const noexcept { return pages_.max_pages_per_request(); }
  [[nodiscard]] group_layout layout(int group) const { return layouts_.at(group); }
  [[nodiscard]] std::vector<group_layout> const& layouts() const noexcept { return layouts_; }

  /// Pages a request would need beyond what it holds to reach `capacity` positions.
  [[nodiscard]] std::size_t missing_pages(int request, std::int64_t capacity) const
  {
    return pages_.missing_pages(request, capacity);
  }

  /**
   * @brief Backs positions [0, capacity) of `request` with pages (host side; the device
   *        table update is ordered on `stream`). All or nothing.
   * @throws dhisparse::error "host store exhausted" when too few pages are free
   */
  void grow(int request, std::int64_t capacity, detail::staging_uploader& uploader,
            cudaStream_t stream)
  {
    if (shared_) {
      take_shared(request, shared_->grow(ids_[std::size_t(request)], capacity), capacity, uploader, stream);
    } else {
      pages_.grow(request, capacity, uploader, stream);
    }
  }

  /**
   * @brief Shared store: `request` (holding no pages) becomes one more holder of request
   *        `id` in the shared store and backs [0, capacity) with its pages — the pages
   *        another rank took for `id`, or new ones for the first rank. All or nothing.
   * @throws dhisparse::error when the store is not shared, `length` differs from the first
   *         rank's, or the shared store is exhausted
   */
  void hold(int request, request_id id, std::int32_t length, std::int64_t capacity,
            detail::staging_uploader& uploader, cudaStream_t stream)
  {
    DHISPARSE_EXPECTS(shared_ != nullptr, "host_store::hold: the store is not shared");
    DHISPARSE_EXPECTS(pages_.pages(request).empty(), "host_store::hold: the request holds pages");
    std::vector<std::int32_t> const pages = shared_->hold(id, length, capacity);
    ids_[std::size_t(request)]            = id;
    take_shared(request, pages, capacity, uploader, stream);
  }

  /**
   * @brief Gives `request` (holding no pages yet) the store's pages `pages`, in that
   *        order: positions [k P, (k + 1) P) of the request are in page `pages[k]`, whose
   *        rows are used where they are (an engine's host KV adopted in place). The pages
   *        return to the store's free pages with `release`. All or nothing.
   * @throws dhisparse::error when the request holds pages, a page is outside the store,
   *         repeated, or not free, or the list is longer than max_context needs
   */
  void adopt(int request, std::vector<std::int32_t> const& pages, detail::staging_uploader& uploader,
             cudaStream_t stream)
  {
    DHISPARSE_EXPECTS(shared_ == nullptr, "adopt: not available with a shared host store");
    pages_.adopt(request, pages, uploader, stream);
  }

  /// Returns all pages of `request` to the store; its device table row becomes empty. A
  /// shared store frees them once every rank released the request.
  void release(int request, cudaStream_t stream)
  {
    if (shared_) {
      pages_.release_now(request, stream);
      shared_->drop(ids_[std::size_t(request)], stream);
    } else {
      pages_.release(request, stream);
    }
  }

  /// Positions of `request` currently backed by pages.
  [[nodiscard]] std::int64_t capacity(int request) const { return pages_.capacity(request); }

  /**
   * @brief Host address of the row of (request, group, layer, position); the engine writes
   *        prefill rows here before the request's first step (direct-to-host admission).
   * @throws dhisparse::error if the position is not backed or an index is out of range
   */
  [[nodiscard]] std::byte* row(int request, int group, int layer, std::int64_t position) const
  {
    DHISPARSE_EXPECTS(group >= 0 && group < int(layouts_.size()),
                      "host_store::row: group " + std::to_string(group) + " out of range");
    DHISPARSE_EXPECTS(layer >= 0 && layer < group_layers_[group],
                      "host_store::row: layer " + std::to_string(layer) + " out of range");
    DHISPARSE_EXPECTS(position >= 0 && position < capacity(request),
                      "host_store::row: position " + std::to_string(position) +
                        " is not backed by a page");
    std::size_t const page    = std::size_t(pages_.pages(request)[position >> page_shift_]);
    std::size_t const in_page = std::size_t(position) & (config_.tokens_per_page - 1);
    return host_base_ + page * page_bytes_ + layouts_[group].page_offset +
           in_page * layouts_[group].row_bytes + std::size_t(layer) * row_bytes_;
  }

  /**
   * @brief The rows of (request, group, layer) from position `first` to the end of its
   *        page, as a strided view: a page of positions per call instead of one row.
   * @throws dhisparse::error as `row`
   */
  [[nodiscard]] host_row_run rows(int request, int group, int layer, std::int64_t first) const
  {
    std::byte* const at         = row(request, group, layer, first);
    std::int64_t const page_end = (first | (config_.tokens_per_page - 1)) + 1;
    return {at, layouts_[group].row_bytes, std::min(page_end, capacity(request)) - first};
  }

  /**
   * @brief Copies the rows of positions [first, first + count) of (request, group, layer)
   *        from `source` (host or device memory; row k at `source + k × source_stride`),
   *        one `cudaMemcpy2DAsync` per host page, ordered on `stream`. Pageable host
   *        sources are copied before this returns; pinned or device sources must stay
   *        valid until the stream reaches the copies.
   * @throws dhisparse::error for positions not backed by pages, a bad group or layer, a
   *         null source or a stride below the row size (nothing enqueued)
   */
  void write_rows(int request, int group, int layer, std::int64_t first, std::int64_t count, void const* source,
                  std::size_t source_stride, cudaStream_t stream) const
  {
    DHISPARSE_EXPECTS(first >= 0 && count >= 0 && first + count <= capacity(request),
                      "host_store::write_rows: positions [" + std::to_string(first) + ", " +
                        std::to_string(first + count) + ") are not all backed by pages (capacity " +
                        std::to_string(capacity(request)) + ")");
    DHISPARSE_EXPECTS(count == 0 || (source != nullptr && source_stride >= row_bytes_),
                      "host_store::write_rows: source must not be null and source_stride must be at least the "
                      "row size (" + std::to_string(row_bytes_) + " bytes)");
    auto const* from = static_cast<std::byte const*>(source);
    for (std::int64_t at = first; at < first + count;) {
      host_row_run const run   = rows(request, group, layer, at);
      std::int64_t const rows_ = std::min(run.count, first + count - at);
      DHISPARSE_CUDA_TRY(cudaMemcpy2DAsync(run.first, run.stride, from + std::size_t(at - first) * source_stride,
                                           source_stride, row_bytes_, std::size_t(rows_), cudaMemcpyDefault,
                                           stream));
      at += rows_;
    }
  }

  /// NUMA placement of the store's pages (see the file comment).
  [[nodiscard]] numa_binding const& numa() const noexcept { return shared_ ? shared_->numa() : memory_.numa(); }
  /// Bytes of the store (capacity_pages × page_bytes): the host range of its rows, e.g. for
  /// `order_plan_async`.
  [[nodiscard]] std::size_t bytes() const noexcept { return page_bytes_ * config_.capacity_pages; }

  /// Device view for kernels.
  [[nodiscard]] host_store_ref ref() const noexcept
  {
    return {device_base_, pages_.device_table(), pages_.max_pages_per_request(), page_shift_, page_bytes_};
  }

 private:
  static host_store_config shared_config(std::shared_ptr<shared_host_store> const& shared)
  {
    DHISPARSE_EXPECTS(shared != nullptr, "host_store: the shared store is null");
    return shared->config();
  }

  /// Appends the pages of `shared_pages` this rank lacks to cover [0, capacity).
  void take_shared(int request, std::vector<std::int32_t> const& shared_pages, std::int64_t capacity,
                   detail::staging_uploader& uploader, cudaStream_t stream)
  {
    std::size_t const have = pages_.pages(request).size();
    std::size_t const want = std::min(shared_pages.size(), std::size_t((capacity + config_.tokens_per_page - 1) /
                                                                       config_.tokens_per_page));
    if (want <= have) { return; }
    pages_.extend(request, std::vector<std::int32_t>(shared_pages.begin() + have, shared_pages.begin() + want),
                  uploader, stream);
  }

  /// Validates the arguments; returns the page count.
  static std::size_t check(host_store_config const& config, std::size_t row_bytes, int max_requests,
                           int max_context)
  {
    DHISPARSE_EXPECTS(row_bytes > 0 && row_bytes % row_alignment == 0,
                      "host_store: row_bytes (" + std::to_string(row_bytes) +
                        ") must be a positive multiple of 16");
    DHISPARSE_EXPECTS(detail::is_power_of_two(config.tokens_per_page),
                      "host_store: tokens_per_page must be a power of two");
    DHISPARSE_EXPECTS(config.capacity_pages > 0 && config.capacity_pages < (std::size_t{1} << 31),
                      "host_store: capacity_pages must be in [1, 2^31)");
    DHISPARSE_EXPECTS(max_requests > 0 && max_context > 0,
                      "host_store: max_requests and max_context must be positive");
    return config.capacity_pages;
  }

  host_store_config config_{};
  std::size_t row_bytes_ = 0;
  std::vector<int> group_layers_;
  std::size_t page_bytes_ = 0;  // before layouts_, which sets it
  std::vector<group_layout> layouts_;
  std::int32_t page_shift_ = 0;
  detail::page_table pages_;
  detail::pinned_host_memory memory_;         // not shared: the pages
  std::shared_ptr<shared_host_store> shared_;  // shared: the pages and their allocator
  std::vector<request_id> ids_;                // shared: the request id of each index
  std::byte* host_base_   = nullptr;           // host address of page 0
  std::byte* device_base_ = nullptr;           // its address on the current device
};

}  // namespace dhisparse
