/**
 * @file detail/shared_page_lists.hpp
 * @brief The page bookkeeping of a host store shared by several hierarchies (tensor-parallel
 *        ranks, `shared_host_store`), in plain C++: one page list per request id, held by
 *        every rank that admitted the id, returned to the free pages once the last holder
 *        released it and every holder's stream passed its release.
 *
 * Ranks admit the same requests with the same lengths (the contract of a shared store): the
 * first rank to admit an id takes its pages, the others get the same list; `hold` refuses
 * a length that differs from the first admission's. A rank growing a request (`reserve`, a
 * larger capacity) extends the one list; the others see the extension when they grow to
 * the same capacity. Synchronisation is the caller's (`shared_host_store` holds a mutex).
 */
#pragma once

#include <dhisparse/error.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dhisparse::detail {

/// Says whether a holder's stream passed its release: `done(false)` polls, `done(true)`
/// waits until it did (then returns true).
using release_token = std::function<bool(bool wait)>;

class shared_page_lists {
 public:
  /**
   * @param num_pages          pages of the store
   * @param positions_per_page P
   * @param max_context        positions a request may reach
   */
  shared_page_lists(std::size_t num_pages, int positions_per_page, int max_context)
    : positions_per_page_{positions_per_page},
      max_pages_per_request_{(std::int64_t(max_context) + positions_per_page - 1) / positions_per_page}
  {
    DHISPARSE_EXPECTS(num_pages > 0 && num_pages < (std::size_t{1} << 31),
                      "shared host store: the number of pages must be in [1, 2^31)");
    DHISPARSE_EXPECTS(positions_per_page > 0 && max_context > 0,
                      "shared host store: tokens_per_page and max_context must be positive");
    free_.reserve(num_pages);
    for (std::size_t p = num_pages; p-- > 0;) { free_.push_back(std::int32_t(p)); }  // page 0 first
  }

  /// Pages no request holds (parked ones included: they are deferred, never lost).
  [[nodiscard]] std::size_t free_pages() const noexcept { return free_.size() + parked_pages_; }
  /// Request ids held by at least one rank.
  [[nodiscard]] std::size_t requests() const noexcept { return lists_.size(); }
  /// Ranks holding `id` (0: unknown).
  [[nodiscard]] int holders(std::uint64_t id) const
  {
    auto const it = lists_.find(id);
    return it == lists_.end() ? 0 : it->second.holders;
  }
  /// The page list of `id` (empty: unknown).
  [[nodiscard]] std::vector<std::int32_t> pages(std::uint64_t id) const
  {
    auto const it = lists_.find(id);
    return it == lists_.end() ? std::vector<std::int32_t>{} : it->second.pages;
  }

  /// Pages `id` would take beyond its list to cover [0, capacity).
  [[nodiscard]] std::size_t missing_pages(std::uint64_t id, std::int64_t capacity) const
  {
    auto const it          = lists_.find(id);
    std::size_t const have = it == lists_.end() ? 0 : it->second.pages.size();
    std::size_t const want = std::size_t((capacity + positions_per_page_ - 1) / positions_per_page_);
    return want > have ? want - have : 0;
  }

  /**
   * @brief One more rank holds `id` (the first one creates its list with `length`), and
   *        its list covers [0, capacity). All or nothing.
   * @return the list (valid until the next call)
   * @throws dhisparse::error when `length` differs from the first admission's, the capacity
   *         exceeds max_context, or too few pages are free
   */
  std::vector<std::int32_t> const& hold(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    auto const it = lists_.find(id);
    if (it != lists_.end()) {
      DHISPARSE_EXPECTS(it->second.length == length,
                        "shared host store: request " + std::to_string(id) + " admitted with length " +
                          std::to_string(length) + ", another rank admitted it with " +
                          std::to_string(it->second.length) + " (ranks must admit the same requests alike)");
    }
    check_capacity(id, capacity);
    entry& e = lists_[id];
    if (e.holders == 0) { e.length = length; }
    ++e.holders;
    extend(e, capacity);
    return e.pages;
  }

  /**
   * @brief Covers [0, capacity) of a held `id`. All or nothing.
   * @throws dhisparse::error for an id no rank holds, a capacity beyond max_context, or too
   *         few free pages
   */
  std::vector<std::int32_t> const& grow(std::uint64_t id, std::int64_t capacity)
  {
    auto const it = lists_.find(id);
    DHISPARSE_EXPECTS(it != lists_.end(), "shared host store: request " + std::to_string(id) + " is not held");
    check_capacity(id, capacity);
    extend(it->second, capacity);
    return it->second.pages;
  }

  /**
   * @brief One rank releases `id`; `done` tells when its stream passed the release. The
   *        pages return to the free pages once the last holder left and every holder's
   *        token is done.
   * @throws dhisparse::error for an id no rank holds
   */
  void drop(std::uint64_t id, release_token done)
  {
    auto const it = lists_.find(id);
    DHISPARSE_EXPECTS(it != lists_.end(), "shared host store: request " + std::to_string(id) + " is not held");
    entry& e = it->second;
    if (done) { e.done.push_back(std::move(done)); }
    if (--e.holders > 0) { return; }
    parked_pages_ += e.pages.size();
    parked_.push_back(parked{std::move(e.pages), std::move(e.done)});
    lists_.erase(it);
  }

 private:
  struct entry {
    std::vector<std::int32_t> pages;
    std::vector<release_token> done;  // of the holders that released so far
    std::int32_t length = 0;
    int holders         = 0;
  };
  struct parked {
    std::vector<std::int32_t> pages;
    std::vector<release_token> done;
  };

  void check_capacity(std::uint64_t id, std::int64_t capacity) const
  {
    DHISPARSE_EXPECTS(capacity >= 0 && (capacity + positions_per_page_ - 1) / positions_per_page_ <=
                                         max_pages_per_request_,
                      "shared host store: capacity (" + std::to_string(capacity) + ") exceeds max_context");
    std::size_t const need = missing_pages(id, capacity);
    DHISPARSE_EXPECTS(need <= free_pages(), "shared host store exhausted: request needs " + std::to_string(need) +
                                              " more pages, " + std::to_string(free_pages()) + " free");
  }

  void extend(entry& e, std::int64_t capacity)
  {
    std::size_t const want = std::size_t((capacity + positions_per_page_ - 1) / positions_per_page_);
    if (want <= e.pages.size()) { return; }
    unpark(want - e.pages.size());
    while (e.pages.size() < want) {
      e.pages.push_back(free_.back());
      free_.pop_back();
    }
  }

  /// Frees parked pages whose holders all passed their release, oldest first; waits for
  /// the oldest while fewer than `need` pages are free.
  void unpark(std::size_t need)
  {
    while (!parked_.empty()) {
      parked& front = parked_.front();
      for (auto& done : front.done) {
        if (!done(false)) {
          if (free_.size() >= need) { return; }
          done(true);
        }
      }
      free_.insert(free_.end(), front.pages.rbegin(), front.pages.rend());
      parked_pages_ -= front.pages.size();
      parked_.pop_front();
    }
  }

  std::int32_t positions_per_page_;
  std::int64_t max_pages_per_request_;
  std::vector<std::int32_t> free_;
  std::unordered_map<std::uint64_t, entry> lists_;
  std::deque<parked> parked_;
  std::size_t parked_pages_ = 0;
};

}  // namespace dhisparse::detail
