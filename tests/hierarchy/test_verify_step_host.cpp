// The verify-step contract on the host reference (issue 14, item 1): set_drafts (counts,
// trees, positions), commit_verified (the accepted path kept and compacted onto
// positions, everything else recycled, cut at the first missing tail, verify's outputs cut
// to the committed tokens), stale tails of an uncommitted resolve recycled, bad inputs
// refused with nothing changed. An independent model (tests/hierarchy/verify_step.hpp)
// says what every commit must keep; committed bytes are checked in the host store.
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>

#include "random.hpp"
#include "verify_step.hpp"
#include "workload.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <vector>

using namespace dhisparse;

namespace {

using fp8            = row_format::mla_fp8_656;
constexpr int K      = 32;
constexpr int Q      = 5;
constexpr int budget = 200;  // ≥ the essential set: min(capacity, 5 × 32) + 5 × (4 + 2)

hierarchy_config step_config()
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = 4;
  c.max_batch              = 4;
  c.max_queries            = Q;
  c.max_top_k              = K;
  c.max_context            = 4096;
  c.device_slots_per_group = 4 * budget + 32;
  c.map_page_positions     = 64;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = 4 * 4096 / 16;
  return c;
}

/// The bytes of a tail row: the truth of its position for nodes on the accepted path,
/// something else (never committed) for the others.
std::vector<std::byte> tail_row(std::uint64_t salt, std::uint64_t id, int g, int layers, std::int32_t position,
                                bool on_path, int node)
{
  return test::truth_group_row(on_path ? salt : salt ^ (0xBADull << 20) ^ std::uint64_t(node), id, g, layers,
                               fp8::bytes, position);
}

/// Drives verified steps on a host hierarchy and checks every commit against the model.
template <class H>
class step_driver {
 public:
  step_driver(H& h, std::uint64_t salt) : h_{h}, salt_{salt} {}

  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    h_.admit(request_id{id}, length, capacity);
    auto const& c = h_.config();
    for (std::int32_t p = 0; p < length; ++p) {
      for (int g = 0; g < c.num_groups(); ++g) {
        for (int l = 0; l < c.group_layers[g]; ++l) {
          test::truth_row(salt_, id, g, l, p, h_.host_row(request_id{id}, g, l, p), fp8::bytes);
        }
      }
    }
    lengths_[id]  = length;
    capacity_[id] = backed(capacity);
  }

  void reserve(std::uint64_t id, std::int64_t capacity)
  {
    h_.reserve(request_id{id}, capacity);
    capacity_[id] = std::max(capacity_[id], backed(capacity));
  }

  /// One verified step of `ids` with random drafts (trees or chains).
  void step(std::mt19937_64& rng, std::vector<std::uint64_t> const& ids, bool tree, double invalid)
  {
    auto const& c = h_.config();
    std::vector<request_id> rid;
    std::vector<std::int32_t> ones(ids.size(), 1);
    for (auto id : ids) { rid.push_back(request_id{id}); }
    h_.set_batch(rid.data(), ones.data(), int(ids.size()));
    auto drafts = test::random_verified_drafts(rng, int(ids.size()), c.max_batch, Q, tree, invalid);
    h_.set_drafts(drafts.num_drafts.data(), drafts.parents.data());
    for (std::size_t b = 0; b < ids.size(); ++b) {
      std::int32_t const len = lengths_[ids[b]];
      REQUIRE(h_.batch_queries(int(b)) == 1 + drafts.num_drafts[b]);
      for (int q = 0; q < Q; ++q) {
        bool const live = q <= drafts.num_drafts[b];
        REQUIRE(h_.query_positions()[b * Q + q] == (live ? len + drafts.depth[b * Q + q] : -1));
        REQUIRE(h_.query_parents()[b * Q + q] == (live ? drafts.parents[b * Q + q] : -1));
      }
    }
    for (int g = 0; g < c.num_groups(); ++g) {
      std::vector<std::int32_t> sel(std::size_t(c.max_batch) * Q * K, -1);
      for (std::size_t b = 0; b < ids.size(); ++b) {
        std::int32_t const len = lengths_[ids[b]];
        for (int q = 0; q <= drafts.num_drafts[b]; ++q) {
          std::int32_t* query = sel.data() + (b * Q + q) * K;
          test::make_selection(rng, len - 1, 0, K - Q, std::int32_t(rng() % std::uint64_t(len)), query);
          int k = K - Q;  // its own path's tail rows, by node index
          for (std::int32_t m = q; m >= 0; m = drafts.parents[b * Q + m]) { query[k++] = len + m; }
        }
      }
      h_.resolve(g, sel.data(), K);
      h_.retrieve(g);
      auto const view = h_.layer_rows(g, 0);
      for (std::size_t b = 0; b < ids.size(); ++b) {
        std::int32_t const len = lengths_[ids[b]];
        int const tails        = expected_tails(ids[b], 1 + drafts.num_drafts[b]);
        for (int j = 0; j < Q; ++j) {
          std::int32_t const slot = h_.tail_slots(g)[b * Q + j];
          REQUIRE((slot >= 0) == (j < tails));
          if (slot < 0) { continue; }
          auto const row = tail_row(salt_, ids[b], g, c.group_layers[g], len + drafts.depth[b * Q + j],
                                    drafts.on_path(int(b), j), j);
          std::memcpy(view.rows + std::size_t(slot) * view.stride, row.data(), row.size());
        }
      }
    }
    auto const before = drafts.emitted;
    h_.commit_verified(drafts.step());
    for (std::size_t b = 0; b < ids.size(); ++b) {
      std::uint64_t const id = ids[b];
      auto const want = test::expect_commit(drafts, int(b), 1 + drafts.num_drafts[b],
                                            expected_tails(id, 1 + drafts.num_drafts[b]));
      INFO("entry " << b << " drafts " << drafts.num_drafts[b] << " accepted " << drafts.accepted[b]);
      REQUIRE(h_.committed_rows()[b] == want.kept);
      REQUIRE(h_.commit_status()[b] == want.bits);
      for (int k = 0; k < Q; ++k) {
        REQUIRE(drafts.emitted[b * Q + k] == (k < want.kept ? before[b * Q + k] : -1));
      }
      REQUIRE(drafts.next_token[b] == (want.kept > 0 ? before[b * Q + want.kept - 1] : -1));
      lengths_[id] += want.kept;
      REQUIRE(h_.length(request_id{id}) == lengths_[id]);
      for (int q = 0; q <= drafts.num_drafts[b]; ++q) {  // positions follow the new length
        REQUIRE(h_.query_positions()[b * Q + q] == lengths_[id] + drafts.depth[b * Q + q]);
      }
      for (int g = 0; g < c.num_groups(); ++g) {
        auto const resident = h_.resident_positions(request_id{id}, g);
        REQUIRE((resident.empty() || resident.back() < lengths_[id]));
        for (int j = 0; j < Q; ++j) { REQUIRE(h_.tail_slots(g)[b * Q + j] == -1); }
      }
    }
    h_.backup();
    check_store();
    for (int g = 0; g < c.num_groups(); ++g) { REQUIRE(h_.owned_slots(g) + h_.free_slots(g) == h_.pool_limit(g)); }
  }

  /// Every committed row of every request reads back exactly from the host store.
  void check_store()
  {
    auto const& c = h_.config();
    for (auto const& [id, len] : lengths_) {
      for (std::int32_t p = checked_[id]; p < len; ++p) {
        for (int g = 0; g < c.num_groups(); ++g) {
          auto const want = test::truth_group_row(salt_, id, g, c.group_layers[g], fp8::bytes, p);
          INFO("request " << id << " group " << g << " position " << p);
          REQUIRE(std::memcmp(h_.host_row(request_id{id}, g, 0, p), want.data(), want.size()) == 0);
        }
      }
      checked_[id] = len;
    }
  }

  std::int32_t length(std::uint64_t id) { return lengths_[id]; }

 private:
  std::int64_t backed(std::int64_t capacity) const
  {
    std::int64_t const page = h_.config().host.tokens_per_page;
    return std::min<std::int64_t>((capacity + page - 1) / page * page, h_.config().max_context);
  }
  int expected_tails(std::uint64_t id, int queries)
  {
    return int(std::clamp<std::int64_t>(capacity_[id] - lengths_[id], 0, queries));
  }

  H& h_;
  std::uint64_t salt_;
  std::map<std::uint64_t, std::int32_t> lengths_, checked_;
  std::map<std::uint64_t, std::int64_t> capacity_;
};

using static_lru = host::kv_hierarchy<fp8, policy::lru, policy::static_budget<budget>>;
using adaptive   = host::kv_hierarchy<fp8, policy::lru, policy::adaptive_budget<>>;

}  // namespace

TEMPLATE_TEST_CASE("host reference: commit_verified keeps the accepted path, compacted, and recycles the rest",
                   "[hierarchy][host][verify_step]", static_lru, adaptive)
{
  auto rng                 = test::seeded_engine("verify step host");
  std::uint64_t const salt = rng();
  TestType h(step_config());
  step_driver<TestType> d(h, salt);
  d.admit(1, 400, 4000);
  d.admit(2, 250, 4000);
  d.admit(3, 600, 4000);
  d.admit(4, 300, 302);  // tight: its capacity is reserved a little at a time
  for (int s = 0; s < 120; ++s) {
    if (s % 3 == 0) { d.reserve(4, d.length(4) + std::int64_t(rng() % (Q + 1))); }
    d.step(rng, {1, 2, 3, 4}, s % 2 == 0, s < 60 ? 0.0 : 0.2);
  }
  REQUIRE((h.status() & ~(status_missing_tail | status_invalid_accept_count | status_capacity_exceeded)) == 0u);
  REQUIRE((h.status() & status_missing_tail) != 0);  // request 4 ran into its capacity
  REQUIRE(d.length(1) > 400);
}

TEST_CASE("host reference: set_drafts validates counts and trees per request", "[hierarchy][host][verify_step]")
{
  static_lru h(step_config());
  for (std::uint64_t id = 1; id <= 3; ++id) { h.admit(request_id{id}, 100 * std::int32_t(id), 1000); }
  request_id const ids[3] = {request_id{1}, request_id{2}, request_id{3}};
  std::int32_t const ones[3] = {1, 1, 1};
  h.set_batch(ids, ones, 3);
  REQUIRE_THROWS_WITH(h.set_drafts(nullptr, nullptr), Catch::Contains("num_drafts"));
  std::vector<std::int32_t> num = {2, Q, 3, 0}, parents(4 * Q, -1);
  parents[0 * Q + 1] = 0;  // entry 0: 0 ← 1, 0 ← 2 (two children of the root)
  parents[0 * Q + 2] = 0;
  parents[2 * Q + 1] = 0;  // entry 2: node 2's parent is itself: not a tree
  parents[2 * Q + 2] = 2;
  parents[2 * Q + 3] = 1;
  h.set_drafts(num.data(), parents.data());
  REQUIRE(h.status() == status_invalid_drafts);
  REQUIRE(h.batch_queries(0) == 3);
  REQUIRE(h.batch_queries(1) == 1);  // Q drafts: more than max_queries − 1
  REQUIRE(h.batch_queries(2) == 1);
  std::int32_t const* pos = h.query_positions();
  REQUIRE(std::vector<std::int32_t>(pos, pos + Q) == std::vector<std::int32_t>{100, 101, 101, -1, -1});
  REQUIRE(std::vector<std::int32_t>(pos + Q, pos + 2 * Q) == std::vector<std::int32_t>{200, -1, -1, -1, -1});
  // Chains without parents; a released entry stays out of the step.
  h.clear_status();
  h.release(request_id{2});
  num = {4, 4, 1, 0};
  h.set_drafts(num.data(), nullptr);
  REQUIRE(h.status() == 0u);
  REQUIRE(h.batch_queries(1) == 0);
  REQUIRE(std::vector<std::int32_t>(pos, pos + Q) == std::vector<std::int32_t>{100, 101, 102, 103, 104});
  REQUIRE(h.query_positions()[Q] == -1);
  REQUIRE(std::vector<std::int32_t>(h.query_parents(), h.query_parents() + Q) ==
          std::vector<std::int32_t>{-1, 0, 1, 2, 3});
}

TEST_CASE("host reference: load_batch is set_batch by request index, validated per entry",
          "[hierarchy][host][verify_step][load_batch]")
{
  static_lru a(step_config()), b(step_config());
  for (std::uint64_t id = 1; id <= 3; ++id) {
    a.admit(request_id{id}, 100 * std::int32_t(id), 1000);
    b.admit(request_id{id}, 100 * std::int32_t(id), 1000);
  }
  int const B = step_config().max_batch;
  auto packed = [&](std::vector<std::int32_t> const& requests, std::vector<std::int32_t> const& queries,
                    std::int32_t count) {
    std::vector<std::int32_t> p(std::size_t(1 + 2 * B), 0);
    p[0] = count;
    std::copy(requests.begin(), requests.end(), p.begin() + 1);
    std::copy(queries.begin(), queries.end(), p.begin() + 1 + B);
    return p;
  };
  auto same_step = [&] {
    std::size_t const n = std::size_t(B) * Q;
    REQUIRE(a.batch_count() == b.batch_count());
    for (int e = 0; e < a.batch_count(); ++e) { REQUIRE(a.batch_queries(e) == b.batch_queries(e)); }
    REQUIRE(std::vector<std::int32_t>(a.query_positions(), a.query_positions() + n) ==
            std::vector<std::int32_t>(b.query_positions(), b.query_positions() + n));
    REQUIRE(std::vector<std::int32_t>(a.query_parents(), a.query_parents() + n) ==
            std::vector<std::int32_t>(b.query_parents(), b.query_parents() + n));
  };
  REQUIRE_THROWS_WITH(a.load_batch(nullptr), Catch::Contains("batch"));

  // A valid batch: what set_batch with the ids of those indices sets.
  request_id const ids[3] = {request_id{3}, request_id{1}, request_id{2}};
  std::int32_t const queries[3] = {2, Q, 1};
  a.set_batch(ids, queries, 3);
  auto const valid = packed({b.request_index(ids[0]), b.request_index(ids[1]), b.request_index(ids[2])}, {2, Q, 1}, 3);
  b.load_batch(valid.data());
  REQUIRE(b.status() == 0u);
  same_step();

  // Invalid entries take no part in the step; the valid ones do; one bit says so.
  std::int32_t const r1 = b.request_index(request_id{1}), r2 = b.request_index(request_id{2});
  auto const bad = packed({r1, r1, 99, r2}, {2, 1, 1, Q + 1}, 4);  // repeated, out of range, too many queries
  b.load_batch(bad.data());
  REQUIRE(b.status() == status_invalid_batch);
  REQUIRE(b.batch_count() == 4);
  REQUIRE(b.batch_queries(0) == 2);
  for (int e = 1; e < 4; ++e) { REQUIRE(b.batch_queries(e) == 0); }
  REQUIRE(b.query_positions()[Q] == -1);
  b.clear_status();

  // A released request's index is not admitted any more; a count beyond max_batch is clamped.
  b.release(request_id{2});
  auto const released = packed({r2, r1}, {1, 1}, 2);
  b.load_batch(released.data());
  REQUIRE(b.status() == status_invalid_batch);
  REQUIRE(b.batch_queries(0) == 0);
  REQUIRE(b.batch_queries(1) == 1);
  b.clear_status();
  auto const clamped = packed({r1}, {1}, B + 3);
  b.load_batch(clamped.data());
  REQUIRE(b.status() == status_invalid_batch);
  REQUIRE(b.batch_count() == B);
  REQUIRE(b.batch_queries(0) == 1);
  REQUIRE(b.batch_queries(1) == 0);  // index 0 repeated (padding of the source)
}

TEST_CASE("host reference: a resolve never committed leaves no stale tail behind", "[hierarchy][host][verify_step]")
{
  static_lru h(step_config());
  request_id const id{7};
  h.admit(id, 50, 1000);
  std::int32_t const three = 3;
  h.set_batch(&id, &three, 1);
  std::vector<std::int32_t> none(std::size_t(4) * Q * K, -1);
  for (int g = 0; g < 2; ++g) { h.resolve(g, none.data(), K); }
  h.resolve(0, none.data(), K);  // again, without a commit: no new tails, flagged
  REQUIRE((h.status() & status_uncommitted_tail) != 0);
  REQUIRE(h.tail_slots(0)[0] == -1);
  h.commit(nullptr);  // group 0 has no tails: nothing kept; the stale ones are recycled
  REQUIRE(h.length(id) == 50);
  REQUIRE(h.commit_status()[0] == status_missing_tail);
  for (int g = 0; g < 2; ++g) { REQUIRE(h.resident_positions(id, g).empty()); }
  h.clear_status();
  for (int g = 0; g < 2; ++g) { h.resolve(g, none.data(), K); }
  h.commit(nullptr);
  REQUIRE(h.status() == 0u);
  REQUIRE(h.length(id) == 53);
  for (int g = 0; g < 2; ++g) { REQUIRE(h.owned_slots(g) + h.free_slots(g) == h.pool_limit(g)); }
}

TEST_CASE("host reference: bad commit_verified arguments are refused and change nothing",
          "[hierarchy][host][verify_step]")
{
  auto rng = test::seeded_engine("verify step host bad input");
  static_lru h(step_config());
  request_id const id{3};
  h.admit(id, 80, 1000);
  std::int32_t const one = 1;
  h.set_batch(&id, &one, 1);
  auto drafts = test::random_verified_drafts(rng, 1, 4, Q, true, 0.0);
  h.set_drafts(drafts.num_drafts.data(), drafts.parents.data());
  std::vector<std::int32_t> none(std::size_t(4) * Q * K, -1);
  for (int g = 0; g < 2; ++g) { h.resolve(g, none.data(), K); }
  verified_step v = drafts.step();
  v.accepted      = nullptr;
  REQUIRE_THROWS_WITH(h.commit_verified(v), Catch::Contains("accepted is null"));
  v            = drafts.step();
  v.emitted    = nullptr;
  REQUIRE_THROWS_WITH(h.commit_verified(v), Catch::Contains("next_token needs emitted"));
  v            = drafts.step();
  v.max_drafts = max_verify_drafts + 1;
  REQUIRE_THROWS_WITH(h.commit_verified(v), Catch::Contains("max_drafts"));
  host::draft_ring ring(4, 8, 1, 16);
  v      = drafts.step();
  v.ring = ring.ref();
  REQUIRE_THROWS_WITH(h.commit_verified(v), Catch::Contains("ring_status"));
  REQUIRE(h.length(id) == 80);
  // Nothing changed: the step commits normally afterwards.
  h.commit_verified(drafts.step());
  REQUIRE(h.committed_rows()[0] == 1 + drafts.accepted[0]);
  REQUIRE(h.length(id) == 81 + drafts.accepted[0]);
  REQUIRE(h.status() == 0u);
}
