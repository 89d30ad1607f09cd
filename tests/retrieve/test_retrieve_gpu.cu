// retrieve: the gather (every lane grouping, layer ranges, skipped and shared rows) and
// the address ordering of plans (order_plan_async), against a host reference on random
// plans; graph capture; rows of several requests interleaved in a real host_store.
// Sizes stay small enough for compute-sanitizer (memcheck, racecheck).
#include <dhisparse/host_store.cuh>
#include <dhisparse/retrieve.cuh>

#include "gpu_test.cuh"
#include "random.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

using namespace dhisparse;

namespace {

/// A mapped pinned pool of random bytes (never all zero), host and device addresses.
class mapped_pool {
 public:
  mapped_pool(std::size_t bytes, std::mt19937_64& rng) : bytes_{bytes}
  {
    DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes,
                                     cudaHostAllocMapped | cudaHostAllocPortable));
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
    for (std::size_t i = 0; i + 8 <= bytes; i += 8) {
      std::uint64_t const v = rng() | 1u;
      std::memcpy(host_ + i, &v, 8);
    }
  }
  mapped_pool(mapped_pool const&)            = delete;
  mapped_pool& operator=(mapped_pool const&) = delete;
  ~mapped_pool() { cudaFreeHost(host_); }

  std::byte* host() const { return host_; }
  std::byte* device() const { return device_; }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::byte* host_   = nullptr;
  std::byte* device_ = nullptr;
};

/// Host reference of a gather: what the slab holds after copying entries [0, count).
std::vector<std::byte> reference_gather(std::vector<std::byte> slab, std::vector<miss_entry> const& entries,
                                        int count, mapped_pool const& pool, std::size_t row_bytes,
                                        std::size_t begin, std::size_t end)
{
  for (int i = 0; i < count; ++i) {
    miss_entry const& e = entries[std::size_t(i)];
    if (e.src == nullptr) { continue; }
    std::byte const* src = pool.host() + (e.src - pool.device()) + begin;
    std::copy(src, src + (end - begin), slab.data() + std::size_t(e.slot) * row_bytes + begin);
  }
  return slab;
}

/// Entries order_plan_async must produce from `in` (its first `count` of `capacity`).
std::vector<miss_entry> reference_order(std::vector<miss_entry> in, int count, std::byte const* base,
                                        std::size_t bytes)
{
  auto const outside = [&](miss_entry const& e) {
    return e.src == nullptr || e.src < base || std::size_t(e.src - base) >= bytes;
  };
  std::stable_sort(in.begin(), in.begin() + count, [&](miss_entry const& a, miss_entry const& b) {
    auto const ka = std::make_tuple(outside(a), reinterpret_cast<std::uintptr_t>(a.src), a.slot, a.position);
    auto const kb = std::make_tuple(outside(b), reinterpret_cast<std::uintptr_t>(b.src), b.slot, b.position);
    return ka < kb;
  });
  return in;
}

bool same_entry(miss_entry const& a, miss_entry const& b)
{
  return a.src == b.src && a.slot == b.slot && a.position == b.position;
}

/**
 * A random plan of `capacity` entries over `pool` (the caller says how many count):
 * distinct slots, rows at random row-aligned places, some rows read twice (into two
 * slots), a few null sources (skipped); entries beyond the count must not be touched.
 */
std::vector<miss_entry> random_plan(std::mt19937_64& rng, mapped_pool const& pool, std::size_t row_bytes,
                                    int capacity, int slots)
{
  std::size_t const rows = pool.bytes() / row_bytes;
  std::vector<std::int32_t> slot_ids(static_cast<std::size_t>(slots));
  std::iota(slot_ids.begin(), slot_ids.end(), 0);
  std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
  std::vector<miss_entry> plan(static_cast<std::size_t>(capacity));
  for (int i = 0; i < capacity; ++i) {
    std::byte const* src = pool.device() + (rng() % rows) * row_bytes;
    if (i > 0 && rng() % 8 == 0) { src = plan[rng() % std::size_t(i)].src; }  // a shared row
    if (rng() % 64 == 0) { src = nullptr; }
    plan[std::size_t(i)] = miss_entry{src, slot_ids[std::size_t(i) % std::size_t(slots)], std::int32_t(rng() % 100000)};
  }
  return plan;
}

}  // namespace

TEST_CASE("retrieve: every lane grouping and layer range copies exactly the plan's rows", "[retrieve][gpu]")
{
  auto rng = test::seeded_engine("retrieve gather");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  mapped_pool pool(std::size_t{8} << 20, rng);
  std::size_t const row_bytes = GENERATE(16, 48, 592, 656, 1152, 2624);
  int const lanes             = GENERATE(0, 4, 8, 16, 32);
  int const layers            = row_bytes % 656 == 0 ? int(row_bytes / 656) : 1;
  std::size_t const layer     = row_bytes / std::size_t(layers);
  for (int round = 0; round < 3; ++round) {
    int const capacity = 1 + int(rng() % 3000);
    int const count    = int(rng() % std::uint64_t(capacity + 1));
    int const slots    = capacity + int(rng() % 100);
    auto const plan    = random_plan(rng, pool, row_bytes, capacity, slots);
    int const first    = int(rng() % std::uint64_t(layers));
    int const last     = first + 1 + int(rng() % std::uint64_t(layers - first));
    std::size_t const begin = round == 0 ? 0 : std::size_t(first) * layer;
    std::size_t const end   = round == 0 ? row_bytes : std::size_t(last) * layer;

    test::device_vector<miss_entry> entries(plan);
    test::device_vector<std::int32_t> n(std::vector<std::int32_t>{count});
    test::device_vector<std::byte> slab(std::size_t(slots) * row_bytes);
    slab.fill_bytes(0xA5);  // poison: unwritten bytes show
    retrieve_params p{};
    p.plan            = {entries.data(), n.data(), capacity};
    p.slab            = slab.data();
    p.group_row_bytes = row_bytes;
    p.byte_begin      = begin;
    p.byte_end        = end;
    p.lanes_per_row   = lanes;
    int const blocks  = round == 2 ? 1 + int(rng() % 7) : 0;  // also tiny grids (grid-stride)
    REQUIRE(retrieve_async(p, blocks, stream) == cudaSuccess);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    std::vector<std::byte> const poisoned(slab.size(), std::byte{0xA5});
    auto const want = reference_gather(poisoned, plan, count, pool, row_bytes, begin, end);
    INFO("row " << row_bytes << " lanes " << lanes << " count " << count << " bytes [" << begin << ", " << end << ")");
    REQUIRE(slab.download() == want);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("retrieve: bad arguments are refused and launch nothing", "[retrieve][gpu]")
{
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  test::device_vector<miss_entry> entries(4);
  test::device_vector<std::int32_t> n(std::vector<std::int32_t>{0});
  test::device_vector<std::byte> slab(4 * 656);
  retrieve_params p{};
  p.plan            = {entries.data(), n.data(), 4};
  p.slab            = slab.data();
  p.group_row_bytes = 656;
  p.byte_end        = 656;
  p.lanes_per_row   = 12;
  CHECK(retrieve_async(p, 0, stream) == cudaErrorInvalidValue);
  CHECK_THAT(retrieve_params_problem(p), Catch::Contains("lanes_per_row"));
  p.lanes_per_row = 0;
  p.byte_end      = 650;
  CHECK(retrieve_async(p, 0, stream) == cudaErrorInvalidValue);
  CHECK_THAT(retrieve_params_problem(p), Catch::Contains("byte_end"));
  p.byte_end = 656;
  CHECK(retrieve_params_problem(p).empty());
  CHECK(retrieve_async(p, 0, stream) == cudaSuccess);

  std::size_t const ws_bytes = order_plan_workspace_size(std::size_t{1} << 20, 4);
  test::device_vector<std::byte> ws(ws_bytes);
  ws.fill_bytes(0);
  plan_order_params o{p.plan, slab.data(), std::size_t{1} << 20, 0};
  CHECK(order_plan_async(o, ws.data(), ws_bytes - 16, stream) == cudaErrorInvalidValue);
  CHECK_THAT(plan_order_problem(o, ws.data(), ws_bytes - 16), Catch::Contains("workspace_bytes"));
  CHECK(order_plan_async(o, nullptr, ws_bytes, stream) == cudaErrorInvalidValue);
  CHECK_THAT(plan_order_problem(o, nullptr, ws_bytes), Catch::Contains("workspace is null"));
  plan_order_params empty_range = o;
  empty_range.host_bytes        = 0;
  CHECK(order_plan_async(empty_range, ws.data(), ws_bytes, stream) == cudaErrorInvalidValue);
  CHECK_THAT(plan_order_problem(empty_range, ws.data(), ws_bytes), Catch::Contains("host_bytes"));
  CHECK(plan_order_problem(o, ws.data(), ws_bytes).empty());
  plan_order_params other_plan = o;
  other_plan.plan.entries      = nullptr;
  CHECK(retrieve_async(p, other_plan, ws.data(), ws_bytes, 0, stream) == cudaErrorInvalidValue);
  CHECK(retrieve_async(p, o, ws.data(), ws_bytes, 0, stream) == cudaSuccess);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

TEST_CASE("order_plan_async: plans sorted by host address, slot, position; workspace left zeroed",
          "[retrieve][order][gpu]")
{
  auto rng = test::seeded_engine("plan order");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  std::size_t const pool_bytes = GENERATE(std::size_t{1} << 16, std::size_t{3} << 20, std::size_t{9} << 20);
  mapped_pool pool(pool_bytes, rng);
  int const capacity = 6000;
  std::size_t const ws_bytes = order_plan_workspace_size(pool_bytes, capacity);
  test::device_vector<std::byte> ws(ws_bytes);
  ws.fill_bytes(0);
  test::device_vector<miss_entry> entries(static_cast<std::size_t>(capacity));
  test::device_vector<std::int32_t> n(1);
  for (int round = 0; round < 6; ++round) {
    std::size_t const row_bytes = round % 3 == 0 ? 16 : (round % 3 == 1 ? 656 : 2624);
    int const count             = round == 0 ? capacity : int(rng() % std::uint64_t(capacity + 1));
    auto plan = random_plan(rng, pool, row_bytes, capacity, capacity);
    // A few entries outside the declared range (they go last) on some rounds.
    std::size_t const range = round == 4 ? pool_bytes / 2 : pool_bytes;
    std::int32_t const min_entries = round == 5 ? count + 1 : (round == 3 ? count : 0);
    entries.upload(plan);
    n.upload(std::vector<std::int32_t>{count});
    plan_order_params o{{entries.data(), n.data(), capacity}, pool.device(), range, min_entries};
    REQUIRE(order_plan_async(o, ws.data(), ws_bytes, stream) == cudaSuccess);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    auto const got  = entries.download();
    auto const want = count >= std::max(min_entries, 2) ? reference_order(plan, count, pool.device(), range) : plan;
    INFO("round " << round << " count " << count << " range " << range);
    REQUIRE(std::equal(got.begin(), got.end(), want.begin(), same_entry));
    // The histogram part of the workspace is zero again.
    auto const w = ws.download();
    std::uint32_t nonzero = 0;
    std::size_t const counts_bytes = order_plan_workspace_size(pool_bytes, 0) / 2;
    for (std::size_t i = 0; i < counts_bytes; ++i) { nonzero += w[i] != std::byte{0}; }
    REQUIRE(nonzero == 0);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("order_plan_async: an over-full bucket keeps arrival order, the rest stays sorted",
          "[retrieve][order][gpu]")
{
  auto rng = test::seeded_engine("plan order overflow");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  mapped_pool pool(std::size_t{1} << 20, rng);
  int const capacity = 7000;
  // 5000 entries read the same row (more than one bucket ranks), 2000 random ones.
  std::vector<miss_entry> plan(static_cast<std::size_t>(capacity));
  std::byte* const hot = pool.device() + 4096 * 17;
  for (int i = 0; i < capacity; ++i) {
    std::byte const* src = i < 5000 ? hot : pool.device() + (rng() % (pool.bytes() / 64)) * 64;
    plan[std::size_t(i)] = miss_entry{src, i, std::int32_t(rng() % 1000)};
  }
  std::shuffle(plan.begin(), plan.end(), rng);
  test::device_vector<miss_entry> entries(plan);
  test::device_vector<std::int32_t> n(std::vector<std::int32_t>{capacity});
  std::size_t const ws_bytes = order_plan_workspace_size(pool.bytes(), capacity);
  test::device_vector<std::byte> ws(ws_bytes);
  ws.fill_bytes(0);
  plan_order_params o{{entries.data(), n.data(), capacity}, pool.device(), pool.bytes(), 0};
  REQUIRE(order_plan_async(o, ws.data(), ws_bytes, stream) == cudaSuccess);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  auto got = entries.download();
  // Addresses never decrease across buckets; within the hot row's bucket any order.
  for (std::size_t i = 1; i < got.size(); ++i) {
    bool const same_bucket = (got[i].src - pool.device()) / 32 == (got[i - 1].src - pool.device()) / 32;
    if (!same_bucket) { REQUIRE(got[i - 1].src < got[i].src); }
  }
  // A permutation of the input.
  auto key = [](miss_entry const& e) { return std::make_tuple(reinterpret_cast<std::uintptr_t>(e.src), e.slot, e.position); };
  auto sorted_plan = plan;
  std::sort(sorted_plan.begin(), sorted_plan.end(), [&](auto const& a, auto const& b) { return key(a) < key(b); });
  std::sort(got.begin(), got.end(), [&](auto const& a, auto const& b) { return key(a) < key(b); });
  REQUIRE(std::equal(got.begin(), got.end(), sorted_plan.begin(), same_entry));
  cudaStreamDestroy(stream);
}

TEST_CASE("retrieve in address order: rows of interleaved requests in a host_store, graph-captured",
          "[retrieve][order][gpu]")
{
  auto rng = test::seeded_engine("ordered retrieve");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Four requests grown in turns, so their pages interleave in the store; groups of 1 and
  // 4 layers of 656-byte rows.
  host_store_config cfg;
  cfg.capacity_pages  = 96;
  cfg.tokens_per_page = 32;
  std::vector<int> const layers = {1, 4};
  int const requests = 4, max_context = 700;
  host_store store(cfg, layers, 656, requests, max_context, stream);
  detail::staging_uploader uploader;
  for (int step = 1; step * 100 <= max_context; ++step) {
    for (int r = 0; r < requests; ++r) { store.grow(r, std::min(max_context, step * 100 + r * 13), uploader, stream); }
  }
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  std::size_t const store_bytes = store.page_bytes() * store.capacity_pages();
  // Fill every backed row with random bytes on the host.
  for (int r = 0; r < requests; ++r) {
    for (int g = 0; g < 2; ++g) {
      for (std::int64_t pos = 0; pos < store.capacity(r); ++pos) {
        for (int l = 0; l < layers[g]; ++l) {
          std::byte* row = store.row(r, g, l, pos);
          for (int i = 0; i < 656; i += 8) {
            std::uint64_t const v = rng() | 1u;
            std::memcpy(row + i, &v, 8);
          }
        }
      }
    }
  }
  host_store_ref const ref = store.ref();
  // Device address of a host row: both mappings are linear over one allocation, so the
  // offset from request 0's first row (page table[0], group 0) carries over.
  std::vector<std::int32_t> table(1);
  DHISPARSE_CUDA_TRY(cudaMemcpy(table.data(), ref.page_table, 4, cudaMemcpyDeviceToHost));
  std::byte* const dev_page0  = ref.base + std::size_t(table[0]) * ref.page_bytes;
  std::byte* const host_page0 = store.row(0, 0, 0, 0);
  auto device_row = [&](int r, int g, std::int32_t pos) { return dev_page0 + (store.row(r, g, 0, pos) - host_page0); };

  for (int g = 0; g < 2; ++g) {
    std::size_t const row_bytes = std::size_t(layers[g]) * 656;
    int const capacity          = 4 * 256;
    int const slots             = capacity;
    // Plans as resolve emits them: request after request (random order), each request's
    // misses in position order; several plans replayed through one captured graph.
    auto make_plan = [&](int count) {
      std::vector<miss_entry> plan(static_cast<std::size_t>(capacity), miss_entry{nullptr, 0, 0});
      std::vector<std::int32_t> slot_ids(static_cast<std::size_t>(slots));
      std::iota(slot_ids.begin(), slot_ids.end(), 0);
      std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
      std::vector<int> order(requests);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      int i = 0;
      for (int k = 0; k < requests && i < count; ++k) {
        int const r = order[std::size_t(k)];
        std::vector<std::int32_t> pos(static_cast<std::size_t>(store.capacity(r)));
        std::iota(pos.begin(), pos.end(), 0);
        std::shuffle(pos.begin(), pos.end(), rng);
        int const take = std::min<int>(count - i, k + 1 == requests ? count - i : count / requests);
        std::sort(pos.begin(), pos.begin() + take);
        for (int t = 0; t < take; ++t, ++i) {
          plan[std::size_t(i)] = miss_entry{device_row(r, g, pos[std::size_t(t)]), slot_ids[std::size_t(i)],
                                            pos[std::size_t(t)]};
        }
      }
      return plan;
    };
    test::device_vector<miss_entry> entries(static_cast<std::size_t>(capacity));
    test::device_vector<std::int32_t> n(1);
    test::device_vector<std::byte> slab(std::size_t(slots) * row_bytes);
    std::size_t const ws_bytes = order_plan_workspace_size(store_bytes, capacity);
    test::device_vector<std::byte> ws(ws_bytes);
    ws.fill_bytes(0);
    retrieve_params p{};
    p.plan            = {entries.data(), n.data(), capacity};
    p.slab            = slab.data();
    p.group_row_bytes = row_bytes;
    p.byte_begin      = 0;
    p.byte_end        = row_bytes;
    plan_order_params const o{p.plan, ref.base, store_bytes, 0};

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    REQUIRE(retrieve_async(p, o, ws.data(), ws_bytes, 0, stream) == cudaSuccess);
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
    DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      int const count = replay == 0 ? capacity : 1 + int(rng() % std::uint64_t(capacity));
      auto const plan = make_plan(count);
      entries.upload(plan);
      n.upload(std::vector<std::int32_t>{count});
      slab.fill_bytes(0x3C);
      DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      auto const got_plan = entries.download();
      auto const got      = slab.download();
      // The plan is in address order now, and every slot holds its row's bytes.
      for (int i = 1; i < count; ++i) { REQUIRE(got_plan[std::size_t(i - 1)].src < got_plan[std::size_t(i)].src); }
      std::vector<int> copied(static_cast<std::size_t>(slots), 0);
      for (int i = 0; i < count; ++i) {
        miss_entry const& e = got_plan[std::size_t(i)];
        // Find the request of the entry by its position and source (the plan keeps both).
        bool found = false;
        for (int r = 0; r < requests && !found; ++r) {
          if (e.position >= store.capacity(r) || device_row(r, g, e.position) != e.src) { continue; }
          found = true;
          std::byte const* want = store.row(r, g, 0, e.position);
          INFO("group " << g << " replay " << replay << " entry " << i);
          REQUIRE(std::memcmp(got.data() + std::size_t(e.slot) * row_bytes, want, row_bytes) == 0);
          copied[std::size_t(e.slot)] = 1;
        }
        REQUIRE(found);
      }
      for (int s = 0; s < slots; ++s) {
        if (!copied[std::size_t(s)]) { REQUIRE(got[std::size_t(s) * row_bytes] == std::byte{0x3C}); }
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}
