// Peers' failures as tests (issue 18, items 4 and 5) on the GPU: the scenarios of
// peers.hpp through the soak's GPU backend (every call ordered on one stream; some steps
// as CUDA graph replays), and an impossible allocation at construction.
#include <catch2/catch.hpp>

#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/row_format.cuh>

#include "gpu_backend.cuh"
#include "peers.hpp"
#include "random.hpp"

#include <cstdint>
#include <cstdio>
#include <memory>

using namespace dhisparse;
using row     = row_format::opaque<64>;
using backend = test::soak::gpu_backend<row, policy::lru, policy::adaptive_budget<reclaim_order::global>>;

namespace {

struct stream_owner {
  cudaStream_t s{};
  stream_owner() { DHISPARSE_CUDA_TRY(cudaStreamCreate(&s)); }
  ~stream_owner() { cudaStreamDestroy(s); }
};

void expect_clean(char const* name, test::soak::report const& r)
{
  std::printf("peers gpu %s: %s\n", name, r.summary().c_str());
  for (auto const& m : r.messages) { std::printf("  violation: %s\n", m.c_str()); }
  std::fflush(stdout);
  INFO(name << ": " << r.summary() << " (set DHISPARSE_TEST_SEED=" << r.seed << " to replay)");
  for (auto const& m : r.messages) { UNSCOPED_INFO(m); }
  CHECK(r.violations == 0);
  CHECK(r.steps > 0);
}

}  // namespace

TEST_CASE("peers GPU: scenarios of peers.hpp", "[peers][gpu]")
{
  stream_owner stream;
  std::uint64_t const seed = test::fresh_seed();
  auto const make          = [&](hierarchy_config const& c) {
    return std::make_unique<backend>(c, stream.s, test::soak::gpu_modes{true, seed});
  };
  SECTION("host-pool admission reserves decode growth") {
    expect_clean("decode growth", test::peers::decode_growth<backend>(make, seed));
  }
  SECTION("verify steps straddling positions 4096 and 8192") {
    expect_clean("drafts beyond 4096", test::peers::drafts_beyond_4096<backend>(make, seed));
  }
  SECTION("max_requests long-context requests at once") {
    expect_clean("many long contexts", test::peers::many_long_contexts<backend>(make, seed, 12));
  }
  SECTION("the first decoded token after admission") {
    expect_clean("first token", test::peers::first_token<backend>(make, seed));
  }
  SECTION("refused requests and calls leave the hierarchy usable") {
    expect_clean("usable after rejections", test::peers::usable_after_rejections<backend>(make, seed, 30));
  }
}

// F12 (docs/reliability.md): release returned the request's host pages to the free list at
// once, while a backup enqueued before it could still write that request's rows into them;
// the next admission got the same pages and its prompt, written by the host, could then be
// overwritten. Released pages are now parked until the stream reaches the release
// (detail/page_table.cuh; the deterministic check is in tests/host_store).
TEST_CASE("F12: a request released while its backup is in flight (stream-ordered)", "[peers][gpu]")
{
  stream_owner stream;
  std::uint64_t const seed = test::fresh_seed();
  auto const make          = [&](hierarchy_config const& c) {
    return std::make_unique<backend>(c, stream.s, test::soak::gpu_modes{true, seed});
  };
  expect_clean("release during backup", test::peers::release_during_backup<backend>(make, seed, 20));
}

TEST_CASE("faults GPU: an impossible slab at construction throws and leaks nothing", "[faults][gpu]")
{
  stream_owner stream;
  hierarchy_config c       = test::peers::base_config();
  c.group_layers           = {1, 64};
  c.device_slots_per_group = (std::int64_t{1} << 31) - 1;  // slabs of 8 TiB and 512 TiB
  c.host.capacity_pages    = 1;                             // a small host store (17 MiB), built first
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  std::size_t free_before = 0, free_after = 0, total = 0;
  DHISPARSE_CUDA_TRY(cudaMemGetInfo(&free_before, &total));
  using huge = kv_hierarchy<row_format::opaque<4096>, policy::lru, policy::adaptive_budget<>>;
  std::string message;
  try {
    huge h(c, stream.s);
  } catch (dhisparse::error const& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("cudaMalloc"));
  CHECK(cudaGetLastError() == cudaSuccess);  // the sticky error was cleared
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  DHISPARSE_CUDA_TRY(cudaMemGetInfo(&free_after, &total));
  // Everything built before the failing allocation was freed (allocator granularity aside).
  CHECK(free_after + (std::size_t{64} << 20) >= free_before);
  // And the device is still usable: a small hierarchy works.
  kv_hierarchy<row, policy::lru, policy::adaptive_budget<>> small(test::peers::base_config(), stream.s);
  small.admit(request_id{1}, 10, stream.s);
  CHECK(small.contains(request_id{1}));
}
