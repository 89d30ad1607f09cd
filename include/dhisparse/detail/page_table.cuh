/**
 * @file detail/page_table.cuh
 * @brief A pool of pages handed out to requests, with each request's page list on the host
 *        and the same lists in a device table `[max_requests][max_pages_per_request]`
 *        (-1 = none) that kernels read. Shared by `host_store` (pages of host rows) and
 *        `residency_map` (pages of map entries).
 *
 * Released pages are parked behind an event recorded on the release's stream: work
 * enqueued before the release (a backup writing the request's rows, a step reading its map)
 * may still use them, so `grow` hands them out only once that event completed — it waits
 * for the oldest parked pages only when the free ones alone do not cover a request.
 * `free_pages()` counts parked pages: they are never lost, only deferred.
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace dhisparse::detail {

class page_table {
 public:
  /**
   * @param name               what the pages are, for error messages ("host store")
   * @param num_pages          pages in the pool
   * @param max_requests       request indices
   * @param positions_per_page positions one page covers
   * @param max_context        positions a request may reach
   * @param device             resource of the device table (`device_bytes_for` bytes)
   */
  page_table(std::string name, std::size_t num_pages, int max_requests, int positions_per_page,
             int max_context, device_memory_resource& device, cudaStream_t stream)
    : name_{std::move(name)},
      positions_per_page_{positions_per_page},
      max_pages_per_request_{pages_per_request(positions_per_page, max_context)}
  {
    DHISPARSE_EXPECTS(num_pages > 0 && num_pages < (std::size_t{1} << 31),
                      name_ + ": the number of pages must be in [1, 2^31)");
    free_.reserve(num_pages);
    for (std::size_t p = num_pages; p-- > 0;) { free_.push_back(std::int32_t(p)); }  // 0 first
    held_.assign(num_pages, 0);
    free_count_ = num_pages;
    lists_.resize(max_requests);
    device_ = device_array<std::int32_t>(std::size_t(max_requests) * max_pages_per_request_, device, stream);
    device_.fill_bytes(0xFF, stream);
  }

  /// Bytes of the device table of a page table of this shape (its only device or pinned
  /// memory: the host-side page lists are ordinary heap memory).
  static std::size_t device_bytes_for(int max_requests, int positions_per_page, int max_context) noexcept
  {
    return std::size_t(max_requests) * std::size_t(pages_per_request(positions_per_page, max_context)) *
           sizeof(std::int32_t);
  }

  /// Pages not held by any request (the parked ones included).
  [[nodiscard]] std::size_t free_pages() const noexcept { return free_count_ + parked_pages_; }
  [[nodiscard]] std::int32_t max_pages_per_request() const noexcept { return max_pages_per_request_; }
  [[nodiscard]] std::int32_t const* device_table() const noexcept { return device_.data(); }
  [[nodiscard]] std::size_t device_bytes() const noexcept { return device_.bytes(); }
  [[nodiscard]] std::vector<std::int32_t> const& pages(int request) const { return lists_.at(request); }

  /// Positions of `request` its pages cover.
  [[nodiscard]] std::int64_t capacity(int request) const
  {
    return std::int64_t(lists_.at(request).size()) * positions_per_page_;
  }

  /// Pages a request would need beyond what it holds to cover `capacity` positions.
  [[nodiscard]] std::size_t missing_pages(int request, std::int64_t capacity) const
  {
    std::size_t const want = std::size_t((capacity + positions_per_page_ - 1) / positions_per_page_);
    std::size_t const have = lists_.at(request).size();
    return want > have ? want - have : 0;
  }

  /// Covers positions [0, capacity) of `request`; the device table update is ordered on
  /// `stream`. All or nothing: throws "<name> exhausted" when too few pages are free.
  void grow(int request, std::int64_t capacity, staging_uploader& uploader, cudaStream_t stream)
  {
    DHISPARSE_EXPECTS(capacity >= 0 && (capacity + positions_per_page_ - 1) / positions_per_page_ <=
                                         max_pages_per_request_,
                      name_ + ": capacity (" + std::to_string(capacity) + ") exceeds max_context");
    std::size_t const need = missing_pages(request, capacity);
    DHISPARSE_EXPECTS(need <= free_pages(), name_ + " exhausted: request needs " + std::to_string(need) +
                                              " more pages, " + std::to_string(free_pages()) + " free");
    if (need == 0) { return; }
    unpark(need);
    auto& list              = lists_[request];
    std::size_t const first = list.size();
    while (list.size() < first + need) {
      std::int32_t const page = free_.back();
      free_.pop_back();
      if (held_[std::size_t(page)] != 0) { continue; }  // adopted since it was freed
      held_[std::size_t(page)] = 1;
      list.push_back(page);
    }
    free_count_ -= need;
    upload_tail(request, first, uploader, stream);
  }

  /**
   * Gives `request`, holding no pages, the free pages `pages` in that order (all or
   * nothing); the device table update is ordered on `stream`.
   */
  void adopt(int request, std::vector<std::int32_t> const& pages, staging_uploader& uploader, cudaStream_t stream)
  {
    DHISPARSE_EXPECTS(lists_.at(request).empty(), name_ + ": adopt needs a request that holds no pages");
    extend(request, pages, uploader, stream);
  }

  /**
   * Appends the free pages `pages` to the list of `request` (all or nothing); the device
   * table update is ordered on `stream`. A store shared by several hierarchies hands every
   * rank's table the pages its one allocator chose (shared_host_store.cuh).
   */
  void extend(int request, std::vector<std::int32_t> const& pages, staging_uploader& uploader, cudaStream_t stream)
  {
    auto& list = lists_.at(request);
    DHISPARSE_EXPECTS(list.size() + pages.size() <= std::size_t(max_pages_per_request_),
                      name_ + ": " + std::to_string(list.size() + pages.size()) +
                        " pages adopted, max_context needs at most " + std::to_string(max_pages_per_request_));
    unpark(0);  // pages whose release the device has passed are free (no waiting)
    std::size_t k = 0;
    for (; k < pages.size(); ++k) {  // marks them held; undone below when one is refused
      std::int32_t const page = pages[k];
      if (page < 0 || std::size_t(page) >= held_.size() || held_[std::size_t(page)] != 0) { break; }
      held_[std::size_t(page)] = 1;
    }
    if (k < pages.size()) {
      std::int32_t const bad = pages[k];
      bool const outside     = bad < 0 || std::size_t(bad) >= held_.size();
      std::string const why  = outside ? "is outside the pool" : held_[std::size_t(bad)] == 1 ? "is held or repeated" : "was released and is not yet free";
      for (std::size_t i = 0; i < k; ++i) { held_[std::size_t(pages[i])] = 0; }
      throw_error(__FILE__, __LINE__, name_ + ": adopted page " + std::to_string(bad) + " (entry " + std::to_string(k) + ") " + why);
    }
    std::size_t const first = list.size();
    list.insert(list.end(), pages.begin(), pages.end());
    free_count_ -= pages.size();
    if (free_.size() > 2 * held_.size()) { compact_free(); }
    upload_tail(request, first, uploader, stream);
  }

  /**
   * Returns the pages of `request` to the pool once `stream` reaches this call (parked
   * until then, see the file comment); its device row becomes empty on `stream`. Inside a
   * stream capture there is no point of the stream to wait for: the pages are free at once.
   */
  void release(int request, cudaStream_t stream)
  {
    auto& list = lists_.at(request);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(device_.data() + std::size_t(request) * max_pages_per_request_, 0xFF,
                                       std::size_t(max_pages_per_request_) * sizeof(std::int32_t), stream));
    if (list.empty()) { return; }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      free_now(list);
    } else {
      for (std::int32_t page : list) { held_[std::size_t(page)] = 2; }
      cudaEvent_t event = nullptr;
      DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      parked p{event_ptr{event}, std::vector<std::int32_t>(list.rbegin(), list.rend())};
      DHISPARSE_CUDA_TRY(cudaEventRecord(event, stream));
      parked_pages_ += p.pages.size();
      parked_.push_back(std::move(p));
    }
    list.clear();
  }

  /**
   * Empties the list of `request` at once, its device row on `stream`: for tables whose
   * pages another allocator hands out and parks (a rank's table of a shared host store).
   */
  void release_now(int request, cudaStream_t stream)
  {
    auto& list = lists_.at(request);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(device_.data() + std::size_t(request) * max_pages_per_request_, 0xFF,
                                       std::size_t(max_pages_per_request_) * sizeof(std::int32_t), stream));
    free_now(list);
    list.clear();
  }

 private:
  void free_now(std::vector<std::int32_t> const& list)
  {
    free_.insert(free_.end(), list.rbegin(), list.rend());
    for (std::int32_t page : list) { held_[std::size_t(page)] = 0; }
    free_count_ += list.size();
  }

  struct event_destroy {
    void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
  };
  using event_ptr = std::unique_ptr<CUevent_st, event_destroy>;
  /// Pages of one release, free once `done` completed (in the order they were released).
  struct parked {
    event_ptr done;
    std::vector<std::int32_t> pages;
  };

  /// Frees the parked pages whose release the device has passed, oldest first; waits for
  /// the oldest ones while fewer than `need` pages are free.
  void unpark(std::size_t need)
  {
    while (!parked_.empty()) {
      cudaError_t const status = cudaEventQuery(parked_.front().done.get());
      if (status == cudaErrorNotReady) {
        if (free_count_ >= need) { return; }
        DHISPARSE_CUDA_TRY(cudaEventSynchronize(parked_.front().done.get()));
      } else if (status != cudaSuccess) {
        throw_cuda_error(status, "cudaEventQuery", __FILE__, __LINE__);
      }
      std::vector<std::int32_t> const& pages = parked_.front().pages;
      free_.insert(free_.end(), pages.begin(), pages.end());
      for (std::int32_t page : pages) { held_[std::size_t(page)] = 0; }
      free_count_ += pages.size();
      parked_pages_ -= pages.size();
      parked_.pop_front();
    }
  }

  /// Uploads `request`'s page list from entry `first` on.
  void upload_tail(int request, std::size_t first, staging_uploader& uploader, cudaStream_t stream)
  {
    auto const& list = lists_[request];
    if (list.size() == first) { return; }
    uploader.upload(device_.data() + std::size_t(request) * max_pages_per_request_ + first, list.data() + first,
                    (list.size() - first) * sizeof(std::int32_t), stream);
  }

  /// Drops the free list's stale entries (pages adopted while listed free), keeping its order.
  void compact_free()
  {
    std::vector<char> seen(held_.size(), 0);
    std::vector<std::int32_t> kept;
    kept.reserve(free_count_);
    for (std::int32_t page : free_) {
      if (held_[std::size_t(page)] == 0 && !seen[std::size_t(page)]) {
        seen[std::size_t(page)] = 1;
        kept.push_back(page);
      }
    }
    free_ = std::move(kept);
  }

  static std::int32_t pages_per_request(int positions_per_page, int max_context) noexcept
  {
    return (max_context + positions_per_page - 1) / positions_per_page;
  }

  std::string name_;
  std::int32_t positions_per_page_;
  std::int32_t max_pages_per_request_;
  std::vector<std::int32_t> free_;  // may list adopted pages too (skipped when popped)
  std::vector<char> held_;          // per page: 0 free, 1 held by a request, 2 parked
  std::size_t free_count_ = 0;      // pages with held_ 0
  std::deque<parked> parked_;
  std::size_t parked_pages_ = 0;
  std::vector<std::vector<std::int32_t>> lists_;
  device_array<std::int32_t> device_;
};

}  // namespace dhisparse::detail
