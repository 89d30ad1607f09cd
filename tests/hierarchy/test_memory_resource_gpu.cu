// Memory from the caller (issue 17): every device and pinned allocation of a kv_hierarchy
// (and of a draft ring, a host store, a trace recorder) goes through the resources the
// caller supplies; `bytes_required` reports before construction exactly what construction
// takes; steps take nothing more; destruction returns everything.
#include "gpu_test.cuh"

#include <dhisparse/draft_ring.cuh>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lfu_decay.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/trace_recorder.cuh>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

using namespace dhisparse;

namespace {

struct stream_guard {
  cudaStream_t s{};
  stream_guard() { DHISPARSE_CUDA_TRY(cudaStreamCreate(&s)); }
  ~stream_guard() { cudaStreamDestroy(s); }
};

hierarchy_config base_config(std::vector<int> groups, int max_requests, int max_queries, std::int64_t slots,
                             std::size_t host_pages)
{
  hierarchy_config c;
  c.group_layers           = std::move(groups);
  c.max_requests           = max_requests;
  c.max_batch              = max_requests;
  c.max_queries            = max_queries;
  c.max_top_k              = 64;
  c.max_context            = 4096;
  c.device_slots_per_group = slots;
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 32;
  c.host.capacity_pages    = host_pages;
  return c;
}

void require_returned(allocation_counts const& c)
{
  CHECK(c.bytes == 0);
  CHECK(c.allocations == 0);
  CHECK(c.mismatches == 0);
}

/// Constructs a hierarchy of `config` through counting resources and checks the counts
/// against `bytes_required` before and after a step, a move, and destruction.
template <class Row, class Eviction, class Budget>
void check_footprint(hierarchy_config config, cudaStream_t stream)
{
  using hierarchy = kv_hierarchy<Row, Eviction, Budget>;
  counting_device_resource device;
  counting_pinned_resource pinned;
  config.resources = {&device, &pinned};
  memory_footprint const need = hierarchy::bytes_required(config);
  INFO("groups " << config.num_groups() << ", max_requests " << config.max_requests << ", device "
                 << need.device_bytes << " B, pinned " << need.pinned_bytes << " B");

  std::int64_t layers = std::accumulate(config.group_layers.begin(), config.group_layers.end(), std::int64_t{0});
  std::size_t const page_bytes = std::size_t(config.host.tokens_per_page) * std::size_t(layers) * Row::bytes;
  CHECK(need.host_store_bytes >= config.host.capacity_pages * page_bytes);
  if (config.slab_memory.empty()) {
    CHECK(need.slab_bytes == std::size_t(config.device_slots_per_group) * std::size_t(layers) * Row::bytes);
  } else {
    CHECK(need.slab_bytes == 0);
  }
  CHECK(need.device_bytes > need.slab_bytes);
  {
    hierarchy h(config, stream);
    CHECK(device.counts().bytes == need.device_bytes);
    CHECK(pinned.counts().bytes == need.pinned_bytes);
    CHECK(device.counts().peak_bytes == need.device_bytes);
    CHECK(pinned.counts().peak_bytes == need.pinned_bytes);
    if (config.host.memory == host_memory::pinned) { CHECK(need.pinned_bytes > need.host_store_bytes); }

    // Requests come and go, a step runs: nothing more is allocated.
    std::int32_t const length = 300;
    h.admit(request_id{7}, length, stream);
    h.reserve(request_id{7}, 2 * length, stream);
    h.admit(request_id{8}, 40, stream);
    std::vector<request_id> const ids{request_id{7}};
    std::vector<std::int32_t> const queries{1};
    h.set_batch(ids.data(), queries.data(), 1, stream);
    std::size_t const entries = config.step_entries();
    std::vector<std::int32_t> selections(entries, -1);
    for (int k = 0; k < config.max_top_k; ++k) { selections[k] = (k * 37) % length; }
    std::int32_t* d_selections = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&d_selections, entries * sizeof(std::int32_t)));
    DHISPARSE_CUDA_TRY(cudaMemcpy(d_selections, selections.data(), entries * sizeof(std::int32_t),
                                  cudaMemcpyHostToDevice));
    for (int g = 0; g < config.num_groups(); ++g) {
      h.resolve(g, d_selections, config.max_top_k, stream);
      h.retrieve(g, stream);
    }
    h.commit(nullptr, stream);
    h.backup(stream);
    h.release(request_id{8}, stream);
    CHECK(h.status_sync(stream) == 0);
    DHISPARSE_CUDA_TRY(cudaFree(d_selections));
    CHECK(device.counts().bytes == need.device_bytes);
    CHECK(pinned.counts().bytes == need.pinned_bytes);

    hierarchy moved{std::move(h)};  // a move hands the memory over, returns nothing
    CHECK(device.counts().bytes == need.device_bytes);
    CHECK(pinned.counts().bytes == need.pinned_bytes);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  require_returned(device.counts());
  require_returned(pinned.counts());
  CHECK(device.counts().peak_bytes == need.device_bytes);
  CHECK(pinned.counts().peak_bytes == need.pinned_bytes);
}

}  // namespace

TEST_CASE("kv_hierarchy::bytes_required equals what construction takes; destruction returns it",
          "[memory_resource][gpu]")
{
  stream_guard stream;
  SECTION("static budget, one group, pinned store")
  {
    check_footprint<row_format::mla_fp8_656, policy::lru, policy::static_budget<256>>(
      base_config({1}, 4, 1, 4 * 256 + 32, 4 * 4096 / 32), stream.s);
  }
  SECTION("static budget, per-request caches (smallest-key eviction), verify queries")
  {
    check_footprint<row_format::mla_bf16_576, policy::lfu_decay<>, policy::static_budget<512>>(
      base_config({2, 1}, 3, 4, 3 * 512 + 64, 3 * 4096 / 32), stream.s);
  }
  SECTION("adaptive budget (global reclaim), three groups, eight requests")
  {
    check_footprint<row_format::opaque<64>, policy::lru, policy::adaptive_budget<>>(
      base_config({4, 1, 2}, 8, 2, 6000, 8 * 1024 / 32 + 7), stream.s);
  }
  SECTION("adaptive budget (fair-share reclaim), clock eviction")
  {
    check_footprint<row_format::mla_fp8_656, policy::clock, policy::adaptive_budget<reclaim_order::fair_share>>(
      base_config({1, 1}, 5, 1, 4000, 5 * 2048 / 32), stream.s);
  }
  SECTION("plans ordered by host address: the ordering workspace is counted")
  {
    using hierarchy = kv_hierarchy<row_format::mla_fp8_656, policy::lru, policy::static_budget<256>>;
    auto c          = base_config({1, 2}, 4, 2, 4 * 256 + 32, 4 * 4096 / 32);
    auto const plain = hierarchy::bytes_required(c).device_bytes;
    c.order_plans             = true;
    c.order_plans_min_entries = 0;
    // Two parities × (bucket counters and starts + one staged entry per step entry).
    CHECK(hierarchy::bytes_required(c).device_bytes >= plain + 2 * c.step_entries() * sizeof(miss_entry));
    check_footprint<row_format::mla_fp8_656, policy::lru, policy::static_budget<256>>(c, stream.s);
  }
  SECTION("resident budget, huge-page store (mapped by the store, not the resource)")
  {
    auto c        = base_config({3}, 2, 1, 2 * 4096 + 64, 2 * 4096 / 32);
    c.host.memory = host_memory::huge_pages;
    check_footprint<row_format::opaque<64>, policy::lru, policy::resident_budget>(c, stream.s);
    using hierarchy = kv_hierarchy<row_format::opaque<64>, policy::lru, policy::resident_budget>;
    auto const f    = hierarchy::bytes_required(c);
    CHECK(f.host_store_bytes % (std::size_t{2} << 20) == 0);
    // The same configuration with a pinned store takes exactly the store's pages more from
    // the pinned resource: huge pages do not come from it.
    auto pinned        = c;
    pinned.host.memory = host_memory::pinned;
    auto const p       = hierarchy::bytes_required(pinned);
    CHECK(p.pinned_bytes - f.pinned_bytes == p.host_store_bytes);
  }
  SECTION("caller slabs and caller host memory: neither counted")
  {
    using row = row_format::mla_fp8_656;
    auto c    = base_config({2, 1}, 2, 1, 2 * 256 + 32, 2 * 4096 / 32);
    std::size_t const host_bytes = c.host.capacity_pages * std::size_t(c.host.tokens_per_page) * 3 * row::bytes;
    void* host = std::aligned_alloc(4096, (host_bytes + 4095) / 4096 * 4096);
    c.host.memory        = host_memory::caller;
    c.host.caller_memory = host;
    c.host.caller_bytes  = host_bytes;
    for (int g = 0; g < c.num_groups(); ++g) {
      void* p = nullptr;
      DHISPARSE_CUDA_TRY(cudaMalloc(&p, std::size_t(c.device_slots_per_group) * c.group_layers[g] * row::bytes));
      c.slab_memory.push_back(p);
    }
    auto const f = kv_hierarchy<row, policy::lru, policy::static_budget<256>>::bytes_required(c);
    CHECK(f.host_store_bytes == host_bytes);
    CHECK(f.pinned_bytes == detail::staging_uploader::ring_bytes + sizeof(std::uint32_t));
    check_footprint<row, policy::lru, policy::static_budget<256>>(c, stream.s);
    for (void* p : c.slab_memory) { cudaFree(p); }
    std::free(host);
  }
}

TEST_CASE("bytes_required rejects what the constructor rejects, allocating nothing", "[memory_resource][gpu]")
{
  auto c         = base_config({1}, 4, 1, 100, 64);  // too few slots for a static budget of 256
  using hierarchy = kv_hierarchy<row_format::opaque<64>, policy::lru, policy::static_budget<256>>;
  REQUIRE_THROWS_WITH(hierarchy::bytes_required(c), Catch::Contains("device_slots_per_group"));
  c.max_requests = 0;
  REQUIRE_THROWS_WITH(hierarchy::bytes_required(c), Catch::Contains("max_requests"));
}

TEST_CASE("a failing resource: construction throws and returns what it took", "[memory_resource][gpu]")
{
  /// Fails the n-th allocation.
  struct failing_device_resource final : device_memory_resource {
    int left;
    explicit failing_device_resource(int n) : left{n} {}
    void* do_allocate(std::size_t bytes, std::size_t alignment, cudaStream_t stream) override
    {
      if (left-- == 0) { throw error("failing_device_resource: out of memory"); }
      return default_device_resource().allocate(bytes, alignment, stream);
    }
    void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, cudaStream_t stream) noexcept override
    {
      default_device_resource().deallocate(p, bytes, alignment, stream);
    }
  };
  stream_guard stream;
  auto c = base_config({2, 1}, 4, 1, 4 * 256 + 32, 4 * 4096 / 32);
  for (int n : {0, 3, 17}) {
    failing_device_resource failing{n};
    counting_device_resource device{failing};
    counting_pinned_resource pinned;
    c.resources = {&device, &pinned};
    using hierarchy = kv_hierarchy<row_format::opaque<64>, policy::lru, policy::static_budget<256>>;
    REQUIRE_THROWS_WITH(hierarchy(c, stream.s), Catch::Contains("out of memory"));
    require_returned(device.counts());
    require_returned(pinned.counts());
  }
}

TEST_CASE("draft_ring and trace recorder allocate through the caller's resources", "[memory_resource][gpu]")
{
  counting_device_resource device;
  memory_resources const resources{&device, nullptr};
  for (bool caller_rows : {false, true}) {
    int const capacity = 5, window = 24, layers = 2;
    std::size_t const row_bytes = 656;
    memory_footprint const need = draft_ring::bytes_required(capacity, window, layers, row_bytes, caller_rows);
    std::size_t const rows      = draft_ring::rows_bytes(capacity, window, layers, row_bytes);
    void* caller                = nullptr;
    if (caller_rows) { DHISPARSE_CUDA_TRY(cudaMalloc(&caller, rows)); }
    {
      draft_ring ring(capacity, window, layers, row_bytes, caller, caller_rows ? rows : 0, resources);
      CHECK(device.counts().bytes == need.device_bytes);
      CHECK(ring.memory_bytes() == need.device_bytes + (caller_rows ? rows : 0));
    }
    require_returned(device.counts());
    cudaFree(caller);
  }

  counting_pinned_resource pinned;
  trace::shape s{};
  s.groups       = 2;
  s.max_requests = 3;
  s.max_queries  = 2;
  s.top_k        = 16;
  std::string const path = "test_memory_resource_gpu.trace";
  {
    trace::recorder r(path, s, 3, &pinned);
    CHECK(pinned.counts().allocations == 1);
    CHECK(pinned.counts().bytes > 0);
  }
  require_returned(pinned.counts());
  std::remove(path.c_str());
}
