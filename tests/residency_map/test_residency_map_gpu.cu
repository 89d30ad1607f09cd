// residency_map: paging, lookups on the device, release clears, memory bound.
#include <dhisparse/detail/hierarchy/kernels.cuh>
#include <dhisparse/residency_map.cuh>

#include "gpu_test.cuh"
#include "random.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace dhisparse;

namespace {

/// Writes value v at (request, group, position) for each query, or reports a missing page.
template <int Dummy = 0>
__global__ void poke_kernel(residency_map_ref map, std::int32_t const* req, std::int32_t const* grp,
                            std::int32_t const* pos, std::int32_t const* value, int n, std::int32_t* old)
{
  int const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) { return; }
  std::int32_t* e = map.entry(req[i], grp[i], pos[i]);
  if (e == nullptr) {
    old[i] = -100;
    return;
  }
  old[i] = *e;
  if (value[i] != -100) { *e = value[i]; }
}

struct map_probe {
  residency_map& map;
  cudaStream_t stream;
  /// For each (request, group, position): the old entry; writes `value` unless -100.
  std::vector<std::int32_t> run(std::vector<std::int32_t> const& r, std::vector<std::int32_t> const& g,
                                std::vector<std::int32_t> const& p, std::vector<std::int32_t> const& v)
  {
    int const n = int(r.size());
    test::device_vector<std::int32_t> dr(r), dg(g), dp(p), dv(v), out(n);
    poke_kernel<<<(n + 127) / 128, 128, 0, stream>>>(map.ref(), dr.data(), dg.data(), dp.data(), dv.data(), n,
                                                     out.data());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return out.download();
  }
};

}  // namespace

TEST_CASE("residency_map: entries are distinct per (request, group, position) and paged",
          "[residency_map][gpu]")
{
  auto rng = test::seeded_engine("residency_map");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  residency_map map(3, 64, 24, 4, 1000, stream);
  detail::staging_uploader uploader;
  map.grow(1, 300, uploader, stream);  // 5 pages
  map.grow(3, 64, uploader, stream);   // 1 page
  REQUIRE(map.free_pages() == 18);
  map_probe probe{map, stream};

  // Write a distinct value everywhere that is backed, then read it all back.
  std::vector<std::int32_t> r, g, p, v, none;
  for (int req : {1, 3}) {
    for (int grp = 0; grp < 3; ++grp) {
      for (std::int32_t pos = 0; pos < (req == 1 ? 320 : 64); ++pos) {
        r.push_back(req);
        g.push_back(grp);
        p.push_back(pos);
        v.push_back(std::int32_t(rng() % 1000000));
      }
    }
  }
  none.assign(v.size(), -100);
  auto const fresh = probe.run(r, g, p, v);
  for (auto e : fresh) { REQUIRE(e == not_resident); }  // new pages are all -1
  auto const back = probe.run(r, g, p, none);
  REQUIRE(back == v);
  // Unbacked positions and requests have no entry.
  auto const missing = probe.run({1, 0, 3, 1}, {0, 0, 2, 0}, {320, 0, 64, -1}, {-100, -100, -100, -100});
  for (auto e : missing) { REQUIRE(e == -100); }

  // Release clears the request's pages on device and returns them; reused pages are -1.
  detail::hierarchy::clear_map_kernel<256><<<16, 256, 0, stream>>>(map.ref(), 1);
  map.release(1, stream);
  REQUIRE(map.free_pages() == 23);
  map.grow(2, 320, uploader, stream);
  std::vector<std::int32_t> r2(r.size(), 2);
  std::vector<std::int32_t> const reused = probe.run(std::vector<std::int32_t>(r2.begin(), r2.begin() + 960),
                                                     std::vector<std::int32_t>(g.begin(), g.begin() + 960),
                                                     std::vector<std::int32_t>(p.begin(), p.begin() + 960),
                                                     std::vector<std::int32_t>(960, -100));
  for (auto e : reused) { REQUIRE(e == not_resident); }
  // Request 3 is untouched.
  std::size_t const first3 = 3 * 320;
  auto const still = probe.run(std::vector<std::int32_t>(r.begin() + first3, r.end()),
                               std::vector<std::int32_t>(g.begin() + first3, g.end()),
                               std::vector<std::int32_t>(p.begin() + first3, p.end()),
                               std::vector<std::int32_t>(r.size() - first3, -100));
  REQUIRE(still == std::vector<std::int32_t>(v.begin() + first3, v.end()));

  REQUIRE_THROWS_WITH(map.grow(0, 2000, uploader, stream), Catch::Contains("max_context"));
  map.grow(0, 1000, uploader, stream);  // 16 pages: 2 left
  REQUIRE(map.free_pages() == 2);
  REQUIRE_THROWS_WITH(map.grow(1, 200, uploader, stream), Catch::Contains("exhausted"));
  REQUIRE(map.free_pages() == 2);
  REQUIRE_THROWS_WITH(residency_map(1, 48, 4, 1, 100, stream), Catch::Contains("power of two"));
  cudaStreamDestroy(stream);
}
