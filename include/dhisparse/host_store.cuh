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
 * kernels read and write rows directly (zero-copy): `cudaHostAlloc` by default,
 * transparent huge pages (`mmap` + `madvise` + `cudaHostRegister`), or caller memory
 * (`cudaHostRegister`). An engine's transfer layer can write prefill rows straight into
 * host pages (`row`) before the request's first step: direct-to-host admission.
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dhisparse {

/// Placement of one group's rows inside a host page (and size of its group rows).
struct group_layout {
  std::size_t page_offset;  ///< byte offset of the group's block inside a page
  std::size_t row_bytes;    ///< bytes of one group row: layers × row format bytes
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
   * @throws dhisparse::error on invalid arguments or failed allocation
   */
  host_store(host_store_config const& config, std::vector<int> const& group_layers,
             std::size_t row_bytes, int max_requests, int max_context, cudaStream_t stream)
    : config_{config}, row_bytes_{row_bytes}, group_layers_{group_layers}
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
    std::size_t offset = 0;
    for (int layers : group_layers) {
      DHISPARSE_EXPECTS(layers > 0, "host_store: group_layers entries must be positive");
      layouts_.push_back({offset, std::size_t(layers) * row_bytes});
      offset += std::size_t(config.tokens_per_page) * layers * row_bytes;
    }
    page_bytes_            = offset;
    max_pages_per_request_ = (max_context + config.tokens_per_page - 1) / config.tokens_per_page;
    while ((1 << page_shift_) < config.tokens_per_page) { ++page_shift_; }
    allocate();
    free_pages_.reserve(config.capacity_pages);
    for (std::size_t p = config.capacity_pages; p-- > 0;) { free_pages_.push_back(std::int32_t(p)); }
    pages_.resize(max_requests);
    page_table_ = detail::device_array<std::int32_t>(std::size_t(max_requests) * max_pages_per_request_);
    page_table_.fill_bytes(0xFF, stream);
  }

  host_store(host_store&& o) noexcept { swap(o); }
  host_store& operator=(host_store&& o) noexcept
  {
    swap(o);
    return *this;
  }
  host_store(host_store const&)            = delete;
  host_store& operator=(host_store const&) = delete;
  ~host_store() { free_memory(); }

  /// Bytes of one page (all groups, all layers, P tokens).
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] int tokens_per_page() const noexcept { return config_.tokens_per_page; }
  [[nodiscard]] std::size_t capacity_pages() const noexcept { return config_.capacity_pages; }
  [[nodiscard]] std::size_t free_pages() const noexcept { return free_pages_.size(); }
  [[nodiscard]] int max_pages_per_request() const noexcept { return max_pages_per_request_; }
  [[nodiscard]] group_layout layout(int group) const { return layouts_.at(group); }
  [[nodiscard]] std::vector<group_layout> const& layouts() const noexcept { return layouts_; }

  /// Pages needed so that positions [0, capacity) of a request are backed.
  [[nodiscard]] std::size_t pages_for(std::int64_t capacity) const noexcept
  {
    return std::size_t((capacity + config_.tokens_per_page - 1) / config_.tokens_per_page);
  }

  /// Pages a request would need beyond what it holds to reach `capacity` positions.
  [[nodiscard]] std::size_t missing_pages(int request, std::int64_t capacity) const
  {
    std::size_t const want = pages_for(capacity);
    std::size_t const have = pages_.at(request).size();
    return want > have ? want - have : 0;
  }

  /**
   * @brief Backs positions [0, capacity) of `request` with pages (host side; the device
   *        table update is ordered on `stream`). All or nothing.
   * @throws dhisparse::error "host store exhausted" when too few pages are free
   */
  void grow(int request, std::int64_t capacity, detail::staging_uploader& uploader,
            cudaStream_t stream)
  {
    DHISPARSE_EXPECTS(capacity >= 0 && pages_for(capacity) <= std::size_t(max_pages_per_request_),
                      "host_store::grow: capacity (" + std::to_string(capacity) +
                        ") exceeds max_context");
    std::size_t const need = missing_pages(request, capacity);
    DHISPARSE_EXPECTS(need <= free_pages_.size(),
                      "host store exhausted: request needs " + std::to_string(need) +
                        " more pages, " + std::to_string(free_pages_.size()) + " free");
    if (need == 0) { return; }
    auto& list                = pages_[request];
    std::size_t const first   = list.size();
    for (std::size_t i = 0; i < need; ++i) {
      list.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    uploader.upload(page_table_.data() + std::size_t(request) * max_pages_per_request_ + first,
                    list.data() + first, need * sizeof(std::int32_t), stream);
  }

  /// Returns all pages of `request` to the store; its device table row becomes empty.
  void release(int request, cudaStream_t stream)
  {
    auto& list = pages_.at(request);
    free_pages_.insert(free_pages_.end(), list.rbegin(), list.rend());
    list.clear();
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(
      page_table_.data() + std::size_t(request) * max_pages_per_request_, 0xFF,
      std::size_t(max_pages_per_request_) * sizeof(std::int32_t), stream));
  }

  /// Positions of `request` currently backed by pages.
  [[nodiscard]] std::int64_t capacity(int request) const
  {
    return std::int64_t(pages_.at(request).size()) * config_.tokens_per_page;
  }

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
    auto const& list = pages_.at(request);
    DHISPARSE_EXPECTS(position >= 0 && position < capacity(request),
                      "host_store::row: position " + std::to_string(position) +
                        " is not backed by a page");
    std::size_t const page = std::size_t(list[position >> page_shift_]);
    std::size_t const in_page = std::size_t(position) & (config_.tokens_per_page - 1);
    return host_base_ + page * page_bytes_ + layouts_[group].page_offset +
           in_page * layouts_[group].row_bytes + std::size_t(layer) * row_bytes_;
  }

  /// Device view for kernels.
  [[nodiscard]] host_store_ref ref() const noexcept
  {
    return {device_base_, page_table_.data(), max_pages_per_request_, page_shift_, page_bytes_};
  }

 private:
  void allocate()
  {
    std::size_t const bytes = page_bytes_ * config_.capacity_pages;
    switch (config_.memory) {
      case host_memory::pinned:
        DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_base_), bytes,
                                         cudaHostAllocMapped | cudaHostAllocPortable));
        break;
      case host_memory::huge_pages: {
        std::size_t const huge = std::size_t{2} << 20;
        mapped_bytes_          = (bytes + huge - 1) / huge * huge;
        void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        DHISPARSE_EXPECTS(p != MAP_FAILED, "host_store: mmap of " + std::to_string(mapped_bytes_) +
                                             " bytes failed");
        ::madvise(p, mapped_bytes_, MADV_HUGEPAGE);  // a hint: no error if THP is off
        host_base_ = static_cast<std::byte*>(p);
        register_memory(mapped_bytes_);
        break;
      }
      case host_memory::caller:
        DHISPARSE_EXPECTS(config_.caller_memory != nullptr,
                          "host_store: host_memory::caller needs caller_memory");
        DHISPARSE_EXPECTS(reinterpret_cast<std::uintptr_t>(config_.caller_memory) % row_alignment == 0,
                          "host_store: caller_memory must be 16-byte aligned");
        DHISPARSE_EXPECTS(config_.caller_bytes >= bytes,
                          "host_store: caller_bytes (" + std::to_string(config_.caller_bytes) +
                            ") is smaller than capacity_pages × page bytes (" +
                            std::to_string(bytes) + ")");
        host_base_ = static_cast<std::byte*>(config_.caller_memory);
        if (!config_.caller_memory_registered) { register_memory(config_.caller_bytes); }
        break;
    }
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_base_), host_base_, 0));
  }

  void register_memory(std::size_t bytes)
  {
    cudaError_t const status =
      cudaHostRegister(host_base_, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (status != cudaSuccess) {
      if (config_.memory == host_memory::huge_pages) { ::munmap(host_base_, mapped_bytes_); }
      host_base_ = nullptr;
      detail::throw_cuda_error(status, "cudaHostRegister", __FILE__, __LINE__);
    }
    registered_ = true;
  }

  void free_memory() noexcept
  {
    if (host_base_ == nullptr) { return; }
    if (registered_) { cudaHostUnregister(host_base_); }
    if (config_.memory == host_memory::pinned) { cudaFreeHost(host_base_); }
    if (config_.memory == host_memory::huge_pages) { ::munmap(host_base_, mapped_bytes_); }
    host_base_ = nullptr;
  }

  void swap(host_store& o) noexcept
  {
    std::swap(config_, o.config_);
    std::swap(row_bytes_, o.row_bytes_);
    std::swap(group_layers_, o.group_layers_);
    std::swap(layouts_, o.layouts_);
    std::swap(page_bytes_, o.page_bytes_);
    std::swap(max_pages_per_request_, o.max_pages_per_request_);
    std::swap(page_shift_, o.page_shift_);
    std::swap(host_base_, o.host_base_);
    std::swap(device_base_, o.device_base_);
    std::swap(mapped_bytes_, o.mapped_bytes_);
    std::swap(registered_, o.registered_);
    std::swap(free_pages_, o.free_pages_);
    std::swap(pages_, o.pages_);
    std::swap(page_table_, o.page_table_);
  }

  host_store_config config_{};
  std::size_t row_bytes_ = 0;
  std::vector<int> group_layers_;
  std::vector<group_layout> layouts_;
  std::size_t page_bytes_          = 0;
  std::int32_t max_pages_per_request_ = 0;
  std::int32_t page_shift_         = 0;
  std::byte* host_base_            = nullptr;
  std::byte* device_base_          = nullptr;
  std::size_t mapped_bytes_        = 0;
  bool registered_                 = false;
  std::vector<std::int32_t> free_pages_;
  std::vector<std::vector<std::int32_t>> pages_;
  detail::device_array<std::int32_t> page_table_;
};

}  // namespace dhisparse
