// speculative_decode: greedy speculative decoding over the KV hierarchy, the whole loop.
//
// A tiny deterministic target model (examples/common/tiny_model.hpp: its logits are a
// random projection of sparse attention over the hierarchy) decodes four requests whose
// device pools hold ~10 × top-K rows each, so rows are evicted and fetched back all the
// time. Three runs over the same prompts:
//   1. plain greedy decoding (one query per request and step);
//   2. speculation with chains: per request and step up to 4 drafts, verified greedily,
//      committed straight from verify's outputs (commit_verified);
//   3. speculation with draft trees of up to 6 nodes (tree nodes of one depth share a
//      position; the accepted path is compacted onto positions at commit);
//   4. chains whose length a load-aware controller (speculation_controller.hpp) picks per
//      request and step from its running acceptance and the step's cost, for drafters of
//      unequal quality.
// The drafter is a stand-in that agrees with the target 70% of the time while on its path;
// its own rows live in a draft ring that commit_verified keeps in step. Runs 2 and 3 must
// emit exactly run 1's tokens (the program fails otherwise); it prints tokens per step,
// acceptance, and rows fetched from host memory per token with and without speculation.
//
// Runs on the GPU when one is present (hierarchy, attention, verification, commit, ring all
// on the device), on the host reference backend otherwise; it says which.
#include <common/speculative_gpu.cuh>
#include <common/speculative_loop.hpp>

#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/speculation_controller.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <vector>

namespace ds = dhisparse;
using examples::tiny_model;

namespace {

constexpr int requests   = 4;
constexpr int top_k      = 16;
constexpr int new_tokens = 240;  // decoded per request by the plain run
constexpr int budget     = 160;  // device rows per request and group: ~10 × top-K

using hierarchy_host = ds::host::kv_hierarchy<tiny_model::row, ds::policy::lru, ds::policy::static_budget<budget>>;
using hierarchy_gpu  = ds::kv_hierarchy<tiny_model::row, ds::policy::lru, ds::policy::static_budget<budget>>;

ds::hierarchy_config make_config()
{
  ds::hierarchy_config c;
  c.group_layers           = {1, 1};  // two layer groups of one layer
  c.max_requests           = requests;
  c.max_batch              = requests;
  c.max_queries            = 7;       // the root and up to 6 draft nodes
  c.max_top_k              = top_k;
  c.max_context            = 2048;
  c.device_slots_per_group = requests * budget;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = requests * 2048 / 16;
  return c;
}

std::vector<std::int32_t> prompt(int r)
{
  std::mt19937_64 g(1000 + r);
  std::vector<std::int32_t> p(200 + 50 * r);
  for (auto& t : p) { t = std::int32_t(g() % 32); }
  return p;
}

double per_token(unsigned long long rows, long tokens) { return tokens > 0 ? double(rows) / double(tokens) : 0.0; }

/// The three runs on one backend; `make_ops()` builds a fresh backend (its own hierarchy).
template <class Ops, class MakeOps>
int demo(MakeOps make_ops)
{
  tiny_model const model({1, 1}, 32, 2026);
  std::vector<std::uint64_t> ids;
  for (int r = 0; r < requests; ++r) { ids.push_back(std::uint64_t(r + 1)); }

  // 1. Plain greedy decoding.
  std::unique_ptr<Ops> plain_ops = make_ops();
  examples::decoder<Ops> plain(*plain_ops, model, top_k);
  for (int r = 0; r < requests; ++r) { plain.admit(ids[std::size_t(r)], prompt(r)); }
  for (int s = 0; s < new_tokens; ++s) { plain.step_plain(ids); }
  auto const& p = plain.stats();
  std::printf("plain decoding:     %4ld steps, 1.00 tokens per request-step, %.2f rows fetched per token "
              "(%llu of %llu selected rows)\n",
              p.steps, per_token(p.fetched, p.tokens), p.fetched, p.selected);

  // 2, 3. Speculation with chains, then with trees; 4. chains whose lengths a load-aware
  // controller picks per request and step, for drafters of unequal quality.
  ds::speculation_settings settings;
  settings.max_drafts = 6;
  settings.cost       = {40.0, 1.0, 0.5};  // µs per step, per query, per fetched row (a guess)
  ds::speculation_controller controller(requests, settings);
  std::map<std::uint64_t, std::int32_t> chosen;
  examples::speculation adaptive{6, false, 0.7};
  adaptive.drafts      = [&](std::uint64_t id) { return chosen.at(id); };
  adaptive.accuracy_of = [](std::uint64_t id) { return std::vector<double>{0.95, 0.8, 0.5, 0.2}.at(id - 1); };
  struct run {
    examples::speculation s;
    char const* kind;
    bool controlled;
  };
  for (run const& r : {run{{4, false, 0.7}, "chains", false}, run{{6, true, 0.7}, "trees", false},
                       run{adaptive, "chains, load-aware lengths", true}}) {
    examples::speculation const& s = r.s;
    std::unique_ptr<Ops> ops = make_ops();
    examples::decoder<Ops> spec(*ops, model, top_k);
    for (int i = 0; i < requests; ++i) { spec.admit(ids[std::size_t(i)], prompt(i)); }
    auto const oracle = [&](std::uint64_t id, std::int32_t x) { return plain.tokens(id).at(std::size_t(x)); };
    std::mt19937_64 rng(7);
    std::map<std::uint64_t, long> drafts_of, steps_of;
    for (int step = 1;; ++step) {
      std::vector<std::uint64_t> active;  // requests whose drafts the stand-in can still peek at
      for (auto id : ids) {
        if (spec.length(id) + s.max_drafts + 2 <= std::int32_t(plain.tokens(id).size())) { active.push_back(id); }
      }
      if (active.empty()) { break; }
      if (r.controlled) {  // the controller's choice from each request's running acceptance
        std::vector<std::int32_t> index, num(active.size());
        for (auto id : active) { index.push_back(ops->request_index(id)); }
        ds::speculation_load load;
        auto const& st              = spec.stats();
        load.fetched_rows_per_query = st.queries > 0 ? double(st.fetched) / double(st.queries) : 0.0;
        controller.choose(index.data(), int(active.size()), load, num.data());
        for (std::size_t i = 0; i < active.size(); ++i) { chosen[active[i]] = num[i]; }
      }
      std::vector<std::int32_t> before;
      for (auto id : active) { before.push_back(spec.length(id)); }
      long const drafted = spec.stats().drafted, accepted = spec.stats().accepted;
      spec.step_speculative(active, s, oracle, rng);
      for (auto const& [id, o] : spec.last_step()) {
        drafts_of[id] += o.drafted;
        ++steps_of[id];
        if (r.controlled) { controller.observe(ops->request_index(id), o.drafted, o.accepted); }
      }
      if (step <= 4) {
        std::printf("  %s, step %d: new tokens per request", r.kind, step);
        for (std::size_t i = 0; i < active.size(); ++i) { std::printf(" %d", spec.length(active[i]) - before[i]); }
        std::printf(" (%ld of %ld drafts accepted)\n", spec.stats().accepted - accepted, spec.stats().drafted - drafted);
      }
    }
    for (auto id : ids) {
      auto const& got  = spec.tokens(id);
      auto const& want = plain.tokens(id);
      if (!std::equal(got.begin(), got.end(), want.begin())) {
        std::printf("MISMATCH: request %llu differs from plain greedy decoding\n", (unsigned long long)id);
        return 1;
      }
    }
    auto const& q = spec.stats();
    std::printf("speculation, %s: %ld steps, %.2f tokens per request-step, %.0f%% of %ld drafts accepted, "
                "%.2f rows fetched per token; tokens identical to plain decoding\n",
                r.kind, q.steps, double(q.tokens) / double(q.queries - q.drafted),
                100.0 * double(q.accepted) / double(std::max(q.drafted, 1L)), q.drafted, per_token(q.fetched, q.tokens));
    if (r.controlled) {
      std::printf("  drafts per step chosen for drafters of accuracy 0.95 / 0.8 / 0.5 / 0.2:");
      for (auto id : ids) { std::printf(" %.1f", double(drafts_of[id]) / double(std::max(steps_of[id], 1L))); }
      std::printf("  (running acceptance");
      for (auto id : ids) { std::printf(" %.2f", controller.acceptance(ops->request_index(id))); }
      std::printf(")\n");
    }
  }
  return 0;
}

}  // namespace

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("no CUDA device: host reference backend\n");
    auto const config = make_config();
    return demo<examples::host_ops<hierarchy_host>>(
      [&] { return std::make_unique<examples::host_ops<hierarchy_host>>(config, 8); });
  }
  cudaDeviceProp prop{};
  DHISPARSE_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  std::printf("CUDA backend on %s\n", prop.name);
  cudaStream_t stream{};
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  auto const config = make_config();
  int const rc = demo<examples::gpu_ops<hierarchy_gpu>>(
    [&] { return std::make_unique<examples::gpu_ops<hierarchy_gpu>>(config, 8, stream); });
  cudaStreamDestroy(stream);
  return rc;
}
