// device_pool: initial state, caller slabs, argument checks.
#include <dhisparse/device_pool.cuh>

#include "gpu_test.cuh"

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

using namespace dhisparse;

namespace {
device_pool_shape shape(std::int32_t slots, std::size_t row_bytes)
{
  device_pool_shape s;
  s.num_slots       = slots;
  s.group_row_bytes = row_bytes;
  s.max_requests    = 8;
  s.max_owned       = 128;
  s.cache_capacity  = 32;
  s.spare_capacity  = 4;
  s.dirty_capacity  = 64;
  return s;
}
}  // namespace

TEST_CASE("device_pool: starts with every slot free, empty and clean", "[device_pool][gpu]")
{
  device_pool pool(shape(1000, 2 * 656), nullptr, nullptr);
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  auto const ref = pool.ref();
  auto download  = [](auto const* p, std::size_t n) {
    std::vector<std::remove_const_t<std::remove_pointer_t<decltype(p)>>> v(n);
    DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(v[0]), cudaMemcpyDeviceToHost));
    return v;
  };
  auto const owner = download(ref.owner, 1000);
  auto const pos   = download(ref.position, 1000);
  auto const dirty = download(ref.dirty, 1000);
  REQUIRE(std::all_of(owner.begin(), owner.end(), [](std::int32_t v) { return v == -1; }));
  REQUIRE(std::all_of(pos.begin(), pos.end(), [](std::int32_t v) { return v == -1; }));
  REQUIRE(std::all_of(dirty.begin(), dirty.end(), [](std::uint32_t v) { return v == 0; }));
  REQUIRE(download(ref.free_count, 1)[0] == 1000);
  REQUIRE(download(ref.limit, 1)[0] == 1000);
  auto const counters = download(ref.counters, 1)[0];
  REQUIRE(counters.selected_rows == 0);
  REQUIRE(counters.reclaims == 0);
  auto const flags = download(ref.cache.flags, 8);
  REQUIRE(std::all_of(flags.begin(), flags.end(), [](std::uint32_t v) { return v == 0; }));
  REQUIRE(download(ref.epoch, 1)[0] == 0);
  REQUIRE(download(ref.dirty_count, 1)[0] == 0);
  auto stack = download(ref.free_stack, 1000);
  REQUIRE(stack.back() == 0);  // popped first
  std::sort(stack.begin(), stack.end());
  std::vector<std::int32_t> all(1000);
  std::iota(all.begin(), all.end(), 0);
  REQUIRE(stack == all);
  auto const owned = download(ref.owned_count, 8);
  REQUIRE(std::all_of(owned.begin(), owned.end(), [](std::int32_t v) { return v == 0; }));
  REQUIRE(ref.group_row_bytes == 2 * 656);
  REQUIRE(pool.metadata_bytes() > 0);
}

TEST_CASE("device_pool: caller slab memory and argument checks", "[device_pool][gpu]")
{
  std::byte* slab = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&slab, 100 * 656 + 16));
  {
    device_pool pool(shape(100, 656), slab, nullptr);
    REQUIRE(pool.slab() == slab);
  }
  // The caller's memory is not freed by the pool: still usable.
  DHISPARSE_CUDA_TRY(cudaMemset(slab, 0, 16));
  REQUIRE_THROWS_WITH(device_pool(shape(100, 656), slab + 8, nullptr), Catch::Contains("16-byte aligned"));
  REQUIRE_THROWS_WITH(device_pool(shape(100, 650), nullptr, nullptr), Catch::Contains("multiple of 16"));
  REQUIRE_THROWS_WITH(device_pool(shape(0, 656), nullptr, nullptr), Catch::Contains("num_slots"));
  cudaFree(slab);
}
