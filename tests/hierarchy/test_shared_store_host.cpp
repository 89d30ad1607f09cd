// The page bookkeeping of a host store shared by tensor-parallel ranks
// (detail/shared_page_lists.hpp): one list per request id for every rank that holds it,
// the admission contract checked, pages freed only after the last holder's release passed.
#include <dhisparse/detail/shared_page_lists.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

using dhisparse::detail::release_token;
using dhisparse::detail::shared_page_lists;

namespace {

/// A fake "stream passed the release" flag; `waits` counts blocking waits.
struct fake_event {
  bool passed = false;
  int waits   = 0;
};
release_token token(std::shared_ptr<fake_event> const& e)
{
  return [e](bool wait) {
    if (wait && !e->passed) {
      ++e->waits;
      e->passed = true;
    }
    return e->passed;
  };
}

}  // namespace

TEST_CASE("shared host store: ranks admitting one request share one page list", "[shared_store]")
{
  shared_page_lists lists(16, 4, 64);  // 16 pages of 4 positions
  auto const first = lists.hold(7, 10, 12);
  REQUIRE(first.size() == 3);
  REQUIRE(lists.free_pages() == 13);
  auto const second = lists.hold(7, 10, 12);  // rank 1: the same pages, none taken
  REQUIRE(second == first);
  REQUIRE(lists.free_pages() == 13);
  REQUIRE(lists.holders(7) == 2);
  REQUIRE(lists.missing_pages(7, 12) == 0);
  REQUIRE(lists.missing_pages(8, 12) == 3);

  SECTION("a rank growing the request extends the one list")
  {
    auto const grown = lists.grow(7, 20);
    REQUIRE(grown.size() == 5);
    REQUIRE(std::equal(first.begin(), first.end(), grown.begin()));
    REQUIRE(lists.grow(7, 20) == grown);  // the other rank: nothing new
    REQUIRE(lists.free_pages() == 11);
  }
  SECTION("a different length breaks the contract and changes nothing")
  {
    REQUIRE_THROWS_WITH(lists.hold(7, 11, 12), Catch::Contains("admitted with length 11"));
    REQUIRE(lists.holders(7) == 2);
    REQUIRE(lists.free_pages() == 13);
  }
  SECTION("capacity beyond max_context or the free pages: refused, nothing changes")
  {
    REQUIRE_THROWS_WITH(lists.hold(9, 0, 65), Catch::Contains("exceeds max_context"));
    REQUIRE_THROWS_WITH(lists.grow(7, 64 + 4), Catch::Contains("exceeds max_context"));
    lists.hold(9, 0, 13 * 4);  // every free page
    REQUIRE(lists.free_pages() == 0);
    REQUIRE_THROWS_WITH(lists.hold(10, 1, 1), Catch::Contains("exhausted"));
    REQUIRE(lists.holders(10) == 0);
    REQUIRE_THROWS_WITH(lists.grow(8, 4), Catch::Contains("not held"));
  }
}

TEST_CASE("shared host store: pages return after the last holder's release passed", "[shared_store]")
{
  shared_page_lists lists(4, 4, 16);
  auto const pages = lists.hold(1, 16, 16);  // the whole store
  lists.hold(1, 16, 16);
  auto const rank0 = std::make_shared<fake_event>();
  auto const rank1 = std::make_shared<fake_event>();
  lists.drop(1, token(rank0));
  REQUIRE(lists.holders(1) == 1);
  REQUIRE(lists.free_pages() == 0);  // rank 1 still holds them
  REQUIRE_THROWS_WITH(lists.hold(2, 0, 4), Catch::Contains("exhausted"));
  lists.drop(1, token(rank1));
  REQUIRE(lists.holders(1) == 0);
  REQUIRE(lists.requests() == 0);
  REQUIRE(lists.free_pages() == 4);  // parked: counted, not yet handed out

  rank0->passed = true;  // rank 1's stream has not passed its release yet
  auto const again = lists.hold(2, 0, 8);
  REQUIRE(rank1->waits == 1);  // no page was free: waited for the parked ones
  REQUIRE(again.size() == 2);
  REQUIRE(std::set<std::int32_t>(again.begin(), again.end()).size() == 2);
  for (auto p : again) { REQUIRE(std::find(pages.begin(), pages.end(), p) != pages.end()); }
  REQUIRE(lists.free_pages() == 2);
}

TEST_CASE("shared host store: random admissions over three ranks never share a page between requests",
          "[shared_store]")
{
  std::mt19937_64 rng(Catch::rngSeed() + 19);
  int const ranks = 3;
  shared_page_lists lists(64, 8, 256);
  std::vector<std::vector<std::uint64_t>> held(ranks);  // ids each rank holds
  std::vector<std::shared_ptr<fake_event>> events;
  for (int step = 0; step < 2000; ++step) {
    int const r          = int(rng() % ranks);
    std::uint64_t const id = rng() % 12;
    auto& mine           = held[std::size_t(r)];
    bool const holds     = std::find(mine.begin(), mine.end(), id) != mine.end();
    if (holds && rng() % 3 == 0) {
      events.push_back(std::make_shared<fake_event>());
      lists.drop(id, token(events.back()));
      mine.erase(std::find(mine.begin(), mine.end(), id));
    } else if (holds) {
      try {
        lists.grow(id, std::int64_t(rng() % 257));
      } catch (dhisparse::error const&) {
      }
    } else {
      std::int32_t const length = std::int32_t(id * 10);  // every rank admits an id alike
      try {
        lists.hold(id, length, length + std::int64_t(rng() % 40));
        mine.push_back(id);
      } catch (dhisparse::error const&) {
      }
    }
    if (rng() % 4 == 0) {
      for (auto& e : events) { e->passed = true; }
    }
    // Every page belongs to at most one request; held + free = all.
    std::set<std::int32_t> seen;
    std::size_t in_lists = 0;
    for (std::uint64_t i = 0; i < 12; ++i) {
      int holding = 0;
      for (auto const& h : held) { holding += int(std::count(h.begin(), h.end(), i)); }
      REQUIRE(lists.holders(i) == holding);
      for (auto p : lists.pages(i)) {
        REQUIRE(seen.insert(p).second);
        ++in_lists;
      }
    }
    REQUIRE(in_lists + lists.free_pages() == 64);
  }
}
