// kv_hierarchy on the GPU against its host reference, step by step (tests/hierarchy/twin.cuh):
// the same hits, misses and evictions, exact bytes in every slot handed to attention,
// exact rows in the host store after backup; CUDA-graph replay; bad inputs.
#include "random.hpp"
#include "twin.cuh"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

using namespace dhisparse;
using test::stream_guard;
using test::test_scale;

namespace {

constexpr int K      = 128;
constexpr int budget = 640;  // ≥ the essential set at Q = 4: 4 × 128 + 4 × (4 + 2)

hierarchy_config twin_config(int max_queries, host_memory memory)
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = 6;
  c.max_batch              = 6;
  c.max_queries            = max_queries;
  c.max_top_k              = K;
  c.max_context            = 8192;
  c.device_slots_per_group = 6 * budget + 64;
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 32;
  c.host.capacity_pages    = 6 * 8192 / 32;
  c.host.memory            = memory;
  return c;
}

template <class Row>
using twin = test::twin<Row, policy::lru, policy::static_budget<budget>>;

}  // namespace

TEMPLATE_TEST_CASE("GPU decode steps match the host reference exactly", "[hierarchy][gpu]",
                   row_format::mla_fp8_656, row_format::mla_bf16_576, row_format::opaque<64>)
{
  auto rng                 = test::seeded_engine("hierarchy gpu decode");
  std::uint64_t const salt = rng();
  stream_guard stream;
  host_memory const memory = GENERATE(host_memory::pinned, host_memory::huge_pages);
  auto config              = twin_config(1, memory);
  // The huge-page variant backs up with the smallest grid (one block, 8 warps round-robin
  // over both groups' rows): a paced backup loses nothing.
  if (memory == host_memory::huge_pages) { config.backup_blocks = 1; }
  // The pinned variant orders every plan by host address before gathering it (the twin
  // checks the order and that the same rows land in the same slots).
  if (memory == host_memory::pinned) {
    config.order_plans             = true;
    config.order_plans_min_entries = 0;
  }
  twin<TestType> t(config, salt, stream.s);
  t.admit(101, 1500, 4000);
  t.admit(202, 90, 2000);
  t.admit(303, 2600, 4000);
  t.set_batch({101, 202, 303}, {1, 1, 1});
  int const steps = int(30 * test_scale());
  for (int s = 0; s < steps; ++s) { t.step(rng, K, nullptr, s % 2 == 1); }
  // Requests come and go: the released request's slots and pages are reused.
  t.release(202);
  t.admit(404, 700, 3000);
  t.set_batch({404, 101, 303}, {1, 1, 1});
  // Selections as an indexer emits them: any order, repeated positions, -1 anywhere.
  t.style() = {true, true, true};
  for (int s = 0; s < steps; ++s) { t.step(rng, K - 5 * (s % 3), nullptr, true); }
  t.check_host_store();
}

TEST_CASE("GPU verify steps (Q > 1) share misses and recycle rejected tails like the reference",
          "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu verify");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config = twin_config(4, host_memory::pinned);
  // Plans ordered by host address (every plan, or none below the default threshold), or not.
  auto const [order, min_entries] = GENERATE(table<bool, std::int32_t>({{false, 0}, {true, 0}, {true, 8192}}));
  config.order_plans              = order;
  config.order_plans_min_entries  = min_entries;
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  t.admit(1, 1200, 4000);
  t.admit(2, 300, 4000);
  t.set_batch({1, 2}, {4, 2});
  int const steps = int(20 * test_scale());
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> accepted = {std::int32_t(rng() % 5), std::int32_t(rng() % 3)};
    t.step(rng, 64, &accepted, true);
  }
  t.check_host_store();
}

// Long verify steps at full size: K = 2048, up to Q = 8, 72 requests. The step has more
// lookup tiles than lookup's grid (at most 8 blocks per SM), so a block looks up several
// tiles of four entries per thread, dead tiles (queries a request does not have) among
// them; owned lists near 16 448 rows (prewarmed) make each victim rescan several rounds
// per thread and pass.
TEST_CASE("GPU steps with more lookup tiles than blocks and long owned lists match the reference",
          "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu many tiles");
  std::uint64_t const salt = rng();
  stream_guard stream;
  constexpr int requests = 72, big_k = 2048, queries = 8, context = 20480;
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = requests;
  c.max_batch              = requests;
  c.max_queries            = queries;
  c.max_top_k              = big_k;
  c.max_context            = context;
  c.device_slots_per_group = std::int64_t(requests) * 16448;
  c.map_page_positions     = 1024;
  c.host.tokens_per_page   = 64;
  c.host.capacity_pages    = requests * context / 64;
  test::twin<row_format::opaque<64>, policy::lru, policy::static_budget<16448>> t(c, salt, stream.s);
  std::vector<std::uint64_t> ids;
  for (int r = 0; r < requests; ++r) {
    ids.push_back(std::uint64_t(r + 1));
    t.admit(ids.back(), 16000 + std::int32_t(rng() % 3000), context);
    t.prewarm(ids.back(), 16400);  // 48 rows below the cap: the first steps evict
  }
  int const steps = int(4 * test_scale());
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> q(requests), accepted(requests);
    for (int b = 0; b < requests; ++b) {
      q[b]        = 1 + std::int32_t(rng() % queries);
      accepted[b] = std::int32_t(rng() % (q[b] + 1));
    }
    t.set_batch(ids, q);
    t.style() = {rng() % 2 == 0, rng() % 2 == 0, rng() % 2 == 0};
    t.step(rng, big_k - int(rng() % 4), &accepted, true);
  }
  group_counters counters{};
  t.gpu().read_counters(0, &counters, stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
  CHECK(counters.evicted_rows > 0);
  t.check_host_store();
}

// F19 (docs/reliability.md): an entry that load_batch leaves out because it repeats an
// earlier entry's request still ran allocate, and its block wrote back the request's spare
// and owned counts it had read before the real entry's block took spares — the spares came
// back and were handed out again while holding committed rows. Many repeats of requests
// whose rows are all resident (their allocation is as short as a repeat's) make the
// interleaving likely on every step; the twin compares every request's spare and owned
// counts and every resident row's bytes after each step.
TEST_CASE("GPU batch entries that repeat a request take no part in the step", "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu repeated entries");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config         = twin_config(4, host_memory::pinned);
  config.max_requests = 32;  // max_batch ≤ max_requests; three of them are admitted
  config.max_batch    = 32;
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  std::vector<std::uint64_t> const ids = {1, 2, 3};
  for (std::uint64_t id : ids) { t.admit(id, std::int32_t(40 + 30 * id), 4000); }
  std::vector<std::uint64_t> entries;
  for (int b = 0; b < config.max_batch; ++b) { entries.push_back(ids[std::size_t(b) % ids.size()]); }
  int const steps = int(20 * test_scale());
  for (int s = 0; s < steps; ++s) {
    t.load_batch(entries, std::vector<std::int32_t>(entries.size(), 4));
    std::vector<std::int32_t> accepted(entries.size(), 0);
    for (std::size_t b = 0; b < ids.size(); ++b) { accepted[b] = std::int32_t(rng() % 5); }
    t.step(rng, 32, &accepted, true);
  }
  t.check_host_store();
}

TEST_CASE("a step captured in CUDA graphs replays with new selections exactly",
          "[hierarchy][gpu][graph]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu graph");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto const config = twin_config(1, host_memory::pinned);
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  t.admit(1, 800, 4000);
  t.admit(2, 2000, 4000);
  t.admit(3, 50, 4000);
  t.set_batch({1, 2, 3}, {1, 1, 1});
  t.step(rng, K, nullptr, true);  // one eager step first

  // Two graphs, so that the comparison can look at the tail slots before commit consumes
  // them: (resolve, retrieve, model writes tails) for every group, then (commit, backup).
  twin<row_format::mla_fp8_656>::layers_graph layers(t, K);
  cudaGraph_t commit_graph{};
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
  t.gpu().commit(nullptr, stream.s);
  t.gpu().backup(stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream.s, &commit_graph));
  cudaGraphExec_t commit_exec{};
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&commit_exec, commit_graph, 0));

  int const steps = int(10 * test_scale());
  for (int s = 0; s < steps; ++s) {
    if (s == steps / 2) {  // a new batch between replays: the graph reads it from device memory
      t.set_batch({3, 1}, {1, 1});
    }
    layers.replay(rng);
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(commit_exec, stream.s));
    t.ref().commit(nullptr);
    t.ref().backup();
    t.advance_lengths(nullptr);
    REQUIRE(t.gpu().status_sync(stream.s) == t.ref().status());
  }
  t.check_host_store();
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(commit_exec));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(commit_graph));
}

TEST_CASE("GPU bad inputs: clear errors, flagged entries, nothing corrupted", "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu bad input");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config                  = twin_config(4, host_memory::pinned);
  config.host.capacity_pages   = 300;
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  auto& gpu = t.gpu();
  t.admit(1, 1000, 2000);
  t.admit(2, 500, 1000);
  t.set_batch({1, 2}, {1, 1});
  t.step(rng, K, nullptr, true);

  // Host-side checks throw before anything is enqueued.
  auto const& sel_buffer = t.d_selections();
  REQUIRE_THROWS_WITH(gpu.resolve(0, sel_buffer.data(), K + 1, stream.s), Catch::Contains("top_k"));
  REQUIRE_THROWS_WITH(gpu.resolve(2, sel_buffer.data(), K, stream.s), Catch::Contains("group 2"));
  REQUIRE_THROWS_WITH(gpu.resolve(0, nullptr, K, stream.s), Catch::Contains("selections"));
  REQUIRE_THROWS_WITH(gpu.retrieve(0, stream.s, 1, 3), Catch::Contains("layer range"));
  REQUIRE_THROWS_WITH(gpu.release(request_id{77}, stream.s), Catch::Contains("unknown request id 77"));
  REQUIRE_THROWS_WITH(gpu.admit(request_id{1}, 10, stream.s), Catch::Contains("already admitted"));
  REQUIRE_THROWS_WITH(gpu.admit(request_id{9}, 10, stream.s, 9000), Catch::Contains("capacity"));
  std::size_t const free_pages = gpu.store().free_pages();
  REQUIRE_THROWS_WITH(gpu.admit(request_id{9}, 8000, stream.s, 8100), Catch::Contains("host store exhausted"));
  REQUIRE_THROWS_WITH(gpu.reserve(request_id{2}, 8100, stream.s), Catch::Contains("host store exhausted"));
  REQUIRE(gpu.store().free_pages() == free_pages);
  REQUIRE(!gpu.contains(request_id{9}));
  request_id const dup[2]   = {request_id{1}, request_id{1}};
  std::int32_t const q2[2]  = {1, 1};
  std::int32_t const q_big  = 5;
  REQUIRE_THROWS_WITH(gpu.set_batch(dup, q2, 2, stream.s), Catch::Contains("appears twice"));
  REQUIRE_THROWS_WITH(gpu.set_batch(dup, &q_big, 1, stream.s), Catch::Contains("queries[0]"));
  REQUIRE_THROWS_WITH(gpu.set_batch(dup, q2, 7, stream.s), Catch::Contains("max_batch"));
  {
    hierarchy_config bad = config;
    bad.device_slots_per_group = budget - 1;
    using gpu_type = twin<row_format::mla_fp8_656>::gpu_type;
    REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("essential floor of one request"));
    bad = config;
    bad.max_top_k = 256;  // 4 × 256 selections no longer fit a budget of 640
    REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("smaller than its essential set"));
    bad = config;
    std::byte* misaligned = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&misaligned, 64));
    bad.slab_memory = {misaligned + 8, misaligned + 8};
    REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("16-byte aligned"));
    cudaFree(misaligned);
  }

  // Device-side: positions out of range are flagged and served as empty, identically on
  // both sides; the rest of the step is exact (compare checks every entry).
  for (int round = 0; round < 8; ++round) {
    for (int g = 0; g < config.num_groups(); ++g) {
      auto sel = t.make_selections(rng, K);
      std::size_t const per_b = std::size_t(config.max_queries) * K;
      switch (round % 4) {
        case 0: sel[5] = t.lengths()[1] + 1; break;              // beyond its query's causal limit
        case 1: sel[per_b + 2] = -2; break;                      // negative
        case 2: sel[7] = 1 << 30; break;                         // out of range
        case 3: sel[per_b + 9] = -7; break;                      // negative
      }
      t.d_selections().upload_prefix(sel);
      gpu.resolve(g, t.d_selections().data(), K, stream.s);
      gpu.retrieve(g, stream.s);
      t.ref().resolve(g, sel.data(), K);
      t.ref().retrieve(g);
      REQUIRE((gpu.status_sync(stream.s) & status_invalid_selection) != 0);
      t.compare(g, sel, K);
      t.stage_tails(g);
      t.write_tails_gpu(g);
      t.write_tails_ref(g);
    }
    std::vector<std::int32_t> accepted = {round % 3 == 0 ? 3 : 1, 1};  // 3 > queries: invalid
    t.finish_step(&accepted, true);
    REQUIRE(((gpu.status_sync(stream.s) & status_invalid_accept_count) != 0) == (round % 3 == 0));
    gpu.clear_status(stream.s);
    t.ref().clear_status();
  }

  // The floor promise: Q = 4 disjoint selections (4 × 128 rows and 4 tails) always get
  // their slots, and every slot handed out is exact.
  t.set_batch({1}, {4});
  auto sel = t.make_selections(rng, K);
  std::int32_t const len = t.lengths()[1];
  for (int q = 0; q < 4; ++q) {
    for (int k = 0; k < K; ++k) { sel[std::size_t(q) * K + k] = q * 240 + k; }  // 4 × 128 distinct
  }
  REQUIRE(len > 4 * 240);
  for (int g = 0; g < config.num_groups(); ++g) {
    t.resolve(g, sel, K);
    REQUIRE((gpu.status_sync(stream.s) & status_budget_exceeded) == 0);
    t.stage_tails(g);
    t.write_tails_gpu(g);
    t.write_tails_ref(g);
  }
  std::vector<std::int32_t> none = {0};
  t.finish_step(&none, true);
  t.check_host_store();
}

TEST_CASE("GPU admission refuses floors the pool cannot hold, changing nothing", "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu floors");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config                   = twin_config(1, host_memory::pinned);
  config.device_slots_per_group = 2 * budget + 10;  // two requests' floors
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  t.admit(1, 900, 2000);
  t.admit(2, 600, 2000);
  std::size_t const pages = t.gpu().store().free_pages();
  REQUIRE_THROWS_WITH(t.gpu().admit(request_id{3}, 100, stream.s), Catch::Contains("budget floors"));
  REQUIRE_THROWS_WITH(t.ref().admit(request_id{3}, 100), Catch::Contains("budget floors"));
  REQUIRE(!t.gpu().contains(request_id{3}));
  REQUIRE(t.gpu().store().free_pages() == pages);
  REQUIRE(t.gpu().floor_sum() == 2 * budget);
  REQUIRE_THROWS_WITH(t.gpu().set_pool_limit(0, 2 * budget - 1, stream.s), Catch::Contains("below the budget floors"));
  REQUIRE(t.gpu().pool_limit(0) == config.device_slots_per_group);
  // The admitted requests run untouched; after a release the third fits.
  t.set_batch({1, 2}, {1, 1});
  for (int s = 0; s < 5 * test_scale(); ++s) { t.step(rng, K, nullptr, true); }
  t.release(1);
  t.admit(3, 100, 2000);
  t.set_batch({3, 2}, {1, 1});
  for (int s = 0; s < 5 * test_scale(); ++s) { t.step(rng, K, nullptr, true); }
  t.check_host_store();
}

TEST_CASE("GPU dirty rows are never evicted, even when backup is late", "[hierarchy][gpu]")
{
  // Without backups the dirty list overflows and the request runs out of evictable rows:
  // the status says so, rows left without a slot are -1, and no committed row is lost.
  auto rng                 = test::seeded_engine("hierarchy gpu late backup");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config = twin_config(4, host_memory::pinned);
  // The default grid, and grids of fewer warps than dirty rows (the list and the overflow
  // scan dealt round-robin over both groups).
  config.backup_blocks = GENERATE(0, 1, 3);
  twin<row_format::mla_fp8_656> t(config, salt, stream.s);
  t.admit(1, 600, 8000);
  t.set_batch({1}, {4});
  std::uint32_t seen = 0;
  for (int s = 0; s < 200 && (seen & status_budget_exceeded) == 0; ++s) {
    t.step(rng, K, nullptr, false);
    seen |= t.gpu().status_sync(stream.s);
  }
  REQUIRE((seen & status_dirty_list_overflow) != 0);
  REQUIRE((seen & status_budget_exceeded) != 0);
  t.check_host_store();  // the final backup copies every dirty row still resident
}

TEST_CASE("host store in caller memory; caller-owned slabs", "[hierarchy][gpu]")
{
  auto rng                 = test::seeded_engine("hierarchy gpu caller memory");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config = twin_config(1, host_memory::caller);
  std::size_t const page_bytes = std::size_t(config.host.tokens_per_page) * 3 * row_format::mla_fp8_656::bytes;
  std::size_t const bytes = page_bytes * config.host.capacity_pages;
  void* host = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  config.host.caller_memory = host;
  config.host.caller_bytes  = bytes;
  std::vector<void*> slabs;
  for (int g = 0; g < config.num_groups(); ++g) {
    void* p = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&p, std::size_t(config.device_slots_per_group) * config.group_layers[g] *
                                        row_format::mla_fp8_656::bytes));
    slabs.push_back(p);
  }
  config.slab_memory = slabs;
  {
    twin<row_format::mla_fp8_656> t(config, salt, stream.s);
    REQUIRE(t.gpu().layer_rows(0, 0).rows == slabs[0]);
    t.admit(1, 700, 2000);
    t.set_batch({1}, {1});
    for (int s = 0; s < 10; ++s) { t.step(rng, K, nullptr, true); }
    t.check_host_store();
    REQUIRE(t.gpu().host_row(request_id{1}, 0, 0, 0) >= static_cast<std::byte*>(host));
    REQUIRE(t.gpu().host_row(request_id{1}, 0, 0, 0) < static_cast<std::byte*>(host) + bytes);
  }
  for (void* p : slabs) { cudaFree(p); }
  std::free(host);
  auto bad                 = twin_config(1, host_memory::caller);
  bad.host.caller_memory   = nullptr;
  using gpu_type           = twin<row_format::mla_fp8_656>::gpu_type;
  REQUIRE_THROWS_WITH(gpu_type(bad, stream.s), Catch::Contains("caller_memory"));
}

TEST_CASE("an engine's host KV pool adopted in place: its page layout, its pages", "[hierarchy][gpu]")
{
  using row                = row_format::mla_fp8_656;
  auto rng                 = test::seeded_engine("hierarchy gpu adopt");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config   = twin_config(1, host_memory::caller);
  int const tpp = config.host.tokens_per_page;
  // The engine's page: position-major, a position's three layer rows together (group 1's
  // layer first), 32 bytes of padding after each position and 64 at the page's end.
  std::size_t const stride = 3 * row::bytes + 32;
  config.host.groups       = {{row::bytes, stride}, {0, stride}};
  config.host.page_bytes   = tpp * stride + 64;
  std::size_t const bytes  = config.host.page_bytes * config.host.capacity_pages;
  auto* host                = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  std::memset(host, 0, bytes);
  config.host.caller_memory = host;
  config.host.caller_bytes  = bytes;
  auto engine_row = [&](std::int32_t page, int g, int l, std::int64_t pos) {
    return host + std::size_t(page) * config.host.page_bytes + config.host.groups[std::size_t(g)].offset +
           std::size_t(pos % tpp) * stride + std::size_t(l) * row::bytes;
  };
  {
    twin<row> t(config, salt, stream.s);
    REQUIRE(t.gpu().store().page_bytes() == config.host.page_bytes);
    // Request 7's 1000 prefill positions in 32 of the engine's pages, scattered.
    std::vector<std::int32_t> pages;
    for (int k = 0; k < 32; ++k) { pages.push_back(std::int32_t(700 - 7 * k)); }
    for (std::int32_t pos = 0; pos < 1000; ++pos) {
      for (int g = 0; g < config.num_groups(); ++g) {
        for (int l = 0; l < config.group_layers[g]; ++l) {
          test::truth_row(salt, 7, g, l, pos, engine_row(pages[std::size_t(pos / tpp)], g, l, pos), row::bytes);
        }
      }
    }
    std::size_t const free_before = t.gpu().store().free_pages();
    t.adopt(7, 1000, pages, 2000);
    CHECK(t.gpu().store().free_pages() == free_before - std::size_t((2000 + tpp - 1) / tpp));
    CHECK(t.gpu().host_row(request_id{7}, 0, 1, 999) == engine_row(pages[999 / tpp], 0, 1, 999));
    t.admit(8, 300, 1000);
    t.set_batch({7, 8}, {1, 1});
    for (int s = 0; s < 12; ++s) { t.step(rng, K, nullptr, true); }
    t.check_host_store();
    // Committed rows are in the engine's layout, the adopted pages included.
    std::int32_t const length = t.lengths()[7];
    for (std::int32_t pos = 0; pos < length; ++pos) {
      for (int g = 0; g < config.num_groups(); ++g) {
        for (int l = 0; l < config.group_layers[g]; ++l) {
          std::byte const* at = t.gpu().host_row(request_id{7}, g, l, pos);
          if (pos < 32 * tpp) { REQUIRE(at == engine_row(pages[std::size_t(pos / tpp)], g, l, pos)); }
          std::vector<std::byte> want(row::bytes);
          test::truth_row(salt, 7, g, l, pos, want.data(), row::bytes);
          INFO("position " << pos << " group " << g << " layer " << l);
          REQUIRE(std::memcmp(at, want.data(), row::bytes) == 0);
        }
      }
    }

    // Refusals change nothing, on both sides where the reference can tell.
    std::size_t const free_now = t.gpu().store().free_pages();
    auto refused = [&](std::vector<std::int32_t> const& list, std::int32_t len, char const* why, bool ref_too) {
      INFO(why);
      CHECK_THROWS_WITH(t.gpu().adopt(request_id{9}, len, list.data(), list.size(), stream.s), Catch::Contains(why));
      if (ref_too) {
        CHECK_THROWS_WITH(t.ref().adopt(request_id{9}, len, list.data(), list.size()), Catch::Contains(why));
      }
      CHECK(!t.gpu().contains(request_id{9}));
      CHECK(t.gpu().store().free_pages() == free_now);
    };
    refused({pages[3]}, 20, "is held or repeated", false);
    refused({5, 6, 5}, 70, "is held or repeated", true);
    refused({std::int32_t(config.host.capacity_pages)}, 20, "is outside the pool", true);
    refused({-1}, 20, "is outside the pool", true);
    refused({5}, 40, "fewer than length", true);
    refused(std::vector<std::int32_t>(std::size_t(config.max_context / tpp + 1), 0), 20, "max_context", true);
    // Released pages come back: adopted again once the stream passed the release.
    t.release(7);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    std::vector<std::int32_t> const again{pages[0], pages[1]};
    for (std::int32_t pos = 0; pos < 50; ++pos) {
      for (int g = 0; g < config.num_groups(); ++g) {
        for (int l = 0; l < config.group_layers[g]; ++l) {
          test::truth_row(salt, 11, g, l, pos, engine_row(again[std::size_t(pos / tpp)], g, l, pos), row::bytes);
        }
      }
    }
    t.adopt(11, 50, again, 64);
    t.set_batch({11, 8}, {1, 1});
    for (int s = 0; s < 4; ++s) { t.step(rng, K, nullptr, true); }
    t.check_host_store();
  }
  std::free(host);

  // Layouts that cannot hold the rows are refused before anything is allocated.
  using gpu_type = twin<row>::gpu_type;
  auto bad_layout = [&](auto change, char const* why) {
    auto c              = twin_config(1, host_memory::pinned);
    c.host.groups       = {{row::bytes, stride}, {0, stride}};
    c.host.page_bytes   = tpp * stride + 64;
    change(c.host);
    INFO(why);
    CHECK_THROWS_WITH(gpu_type::bytes_required(c), Catch::Contains(why));
  };
  bad_layout([&](host_store_config& h) { h.groups[1].offset = 2 * row::bytes; }, "overlapping");
  bad_layout([&](host_store_config& h) { h.groups[0].token_stride = row::bytes; }, "smaller than the group row");
  bad_layout([&](host_store_config& h) { h.page_bytes = tpp * stride - 64; }, "smaller than the rows of a page");
  bad_layout([&](host_store_config& h) { h.groups[0].offset = 8; }, "multiples of 16");
  bad_layout([&](host_store_config& h) { h.groups.pop_back(); }, "one placement per layer group");
  bad_layout([&](host_store_config& h) { h.page_bytes = 8 + tpp * stride + 64; }, "page_bytes must be a multiple of 16");
}

TEST_CASE("residency map memory stays under 1% of the KV it indexes", "[hierarchy][gpu]")
{
  // Scenario A-like: 128 requests × 100K tokens of 656-byte rows, one group per layer.
  stream_guard stream;
  int const requests = 128, context = 100'000, page = 1024;
  std::size_t const tokens = std::size_t(requests) * context;
  residency_map map(1, page, tokens / page + requests, requests, context, stream.s);
  double const kv = double(tokens) * row_format::mla_fp8_656::bytes;
  INFO("map bytes " << map.device_bytes() << " for " << kv << " bytes of KV");
  REQUIRE(double(map.device_bytes()) <= 0.01 * kv);
}

TEST_CASE("bulk host rows: page runs and asynchronous writes from device and host memory", "[hierarchy][gpu]")
{
  using row                = row_format::mla_fp8_656;
  using gpu_type           = twin<row>::gpu_type;
  auto rng                 = test::seeded_engine("hierarchy gpu bulk host rows");
  stream_guard stream;
  auto const config = twin_config(1, host_memory::pinned);
  gpu_type h(config, stream.s);
  request_id const id{3};
  std::int32_t const length = 500 + std::int32_t(rng() % 3000);
  h.admit(id, length, stream.s);
  std::int64_t const page = config.host.tokens_per_page;

  // A run ends at its page's end (or the request's capacity) and steps by the group row.
  for (int g = 0; g < config.num_groups(); ++g) {
    std::int64_t const first = std::int64_t(rng() % std::uint64_t(length));
    host_row_run const run   = h.host_rows(id, g, 0, first);
    REQUIRE(run.first == h.host_row(id, g, 0, first));
    REQUIRE(run.stride == std::size_t(config.group_layers[g]) * row::bytes);
    std::int64_t const capacity = h.store().capacity(h.request_index(id));
    REQUIRE(run.count == std::min((first / page + 1) * page, capacity) - first);
    REQUIRE(run.first + std::size_t(run.count - 1) * run.stride == h.host_row(id, g, 0, first + run.count - 1));
  }

  // Writes from device memory and from host memory, across page boundaries, with a stride
  // larger than a row; every other row keeps its poison.
  for (int g = 0; g < config.num_groups(); ++g) {
    for (int l = 0; l < config.group_layers[g]; ++l) {
      for (std::int64_t pos = 0; pos < length; ++pos) { std::memset(h.host_row(id, g, l, pos), 0xEE, row::bytes); }
    }
  }
  std::size_t const stride = row::bytes + 32;
  for (int g = 0; g < config.num_groups(); ++g) {
    for (int l = 0; l < config.group_layers[g]; ++l) {
      std::int64_t const first = std::int64_t(rng() % std::uint64_t(length / 2));
      std::int64_t const count = 1 + std::int64_t(rng() % std::uint64_t(length - first));
      std::vector<std::byte> source(std::size_t(count) * stride);
      for (auto& b : source) { b = std::byte(rng()); }
      bool const from_device = ((g + l) & 1) == 0;
      detail::device_array<std::byte> device_source(from_device ? source.size() : 0);
      if (from_device) {
        DHISPARSE_CUDA_TRY(cudaMemcpy(device_source.data(), source.data(), source.size(), cudaMemcpyHostToDevice));
      }
      h.write_host_rows(id, g, l, first, count, from_device ? static_cast<void const*>(device_source.data())
                                                            : static_cast<void const*>(source.data()),
                        stride, stream.s);
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
      std::vector<std::byte> const poison(row::bytes, std::byte{0xEE});
      for (std::int64_t pos = 0; pos < length; ++pos) {
        bool const written = pos >= first && pos < first + count;
        std::byte const* want = written ? source.data() + std::size_t(pos - first) * stride : poison.data();
        INFO("group " << g << " layer " << l << " position " << pos << (from_device ? " (device source)" : ""));
        REQUIRE(std::memcmp(h.host_row(id, g, l, pos), want, row::bytes) == 0);
      }
    }
  }

  // Bad writes throw before anything is enqueued.
  std::vector<std::byte> source(std::size_t(length) * row::bytes);
  std::int64_t const cap = h.store().capacity(h.request_index(id));
  CHECK_THROWS_WITH(h.write_host_rows(request_id{77}, 0, 0, 0, 1, source.data(), row::bytes, stream.s),
                    Catch::Contains("write_host_rows"));
  CHECK_THROWS_WITH(h.write_host_rows(id, 0, 0, cap - 1, 2, source.data(), row::bytes, stream.s),
                    Catch::Contains("not all backed by pages"));
  CHECK_THROWS_WITH(h.write_host_rows(id, 0, 0, 0, 2, nullptr, row::bytes, stream.s), Catch::Contains("null"));
  CHECK_THROWS_WITH(h.write_host_rows(id, 0, 0, 0, 2, source.data(), row::bytes - 16, stream.s),
                    Catch::Contains("row size"));
  CHECK_THROWS_WITH(h.write_host_rows(id, 0, 7, 0, 2, source.data(), row::bytes, stream.s),
                    Catch::Contains("layer"));
}
