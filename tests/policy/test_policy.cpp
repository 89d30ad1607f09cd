// Policy contracts (policy/concepts.hpp) and what each shipped policy promises.
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/policy/lfu_decay.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/policy/score_ema.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>

#include "random.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>

using namespace dhisparse;

namespace {
struct not_a_policy {};
struct bad_row {  // 20 bytes: breaks the 16-byte rule
  static constexpr std::size_t bytes = 20;
  static constexpr char const* name  = "bad";
};
struct sweeps_without_hooks : policy::eviction_defaults {
  static constexpr victim_search search = victim_search::sweep;
};
selection_context at(std::uint32_t epoch, std::int32_t position = 0, float score = 0.f, std::uint32_t n = 1)
{
  return {epoch, position, score, n};
}
}  // namespace

static_assert(is_eviction_policy_v<policy::lru>);
static_assert(is_complete_eviction_policy_v<policy::clock>);
static_assert(is_complete_eviction_policy_v<policy::lfu_decay<>>);
static_assert(is_complete_eviction_policy_v<policy::score_ema<>>);
static_assert(!is_eviction_policy_v<not_a_policy>);
static_assert(is_eviction_policy_v<sweeps_without_hooks> && !is_complete_eviction_policy_v<sweeps_without_hooks>,
              "a sweeping policy needs referenced() and clear_reference()");
static_assert(is_budget_policy_v<policy::static_budget<4096>>);
static_assert(is_budget_policy_v<policy::adaptive_budget<>>);
static_assert(is_budget_policy_v<policy::resident_budget>);
static_assert(!is_budget_policy_v<not_a_policy>);
static_assert(!is_row_format_v<bad_row>, "a row that breaks 16-byte alignment is not a row format");

TEST_CASE("lru: older first; the key changes only when the row is used", "[policy]")
{
  using P = policy::lru;
  policy_state const s1 = P::on_insert(at(5));
  policy_state const s2 = P::on_hit(s1, at(9));
  REQUIRE(P::eviction_key(s1, 1000) < P::eviction_key(s2, 3));
  REQUIRE(P::eviction_key(s2, 3) == P::eviction_key(P::on_hit(s1, at(9, 77)), 3));
}

TEST_CASE("clock: referenced on use, cleared by the hand, unreferenced first for reclaim", "[policy]")
{
  using P = policy::clock;
  policy_state const s = P::on_insert(at(4));
  REQUIRE(P::referenced(s));
  policy_state const cleared = P::clear_reference(s);
  REQUIRE(!P::referenced(cleared));
  REQUIRE(P::referenced(P::on_hit(cleared, at(6))));
  // Global order: every unreferenced row before any referenced one, older first.
  REQUIRE(P::eviction_key(P::clear_reference(P::on_insert(at(100))), 0) < P::eviction_key(P::on_insert(at(1)), 0));
  REQUIRE(P::eviction_key(P::clear_reference(P::on_insert(at(3))), 0) <
          P::eviction_key(P::clear_reference(P::on_insert(at(4))), 0));
}

TEST_CASE("lfu_decay: frequent rows outlive rare ones until their counts decay", "[policy]")
{
  using P = policy::lfu_decay<8>;
  // Row a: selected at epochs 1..10; row b: once, at epoch 10.
  policy_state a = P::on_insert(at(1));
  for (std::uint32_t e = 2; e <= 10; ++e) { a = P::on_hit(a, at(e)); }
  policy_state const b = P::on_insert(at(10));
  REQUIRE(P::eviction_key(b, 0) < P::eviction_key(a, 0));  // b goes first
  // Row c: selected often long ago; after many half lives a fresh single use wins.
  policy_state c = P::on_insert(at(1));
  for (std::uint32_t e = 2; e <= 5; ++e) { c = P::on_hit(c, at(e)); }
  policy_state const d = P::on_insert(at(200));
  REQUIRE(P::eviction_key(c, 0) < P::eviction_key(d, 0));
  // Several queries in one step count several times.
  REQUIRE(P::eviction_key(P::on_insert(at(10, 0, 0.f, 1)), 0) < P::eviction_key(P::on_insert(at(10, 0, 0.f, 4)), 0));
  // Integer arithmetic: decayed counts are monotone in elapsed time.
  auto rng = test::seeded_engine("lfu_decay monotone");
  for (int i = 0; i < 1000; ++i) {
    std::uint32_t const count = std::uint32_t(rng() % 0xFFFFFFFFull) | 1u;
    std::uint32_t const t     = std::uint32_t(rng() % 400);
    REQUIRE(P::decayed(count, t + 1) <= P::decayed(count, t));
  }
}

TEST_CASE("score_ema: low scores first, aging makes old high scores go", "[policy]")
{
  using P = policy::score_ema<1, 2, 100>;  // α = 1/2, 0.1 score units per step
  policy_state const low  = P::on_insert(at(10, 0, 1.f));
  policy_state const high = P::on_insert(at(10, 0, 5.f));
  REQUIRE(P::eviction_key(low, 0) < P::eviction_key(high, 0));
  REQUIRE(P::ema_of(P::on_hit(high, at(11, 0, 1.f))) == 3.f);  // (5 + 1) / 2
  // A score of 5 at epoch 10 ages below a score of 1 at epoch 100 (5 − 0.1·90 < 1).
  REQUIRE(P::eviction_key(high, 0) < P::eviction_key(P::on_insert(at(100, 0, 1.f)), 0));
  // Negative scores order correctly too.
  REQUIRE(P::eviction_key(P::on_insert(at(10, 0, -3.f)), 0) < P::eviction_key(P::on_insert(at(10, 0, -1.f)), 0));
  REQUIRE(P::needs_scores);
}

TEST_CASE("budgets: floors cover the essential set; static caps, adaptive and resident shares", "[policy]")
{
  budget_inputs const in{100'000, 1, 2048, 4};
  REQUIRE(essential_floor(in) == 2048 + 1 * (4 + 2));
  REQUIRE(essential_floor({100, 8, 2048, 4}) == 100 + 8 * 6);  // a short request selects what it has
  REQUIRE(policy::static_budget<4096>::floor(in) == 4096);
  REQUIRE(policy::static_budget<4096>::cap(in) == 4096);
  REQUIRE(policy::static_budget<4096>::kind == budget_kind::per_request);
  REQUIRE(policy::adaptive_budget<>::floor(in) == essential_floor(in));
  REQUIRE(policy::adaptive_budget<>::cap(in) == unlimited_slots);
  REQUIRE(policy::adaptive_budget<reclaim_order::fair_share>::reclaim == reclaim_order::fair_share);
  REQUIRE(policy::resident_budget::floor(in) >= in.capacity);
  REQUIRE(policy::resident_budget::reclaim == reclaim_order::none);
}
