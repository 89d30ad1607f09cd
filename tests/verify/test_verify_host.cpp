// Host reference of speculative verification (host/verify.hpp): the RNG, the exact
// arithmetic, greedy exactness, the statistical contract of every sampling rule, and
// the input checks.
#include <dhisparse/detail/philox.hpp>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/host/verify.hpp>
#include <dhisparse/status.hpp>

#include "random.hpp"
#include "verify_cases.hpp"
#include "verify_stats.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace dhisparse;
namespace dv = dhisparse::detail::verify;

TEST_CASE("philox4x32-10 matches Random123's known-answer vectors", "[verify][rng]")
{
  using dhisparse::detail::philox4x32_10;
  using dhisparse::detail::philox_block;
  auto same = [](philox_block a, philox_block b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; };
  CHECK(same(philox4x32_10({0, 0, 0, 0}, 0, 0), {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  CHECK(same(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu),
             {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  CHECK(same(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u),
             {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST_CASE("uniform_float stays in [0, 1) and hits both ends of its grid", "[verify][rng]")
{
  using dhisparse::detail::uniform_float;
  CHECK(uniform_float(0u) == 0.f);
  CHECK(uniform_float(0xFFFFFFFFu) == 1.f - 0x1p-24f);
  CHECK(uniform_float(0xFFFFFFFFu) < 1.f);
  CHECK(uniform_float(0x80000000u) == 0.5f);
}

TEST_CASE("exact integer helpers agree with 128-bit arithmetic", "[verify][fixed]")
{
  __extension__ using u128 = unsigned __int128;
  auto rng                 = test::seeded_engine("fixed point");
  for (int i = 0; i < 100000; ++i) {
    std::uint64_t const a = rng() >> (rng() % 64), b = rng() >> (rng() % 64);
    REQUIRE(dhisparse::detail::mulhi64(a, b) == std::uint64_t((u128(a) * b) >> 64));
    u128 const shifted = (u128(a) * b) >> 62;
    std::uint64_t const expect = shifted >> 64 ? ~std::uint64_t(0) : std::uint64_t(shifted);
    REQUIRE(dv::mul_fixed(a, b) == expect);
  }
  CHECK(dv::to_fixed(1.f) == dv::fixed_one);
  CHECK(dv::to_fixed(0.5f) == dv::fixed_one / 2);
  CHECK(dv::to_fixed(0x1p-62f) == 1);
  CHECK(dv::to_fixed(0x1p-63f) == 0);
  CHECK(dv::to_fixed(1.f - 0x1p-24f) == dv::fixed_one - (dv::fixed_one >> 24));
  CHECK(dv::to_fixed(-0.25f) == 0);
  CHECK(dv::to_fixed(std::numeric_limits<float>::quiet_NaN()) == 0);
  CHECK(dv::to_fixed(std::numeric_limits<float>::infinity()) == dv::fixed_one);
  CHECK(dv::to_fixed(3.f) == dv::fixed_one);
  // Acceptance with probability 1/2 exactly: R = S/2 accepts iff bits < 2^63.
  CHECK(dv::accepts(dv::fixed_one / 2, dv::fixed_one, (std::uint64_t(1) << 63) - 1));
  CHECK(!dv::accepts(dv::fixed_one / 2, dv::fixed_one, std::uint64_t(1) << 63));
  CHECK(dv::accepts(1, 0, ~std::uint64_t(0)));  // q(x) = 0 and p(x) > 0: always accepted
  CHECK(!dv::accepts(0, 0, 0));
  // The inverse-CDF target is below the mass for every draw.
  CHECK(dv::sample_target(dv::fixed_one, ~std::uint64_t(0)) < dv::fixed_one);
  CHECK(dv::sample_target(12345, ~std::uint64_t(0)) == 12344);
}

namespace {

// ---------------------------------------------------------------------------------------
// A synthetic target for greedy tests: logits depend on the whole prefix (a hash of it).
// ---------------------------------------------------------------------------------------
struct prefix_model {
  int vocab;
  std::uint64_t seed;

  static std::uint64_t mix(std::uint64_t x)
  {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  std::uint64_t extend(std::uint64_t h, std::int32_t token) const { return mix(h * 31 + std::uint64_t(token) + 1); }
  /// Logits (not probabilities: negative values included) after prefix hash h.
  std::vector<float> logits(std::uint64_t h) const
  {
    std::vector<float> out(vocab);
    for (int v = 0; v < vocab; ++v) {
      out[v] = float(std::int64_t(mix(h ^ mix(seed + v)) >> 40) - (std::int64_t(1) << 23)) * 0x1p-20f;
    }
    return out;
  }
  std::int32_t argmax(std::uint64_t h) const
  {
    std::vector<float> const l = logits(h);
    return std::int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  }
  /// Plain greedy decoding of `count` tokens after prefix hash h.
  std::vector<std::int32_t> greedy(std::uint64_t h, int count) const
  {
    std::vector<std::int32_t> out;
    for (int i = 0; i < count; ++i) {
      out.push_back(argmax(h));
      h = extend(h, out.back());
    }
    return out;
  }
};

/// Chain or tree greedy problem over `prefix_model`; returns the case and each request's
/// root prefix hash.
test::verify_case make_greedy_case(draft_topology topo, int B, int d, prefix_model const& model,
                                   std::mt19937_64& g, std::vector<std::uint64_t>& roots, bool ids)
{
  test::verify_case c;
  c.a.rule       = verify_rule::greedy;
  c.a.topology   = topo;
  c.a.capacity   = B;
  c.a.max_drafts = d;
  c.a.vocab      = model.vocab;
  int const R    = d + 1;
  bool const tree = topo == draft_topology::tree;
  c.p.resize(std::size_t(B) * R * model.vocab);
  if (ids) { c.target_tokens.resize(std::size_t(B) * R); }
  c.draft_tokens.resize(std::size_t(B) * (tree ? R : d));
  if (tree) {
    c.first_child.resize(std::size_t(B) * R);
    c.next_sibling.resize(std::size_t(B) * R);
  }
  std::uniform_real_distribution<double> unit(0, 1);
  std::uniform_int_distribution<int> any(0, model.vocab - 1);
  roots.assign(B, 0);
  for (int b = 0; b < B; ++b) {
    roots[b] = g();
    std::vector<int> parent(R);
    if (tree) {
      parent = test::random_tree(d, g, c.first_child.data() + std::size_t(b) * R,
                                 c.next_sibling.data() + std::size_t(b) * R, 3);
    } else {
      for (int m = 0; m <= d; ++m) { parent[m] = m - 1; }
    }
    std::vector<std::uint64_t> h(R);
    h[0] = roots[b];
    for (int m = 0; m <= d; ++m) {
      if (m > 0) {
        // Siblings carry distinct tokens, as in EAGLE trees (with duplicates the rule
        // follows the first in sibling order).
        std::int32_t x = unit(g) < 0.7 ? model.argmax(h[parent[m]]) : any(g);
        auto taken     = [&](std::int32_t t) {
          for (int k = 1; k < m; ++k) {
            if (parent[k] == parent[m] && c.token(b, k) == t) { return true; }
          }
          return false;
        };
        while (taken(x)) { x = any(g); }
        c.token(b, m) = x;
        h[m]                 = model.extend(h[parent[m]], x);
      }
      std::vector<float> const l = model.logits(h[m]);
      std::copy(l.begin(), l.end(), c.p.begin() + (std::size_t(b) * R + m) * model.vocab);
      if (ids) { c.target_tokens[std::size_t(b) * R + m] = model.argmax(h[m]); }
    }
  }
  if (ids) { c.p.clear(); }
  c.bind();
  c.poison();
  return c;
}

}  // namespace

TEST_CASE("greedy verification emits exactly the target's greedy decoding", "[verify][greedy]")
{
  auto g = test::seeded_engine("greedy");
  prefix_model const model{97, g()};
  for (auto topo : {draft_topology::chain, draft_topology::tree}) {
    for (bool ids : {false, true}) {
      int const B = 200, d = 7;
      std::vector<std::uint64_t> roots;
      test::verify_case c = make_greedy_case(topo, B, d, model, g, roots, ids);
      host::verify(c.a);
      CHECK(c.status[0] == 0);
      int total_accepted = 0;
      for (int b = 0; b < B; ++b) {
        std::vector<std::int32_t> const e     = c.emitted_of(b);
        std::vector<std::int32_t> const plain = model.greedy(roots[b], d + 1);
        INFO("request " << b << (topo == draft_topology::tree ? " tree" : " chain") << (ids ? " ids" : ""));
        REQUIRE(!e.empty());
        REQUIRE(std::equal(e.begin(), e.end(), plain.begin()));
        REQUIRE(c.accepted[b] == int(e.size()) - 1);
        REQUIRE(c.next_token[b] == e.back());
        // Longest prefix of the plain decoding present in the draft, found by brute force.
        int deepest = 0;
        for (int m = 1; m <= d; ++m) {
          std::vector<std::int32_t> path;
          int node = m;
          if (topo == draft_topology::tree) {
            std::vector<int> parent(d + 1, -1);
            std::int32_t const* fc = c.first_child.data() + std::size_t(b) * (d + 1);
            std::int32_t const* ns = c.next_sibling.data() + std::size_t(b) * (d + 1);
            for (int r = 0; r <= d; ++r) {
              for (int k = fc[r]; k != -1; k = ns[k]) { parent[k] = r; }
            }
            for (; node > 0; node = parent[node]) { path.insert(path.begin(), c.token(b, node)); }
          } else {
            for (int k = 1; k <= m; ++k) { path.push_back(c.token(b, k)); }
          }
          if (std::equal(path.begin(), path.end(), plain.begin())) { deepest = std::max(deepest, int(path.size())); }
        }
        REQUIRE(c.accepted[b] == deepest);
        for (int j = 0; j < c.accepted[b]; ++j) {
          REQUIRE(c.token(b, c.accepted_nodes[std::size_t(b) * d + j]) == e[j]);
        }
        total_accepted += c.accepted[b];
      }
      CHECK(total_accepted > B);  // the drafts do get accepted: the test exercises the walk
    }
  }
}

TEST_CASE("greedy argmax breaks ties toward the smallest token id", "[verify][greedy]")
{
  test::verify_case c;
  c.a.rule       = verify_rule::greedy;
  c.a.capacity   = 1;
  c.a.max_drafts = 1;
  c.a.vocab      = 6;
  c.p            = {0.1f, 0.3f, 0.1f, 0.3f, 0.2f, 0.f, -1.f, 5.f, 5.f, 2.f, 5.f, 0.f};
  c.draft_tokens = {1};
  c.bind();
  host::verify(c.a);
  CHECK(c.emitted_of(0) == std::vector<std::int32_t>{1, 1});  // token 1 beats 3; row 1: 1 beats 2 and 4
}

namespace {

void require_stats_ok(test::chain_stats_report const& r)
{
  INFO(r.text);
  CHECK(r.worst_token_z <= 6.0);
  CHECK(r.worst_length_z <= 6.0);
  CHECK(r.tv_large <= r.tv_bound_large);
  CHECK(r.tv_large < 0.5 * r.tv_expected_small);  // the distance to p0 shrinks with more trials
  CHECK(r.tv_other_large > 0.5 * r.tv_other_small);
  CHECK(r.tv_other_large > 4 * r.tv_bound_large);
}

}  // namespace

TEST_CASE("chain sampling preserves the target distribution (dense, candidate and one-hot q)",
          "[verify][stats]")
{
  auto g       = test::seeded_engine("chain stats");
  int const T  = 65536;
  for (auto dist : {draft_distribution::dense, draft_distribution::candidates, draft_distribution::one_hot}) {
    INFO("distribution " << int(dist));
    test::chain_stats_problem s = test::make_chain_stats(dist, T, 4, 8, 5, g);
    host::verify(s.c.a);
    REQUIRE(s.c.status[0] == 0);
    std::vector<float> const unrelated = test::random_distribution(8, g, 1.2);
    test::chain_stats_report const r   = test::check_chain_stats(s, unrelated);
    require_stats_ok(r);
  }
}

TEST_CASE("tree sampling preserves the target distribution (dense, candidate and one-hot q)",
          "[verify][stats]")
{
  auto g      = test::seeded_engine("tree stats");
  int const T = 65536;
  for (auto dist : {draft_distribution::dense, draft_distribution::candidates, draft_distribution::one_hot}) {
    INFO("distribution " << int(dist));
    test::tree_stats_problem s = test::make_tree_stats(dist, T, 6, 6, 4, g);
    host::verify(s.c.a);
    REQUIRE(s.c.status[0] == 0);
    test::tree_stats_report const r = test::check_tree_stats(s);
    INFO(r.text);
    CHECK(r.worst_first_z <= 6.0);
    CHECK(r.worst_transition_z <= 6.0);
    CHECK(r.tv_large <= r.tv_bound_large);
    CHECK(r.tv_large < 0.5 * r.tv_expected_small);  // the distance to p0 shrinks with more trials
    CHECK(r.tv_other_large > 0.5 * r.tv_other_small);
    CHECK(r.mean_accepted > 0.3);  // trees are accepted deep enough to test transitions
  }
}

TEST_CASE("sampling is deterministic for a seed and offset, and the offset changes it", "[verify]")
{
  auto g = test::seeded_engine("determinism");
  for (auto topo : {draft_topology::chain, draft_topology::tree}) {
    test::verify_case c = test::make_case(verify_rule::sampling, topo, draft_distribution::dense, 64, 6, 40, 0, g);
    host::verify(c.a);
    auto const first = c.emitted;
    c.poison();
    host::verify(c.a);
    CHECK(c.emitted == first);
    c.rng[1] += 1;
    c.poison();
    host::verify(c.a);
    CHECK(c.emitted != first);
  }
}

TEST_CASE("bytes_read counts the passes the rules need", "[verify]")
{
  // Chain, dense q: a rejection reads p and q of its row in full plus one chunk of each
  // again; accepting everything reads the bonus row of p and one chunk.
  auto g              = test::seeded_engine("bytes");
  int const V         = 3000;  // 6 chunks of 512; the last one short
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::chain, draft_distribution::dense,
                                        32, 3, V, 0, g);
  host::verify(c.a);
  std::uint64_t expect = 0;
  for (int b = 0; b < 32; ++b) {
    bool const rejected = c.accepted[b] < c.num_drafts[b];
    std::int64_t const chunk0 = c.next_token[b] / 512 * 512;
    std::uint64_t const chunk = std::uint64_t(std::min<std::int64_t>(512, V - chunk0)) * 4;
    expect += rejected ? 2 * (4ull * V + chunk) : 4ull * V + chunk;
  }
  CHECK(c.bytes_read[0] == expect);
}

TEST_CASE("a residual without mass is sampled from p (one pass more)", "[verify]")
{
  // Chain, dense q = min(1, 1.25·p) ≥ p everywhere: a rejection leaves max(0, p − q) = 0,
  // so the token is drawn from p itself. A rejected request reads p and q of its row (the
  // residual's mass: 0), then p again (the fallback) and one chunk of p; the token has p > 0.
  auto g              = test::seeded_engine("degenerate residual");
  int const V         = 3000;
  int const B         = 48;
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::chain, draft_distribution::dense,
                                        B, 3, V, 0, g);
  test::make_residuals_massless(c);
  host::verify(c.a);
  REQUIRE(c.status[0] == 0);
  std::uint64_t expect = 0;
  int rejected_count   = 0;
  for (int b = 0; b < B; ++b) {
    bool const rejected       = c.accepted[b] < c.num_drafts[b];
    std::int64_t const chunk0 = c.next_token[b] / 512 * 512;
    std::uint64_t const chunk = std::uint64_t(std::min<std::int64_t>(512, V - chunk0)) * 4;
    expect += rejected ? 8ull * V + 4ull * V + chunk : 4ull * V + chunk;
    rejected_count += rejected;
    CHECK(c.p_row(b, c.accepted[b])[c.next_token[b]] > 0.f);
  }
  CHECK(rejected_count > 0);
  CHECK(c.bytes_read[0] == expect);
}

TEST_CASE("padding requests get empty outputs and their inputs are not read", "[verify]")
{
  auto g = test::seeded_engine("padding");
  test::case_options o;
  o.padding = 5;  // their inputs are NaN / invalid ids
  o.row_pad = 3;  // gaps between rows hold NaN: must never be read either
  for (auto dist : {draft_distribution::dense, draft_distribution::candidates, draft_distribution::one_hot}) {
    test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::tree, dist, 7, 5, 33, 6, g, o);
    host::verify(c.a);
    CHECK(c.status[0] == 0);
    for (int b = 7; b < 12; ++b) {
      CHECK(c.accepted[b] == 0);
      CHECK(c.next_token[b] == -1);
      CHECK(c.emitted_of(b).empty());
      CHECK(c.request_status[b] == 0);
    }
  }
}

TEST_CASE("invalid inputs: a clear error naming the argument, and nothing else is touched",
          "[verify][errors]")
{
  auto g = test::seeded_engine("errors");
  struct kind {
    verify_rule rule;
    draft_topology topo;
    draft_distribution dist;
    bool ids;
  };
  std::vector<kind> const kinds = {
    {verify_rule::greedy, draft_topology::chain, draft_distribution::dense, false},
    {verify_rule::greedy, draft_topology::tree, draft_distribution::dense, true},
    {verify_rule::sampling, draft_topology::chain, draft_distribution::dense, false},
    {verify_rule::sampling, draft_topology::tree, draft_distribution::candidates, false},
    {verify_rule::sampling, draft_topology::tree, draft_distribution::one_hot, false},
  };
  int applied = 0;
  for (kind const& k : kinds) {
    test::case_options o;
    o.vary_drafts       = false;
    o.target_ids        = k.ids;
    test::verify_case const clean = [&] {
      test::verify_case c = test::make_case(k.rule, k.topo, k.dist, 4, 5, 64, 12, g, o);
      host::verify(c.a);
      return c;
    }();
    REQUIRE(clean.status[0] == 0);
    for (test::corruption const& bad : test::corruptions()) {
      test::verify_case c = clean;
      c.bind();
      c.poison();
      if (!bad.apply(c, 2)) { continue; }
      ++applied;
      INFO(bad.name << " (rule " << int(k.rule) << ", tree " << int(k.topo) << ", q " << int(k.dist) << ")");
      // Throwing mode: the message names the argument and request; no output is written.
      try {
        host::verify(c.a);
        FAIL("no error thrown");
      } catch (dhisparse::error const& e) {
        std::string const what = e.what();
        INFO(what);
        CHECK(what.find(bad.argument) != std::string::npos);
        CHECK(what.find("request 2") != std::string::npos);
      }
      CHECK(std::all_of(c.emitted.begin(), c.emitted.end(), [](std::int32_t t) { return t == -777; }));
      CHECK(c.status[0] == 0xDEADBEEFu);
      // Flagging mode: the bad request is emptied, its bits raised, the others unchanged.
      host::verify(c.a, host::on_invalid_input::flag);
      CHECK((c.request_status[2] & bad.bit) != 0);
      CHECK(c.status[0] == c.request_status[2]);
      CHECK(c.accepted[2] == 0);
      CHECK(c.next_token[2] == -1);
      CHECK(c.emitted_of(2).empty());
      for (int b : {0, 1, 3}) {
        CHECK(c.request_status[b] == 0);
        CHECK(c.emitted_of(b) == clean.emitted_of(b));
        CHECK(c.accepted[b] == clean.accepted[b]);
      }
      CHECK(host::verify_input_status(c.a)[2] == c.request_status[2]);
    }
  }
  CHECK(applied >= 40);
}

TEST_CASE("bad shapes and batch sizes are refused with the argument named", "[verify][errors]")
{
  auto g              = test::seeded_engine("shapes");
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::chain, draft_distribution::dense,
                                        3, 4, 32, 0, g);
  auto refused_with = [&](verify_params const& a, char const* word) {
    try {
      host::verify(a);
    } catch (dhisparse::error const& e) {
      INFO(e.what());
      return std::string(e.what()).find(word) != std::string::npos;
    }
    return false;
  };
  verify_params a = c.a;
  a.max_drafts    = max_verify_drafts + 1;
  CHECK(refused_with(a, "max_drafts"));
  a = c.a, a.vocab = 0;
  CHECK(refused_with(a, "vocab"));
  a = c.a, a.q = nullptr;
  CHECK(refused_with(a, "q is null"));
  a = c.a, a.rng = nullptr;
  CHECK(refused_with(a, "rng"));
  a = c.a, a.ctas_per_request = 3;
  CHECK(refused_with(a, "ctas_per_request"));
  a = c.a, a.p_row_stride = 31;
  CHECK(refused_with(a, "p_row_stride"));
  a = c.a, a.status = nullptr;
  CHECK(refused_with(a, "status"));
  a = c.a, a.distribution = draft_distribution::candidates, a.num_candidates = 0;
  CHECK(refused_with(a, "num_candidates"));
  // The wide greedy path's workspace: 16-byte aligned, at least verify_workspace_bytes.
  alignas(16) static unsigned char scratch[4096];
  a = c.a, a.workspace = scratch, a.workspace_bytes = verify_workspace_bytes(a);
  CHECK(verify_params_problem(a).empty());
  CHECK(verify_workspace_bytes(a) % 16 == 0);
  CHECK(verify_workspace_bytes(a) >= 48u * std::size_t(a.capacity) + 4u * std::size_t(a.max_drafts + 1));
  a.workspace_bytes -= 1;
  CHECK(refused_with(a, "workspace_bytes"));
  a = c.a, a.workspace = scratch + 8, a.workspace_bytes = sizeof scratch - 8;
  CHECK(refused_with(a, "aligned"));
  c.batch_size = {4};
  c.bind();
  CHECK(refused_with(c.a, "batch_size"));
  // Flagging mode clamps the batch size and raises the bit.
  host::verify(c.a, host::on_invalid_input::flag);
  CHECK(c.status[0] == verify_status::bad_batch_size);
  std::string const text = describe_status(verify_status::p_negative | verify_status::bad_tree, status_format::explained);
  CHECK(text.find("first_child") != std::string::npos);
  CHECK(text.find("verify.p_negative") != std::string::npos);
}

TEST_CASE("the workspace layout: greedy arrays, then the shared passes' for sampling rules", "[verify][errors]")
{
  using detail::verify::workspace_layout;
  for (int const capacity : {1, 31, 32, 33, 512}) {
    for (int const d : {0, 8, 256}) {
      for (std::int64_t const V : {1, 37, 151552, 1100003}) {
        INFO("capacity " << capacity << " d " << d << " V " << V);
        workspace_layout const g = workspace_layout::of(capacity, d, V, false);
        workspace_layout const s = workspace_layout::of(capacity, d, V, true);
        // Greedy: 48 bytes per request and 4 per draft, rounded to 16; nothing else.
        CHECK(g.bytes == (48u * capacity + 4u * (d + 1) + 15) / 16 * 16);
        CHECK(g.control_bytes == 0);
        // Sampling: the same greedy arrays, then control, descriptors, chunks and partials,
        // each 16-byte aligned and large enough, in that order.
        CHECK(s.keys == g.keys);
        CHECK(s.counts == g.counts);
        CHECK(s.control >= s.counts + 4u * (d + 1));
        std::size_t const nchunks = std::size_t((V + detail::verify::chunk_length(V) - 1) / detail::verify::chunk_length(V));
        CHECK(s.control_bytes >= 4u * (4 + 2 * capacity) + 4u * ((capacity + 31) / 32));
        CHECK(s.descs >= s.control + s.control_bytes);
        CHECK(s.chunks >= s.descs + capacity * workspace_layout::desc_bytes(d));
        CHECK(s.partials >= s.chunks + 8u * capacity * nchunks);
        CHECK(s.bytes >= s.partials + capacity * std::size_t(detail::verify::max_share_groups) * workspace_layout::partial_bytes);
        for (std::size_t const at : {s.control, s.descs, s.chunks, s.partials, s.bytes}) { CHECK(at % 16 == 0); }
        CHECK(workspace_layout::desc_bytes(d) % 16 == 0);
      }
    }
  }
  verify_params a;
  a.capacity   = 512;
  a.max_drafts = 8;
  a.vocab      = 151552;
  a.rule       = verify_rule::greedy;
  CHECK(verify_workspace_bytes(a) == 48u * 512 + 48);
  a.rule = verify_rule::sampling;  // ≈ 5.5 KB per request at this vocabulary
  CHECK(verify_workspace_bytes(a) > 5000u * 512);
  CHECK(verify_workspace_bytes(a) < 6000u * 512);
}

TEST_CASE("a tree with a node linked twice is refused", "[verify][errors]")
{
  test::verify_case c;
  c.a.rule       = verify_rule::greedy;
  c.a.topology   = draft_topology::tree;
  c.a.capacity   = 1;
  c.a.max_drafts = 3;
  c.a.vocab      = 4;
  c.p.assign(16, 0.25f);
  c.draft_tokens = {0, 1, 2, 3};
  c.first_child  = {1, 3, -1, -1};  // node 3 is node 1's child ...
  c.next_sibling = {-1, 2, 3, -1};  // ... and node 2's sibling
  c.bind();
  CHECK(host::verify_input_status(c.a)[0] == verify_status::bad_tree);
  c.next_sibling = {-1, 2, -1, -1};
  c.bind();
  CHECK(host::verify_input_status(c.a)[0] == verify_status::ok);
}
