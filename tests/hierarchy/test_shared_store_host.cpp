// The page bookkeeping of a host store shared by tensor-parallel ranks
// (detail/shared_page_lists.hpp): one list per request id for every rank that holds it,
// the admission contract checked, pages freed only after the last holder's release passed.
#include <dhisparse/detail/shared_page_lists.hpp>
#include <dhisparse/detail/shm_segment.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <set>
#include <string>
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

namespace {

/// A shared anonymous mapping both sides of a fork see.
struct shared_mapping {
  explicit shared_mapping(std::size_t n) : bytes{n}
  {
    memory = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(memory != MAP_FAILED);
  }
  ~shared_mapping() { ::munmap(memory, bytes); }
  std::size_t bytes;
  void* memory;
};

/// Runs `child` in a forked process; returns its exit status (0: every check held).
template <class F>
int in_child(F child)
{
  pid_t const pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    try {
      rc = child();
    } catch (...) {
      rc = 2;
    }
    ::_exit(rc);
  }
  return pid;
}

/// Waits (at most about 20 s) until `flag` is set; false on time-out.
bool await(std::int32_t const volatile& flag)
{
  for (int i = 0; i < 20000 && flag == 0; ++i) { ::usleep(1000); }
  return flag != 0;
}

int wait_child(int pid)
{
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

}  // namespace

TEST_CASE("shared host store: page lists in shared memory serve ranks in two processes", "[shared_store]")
{
  constexpr std::size_t pages = 64;
  constexpr int ppp = 8, max_context = 512, max_ids = 32;
  std::size_t const bytes = shared_page_lists::state_bytes(pages, max_ids);
  shared_mapping state(bytes);
  shared_mapping board(4096);  // the child's findings
  auto* seen = static_cast<std::int32_t*>(board.memory);
  shared_page_lists lists(state.memory, bytes, pages, ppp, max_context, max_ids, true, true);

  SECTION("the same request gets the same pages in both; a mismatched shape is refused")
  {
    auto const mine = lists.hold(5, 40, 60);
    REQUIRE(mine.size() == 8);
    int const child = in_child([&] {
      REQUIRE_THROWS(shared_page_lists(state.memory, bytes, pages, ppp * 2, max_context, max_ids, false, true));
      shared_page_lists other(state.memory, bytes, pages, ppp, max_context, max_ids, false, true);
      auto const theirs = other.hold(5, 40, 60);
      std::copy(theirs.begin(), theirs.end(), seen);
      seen[63] = int(theirs.size());
      seen[62] = other.holders(5);
      return 0;
    });
    REQUIRE(wait_child(child) == 0);
    REQUIRE(seen[63] == 8);
    REQUIRE(seen[62] == 2);
    REQUIRE(std::equal(mine.begin(), mine.end(), seen));
    REQUIRE(lists.holders(5) == 2);
    REQUIRE(lists.free_pages() == pages - 8);
  }

  SECTION("pages parked behind the other process's release wait until it settles")
  {
    lists.hold(1, 0, std::int64_t(pages) * ppp / 2);
    int const child = in_child([&] {
      shared_page_lists other(state.memory, bytes, pages, ppp, max_context, max_ids, false, true);
      other.hold(1, 0, std::int64_t(pages) * ppp / 2);
      auto const event = std::make_shared<fake_event>();
      other.drop(1, token(event));  // its stream has not passed the release yet
      seen[0] = 1;
      if (!await(seen[1])) { return 4; }  // the parent tried and was refused
      event->passed = true;
      other.settle();
      seen[2] = 1;
      return await(seen[3]) ? 0 : 5;
    });
    REQUIRE(await(seen[0]));
    lists.drop(1, nullptr);  // the last holder: parked behind the child's token
    REQUIRE(lists.free_pages() == pages);
    REQUIRE_THROWS_WITH(lists.hold(2, 0, std::int64_t(pages) * ppp), Catch::Contains("another process"));
    REQUIRE(lists.holders(2) == 0);
    seen[1] = 1;
    REQUIRE(await(seen[2]));
    REQUIRE(lists.hold(2, 0, std::int64_t(pages) * ppp).size() == pages);  // every page, the parked ones too
    seen[3] = 1;
    REQUIRE(wait_child(child) == 0);
  }

  SECTION("random admissions from both processes at once: no page in two lists, none lost")
  {
    auto churn = [&](shared_page_lists& l, std::uint64_t seed, std::uint64_t first_id) {
      std::mt19937_64 rng(seed);
      std::vector<std::uint64_t> held;
      for (int step = 0; step < 3000; ++step) {
        std::uint64_t const id = first_id + rng() % 24;  // 12 ids of one side, 12 of both
        bool const holds       = std::find(held.begin(), held.end(), id) != held.end();
        try {
          if (holds && rng() % 3 == 0) {
            auto const e = std::make_shared<fake_event>();
            e->passed    = rng() % 2 == 0;
            l.drop(id, token(e));
            held.erase(std::find(held.begin(), held.end(), id));
          } else if (holds) {
            l.grow(id, std::int64_t(rng() % (max_context + 1)));
          } else {
            std::int32_t const length = std::int32_t(id % 8) * 4;
            l.hold(id, length, length + std::int64_t(rng() % 64));
            held.push_back(id);
          }
        } catch (dhisparse::error const&) {
        }
        // Pages of distinct requests never overlap (one consistent view of every list).
        if (step % 50 == 0) {
          std::set<std::int32_t> used;
          for (auto const& list : l.held_lists()) {
            for (auto p : list) {
              if (!used.insert(p).second) { return false; }
            }
          }
        }
      }
      for (auto id : held) { l.drop(id, nullptr); }
      return true;
    };
    std::uint64_t const seed = Catch::rngSeed();
    int const child = in_child([&] {
      shared_page_lists other(state.memory, bytes, pages, ppp, max_context, max_ids, false, true);
      return churn(other, seed + 1, 12) ? 0 : 3;  // ids 12–35
    });
    bool const ok = churn(lists, seed + 2, 0);  // ids 0–23
    REQUIRE(wait_child(child) == 0);
    REQUIRE(ok);
    REQUIRE(lists.requests() == 0);
    REQUIRE(lists.free_pages() == pages);
    REQUIRE(lists.hold(99, 0, std::int64_t(pages) * ppp).size() == pages);  // every parked page came back
  }
}

namespace {

dhisparse::detail::shm_shape segment_test_shape()
{
  dhisparse::detail::shm_shape s{};
  s.capacity_pages  = 16;
  s.page_bytes      = 4096;
  s.row_bytes       = 656;
  s.layout_hash     = dhisparse::detail::shm_layout_hash{}.add(1).add(2).value();
  s.tokens_per_page = 8;
  s.max_context     = 128;
  s.max_ids         = 20;
  return s;
}

/// A name no other run of this test uses at the same time.
std::string segment_test_name(char const* what)
{
  return std::string("test.") + what + "." + std::to_string(::getpid()) + "." +
         std::to_string(std::random_device{}() % 100000);
}

}  // namespace

TEST_CASE("shared host store segment: created in one process, opened in another, same bytes", "[shared_store]")
{
  using dhisparse::detail::shm_segment;
  auto const shape       = segment_test_shape();
  std::string const name = segment_test_name("segment");
  auto layout            = shm_segment::layout(shape, 1000, shape.capacity_pages * shape.page_bytes);
  REQUIRE(layout.lists_offset == dhisparse::detail::shm_header::bytes);
  REQUIRE(layout.lists_bytes == 1000);
  REQUIRE(layout.pages_offset % 4096 == 0);
  REQUIRE(layout.pages_offset >= layout.lists_offset + 1000);
  REQUIRE(layout.segment_bytes >= layout.pages_offset + shape.capacity_pages * shape.page_bytes);

  shm_segment created = shm_segment::create(name, layout);
  // The name is taken while the creator lives.
  REQUIRE_THROWS_WITH(shm_segment::create(name, layout), Catch::Contains("in use"));
  std::byte* pages = created.at(created.layout().pages_offset);
  for (std::size_t i = 0; i < shape.page_bytes; ++i) { pages[i] = std::byte(i * 7); }

  // The child opens before the creator publishes: it waits for readiness, then sees the
  // creator's bytes and writes its own where the creator reads them.
  int const pid = in_child([&] {
    shm_segment opened = shm_segment::open(name, shape, std::chrono::seconds(20));
    std::byte const* p = opened.at(opened.layout().pages_offset);
    for (std::size_t i = 0; i < shape.page_bytes; ++i) {
      if (p[i] != std::byte(i * 7)) { return 3; }
    }
    opened.at(opened.layout().pages_offset)[shape.page_bytes] = std::byte{0x5A};
    opened.header()->writer_backups.fetch_add(5);
    if (opened.owner()) { return 4; }  // an opener never unlinks the name
    return 0;
  });
  ::usleep(50000);
  created.publish();
  REQUIRE(wait_child(pid) == 0);
  REQUIRE(pages[shape.page_bytes] == std::byte{0x5A});
  REQUIRE(created.header()->writer_backups.load() == 5);
  REQUIRE(created.header()->creator_pid == std::int32_t(::getpid()));

  // Another shape is refused, naming both.
  auto other        = shape;
  other.max_context = 256;
  REQUIRE_THROWS_WITH(shm_segment::open(name, other, std::chrono::milliseconds(100)),
                      Catch::Contains("max_context 128") && Catch::Contains("max_context 256"));
  other             = shape;
  other.layout_hash = dhisparse::detail::shm_layout_hash{}.add(2).add(1).value();
  REQUIRE_THROWS_WITH(shm_segment::open(name, other, std::chrono::milliseconds(100)), Catch::Contains("layout"));

  // A name left behind (its creator died: here, a second segment of the name made after an
  // unlink) is removed by name; the creator's destruction then finds nothing to unlink.
  REQUIRE(shm_segment::remove(name));
  REQUIRE_FALSE(shm_segment::remove(name));
  {
    shm_segment again = shm_segment::create(name, layout);  // the name is free again
    REQUIRE(again.owner());
  }
  // The creator's destruction unlinks the name.
  created = shm_segment{};
  REQUIRE_THROWS_WITH(shm_segment::open(name, shape, std::chrono::milliseconds(30)),
                      Catch::Contains("no store named") && Catch::Contains("30 ms"));
}

TEST_CASE("shared host store segment: names are checked, a missing store times out", "[shared_store]")
{
  using dhisparse::detail::shm_segment;
  auto const shape = segment_test_shape();
  for (std::string const& bad : std::vector<std::string>{"", "a/b", "x y", std::string(201, 'n')}) {
    INFO("name '" << bad << "'");
    REQUIRE_THROWS_AS(shm_segment::path_of(bad), dhisparse::error);
  }
  REQUIRE(shm_segment::path_of("replica-0.tp_8") == "/dhisparse.replica-0.tp_8");
  auto const start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(shm_segment::open(segment_test_name("missing"), shape, std::chrono::milliseconds(40)),
                      Catch::Contains("no store named"));
  REQUIRE(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(40));
}
