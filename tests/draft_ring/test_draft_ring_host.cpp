// Host reference of the draft ring (host/draft_ring.hpp) against an independent model:
// wrap-around, rollback across the wrap and past the window, random operation sequences,
// and the checks of bad counts.
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/status.hpp>

#include "random.hpp"
#include "ring_ops.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

using namespace dhisparse;

namespace {

/// Tag read back from a row (request, position, layer, generation), checking that every
/// 16-byte group of the row carries it.
struct tag {
  std::uint32_t request, position, layer, generation;
  bool operator==(tag const& o) const
  {
    return request == o.request && position == o.position && layer == o.layer && generation == o.generation;
  }
};

tag read_tag(std::byte const* row, std::int64_t bytes)
{
  tag t;
  std::memcpy(&t, row, 16);
  for (std::int64_t i = 16; i < bytes; i += 16) {
    tag u;
    std::memcpy(&u, row + i, 16);
    REQUIRE(u == t);
  }
  return t;
}

/// Every row the ring holds is the model's, at the position the view maps it to.
void require_matches(host::draft_ring const& ring, test::ring_model const& model)
{
  draft_ring_ref const& r = ring.ref();
  for (int b = 0; b < r.capacity; ++b) {
    INFO("request " << b);
    REQUIRE(ring.end()[b] == model.end[b]);
    REQUIRE(ring.length()[b] == int(model.held[b].size()));
    for (int j = 0; j < ring.length()[b]; ++j) {
      auto const& e = model.held[b][j];
      REQUIRE(r.first_position(b) + j == e.position);
      for (int layer = 0; layer < r.layers; ++layer) {
        tag const t = read_tag(r.row(layer, b, r.slot_of_index(b, j)), r.row_bytes);
        REQUIRE(t == tag{std::uint32_t(b), std::uint32_t(e.position), std::uint32_t(layer), e.generation});
      }
    }
  }
}

/// Applies `op` to the model (the semantics, written independently of the reference).
void apply_model(test::ring_model& m, test::ring_op const& op, int capacity)
{
  int const batch = std::clamp<int>(op.batch, 0, capacity);
  switch (op.kind) {
    case test::ring_op_kind::append:
    case test::ring_op_kind::advance:
      for (int b = 0; b < batch; ++b) {
        if (op.counts[b] < 0 || op.counts[b] > op.max_count) { continue; }
        for (int j = 0; j < op.counts[b]; ++j) { m.push(b, m.end[b] + j, op.generation); }
        m.end[b] += op.counts[b];
      }
      break;
    case test::ring_op_kind::rollback:
      for (int b = 0; b < batch; ++b) {
        long long const n = op.counts[b] < 0 ? -1 : op.counts[b] - (op.accepted.empty() ? 0 : op.accepted[b]);
        if (n < 0 || n > m.end[b]) { continue; }
        m.end[b] -= n;
        while (!m.held[b].empty() && m.held[b].back().position >= m.end[b]) { m.held[b].pop_back(); }
      }
      break;
    case test::ring_op_kind::reset:
      for (std::size_t i = 0; i < op.requests.size(); ++i) {
        int const r = op.requests[i];
        if (r < 0 || r >= capacity || (!op.start.empty() && op.start[i] < 0)) { continue; }
        m.end[r] = op.start.empty() ? 0 : op.start[i];
        m.held[r].clear();
      }
      break;
  }
}

/// Applies `op` to the host ring; advance first writes its rows in place through the view.
void apply_ring(host::draft_ring& ring, test::ring_op const& op)
{
  draft_ring_ref const& r = ring.ref();
  std::int32_t const batch = op.batch;
  switch (op.kind) {
    case test::ring_op_kind::append:
      ring.append(draft_ring_rows{op.rows.data()}, op.counts.data(), op.max_count, &batch);
      break;
    case test::ring_op_kind::advance:
      for (int b = 0; b < std::clamp<int>(batch, 0, r.capacity); ++b) {
        if (op.counts[b] < 0 || op.counts[b] > op.max_count) { continue; }
        for (int j = 0; j < op.counts[b]; ++j) {
          for (int layer = 0; layer < r.layers; ++layer) {
            test::tag_row(r.row(layer, b, r.append_slot(b, j)), r.row_bytes, b, r.end[b] + j, layer, op.generation);
          }
        }
      }
      ring.advance(op.counts.data(), op.max_count, &batch);
      break;
    case test::ring_op_kind::rollback:
      ring.rollback(op.counts.data(), op.accepted.empty() ? nullptr : op.accepted.data(), &batch);
      break;
    case test::ring_op_kind::reset:
      ring.reset(op.requests.data(), op.start.empty() ? nullptr : op.start.data(), int(op.requests.size()));
      break;
  }
}

}  // namespace

TEST_CASE("draft ring: wrap-around and rollback across the wrap", "[draft_ring]")
{
  int const W = 8;
  host::draft_ring ring(2, W, 2, 32);
  test::ring_model model(2, W);
  auto append = [&](std::vector<std::int32_t> counts, std::uint32_t generation) {
    test::ring_op op;
    op.kind       = test::ring_op_kind::append;
    op.counts     = counts;
    op.max_count  = 6;
    op.batch      = 2;
    op.generation = generation;
    op.rows.resize(2 * 6 * 2 * 32);
    for (int b = 0; b < 2; ++b) {
      for (int j = 0; j < 6; ++j) {
        for (int layer = 0; layer < 2; ++layer) {
          test::tag_row(op.rows.data() + ((b * 6 + j) * 2 + layer) * 32, 32, b, ring.end()[b] + j, layer, generation);
        }
      }
    }
    apply_ring(ring, op);
    apply_model(model, op, 2);
    require_matches(ring, model);
  };
  append({5, 1}, 1);
  append({6, 2}, 2);  // request 0: positions 3..10 held, slots 3..7 then 0..2
  CHECK(ring.end()[0] == 11);
  CHECK(ring.length()[0] == W);
  CHECK(ring.ref().first_position(0) == 3);
  CHECK(ring.ref().slot_of_index(0, 0) == 3);
  CHECK(ring.ref().slot_of_index(0, 7) == 2);
  CHECK(ring.ref().append_slot(0, 0) == 3);

  // Roll back 3 of 5 drafted rows: positions 8..10 (slots 0..2, past the wrap) go.
  std::vector<std::int32_t> drafted{5, 0}, accepted{2, 0};
  std::int32_t const batch = 2;
  ring.rollback(drafted.data(), accepted.data(), &batch);
  test::ring_op op;
  op.kind     = test::ring_op_kind::rollback;
  op.counts   = drafted;
  op.accepted = accepted;
  op.batch    = 2;
  apply_model(model, op, 2);
  require_matches(ring, model);
  CHECK(ring.end()[0] == 8);
  CHECK(ring.length()[0] == 5);
  CHECK(ring.status() == 0);

  append({4, 0}, 3);  // positions 8..11 reuse slots 0..3: generation 3 replaces 1 and 2
  CHECK(ring.ref().first_position(0) == 4);

  // Rolling back more than the ring holds empties it and says that rows were lost.
  drafted = {W + 3, 0};
  ring.rollback(drafted.data(), nullptr, &batch);
  CHECK(ring.status() == draft_ring_status::rollback_past_window);
  CHECK(ring.length()[0] == 0);
  CHECK(ring.end()[0] == 12 - (W + 3));
  ring.clear_status();
  // Before position 0: flagged, nothing changes.
  drafted = {100, 0};
  ring.rollback(drafted.data(), nullptr, &batch);
  CHECK(ring.status() == draft_ring_status::bad_count);
  CHECK(ring.end()[0] == 12 - (W + 3));
}

TEST_CASE("draft ring: random operation sequences match the model", "[draft_ring]")
{
  auto g = test::seeded_engine("draft ring host");
  for (int round = 0; round < 20; ++round) {
    int const B = std::uniform_int_distribution<int>(1, 6)(g);
    int const W = std::uniform_int_distribution<int>(1, 20)(g);
    int const L = std::uniform_int_distribution<int>(1, 3)(g);
    host::draft_ring ring(B, W, L, 16 * std::uniform_int_distribution<int>(1, 4)(g), std::byte{0xAB});
    test::ring_model model(B, W);
    for (std::uint32_t step = 1; step <= 150; ++step) {
      test::ring_op const op = test::random_op(ring.ref(), ring.end(), g, step);
      INFO("round " << round << " step " << step << " op " << int(op.kind));
      apply_ring(ring, op);
      apply_model(model, op, B);
      require_matches(ring, model);
    }
    CHECK(ring.rows().size() == std::size_t(B) * W * L * ring.ref().row_bytes);  // bounded by B·W·rows
  }
}

TEST_CASE("draft ring: bad counts, batch sizes and requests are flagged and skipped", "[draft_ring]")
{
  host::draft_ring ring(3, 4, 1, 16);
  std::vector<std::int32_t> counts{2, 9, -1};
  std::int32_t batch = 3;
  ring.advance(counts.data(), 4, &batch);
  CHECK(ring.status() == draft_ring_status::bad_count);
  CHECK(ring.end() == std::vector<std::int64_t>{2, 0, 0});
  ring.clear_status();
  batch = 7;
  counts = {1, 1, 1};
  ring.advance(counts.data(), 4, &batch);
  CHECK(ring.status() == draft_ring_status::bad_batch_size);
  CHECK(ring.end() == std::vector<std::int64_t>{3, 1, 1});
  ring.clear_status();
  std::vector<std::int32_t> requests{1, 3};
  std::vector<std::int64_t> start{40, 2};
  ring.reset(requests.data(), start.data(), 2);
  CHECK(ring.status() == draft_ring_status::bad_request);
  CHECK(ring.end() == std::vector<std::int64_t>{3, 40, 1});
  CHECK(ring.length() == std::vector<std::int32_t>{3, 0, 1});
  ring.clear_status();
  start = {-1, 0};
  ring.reset(requests.data(), start.data(), 1);
  CHECK(ring.status() == draft_ring_status::bad_start);
  CHECK(describe_status(draft_ring_status::bad_count, status_format::explained).find("counts") != std::string::npos);
  CHECK_THROWS_WITH(host::draft_ring(2, 8, 1, 24), Catch::Contains("row_bytes"));
  CHECK_THROWS_WITH(host::draft_ring(2, 0, 1, 32), Catch::Contains("window"));
  CHECK_THROWS_WITH(host::draft_ring(2, 8, 0, 32), Catch::Contains("layers"));
}
