/**
 * @file e2e.hpp
 * @brief End-to-end exactness of speculative decoding over the hierarchy (issue 14, item
 *        5), for either backend: greedy speculative decoding of `examples::tiny_model` over
 *        a hierarchy with small pools must emit, token for token, what plain greedy
 *        decoding emits with every row resident — and every committed query's attention
 *        outputs must be bit-identical to the reference's at the same position.
 *
 * Requests come and go (one is replaced every `replace_every` steps); the drafter stand-in
 * peeks at the reference's tokens (correct with probability `accuracy` while on the
 * target's path), its own rows live in a draft ring that commit_verified keeps in step.
 */
#pragma once

#include <common/speculative_loop.hpp>

#include <dhisparse/hierarchy_config.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

namespace dhisparse::test {

struct e2e_options {
  int steps          = 1000;  ///< speculative steps (DHISPARSE_E2E_STEPS overrides)
  int requests       = 8;     ///< concurrent requests
  int replace_every  = 150;   ///< steps between replacing one request by a new one
  int top_k          = 16;
  examples::speculation spec;
  std::uint64_t seed = 1;
};

/// Device rows per request and group of the static-budget runs: just above the essential
/// floor of `e2e_config` (7 × 16 selections + 7 × (4 + 2) = 154).
inline constexpr int e2e_budget = 160;
/// Pool of the adaptive-budget runs: the 8 floors and 40 slots more.
inline constexpr std::int64_t e2e_adaptive_slots = 8 * 154 + 40;

/// The hierarchy of every end-to-end run: two groups of one layer, 8 requests of up to 8192
/// positions, Q ≤ 7, K = 16; `slots` per group.
inline hierarchy_config e2e_config(std::int64_t slots)
{
  hierarchy_config c;
  c.group_layers           = {1, 1};
  c.max_requests           = 8;
  c.max_batch              = 8;
  c.max_queries            = 7;
  c.max_top_k              = 16;
  c.max_context            = 8192;
  c.device_slots_per_group = slots;
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = 8 * 8192 / 16;
  return c;
}

/// Pool of the resident reference: every position of every request.
inline constexpr std::int64_t e2e_resident_slots = 8 * 8192 + 64;

/// Steps of an end-to-end run: `fallback`, or DHISPARSE_E2E_STEPS when set.
inline int e2e_steps(int fallback)
{
  char const* env = std::getenv("DHISPARSE_E2E_STEPS");
  return env != nullptr ? std::max(1, std::atoi(env)) : fallback;
}

/// The prompt of request `id`: 40 … 300 tokens, a function of (seed, id).
inline std::vector<std::int32_t> e2e_prompt(std::uint64_t seed, std::uint64_t id, int vocab)
{
  std::mt19937_64 g(examples::tiny_model::mix(seed ^ (id * 0x9E3779B97F4A7C15ull)));
  std::vector<std::int32_t> p(40 + g() % 261);
  for (auto& t : p) { t = std::int32_t(g() % std::uint64_t(vocab)); }
  return p;
}

/**
 * @brief Runs `o.steps` speculative steps on `spec_ops` against plain greedy decoding on
 *        `ref_ops` (a hierarchy that keeps every row resident), checking tokens after every
 *        step and attention digests when a request leaves. Returns the speculative run's
 *        statistics.
 */
template <class RefOps, class SpecOps>
examples::decode_stats run_e2e(RefOps& ref_ops, SpecOps& spec_ops, examples::tiny_model const& model,
                               e2e_options const& o)
{
  examples::decoder<RefOps> ref(ref_ops, model, o.top_k);
  examples::decoder<SpecOps> spec(spec_ops, model, o.top_k);
  std::mt19937_64 rng(o.seed);
  std::vector<std::uint64_t> active;
  std::uint64_t next_id = 1;
  auto const admit = [&] {
    auto const prompt = e2e_prompt(o.seed, next_id, model.vocab());
    ref.admit(next_id, prompt);
    spec.admit(next_id, prompt);
    active.push_back(next_id++);
  };
  auto const compare_digests = [&](std::uint64_t id) {
    for (std::int32_t p = std::int32_t(e2e_prompt(o.seed, id, model.vocab()).size()) - 1; p < spec.length(id); ++p) {
      INFO("request " << id << " position " << p);
      REQUIRE(spec.digests().at({id, p}) == ref.digests().at({id, p}));
    }
  };
  for (int i = 0; i < o.requests; ++i) { admit(); }
  auto const oracle = [&](std::uint64_t id, std::int32_t x) {
    auto const& t = ref.tokens(id);
    REQUIRE(std::size_t(x) < t.size());
    return t[std::size_t(x)];
  };
  for (int step = 0; step < o.steps; ++step) {
    if (o.replace_every > 0 && step > 0 && step % o.replace_every == 0) {
      // The longest request finishes: compared, released on both sides, replaced.
      auto const it = std::max_element(active.begin(), active.end(),
                                       [&](auto a, auto b) { return spec.length(a) < spec.length(b); });
      compare_digests(*it);
      spec.release(*it);
      ref.release(*it);
      active.erase(it);
      admit();
    }
    // The reference runs ahead of every request by more than a step can accept.
    for (;;) {
      std::vector<std::uint64_t> behind;
      for (auto id : active) {
        if (ref.length(id) < spec.length(id) + o.spec.max_drafts + 2) { behind.push_back(id); }
      }
      if (behind.empty()) { break; }
      ref.step_plain(behind);
    }
    spec.step_speculative(active, o.spec, oracle, rng);
    for (auto id : active) {
      auto const& got  = spec.tokens(id);
      auto const& want = ref.tokens(id);
      INFO("step " << step << " request " << id);
      REQUIRE(got.size() <= want.size());
      REQUIRE(std::equal(got.begin(), got.end(), want.begin()));
    }
    REQUIRE(spec_ops.status() == 0u);
  }
  for (auto id : active) { compare_digests(id); }
  REQUIRE(ref_ops.status() == 0u);
  auto const& s = spec.stats();
  std::printf("  %ld steps, %ld tokens (%.2f per request-step), %ld of %ld drafts accepted, %llu of %llu selected "
              "rows fetched, %llu evicted, %llu reclaimed\n",
              s.steps, s.tokens, double(s.tokens) / double(s.steps * o.requests), s.accepted, s.drafted, s.fetched,
              s.selected, s.evicted, s.reclaimed);
  REQUIRE(s.cut == 0);
  REQUIRE(s.steps == o.steps);
  REQUIRE(s.accepted > 0);
  REQUIRE(s.accepted < s.drafted);
  return s;
}

}  // namespace dhisparse::test
