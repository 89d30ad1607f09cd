// dhisparse-sim's core (tools/sim/simulator.hpp) on small drift workloads: a static budget
// fetches exactly what the host reference driven directly fetches, and the run-time H
// decides as policy::static_budget<H> for every eviction policy; adaptive budgets at a
// pool that holds the live KV fetch less than static and reclaim nothing, under pressure
// they reclaim and keep the slot accounting; a trace written from a workload replays to
// the same counters; requests arrive and leave as a trace says, and a trace whose
// lengths contradict its commits, or requests that do not fit, are reported. Verify steps
// commit their recorded accepted counts.
#include <catch2/catch.hpp>

#include <simulator.hpp>
#include <workload.hpp>

#include <common/drift.hpp>
#include <common/drift_lru.hpp>

#include <dhisparse/policy/static_budget.cuh>

#include "random.hpp"
#include "random_trace.hpp"

#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace sim = dhisparse::sim;
using dhisparse::group_counters;
using dhisparse::request_id;
using dhisparse::bench::drift_config;

namespace {

/// B requests of a 12 000-token context, K = 512 (`wide`: 30 000 tokens, K = 2048, so
/// that a 4096-row buffer fills within a few steps and evicts).
drift_config small_drift(int requests, int queries, bool wide = false)
{
  drift_config c;
  c.context  = wide ? 30000 : 12000;
  c.top_k    = wide ? 2048 : 512;
  c.requests = requests;
  c.queries  = queries;
  c.seed     = dhisparse::test::fresh_seed();
  return c;
}

bool same_counters(group_counters const& a, group_counters const& b)
{
  return a.selected_rows == b.selected_rows && a.fetched_rows == b.fetched_rows && a.tail_rows == b.tail_rows &&
         a.evicted_rows == b.evicted_rows && a.reclaimed_rows == b.reclaimed_rows && a.reclaims == b.reclaims &&
         a.prewarmed_rows == b.prewarmed_rows && a.backed_up_rows == b.backed_up_rows;
}

bool same_run(sim::run_result const& a, sim::run_result const& b)
{
  return same_counters(a.counters, b.counters) && a.tokens == b.tokens && a.selections == b.selections &&
         a.admitted == b.admitted && a.refused == b.refused && a.status == b.status && a.error == b.error;
}

}  // namespace

TEST_CASE("a static budget fetches what the host reference driven directly fetches", "[sim]")
{
  drift_config const c = small_drift(2, 1, true);
  INFO("seed " << c.seed);
  int const warmup = 8, steps = 40;
  auto w          = sim::make_drift_workload(c, warmup + steps, false);
  auto const plan = sim::request_plan::of(w, 0);
  sim::run_config rc;
  rc.pool_slots   = 4096 * 2;  // what measure_lru_fetch gives its buffer
  rc.warmup_steps = warmup;
  rc.static_slots = 4096;
  auto const r = sim::simulate(w, plan, sim::eviction::lru, sim::budget::static_slots, rc);
  // bench/common/drift_lru.hpp drives host::kv_hierarchy<opaque<16>, lru, static_budget<4096>>
  // with its own loop over its own drift_generator.
  auto const direct = dhisparse::bench::measure_lru_fetch(c, warmup, steps);
  CHECK(r.error.empty());
  CHECK(r.counters.evicted_rows > 0);  // the buffer is under pressure: the comparison means something
  CHECK(direct.fetched > 0);
  CHECK(r.selections == direct.selected);
  CHECK(r.counters.fetched_rows == direct.fetched);
  CHECK(r.tokens == std::uint64_t(steps) * 2);
  CHECK(r.measured_steps == std::uint64_t(steps));
  CHECK(r.status == 0);
}

TEMPLATE_TEST_CASE("the run-time static budget decides as static_budget<H>", "[sim]", dhisparse::policy::lru,
                   dhisparse::policy::clock, dhisparse::policy::lfu_decay<>, dhisparse::policy::score_ema<>)
{
  drift_config const c = small_drift(2, 2);
  INFO("seed " << c.seed);
  auto w          = sim::make_drift_workload(c, 36, true);
  auto const plan = sim::request_plan::of(w, 0);
  sim::run_config rc;
  rc.pool_slots   = 3 * 2048;
  rc.warmup_steps = 6;
  rc.static_slots = 2048;
  auto const runtime  = sim::simulate<TestType, sim::static_slots_budget>(w, plan, rc);
  auto const compiled = sim::simulate<TestType, dhisparse::policy::static_budget<2048>>(w, plan, rc);
  CHECK(runtime.error.empty());
  CHECK(runtime.counters.evicted_rows > 0);
  CHECK(same_run(runtime, compiled));
  CHECK(sim::static_slots_budget::slots() == 4096);  // the scope restored the default
  rc.static_slots = 1536;                             // another H decides otherwise
  auto const smaller = sim::simulate<TestType, sim::static_slots_budget>(w, plan, rc);
  CHECK(smaller.error.empty());
  CHECK(smaller.counters.fetched_rows > runtime.counters.fetched_rows);
  CHECK(same_run(smaller, sim::simulate<TestType, dhisparse::policy::static_budget<1536>>(w, plan, rc)));
}

TEST_CASE("adaptive budgets with the live KV in the pool fetch less than static and reclaim nothing", "[sim]")
{
  drift_config const c = small_drift(3, 1, true);
  INFO("seed " << c.seed);
  auto w          = sim::make_drift_workload(c, 48, false);
  auto const plan = sim::request_plan::of(w, 0);
  REQUIRE(plan.live_kv == 3 * (std::int64_t(c.context) + 48));
  sim::run_config rc;
  rc.pool_slots   = plan.live_kv;
  rc.warmup_steps = 8;
  rc.static_slots = 4096;
  auto const fixed = sim::simulate(w, plan, sim::eviction::lru, sim::budget::static_slots, rc);
  CHECK(fixed.counters.evicted_rows > 0);
  for (auto b : {sim::budget::global, sim::budget::fair_share}) {
    INFO(sim::name(b));
    auto const r = sim::simulate(w, plan, sim::eviction::lru, b, rc);
    CHECK(r.status == 0);
    CHECK(r.counters.reclaimed_rows == 0);
    CHECK(r.counters.evicted_rows == 0);
    CHECK(r.counters.selected_rows == fixed.counters.selected_rows);
    CHECK(r.fetch_fraction() < fixed.fetch_fraction());
    // With the whole context prewarmed (prefill left on the device) nothing is fetched,
    // counting from the first step.
    sim::run_config prewarmed = rc;
    prewarmed.prewarm_rows    = -1;
    prewarmed.warmup_steps    = 0;
    auto const warmed         = sim::simulate(w, plan, sim::eviction::lru, b, prewarmed);
    CHECK(warmed.counters.prewarmed_rows == 3 * std::uint64_t(c.context));
    CHECK(warmed.counters.fetched_rows == 0);
  }
}

TEST_CASE("under pressure global and fair-share reclaim and keep the slot accounting", "[sim]")
{
  drift_config const c = small_drift(3, 1);
  INFO("seed " << c.seed);
  auto w          = sim::make_drift_workload(c, 40, false);
  auto const plan = sim::request_plan::of(w, 0);
  std::int64_t const floor = dhisparse::essential_floor({plan.max_capacity, 1, c.top_k, 1});
  sim::run_config rc;
  rc.pool_slots   = 3 * floor + 3 * floor / 10;  // BENCH.md's high load: the sum of floors + 10%
  rc.warmup_steps = 4;
  std::vector<sim::run_result> runs;
  for (auto b : {sim::budget::global, sim::budget::fair_share}) {
    INFO(sim::name(b));
    int violations = 0;
    auto const check = [&](auto const& h, std::uint64_t) {
      std::int64_t resident = 0, live = 0;
      for (int r = 1; r <= 3; ++r) {  // (all are released after the last step)
        if (!h.contains(request_id(r))) { continue; }
        ++live;
        resident += std::int64_t(h.resident_positions(request_id(r), 0).size());
      }
      std::int64_t const owned = h.owned_slots(0);
      bool const ok = owned + h.free_slots(0) == rc.pool_slots && h.floor_sum() == live * floor &&
                      resident <= owned && owned - resident <= live /* spare tail slots: Q = 1 each */ &&
                      (live > 0 || owned == 0);
      violations += ok ? 0 : 1;
    };
    auto const r = sim::simulate(w, plan, sim::eviction::lru, b, rc, check);
    CHECK(violations == 0);
    CHECK(r.status == 0);
    CHECK(r.refused == 0);
    CHECK(r.counters.reclaimed_rows > 0);
    CHECK(r.counters.reclaims > 0);
    CHECK(r.counters.evicted_rows == 0);
    runs.push_back(r);
  }
  CHECK(runs[0].counters.selected_rows == runs[1].counters.selected_rows);
}

TEST_CASE("a trace written from a workload replays to the same counters", "[sim]")
{
  // Verify steps: three queries, each draft accepted with probability 0.6.
  drift_config const c = small_drift(3, 3);
  INFO("seed " << c.seed);
  auto generated = sim::make_drift_workload(c, 30, true, 0.6);
  REQUIRE(generated.shape().accepted);
  dhisparse::test::scratch_file file("sim_replay");
  CHECK(sim::write_trace(generated, file.path()) == 30);
  sim::trace_workload replayed(file.path());
  CHECK(replayed.shape() == generated.shape());
  int const warmup = 5;
  for (int concurrency : {0, 2}) {
    auto const plan  = sim::request_plan::of(generated, concurrency);
    auto const plan2 = sim::request_plan::of(replayed, concurrency);
    CHECK(plan2.live_kv == plan.live_kv);
    CHECK(int(plan.requests.size()) == (concurrency == 0 ? 3 : 2));
    std::uint64_t accepted = 0;  // the tokens the measured steps commit
    for (std::size_t step = warmup; step < generated.steps().size(); ++step) {
      for (std::size_t r = 0; r < plan.requests.size(); ++r) { accepted += generated.steps()[step].requests[r].accepted; }
    }
    CHECK(accepted < std::uint64_t(30 - warmup) * plan.requests.size() * 3);  // some drafts were rejected
    for (auto e : sim::all_evictions) {
      for (auto b : sim::all_budgets) {
        INFO(sim::name(e) << " / " << sim::name(b) << " at concurrency " << concurrency);
        sim::run_config rc;
        rc.pool_slots   = plan.live_kv / 4;
        rc.warmup_steps = warmup;
        rc.static_slots = 2048;
        auto const a = sim::simulate(generated, plan, e, b, rc);
        auto const r = sim::simulate(replayed, plan2, e, b, rc);
        CHECK(a.error.empty());
        CHECK(a.counters.fetched_rows > 0);
        CHECK(a.tokens == accepted);
        CHECK(same_run(a, r));
      }
    }
  }
}

TEST_CASE("requests are admitted when they first appear and released after their last step", "[sim]")
{
  // id: first step, last step, initial length; two queries per step, all accepted.
  struct life {
    std::uint64_t id;
    int first, last;
    std::int32_t length;
  };
  std::vector<life> const lives = {{7, 0, 2, 300}, {9, 1, 4, 500}, {11, 3, 5, 100}, {13, 5, 5, 50}};
  dhisparse::trace::shape s;
  s.max_requests = 3;
  s.max_queries  = 2;
  s.top_k        = 16;
  auto rng = dhisparse::test::seeded_engine("sim arrivals");
  std::vector<dhisparse::trace::step_record> steps(6);
  for (int step = 0; step < 6; ++step) {
    auto& rec = steps[std::size_t(step)];
    rec.step  = std::uint64_t(step);
    for (auto const& l : lives) {
      if (step < l.first || step > l.last) { continue; }
      std::int32_t const length = l.length + 2 * (step - l.first);
      rec.requests.push_back({request_id(l.id), length, 2, -1});
      for (int q = 0; q < 2; ++q) {
        for (int k = 0; k < s.top_k; ++k) {
          rec.positions.push_back(std::uniform_int_distribution<std::int32_t>(0, length + q)(rng));
        }
      }
    }
  }
  sim::memory_workload w(s, steps, "arrivals");
  auto const plan = sim::request_plan::of(w, 0);
  REQUIRE(plan.requests.size() == 4);
  CHECK(plan.max_live == 2);
  CHECK(plan.max_batch == 2);
  CHECK(plan.requests[1].first_step == 1);
  CHECK(plan.requests[1].last_step == 4);
  CHECK(plan.requests[1].capacity == 500 + 2 * 3 + 2);
  CHECK(plan.max_capacity == 508);
  CHECK(plan.live_kv == (300 + 4 + 2) + (500 + 2 + 2));  // step 2: ids 7 and 9

  std::vector<std::size_t> live;
  sim::run_config rc;
  rc.pool_slots = 4096;
  auto const r  = sim::simulate(w, plan, sim::eviction::lru, sim::budget::global, rc,
                                [&](auto const& h, std::uint64_t) { live.push_back(h.num_requests()); });
  CHECK(live == std::vector<std::size_t>{1, 2, 1, 2, 1, 0});  // each released after its last step
  CHECK(r.admitted == 4);
  CHECK(r.tokens == 2 * (3 + 4 + 3 + 1));
  CHECK(r.status == 0);

  // The first two requests only: 11 and 13 are not replayed.
  auto const two = sim::request_plan::of(w, 2);
  CHECK(two.requests.size() == 2);
  auto const r2 = sim::simulate(w, two, sim::eviction::lru, sim::budget::global, rc);
  CHECK(r2.tokens == 2 * (3 + 4));

  // A recorded length that its commits did not produce.
  steps[2].requests[1].length += 1;  // id 9 at step 2
  sim::memory_workload broken(s, steps, "broken");
  CHECK_THROWS_WITH(sim::simulate(broken, sim::request_plan::of(broken, 0), sim::eviction::lru, sim::budget::global, rc),
                    Catch::Contains("step 2, request 9: recorded length 503, but it committed 502 tokens"));
}

TEST_CASE("requests whose floors do not fit are refused and left out", "[sim]")
{
  drift_config const c = small_drift(3, 1);
  auto w          = sim::make_drift_workload(c, 12, false);
  auto const plan = sim::request_plan::of(w, 0);
  sim::run_config rc;
  rc.pool_slots   = 2 * 4096 + 100;  // two static floors of 4096, not three
  rc.static_slots = 4096;
  auto const r = sim::simulate(w, plan, sim::eviction::lru, sim::budget::static_slots, rc);
  CHECK(r.admitted == 2);
  CHECK(r.refused == 1);
  CHECK(r.tokens == 2 * 12);
  CHECK(r.selections == 2 * 12 * std::uint64_t(c.top_k));
  rc.pool_slots = 4000;  // not even one floor: no hierarchy
  auto const none = sim::simulate(w, plan, sim::eviction::lru, sim::budget::static_slots, rc);
  CHECK_THAT(none.error, Catch::Contains("too small for the essential floor"));
  CHECK(none.refused == 3);
  CHECK(none.selections == 0);
  CHECK_THROWS_WITH(sim::simulate(w, plan, sim::eviction::score_ema, sim::budget::global, rc),
                    Catch::Contains("needs selection scores"));
}
