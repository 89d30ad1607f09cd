// The drift workload's GPU version makes the CPU version's selections and scores, bit
// for bit, for the same configuration and seed: random small workloads (both regimes,
// verify queries, random accepted counts) and one at full K with a long context.
#include <catch2/catch.hpp>

#include <common/drift.hpp>
#include <common/drift_gpu.cuh>

#include "drift_cases.hpp"
#include "gpu_test.cuh"
#include "random.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using dhisparse::bench::drift_config;
using dhisparse::test::device_vector;

namespace {

void compare_cpu_gpu(std::mt19937_64& rng, drift_config const& c, int steps)
{
  INFO("context " << c.context << " K " << c.top_k << " d " << c.dim << " B " << c.requests << " Q " << c.queries
                  << " seed " << c.seed);
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    dhisparse::bench::drift_generator cpu(c);
    dhisparse::bench::drift_generator_gpu gpu(c, steps, stream);
    std::size_t const n = std::size_t(c.requests) * c.queries * c.top_k;
    std::vector<std::int32_t> cpu_sel(n);
    std::vector<float> cpu_scores(n);
    device_vector<std::int32_t> gpu_sel(n);
    device_vector<float> gpu_scores(n);
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      gpu_sel.fill_bytes(0x5A);  // poisoned: every entry must be written
      gpu_scores.fill_bytes(0x7F);
      gpu.next(gpu_sel.data(), gpu_scores.data(), stream);
      cpu.next(cpu_sel.data(), cpu_scores.data());
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      auto const sel    = gpu_sel.download();
      auto const scores = gpu_scores.download();
      REQUIRE(sel == cpu_sel);
      REQUIRE(std::memcmp(scores.data(), cpu_scores.data(), n * sizeof(float)) == 0);
      // The GPU generator's host state is the CPU's: its selections meet the contract.
      for (int b = 0; b < c.requests; ++b) {
        for (int q = 0; q < c.queries; ++q) {
          std::size_t const row = (std::size_t(b) * c.queries + q) * c.top_k;
          dhisparse::test::check_selection_contract(gpu.host(), b, q, sel.data() + row, scores.data() + row);
        }
      }
      auto const accepted = dhisparse::test::random_accepted(rng, c);
      cpu.commit(accepted.data());
      gpu.commit(accepted.data());
    }
  }
  DHISPARSE_CUDA_TRY(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("the GPU drift workload equals the CPU one on small random workloads", "[drift][gpu]")
{
  auto rng = dhisparse::test::seeded_engine("drift gpu small");
  for (int rep = 0; rep < 8; ++rep) { compare_cpu_gpu(rng, dhisparse::test::random_drift_config(rng), 12); }
}

TEST_CASE("the GPU drift workload equals the CPU one at K = 2048", "[drift][gpu]")
{
  auto rng = dhisparse::test::seeded_engine("drift gpu large");
  drift_config c;
  c.context  = 30000;
  c.requests = 3;
  c.queries  = 2;
  c.seed     = rng();
  compare_cpu_gpu(rng, c, 6);
}
