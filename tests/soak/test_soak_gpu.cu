// Soak on the GPU (issue 18, item 1): tests/soak/soak.hpp driving kv_hierarchy, with CUDA
// graph replays of the layers, commits and backups on some steps. Steps per policy
// combination from DHISPARSE_SOAK_STEPS (default 2000; 200 with DHISPARSE_TEST_SMALL),
// the seed from DHISPARSE_TEST_SEED; each run prints its report. The long run:
//   DHISPARSE_SOAK_STEPS=100000 test_soak_gpu
#include <catch2/catch.hpp>

#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/score_ema.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>

#include "gpu_backend.cuh"
#include "random.hpp"
#include "soak.hpp"
#include "soak_config.hpp"

#include <cstdio>
#include <cstdlib>

using namespace dhisparse;
using row = row_format::opaque<64>;

namespace {

struct stream_owner {
  cudaStream_t s{};
  stream_owner() { DHISPARSE_CUDA_TRY(cudaStreamCreate(&s)); }
  ~stream_owner() { cudaStreamDestroy(s); }
};

template <class Eviction, class Budget>
void soak_gpu(char const* name)
{
  stream_owner stream;
  test::soak::options o;
  o.seed  = test::fresh_seed();
  o.steps = test::soak::steps_from_env(std::getenv("DHISPARSE_TEST_SMALL") != nullptr ? 200 : 2000);
  bool const graphs = std::getenv("DHISPARSE_SOAK_GRAPHS") == nullptr || std::atoi(std::getenv("DHISPARSE_SOAK_GRAPHS")) != 0;
  test::soak::gpu_backend<row, Eviction, Budget> backend(test::soak::config(), stream.s, {graphs, o.seed});
  test::soak::report const r = test::soak::driver<decltype(backend)>(backend, o).run();
  std::printf("soak gpu %s: %s; %lld steps as graph replays\n", name, r.summary().c_str(),
              static_cast<long long>(backend.graph_replays()));
  for (auto const& m : r.messages) { std::printf("  violation: %s\n", m.c_str()); }
  std::fflush(stdout);
  INFO(name << ": " << r.summary() << " (set DHISPARSE_TEST_SEED=" << r.seed << " to replay)");
  for (auto const& m : r.messages) { UNSCOPED_INFO(m); }
  CHECK(r.violations == 0);
  CHECK(r.steps == o.steps);
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace

TEST_CASE("soak: GPU, LRU, adaptive budget with global reclaim, graph replays", "[soak][gpu]")
{
  soak_gpu<policy::lru, policy::adaptive_budget<reclaim_order::global>>("lru/adaptive<global>");
}

TEST_CASE("soak: GPU, score EMA, adaptive budget with fair-share reclaim, graph replays", "[soak][gpu]")
{
  soak_gpu<policy::score_ema<>, policy::adaptive_budget<reclaim_order::fair_share>>("score_ema/adaptive<fair_share>");
}

TEST_CASE("soak: GPU, CLOCK, static budget (HiSparse), graph replays", "[soak][gpu]")
{
  soak_gpu<policy::clock, policy::static_budget<256>>("clock/static<256>");
}
