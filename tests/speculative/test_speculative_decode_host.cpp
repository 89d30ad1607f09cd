// End-to-end exactness of speculative decoding over the host reference hierarchy (issue
// 14, item 5; tests/speculative/e2e.hpp): chains and trees, per-request draft lengths,
// small pools with per-request (static) and shared (adaptive) budgets, requests coming and
// going, ≥ 1000 steps each (DHISPARSE_E2E_STEPS overrides), against plain greedy decoding
// with every row resident.
#include "e2e.hpp"
#include "random.hpp"

#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/policy/static_budget.cuh>

#include <catch2/catch.hpp>

using namespace dhisparse;
using examples::tiny_model;

namespace {

using test::e2e_adaptive_slots;
using test::e2e_budget;
using test::e2e_config;
using test::e2e_resident_slots;

using resident = examples::host_ops<host::kv_hierarchy<tiny_model::row, policy::lru, policy::resident_budget>>;

template <class Spec>
void run(examples::speculation s, std::int64_t slots, char const* what)
{
  auto seeds = test::seeded_engine(what);
  test::e2e_options o;
  o.steps = test::e2e_steps(1000);
  o.spec  = s;
  o.seed  = seeds();
  tiny_model const model({1, 1}, 32, o.seed);
  resident ref(e2e_config(e2e_resident_slots), 8);
  Spec spec(e2e_config(slots), 8);
  auto const stats = test::run_e2e(ref, spec, model, o);
  REQUIRE(stats.fetched > 0);
  REQUIRE(stats.evicted + stats.reclaimed > 0);  // the pools are small: rows are dropped and fetched again
}

}  // namespace

TEST_CASE("speculative decoding over small pools emits plain greedy decoding's tokens (host)", "[speculative][e2e]")
{
  SECTION("chains, static budget (HiSparse buffer), LRU")
  {
    using spec = examples::host_ops<host::kv_hierarchy<tiny_model::row, policy::lru, policy::static_budget<e2e_budget>>>;
    run<spec>({4, false, 0.7}, 8 * e2e_budget + 16, "e2e host chain static");
  }
  SECTION("trees, static budget, CLOCK")
  {
    using spec = examples::host_ops<host::kv_hierarchy<tiny_model::row, policy::clock, policy::static_budget<e2e_budget>>>;
    run<spec>({6, true, 0.7}, 8 * e2e_budget + 16, "e2e host tree static");
  }
  SECTION("chains, adaptive budget (global reclaim)")
  {
    using spec = examples::host_ops<host::kv_hierarchy<tiny_model::row, policy::lru, policy::adaptive_budget<>>>;
    run<spec>({4, false, 0.6}, e2e_adaptive_slots, "e2e host chain adaptive");
  }
  SECTION("trees, adaptive budget (fair-share reclaim)")
  {
    using spec = examples::host_ops<
      host::kv_hierarchy<tiny_model::row, policy::lru, policy::adaptive_budget<reclaim_order::fair_share>>>;
    run<spec>({6, true, 0.8}, e2e_adaptive_slots, "e2e host tree adaptive");
  }
}
