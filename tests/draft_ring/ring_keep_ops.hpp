/**
 * @file ring_keep_ops.hpp
 * @brief Random "draft in place, then keep the accepted path" operations on a draft ring
 *        and an independent model of what it must hold (position → content tag per
 *        request), for the host and GPU tests of `keep`.
 */
#pragma once

#include "ring_ops.hpp"  // tag_row

#include <dhisparse/draft_ring_ref.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace dhisparse::test {

/// One step: every ring request drafts `advance[r]` rows in place, then entries keep paths.
struct keep_op {
  int entries = 0;                    ///< batch entries (the keep's grid)
  std::int32_t batch = 0;             ///< entries in play (device batch size)
  std::vector<std::int32_t> advance;  ///< [capacity] rows drafted per ring request
  int max_drafted = 0;
  std::vector<std::int32_t> ring_index;  ///< [entries]
  std::vector<std::int32_t> drafted;     ///< [entries]
  std::vector<std::int32_t> kept;        ///< [entries]
  std::vector<std::int32_t> nodes;       ///< [entries][stride], or empty: chains
  int stride = 0;
  std::uint32_t generation = 0;
};

/// What each ring request must hold: position → (position the bytes were written for,
/// generation), for the held positions.
struct keep_model {
  struct tag {
    std::int64_t position;
    std::uint32_t generation;
  };
  int window;
  std::vector<std::int64_t> end;
  std::vector<std::int32_t> length;
  std::vector<std::map<std::int64_t, tag>> content;

  keep_model(int capacity, int window_)
    : window{window_}, end(capacity, 0), length(capacity, 0), content(capacity)
  {
  }

  void advance(keep_op const& op)
  {
    for (std::size_t r = 0; r < end.size(); ++r) {
      for (std::int32_t j = 0; j < op.advance[r]; ++j) { content[r][end[r] + j] = {end[r] + j, op.generation}; }
      end[r] += op.advance[r];
      length[r] = std::int32_t(std::min<std::int64_t>(std::int64_t(length[r]) + op.advance[r], window));
    }
  }

  /// Applies the keeps; returns the status bits the ring must raise.
  std::uint32_t keep(keep_op const& op)
  {
    std::uint32_t bits = 0;
    int const n        = std::clamp(op.batch, 0, op.entries);
    for (int b = 0; b < n; ++b) {
      int const r = op.ring_index.empty() ? b : op.ring_index[b];
      if (r < 0 || r >= int(end.size())) {
        bits |= draft_ring_status::bad_request;
        continue;
      }
      std::int32_t const d = op.drafted[b], k = op.kept.empty() ? 0 : op.kept[b];
      std::int32_t const* nodes = op.nodes.empty() ? nullptr : op.nodes.data() + std::size_t(b) * op.stride;
      if (d < 0 || k < 0 || k > d) {
        bits |= draft_ring_status::bad_count;
        continue;
      }
      // A path longer than its row of nodes, or not increasing inside [1, d].
      bool bad_path = nodes != nullptr && k > op.stride;
      for (int i = 0; nodes && !bad_path && i < k; ++i) {
        bad_path = nodes[i] <= (i ? nodes[i - 1] : 0) || nodes[i] > d;
      }
      if (bad_path) {
        bits |= draft_ring_status::bad_path;
        continue;
      }
      if (d > end[r]) {  // more rows than the ring ever held
        bits |= draft_ring_status::bad_count;
        continue;
      }
      std::int64_t const base = end[r] - d;
      for (int i = 1; nodes && i <= k; ++i) {
        std::int64_t const from = base + nodes[i - 1] - 1, to = base + i - 1;
        if (from != to && to >= end[r] - length[r]) { content[r][to] = content[r].at(from); }
      }
      std::int64_t const drop = d - k;
      end[r] -= drop;
      if (drop > length[r]) {
        length[r] = 0;
        bits |= draft_ring_status::rollback_past_window;
      } else {
        length[r] -= std::int32_t(drop);
      }
    }
    return bits;
  }
};

/// A random step: mostly the speculative pattern (keep k of the rows just drafted along an
/// increasing path), sometimes invalid counts, paths or ring indices, batch sizes < entries.
inline keep_op random_keep_op(draft_ring_ref const& shape, keep_model const& model, std::mt19937_64& g,
                              std::uint32_t generation)
{
  int const B = shape.capacity, W = shape.window;
  auto pick   = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); };
  keep_op op;
  op.generation  = generation;
  op.entries     = B;
  op.batch       = pick(0, 4) == 0 ? pick(0, B) : B;
  op.max_drafted = W + 3;
  op.advance.resize(B);
  for (auto& a : op.advance) { a = pick(0, op.max_drafted); }
  op.ring_index.resize(B);
  for (int b = 0; b < B; ++b) { op.ring_index[b] = b; }
  std::shuffle(op.ring_index.begin(), op.ring_index.end(), g);
  if (pick(0, 9) == 0) { op.ring_index[pick(0, B - 1)] = pick(0, 1) ? -1 : B; }
  bool const chains = pick(0, 3) == 0;
  // Rows of nodes as long as any path, or sometimes shorter than the paths kept.
  op.stride = pick(0, 4) == 0 ? pick(1, op.max_drafted) : op.max_drafted + 1;
  if (!chains) { op.nodes.assign(std::size_t(B) * op.stride, 0); }
  op.drafted.resize(B);
  op.kept.resize(B);
  for (int b = 0; b < B; ++b) {
    int const r       = op.ring_index[b];
    int const drafted = r >= 0 && r < B ? op.advance[r] : pick(0, 3);
    op.drafted[b]     = pick(0, 19) == 0 ? (pick(0, 1) ? -1 : drafted + pick(1, 3)) : drafted;
    int const d       = std::max(0, op.drafted[b]);
    // Sometimes more than drafted (bad_count), or than the row of nodes holds (bad_path).
    op.kept[b]        = pick(0, 19) == 0 ? d + 1 : pick(0, d);
    if (chains) { continue; }
    // An increasing path: kept distinct nodes of [1, d].
    std::vector<std::int32_t> all(static_cast<std::size_t>(d));
    for (int i = 0; i < d; ++i) { all[std::size_t(i)] = i + 1; }
    std::shuffle(all.begin(), all.end(), g);
    int const k = std::min({op.kept[b], d, op.stride});  // a drafted count beyond the ring fits no row
    std::sort(all.begin(), all.begin() + k);
    std::copy(all.begin(), all.begin() + k, op.nodes.begin() + std::ptrdiff_t(b) * op.stride);
    if (k > 1 && pick(0, 19) == 0) { op.nodes[std::size_t(b) * op.stride + 1] = op.nodes[std::size_t(b) * op.stride]; }
  }
  (void)model;
  return op;
}

/// The drafter's in-place writes of a step (host memory): rows tagged with their position.
inline void draft_in_place(draft_ring_ref const& ring, keep_op const& op)
{
  for (int r = 0; r < ring.capacity; ++r) {
    for (std::int32_t j = 0; j < op.advance[r]; ++j) {
      for (int layer = 0; layer < ring.layers; ++layer) {
        tag_row(ring.row(layer, r, ring.append_slot(r, j)), ring.row_bytes, r, ring.end[r] + j, layer,
                op.generation);
      }
    }
  }
}

/// The ring (host view) holds exactly what the model says.
inline void check_ring(draft_ring_ref const& ring, keep_model const& model, int layers)
{
  std::vector<std::byte> want(std::size_t(ring.row_bytes));
  for (int r = 0; r < ring.capacity; ++r) {
    REQUIRE(ring.end[r] == model.end[r]);
    REQUIRE(ring.length[r] == model.length[r]);
    for (std::int64_t x = model.end[r] - model.length[r]; x < model.end[r]; ++x) {
      auto const& t = model.content[r].at(x);
      for (int layer = 0; layer < layers; ++layer) {
        tag_row(want.data(), ring.row_bytes, r, t.position, layer, t.generation);
        INFO("request " << r << " position " << x << " layer " << layer);
        REQUIRE(std::memcmp(ring.row(layer, r, ring.slot(x)), want.data(), want.size()) == 0);
      }
    }
  }
}

}  // namespace dhisparse::test
