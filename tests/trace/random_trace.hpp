/**
 * @file random_trace.hpp
 * @brief Random valid traces for the trace tests, reading a whole trace back, and a
 *        scratch file that removes itself.
 */
#pragma once

#include <dhisparse/trace.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

namespace dhisparse::test {

/// A path in the temporary directory, removed when this goes out of scope.
class scratch_file {
 public:
  explicit scratch_file(std::string const& tag)
  {
    std::random_device rd;
    path_ = (std::filesystem::temp_directory_path() /
             ("dhisparse_" + tag + "_" + std::to_string(rd()) + std::to_string(rd()) + ".trace"))
              .string();
  }
  scratch_file(scratch_file const&)            = delete;
  scratch_file& operator=(scratch_file const&) = delete;
  ~scratch_file() { std::remove(path_.c_str()); }
  [[nodiscard]] std::string const& path() const noexcept { return path_; }

 private:
  std::string path_;
};

/// Random shapes: 1-3 groups, 1-5 requests, 1-4 queries, top_k in [1, max_top_k].
inline trace::shape random_shape(std::mt19937_64& rng, bool scores, bool accepted, int max_top_k)
{
  trace::shape s;
  s.groups       = std::uniform_int_distribution<int>(1, 3)(rng);
  s.max_requests = std::uniform_int_distribution<int>(1, 5)(rng);
  s.max_queries  = std::uniform_int_distribution<int>(1, 4)(rng);
  s.top_k        = std::uniform_int_distribution<int>(1, max_top_k)(rng);
  s.scores       = scores;
  s.accepted     = accepted;
  return s;
}

/**
 * @brief `steps` random valid steps of shape `s`: random request counts (sometimes 0),
 *        distinct ids, queries, lengths and accepted counts; every stored row ascending
 *        and in range, full or -1 padded; scores random finite floats where present.
 */
inline std::vector<trace::step_record> random_trace(std::mt19937_64& rng, trace::shape const& s, int steps)
{
  std::vector<trace::step_record> out;
  std::size_t const k = std::size_t(s.top_k);
  for (int step = 0; step < steps; ++step) {
    trace::step_record rec;
    rec.step        = std::uint64_t(step);
    int const count = std::uniform_int_distribution<int>(step == 0 ? 1 : 0, s.max_requests)(rng);
    std::unordered_set<std::uint64_t> ids;
    for (int r = 0; r < count; ++r) {
      trace::request_record q;
      std::uint64_t id = rng();
      while (!ids.insert(id).second) { id = rng(); }
      q.id      = request_id{id};
      q.length  = std::uniform_int_distribution<std::int32_t>(0, 3 * s.top_k)(rng);
      q.queries = std::uniform_int_distribution<std::int32_t>(1, s.max_queries)(rng);
      q.accepted = s.accepted ? std::uniform_int_distribution<std::int32_t>(0, q.queries)(rng) : -1;
      rec.requests.push_back(q);
    }
    std::size_t const total = s.group_entries(count) * std::size_t(s.groups);
    rec.positions.assign(total, -1);
    if (s.scores) { rec.scores.assign(total, 0.0f); }
    std::uniform_real_distribution<float> score(-4.0f, 4.0f);
    for (int g = 0; g < s.groups; ++g) {
      for (int r = 0; r < count; ++r) {
        auto const& q = rec.requests[r];
        for (int i = 0; i < q.queries; ++i) {
          std::int64_t const available = std::int64_t(q.length) + i + 1;
          std::int64_t want            = std::min<std::int64_t>(available, std::int64_t(k));
          if (rng() % 4 == 0) { want = std::uniform_int_distribution<std::int64_t>(0, want)(rng); }
          std::set<std::int32_t> picked;
          while (std::int64_t(picked.size()) < want) {
            picked.insert(std::uniform_int_distribution<std::int32_t>(0, std::int32_t(available - 1))(rng));
          }
          std::size_t const row = ((std::size_t(g) * count + r) * std::size_t(s.max_queries) + i) * k;
          std::size_t e         = 0;
          for (std::int32_t p : picked) { rec.positions[row + e++] = p; }
          if (s.scores) {
            for (std::size_t j = 0; j < k; ++j) { rec.scores[row + j] = score(rng); }
          }
        }
      }
    }
    out.push_back(std::move(rec));
  }
  return out;
}

/// Every step of the trace at `path` (whose shapes must be `expected`).
inline std::vector<trace::step_record> read_trace(std::string const& path, trace::shape const& expected)
{
  trace::reader r(path, expected);
  std::vector<trace::step_record> out;
  trace::step_record rec;
  while (r.next(rec)) { out.push_back(rec); }
  return out;
}

/// Whether two records are equal field by field (scores bit for bit).
inline bool same_record(trace::step_record const& a, trace::step_record const& b)
{
  if (a.step != b.step || a.requests.size() != b.requests.size()) { return false; }
  for (std::size_t r = 0; r < a.requests.size(); ++r) {
    auto const& x = a.requests[r];
    auto const& y = b.requests[r];
    if (x.id != y.id || x.length != y.length || x.queries != y.queries || x.accepted != y.accepted) { return false; }
  }
  return a.positions == b.positions && a.scores.size() == b.scores.size() &&
         std::equal(a.scores.begin(), a.scores.end(), b.scores.begin(),
                    [](float u, float v) { return std::memcmp(&u, &v, sizeof u) == 0; });
}

}  // namespace dhisparse::test
