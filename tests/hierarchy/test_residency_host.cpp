// Load-adaptive residency on the host reference (host/hierarchy.hpp), against independent
// models where one can be written in a few lines: the floor promise, optional residency
// and reclaim under pressure (never a dirty row, never below a floor), fair-share water
// filling, CLOCK's sweep, prewarm, pool limits. The GPU tests compare the GPU with this
// reference decision by decision.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/resident_budget.cuh>

#include "random.hpp"
#include "workload.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

using namespace dhisparse;

namespace {

using row       = row_format::opaque<32>;
constexpr int K = 32;

hierarchy_config base_config(int max_queries, std::int64_t slots)
{
  hierarchy_config c;
  c.group_layers           = {1};
  c.max_requests           = 6;
  c.max_batch              = 6;
  c.max_queries            = max_queries;
  c.max_top_k              = K;
  c.max_context            = 4096;
  c.device_slots_per_group = slots;
  c.map_page_positions     = 64;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = 6 * 4096 / 16;
  return c;
}

/// A decode loop over `h` with the test workload's selections; checks every served slot
/// and returns the OR of the status words.
template <class H>
std::uint32_t decode(H& h, std::mt19937_64& rng, std::uint64_t salt, std::vector<std::uint64_t> const& ids,
                     int steps, int backup_every, std::map<std::uint64_t, std::int32_t>& lengths)
{
  auto const& c = h.config();
  std::vector<request_id> rid;
  for (auto id : ids) { rid.push_back(request_id{id}); }
  std::vector<std::int32_t> queries(ids.size(), 1);
  h.set_batch(rid.data(), queries.data(), int(ids.size()));
  std::vector<std::int32_t> sel(c.step_entries(), -1);
  std::map<std::uint64_t, std::int32_t> focus;
  std::uint32_t status = 0;
  for (int s = 0; s < steps; ++s) {
    for (std::size_t b = 0; b < ids.size(); ++b) {
      std::int32_t& f = focus[ids[b]];
      f = std::clamp<std::int32_t>(f + std::int32_t(rng() % 41) - 20, 0, lengths[ids[b]]);
      test::make_selection(rng, lengths[ids[b]], 0, K, f, sel.data() + b * std::size_t(c.max_queries) * K);
    }
    h.resolve(0, sel.data(), K);
    h.retrieve(0);
    auto rows = h.layer_rows(0, 0);
    for (std::size_t b = 0; b < ids.size(); ++b) {
      for (int k = 0; k < K; ++k) {
        std::int32_t const pos  = sel[b * std::size_t(c.max_queries) * K + k];
        std::int32_t const slot = h.slot_table(0)[b * std::size_t(c.max_queries) * K + k];
        if (pos < 0 || pos >= lengths[ids[b]] || slot < 0) { continue; }
        auto const want = test::truth_group_row(salt, ids[b], 0, 1, row::bytes, pos);
        REQUIRE(std::memcmp(rows.rows + std::size_t(slot) * rows.stride, want.data(), want.size()) == 0);
      }
      std::int32_t const tail = h.tail_slots(0)[b * std::size_t(c.max_queries)];
      if (tail >= 0) {
        auto const row_bytes = test::truth_group_row(salt, ids[b], 0, 1, row::bytes, lengths[ids[b]]);
        std::memcpy(rows.rows + std::size_t(tail) * rows.stride, row_bytes.data(), row_bytes.size());
      }
    }
    h.commit(nullptr);
    if ((s + 1) % backup_every == 0) { h.backup(); }
    for (auto id : ids) { ++lengths[id]; }
    status |= h.status();
    REQUIRE(h.owned_slots(0) + h.free_slots(0) == h.pool_limit(0));
  }
  return status;
}

template <class H>
void admit(H& h, std::uint64_t salt, std::uint64_t id, std::int32_t length, std::int64_t capacity,
           std::map<std::uint64_t, std::int32_t>& lengths)
{
  h.admit(request_id{id}, length, capacity);
  for (std::int32_t p = 0; p < length; ++p) {
    test::truth_row(salt, id, 0, 0, p, h.host_row(request_id{id}, 0, 0, p), row::bytes);
  }
  lengths[id] = length;
}

template <class H>
void check_store(H& h, std::uint64_t salt, std::map<std::uint64_t, std::int32_t> const& lengths)
{
  h.backup();
  for (auto const& [id, len] : lengths) {
    for (std::int32_t p = 0; p < len; ++p) {
      auto const want = test::truth_group_row(salt, id, 0, 1, row::bytes, p);
      REQUIRE(std::memcmp(h.host_row(request_id{id}, 0, 0, p), want.data(), want.size()) == 0);
    }
  }
}

}  // namespace

TEST_CASE("the floor promise: the smallest budget accepted never runs out of slots", "[residency][host]")
{
  // essential floor = K selections + 1 × (4 + 2) with backups every 4 steps.
  auto rng                 = test::seeded_engine("residency host floor");
  std::uint64_t const salt = rng();
  constexpr int floor      = K + 6;
  auto c                   = base_config(1, 3 * floor);
  host::kv_hierarchy<row, policy::lru, policy::static_budget<floor>> h(c);
  std::map<std::uint64_t, std::int32_t> lengths;
  for (std::uint64_t id = 1; id <= 3; ++id) { admit(h, salt, id, 400 + 100 * std::int32_t(id), 2000, lengths); }
  REQUIRE_THROWS_WITH(h.admit(request_id{4}, 10), Catch::Contains("budget floors"));
  REQUIRE(decode(h, rng, salt, {1, 2, 3}, 200, c.backup_interval_steps, lengths) == 0);
  check_store(h, salt, lengths);
  using too_small = host::kv_hierarchy<row, policy::lru, policy::static_budget<floor - 1>>;
  REQUIRE_THROWS_WITH(too_small(c), Catch::Contains("smaller than its essential set"));
}

TEST_CASE("optional residency: spare slots keep rows; pressure reclaims clean rows only", "[residency][host]")
{
  auto rng                 = test::seeded_engine("residency host adaptive");
  std::uint64_t const salt = rng();
  using adaptive           = host::kv_hierarchy<row, policy::lru, policy::adaptive_budget<>>;
  using fixed              = host::kv_hierarchy<row, policy::lru, policy::static_budget<2 * K + 6>>;
  // Low load: a pool far above the floors. The adaptive budget fetches far less than a
  // fixed buffer on the same selections.
  auto c = base_config(1, 6000);
  adaptive a(c);
  fixed f(c);
  std::map<std::uint64_t, std::int32_t> la, lf;
  for (std::uint64_t id = 1; id <= 2; ++id) {
    admit(a, salt, id, 1500, 3000, la);
    admit(f, salt, id, 1500, 3000, lf);
  }
  auto rng_f = rng;
  REQUIRE(decode(a, rng, salt, {1, 2}, 300, 2, la) == 0);
  REQUIRE(decode(f, rng_f, salt, {1, 2}, 300, 2, lf) == 0);
  INFO("adaptive " << a.counters(0).fetch_fraction() << " static " << f.counters(0).fetch_fraction());
  REQUIRE(a.counters(0).fetch_fraction() < 0.5 * f.counters(0).fetch_fraction());
  REQUIRE(a.counters(0).reclaims == 0);

  // High load: the limit drops to the floors + 10%; every step still gets its slots,
  // reclaims release rows, and no committed row is lost (dirty rows are never released:
  // backups run only every third step here).
  a.set_pool_limit(0, a.floor_sum() + a.floor_sum() / 10);
  REQUIRE(a.pool_limit(0) < 6000);
  auto const before = a.counters(0);
  REQUIRE(decode(a, rng, salt, {1, 2}, 300, 3, la) == 0);
  REQUIRE(a.counters(0).reclaims > before.reclaims);
  REQUIRE(a.counters(0).reclaimed_rows > before.reclaimed_rows);
  check_store(a, salt, la);
}

TEST_CASE("fair-share reclaim: water filling over what each request holds above its floor", "[residency][host]")
{
  auto rng                 = test::seeded_engine("residency host fair");
  std::uint64_t const salt = rng();
  using fair               = host::kv_hierarchy<row, policy::lru, policy::adaptive_budget<reclaim_order::fair_share>>;
  auto c                   = base_config(1, 6000);
  fair h(c);
  std::map<std::uint64_t, std::int32_t> lengths;
  // Three requests that touched 100, 400 and 1500 of their rows.
  std::vector<std::int32_t> const touched = {100, 400, 1500};
  for (std::uint64_t id = 1; id <= 3; ++id) {
    admit(h, salt, id, touched[id - 1] + 10, 4000, lengths);
    h.prewarm(request_id{id}, touched[id - 1]);
  }
  auto held = [&] {
    std::vector<long long> out;
    for (std::uint64_t id = 1; id <= 3; ++id) { out.push_back(long(h.resident_positions(request_id{id}, 0).size())); }
    return out;
  };
  auto const start = held();
  REQUIRE(start == std::vector<long long>{100, 400, 1500});
  long long const want = 1200;
  h.reclaim(0, std::int32_t(h.free_slots(0) + want));
  auto const end = held();
  // Model: lower the largest excess (held − floor) first until `want` rows are gone.
  std::vector<long long> excess;
  for (std::uint64_t id = 1; id <= 3; ++id) { excess.push_back(start[id - 1] - h.floor(request_id{id})); }
  std::vector<long long> give(3, 0);
  for (long long n = 0; n < want; ++n) {
    int best = 0;
    for (int r = 1; r < 3; ++r) {
      if (excess[r] - give[r] > excess[best] - give[best]) { best = r; }
    }
    ++give[best];
  }
  for (int r = 0; r < 3; ++r) {
    INFO("request " << r + 1);
    REQUIRE(start[r] - end[r] == give[r]);
  }
  REQUIRE(h.counters(0).reclaimed_rows == std::uint64_t(want));
}

TEST_CASE("CLOCK: victims follow an independent second-chance sweep", "[residency][host]")
{
  auto rng = test::seeded_engine("residency host clock");
  constexpr int budget = 2 * K + 6;
  auto c               = base_config(1, 6 * budget);
  host::kv_hierarchy<row, policy::clock, policy::static_budget<budget>> h(c);
  std::int32_t length = 1500;
  request_id const id{9};
  h.admit(id, length, 3000);
  std::int32_t const one = 1;
  h.set_batch(&id, &one, 1);
  // Model: positions in the order their slots were taken, a reference bit each, a hand.
  std::vector<std::int32_t> ring;  // position held by each owned slot, in owned-list order
  std::vector<bool> referenced;
  std::size_t hand = 0;
  std::set<std::int32_t> dirty;  // committed tails not yet backed up
  std::vector<std::int32_t> sel(c.step_entries(), -1);
  std::int32_t focus = 700;
  for (int t = 0; t < 300; ++t) {
    focus = std::clamp<std::int32_t>(focus + std::int32_t(rng() % 61) - 30, 0, length);
    test::make_selection(rng, length, 0, K, focus, sel.data());
    std::set<std::int32_t> chosen, missed;
    for (int k = 0; k < K && sel[k] >= 0; ++k) {
      if (sel[k] < length) { chosen.insert(sel[k]); }
    }
    std::set<std::size_t> pinned;
    for (std::size_t i = 0; i < ring.size(); ++i) {
      if (chosen.count(ring[i])) {
        referenced[i] = true;
        pinned.insert(i);
      }
    }
    for (auto p : chosen) {
      if (std::find(ring.begin(), ring.end(), p) == ring.end()) { missed.insert(p); }
    }
    std::vector<std::int32_t> rows = {length};  // the tail first, then misses ascending
    rows.insert(rows.end(), missed.begin(), missed.end());
    std::size_t next = 0;
    while (ring.size() < std::size_t(budget) && next < rows.size()) {
      ring.push_back(rows[next++]);
      referenced.push_back(true);
      pinned.insert(ring.size() - 1);
    }
    for (std::size_t steps = 0; next < rows.size() && steps < 2 * ring.size(); ++steps) {
      std::size_t const i = hand;
      hand                = (hand + 1) % ring.size();
      if (pinned.count(i) || dirty.count(ring[i])) { continue; }
      if (referenced[i]) {
        referenced[i] = false;
        continue;
      }
      ring[i]       = rows[next++];
      referenced[i] = true;
      pinned.insert(i);
    }
    h.resolve(0, sel.data(), K);
    REQUIRE(h.misses(0).size() == missed.size());
    h.commit(nullptr);
    dirty.insert(length);
    if (t % 2 == 1) {
      h.backup();
      dirty.clear();
    }
    ++length;
    std::vector<std::int32_t> expect(ring.begin(), ring.end());
    std::sort(expect.begin(), expect.end());
    REQUIRE(h.resident_positions(id, 0) == expect);
  }
  REQUIRE(h.status() == 0);
}

TEST_CASE("prewarm brings the most recent rows in with spare slots; pool limits move rows", "[residency][host]")
{
  auto rng                 = test::seeded_engine("residency host prewarm");
  std::uint64_t const salt = rng();
  auto c                   = base_config(1, 900);
  host::kv_hierarchy<row, policy::lru, policy::adaptive_budget<>> h(c);
  std::map<std::uint64_t, std::int32_t> lengths;
  admit(h, salt, 1, 2000, 3000, lengths);
  h.prewarm(request_id{1}, 500);
  auto const resident = h.resident_positions(request_id{1}, 0);
  REQUIRE(resident.size() == 500);
  REQUIRE(resident.front() == 1500);
  REQUIRE(resident.back() == 1999);
  REQUIRE(h.counters(0).prewarmed_rows == 500);
  // Only spare slots: the rest of the pool.
  h.prewarm_range(request_id{1}, 0, 0, 1500);
  REQUIRE(h.free_slots(0) == 0);
  REQUIRE(h.resident_positions(request_id{1}, 0).size() == 900);
  // The engine takes memory back: down to 300 slots, rows released without a copy.
  h.set_pool_limit(0, 300);
  REQUIRE(h.owned_slots(0) + h.free_slots(0) == 300);
  REQUIRE_THROWS_WITH(h.set_pool_limit(0, h.floor_sum() - 1), Catch::Contains("below the budget floors"));
  REQUIRE(decode(h, rng, salt, {1}, 50, 2, lengths) == 0);
  h.set_pool_limit(0, 900);
  REQUIRE(decode(h, rng, salt, {1}, 50, 2, lengths) == 0);
  check_store(h, salt, lengths);
}
