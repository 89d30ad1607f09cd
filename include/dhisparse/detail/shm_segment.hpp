/**
 * @file detail/shm_segment.hpp
 * @brief A named POSIX shared-memory segment (`/dev/shm/dhisparse.<name>`) that holds a
 *        host store shared by processes (`shared_host_store::create` / `open`): a header
 *        (shape, readiness, the writer's registration and hand-off counters), then the
 *        page lists' state, then the pages. Plain C++ (Linux).
 *
 * The creator makes the segment exclusively (an existing name is an error), sizes it,
 * lets the caller initialise the contents and then marks it ready; it unlinks the name
 * when destroyed (mappings of other processes stay valid until they unmap). `open` waits
 * (up to a timeout) for the name to exist and to be ready, then checks the shape.
 */
#pragma once

#include <dhisparse/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

namespace dhisparse::detail {

/// What a process that opens a segment must agree on with its creator.
struct shm_shape {
  std::uint64_t capacity_pages = 0;
  std::uint64_t page_bytes     = 0;
  std::uint64_t row_bytes      = 0;
  std::uint64_t layout_hash    = 0;  ///< group layers and placements (`shm_layout_hash`)
  std::int32_t tokens_per_page = 0;
  std::int32_t max_context     = 0;
  std::int32_t max_ids         = 0;
  std::int32_t reserved        = 0;

  [[nodiscard]] bool operator==(shm_shape const& o) const noexcept
  {
    return capacity_pages == o.capacity_pages && page_bytes == o.page_bytes && row_bytes == o.row_bytes &&
           layout_hash == o.layout_hash && tokens_per_page == o.tokens_per_page && max_context == o.max_context &&
           max_ids == o.max_ids;
  }
  [[nodiscard]] std::string describe() const
  {
    return std::to_string(capacity_pages) + " pages of " + std::to_string(page_bytes) + " B, rows of " +
           std::to_string(row_bytes) + " B, " + std::to_string(tokens_per_page) + " tokens per page, max_context " +
           std::to_string(max_context) + ", " + std::to_string(max_ids) + " ids, layout " + std::to_string(layout_hash);
  }
};

/// FNV-1a over 64-bit words (the group layout of a store).
class shm_layout_hash {
 public:
  shm_layout_hash& add(std::uint64_t v) noexcept
  {
    for (int i = 0; i < 8; ++i) {
      value_ ^= (v >> (8 * i)) & 0xFFu;
      value_ *= 0x100000001b3ull;
    }
    return *this;
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return value_; }

 private:
  std::uint64_t value_ = 0xcbf29ce484222325ull;
};

/// Where the parts of a segment lie (bytes from its start).
struct shm_layout {
  shm_shape shape;
  std::uint64_t lists_offset  = 0;  ///< the page lists' state
  std::uint64_t lists_bytes   = 0;
  std::uint64_t pages_offset  = 0;  ///< page 0 (4096-aligned)
  std::uint64_t segment_bytes = 0;
};

/// The first bytes of a segment. Atomics of 32 and 64 bits are lock-free and address-free,
/// so processes mapping the segment at different addresses share them.
struct shm_header {
  static constexpr std::uint64_t magic_value = 0x64687368'73746f72ull;  // "dhshstor"
  static constexpr std::uint32_t version     = 1;
  static constexpr std::size_t bytes         = 4096;  ///< reserved for the header
  static constexpr std::size_t handle_bytes  = 64;    ///< an IPC event handle (cudaIpcEventHandle_t)

  std::uint64_t magic;
  std::uint32_t layout_version;
  std::atomic<std::uint32_t> ready;  ///< 1 once the creator initialised everything
  shm_layout layout;
  std::int32_t creator_pid;
  /// The writer hierarchy's process (0: none registered).
  std::atomic<std::int32_t> writer_pid;
  /// Backups the writer completed on the host (each after recording its event).
  std::atomic<std::uint64_t> writer_backups;
  /// Bumped after each (re)publication of the writer's event handle below.
  std::atomic<std::uint64_t> event_generation;
  alignas(8) unsigned char writer_event[handle_bytes];
};
static_assert(sizeof(shm_header) <= shm_header::bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::int32_t>::is_always_lock_free &&
              std::atomic<std::uint64_t>::is_always_lock_free);

/// A mapped segment: the creator's (unlinks the name when destroyed) or an opener's.
class shm_segment {
 public:
  /// `/dhisparse.<name>`; names are letters, digits, '_', '-' and '.'.
  static std::string path_of(std::string const& name)
  {
    DHISPARSE_EXPECTS(!name.empty() && name.size() <= 200, "shared_host_store: name must have 1 to 200 characters");
    for (char c : name) {
      bool const ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || c == '.';
      DHISPARSE_EXPECTS(ok, "shared_host_store: name '" + name + "' may hold only letters, digits, '_', '-', '.'");
    }
    return "/dhisparse." + name;
  }

  /// Offsets of a segment for page lists of `lists_bytes` and `pages_bytes` of pages.
  static shm_layout layout(shm_shape const& shape, std::size_t lists_bytes, std::size_t pages_bytes)
  {
    shm_layout h{};
    h.shape         = shape;
    h.lists_offset  = shm_header::bytes;
    h.lists_bytes   = lists_bytes;
    h.pages_offset  = round_up(h.lists_offset + lists_bytes, 4096);
    h.segment_bytes = round_up(h.pages_offset + pages_bytes, 4096);
    return h;
  }

  shm_segment() = default;

  /**
   * @brief Creates `name` exclusively, sized and laid out as `layout` says (zero-filled);
   *        the caller initialises the contents, then calls `publish`.
   * @throws dhisparse::error when the name exists or the system refuses
   */
  static shm_segment create(std::string const& name, shm_layout const& layout)
  {
    shm_segment s;
    s.path_ = path_of(name);
    int const fd = ::shm_open(s.path_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    DHISPARSE_EXPECTS(fd >= 0, "shared_host_store::create: shm_open(" + s.path_ + ") failed: " +
                                 std::strerror(errno) + (errno == EEXIST ? " (the name is in use)" : ""));
    s.owner_ = true;
    if (::ftruncate(fd, off_t(layout.segment_bytes)) != 0) {
      int const err = errno;
      ::close(fd);
      ::shm_unlink(s.path_.c_str());
      throw error("shared_host_store::create: ftruncate to " + std::to_string(layout.segment_bytes) +
                  " bytes failed: " + std::strerror(err));
    }
    s.map(fd, layout.segment_bytes);
    shm_header* h   = s.header();
    h->magic          = shm_header::magic_value;
    h->layout_version = shm_header::version;
    h->layout         = layout;
    h->creator_pid    = std::int32_t(::getpid());
    return s;
  }

  /// Removes the name `name` (a store left behind by a process that died); true when it
  /// existed. Processes that mapped it keep their mappings.
  static bool remove(std::string const& name) { return ::shm_unlink(path_of(name).c_str()) == 0; }

  /// The creator: everything is initialised; openers may proceed.
  void publish() noexcept { header()->ready.store(1, std::memory_order_release); }

  /**
   * @brief Maps `name` once it exists and is ready, and checks that its shape is `shape`.
   * @throws dhisparse::error after `timeout`, or for another shape or a foreign segment
   */
  static shm_segment open(std::string const& name, shm_shape const& shape, std::chrono::milliseconds timeout)
  {
    shm_segment s;
    s.path_         = path_of(name);
    auto const end  = std::chrono::steady_clock::now() + timeout;
    auto const late = [&] { return std::chrono::steady_clock::now() >= end; };
    int fd          = -1;
    while ((fd = ::shm_open(s.path_.c_str(), O_RDWR, 0)) < 0) {
      DHISPARSE_EXPECTS(errno == ENOENT, "shared_host_store::open: shm_open(" + s.path_ + ") failed: " +
                                           std::strerror(errno));
      DHISPARSE_EXPECTS(!late(), "shared_host_store::open: no store named '" + name + "' appeared within " +
                                   std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    struct stat st {};
    // The creator sizes the segment right after creating it: wait for the header at least.
    while (::fstat(fd, &st) == 0 && std::size_t(st.st_size) < shm_header::bytes && !late()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (std::size_t(st.st_size) < shm_header::bytes) {
      ::close(fd);
      throw error("shared_host_store::open: '" + name + "' is not a store (" + std::to_string(st.st_size) + " bytes)");
    }
    s.map(fd, std::size_t(st.st_size));
    shm_header const* h = s.header();
    while (h->ready.load(std::memory_order_acquire) == 0) {
      DHISPARSE_EXPECTS(!late(), "shared_host_store::open: the store named '" + name + "' was not ready within " +
                                   std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    DHISPARSE_EXPECTS(h->magic == shm_header::magic_value && h->layout_version == shm_header::version &&
                        h->layout.segment_bytes == s.bytes_,
                      "shared_host_store::open: '" + name + "' is not a store of this version of dhisparse");
    DHISPARSE_EXPECTS(h->layout.shape == shape, "shared_host_store::open: '" + name + "' holds " +
                                                  h->layout.shape.describe() +
                                           "; this process expects " + shape.describe());
    return s;
  }

  shm_segment(shm_segment&& o) noexcept { swap(o); }
  shm_segment& operator=(shm_segment&& o) noexcept
  {
    swap(o);
    return *this;
  }
  shm_segment(shm_segment const&)            = delete;
  shm_segment& operator=(shm_segment const&) = delete;
  ~shm_segment()
  {
    if (base_ != nullptr) { ::munmap(base_, bytes_); }
    if (owner_) { ::shm_unlink(path_.c_str()); }
  }

  [[nodiscard]] shm_header* header() const noexcept { return static_cast<shm_header*>(base_); }
  [[nodiscard]] shm_layout const& layout() const noexcept { return header()->layout; }
  [[nodiscard]] std::byte* at(std::uint64_t offset) const noexcept { return static_cast<std::byte*>(base_) + offset; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] bool owner() const noexcept { return owner_; }
  [[nodiscard]] std::string const& path() const noexcept { return path_; }

 private:
  static std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

  void map(int fd, std::size_t bytes)
  {
    void* p       = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int const err = errno;
    ::close(fd);
    DHISPARSE_EXPECTS(p != MAP_FAILED, "shared_host_store: mmap of " + path_ + " (" + std::to_string(bytes) +
                                         " bytes) failed: " + std::strerror(err));
    base_  = p;
    bytes_ = bytes;
  }
  void swap(shm_segment& o) noexcept
  {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(owner_, o.owner_);
    std::swap(path_, o.path_);
  }

  void* base_        = nullptr;
  std::size_t bytes_ = 0;
  bool owner_        = false;
  std::string path_;
};

}  // namespace dhisparse::detail
