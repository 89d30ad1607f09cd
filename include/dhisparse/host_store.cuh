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
 * `numa()` says what happened and on which node the first page landed.
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/numa.hpp>
#include <dhisparse/detail/page_table.cuh>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

namespace detail {

/// Move-only owner of the host store's memory: from the pinned resource, huge pages or
/// registered caller memory, mapped into the device address space.
class pinned_host_memory {
 public:
  pinned_host_memory() = default;
  pinned_host_memory(host_store_config const& config, std::size_t bytes,
                     pinned_memory_resource& pinned = default_pinned_resource())
    : kind_{config.memory}
  {
    numa_.requested = config.numa_node;
    numa::choice const where =
      kind_ == host_memory::caller ? numa::choice{-1, "caller memory: placed by the caller"}
                                   : numa::choose_node(config.numa_node, "/sys", current_pci_bus_id());
    numa_.node   = where.node;
    numa_.reason = where.reason;
    switch (kind_) {
      case host_memory::pinned: {
        // cudaHostAlloc (the default resource) touches its pages in this thread: a thread
        // policy places them. A caller's resource that hands out touched memory places it.
        std::optional<numa::scoped_preferred_node> prefer;
        if (where.node >= 0) {
          prefer.emplace(where.node);
          if (prefer->status() != 0) { unbind(numa::refused("set_mempolicy", prefer->status())); }
        }
        pages_ = pinned_array<std::byte>(bytes, pinned, nullptr);
        host_  = pages_.data();
        break;
      }
      case host_memory::huge_pages: {
        mapped_bytes_ = mapped_size(kind_, bytes);
        void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        DHISPARSE_EXPECTS(p != MAP_FAILED,
                          "host_store: mmap of " + std::to_string(mapped_bytes_) + " bytes failed");
        if (where.node >= 0) {  // before any page is touched
          int const err = numa::bind_preferred(p, mapped_bytes_, where.node);
          if (err != 0) { unbind(numa::refused("mbind", err)); }
        }
        ::madvise(p, mapped_bytes_, MADV_HUGEPAGE);  // a hint: no error if THP is off
        host_ = static_cast<std::byte*>(p);
        register_memory(mapped_bytes_);
        break;
      }
      case host_memory::caller:
        DHISPARSE_EXPECTS(config.caller_memory != nullptr,
                          "host_store: host_memory::caller needs caller_memory");
        DHISPARSE_EXPECTS(reinterpret_cast<std::uintptr_t>(config.caller_memory) % row_alignment == 0,
                          "host_store: caller_memory must be 16-byte aligned");
        DHISPARSE_EXPECTS(config.caller_bytes >= bytes,
                          "host_store: caller_bytes (" + std::to_string(config.caller_bytes) +
                            ") is smaller than capacity_pages × page bytes (" + std::to_string(bytes) + ")");
        host_ = static_cast<std::byte*>(config.caller_memory);
        if (!config.caller_memory_registered) { register_memory(config.caller_bytes); }
        break;
    }
    numa_.first_page_node = numa::page_node(host_);
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  }
  pinned_host_memory(pinned_host_memory&& o) noexcept { swap(o); }
  pinned_host_memory& operator=(pinned_host_memory&& o) noexcept
  {
    swap(o);
    return *this;
  }
  pinned_host_memory(pinned_host_memory const&)            = delete;
  pinned_host_memory& operator=(pinned_host_memory const&) = delete;
  ~pinned_host_memory()
  {
    if (host_ == nullptr) { return; }
    if (registered_) { cudaHostUnregister(host_); }
    if (kind_ == host_memory::huge_pages) { ::munmap(host_, mapped_bytes_); }
  }

  [[nodiscard]] std::byte* host() const noexcept { return host_; }
  [[nodiscard]] std::byte* device() const noexcept { return device_; }

  /// Host bytes a store of `bytes` occupies: rounded up to whole 2 MiB pages with
  /// huge_pages, `bytes` otherwise.
  static std::size_t mapped_size(host_memory kind, std::size_t bytes) noexcept
  {
    std::size_t const huge = std::size_t{2} << 20;
    return kind == host_memory::huge_pages ? (bytes + huge - 1) / huge * huge : bytes;
  }
  [[nodiscard]] numa_binding const& numa() const noexcept { return numa_; }

  /// PCI bus id of the current device ("" without one), for the NUMA choice.
  static std::string current_pci_bus_id()
  {
    int device = 0;
    char id[32] = {};
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(id, int(sizeof id), device) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return id;
  }

 private:
  void unbind(std::string why)
  {
    numa_.reason += "; " + why + ", not bound";
    numa_.node = -1;
  }
  void register_memory(std::size_t bytes)
  {
    cudaError_t const status = cudaHostRegister(host_, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (status != cudaSuccess) {
      if (kind_ == host_memory::huge_pages) { ::munmap(host_, mapped_bytes_); }
      host_ = nullptr;
      throw_cuda_error(status, "cudaHostRegister", __FILE__, __LINE__);
    }
    registered_ = true;
  }
  void swap(pinned_host_memory& o) noexcept
  {
    std::swap(kind_, o.kind_);
    std::swap(pages_, o.pages_);
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
    std::swap(mapped_bytes_, o.mapped_bytes_);
    std::swap(registered_, o.registered_);
    std::swap(numa_, o.numa_);
  }

  host_memory kind_        = host_memory::pinned;
  pinned_array<std::byte> pages_;  // host_memory::pinned: from the resource
  std::byte* host_         = nullptr;
  std::byte* device_       = nullptr;
  std::size_t mapped_bytes_ = 0;
  bool registered_         = false;
  numa_binding numa_{};
};

}  // namespace detail

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
  ~host_store()                                = default;

  /// Bytes of one page (all groups, all layers, P tokens).
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] int tokens_per_page() const noexcept { return config_.tokens_per_page; }
  [[nodiscard]] std::size_t capacity_pages() const noexcept { return config_.capacity_pages; }
  [[nodiscard]] std::size_t free_pages() const noexcept { return pages_.free_pages(); }
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
    pages_.grow(request, capacity, uploader, stream);
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
    pages_.adopt(request, pages, uploader, stream);
  }

  /// Returns all pages of `request` to the store; its device table row becomes empty.
  void release(int request, cudaStream_t stream) { pages_.release(request, stream); }

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
    return memory_.host() + page * page_bytes_ + layouts_[group].page_offset +
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
  [[nodiscard]] numa_binding const& numa() const noexcept { return memory_.numa(); }
  /// Bytes of the store (capacity_pages × page_bytes): the host range of its rows, e.g. for
  /// `order_plan_async`.
  [[nodiscard]] std::size_t bytes() const noexcept { return page_bytes_ * config_.capacity_pages; }

  /// Device view for kernels.
  [[nodiscard]] host_store_ref ref() const noexcept
  {
    return {memory_.device(), pages_.device_table(), pages_.max_pages_per_request(), page_shift_, page_bytes_};
  }

 private:
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
  detail::pinned_host_memory memory_;
};

}  // namespace dhisparse
