// Load-adaptive residency on the GPU against the host reference, under random operation
// sequences with pressure swings: admission storms (refusals must match and change
// nothing), releases, pool limits down and up, prewarm, explicit reclaims, verify steps
// with random accepted counts, selections in any order with repeats and holes. After every
// operation: the same resident rows for every request (every eviction and reclaim
// decision), exact bytes, counters, free + owned = limit. For every eviction policy with
// the static budget and with the adaptive budgets, and for the resident budget.
#include "random.hpp"
#include "twin.cuh"

#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lfu_decay.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/policy/score_ema.cuh>

#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

using namespace dhisparse;
using test::stream_guard;
using test::test_scale;

namespace {

constexpr int K = 64;
using row       = row_format::opaque<64>;

/// `ReclaimSample`: `hierarchy_config::reclaim_sample_slots` (speed only; the variants with a
/// tiny sample reach reclaim's pass over the rows above a bound that holds too few).
/// `ReclaimBlocks`: `hierarchy_config::reclaim_blocks` (speed only; resolve's reclaim then
/// runs with a team of one block, or with more blocks than fit on the device, whose team
/// is sealed by the first block's wait running out).
template <class Eviction, class Budget, int ReclaimSample = 16384, int ReclaimBlocks = 0>
struct combo {
  using eviction                      = Eviction;
  using budget                        = Budget;
  static constexpr int reclaim_sample = ReclaimSample;
  static constexpr int reclaim_blocks = ReclaimBlocks;
};

using static_lru      = combo<policy::lru, policy::static_budget<256>>;
using static_clock    = combo<policy::clock, policy::static_budget<256>>;
using static_lfu      = combo<policy::lfu_decay<16>, policy::static_budget<256>>;
using adaptive_lru    = combo<policy::lru, policy::adaptive_budget<>>;
using fair_lru        = combo<policy::lru, policy::adaptive_budget<reclaim_order::fair_share>>;
using adaptive_clock  = combo<policy::clock, policy::adaptive_budget<>>;
using lru_sample_2    = combo<policy::lru, policy::adaptive_budget<>, 2>;
using clock_sample_16 = combo<policy::clock, policy::adaptive_budget<>, 16>;
using lru_no_sample   = combo<policy::lru, policy::adaptive_budget<>, 0>;
using adaptive_scores = combo<policy::score_ema<1, 4, 20>, policy::adaptive_budget<reclaim_order::fair_share>>;
using resident        = combo<policy::lru, policy::resident_budget>;
using lru_one_block   = combo<policy::lru, policy::adaptive_budget<>, 16384, 1>;
using fair_wide_grid  = combo<policy::lru, policy::adaptive_budget<reclaim_order::fair_share>, 16384, 4096>;

template <class Budget>
hierarchy_config residency_config()
{
  hierarchy_config c;
  c.group_layers          = {1, 2};
  c.max_requests          = 8;
  c.max_batch             = 6;
  c.max_queries           = 3;
  c.max_top_k             = K;
  c.max_context           = 4096;
  c.map_page_positions    = 256;
  c.host.tokens_per_page  = 32;
  c.host.capacity_pages   = 8 * 4096 / 32;
  c.backup_interval_steps = 4;
  c.reclaim_batch         = 24;
  if constexpr (Budget::kind == budget_kind::per_request) {
    c.device_slots_per_group = 8 * 256;
  } else if constexpr (Budget::reclaim == reclaim_order::none) {
    c.device_slots_per_group = 9000;  // resident: whole capacities
  } else {
    c.device_slots_per_group = 1400;  // adaptive: a few floors (≤ 210 each) and some spare
    c.reclaim_low_watermark  = 8;
  }
  return c;
}

}  // namespace

TEMPLATE_TEST_CASE("random operations under pressure: GPU and reference make the same decisions",
                   "[residency][gpu]", static_lru, static_clock, static_lfu, adaptive_lru, fair_lru, adaptive_clock,
                   adaptive_scores, resident, lru_sample_2, clock_sample_16, lru_no_sample, lru_one_block,
                   fair_wide_grid)
{
  using Eviction = typename TestType::eviction;
  using Budget   = typename TestType::budget;
  auto rng                 = test::seeded_engine("residency gpu random ops");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config                 = residency_config<Budget>();
  config.reclaim_sample_slots = TestType::reclaim_sample;
  config.reclaim_blocks       = TestType::reclaim_blocks;
  test::twin<row, Eviction, Budget> t(config, salt, stream.s);
  std::vector<std::uint64_t> live;
  std::uint64_t next_id = 1;
  int since_backup      = 0;
  int refused           = 0;
  int const steps       = 40 * test_scale();
  for (int step = 0; step < steps; ++step) {
    // Admission storm every 10 steps, single arrivals otherwise.
    int const arrivals = step % 10 == 0 ? 4 : int(rng() % 3 == 0);
    for (int a = 0; a < arrivals && int(live.size()) < config.max_requests; ++a) {
      std::int32_t const length = 50 + std::int32_t(rng() % 2000);
      std::int64_t const cap    = length + 100 + std::int64_t(rng() % 400);
      if (t.try_admit(next_id, length, cap)) {
        live.push_back(next_id);
        if (rng() % 3 == 0) { t.prewarm(next_id, std::int32_t(rng() % 600)); }
      } else {
        ++refused;
      }
      ++next_id;
    }
    if (live.size() > 2 && rng() % 4 == 0) {  // a departure
      std::size_t const i = rng() % live.size();
      t.release(live[i]);
      live.erase(live.begin() + std::ptrdiff_t(i));
    }
    if (rng() % 6 == 0) {  // the engine takes memory back, or gives it
      int const g             = int(rng() % config.num_groups());
      std::int64_t const low  = std::max<std::int64_t>(t.gpu().floor_sum(), 1);
      std::int64_t const high = config.device_slots_per_group;
      // Lowering a limit backs group g up, raising it backs nothing up: the cadence below
      // keeps every group within the dirty list's backup_interval_steps either way.
      t.set_pool_limit(g, low + std::int64_t(rng() % std::uint64_t(high - low + 1)));
    }
    if constexpr (Budget::kind == budget_kind::shared && Budget::reclaim != reclaim_order::none) {
      if (rng() % 8 == 0) { t.reclaim(int(rng() % config.num_groups()), std::int32_t(rng() % 400)); }
    }
    if (live.empty()) { continue; }
    // A batch of live requests, some verifying drafts.
    std::vector<std::uint64_t> batch = live;
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(std::min<std::size_t>(batch.size(), std::size_t(config.max_batch)));
    std::vector<std::int32_t> queries, accepted;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      queries.push_back(1 + std::int32_t(rng() % config.max_queries));
      accepted.push_back(std::int32_t(rng() % (queries.back() + 1)));
    }
    // Requests grow their capacity now and then (refused alike when floors would not fit).
    for (auto id : batch) {
      if (rng() % 5 == 0) { t.try_reserve(id, std::min(t.lengths()[id] + 200, config.max_context)); }
    }
    t.set_batch(batch, queries);
    t.style() = {rng() % 2 == 0, rng() % 3 == 0, rng() % 3 == 0};
    bool const backup = since_backup >= 2 || rng() % 2 == 0;
    t.step(rng, K - int(rng() % 8), rng() % 2 == 0 ? &accepted : nullptr, backup);
    since_backup = backup ? 0 : since_backup + 1;
    std::uint32_t const status = t.gpu().status_sync(stream.s);
    // A status other than tails beyond capacity would mean a broken floor promise.
    REQUIRE((status & ~std::uint32_t(status_capacity_exceeded)) == 0);
    t.gpu().clear_status(stream.s);
    t.ref().clear_status();
  }
  INFO("admissions refused for lack of floor room: " << refused);
  t.check_host_store();
  group_counters c{};
  t.gpu().read_counters(0, &c, stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
  REQUIRE(c.selected_rows > 0);
  if constexpr (Budget::kind == budget_kind::per_request) { REQUIRE(c.reclaims == 0); }
  if constexpr (Budget::reclaim == reclaim_order::none) { REQUIRE(c.reclaimed_rows == 0); }
}

TEST_CASE("adaptive residency keeps rows while the pool is spare, and reclaims inside a CUDA graph",
          "[residency][gpu][graph]")
{
  // Low load first: optional rows stay, the fetch fraction falls far below a static
  // buffer's. Then more requests arrive and the same captured step reclaims on its own.
  auto rng                 = test::seeded_engine("residency gpu graph");
  std::uint64_t const salt = rng();
  stream_guard stream;
  using budget = policy::adaptive_budget<>;
  auto config  = residency_config<budget>();
  test::twin<row, policy::lru, budget> t(config, salt, stream.s);
  t.admit(1, 1500, 4000);
  t.admit(2, 900, 4000);
  t.set_batch({1, 2}, {1, 1});
  for (int s = 0; s < 5; ++s) { t.step(rng, K, nullptr, true); }  // eager warm-up

  decltype(t)::layers_graph layers(t, K, true);  // resolve_and_retrieve: the copy inside allocate
  int const steps = 12 * test_scale();
  for (int s = 0; s < steps; ++s) {
    if (s == steps / 2) {  // load arrives: three more requests share the pool
      for (std::uint64_t id = 3; id <= 5; ++id) { t.admit(id, 1800, 4000); }
      t.set_batch({1, 2, 3, 4, 5}, {1, 1, 1, 1, 1});
    }
    layers.replay(rng);
    t.finish_step(nullptr, true);
  }
  group_counters c{};
  t.gpu().read_counters(0, &c, stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
  REQUIRE(c.reclaims > 0);  // the graph's reclaim kernel ran for real
  REQUIRE(c.reclaimed_rows > 0);
  t.check_host_store();
}

TEST_CASE("bad inputs of adaptive residency: clear errors, nothing changed", "[residency][gpu]")
{
  auto rng                 = test::seeded_engine("residency gpu bad input");
  std::uint64_t const salt = rng();
  stream_guard stream;
  using scores_budget = policy::adaptive_budget<>;
  auto config         = residency_config<scores_budget>();
  test::twin<row, policy::score_ema<>, scores_budget> t(config, salt, stream.s);
  t.admit(1, 800, 1200);
  t.set_batch({1}, {1});
  auto& gpu = t.gpu();
  // score_ema needs the indexer's scores.
  REQUIRE_THROWS_WITH(gpu.resolve(0, t.d_selections().data(), K, stream.s), Catch::Contains("scores"));
  // A pool limit below the admitted floors, or above the slab.
  REQUIRE_THROWS_WITH(gpu.set_pool_limit(0, gpu.floor_sum() - 1, stream.s), Catch::Contains("below the budget floors"));
  REQUIRE_THROWS_WITH(gpu.set_pool_limit(0, config.device_slots_per_group + 1, stream.s),
                      Catch::Contains("device_slots_per_group"));
  REQUIRE_THROWS_WITH(gpu.set_pool_limit(5, 100, stream.s), Catch::Contains("group 5"));
  REQUIRE_THROWS_WITH(gpu.prewarm_range(request_id{1}, 0, -1, 4, stream.s), Catch::Contains("negative"));
  REQUIRE(gpu.pool_limit(0) == config.device_slots_per_group);
  // Admission beyond the floors the pool can hold.
  t.set_pool_limit(0, gpu.floor_sum() + 50);
  REQUIRE_THROWS_WITH(gpu.admit(request_id{2}, 500, stream.s), Catch::Contains("budget floors"));
  REQUIRE(!gpu.contains(request_id{2}));
  for (int s = 0; s < 4 * test_scale(); ++s) { t.step(rng, K, nullptr, true); }
  t.set_pool_limit(0, config.device_slots_per_group);
  t.admit(2, 500, 1200);
  t.set_batch({1, 2}, {1, 1});
  for (int s = 0; s < 4 * test_scale(); ++s) { t.step(rng, K, nullptr, true); }
  t.check_host_store();
}
