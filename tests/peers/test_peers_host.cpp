// Peers' failures as tests (issue 18, items 4 and 5) on the host reference: the scenarios
// of peers.hpp through the soak's host backend, the draft ring beyond 4096 positions, and
// allocation failures. DHISPARSE_TEST_SEED replays a run; each prints its report.
#include <catch2/catch.hpp>

#include <dhisparse/error.hpp>
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/row_format.cuh>

#include "host_backend.hpp"
#include "peers.hpp"
#include "random.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <vector>

using namespace dhisparse;
using row     = row_format::opaque<64>;
using backend = test::soak::host_backend<row, policy::lru, policy::adaptive_budget<reclaim_order::global>>;

namespace {

auto const make = [](hierarchy_config const& c) { return std::make_unique<backend>(c); };

void expect_clean(char const* name, test::soak::report const& r)
{
  std::printf("peers host %s: %s\n", name, r.summary().c_str());
  for (auto const& m : r.messages) { std::printf("  violation: %s\n", m.c_str()); }
  INFO(name << ": " << r.summary() << " (set DHISPARSE_TEST_SEED=" << r.seed << " to replay)");
  for (auto const& m : r.messages) { UNSCOPED_INFO(m); }
  CHECK(r.violations == 0);
  CHECK(r.steps > 0);
}

}  // namespace

TEST_CASE("peers: host-pool admission reserves decode growth (SGLang 'host mem pool alloc failed')", "[peers]")
{
  expect_clean("decode growth", test::peers::decode_growth<backend>(make, test::fresh_seed()));
}

TEST_CASE("peers: verify steps straddling positions 4096 and 8192 (SGLang draft pages beyond 4096)", "[peers]")
{
  expect_clean("drafts beyond 4096", test::peers::drafts_beyond_4096<backend>(make, test::fresh_seed()));
}

TEST_CASE("peers: max_requests long-context requests admitted at once (SGLang)", "[peers]")
{
  expect_clean("many long contexts", test::peers::many_long_contexts<backend>(make, test::fresh_seed(), 12));
}

TEST_CASE("peers: the first decoded token after admission is exact (vLLM)", "[peers]")
{
  expect_clean("first token", test::peers::first_token<backend>(make, test::fresh_seed()));
}

TEST_CASE("peers: a request released while its backup is in flight", "[peers]")
{
  expect_clean("release during backup", test::peers::release_during_backup<backend>(make, test::fresh_seed(), 20));
}

TEST_CASE("faults: refused requests and calls leave the hierarchy usable for the others", "[faults]")
{
  expect_clean("usable after rejections", test::peers::usable_after_rejections<backend>(make, test::fresh_seed(), 30));
}

TEST_CASE("peers: the draft ring across position 4096 and beyond 2^31", "[peers]")
{
  // Two requests' draft KV in a window of 8: one from position 4090, one from 2^31 - 3;
  // each round appends 4 drafts (crossing 4096 and 2^31) and rolls the rejected ones back;
  // the rows the ring holds are always those last written at their positions.
  auto rng = test::seeded_engine("draft ring beyond 4096");
  constexpr int window = 8, layers = 2, max_count = 4;
  constexpr std::size_t row_bytes = 32;
  host::draft_ring ring(2, window, layers, row_bytes);
  std::int32_t const requests[2] = {0, 1};
  std::int64_t const start[2]    = {4090, (std::int64_t{1} << 31) - 3};
  ring.reset(requests, start, 2);
  std::map<std::int64_t, std::uint32_t> written[2];  // position → round that wrote it
  auto const fill = [](int b, std::int64_t position, int layer, std::uint32_t round, std::byte* out) {
    test::soak::row_bytes(77, std::uint64_t(b), 0, layer, position, round, out, row_bytes);
  };
  std::vector<std::byte> rows(2 * max_count * layers * row_bytes);
  for (std::uint32_t round = 1; round <= 12; ++round) {
    std::int32_t counts[2], accepted[2];
    for (int b = 0; b < 2; ++b) {
      counts[b] = max_count;
      for (int j = 0; j < max_count; ++j) {
        std::int64_t const position = ring.end()[std::size_t(b)] + j;
        for (int l = 0; l < layers; ++l) {
          fill(b, position, l, round, rows.data() + ((std::size_t(b) * max_count + j) * layers + l) * row_bytes);
        }
        written[b][position] = round;
      }
      accepted[b] = std::int32_t(rng() % (max_count + 1));
    }
    draft_ring_rows const view{rows.data()};
    ring.append(view, counts, max_count, nullptr);
    ring.rollback(counts, accepted, nullptr);
    REQUIRE(ring.status() == 0);
    for (int b = 0; b < 2; ++b) {
      std::int64_t const first = ring.ref().first_position(b);
      INFO("round " << round << " request " << b << " first position " << first);
      REQUIRE(ring.length()[std::size_t(b)] <= window);
      REQUIRE(ring.length()[std::size_t(b)] >= std::min<std::int64_t>(accepted[b], window));
      REQUIRE(first >= start[b]);
      for (std::int32_t j = 0; j < ring.length()[std::size_t(b)]; ++j) {
        for (int l = 0; l < layers; ++l) {
          std::byte want[row_bytes];
          fill(b, first + j, l, written[b].at(first + j), want);
          REQUIRE(std::memcmp(ring.ref().row(l, b, ring.ref().slot_of_index(b, j)), want, row_bytes) == 0);
        }
      }
    }
  }
  CHECK(ring.end()[1] > (std::int64_t{1} << 31));
  CHECK(ring.end()[0] > 4096);
}

// ---- allocation failures (issue 18, item 5) --------------------------------------------
// The host reference allocates its slabs and host-store rows with std::vector. Asked for
// an impossible size it let std::bad_alloc escape, which named nothing, and admission had
// already taken the host pages and set the capacity when the allocation failed, so the
// request was half admitted (docs/reliability.md, F10 and F11, fixed): now it allocates
// before it changes anything and names the allocation in a dhisparse::error.
// AddressSanitizer reports an impossible `new` and aborts instead of throwing, so the
// sanitizer build skips these two.
#if defined(__SANITIZE_ADDRESS__)
#define DHISPARSE_SKIP_UNDER_ASAN()                                                             \
  WARN("skipped under AddressSanitizer (it aborts on an impossible allocation)");              \
  return
#else
#define DHISPARSE_SKIP_UNDER_ASAN() (void)0
#endif

TEST_CASE("F10: an impossible slab at construction is reported by name", "[faults]")
{
  DHISPARSE_SKIP_UNDER_ASAN();
  hierarchy_config c         = test::peers::base_config();
  c.group_layers             = {1, 64};
  c.device_slots_per_group   = (std::int64_t{1} << 31) - 1;  // 2^31 slots × 64 layers × 4 KiB
  using huge                 = host::kv_hierarchy<row_format::opaque<4096>, policy::lru, policy::adaptive_budget<>>;
  CHECK_THROWS_WITH(huge(c), Catch::Contains("allocation failed: slab of group 0"));
}

TEST_CASE("F11: an impossible host-store allocation at admission changes nothing", "[faults]")
{
  DHISPARSE_SKIP_UNDER_ASAN();
  hierarchy_config c       = test::peers::base_config();
  c.group_layers           = {64};
  c.max_context            = (1 << 30);
  c.host.tokens_per_page   = 1 << 16;
  c.host.capacity_pages    = 1 << 16;
  c.map_page_positions     = 1 << 16;
  host::kv_hierarchy<row_format::opaque<4096>, policy::lru, policy::adaptive_budget<>> h(c);
  std::size_t const pages = h.free_host_pages();
  // 2^30 positions × 64 layers × 4 KiB = 256 TiB of host-store rows.
  CHECK_THROWS_AS(h.admit(request_id{1}, 0, std::int64_t{1} << 30), dhisparse::error);
  CHECK_FALSE(h.contains(request_id{1}));
  CHECK(h.free_host_pages() == pages);
  CHECK(h.floor_sum() == 0);
  h.admit(request_id{2}, 16, 64);  // and the hierarchy is still usable
  CHECK(h.contains(request_id{2}));
}
