/**
 * @file trace.hpp
 * @brief Selection traces: a versioned, little-endian binary file of the top-K selections
 *        an engine made, step by step, with a writer and a validating reader (plain C++).
 *
 * A trace records, per step, per layer group and per request, the selected positions of
 * every query (optionally their scores, and the accepted counts of verify steps), so that
 * the selections of a real model can be replayed through every policy and budget
 * (`dhisparse-sim`, `bench/residency`). The byte layout is specified in docs/trace.md;
 * `trace_recorder.cuh` records from the GPU without stalling the step.
 *
 * The reader checks everything before it hands anything out: the header (magic, version,
 * shapes, the declared sizes against the file's) and the FNV-1a 64 checksum of the whole
 * payload when it opens the file, and every record in full (shapes, counts, position
 * ranges and order) before `next` returns it. Failures throw `dhisparse::error` with a
 * message that names the file, the step, group, request, query and entry concerned.
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dhisparse::trace {

/// Version of the format this header writes and reads.
inline constexpr std::uint32_t format_version = 1;
/// Bytes of the file header.
inline constexpr std::size_t header_bytes = 64;
/// The first eight bytes of every trace file.
inline constexpr char file_magic[8] = {'D', 'H', 'S', 'T', 'R', 'A', 'C', 'E'};
/// Tag that opens every step record ("STEP" in file order).
inline constexpr std::uint32_t step_tag = 0x50455453u;
/// Bytes of a step record's head: tag, request count, step index.
inline constexpr std::size_t step_head_bytes = 16;
/// Bytes of one request entry of a step record.
inline constexpr std::size_t request_entry_bytes = 24;
/// `payload_bytes` of a file whose writer was never closed.
inline constexpr std::uint64_t unfinished_payload = ~std::uint64_t{0};

/// FNV-1a 64 offset basis (the initial `state` of `fnv1a64`).
inline constexpr std::uint64_t fnv1a64_basis = 0xCBF29CE484222325ull;

/**
 * @brief FNV-1a 64 of `bytes` bytes, continuing from `state` (the trace checksum).
 * @param data bytes to hash
 * @param bytes how many
 * @param state the hash so far (`fnv1a64_basis` to start)
 */
inline std::uint64_t fnv1a64(void const* data, std::size_t bytes, std::uint64_t state = fnv1a64_basis)
{
  auto const* p = static_cast<unsigned char const*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    state ^= p[i];
    state *= 0x100000001B3ull;
  }
  return state;
}

/**
 * @brief The shapes of a trace, fixed for the whole file (its header).
 */
struct shape {
  std::int32_t groups       = 1;     ///< layer groups (each has its own selections)
  std::int32_t max_requests = 1;     ///< requests per step at most (the engine's max_batch)
  std::int32_t max_queries  = 1;     ///< queries per request and step at most (1 + drafts)
  std::int32_t top_k        = 2048;  ///< K: entries per query
  bool scores               = false; ///< records carry a float score per entry
  bool accepted             = false; ///< records carry accepted counts (verify steps)

  /// Throws `dhisparse::error` naming the first invalid field.
  void validate() const
  {
    DHISPARSE_EXPECTS(groups > 0, "trace::shape.groups must be positive");
    DHISPARSE_EXPECTS(max_requests > 0, "trace::shape.max_requests must be positive");
    DHISPARSE_EXPECTS(max_queries > 0, "trace::shape.max_queries must be positive");
    DHISPARSE_EXPECTS(top_k > 0, "trace::shape.top_k must be positive");
    // What a hierarchy can replay; it also bounds the padding of a record (every query row
    // of a step_record holds max_queries × top_k entries per request, stored or not).
    DHISPARSE_EXPECTS(std::int64_t(max_queries) * top_k <= max_request_selections,
                      "trace::shape: max_queries × top_k (" + std::to_string(std::int64_t(max_queries) * top_k) +
                        ") must be at most " + std::to_string(max_request_selections));
  }
  /// Entries of one group's part of a step of `requests` requests: requests × max_queries × top_k.
  [[nodiscard]] std::size_t group_entries(int requests) const
  {
    return std::size_t(requests) * std::size_t(max_queries) * std::size_t(top_k);
  }
  friend bool operator==(shape const& a, shape const& b)
  {
    return a.groups == b.groups && a.max_requests == b.max_requests && a.max_queries == b.max_queries &&
           a.top_k == b.top_k && a.scores == b.scores && a.accepted == b.accepted;
  }
  friend bool operator!=(shape const& a, shape const& b) { return !(a == b); }
};

/// One request of one step.
struct request_record {
  request_id id{};            ///< the engine's request id (distinct within a step)
  std::int32_t length   = 0;  ///< committed tokens before the step: query q may select
                              ///< positions 0 .. length + q (its position limit)
  std::int32_t queries  = 1;  ///< queries of this request in this step, 1 .. max_queries
  std::int32_t accepted = -1; ///< tail tokens kept by the verify step, 0 .. queries;
                              ///< -1 when the trace carries no accepted counts
};

/**
 * @brief A step as the writer takes it (non-owning).
 *
 * `positions` and `scores` are laid out [groups][count][max_queries][top_k]: one group's
 * part is exactly what `resolve` takes for a batch of `count`. Rows of queries beyond a
 * request's `queries` are ignored (not stored). Each stored row holds that query's
 * selection as resolve takes it: positions in [0, length + q] in any order, repeats
 * allowed, -1 for "none" anywhere.
 */
struct step_view {
  request_record const* requests = nullptr;  ///< [count]
  std::int32_t count             = 0;        ///< requests in this step, 0 .. max_requests
  std::int32_t const* positions  = nullptr;  ///< [groups][count][max_queries][top_k]
  float const* scores            = nullptr;  ///< same layout; required iff shape.scores
};

/**
 * @brief A step as the reader returns it (owning), in the layout of `step_view`; rows
 *        of absent queries are -1 (scores 0).
 */
struct step_record {
  std::uint64_t step = 0;  ///< index of the step in the trace, from 0
  std::vector<request_record> requests;
  std::vector<std::int32_t> positions;  ///< [groups][requests][max_queries][top_k]
  std::vector<float> scores;            ///< same, or empty

  /// The non-owning view of this record.
  [[nodiscard]] step_view view() const
  {
    return {requests.data(), std::int32_t(requests.size()), positions.data(),
            scores.empty() ? nullptr : scores.data()};
  }
};

namespace detail {

inline bool host_is_little_endian()
{
  std::uint16_t const probe = 1;
  unsigned char first       = 0;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

/// Appends `value` little-endian.
template <class T>
void put_le(std::vector<unsigned char>& out, T value)
{
  static_assert(std::is_integral_v<T>, "put_le: integers only");
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<unsigned char>(std::uint64_t(value) >> (8 * i)));
  }
}

/// Reads a little-endian `T` at `in`.
template <class T>
T get_le(unsigned char const* in)
{
  static_assert(std::is_integral_v<T>, "get_le: integers only");
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) { v |= std::uint64_t(in[i]) << (8 * i); }
  return static_cast<T>(v);
}

/// Appends `n` 4-byte values (int32 or float) little-endian.
template <class T>
void put_array(std::vector<unsigned char>& out, T const* values, std::size_t n)
{
  static_assert(sizeof(T) == 4, "put_array: 4-byte values");
  std::size_t const at = out.size();
  out.resize(at + 4 * n);
  std::memcpy(out.data() + at, values, 4 * n);
  if (!host_is_little_endian()) {
    for (std::size_t i = 0; i < n; ++i) { std::reverse(out.begin() + at + 4 * i, out.begin() + at + 4 * i + 4); }
  }
}

/// Reads `n` 4-byte values (int32 or float) little-endian.
template <class T>
void get_array(unsigned char const* in, T* values, std::size_t n)
{
  static_assert(sizeof(T) == 4, "get_array: 4-byte values");
  if (host_is_little_endian()) {
    std::memcpy(values, in, 4 * n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char b[4] = {in[4 * i + 3], in[4 * i + 2], in[4 * i + 1], in[4 * i]};
    std::memcpy(values + i, b, 4);
  }
}

/// Encodes the 64-byte header (docs/trace.md).
inline std::vector<unsigned char> encode_header(shape const& s, std::uint64_t steps, std::uint64_t payload,
                                                std::uint64_t checksum)
{
  std::vector<unsigned char> h(file_magic, file_magic + sizeof(file_magic));
  put_le<std::uint32_t>(h, format_version);
  put_le<std::uint32_t>(h, std::uint32_t(header_bytes));
  put_le<std::uint32_t>(h, std::uint32_t(s.groups));
  put_le<std::uint32_t>(h, std::uint32_t(s.max_requests));
  put_le<std::uint32_t>(h, std::uint32_t(s.max_queries));
  put_le<std::uint32_t>(h, std::uint32_t(s.top_k));
  put_le<std::uint32_t>(h, (s.scores ? 1u : 0u) | (s.accepted ? 2u : 0u));
  put_le<std::uint32_t>(h, 0);  // reserved
  put_le<std::uint64_t>(h, steps);
  put_le<std::uint64_t>(h, payload);
  put_le<std::uint64_t>(h, checksum);
  return h;
}

/// "trace 'path': step S" — the prefix of record-level messages.
inline std::string step_context(std::string const& where, std::uint64_t step)
{
  return where + ": step " + std::to_string(step);
}

/**
 * @brief Checks a step's requests against the shape: counts, queries, lengths, accepted
 *        counts, distinct ids. Throws `dhisparse::error` prefixed with `where`.
 */
inline void check_requests(shape const& s, request_record const* requests, std::int64_t count,
                           std::uint64_t step, std::string const& where)
{
  std::string const at = step_context(where, step);
  DHISPARSE_EXPECTS(count >= 0 && count <= s.max_requests,
                    at + ": " + std::to_string(count) + " requests, not in [0, max_requests = " +
                      std::to_string(s.max_requests) + "]");
  std::unordered_set<std::uint64_t> ids;
  for (std::int64_t r = 0; r < count; ++r) {
    request_record const& q     = requests[r];
    std::uint64_t const id      = static_cast<std::uint64_t>(q.id);
    std::string const rq        = at + ", request " + std::to_string(r) + " (id " + std::to_string(id) + ")";
    DHISPARSE_EXPECTS(ids.insert(id).second, rq + ": request id appears twice in the step");
    DHISPARSE_EXPECTS(q.queries >= 1 && q.queries <= s.max_queries,
                      rq + ": " + std::to_string(q.queries) + " queries, not in [1, max_queries = " +
                        std::to_string(s.max_queries) + "]");
    DHISPARSE_EXPECTS(q.length >= 0 && std::int64_t(q.length) + q.queries - 1 <= std::numeric_limits<std::int32_t>::max(),
                      rq + ": length " + std::to_string(q.length) + " is negative or too large");
    if (s.accepted) {
      DHISPARSE_EXPECTS(q.accepted >= 0 && q.accepted <= q.queries,
                        rq + ": accepted count " + std::to_string(q.accepted) + " is not in [0, queries = " +
                          std::to_string(q.queries) + "]");
    } else {
      DHISPARSE_EXPECTS(q.accepted == -1, rq + ": accepted count " + std::to_string(q.accepted) +
                                            " in a trace without accepted counts (must be -1)");
    }
  }
}

/**
 * @brief Checks the stored rows of a step: every entry -1 or in [0, length + q]. Throws
 *        `dhisparse::error` naming the group, request, query and entry.
 */
inline void check_positions(shape const& s, step_view const& v, std::uint64_t step, std::string const& where)
{
  std::size_t const k = std::size_t(s.top_k);
  for (int g = 0; g < s.groups; ++g) {
    for (int r = 0; r < v.count; ++r) {
      request_record const& rq = v.requests[r];
      for (int q = 0; q < rq.queries; ++q) {
        std::int32_t const* row =
          v.positions + ((std::size_t(g) * v.count + r) * std::size_t(s.max_queries) + q) * k;
        std::int64_t const limit = std::int64_t(rq.length) + q;
        for (std::size_t e = 0; e < k; ++e) {
          std::int32_t const p = row[e];
          if (p == -1) { continue; }
          auto const here = [&] {
            return step_context(where, step) + ", group " + std::to_string(g) + ", request " + std::to_string(r) +
                   " (id " + std::to_string(static_cast<std::uint64_t>(rq.id)) + "), query " + std::to_string(q) +
                   ", entry " + std::to_string(e) + ": position " + std::to_string(p);
          };
          DHISPARSE_EXPECTS(p >= 0, here() + " is below -1");
          DHISPARSE_EXPECTS(p <= limit, here() + " is beyond the request's limit " + std::to_string(limit) +
                                          " (length " + std::to_string(rq.length) + " + query " +
                                          std::to_string(q) + ")");
        }
      }
    }
  }
}

/// Validates a whole step (requests, then positions) against `s`.
inline void check_step(shape const& s, step_view const& v, std::uint64_t step, std::string const& where)
{
  check_requests(s, v.requests, v.count, step, where);
  DHISPARSE_EXPECTS(v.count == 0 || v.positions != nullptr, step_context(where, step) + ": positions are null");
  DHISPARSE_EXPECTS(v.count == 0 || s.scores == (v.scores != nullptr),
                    step_context(where, step) +
                      (s.scores ? ": the trace carries scores but the step has none"
                                : ": the step has scores but the trace carries none"));
  check_positions(s, v, step, where);
}

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_handle = std::unique_ptr<std::FILE, file_closer>;

inline std::string io_error(std::string const& what, std::string const& path)
{
  return what + " '" + path + "': " + std::strerror(errno);
}

}  // namespace detail

/**
 * @brief Writes a trace file step by step; validates each step in full before writing
 *        any of it, so a rejected step leaves the file as it was.
 *
 * The header is written first with an "unfinished" mark and completed by `close` (step
 * count, payload size, checksum); a file whose writer never closed is rejected by the
 * reader. Move-only.
 */
class writer {
 public:
  /**
   * @brief Creates (truncates) `path` and writes the provisional header.
   * @param path the trace file
   * @param s the trace's shapes (validated)
   */
  writer(std::string path, trace::shape const& s) : path_{std::move(path)}, shape_{s}
  {
    shape_.validate();
    file_.reset(std::fopen(path_.c_str(), "wb"));
    DHISPARSE_EXPECTS(file_ != nullptr, detail::io_error("trace writer: cannot create", path_));
    auto const h = detail::encode_header(shape_, 0, unfinished_payload, 0);
    put(h.data(), h.size());
  }
  writer(writer&&) noexcept            = default;
  writer& operator=(writer&& o) noexcept
  {
    if (this != &o) {
      close_quietly();
      path_     = std::move(o.path_);
      shape_    = o.shape_;
      file_     = std::move(o.file_);
      steps_    = o.steps_;
      payload_  = o.payload_;
      checksum_ = o.checksum_;
    }
    return *this;
  }
  writer(writer const&)            = delete;
  writer& operator=(writer const&) = delete;
  /// Closes the file if `close` was not called; never throws (errors are lost: call `close`).
  ~writer() { close_quietly(); }

  /**
   * @brief Appends one step (validated first: on error nothing is written).
   * @param v the step, in the layout of `step_view`
   */
  void write(step_view const& v)
  {
    DHISPARSE_EXPECTS(file_ != nullptr, "trace writer '" + path_ + "': write after close");
    std::string const where = "trace writer '" + path_ + "'";
    detail::check_step(shape_, v, steps_, where);
    buffer_.clear();
    detail::put_le<std::uint32_t>(buffer_, step_tag);
    detail::put_le<std::uint32_t>(buffer_, std::uint32_t(v.count));
    detail::put_le<std::uint64_t>(buffer_, steps_);
    for (int r = 0; r < v.count; ++r) {
      request_record const& q = v.requests[r];
      detail::put_le<std::uint64_t>(buffer_, static_cast<std::uint64_t>(q.id));
      detail::put_le<std::int32_t>(buffer_, q.length);
      detail::put_le<std::int32_t>(buffer_, q.queries);
      detail::put_le<std::int32_t>(buffer_, q.accepted);
      detail::put_le<std::uint32_t>(buffer_, 0);  // reserved
    }
    std::size_t const k = std::size_t(shape_.top_k);
    for (int g = 0; g < shape_.groups; ++g) {
      for (int r = 0; r < v.count; ++r) {
        std::size_t const row = (std::size_t(g) * v.count + r) * std::size_t(shape_.max_queries) * k;
        std::size_t const n   = std::size_t(v.requests[r].queries) * k;
        detail::put_array(buffer_, v.positions + row, n);
        if (shape_.scores) { detail::put_array(buffer_, v.scores + row, n); }
      }
    }
    put(buffer_.data(), buffer_.size());
    checksum_ = fnv1a64(buffer_.data(), buffer_.size(), checksum_);
    payload_ += buffer_.size();
    ++steps_;
  }

  /// @brief Completes the header (steps, payload size, checksum) and closes the file.
  ///        Idempotent.
  void close()
  {
    if (file_ == nullptr) { return; }
    auto const h = detail::encode_header(shape_, steps_, payload_, checksum_);
    bool ok      = std::fseek(file_.get(), 0, SEEK_SET) == 0;
    ok           = ok && std::fwrite(h.data(), 1, h.size(), file_.get()) == h.size();
    ok           = ok && std::fflush(file_.get()) == 0;
    int const closed = std::fclose(file_.release());
    DHISPARSE_EXPECTS(ok && closed == 0, detail::io_error("trace writer: cannot complete", path_));
  }

  /// @brief Steps written so far.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// @brief The trace's shapes.
  [[nodiscard]] trace::shape const& shape() const noexcept { return shape_; }
  /// @brief The file's path.
  [[nodiscard]] std::string const& path() const noexcept { return path_; }

 private:
  void put(void const* data, std::size_t bytes)
  {
    DHISPARSE_EXPECTS(std::fwrite(data, 1, bytes, file_.get()) == bytes,
                      detail::io_error("trace writer: cannot write", path_));
  }
  void close_quietly() noexcept
  {
    try {
      close();
    } catch (...) {  // a destructor never throws; `close` reports errors
    }
  }

  std::string path_;
  trace::shape shape_;
  detail::file_handle file_;
  std::uint64_t steps_    = 0;
  std::uint64_t payload_  = 0;
  std::uint64_t checksum_ = fnv1a64_basis;
  std::vector<unsigned char> buffer_;
};

/**
 * @brief Reads a trace file, validating everything before handing it out.
 *
 * Opening checks the header (magic, version, header size, shapes, flags, reserved bits),
 * that the file holds exactly the declared payload (a shorter file is truncated, a
 * longer one has trailing bytes, an unfinished one was never closed), the payload's
 * checksum, and, if given, that the shapes equal the expected ones. `next` then decodes
 * and validates one record in full before it touches its output argument.
 */
class reader {
 public:
  /**
   * @brief Opens `path` and validates its header, size and checksum (reads the file once).
   * @param path the trace file
   */
  explicit reader(std::string path) : path_{std::move(path)}
  {
    file_.reset(std::fopen(path_.c_str(), "rb"));
    DHISPARSE_EXPECTS(file_ != nullptr, detail::io_error("trace reader: cannot open", path_));
    std::string const where = "trace '" + path_ + "'";
    DHISPARSE_EXPECTS(std::fseek(file_.get(), 0, SEEK_END) == 0, detail::io_error("trace reader: cannot seek", path_));
    long const size = std::ftell(file_.get());
    DHISPARSE_EXPECTS(size >= 0, detail::io_error("trace reader: cannot size", path_));
    std::rewind(file_.get());
    std::uint64_t const file_bytes = std::uint64_t(size);
    DHISPARSE_EXPECTS(file_bytes >= header_bytes, where + ": truncated: " + std::to_string(file_bytes) +
                                                    " bytes, less than the " + std::to_string(header_bytes) +
                                                    "-byte header");
    unsigned char h[header_bytes];
    read_exact(h, header_bytes, where);
    DHISPARSE_EXPECTS(std::memcmp(h, file_magic, sizeof(file_magic)) == 0,
                      where + ": not a dhisparse trace (wrong magic; expected \"DHSTRACE\")");
    std::uint32_t const version = detail::get_le<std::uint32_t>(h + 8);
    DHISPARSE_EXPECTS(version == format_version, where + ": unsupported trace version " + std::to_string(version) +
                                                   " (this reader reads version " +
                                                   std::to_string(format_version) + ")");
    std::uint32_t const hbytes = detail::get_le<std::uint32_t>(h + 12);
    DHISPARSE_EXPECTS(hbytes == header_bytes, where + ": header size " + std::to_string(hbytes) + ", expected " +
                                                std::to_string(header_bytes));
    auto const field = [&](int offset, char const* name) {
      std::uint32_t const v = detail::get_le<std::uint32_t>(h + offset);
      DHISPARSE_EXPECTS(v >= 1 && v <= std::uint32_t(std::numeric_limits<std::int32_t>::max()),
                        where + ": header field " + name + " = " + std::to_string(v) + " is out of range");
      return std::int32_t(v);
    };
    shape_.groups       = field(16, "groups");
    shape_.max_requests = field(20, "max_requests");
    shape_.max_queries  = field(24, "max_queries");
    shape_.top_k        = field(28, "top_k");
    std::uint32_t const flags = detail::get_le<std::uint32_t>(h + 32);
    DHISPARSE_EXPECTS((flags & ~3u) == 0 && detail::get_le<std::uint32_t>(h + 36) == 0,
                      where + ": unknown header flags " + std::to_string(flags) + " or reserved bits set");
    shape_.scores   = (flags & 1u) != 0;
    shape_.accepted = (flags & 2u) != 0;
    DHISPARSE_EXPECTS(std::int64_t(shape_.max_queries) * shape_.top_k <= max_request_selections,
                      where + ": header fields max_queries × top_k = " +
                        std::to_string(std::int64_t(shape_.max_queries) * shape_.top_k) + " exceed " +
                        std::to_string(max_request_selections));
    steps_          = detail::get_le<std::uint64_t>(h + 40);
    payload_        = detail::get_le<std::uint64_t>(h + 48);
    std::uint64_t const checksum = detail::get_le<std::uint64_t>(h + 56);
    DHISPARSE_EXPECTS(payload_ != unfinished_payload,
                      where + ": unfinished: the writer was never closed (no step count or checksum)");
    DHISPARSE_EXPECTS(steps_ > 0 || payload_ == 0,
                      where + ": the header declares no steps but " + std::to_string(payload_) + " payload bytes");
    std::uint64_t const body = file_bytes - header_bytes;
    DHISPARSE_EXPECTS(body >= payload_, where + ": truncated: the header declares " + std::to_string(payload_) +
                                          " payload bytes, the file holds " + std::to_string(body));
    DHISPARSE_EXPECTS(body == payload_, where + ": " + std::to_string(body - payload_) +
                                          " trailing bytes after the declared payload of " +
                                          std::to_string(payload_) + " bytes");
    std::uint64_t sum = fnv1a64_basis;
    std::vector<unsigned char> chunk(std::size_t{1} << 20);
    for (std::uint64_t left = payload_; left > 0;) {
      std::size_t const n = std::size_t(std::min<std::uint64_t>(left, chunk.size()));
      read_exact(chunk.data(), n, where);
      sum = fnv1a64(chunk.data(), n, sum);
      left -= n;
    }
    DHISPARSE_EXPECTS(sum == checksum, where + ": checksum mismatch (payload FNV-1a 64 " + hex(sum) +
                                         ", header " + hex(checksum) + "): the file is corrupt");
    rewind();
  }

  /**
   * @brief Opens `path` as above and also requires its shapes to equal `expected`.
   * @param path the trace file
   * @param expected the shapes the caller can replay
   */
  reader(std::string path, trace::shape const& expected) : reader(std::move(path))
  {
    auto const mismatch = [&](char const* name, long long have, long long want) {
      DHISPARSE_EXPECTS(have == want, "trace '" + path_ + "': shape mismatch: " + name + " is " +
                                        std::to_string(have) + ", expected " + std::to_string(want));
    };
    mismatch("groups", shape_.groups, expected.groups);
    mismatch("max_requests", shape_.max_requests, expected.max_requests);
    mismatch("max_queries", shape_.max_queries, expected.max_queries);
    mismatch("top_k", shape_.top_k, expected.top_k);
    mismatch("scores", shape_.scores, expected.scores);
    mismatch("accepted", shape_.accepted, expected.accepted);
  }

  /// @brief The trace's shapes.
  [[nodiscard]] trace::shape const& shape() const noexcept { return shape_; }
  /// @brief Steps the trace declares.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// @brief Steps returned since opening or the last `rewind`.
  [[nodiscard]] std::uint64_t position() const noexcept { return next_step_; }

  /// @brief Goes back to the first step.
  void rewind()
  {
    DHISPARSE_EXPECTS(std::fseek(file_.get(), long(header_bytes), SEEK_SET) == 0,
                      detail::io_error("trace reader: cannot seek", path_));
    next_step_ = 0;
    offset_    = 0;
    failed_    = false;
  }

  /**
   * @brief Reads the next step into `out` after validating it in full.
   * @param out the record; left unchanged when this returns false or throws
   * @return false after the last step
   */
  bool next(step_record& out)
  {
    if (next_step_ == steps_) { return false; }
    std::string const where = "trace '" + path_ + "'";
    std::string const at    = detail::step_context(where, next_step_);
    DHISPARSE_EXPECTS(!failed_, at + ": an earlier record was invalid; rewind() to read again");
    failed_ = true;  // until this record is complete
    unsigned char head[step_head_bytes];
    consume(head, step_head_bytes, at);
    std::uint32_t const tag   = detail::get_le<std::uint32_t>(head);
    std::uint32_t const count = detail::get_le<std::uint32_t>(head + 4);
    std::uint64_t const index = detail::get_le<std::uint64_t>(head + 8);
    DHISPARSE_EXPECTS(tag == step_tag, at + ": record does not start with the STEP tag");
    DHISPARSE_EXPECTS(index == next_step_, at + ": record carries step index " + std::to_string(index));
    DHISPARSE_EXPECTS(count <= std::uint32_t(shape_.max_requests),
                      at + ": " + std::to_string(count) + " requests, not in [0, max_requests = " +
                        std::to_string(shape_.max_requests) + "]");
    // Nothing is allocated before the payload is known to hold it: the request table and
    // the stored rows are checked against the bytes left first. The padded arrays are then
    // at most max_queries (≤ max_request_selections) times the stored rows.
    std::size_t const table_bytes = std::size_t(count) * request_entry_bytes;
    require(table_bytes, at);
    step_record rec;
    rec.step = index;
    rec.requests.resize(count);
    std::vector<unsigned char> table(table_bytes);
    consume(table.data(), table.size(), at);
    for (std::uint32_t r = 0; r < count; ++r) {
      unsigned char const* e = table.data() + std::size_t(r) * request_entry_bytes;
      rec.requests[r].id       = request_id{detail::get_le<std::uint64_t>(e)};
      rec.requests[r].length   = detail::get_le<std::int32_t>(e + 8);
      rec.requests[r].queries  = detail::get_le<std::int32_t>(e + 12);
      rec.requests[r].accepted = detail::get_le<std::int32_t>(e + 16);
      DHISPARSE_EXPECTS(detail::get_le<std::uint32_t>(e + 20) == 0,
                        at + ", request " + std::to_string(r) + ": reserved field is not zero");
    }
    detail::check_requests(shape_, rec.requests.data(), count, index, where);
    std::size_t const k = std::size_t(shape_.top_k);
    // stored ≤ count × max_request_selections < 2^47: the products below cannot overflow
    // once groups is bounded by the payload left (by division).
    std::size_t stored = 0;
    for (auto const& q : rec.requests) { stored += std::size_t(q.queries) * k; }
    std::uint64_t const group_bytes = std::uint64_t(stored) * 4 * (shape_.scores ? 2 : 1);
    std::uint64_t const left        = payload_ - offset_;
    DHISPARSE_EXPECTS(group_bytes == 0 || std::uint64_t(shape_.groups) <= left / group_bytes,
                      at + ": record needs " + std::to_string(shape_.groups) + " groups × " +
                        std::to_string(group_bytes) + " bytes, only " + std::to_string(left) +
                        " remain in the payload (inconsistent record)");
    std::size_t const bytes = std::size_t(group_bytes) * std::size_t(shape_.groups);
    std::size_t const total = shape_.group_entries(int(count)) * std::size_t(shape_.groups);
    rec.positions.assign(total, -1);
    if (shape_.scores) { rec.scores.assign(total, 0.0f); }
    std::vector<unsigned char> data(bytes);
    consume(data.data(), bytes, at);
    unsigned char const* in = data.data();
    for (int g = 0; g < shape_.groups; ++g) {
      for (std::uint32_t r = 0; r < count; ++r) {
        std::size_t const row = (std::size_t(g) * count + r) * std::size_t(shape_.max_queries) * k;
        std::size_t const n   = std::size_t(rec.requests[r].queries) * k;
        detail::get_array(in, rec.positions.data() + row, n);
        in += 4 * n;
        if (shape_.scores) {
          detail::get_array(in, rec.scores.data() + row, n);
          in += 4 * n;
        }
      }
    }
    detail::check_positions(shape_, rec.view(), index, where);
    DHISPARSE_EXPECTS(next_step_ + 1 < steps_ || offset_ == payload_,
                      at + ": " + std::to_string(payload_ - offset_) + " bytes follow the last declared step (" +
                        std::to_string(steps_) + " steps)");
    ++next_step_;
    failed_ = false;
    out     = std::move(rec);
    return true;
  }

 private:
  static std::string hex(std::uint64_t v)
  {
    char buf[19];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return buf;
  }
  /// Throws unless the next `bytes` bytes of a record lie within the declared payload.
  void require(std::size_t bytes, std::string const& at) const
  {
    DHISPARSE_EXPECTS(bytes <= payload_ - offset_, at + ": record needs " + std::to_string(bytes) + " bytes, only " +
                                                     std::to_string(payload_ - offset_) +
                                                     " remain in the payload (inconsistent record)");
  }
  /// Reads the next `bytes` bytes of a record, which must lie within the declared payload.
  void consume(void* out, std::size_t bytes, std::string const& at)
  {
    require(bytes, at);
    read_exact(out, bytes, at);
    offset_ += bytes;
  }
  void read_exact(void* out, std::size_t bytes, std::string const& where)
  {
    DHISPARSE_EXPECTS(std::fread(out, 1, bytes, file_.get()) == bytes,
                      where + ": truncated: read failed (" + std::string(std::strerror(errno)) + ")");
  }

  std::string path_;
  detail::file_handle file_;
  trace::shape shape_;
  std::uint64_t steps_     = 0;
  std::uint64_t payload_   = 0;
  std::uint64_t next_step_ = 0;
  std::uint64_t offset_    = 0;  ///< payload bytes consumed by records
  bool failed_             = false;
};

}  // namespace dhisparse::trace
