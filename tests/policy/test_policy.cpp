// Policy contracts (policy/lru.cuh, policy/static_budget.cuh) and their checks.
#include <dhisparse/detail/policy_traits.hpp>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>

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
}  // namespace

static_assert(is_eviction_policy_v<policy::lru>);
static_assert(!is_eviction_policy_v<not_a_policy>);
static_assert(is_budget_policy_v<policy::static_budget<4096>>);
static_assert(!is_budget_policy_v<not_a_policy>);
static_assert(!is_row_format_v<bad_row>, "a row that breaks 16-byte alignment is not a row format");

TEST_CASE("lru: older first, then lower position; keys stay below 2^63", "[policy]")
{
  using P = policy::lru;
  std::uint32_t const s1 = P::on_insert(5);
  std::uint32_t const s2 = P::on_hit(s1, 9);
  REQUIRE(s2 == 9);
  REQUIRE(P::eviction_key(5, 1000) < P::eviction_key(9, 3));    // least recently used first
  REQUIRE(P::eviction_key(9, 3) < P::eviction_key(9, 4));       // same step: lower position
  REQUIRE(P::eviction_key(0xFFFFFFFFu, 0x7FFFFFFF) < (std::uint64_t{1} << 63));
  REQUIRE(policy::static_budget<4096>::slots_per_request == 4096);
}
