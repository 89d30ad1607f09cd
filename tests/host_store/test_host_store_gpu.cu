// host_store: page accounting, row addressing on host and device, memory kinds, errors.
#include <dhisparse/host_store.cuh>

#include "gpu_test.cuh"
#include "random.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <vector>

using namespace dhisparse;

namespace {

/// Keeps its stream busy for `cycles` clock cycles.
__global__ void spin_kernel(long long cycles)
{
  long long const start = clock64();
  while (clock64() - start < cycles) {}
}

/// Copies the first 16 bytes of the group row of (request, position) for each query.
template <int Dummy = 0>
__global__ void read_rows_kernel(host_store_ref store, group_layout layout, std::int32_t const* requests,
                                 std::int32_t const* positions, int n, int4* out)
{
  int const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) { return; }
  std::byte const* row = store.group_row(requests[i], positions[i], layout);
  out[i] = row == nullptr ? make_int4(-1, -1, -1, -1) : *reinterpret_cast<int4 const*>(row);
}

}  // namespace

TEST_CASE("host_store: rows written on the host are read at the same place by kernels",
          "[host_store][gpu]")
{
  auto rng = test::seeded_engine("host_store");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  host_memory const memory = GENERATE(host_memory::pinned, host_memory::huge_pages);
  host_store_config cfg;
  cfg.capacity_pages  = 64;
  cfg.tokens_per_page = 16;
  cfg.memory          = memory;
  std::vector<int> const layers = {2, 1, 3};
  host_store store(cfg, layers, 656, 4, 1000, stream);
  detail::staging_uploader uploader;
  REQUIRE(store.page_bytes() == 16 * 6 * 656);
  REQUIRE(store.layout(1).page_offset == 16 * 2 * 656);
  REQUIRE(store.layout(2).row_bytes == 3 * 656);

  store.grow(0, 100, uploader, stream);  // 7 pages
  store.grow(2, 33, uploader, stream);   // 3 pages
  store.grow(0, 90, uploader, stream);   // no-op
  REQUIRE(store.capacity(0) == 112);
  REQUIRE(store.free_pages() == 64 - 10);
  // A group row is contiguous: layer l of a group row follows layer l-1.
  REQUIRE(store.row(0, 2, 1, 5) == store.row(0, 2, 0, 5) + 656);
  REQUIRE(store.row(0, 0, 0, 6) == store.row(0, 0, 0, 5) + 2 * 656);

  // Stamp every row with its coordinates on the host, read them back on the device.
  std::vector<std::int32_t> requests, positions;
  for (int r : {0, 2}) {
    for (std::int32_t p = 0; p < store.capacity(r); ++p) {
      for (int g = 0; g < 3; ++g) {
        int4 const stamp{r, g, p, int(rng() % 1000) + 1};
        std::memcpy(store.row(r, g, 0, p), &stamp, sizeof stamp);
      }
      requests.push_back(r);
      positions.push_back(p);
    }
  }
  requests.push_back(1);  // no pages: nullptr
  positions.push_back(0);
  requests.push_back(2);  // beyond capacity
  positions.push_back(48);
  int const n = int(requests.size());
  test::device_vector<std::int32_t> d_req(requests), d_pos(positions);
  test::device_vector<int4> out(n);
  for (int g = 0; g < 3; ++g) {
    out.fill_bytes(0x55);
    read_rows_kernel<<<(n + 127) / 128, 128, 0, stream>>>(store.ref(), store.layout(g), d_req.data(), d_pos.data(),
                                                          n, out.data());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    auto const got = out.download();
    for (int i = 0; i < n - 2; ++i) {
      int4 want;
      std::memcpy(&want, store.row(requests[i], g, 0, positions[i]), sizeof want);
      REQUIRE(got[i].x == want.x);
      REQUIRE(got[i].y == g);
      REQUIRE(got[i].z == positions[i]);
      REQUIRE(got[i].w == want.w);
    }
    REQUIRE(got[n - 2].x == -1);
    REQUIRE(got[n - 1].x == -1);
  }

  // Errors: exhaustion changes nothing; addressing outside the backed range throws.
  REQUIRE_THROWS_WITH(store.grow(1, 16 * 60, uploader, stream), Catch::Contains("host store exhausted"));
  REQUIRE(store.free_pages() == 54);
  REQUIRE(store.capacity(1) == 0);
  REQUIRE_THROWS_WITH(store.grow(1, 2000, uploader, stream), Catch::Contains("max_context"));
  REQUIRE_THROWS_WITH(store.row(2, 0, 0, 48), Catch::Contains("not backed"));
  REQUIRE_THROWS_WITH(store.row(2, 3, 0, 0), Catch::Contains("group 3"));
  REQUIRE_THROWS_WITH(store.row(2, 0, 2, 0), Catch::Contains("layer 2"));

  // Release returns the pages and empties the device table.
  store.release(0, stream);
  REQUIRE(store.free_pages() == 61);
  read_rows_kernel<<<(n + 127) / 128, 128, 0, stream>>>(store.ref(), store.layout(0), d_req.data(), d_pos.data(),
                                                        n, out.data());
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  REQUIRE(out.download()[0].x == -1);
  cudaStreamDestroy(stream);
}

TEST_CASE("host_store: released pages are handed out only after the stream passed the release (F12)",
          "[host_store][gpu]")
{
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  host_store_config cfg;
  cfg.capacity_pages  = 16;
  cfg.tokens_per_page = 16;
  cfg.memory          = host_memory::pinned;
  host_store store(cfg, {1}, 656, 4, 1000, stream);
  detail::staging_uploader uploader;
  store.grow(0, 8 * 16, uploader, stream);  // 8 pages
  std::set<std::byte*> released;
  for (int p = 0; p < 8; ++p) { released.insert(store.row(0, 0, 0, p * 16)); }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));

  // Work enqueued before the release (a backup, in an engine) still runs when release
  // returns: the pages stay parked until the stream reaches the release.
  spin_kernel<<<1, 1, 0, stream>>>(1'000'000'000LL);  // ~0.5 s
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  store.release(0, stream);
  CHECK(store.free_pages() == 16);           // parked pages are not lost
  store.grow(1, 8 * 16, uploader, stream);   // the 8 never-used pages, no wait
  CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);  // the release is still ahead of the device
  for (int p = 0; p < 8; ++p) { CHECK(released.count(store.row(1, 0, 0, p * 16)) == 0); }
  // Only parked pages are left: the next growth waits for the release, then takes them.
  store.grow(2, 4 * 16, uploader, stream);
  for (int p = 0; p < 4; ++p) { CHECK(released.count(store.row(2, 0, 0, p * 16)) == 1); }
  CHECK(store.free_pages() == 4);
  REQUIRE_THROWS_WITH(store.grow(3, 5 * 16, uploader, stream), Catch::Contains("host store exhausted"));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  DHISPARSE_CUDA_TRY(cudaStreamDestroy(stream));
}

TEST_CASE("host_store: invalid configurations are refused", "[host_store][gpu]")
{
  host_store_config cfg;
  cfg.capacity_pages = 4;
  std::vector<int> const layers = {1};
  REQUIRE_THROWS_WITH(host_store(cfg, layers, 650, 1, 100, nullptr), Catch::Contains("multiple of 16"));
  cfg.tokens_per_page = 24;
  REQUIRE_THROWS_WITH(host_store(cfg, layers, 656, 1, 100, nullptr), Catch::Contains("power of two"));
  cfg.tokens_per_page = 16;
  cfg.memory          = host_memory::caller;
  alignas(64) static std::byte buffer[4 * 16 * 656 + 64];
  cfg.caller_memory = buffer + 8;
  cfg.caller_bytes  = 4 * 16 * 656;
  REQUIRE_THROWS_WITH(host_store(cfg, layers, 656, 1, 100, nullptr), Catch::Contains("16-byte aligned"));
  cfg.caller_memory = buffer;
  cfg.caller_bytes  = 100;
  REQUIRE_THROWS_WITH(host_store(cfg, layers, 656, 1, 100, nullptr), Catch::Contains("caller_bytes"));
  cfg.caller_bytes = sizeof buffer;
  host_store ok(cfg, layers, 656, 1, 100, nullptr);  // registered caller memory works
  REQUIRE(ok.page_bytes() == 16 * 656);
}

TEST_CASE("host_store: NUMA placement is chosen, applied where allowed, and reported", "[host_store][numa][gpu]")
{
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  host_memory const memory = GENERATE(host_memory::pinned, host_memory::huge_pages);
  std::vector<int> const online = detail::numa::online_nodes("/sys");
  host_store_config cfg;
  cfg.capacity_pages  = 8;
  cfg.tokens_per_page = 16;
  cfg.memory          = memory;
  std::vector<int> const layers = {1};
  detail::staging_uploader uploader;
  for (int requested : {numa_device_local, numa_unbound, online.back()}) {
    cfg.numa_node = requested;
    host_store store(cfg, layers, 656, 2, 100, stream);
    numa_binding const& b = store.numa();
    INFO(b.describe());
    CHECK(b.requested == requested);
    CHECK(!b.reason.empty());
    if (online.size() < 2 || requested == numa_unbound) { CHECK(b.node == -1); }
    if (b.node >= 0 && b.first_page_node >= 0) { CHECK(b.first_page_node == b.node); }
    // The memory works whatever the placement.
    store.grow(0, 16, uploader, stream);
    *store.row(0, 0, 0, 3) = std::byte{42};
    CHECK(*store.row(0, 0, 0, 3) == std::byte{42});
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  cfg.numa_node = 4096;  // never an online node
  REQUIRE_THROWS_WITH(host_store(cfg, layers, 656, 1, 100, stream), Catch::Contains("numa_node"));
  cfg.memory        = host_memory::caller;  // the caller's memory is placed by the caller
  cfg.numa_node     = numa_device_local;
  alignas(64) static std::byte buffer[8 * 16 * 656];
  cfg.caller_memory = buffer;
  cfg.caller_bytes  = sizeof buffer;
  host_store caller(cfg, layers, 656, 1, 100, stream);
  CHECK(caller.numa().node == -1);
  cudaStreamDestroy(stream);
}
