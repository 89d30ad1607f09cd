// End-to-end exactness of speculative decoding over the CUDA hierarchy (issue 14, item 5;
// tests/speculative/e2e.hpp): the same runs as test_speculative_decode_host, with the
// hierarchy, sparse attention (one split, so every query's output is independent of the
// launch shape), greedy verification, commit_verified and the draft ring on the GPU. The
// reference is plain greedy decoding on the GPU with every row resident; tokens and the
// bits of every committed query's attention outputs must match.
#include "e2e.hpp"
#include "random.hpp"

#include <common/speculative_gpu.cuh>

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

struct stream_guard {
  cudaStream_t s{};
  stream_guard() { DHISPARSE_CUDA_TRY(cudaStreamCreate(&s)); }
  ~stream_guard() { cudaStreamDestroy(s); }
};

using resident = examples::gpu_ops<kv_hierarchy<tiny_model::row, policy::lru, policy::resident_budget>>;

template <class Spec>
void run(examples::speculation s, std::int64_t slots, char const* what)
{
  auto seeds = test::seeded_engine(what);
  test::e2e_options o;
  o.steps = test::e2e_steps(std::getenv("DHISPARSE_TEST_SMALL") != nullptr ? 60 : 1000);
  o.spec  = s;
  o.seed  = seeds();
  tiny_model const model({1, 1}, 32, o.seed);
  stream_guard stream;
  resident ref(e2e_config(e2e_resident_slots), 8, stream.s);
  Spec spec(e2e_config(slots), 8, stream.s);
  auto const stats = test::run_e2e(ref, spec, model, o);
  REQUIRE(stats.fetched > 0);
  REQUIRE(stats.evicted + stats.reclaimed > 0);
}

}  // namespace

TEST_CASE("speculative decoding over small pools emits plain greedy decoding's tokens (GPU)", "[speculative][e2e][gpu]")
{
  SECTION("chains, static budget, LRU")
  {
    using spec = examples::gpu_ops<kv_hierarchy<tiny_model::row, policy::lru, policy::static_budget<e2e_budget>>>;
    run<spec>({4, false, 0.7}, 8 * e2e_budget + 16, "e2e gpu chain static");
  }
  SECTION("trees, static budget, CLOCK")
  {
    using spec = examples::gpu_ops<kv_hierarchy<tiny_model::row, policy::clock, policy::static_budget<e2e_budget>>>;
    run<spec>({6, true, 0.7}, 8 * e2e_budget + 16, "e2e gpu tree static");
  }
  SECTION("chains, adaptive budget (global reclaim)")
  {
    using spec = examples::gpu_ops<kv_hierarchy<tiny_model::row, policy::lru, policy::adaptive_budget<>>>;
    run<spec>({4, false, 0.6}, e2e_adaptive_slots, "e2e gpu chain adaptive");
  }
  SECTION("trees, adaptive budget (fair-share reclaim)")
  {
    using spec =
      examples::gpu_ops<kv_hierarchy<tiny_model::row, policy::lru, policy::adaptive_budget<reclaim_order::fair_share>>>;
    run<spec>({6, true, 0.8}, e2e_adaptive_slots, "e2e gpu tree adaptive");
  }
}
