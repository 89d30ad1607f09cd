// Soak on the host reference (issue 18, item 1): the CI-sized run of tests/soak/soak.hpp
// under three policy combinations. DHISPARSE_SOAK_STEPS sets the steps per combination
// (default 3000), DHISPARSE_TEST_SEED the seed; each run prints its report.
#include <catch2/catch.hpp>

#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/score_ema.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>

#include "host_backend.hpp"
#include "random.hpp"
#include "soak.hpp"
#include "soak_config.hpp"

#include <cstdio>
#include <string>

using namespace dhisparse;
using row = row_format::opaque<64>;

namespace {

template <class Eviction, class Budget>
void soak_host(char const* name)
{
  test::soak::host_backend<row, Eviction, Budget> backend(test::soak::config());
  test::soak::options o;
  o.seed  = test::fresh_seed();
  o.steps = test::soak::steps_from_env(3000);
  test::soak::report const r = test::soak::driver<decltype(backend)>(backend, o).run();
  std::printf("soak host %s: %s\n", name, r.summary().c_str());
  for (auto const& m : r.messages) { std::printf("  violation: %s\n", m.c_str()); }
  INFO(name << ": " << r.summary() << " (set DHISPARSE_TEST_SEED=" << r.seed << " to replay)");
  for (auto const& m : r.messages) { UNSCOPED_INFO(m); }
  CHECK(r.violations == 0);
  CHECK(r.steps == o.steps);
  CHECK(r.admitted > 0);
  CHECK(r.released > 0);
  CHECK(r.committed_rows > 0);
}

}  // namespace

TEST_CASE("soak: host reference, LRU, adaptive budget with global reclaim", "[soak]")
{
  soak_host<policy::lru, policy::adaptive_budget<reclaim_order::global>>("lru/adaptive<global>");
}

TEST_CASE("soak: host reference, score EMA, adaptive budget with fair-share reclaim", "[soak]")
{
  soak_host<policy::score_ema<>, policy::adaptive_budget<reclaim_order::fair_share>>("score_ema/adaptive<fair_share>");
}

TEST_CASE("soak: host reference, CLOCK, static budget (HiSparse)", "[soak]")
{
  soak_host<policy::clock, policy::static_budget<256>>("clock/static<256>");
}
