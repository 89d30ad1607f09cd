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
 * the same capacity.
 *
 * The state is one block of memory without pointers — a free-page stack, a `next` link per
 * page (a request's pages are a chain), a table of ids — guarded by a mutex inside it, so
 * that it can live in a shared-memory segment that processes map at different addresses
 * (the ranks of a replica run in separate processes). Every call locks it. Each object
 * keeps its own process's release tokens; the state counts the tokens not yet passed per
 * id (`pending`), which a process settles the next time it calls in (or when it is
 * destroyed: it waits for its tokens then). A process waits only for its own tokens: pages
 * parked behind another process's release stay parked until that process calls in.
 */
#pragma once

#include <dhisparse/error.hpp>

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace dhisparse::detail {

/// Says whether a holder's stream passed its release: `done(false)` polls, `done(true)`
/// waits until it did (then returns true).
using release_token = std::function<bool(bool wait)>;

class shared_page_lists {
 public:
  /// Ids (held or parked) the state has room for unless told otherwise.
  static constexpr std::int32_t default_max_ids = 4096;

  /// Bytes of state for these shapes (see the constructors).
  static std::size_t state_bytes(std::size_t num_pages, std::int32_t max_ids)
  {
    return layout::of(num_pages, max_ids).bytes;
  }

  /**
   * @brief Page lists of this process only, their state on the heap.
   * @param num_pages          pages of the store
   * @param positions_per_page P
   * @param max_context        positions a request may reach
   * @param max_ids            request ids held or parked at once
   */
  shared_page_lists(std::size_t num_pages, int positions_per_page, int max_context,
                    std::int32_t max_ids = default_max_ids)
    : owned_{new std::max_align_t[(state_bytes(checked(num_pages, max_ids), max_ids) + sizeof(std::max_align_t) - 1) /
                                  sizeof(std::max_align_t)]}
  {
    attach(owned_.get(), state_bytes(num_pages, max_ids), num_pages, positions_per_page, max_context, max_ids, true,
           false);
  }

  /**
   * @brief Page lists whose state lives in `memory` (≥ `state_bytes`, 8-byte aligned), e.g.
   *        a shared-memory segment. `create`: initialise it (its mutex process-shared when
   *        `process_shared`); otherwise attach to a state another object (of this or
   *        another process) created with the same shapes.
   * @throws dhisparse::error for bad shapes, or a state that was not created with them
   */
  shared_page_lists(void* memory, std::size_t bytes, std::size_t num_pages, int positions_per_page, int max_context,
                    std::int32_t max_ids, bool create, bool process_shared)
  {
    checked(num_pages, max_ids);
    attach(memory, bytes, num_pages, positions_per_page, max_context, max_ids, create, process_shared);
  }

  shared_page_lists(shared_page_lists const&)            = delete;
  shared_page_lists& operator=(shared_page_lists const&) = delete;

  /// Waits for this process's outstanding release tokens and settles them.
  ~shared_page_lists()
  {
    if (header_ == nullptr) { return; }
    try {
      for (auto& t : tokens_) { t.done(true); }
      guard g{*this};
      for (auto const& t : tokens_) { settle(t); }
      tokens_.clear();
    } catch (...) {  // a failed wait: the pages stay parked
    }
  }

  /// Pages no request holds (parked ones included: they are deferred, never lost).
  [[nodiscard]] std::size_t free_pages() const
  {
    guard g{*this};
    return std::size_t(header_->free_count + header_->parked_pages);
  }
  /// Request ids held by at least one rank.
  [[nodiscard]] std::size_t requests() const
  {
    guard g{*this};
    return std::size_t(header_->held_ids);
  }
  /// Ranks holding `id` (0: unknown).
  [[nodiscard]] int holders(std::uint64_t id) const
  {
    guard g{*this};
    entry const* e = find(id);
    return e == nullptr ? 0 : e->holders;
  }
  /// The page list of `id` (empty: unknown).
  [[nodiscard]] std::vector<std::int32_t> pages(std::uint64_t id) const
  {
    guard g{*this};
    entry const* e = find(id);
    return e == nullptr ? std::vector<std::int32_t>{} : chain(*e);
  }

  /// The page lists of every held id, read under one lock (a consistent view while other
  /// processes change them).
  [[nodiscard]] std::vector<std::vector<std::int32_t>> held_lists() const
  {
    guard g{*this};
    std::vector<std::vector<std::int32_t>> out;
    for (std::int32_t i = 0; i < header_->max_ids; ++i) {
      if (entries_[i].state == entry_held) { out.push_back(chain(entries_[i])); }
    }
    return out;
  }

  /// Pages `id` would take beyond its list to cover [0, capacity).
  [[nodiscard]] std::size_t missing_pages(std::uint64_t id, std::int64_t capacity) const
  {
    guard g{*this};
    return missing(find(id), capacity);
  }

  /// Settles this process's release tokens that passed (every `hold`, `grow` and `drop`
  /// does it first): another process waiting for those pages can take them then.
  void settle()
  {
    guard g{*this};
    settle_passed();
  }

  /**
   * @brief One more rank holds `id` (the first one creates its list with `length`), and
   *        its list covers [0, capacity). All or nothing.
   * @return the list
   * @throws dhisparse::error when `length` differs from the first admission's, the capacity
   *         exceeds max_context, too few pages are free, or the table of ids is full
   */
  std::vector<std::int32_t> hold(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    guard g{*this};
    settle_passed();
    entry* e = find(id);
    if (e != nullptr) {
      DHISPARSE_EXPECTS(e->length == length,
                        "shared host store: request " + std::to_string(id) + " admitted with length " +
                          std::to_string(length) + ", another rank admitted it with " + std::to_string(e->length) +
                          " (ranks must admit the same requests alike)");
    }
    check_capacity(e, capacity);
    make_room(std::int64_t(missing(e, capacity)));  // before anything changes: a failure leaves no trace
    if (e == nullptr) {
      e = empty_entry();
      if (e == nullptr) {  // every entry held or parked: free the oldest parked list nothing waits on
        if (entry* p = oldest_parked([](entry const& x) { return x.pending == 0; })) { unpark(*p); }
        e = empty_entry();
      }
      DHISPARSE_EXPECTS(e != nullptr, "shared host store: " + std::to_string(header_->max_ids) +
                                        " request ids are held or parked already (the table of ids is full)");
      *e            = entry{};
      e->id         = id;
      e->state      = entry_held;
      e->length     = length;
      e->head       = -1;
      e->tail       = -1;
      e->generation = ++header_->clock;
      ++header_->held_ids;
    }
    ++e->holders;
    extend(*e, capacity);
    return chain(*e);
  }

  /**
   * @brief Covers [0, capacity) of a held `id`. All or nothing.
   * @throws dhisparse::error for an id no rank holds, a capacity beyond max_context, or too
   *         few free pages
   */
  std::vector<std::int32_t> grow(std::uint64_t id, std::int64_t capacity)
  {
    guard g{*this};
    settle_passed();
    entry* e = find(id);
    DHISPARSE_EXPECTS(e != nullptr, "shared host store: request " + std::to_string(id) + " is not held");
    check_capacity(e, capacity);
    make_room(std::int64_t(missing(e, capacity)));
    extend(*e, capacity);
    return chain(*e);
  }

  /**
   * @brief One rank releases `id`; `done` tells when its stream passed the release (null:
   *        nothing in flight). The pages return to the free pages once the last holder
   *        left and every holder's token is done.
   * @throws dhisparse::error for an id no rank holds
   */
  void drop(std::uint64_t id, release_token done)
  {
    guard g{*this};
    settle_passed();
    entry* e = find(id);
    DHISPARSE_EXPECTS(e != nullptr, "shared host store: request " + std::to_string(id) + " is not held");
    if (done) {
      ++e->pending;
      tokens_.push_back(local_token{std::int32_t(e - entries_), e->generation, std::move(done)});
    }
    if (--e->holders > 0) { return; }
    e->state = entry_parked;
    e->parked_at = ++header_->clock;
    header_->parked_pages += e->count;
    --header_->held_ids;
  }

 private:
  static constexpr std::uint64_t state_magic = 0x64687370'6c697374ull;  // "dhsplist"
  enum : std::int32_t { entry_empty = 0, entry_held = 1, entry_parked = 2 };

  struct entry {
    std::uint64_t id;
    std::uint64_t generation;  ///< unique per list (tokens name it)
    std::uint64_t parked_at;   ///< order of parking (oldest first)
    std::int64_t count;        ///< pages in the chain
    std::int32_t state;
    std::int32_t length;
    std::int32_t holders;
    std::int32_t pending;      ///< release tokens not yet settled, of any process
    std::int32_t head, tail;   ///< first and last page of the chain (-1: none)
  };
  struct header {
    std::uint64_t magic;
    std::int64_t num_pages, positions_per_page, max_pages_per_request;
    std::int32_t max_ids, process_shared;
    std::int64_t free_count, parked_pages, held_ids;
    std::uint64_t clock;
    pthread_mutex_t mutex;
  };
  struct layout {
    std::size_t free_off, next_off, entries_off, bytes;
    static layout of(std::size_t num_pages, std::int32_t max_ids)
    {
      auto up = [](std::size_t n) { return (n + 63) / 64 * 64; };
      layout l{};
      l.free_off    = up(sizeof(header));
      l.next_off    = l.free_off + up(num_pages * 4);
      l.entries_off = l.next_off + up(num_pages * 4);
      l.bytes       = l.entries_off + std::size_t(max_ids) * sizeof(entry);
      return l;
    }
  };
  struct local_token {
    std::int32_t index;
    std::uint64_t generation;
    release_token done;
  };
  struct guard {
    explicit guard(shared_page_lists const& l) : m{&l.header_->mutex}
    {
      int const rc = pthread_mutex_lock(m);
      if (rc == EOWNERDEAD) {  // a process died inside a call: take the state as it is
        pthread_mutex_consistent(m);
      } else if (rc != 0) {
        throw dhisparse::error("shared host store: locking its state failed (" + std::to_string(rc) + ")");
      }
    }
    ~guard() { pthread_mutex_unlock(m); }
    guard(guard const&)            = delete;
    guard& operator=(guard const&) = delete;
    pthread_mutex_t* m;
  };

  static std::size_t checked(std::size_t num_pages, std::int32_t max_ids)
  {
    DHISPARSE_EXPECTS(num_pages > 0 && num_pages < (std::size_t{1} << 31),
                      "shared host store: the number of pages must be in [1, 2^31)");
    DHISPARSE_EXPECTS(max_ids > 0, "shared host store: max_ids must be positive");
    return num_pages;
  }

  void attach(void* memory, std::size_t bytes, std::size_t num_pages, int positions_per_page, int max_context,
              std::int32_t max_ids, bool create, bool process_shared)
  {
    DHISPARSE_EXPECTS(positions_per_page > 0 && max_context > 0,
                      "shared host store: tokens_per_page and max_context must be positive");
    layout const l = layout::of(num_pages, max_ids);
    DHISPARSE_EXPECTS(memory != nullptr && reinterpret_cast<std::uintptr_t>(memory) % 8 == 0 && bytes >= l.bytes,
                      "shared host store: the page lists need " + std::to_string(l.bytes) +
                        " bytes of 8-byte aligned memory");
    auto* base                 = static_cast<std::byte*>(memory);
    std::int64_t const max_ppr = (std::int64_t(max_context) + positions_per_page - 1) / positions_per_page;
    if (create) {
      header_ = new (base) header{};
      header_->num_pages             = std::int64_t(num_pages);
      header_->positions_per_page    = positions_per_page;
      header_->max_pages_per_request = max_ppr;
      header_->max_ids               = max_ids;
      header_->process_shared        = process_shared ? 1 : 0;
      pthread_mutexattr_t attr;
      pthread_mutexattr_init(&attr);
      if (process_shared) {
        pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
      }
      int const rc = pthread_mutex_init(&header_->mutex, &attr);
      pthread_mutexattr_destroy(&attr);
      DHISPARSE_EXPECTS(rc == 0, "shared host store: initialising its mutex failed");
    } else {
      header_ = reinterpret_cast<header*>(base);
      DHISPARSE_EXPECTS(header_->magic == state_magic && header_->num_pages == std::int64_t(num_pages) &&
                          header_->positions_per_page == positions_per_page &&
                          header_->max_pages_per_request == max_ppr && header_->max_ids == max_ids,
                        "shared host store: the shared page lists were created with other shapes (pages, "
                        "tokens_per_page, max_context or max_ids differ)");
    }
    free_    = reinterpret_cast<std::int32_t*>(base + l.free_off);
    next_    = reinterpret_cast<std::int32_t*>(base + l.next_off);
    entries_ = reinterpret_cast<entry*>(base + l.entries_off);
    if (create) {
      for (std::size_t i = 0; i < num_pages; ++i) { free_[i] = std::int32_t(num_pages - 1 - i); }  // page 0 on top
      header_->free_count = std::int64_t(num_pages);
      for (std::int32_t i = 0; i < max_ids; ++i) { entries_[i] = entry{}; }
      header_->magic = state_magic;  // last: the state is complete
    }
  }

  entry* find(std::uint64_t id) const
  {
    for (std::int32_t i = 0; i < header_->max_ids; ++i) {
      if (entries_[i].state == entry_held && entries_[i].id == id) { return entries_ + i; }
    }
    return nullptr;
  }
  entry* empty_entry() const
  {
    for (std::int32_t i = 0; i < header_->max_ids; ++i) {
      if (entries_[i].state == entry_empty) { return entries_ + i; }
    }
    return nullptr;
  }
  std::vector<std::int32_t> chain(entry const& e) const
  {
    std::vector<std::int32_t> out;
    out.reserve(std::size_t(e.count));
    for (std::int32_t p = e.head; p >= 0 && std::int64_t(out.size()) < e.count; p = next_[p]) { out.push_back(p); }
    return out;
  }

  std::int64_t want_pages(std::int64_t capacity) const
  {
    return (capacity + header_->positions_per_page - 1) / header_->positions_per_page;
  }
  std::size_t missing(entry const* e, std::int64_t capacity) const
  {
    std::int64_t const have = e == nullptr ? 0 : e->count;
    std::int64_t const want = want_pages(capacity);
    return want > have ? std::size_t(want - have) : 0;
  }

  void check_capacity(entry const* e, std::int64_t capacity) const
  {
    DHISPARSE_EXPECTS(capacity >= 0 && want_pages(capacity) <= header_->max_pages_per_request,
                      "shared host store: capacity (" + std::to_string(capacity) + ") exceeds max_context");
    std::size_t const need = missing(e, capacity);
    std::size_t const free = std::size_t(header_->free_count + header_->parked_pages);
    DHISPARSE_EXPECTS(need <= free, "shared host store exhausted: request needs " + std::to_string(need) +
                                      " more pages, " + std::to_string(free) + " free");
  }

  /// Takes the pages `e` lacks to cover [0, capacity) (`make_room` made them free).
  void extend(entry& e, std::int64_t capacity)
  {
    std::int64_t const want = want_pages(capacity);
    while (e.count < want) {
      std::int32_t const p = free_[--header_->free_count];
      next_[p]             = -1;
      if (e.tail >= 0) {
        next_[e.tail] = p;
      } else {
        e.head = p;
      }
      e.tail = p;
      ++e.count;
    }
  }

  /// Frees parked lists no token waits on, oldest first, until `need` pages are free; then
  /// waits for this process's tokens of the oldest lists that wait on them. Throws (nothing
  /// taken) when the pages it would need wait on another process's release.
  void make_room(std::int64_t need)
  {
    if (header_->free_count >= need) { return; }
    std::vector<entry*> ready;  // one pass over the table, then oldest first
    for (std::int32_t i = 0; i < header_->max_ids; ++i) {
      if (entries_[i].state == entry_parked && entries_[i].pending == 0) { ready.push_back(entries_ + i); }
    }
    std::sort(ready.begin(), ready.end(), [](entry const* a, entry const* b) { return a->parked_at < b->parked_at; });
    for (entry* e : ready) {
      if (header_->free_count >= need) { break; }
      unpark(*e);
    }
    while (header_->free_count < need) {
      entry* const e = oldest_parked([&](entry const& x) { return mine(x) != tokens_.end(); });
      if (e == nullptr) { break; }  // only other processes' releases left: they settle them
      auto const t = mine(*e);
      t->done(true);
      settle(*t);
      tokens_.erase(t);
      if (e->pending == 0) { unpark(*e); }
    }
    DHISPARSE_EXPECTS(header_->free_count >= need,
                      "shared host store exhausted: " + std::to_string(header_->parked_pages) +
                        " pages are parked until another process's release of them passes (that process settles "
                        "them the next time it calls the store)");
  }

  template <class Pred>
  entry* oldest_parked(Pred pred) const
  {
    entry* oldest = nullptr;
    for (std::int32_t i = 0; i < header_->max_ids; ++i) {
      entry* e = entries_ + i;
      if (e->state == entry_parked && pred(*e) && (oldest == nullptr || e->parked_at < oldest->parked_at)) {
        oldest = e;
      }
    }
    return oldest;
  }

  std::deque<local_token>::iterator mine(entry const& e)
  {
    return std::find_if(tokens_.begin(), tokens_.end(),
                        [&](local_token const& t) { return t.generation == e.generation; });
  }

  /// Returns a parked list's pages to the free stack (its first page on top).
  void unpark(entry& e)
  {
    std::vector<std::int32_t> const pages = chain(e);
    for (auto p = pages.rbegin(); p != pages.rend(); ++p) { free_[header_->free_count++] = *p; }
    header_->parked_pages -= e.count;
    e = entry{};
  }

  /// Settles this process's tokens that passed; frees the parked lists left without any.
  void settle_passed()
  {
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      if (it->done(false)) {
        settle(*it);
        it = tokens_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void settle(local_token const& t)
  {
    entry& e = entries_[t.index];
    if (e.state != entry_empty && e.generation == t.generation && e.pending > 0) { --e.pending; }
  }

  std::unique_ptr<std::max_align_t[]> owned_;
  header* header_       = nullptr;
  std::int32_t* free_   = nullptr;
  std::int32_t* next_   = nullptr;
  entry* entries_       = nullptr;
  std::deque<local_token> tokens_;
};

}  // namespace dhisparse::detail
