// Draft ring `keep` (the ring side of commit_verified): the host reference against an
// independent model — a map position → content tag per request — over random sequences of
// in-place drafts and kept paths (chains and tree paths, across the wrap, past the window,
// invalid counts and paths).
#include <dhisparse/host/draft_ring.hpp>

#include "random.hpp"
#include "ring_keep_ops.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

using namespace dhisparse;

TEST_CASE("draft ring keep: random drafts and kept paths match the model", "[draft_ring]")
{
  auto rng = test::seeded_engine("draft ring keep host");
  for (int trial = 0; trial < 40; ++trial) {
    int const B = 1 + int(rng() % 4), W = 1 + int(rng() % 9), layers = 1 + int(rng() % 2);
    host::draft_ring ring(B, W, layers, 32, std::byte{0x5A});
    test::keep_model model(B, W);
    for (int step = 0; step < 60; ++step) {
      auto const op = test::random_keep_op(ring.ref(), model, rng, std::uint32_t(trial * 1000 + step));
      test::draft_in_place(ring.ref(), op);  // the drafter writes its rows, then advance
      ring.advance(op.advance.data(), op.max_drafted, nullptr);
      model.advance(op);
      ring.clear_status();
      ring.keep(op.drafted.data(), op.kept.data(), op.nodes.data(), op.stride, op.ring_index.data(), op.entries,
                &op.batch);
      std::uint32_t const want = model.keep(op);
      INFO("trial " << trial << " step " << step << " window " << W);
      REQUIRE(ring.status() == want);
      test::check_ring(ring.ref(), model, layers);
    }
  }
}

TEST_CASE("draft ring keep: a chain keep is a rollback; bad arguments are skipped", "[draft_ring]")
{
  host::draft_ring a(2, 8, 1, 16), b(2, 8, 1, 16);
  std::int32_t const drafted[2] = {5, 3}, kept[2] = {2, 3};
  a.advance(drafted, 8, nullptr);
  b.advance(drafted, 8, nullptr);
  a.keep(drafted, kept, nullptr, 0, nullptr, 2, nullptr);
  b.rollback(drafted, kept, nullptr);
  REQUIRE(a.end() == b.end());
  REQUIRE(a.length() == b.length());
  REQUIRE(a.status() == 0);

  // Nodes not increasing, beyond the drafted rows, kept > drafted, a bad ring index: flagged, unchanged.
  std::int32_t const nodes[2][3]   = {{2, 2, 0}, {1, 4, 0}};
  std::int32_t const two[2]        = {2, 2};
  std::int32_t const three[2]      = {3, 3};
  std::int32_t const index[2]      = {1, 7};
  auto const end                   = a.end();
  auto const length                = a.length();
  a.advance(three, 8, nullptr);
  auto const end3 = a.end();
  a.keep(three, two, &nodes[0][0], 3, nullptr, 2, nullptr);
  REQUIRE(a.status() == draft_ring_status::bad_path);
  REQUIRE(a.end() == end3);
  a.clear_status();
  a.keep(two, three, nullptr, 0, nullptr, 2, nullptr);
  REQUIRE(a.status() == draft_ring_status::bad_count);
  REQUIRE(a.end() == end3);
  a.clear_status();
  a.keep(three, nullptr, nullptr, 0, index, 2, nullptr);  // entry 0 → ring request 1; entry 1 → 7
  REQUIRE(a.status() == draft_ring_status::bad_request);
  REQUIRE(a.end()[1] == end3[1] - 3);
  REQUIRE(a.end()[0] == end3[0]);
  (void)end;
  (void)length;
}
