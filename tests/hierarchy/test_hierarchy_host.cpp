// Host reference of the hierarchy (host/hierarchy.hpp): exactness, LRU order against an
// independent model, speculative commits, and every bad input of DESIGN.md §5.
#include <dhisparse/host/hierarchy.hpp>

#include "random.hpp"
#include "workload.hpp"

#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace dhisparse;

namespace {

using fp8      = row_format::mla_fp8_656;
constexpr int K      = 32;
constexpr int budget = 128;  // ≥ the essential set of small_config: K × 3 queries + 3 × (4 + 2)
using ref_lru        = host::kv_hierarchy<fp8, policy::lru, policy::static_budget<budget>>;

hierarchy_config small_config()
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = 4;
  c.max_batch              = 4;
  c.max_queries            = 3;
  c.max_top_k              = K;
  c.max_context            = 4096;
  c.device_slots_per_group = 4 * budget;
  c.map_page_positions     = 64;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = 4 * 4096 / 16;
  return c;
}

/// Writes the truth of positions [from, to) of request `id` into the reference store.
template <class H>
void write_prefill(H& h, std::uint64_t salt, std::uint64_t id, std::int32_t from, std::int32_t to)
{
  auto const& c = h.config();
  for (std::int32_t p = from; p < to; ++p) {
    for (int g = 0; g < c.num_groups(); ++g) {
      for (int l = 0; l < c.group_layers[g]; ++l) {
        test::truth_row(salt, id, g, l, p, h.host_row(request_id{id}, g, l, p), fp8::bytes);
      }
    }
  }
}

/// Checks every valid slot-table entry of `group`: committed positions hold their truth,
/// tail positions name the tail slot.
template <class H>
void check_slots(H& h, std::uint64_t salt, int group, std::vector<std::uint64_t> const& ids,
                 std::vector<std::int32_t> const& lengths, std::vector<std::int32_t> const& sel,
                 int top_k)
{
  auto const& c        = h.config();
  int const layers     = c.group_layers[group];
  std::int32_t const* table = h.slot_table(group);
  std::int32_t const* tails = h.tail_slots(group);
  auto rows = h.layer_rows(group, 0);
  for (std::size_t b = 0; b < ids.size(); ++b) {
    for (int q = 0; q < c.max_queries; ++q) {
      for (int k = 0; k < top_k; ++k) {
        std::size_t const i = (b * c.max_queries + q) * top_k + k;
        std::int32_t const slot = table[i];
        if (sel[i] < 0) {
          REQUIRE(slot == -1);
          continue;
        }
        REQUIRE(slot >= 0);
        if (sel[i] >= lengths[b]) {
          REQUIRE(slot == tails[b * c.max_queries + (sel[i] - lengths[b])]);
          continue;
        }
        auto const want = test::truth_group_row(salt, ids[b], group, layers, fp8::bytes, sel[i]);
        REQUIRE(std::memcmp(rows.rows + std::size_t(slot) * rows.stride, want.data(), want.size()) == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("host reference: config errors name the field", "[hierarchy][host]")
{
  using mutation = std::function<void(hierarchy_config&)>;
  std::vector<std::pair<mutation, std::string>> cases = {
    {[](hierarchy_config& c) { c.group_layers.clear(); }, "group_layers"},
    {[](hierarchy_config& c) { c.group_layers[1] = 0; }, "group_layers[1]"},
    {[](hierarchy_config& c) { c.max_requests = 0; }, "max_requests"},
    {[](hierarchy_config& c) { c.max_batch = 5; }, "max_batch"},
    {[](hierarchy_config& c) { c.max_queries = 0; }, "max_queries"},
    {[](hierarchy_config& c) { c.max_context = 0; }, "max_context"},
    {[](hierarchy_config& c) { c.map_page_positions = 48; }, "map_page_positions"},
    {[](hierarchy_config& c) { c.host.tokens_per_page = 12; }, "tokens_per_page"},
    {[](hierarchy_config& c) { c.host.capacity_pages = 0; }, "capacity_pages"},
    {[](hierarchy_config& c) { c.device_slots_per_group = budget - 1; }, "essential floor of one request"},
    {[](hierarchy_config& c) { c.max_top_k = 40; }, "smaller than its essential set"},
    {[](hierarchy_config& c) { c.backup_interval_steps = 10; }, "smaller than its essential set"},
    {[](hierarchy_config& c) { c.max_top_k = 8192; }, "at most 16384"},
    {[](hierarchy_config& c) { c.backup_blocks = -1; }, "backup_blocks"},
    {[](hierarchy_config& c) { c.order_plans_min_entries = -1; }, "order_plans_min_entries"},
  };
  for (auto const& [mutate, field] : cases) {
    auto c = small_config();
    mutate(c);
    REQUIRE_THROWS_WITH(ref_lru(c), Catch::Contains(field));
  }
}

TEST_CASE("host reference: every slot handed out holds the committed bytes", "[hierarchy][host]")
{
  auto rng                 = test::seeded_engine("hierarchy host exactness");
  std::uint64_t const salt = rng();
  ref_lru h(small_config());
  std::vector<std::uint64_t> ids = {11, 22, 33};
  std::vector<std::int32_t> lengths = {300, 40, 1000};
  for (std::size_t i = 0; i < ids.size(); ++i) {
    h.admit(request_id{ids[i]}, lengths[i], lengths[i] + 512);
    write_prefill(h, salt, ids[i], 0, lengths[i]);
  }
  std::vector<std::int32_t> queries(ids.size(), 1);
  std::vector<request_id> rid;
  for (auto id : ids) { rid.push_back(request_id{id}); }
  h.set_batch(rid.data(), queries.data(), int(ids.size()));
  auto const& c = h.config();
  std::vector<std::int32_t> sel(std::size_t(c.max_batch) * c.max_queries * K, -1);
  std::vector<std::int32_t> focus = {100, 10, 500};
  for (int step = 0; step < 200; ++step) {
    for (int g = 0; g < c.num_groups(); ++g) {
      std::fill(sel.begin(), sel.end(), -1);
      for (std::size_t b = 0; b < ids.size(); ++b) {
        focus[b] = std::clamp<std::int32_t>(focus[b] + std::int32_t(rng() % 21) - 10, 0, lengths[b]);
        test::make_selection(rng, lengths[b], 0, K, focus[b], sel.data() + b * c.max_queries * K);
      }
      h.resolve(g, sel.data(), K);
      h.retrieve(g);
      check_slots(h, salt, g, ids, lengths, sel, K);
      // The model writes the tail rows.
      auto rows = h.layer_rows(g, 0);
      for (std::size_t b = 0; b < ids.size(); ++b) {
        std::int32_t const slot = h.tail_slots(g)[b * c.max_queries];
        REQUIRE(slot >= 0);
        auto const row = test::truth_group_row(salt, ids[b], g, c.group_layers[g], fp8::bytes, lengths[b]);
        std::memcpy(rows.rows + std::size_t(slot) * rows.stride, row.data(), row.size());
      }
    }
    h.commit(nullptr);
    if (step % 3 == 2) { h.backup(); }
    for (auto& l : lengths) { ++l; }
    REQUIRE(h.status() == 0);
  }
  h.backup();
  // Every committed row (prefill and decoded) reads back exactly from the host store.
  for (std::size_t b = 0; b < ids.size(); ++b) {
    REQUIRE(h.length(request_id{ids[b]}) == lengths[b]);
    for (std::int32_t p = 0; p < lengths[b]; ++p) {
      for (int g = 0; g < c.num_groups(); ++g) {
        auto const want = test::truth_group_row(salt, ids[b], g, c.group_layers[g], fp8::bytes, p);
        REQUIRE(std::memcmp(h.host_row(request_id{ids[b]}, g, 0, p), want.data(), want.size()) == 0);
      }
    }
  }
}

TEST_CASE("host reference: evictions follow an independent LRU model", "[hierarchy][host]")
{
  // A HiSparse buffer of H slots: after each step the resident positions must equal those
  // of a plain LRU over (last use, position), computed here without slots or lists.
  auto rng = test::seeded_engine("hierarchy host lru");
  auto c   = small_config();
  c.group_layers = {1};
  ref_lru h(c);
  std::int32_t length = 2000;
  h.admit(request_id{7}, length, 4000);
  request_id const id{7};
  std::int32_t const one = 1;
  h.set_batch(&id, &one, 1);
  std::map<std::int32_t, std::uint32_t> model;  // position → last use
  std::vector<std::int32_t> sel(std::size_t(c.max_batch) * c.max_queries * K, -1);
  std::int32_t focus = 1000;
  std::uint64_t fetched = 0, selected = 0;
  for (std::uint32_t t = 1; t <= 400; ++t) {
    focus = std::clamp<std::int32_t>(focus + std::int32_t(rng() % 41) - 20, 0, length);
    test::make_selection(rng, length, 0, K, focus, sel.data());
    h.resolve(0, sel.data(), K);
    // Model: hits refresh, misses + the new tail need slots; evict the least recently used
    // (ties: lower position) among rows not selected in this step.
    std::set<std::int32_t> chosen;
    for (int k = 0; k < K && sel[k] >= 0; ++k) {
      if (sel[k] < length) { chosen.insert(sel[k]); }
    }
    std::vector<std::int32_t> missed;
    for (auto p : chosen) {
      if (model.count(p)) {
        model[p] = t;
      } else {
        missed.push_back(p);
      }
    }
    int const need = int(missed.size()) + 1;
    int const over = int(model.size()) + need - budget;
    if (over > 0) {
      std::vector<std::pair<std::uint32_t, std::int32_t>> order;
      for (auto const& [p, use] : model) {
        if (!chosen.count(p)) { order.emplace_back(use, p); }
      }
      std::sort(order.begin(), order.end());
      for (int i = 0; i < over; ++i) { model.erase(order[i].second); }
    }
    for (auto p : missed) { model[p] = t; }
    model[length] = t;
    fetched += missed.size();
    selected += chosen.size();
    REQUIRE(h.misses(0).size() == missed.size());
    h.commit(nullptr);
    h.backup();
    ++length;
    std::vector<std::int32_t> expect;
    for (auto const& kv : model) { expect.push_back(kv.first); }
    REQUIRE(h.resident_positions(id, 0) == expect);
  }
  REQUIRE(h.status() == 0);
  INFO("fetched " << fetched << " of " << selected);
  REQUIRE(fetched > 0);
  REQUIRE(fetched < selected);
}

TEST_CASE("host reference: verify steps share misses across queries and recycle rejected tails",
          "[hierarchy][host]")
{
  auto rng                 = test::seeded_engine("hierarchy host verify");
  std::uint64_t const salt = rng();
  auto c                   = small_config();
  ref_lru h(c);
  request_id const id{5};
  std::int32_t len = 500;
  h.admit(id, len, 1000);
  write_prefill(h, salt, 5, 0, len);
  std::int32_t const nq = 3;
  h.set_batch(&id, &nq, 1);
  std::vector<std::int32_t> sel(std::size_t(c.max_batch) * c.max_queries * K, -1);
  for (int step = 0; step < 50; ++step) {
    // Three queries selecting the same committed rows plus their own tail prefix.
    std::vector<std::int32_t> common;
    test::make_selection(rng, len - 1, 0, K - 3, std::int32_t(rng() % len), sel.data());
    for (int k = 0; k < K - 3 && sel[k] >= 0; ++k) { common.push_back(sel[k]); }
    for (int q = 0; q < nq; ++q) {
      std::int32_t* query = sel.data() + std::size_t(q) * K;
      std::fill(query, query + K, -1);
      int k = 0;
      for (auto p : common) { query[k++] = p; }
      for (int t = 0; t <= q; ++t) { query[k++] = len + t; }
    }
    h.resolve(0, sel.data(), K);
    // One miss per distinct position, whatever the number of queries selecting it.
    std::set<std::int32_t> distinct;
    for (auto const& m : h.misses(0)) { REQUIRE(distinct.insert(m.position).second); }
    h.retrieve(0);
    std::vector<std::int32_t> lengths = {len};
    check_slots(h, salt, 0, {5}, lengths, sel, K);
    std::int32_t const keep = std::int32_t(rng() % (nq + 1));
    auto rows = h.layer_rows(0, 0);
    for (int j = 0; j < keep; ++j) {
      auto const row = test::truth_group_row(salt, 5, 0, c.group_layers[0], fp8::bytes, len + j);
      std::memcpy(rows.rows + std::size_t(h.tail_slots(0)[j]) * rows.stride, row.data(), row.size());
    }
    h.resolve(1, sel.data(), K);  // group 1 too, so that commit sees both groups' tails
    h.retrieve(1);
    auto rows1 = h.layer_rows(1, 0);
    for (int j = 0; j < keep; ++j) {
      auto const row = test::truth_group_row(salt, 5, 1, c.group_layers[1], fp8::bytes, len + j);
      std::memcpy(rows1.rows + std::size_t(h.tail_slots(1)[j]) * rows1.stride, row.data(), row.size());
    }
    h.commit(&keep);
    h.backup();
    len += keep;
    REQUIRE(h.length(id) == len);
    // Rejected tails are no longer resident.
    auto const resident = h.resident_positions(id, 0);
    REQUIRE(std::none_of(resident.begin(), resident.end(), [&](std::int32_t p) { return p >= len; }));
  }
  REQUIRE(h.status() == 0);
  for (std::int32_t p = 0; p < len; ++p) {
    auto const want = test::truth_group_row(salt, 5, 0, c.group_layers[0], fp8::bytes, p);
    REQUIRE(std::memcmp(h.host_row(id, 0, 0, p), want.data(), want.size()) == 0);
  }
}

TEST_CASE("host reference: bad inputs give clear errors and corrupt nothing", "[hierarchy][host]")
{
  auto rng                 = test::seeded_engine("hierarchy host bad input");
  std::uint64_t const salt = rng();
  auto c                   = small_config();
  c.host.capacity_pages    = 40;
  ref_lru h(c);
  request_id const a{1}, b{2};
  h.admit(a, 100, 200);
  write_prefill(h, salt, 1, 0, 100);
  std::size_t const free_before = h.free_host_pages();

  REQUIRE_THROWS_WITH(h.admit(a, 10), Catch::Contains("already admitted"));
  REQUIRE_THROWS_WITH(h.admit(b, 10, 5000), Catch::Contains("capacity"));
  REQUIRE_THROWS_WITH(h.admit(b, 600, 640), Catch::Contains("host store exhausted"));
  REQUIRE(!h.contains(b));
  REQUIRE(h.free_host_pages() == free_before);
  REQUIRE_THROWS_WITH(h.reserve(request_id{9}, 10), Catch::Contains("unknown request id 9"));
  REQUIRE_THROWS_WITH(h.release(request_id{9}), Catch::Contains("unknown request id 9"));
  REQUIRE_THROWS_WITH(h.host_row(a, 0, 0, 5000), Catch::Contains("not backed"));
  REQUIRE_THROWS_WITH(h.host_row(a, 2, 0, 0), Catch::Contains("group 2"));

  request_id const twice[2] = {a, a};
  std::int32_t const ones[2] = {1, 1};
  REQUIRE_THROWS_WITH(h.set_batch(twice, ones, 2), Catch::Contains("appears twice"));
  std::int32_t const too_many = 4;
  REQUIRE_THROWS_WITH(h.set_batch(&a, &too_many, 1), Catch::Contains("queries[0]"));
  REQUIRE_THROWS_WITH(h.set_batch(&b, ones, 1), Catch::Contains("unknown request id 2"));
  h.set_batch(&a, ones, 1);

  std::vector<std::int32_t> sel(std::size_t(c.max_batch) * c.max_queries * K, -1);
  REQUIRE_THROWS_WITH(h.resolve(0, sel.data(), K + 1), Catch::Contains("top_k"));
  REQUIRE_THROWS_WITH(h.resolve(2, sel.data(), K), Catch::Contains("group 2"));
  REQUIRE_THROWS_WITH(h.resolve(0, nullptr, K), Catch::Contains("selections"));

  // Selections as an indexer emits them (any order, repeats, -1 anywhere) are served; only
  // positions out of range are flagged and served as empty.
  std::vector<std::int32_t> query = {3, 7, 7, 5, 99, 100, 101, -5, 20, -1, 30};
  std::copy(query.begin(), query.end(), sel.begin());
  h.resolve(0, sel.data(), K);
  h.retrieve(0);
  REQUIRE((h.status() & status_invalid_selection) != 0);
  REQUIRE(h.slot_table(0)[1] == h.slot_table(0)[2]);  // one row, one slot
  std::vector<bool> expect_valid = {true, true, true, true, true, true, false, false, true, false, true};
  for (std::size_t k = 0; k < query.size(); ++k) {
    INFO("entry " << k << " position " << query[k]);
    REQUIRE((h.slot_table(0)[k] >= 0) == expect_valid[k]);
  }
  std::int32_t const bad_accept = 2;
  h.commit(&bad_accept);
  REQUIRE((h.status() & status_invalid_accept_count) != 0);
  REQUIRE(h.length(a) == 100);
  REQUIRE(h.resident_positions(a, 0).back() < 100);  // the rejected tail was recycled
  // Nothing committed was corrupted.
  for (std::int32_t p = 0; p < 100; ++p) {
    auto const want = test::truth_group_row(salt, 1, 0, 2, fp8::bytes, p);
    REQUIRE(std::memcmp(h.host_row(a, 0, 0, p), want.data(), want.size()) == 0);
  }
  h.clear_status();

  // A tail beyond the reserved capacity is refused on device-side semantics.
  request_id const full{3};
  h.admit(full, 32, 32);
  h.set_batch(&full, ones, 1);
  std::fill(sel.begin(), sel.end(), -1);
  sel[0] = 0;
  h.resolve(0, sel.data(), K);
  REQUIRE((h.status() & status_capacity_exceeded) != 0);
  REQUIRE(h.tail_slots(0)[0] == -1);
  REQUIRE(h.slot_table(0)[0] >= 0);
}

TEST_CASE("host reference: bulk host-row writes equal row-by-row writes; bad ones change nothing",
          "[hierarchy][host]")
{
  auto rng  = test::seeded_engine("host reference bulk rows");
  auto cfg  = small_config();
  ref_lru bulk(cfg), single(cfg);
  request_id const id{7};
  std::int32_t const length = 1000 + std::int32_t(rng() % 2000);
  bulk.admit(id, length);
  single.admit(id, length);
  // A source with a stride larger than a row (as an engine's [tokens][layers][row] buffer).
  std::size_t const stride = fp8::bytes + 16 * std::size_t(rng() % 4);
  for (int g = 0; g < cfg.num_groups(); ++g) {
    for (int l = 0; l < cfg.group_layers[g]; ++l) {
      std::int64_t const first = std::int64_t(rng() % std::uint64_t(length / 2));
      std::int64_t const count = 1 + std::int64_t(rng() % std::uint64_t(length - first));
      std::vector<std::byte> source(std::size_t(count) * stride);
      for (auto& b : source) { b = std::byte(rng()); }
      bulk.write_host_rows(id, g, l, first, count, source.data(), stride);
      for (std::int64_t k = 0; k < count; ++k) {
        std::memcpy(single.host_row(id, g, l, first + k), source.data() + std::size_t(k) * stride, fp8::bytes);
      }
      for (std::int64_t p = 0; p < length; ++p) {
        REQUIRE(std::memcmp(bulk.host_row(id, g, l, p), single.host_row(id, g, l, p), fp8::bytes) == 0);
      }
    }
  }
  // Bad calls throw and write nothing.
  std::vector<std::byte> before(std::size_t(length) * fp8::bytes);
  for (std::int64_t p = 0; p < length; ++p) {
    std::memcpy(before.data() + std::size_t(p) * fp8::bytes, bulk.host_row(id, 0, 0, p), fp8::bytes);
  }
  std::vector<std::byte> source(std::size_t(length + 64) * fp8::bytes, std::byte{0x5A});
  // The default capacity (length + max_queries) in whole host pages.
  std::int64_t const page = cfg.host.tokens_per_page;
  std::int64_t const cap  = (std::int64_t(length) + cfg.max_queries + page - 1) / page * page;
  CHECK_THROWS_WITH(bulk.write_host_rows(request_id{99}, 0, 0, 0, 1, source.data(), fp8::bytes),
                    Catch::Contains("write_host_rows"));
  CHECK_THROWS_WITH(bulk.write_host_rows(id, 0, 0, cap - 1, 2, source.data(), fp8::bytes),
                    Catch::Contains("not all backed by pages"));
  CHECK_THROWS_WITH(bulk.write_host_rows(id, 0, 0, -1, 2, source.data(), fp8::bytes),
                    Catch::Contains("not all backed by pages"));
  CHECK_THROWS_WITH(bulk.write_host_rows(id, 0, 0, 0, 2, nullptr, fp8::bytes), Catch::Contains("null"));
  CHECK_THROWS_WITH(bulk.write_host_rows(id, 0, 0, 0, 2, source.data(), fp8::bytes - 16),
                    Catch::Contains("row size"));
  CHECK_THROWS_WITH(bulk.write_host_rows(id, 0, 5, 0, 2, source.data(), fp8::bytes), Catch::Contains("layer"));
  CHECK_THROWS_WITH(bulk.write_host_rows(id, 9, 0, 0, 2, source.data(), fp8::bytes), Catch::Contains("group"));
  for (std::int64_t p = 0; p < length; ++p) {
    REQUIRE(std::memcmp(before.data() + std::size_t(p) * fp8::bytes, bulk.host_row(id, 0, 0, p), fp8::bytes) == 0);
  }
}

TEST_CASE("host reference: adopted pages of a caller's host KV in its own layout; bad pages and layouts refused",
          "[hierarchy][host]")
{
  auto rng                 = test::seeded_engine("host reference adopt");
  std::uint64_t const salt = rng();
  auto cfg                 = small_config();
  int const tpp            = cfg.host.tokens_per_page;
  // Interleaved position by position, group 1's layer first, padded: an engine's layout.
  std::size_t const stride = 3 * fp8::bytes + 16 * std::size_t(rng() % 3);
  cfg.host.memory          = host_memory::caller;
  cfg.host.groups          = {{fp8::bytes, stride}, {0, stride}};
  cfg.host.page_bytes      = tpp * stride + 32;
  std::vector<std::byte> pool(cfg.host.page_bytes * cfg.host.capacity_pages);
  cfg.host.caller_memory = pool.data();
  cfg.host.caller_bytes  = pool.size();
  auto engine_row        = [&](std::int32_t page, int g, int l, std::int32_t pos) {
    return pool.data() + std::size_t(page) * cfg.host.page_bytes + cfg.host.groups[std::size_t(g)].offset +
           std::size_t(pos % tpp) * stride + std::size_t(l) * fp8::bytes;
  };
  std::int32_t const length = 100 + std::int32_t(rng() % 200);
  std::vector<std::int32_t> pages;
  for (std::int32_t k = 0; k < (length + tpp - 1) / tpp; ++k) { pages.push_back(std::int32_t(900 - 3 * k)); }
  for (std::int32_t pos = 0; pos < length; ++pos) {
    for (int g = 0; g < cfg.num_groups(); ++g) {
      for (int l = 0; l < cfg.group_layers[g]; ++l) {
        test::truth_row(salt, 5, g, l, pos, engine_row(pages[std::size_t(pos / tpp)], g, l, pos), fp8::bytes);
      }
    }
  }
  ref_lru h(cfg);
  h.adopt(request_id{5}, length, pages.data(), pages.size());
  for (std::int32_t pos = 0; pos < length; ++pos) {
    for (int g = 0; g < cfg.num_groups(); ++g) {
      for (int l = 0; l < cfg.group_layers[g]; ++l) {
        REQUIRE(std::memcmp(h.host_row(request_id{5}, g, l, pos), engine_row(pages[std::size_t(pos / tpp)], g, l, pos),
                            fp8::bytes) == 0);
      }
    }
  }
  CHECK(h.length(request_id{5}) == length);
  // Refusals admit nothing.
  std::vector<std::int32_t> const repeated{1, 2, 1}, outside{std::int32_t(cfg.host.capacity_pages)}, one{3};
  CHECK_THROWS_WITH(h.adopt(request_id{6}, 40, repeated.data(), repeated.size()), Catch::Contains("repeated"));
  CHECK_THROWS_WITH(h.adopt(request_id{6}, 10, outside.data(), outside.size()), Catch::Contains("outside the pool"));
  CHECK_THROWS_WITH(h.adopt(request_id{6}, tpp + 1, one.data(), one.size()), Catch::Contains("fewer than length"));
  CHECK_THROWS_WITH(h.adopt(request_id{5}, 10, one.data(), one.size()), Catch::Contains("already admitted"));
  CHECK(!h.contains(request_id{6}));
  auto pinned        = small_config();
  ref_lru not_caller(pinned);
  CHECK_THROWS_WITH(not_caller.adopt(request_id{6}, 10, one.data(), one.size()), Catch::Contains("host_memory::caller"));

  // Layout checks (shared with the GPU store).
  auto layout_error = [&](auto change) {
    auto c = cfg.host;
    change(c);
    std::size_t page_bytes = 0;
    try {
      detail::make_group_layouts(c, cfg.group_layers, fp8::bytes, page_bytes);
    } catch (dhisparse::error const& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(layout_error([](host_store_config& c) { c.groups[1].offset = 2 * fp8::bytes; }), Catch::Contains("overlapping"));
  CHECK_THAT(layout_error([](host_store_config& c) { c.groups[0].token_stride = fp8::bytes; }),
             Catch::Contains("smaller than the group row"));
  CHECK_THAT(layout_error([&](host_store_config& c) { c.page_bytes = tpp * stride - 64; }),
             Catch::Contains("smaller than the rows of a page"));
  CHECK(layout_error([](host_store_config&) {}).empty());
  auto overlapping              = cfg;
  overlapping.host.groups[1].offset = 2 * fp8::bytes;
  CHECK_THROWS_WITH(ref_lru(overlapping), Catch::Contains("overlapping"));  // at construction, as the GPU store
  // The packed layout when nothing is described; page padding alone is allowed.
  std::size_t packed = 0, padded = 0;
  auto packed_layout = detail::make_group_layouts(small_config().host, cfg.group_layers, fp8::bytes, packed);
  CHECK(packed == std::size_t(tpp) * 3 * fp8::bytes);
  CHECK(packed_layout[1].page_offset == std::size_t(tpp) * 2 * fp8::bytes);
  auto pad            = small_config().host;
  pad.page_bytes      = packed + 4096;
  auto padded_layout  = detail::make_group_layouts(pad, cfg.group_layers, fp8::bytes, padded);
  CHECK(padded == packed + 4096);
  CHECK(padded_layout[1].page_offset == packed_layout[1].page_offset);
}
