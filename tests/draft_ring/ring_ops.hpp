/**
 * @file ring_ops.hpp
 * @brief Random draft-ring operations and an independent model of what a ring must hold
 *        (a bounded deque of tagged rows per request), for the host and GPU tests.
 */
#pragma once

#include <dhisparse/draft_ring_ref.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace dhisparse::test {

/// Content of a row: (request, position, layer, generation) repeated over its bytes, so a
/// row in the wrong place or stale from an earlier write never matches.
inline void tag_row(std::byte* row, std::int64_t bytes, int request, std::int64_t position, int layer,
                    std::uint32_t generation)
{
  std::uint32_t const words[4] = {std::uint32_t(request), std::uint32_t(position), std::uint32_t(layer),
                                  generation};
  for (std::int64_t i = 0; i < bytes; i += 16) { std::memcpy(row + i, words, 16); }
}

enum class ring_op_kind { append, advance, rollback, reset };

/// One operation with its host arguments (device tests upload them).
struct ring_op {
  ring_op_kind kind;
  std::vector<std::int32_t> counts;    ///< append / advance counts; rollback: drafted
  std::vector<std::int32_t> accepted;  ///< rollback (may be empty: nullptr)
  std::vector<std::int32_t> requests;  ///< reset
  std::vector<std::int64_t> start;     ///< reset (may be empty: nullptr)
  std::vector<std::byte> rows;         ///< append: [capacity][max_count][layers][row_bytes] (packed)
  int max_count = 0;
  std::int32_t batch = 0;              ///< device batch size for this op
  std::uint32_t generation = 0;
};

/// The rows a ring must hold: per request the (position, generation) of each row, oldest
/// first, at most `window` of them.
struct ring_model {
  struct entry {
    std::int64_t position;
    std::uint32_t generation;
  };
  int window;
  std::vector<std::deque<entry>> held;
  std::vector<std::int64_t> end;

  ring_model(int capacity, int window_) : window{window_}, held(capacity), end(capacity, 0) {}

  void push(int b, std::int64_t position, std::uint32_t generation)
  {
    held[b].push_back({position, generation});
    if (int(held[b].size()) > window) { held[b].pop_front(); }
  }
};

/**
 * @brief A random valid-or-not operation. Mostly valid; about one in ten counts is out of
 *        range (must be flagged and skipped). Rollbacks usually remove fewer rows than
 *        were just added (the speculative pattern), sometimes more than the ring holds.
 */
inline ring_op random_op(draft_ring_ref const& shape, std::vector<std::int64_t> const& end, std::mt19937_64& g,
                         std::uint32_t generation, bool allow_invalid = true)
{
  int const B = shape.capacity, W = shape.window;
  std::uniform_int_distribution<int> pick(0, 9);
  ring_op op;
  op.generation = generation;
  op.batch      = std::uniform_int_distribution<int>(B > 1 ? B - 2 : 0, B)(g);
  int const k   = pick(g);
  op.kind       = k < 4 ? ring_op_kind::append : k < 6 ? ring_op_kind::advance : k < 9 ? ring_op_kind::rollback
                                                                                       : ring_op_kind::reset;
  auto invalid  = [&] { return allow_invalid && pick(g) == 0; };
  switch (op.kind) {
    case ring_op_kind::append:
    case ring_op_kind::advance: {
      op.max_count = std::uniform_int_distribution<int>(1, 2 * W + 3)(g);
      op.counts.resize(B);
      for (auto& c : op.counts) {
        c = invalid() ? (pick(g) < 5 ? -1 : op.max_count + 1) : std::uniform_int_distribution<int>(0, op.max_count)(g);
      }
      if (op.kind == ring_op_kind::append) {
        std::int64_t const per_row = shape.row_bytes;
        op.rows.resize(std::size_t(B) * op.max_count * shape.layers * per_row);
        for (int b = 0; b < B; ++b) {
          for (int j = 0; j < op.max_count; ++j) {
            for (int layer = 0; layer < shape.layers; ++layer) {
              std::byte* row = op.rows.data() + ((std::int64_t(b) * op.max_count + j) * shape.layers + layer) * per_row;
              tag_row(row, per_row, b, end[b] + j, layer, generation);
            }
          }
        }
      }
      break;
    }
    case ring_op_kind::rollback: {
      op.counts.resize(B);
      if (pick(g) < 8) { op.accepted.resize(B); }
      for (int b = 0; b < B; ++b) {
        int const drafted = std::uniform_int_distribution<int>(0, W + 2)(g);
        op.counts[b]      = invalid() ? -3 : drafted;
        if (!op.accepted.empty()) {
          op.accepted[b] = invalid() ? drafted + 1 : std::uniform_int_distribution<int>(0, drafted)(g);
        }
      }
      break;
    }
    case ring_op_kind::reset: {
      std::vector<int> all(B);
      for (int b = 0; b < B; ++b) { all[b] = b; }
      std::shuffle(all.begin(), all.end(), g);
      int const n = std::uniform_int_distribution<int>(0, std::min(B, 2))(g);
      op.requests.assign(all.begin(), all.begin() + n);
      if (invalid()) { op.requests.push_back(B + 5); }
      if (pick(g) < 5) {
        for (std::size_t i = 0; i < op.requests.size(); ++i) {
          op.start.push_back(invalid() ? -1 : std::uniform_int_distribution<std::int64_t>(0, 5000)(g));
        }
      }
      break;
    }
  }
  return op;
}

}  // namespace dhisparse::test
