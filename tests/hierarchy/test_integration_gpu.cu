/**
 * @file test_integration_gpu.cu
 * @brief The engine-facing additions of issue 17 (items 4, 5, 7) on the GPU:
 *        - `attention_params(g, l)` equals hand-built `sparse_attention::params`, and attention
 *          through it (with a `sparse_attention::plan`) matches the host reference computed
 *          from the host store's rows at the selected positions;
 *        - `release_async` (launch layer, hand-built params from the public views) and
 *          `kv_hierarchy::release` both have exactly the specified effect on the device
 *          state, mid-step included (per-request and shared budgets);
 *        - the counters read on a monitor stream behind an event while the step stream is
 *          still busy (never synchronized), and their byte counts.
 * Built with DHISPARSE_NVTX defined, so the NVTX ranges are compiled here.
 */
#include "gpu_test.cuh"
#include "random.hpp"

#include <dhisparse/hierarchy.cuh>
#include <dhisparse/host/row_format.hpp>
#include <dhisparse/host/sparse_attention.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/release.cuh>
#include <dhisparse/sparse_attention.cuh>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace dhisparse;
namespace sa = dhisparse::sparse_attention;
using row    = row_format::mha<1, 128, bf16>;  // 512-byte rows: K and V of one head
/// 256 slots per request: four requests' floors fill the 1024-slot pools of `small_config`.
using hierarchy = kv_hierarchy<row, policy::lru, policy::static_budget<256>>;

DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mha<1, 128, bf16>);

namespace {

struct stream_guard {
  cudaStream_t s{};
  stream_guard() { DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_guard() { cudaStreamDestroy(s); }
};

hierarchy_config small_config()
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = 4;
  c.max_batch              = 4;
  c.max_queries            = 2;
  c.max_top_k              = 64;
  c.max_context            = 512;
  c.device_slots_per_group = 1024;
  c.map_page_positions     = 128;
  c.host.capacity_pages    = 64;
  c.host.tokens_per_page   = 64;
  return c;
}

/// Random bf16 values in [-1, 1) for every prefill row of every layer (never all zero).
template <class H>
void fill_host_rows(H& h, request_id id, int length, std::mt19937_64& rng)
{
  std::uniform_real_distribution<float> value(-1.f, 1.f);
  std::vector<bf16> buffer(row::bytes / sizeof(bf16));
  for (int g = 0; g < h.config().num_groups(); ++g) {
    for (int l = 0; l < h.config().group_layers[g]; ++l) {
      for (int pos = 0; pos < length; ++pos) {
        for (auto& v : buffer) { v = host::float_to_bf16(value(rng)); }
        std::memcpy(h.host_row(id, g, l, pos), buffer.data(), row::bytes);
      }
    }
  }
}

/// The model's part of a step: every tail row of every layer gets a value (a byte of its
/// slot), as the engine writes them before `commit`. Synchronizes `stream`.
template <class H>
void write_tail_rows(H const& h, cudaStream_t stream)
{
  auto const& c  = h.config();
  std::size_t n  = std::size_t(c.max_batch) * c.max_queries;
  std::vector<std::int32_t> slots(n);
  for (int g = 0; g < c.num_groups(); ++g) {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(slots.data(), h.tail_slots(g), n * sizeof(std::int32_t),
                                       cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    for (int l = 0; l < c.group_layers[g]; ++l) {
      auto const rows = h.layer_rows(g, l);
      for (std::int32_t slot : slots) {
        if (slot < 0) { continue; }
        DHISPARSE_CUDA_TRY(cudaMemsetAsync(rows.rows + std::size_t(slot) * rows.stride, 1 + slot % 251, row::bytes,
                                           stream));
      }
    }
  }
}

/// Per query (b, q < Q_b): `top_k` distinct committed positions (or -1 holes), shuffled.
std::vector<std::int32_t> make_selections(hierarchy_config const& c, std::vector<int> const& lengths,
                                          std::vector<int> const& queries, int top_k, std::mt19937_64& rng)
{
  std::vector<std::int32_t> sel(std::size_t(c.max_batch) * c.max_queries * top_k, -1);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    for (int q = 0; q < queries[b]; ++q) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(lengths[b]));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::int32_t* out = &sel[(b * c.max_queries + q) * top_k];
      for (int k = 0; k < top_k && k < lengths[b]; ++k) { out[k] = (k % 7 == 3) ? -1 : all[std::size_t(k)]; }
    }
  }
  return sel;
}

}  // namespace

TEST_CASE("attention_params: the hierarchy's slot table and slab as sparse attention arguments", "[integration]")
{
  auto rng = test::seeded_engine("attention_params");
  stream_guard stream;
  hierarchy_config const c = small_config();
  hierarchy h(c, stream.s);

  std::vector<request_id> ids{request_id{11}, request_id{22}, request_id{33}};
  std::vector<int> const lengths{100, 150, 200};
  std::vector<int> const queries{2, 1, 2};
  for (std::size_t i = 0; i < ids.size(); ++i) {
    h.admit(ids[i], lengths[i], stream.s);
    fill_host_rows(h, ids[i], lengths[i], rng);
  }
  h.set_batch(ids.data(), queries.data(), int(ids.size()), stream.s);
  CHECK_THROWS_AS(h.attention_params(0, 0), dhisparse::error);  // not resolved yet

  int const top_k = 48;
  int const group = 0;
  auto const selections = make_selections(c, lengths, queries, top_k, rng);
  test::device_vector<std::int32_t> d_sel(selections);
  h.resolve(group, d_sel.data(), top_k, stream.s);
  h.retrieve(group, stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
  REQUIRE(h.status_sync(stream.s) == 0);
  CHECK(h.resolved_top_k(group) == top_k);
  CHECK_THROWS_AS(h.attention_params(group, 2), dhisparse::error);  // group 0 has 2 layers
  CHECK_THROWS_AS(h.attention_params(2, 0), dhisparse::error);

  int const heads = 4;
  test::device_vector<bf16> d_queries(std::size_t(c.max_batch) * c.max_queries * heads * 128);
  {
    std::uniform_real_distribution<float> value(-1.f, 1.f);
    std::vector<bf16> q(d_queries.size());
    for (auto& v : q) { v = host::float_to_bf16(value(rng)); }
    d_queries.upload(q);
  }
  std::vector<bf16> host_queries(d_queries.size());
  DHISPARSE_CUDA_TRY(
    cudaMemcpy(host_queries.data(), d_queries.data(), d_queries.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  sa::plan<row> const plan;
  CHECK(plan.num_sms() > 0);

  for (int layer = 0; layer < c.group_layers[group]; ++layer) {
    sa::params p = h.attention_params(group, layer);

    // What an engine would otherwise assemble by hand.
    layer_view const rows = h.layer_rows(group, layer);
    CHECK(p.rows == rows.rows);
    CHECK(p.row_stride == rows.stride);
    CHECK(p.row_stride == std::size_t(c.group_layers[group]) * row::bytes);
    CHECK(p.num_slots == c.device_slots_per_group);
    CHECK(p.slots == h.slot_table(group));
    CHECK(p.slot_stride_query == top_k);
    CHECK(p.slot_stride_batch == std::int64_t(c.max_queries) * top_k);
    CHECK(p.batch_size == h.batch_ref().size);
    CHECK(p.batch == c.max_batch);
    CHECK(p.num_queries == c.max_queries);
    CHECK(p.top_k == top_k);
    CHECK(p.status == nullptr);
    CHECK(p.queries == nullptr);
    CHECK(p.out == nullptr);

    // The engine adds queries, outputs and the scale; contiguous strides keep the slot strides.
    p.num_heads = heads;
    sa::set_contiguous_strides<row>(p);
    CHECK(p.slot_stride_query == top_k);
    CHECK(p.slot_stride_batch == std::int64_t(c.max_queries) * top_k);
    std::size_t const out_elems = std::size_t(c.max_batch) * c.max_queries * heads * 128;
    test::device_vector<bf16> d_out(out_elems), d_out_cached(out_elems);
    test::device_vector<float> d_lse(std::size_t(c.max_batch) * c.max_queries * heads);
    d_out.fill_bytes(0xFF);
    d_out_cached.fill_bytes(0xFF);
    p.queries       = d_queries.data();
    p.out           = d_out.data();
    p.lse           = d_lse.data();
    p.softmax_scale = 1.f / std::sqrt(128.f);
    std::size_t const ws_bytes = sa::workspace_size(plan, p);
    CHECK(ws_bytes == sa::workspace_size<row>(p));
    test::device_vector<std::byte> ws(std::max<std::size_t>(ws_bytes, 16));
    REQUIRE(sa::run(plan, p, ws.data(), ws_bytes, stream.s) == cudaSuccess);
    sa::params p_cached = p;  // the same call without a plan (cached per device)
    p_cached.out        = d_out_cached.data();
    p_cached.lse        = nullptr;
    REQUIRE(sa::run<row>(p_cached, ws.data(), ws_bytes, stream.s) == cudaSuccess);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    std::vector<bf16> out(out_elems), out_cached(out_elems);
    DHISPARSE_CUDA_TRY(cudaMemcpy(out.data(), d_out.data(), out_elems * sizeof(bf16), cudaMemcpyDeviceToHost));
    DHISPARSE_CUDA_TRY(
      cudaMemcpy(out_cached.data(), d_out_cached.data(), out_elems * sizeof(bf16), cudaMemcpyDeviceToHost));

    // Reference: the rows straight from the host store, addressed by (request, position).
    std::vector<std::byte> store_rows(ids.size() * std::size_t(c.max_context) * row::bytes);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (int pos = 0; pos < lengths[i]; ++pos) {
        std::memcpy(&store_rows[(i * c.max_context + std::size_t(pos)) * row::bytes],
                    h.host_row(ids[i], group, layer, pos), row::bytes);
      }
    }
    std::vector<std::int32_t> ref_slots(selections.size(), -1);
    for (std::size_t b = 0; b < ids.size(); ++b) {
      for (std::size_t e = b * c.max_queries * top_k; e < (b + 1) * c.max_queries * top_k; ++e) {
        if (selections[e] >= 0) { ref_slots[e] = std::int32_t(b * c.max_context + std::size_t(selections[e])); }
      }
    }
    sa::params hp = p;
    hp.queries    = host_queries.data();
    hp.rows       = store_rows.data();
    hp.row_stride = row::bytes;
    hp.num_slots  = std::int64_t(ids.size()) * c.max_context;
    hp.slots      = ref_slots.data();
    hp.batch_size = nullptr;
    std::vector<double> ref(static_cast<std::size_t>(heads) * 128), ref_lse(static_cast<std::size_t>(heads));
    double worst      = 0.0;
    int differ_cached = 0;
    for (std::size_t b = 0; b < ids.size(); ++b) {
      for (int q = 0; q < queries[b]; ++q) {
        REQUIRE(host::sparse_attention_exact<row>(hp, int(b), q, ref.data(), ref_lse.data()) == 0);
        for (int hd = 0; hd < heads; ++hd) {
          std::size_t const base = ((b * c.max_queries + std::size_t(q)) * heads + std::size_t(hd)) * 128;
          double num = 0, den = 0;
          for (int d = 0; d < 128; ++d) {
            double const v = host::bf16_to_float(out[base + std::size_t(d)]);
            double const r = ref[std::size_t(hd) * 128 + std::size_t(d)];
            num += (v - r) * (v - r);
            den += r * r;
            differ_cached += out[base + std::size_t(d)].bits != out_cached[base + std::size_t(d)].bits;
          }
          worst = std::max(worst, std::isnan(num) ? 1e9 : std::sqrt(num / std::max(den, 1e-30)));
        }
      }
    }
    INFO("layer " << layer << ": worst relative L2 error " << worst);
    CHECK(worst < 1e-2);
    CHECK(differ_cached == 0);  // plan and cached plan: the same launch, bit-identical
    // Padding beyond the real batch is never written.
    std::size_t const pad = ids.size() * c.max_queries * heads * 128;
    CHECK(std::all_of(out.begin() + std::ptrdiff_t(pad), out.end(), [](bf16 v) { return v.bits == 0xFFFF; }));
  }

  // The plan refuses an empty plan and bad arguments like `run` does.
  sa::params bad = h.attention_params(group, 0);
  CHECK(sa::run(plan, bad, nullptr, 0, stream.s) == cudaErrorInvalidValue);  // no queries / out
  sa::plan<row> const empty{nullptr};
  bad.num_heads = heads;
  sa::set_contiguous_strides<row>(bad);
  bad.queries       = d_queries.data();
  test::device_vector<bf16> d_out(std::size_t(c.max_batch) * c.max_queries * heads * 128);
  bad.out           = d_out.data();
  bad.softmax_scale = 1.f;
  CHECK(sa::run(empty, bad, nullptr, 0, stream.s) == cudaErrorInvalidValue);
  h.commit(nullptr, stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
}

namespace {

/// Device state a release touches, downloaded.
struct release_snapshot {
  struct group_state {
    std::vector<std::int32_t> owner, position, free_stack, tail_slots;
    std::vector<std::uint32_t> dirty;
    std::vector<std::int32_t> dirty_list;
    std::int32_t free_count = 0, dirty_count = 0;
    std::vector<miss_entry> plan;
  };
  std::vector<group_state> groups;
  std::vector<std::int32_t> batch;  // size, requests, queries
  std::vector<std::int32_t> positions;
  std::vector<std::int32_t> lengths;
};

template <class T>
std::vector<T> download(T const* p, std::size_t n)
{
  std::vector<T> v(n);
  if (n > 0) { DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost)); }
  return v;
}

template <class H>
release_snapshot snapshot(H const& h)
{
  auto const& c = h.config();
  release_snapshot s;
  std::size_t const slots = std::size_t(c.device_slots_per_group);
  for (int g = 0; g < c.num_groups(); ++g) {
    device_pool_ref const pool = h.pool_ref(g);
    release_snapshot::group_state gs;
    gs.owner       = download(pool.owner, slots);
    gs.position    = download(pool.position, slots);
    gs.dirty       = download(pool.dirty, slots);
    gs.free_count  = download(pool.free_count, 1)[0];
    gs.free_stack  = download(pool.free_stack, std::size_t(gs.free_count));
    gs.dirty_count = download(pool.dirty_count, 1)[0];
    gs.dirty_list  = download(pool.dirty_list, std::size_t(std::min(gs.dirty_count, pool.dirty_capacity)));
    gs.tail_slots  = download(h.tail_slots(g), std::size_t(c.max_batch) * c.max_queries);
    miss_plan_ref const plan = h.plan_ref(g);
    std::int32_t const n     = std::min(download(plan.count, 1)[0], plan.capacity);
    gs.plan                  = download(plan.entries, std::size_t(n));
    s.groups.push_back(std::move(gs));
  }
  step_batch_ref const b = h.batch_ref();
  s.batch     = download(b.size, 1 + 2 * std::size_t(c.max_batch));
  s.positions = download(h.query_positions(), std::size_t(c.max_batch) * c.max_queries);
  s.lengths   = download(h.committed_lengths(), std::size_t(c.max_requests));
  return s;
}

/**
 * The specified effect of releasing request `r` (batch entry `entry`, `sources`: its host
 * group rows per group): its slots free, everything else unchanged.
 */
void check_release_effect(release_snapshot const& before, release_snapshot const& after, std::int32_t r, int entry,
                          int max_batch, int max_queries, std::vector<std::set<std::byte const*>> const& sources)
{
  for (std::size_t g = 0; g < before.groups.size(); ++g) {
    auto const& b = before.groups[g];
    auto const& a = after.groups[g];
    INFO("group " << g);
    std::set<std::int32_t> mine;
    for (std::size_t s = 0; s < b.owner.size(); ++s) {
      if (b.owner[s] == r) {
        mine.insert(std::int32_t(s));
        CHECK(a.owner[s] == -1);
        CHECK(a.position[s] == -1);
        CHECK(a.dirty[s] == 0);
      } else {
        CHECK(a.owner[s] == b.owner[s]);
        CHECK(a.position[s] == b.position[s]);
        CHECK(a.dirty[s] == b.dirty[s]);
      }
    }
    CHECK(!mine.empty());  // the test gives the request slots in every group
    REQUIRE(a.free_count == b.free_count + std::int32_t(mine.size()));
    CHECK(std::equal(b.free_stack.begin(), b.free_stack.end(), a.free_stack.begin()));
    std::set<std::int32_t> const pushed(a.free_stack.begin() + b.free_count, a.free_stack.end());
    CHECK(pushed == mine);
    REQUIRE(a.dirty_list.size() == b.dirty_list.size());
    for (std::size_t i = 0; i < b.dirty_list.size(); ++i) {
      bool const scrubbed = b.dirty_list[i] >= 0 && mine.count(b.dirty_list[i]) > 0;
      CHECK(a.dirty_list[i] == (scrubbed ? -1 : b.dirty_list[i]));
    }
    for (int e = 0; e < max_batch; ++e) {
      for (int q = 0; q < max_queries; ++q) {
        std::size_t const i = std::size_t(e) * max_queries + q;
        CHECK(a.tail_slots[i] == (e == entry ? -1 : b.tail_slots[i]));
      }
    }
    REQUIRE(a.plan.size() == b.plan.size());
    int dropped = 0;
    for (std::size_t i = 0; i < b.plan.size(); ++i) {
      bool const its = b.plan[i].src != nullptr && sources[g].count(b.plan[i].src) > 0;
      dropped += its;
      CHECK(a.plan[i].src == (its ? nullptr : b.plan[i].src));
      CHECK(a.plan[i].slot == b.plan[i].slot);
    }
    CHECK(dropped > 0);  // the open step had misses of the request
  }
  // Its batch entry has 0 queries and no positions; the others are untouched.
  for (int e = 0; e < max_batch; ++e) {
    CHECK(after.batch[1 + std::size_t(e)] == before.batch[1 + std::size_t(e)]);
    CHECK(after.batch[1 + std::size_t(max_batch + e)] == (e == entry ? 0 : before.batch[1 + std::size_t(max_batch + e)]));
    for (int q = 0; q < max_queries; ++q) {
      std::size_t const i = std::size_t(e) * max_queries + q;
      CHECK(after.positions[i] == (e == entry ? -1 : before.positions[i]));
    }
  }
  for (std::size_t i = 0; i < before.lengths.size(); ++i) {
    CHECK(after.lengths[i] == (std::int32_t(i) == r ? 0 : before.lengths[i]));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("release_async has the effect of kv_hierarchy::release, mid-step", "[integration]",
                   policy::static_budget<256>, policy::adaptive_budget<>)
{
  using H  = kv_hierarchy<row, policy::lru, TestType>;
  auto rng = test::seeded_engine("release_async");
  stream_guard stream;
  hierarchy_config const c = small_config();
  std::vector<request_id> const ids{request_id{5}, request_id{6}, request_id{7}};
  std::vector<int> const lengths{120, 90, 160};
  std::vector<int> const queries{2, 2, 1};
  int const top_k   = 40;
  int const victim  = 1;  // batch entry released mid-step

  for (bool launch_layer : {false, true}) {
    INFO((launch_layer ? "release_async" : "kv_hierarchy::release"));
    H h(c, stream.s);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      h.admit(ids[i], lengths[i], stream.s);
      h.reserve(ids[i], lengths[i] + 2 * c.max_queries, stream.s);  // two steps of tails
      fill_host_rows(h, ids[i], lengths[i], rng);
    }
    h.set_batch(ids.data(), queries.data(), int(ids.size()), stream.s);
    // One committed step (the victim gets resident, dirty rows), then a step left open:
    // resolved in both groups, its plans not retrieved yet.
    std::vector<int> grown = lengths;
    for (int step = 0; step < 2; ++step) {
      auto const sel = make_selections(c, grown, queries, top_k, rng);
      test::device_vector<std::int32_t> d_sel(sel);
      for (int g = 0; g < c.num_groups(); ++g) {
        h.resolve(g, d_sel.data(), top_k, stream.s);
        if (step == 0) { h.retrieve(g, stream.s); }
      }
      if (step == 0) {
        write_tail_rows(h, stream.s);
        h.commit(nullptr, stream.s);
        for (std::size_t i = 0; i < grown.size(); ++i) { grown[i] += queries[i]; }
      }
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    }
    REQUIRE(h.status_sync(stream.s) == 0);

    int const r = h.request_index(ids[victim]);
    std::vector<std::set<std::byte const*>> sources(std::size_t(c.num_groups()));
    for (int g = 0; g < c.num_groups(); ++g) {
      for (int pos = 0; pos < grown[victim]; ++pos) { sources[std::size_t(g)].insert(h.host_row(ids[victim], g, 0, pos)); }
    }
    release_snapshot const before = snapshot(h);

    if (launch_layer) {
      // What an engine owning its buffers passes: built from the public views only.
      std::vector<device_pool_ref> refs;
      for (int g = 0; g < c.num_groups(); ++g) { refs.push_back(h.pool_ref(g)); }
      test::device_vector<device_pool_ref> d_refs(refs);
      step_batch_ref const batch = h.batch_ref();
      release_params p{};
      p.pools           = d_refs.data();
      p.num_groups      = c.num_groups();
      p.num_slots       = std::int32_t(c.device_slots_per_group);
      p.owned_lists     = refs[0].owned != nullptr;
      p.map             = h.map().ref();
      p.request         = r;
      p.batch_size      = batch.size;
      p.batch_requests  = batch.requests;
      p.batch_queries   = const_cast<std::int32_t*>(batch.queries);
      p.tail_slots      = const_cast<std::int32_t*>(h.tail_slots(0));  // [groups][max_batch][max_queries]
      p.query_positions = const_cast<std::int32_t*>(h.query_positions());
      p.max_batch       = c.max_batch;
      p.max_queries     = c.max_queries;
      p.plans[0]        = h.plan_ref(0);
      p.plans[1]        = h.plan_ref(1);
      p.host            = h.store().ref();
      p.request_fields[0] = batch.lengths;
      p.request_fields[1] = const_cast<std::int32_t*>(batch.capacities);
      p.request_fields[2] = const_cast<std::int32_t*>(batch.floors);
      p.request_fields[3] = const_cast<std::int32_t*>(batch.caps);
      REQUIRE(release_async(p, stream.s) == cudaSuccess);
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
      check_release_effect(before, snapshot(h), r, victim, c.max_batch, c.max_queries, sources);
      // Bad arguments enqueue nothing.
      release_params bad = p;
      bad.pools          = nullptr;
      CHECK(release_async(bad, stream.s) == cudaErrorInvalidValue);
      CHECK_THAT(release_params_problem(bad), Catch::Contains("pools"));
      bad                = p;
      bad.tail_slots     = nullptr;
      CHECK(release_async(bad, stream.s) == cudaErrorInvalidValue);
      CHECK_THAT(release_params_problem(bad), Catch::Contains("tail_slots"));
      CHECK(release_params_problem(p).empty());
      // The owner still returns the host and map pages (the device part again is a no-op).
      h.release(ids[victim], stream.s);
    } else {
      h.release(ids[victim], stream.s);
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
      check_release_effect(before, snapshot(h), r, victim, c.max_batch, c.max_queries, sources);
    }
    // The others' step goes on.
    for (int g = 0; g < c.num_groups(); ++g) { h.retrieve(g, stream.s); }
    write_tail_rows(h, stream.s);
    h.commit(nullptr, stream.s);
    h.backup(stream.s);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    CHECK(h.status_sync(stream.s) == 0);
    std::vector<std::int32_t> const committed = download(h.committed_rows(), std::size_t(c.max_batch));
    for (std::size_t b = 0; b < ids.size(); ++b) {
      if (int(b) != victim) { CHECK(committed[b] == queries[b]); }
    }
    CHECK(!h.contains(ids[victim]));
  }
}

namespace {

/// Holds its stream until the host sets `*flag` (mapped pinned memory), or ~10 s passed.
__global__ void hold_stream_kernel(int const volatile* flag)
{
  long long const start = clock64();
  while (*flag == 0 && clock64() - start < 20'000'000'000LL) {}
}

}  // namespace

TEST_CASE("counters: read on the engine's monitor stream behind an event, the step stream never synchronized",
          "[integration]")
{
  auto rng = test::seeded_engine("counters");
  stream_guard step, monitor;
  hierarchy_config const c = small_config();
  hierarchy h(c, step.s);
  // Everything the monitor needs is allocated before the step (allocation may synchronize).
  int* flag = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped));
  *flag          = 0;
  int* d_flag    = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flag), flag, 0));
  group_counters* pinned = nullptr;
  DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 2 * sizeof(group_counters), cudaHostAllocDefault));
  std::memset(static_cast<void*>(pinned), 0xFF, 2 * sizeof(group_counters));
  std::vector<request_id> const ids{request_id{1}, request_id{2}};
  std::vector<int> const lengths{200, 64};
  std::vector<int> const queries{1, 2};
  for (std::size_t i = 0; i < ids.size(); ++i) {
    h.admit(ids[i], lengths[i], step.s);
    fill_host_rows(h, ids[i], lengths[i], rng);
  }
  h.set_batch(ids.data(), queries.data(), int(ids.size()), step.s);
  int const top_k = 32;
  auto const sel  = make_selections(c, lengths, queries, top_k, rng);
  test::device_vector<std::int32_t> d_sel(sel);
  for (int g = 0; g < c.num_groups(); ++g) {
    h.resolve(g, d_sel.data(), top_k, step.s);
    h.retrieve(g, step.s);
  }
  write_tail_rows(h, step.s);  // before the events: the step stream is then never synchronized
  h.commit(nullptr, step.s);
  h.backup(step.s);
  cudaEvent_t after_step{}, copied{};
  DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&after_step, cudaEventDisableTiming));
  DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  DHISPARSE_CUDA_TRY(cudaEventRecord(after_step, step.s));

  hold_stream_kernel<<<1, 1, 0, step.s>>>(d_flag);  // the step stream stays busy
  DHISPARSE_CUDA_TRY(cudaGetLastError());

  for (int g = 0; g < c.num_groups(); ++g) { h.read_counters(g, pinned + g, monitor.s, after_step); }
  DHISPARSE_CUDA_TRY(cudaEventRecord(copied, monitor.s));

  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  cudaError_t done    = cudaErrorNotReady;
  while ((done = cudaEventQuery(copied)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaError_t const step_busy = cudaStreamQuery(step.s);
  cudaGetLastError();  // the queries' "not ready" is no error
  *flag                       = 1;  // let the step stream go
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(step.s));
  CHECK(done == cudaSuccess);              // the counters arrived …
  CHECK(step_busy == cudaErrorNotReady);   // … while the step stream was still held

  std::size_t committed_rows = 0;
  for (int q : queries) { committed_rows += std::size_t(q); }
  for (int g = 0; g < c.num_groups(); ++g) {
    INFO("group " << g);
    group_counters synced{};
    h.read_counters(g, &synced, step.s);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(step.s));
    group_counters const& seen = pinned[g];
    CHECK(std::memcmp(&seen, &synced, sizeof synced) == 0);  // nothing counted after the event
    CHECK(seen.fetched_rows > 0);                              // nothing was resident before
    CHECK(seen.selected_rows >= seen.fetched_rows);
    CHECK(seen.backed_up_rows == committed_rows);
    std::size_t const row_bytes = h.group_row_bytes(g);
    CHECK(row_bytes == std::size_t(c.group_layers[g]) * row::bytes);
    CHECK(seen.h2d_bytes(row_bytes) == (seen.fetched_rows + seen.prewarmed_rows) * row_bytes);
    CHECK(seen.d2h_bytes(row_bytes) == committed_rows * row_bytes);
  }
  CHECK_THROWS_AS(h.read_counters(2, pinned, monitor.s, after_step), dhisparse::error);
  cudaFreeHost(pinned);
  cudaFreeHost(flag);
  cudaEventDestroy(after_step);
  cudaEventDestroy(copied);
}
