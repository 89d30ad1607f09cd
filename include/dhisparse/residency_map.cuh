/**
 * @file residency_map.cuh
 * @brief O(1) position → slot lookup per (request, group), paged so that its memory
 *        grows with the context.
 *
 * The map is a pool of pages in device memory. A page covers `positions_per_page`
 * consecutive positions of one request for every group: `[groups][positions_per_page]`
 * int32 entries, -1 = not resident. A per-request directory
 * `[max_requests][max_pages_per_request]` names the page of each position range.
 * Lookup: `pages[directory[request][pos / M]][group][pos % M]` — two dependent loads.
 *
 * Memory: 4 bytes per (position, group) for the positions the host store can hold, plus
 * the directory: 0.6% of the KV it indexes for 656-byte rows (4 / 656), less for larger
 * rows or groups of several layers.
 *
 * Entries are written only by the hierarchy's kernels (resolve, commit, release); pages
 * are handed out host-side (`grow`) and cleared on device when released, so a page in
 * the free pool is always all -1.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/page_table.cuh>
#include <dhisparse/detail/staging_uploader.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dhisparse {

/// Value of a map entry that names no slot.
inline constexpr std::int32_t not_resident = -1;

/**
 * @brief Trivially copyable device view of a `residency_map` (passed to kernels by value).
 */
struct residency_map_ref {
  std::int32_t* pages;             ///< [num_pages][num_groups][positions_per_page]
  std::int32_t const* directory;   ///< [max_requests][max_pages_per_request], -1 = none
  std::int32_t max_pages_per_request;
  std::int32_t num_groups;
  std::int32_t page_shift;  ///< log2(positions_per_page)

  /// The entry of (request, group, position), or nullptr if no page covers the position.
  DHISPARSE_HOST_DEVICE std::int32_t* entry(std::int32_t request, std::int32_t group,
                                            std::int32_t position) const
  {
    std::int32_t const page_index = position >> page_shift;
    if (position < 0 || page_index >= max_pages_per_request) { return nullptr; }
    std::int32_t const page = directory[std::int64_t(request) * max_pages_per_request + page_index];
    if (page < 0) { return nullptr; }
    std::int32_t const per_page = 1 << page_shift;
    return pages + (std::int64_t(page) * num_groups + group) * per_page + (position & (per_page - 1));
  }
};
static_assert(std::is_trivially_copyable_v<residency_map_ref>);

/**
 * @brief Owning, move-only residency map for all groups (see the file comment).
 */
class residency_map {
 public:
  /**
   * @param num_groups          layer groups
   * @param positions_per_page  M, a power of two
   * @param num_pages           pages in the pool (bounds the positions all requests hold)
   * @param max_requests        request indices
   * @param max_context         positions a request may reach
   * @param stream              stream on which the pool and directory are initialised
   * @param resources           where the pages and the directory come from (device)
   */
  residency_map(int num_groups, int positions_per_page, std::size_t num_pages, int max_requests,
                int max_context, cudaStream_t stream, memory_resources const& resources = {})
    : num_groups_{num_groups},
      positions_per_page_{check(num_groups, positions_per_page)},
      directory_{"residency map", num_pages, max_requests, positions_per_page, max_context,
                 detail::device_resource(resources), stream}
  {
    while ((1 << page_shift_) < positions_per_page) { ++page_shift_; }
    pages_ = detail::device_array<std::int32_t>(page_entries(num_groups, positions_per_page, num_pages),
                                                detail::device_resource(resources), stream);
    pages_.fill_bytes(0xFF, stream);
  }

  /// Memory a map of this shape allocates (device only; see `memory_footprint`).
  static memory_footprint bytes_required(int num_groups, int positions_per_page, std::size_t num_pages,
                                         int max_requests, int max_context) noexcept
  {
    memory_footprint f{};
    f.device_bytes = page_entries(num_groups, positions_per_page, num_pages) * sizeof(std::int32_t) +
                     detail::page_table::device_bytes_for(max_requests, positions_per_page, max_context);
    return f;
  }

  [[nodiscard]] std::size_t free_pages() const noexcept { return directory_.free_pages(); }
  [[nodiscard]] int positions_per_page() const noexcept { return positions_per_page_; }

  /// Pages a request would need beyond what it holds to cover `capacity` positions.
  [[nodiscard]] std::size_t missing_pages(int request, std::int64_t capacity) const
  {
    return directory_.missing_pages(request, capacity);
  }

  /**
   * @brief Covers positions [0, capacity) of `request` with (all -1) pages; the directory
   *        update is ordered on `stream`. All or nothing.
   */
  void grow(int request, std::int64_t capacity, detail::staging_uploader& uploader,
            cudaStream_t stream)
  {
    directory_.grow(request, capacity, uploader, stream);
  }

  /**
   * @brief Returns the pages of `request` to the pool. The caller must first have cleared
   *        them on device (`kv_hierarchy::release` runs the clearing kernel, which reads
   *        the directory); this clears the request's directory row on `stream`.
   */
  void release(int request, cudaStream_t stream) { directory_.release(request, stream); }

  /// Device view for kernels.
  [[nodiscard]] residency_map_ref ref() const noexcept
  {
    return {pages_.data(), directory_.device_table(), directory_.max_pages_per_request(), num_groups_,
            page_shift_};
  }

  /// Bytes of device memory held (pages and directory).
  [[nodiscard]] std::size_t device_bytes() const noexcept { return pages_.bytes() + directory_.device_bytes(); }

 private:
  static std::size_t page_entries(int num_groups, int positions_per_page, std::size_t num_pages) noexcept
  {
    return num_pages * std::size_t(num_groups) * std::size_t(positions_per_page);
  }
  static int check(int num_groups, int positions_per_page)
  {
    DHISPARSE_EXPECTS(num_groups > 0, "residency_map: num_groups must be positive");
    DHISPARSE_EXPECTS(detail::is_power_of_two(positions_per_page),
                      "residency_map: positions_per_page must be a power of two");
    return positions_per_page;
  }

  int num_groups_;
  int positions_per_page_;
  std::int32_t page_shift_ = 0;
  detail::page_table directory_;
  detail::device_array<std::int32_t> pages_;
};

}  // namespace dhisparse
