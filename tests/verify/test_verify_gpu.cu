// Speculative verification kernels against the host reference: identical outputs on
// random problems of every kind, input checks through the device status word, the
// statistical contract on the GPU, determinism and CUDA-graph replay.
//
// Tests tagged [small] are the subset run under compute-sanitizer; with the environment
// variable DHISPARSE_TEST_SMALL set they also shrink their loops (sanitizers are slow).
#include <dhisparse/verify.cuh>
DHISPARSE_VERIFY_EXTERN();  // the kernels are compiled once, in verify_instantiate.cu

#include <dhisparse/host/verify.hpp>

#include "gpu_test.cuh"
#include "random.hpp"
#include "verify_cases.hpp"
#include "verify_stats.hpp"

#include <catch2/catch.hpp>
#include <curand_kernel.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dhisparse;
using test::device_vector;

namespace {

bool small_run() { return std::getenv("DHISPARSE_TEST_SMALL") != nullptr; }

/// Whether the current device has thread-block clusters (sm_90 and later).
bool device_has_clusters()
{
  int device = 0, major = 0;
  DHISPARSE_CUDA_TRY(cudaGetDevice(&device));
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

/// The kernel shapes every exactness test runs: one CTA per request, and where the device
/// has clusters a cluster per request, asked for explicitly (so that a fallback to one CTA
/// would fail the launch, not pass silently).
std::vector<int> ctas_choices()
{
  if (device_has_clusters()) { return {1, verify_cluster_ctas}; }
  return {1, 0};
}

/// A `verify_case` uploaded to the device, with device outputs.
struct device_case {
  verify_params a;
  device_vector<std::int32_t> batch_size, num_drafts, draft_tokens, first_child, next_sibling, target_tokens,
    candidate_ids, accepted, emitted, next_token, accepted_nodes;
  device_vector<float> p, q, candidate_probs;
  device_vector<std::uint64_t> rng, bytes_read;
  device_vector<std::uint32_t> request_status, status;

  explicit device_case(test::verify_case const& c) : a{c.a}
  {
    auto up = [](auto& dst, auto const& src) {
      using T = typename std::decay_t<decltype(src)>::value_type;
      if (src.empty()) { return static_cast<T*>(nullptr); }  // no zero-size copies
      dst = device_vector<T>(src);
      return dst.data();
    };
    a.batch_size      = up(batch_size, c.batch_size);
    a.num_drafts      = up(num_drafts, c.num_drafts);
    a.draft_tokens    = up(draft_tokens, c.draft_tokens);
    a.first_child     = up(first_child, c.first_child);
    a.next_sibling    = up(next_sibling, c.next_sibling);
    a.target_tokens   = up(target_tokens, c.target_tokens);
    a.candidate_ids   = up(candidate_ids, c.candidate_ids);
    a.p               = up(p, c.p);
    a.q               = up(q, c.q);
    a.candidate_probs = up(candidate_probs, c.candidate_probs);
    a.rng             = up(rng, c.rng);
    a.accepted        = up(accepted, c.accepted);
    a.emitted         = up(emitted, c.emitted);
    a.next_token      = up(next_token, c.next_token);
    a.accepted_nodes  = up(accepted_nodes, c.accepted_nodes);
    a.request_status  = up(request_status, c.request_status);
    a.status          = up(status, c.status);
    a.bytes_read      = up(bytes_read, c.bytes_read);
    if (c.a.accepted_nodes == nullptr) { a.accepted_nodes = nullptr; }
  }

  /// Every output byte set to 0x7F: int32 0x7F7F7F7F is no token, no count, no status.
  void poison()
  {
    accepted.fill_bytes(0x7F);
    emitted.fill_bytes(0x7F);
    next_token.fill_bytes(0x7F);
    accepted_nodes.fill_bytes(0x7F);
    request_status.fill_bytes(0x7F);
    status.fill_bytes(0x7F);
    bytes_read.fill_bytes(0);
  }

  void run(cudaStream_t stream = nullptr)
  {
    DHISPARSE_CUDA_TRY(verify_async(a, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  /// The outputs, as a host case (inputs copied from `c`).
  test::verify_case download(test::verify_case const& c) const
  {
    auto fetch = [](auto const& v) {
      using T = std::decay_t<decltype(*v.data())>;
      return v.size() ? v.download() : std::vector<T>{};
    };
    test::verify_case out = c;
    out.accepted          = fetch(accepted);
    out.emitted           = fetch(emitted);
    out.next_token        = fetch(next_token);
    out.accepted_nodes    = fetch(accepted_nodes);
    out.request_status    = fetch(request_status);
    out.status            = fetch(status);
    out.bytes_read        = fetch(bytes_read);
    out.bind();
    return out;
  }
};

void require_same(test::verify_case const& host, test::verify_case const& dev)
{
  REQUIRE(dev.status == host.status);
  REQUIRE(dev.request_status == host.request_status);
  REQUIRE(dev.accepted == host.accepted);
  REQUIRE(dev.next_token == host.next_token);
  REQUIRE(dev.emitted == host.emitted);
  REQUIRE(dev.accepted_nodes == host.accepted_nodes);
  REQUIRE(dev.bytes_read == host.bytes_read);
}

/// Runs a case on the device (with `ctas` CTAs per request: `ctas_per_request`) and on the
/// host (flag mode, as the kernel behaves) and requires identical outputs; returns the host
/// result.
test::verify_case run_both(test::verify_case c, int ctas = 0)
{
  device_case d(c);
  d.a.ctas_per_request = ctas;
  d.poison();
  d.run();
  test::verify_case const dev = d.download(c);
  host::verify(c.a, host::on_invalid_input::flag);
  require_same(c, dev);
  return c;
}

struct kind {
  verify_rule rule;
  draft_topology topo;
  draft_distribution dist;
  bool ids;
};

std::vector<kind> all_kinds()
{
  std::vector<kind> out;
  for (auto topo : {draft_topology::chain, draft_topology::tree}) {
    out.push_back({verify_rule::greedy, topo, draft_distribution::dense, false});
    out.push_back({verify_rule::greedy, topo, draft_distribution::dense, true});
    for (auto dist : {draft_distribution::dense, draft_distribution::candidates, draft_distribution::one_hot}) {
      out.push_back({verify_rule::sampling, topo, dist, false});
    }
  }
  return out;
}

__global__ void philox_both(std::uint32_t const* ctr, std::uint32_t* ours, std::uint32_t* curand_out, int n)
{
  int const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) { return; }
  uint4 const c{ctr[6 * i], ctr[6 * i + 1], ctr[6 * i + 2], ctr[6 * i + 3]};
  uint2 const k{ctr[6 * i + 4], ctr[6 * i + 5]};
  auto const r = dhisparse::detail::philox4x32_10({c.x, c.y, c.z, c.w}, k.x, k.y);
  uint4 const s = curand_Philox4x32_10(c, k);
  ours[4 * i] = r.x, ours[4 * i + 1] = r.y, ours[4 * i + 2] = r.z, ours[4 * i + 3] = r.w;
  curand_out[4 * i] = s.x, curand_out[4 * i + 1] = s.y, curand_out[4 * i + 2] = s.z, curand_out[4 * i + 3] = s.w;
}

}  // namespace

TEST_CASE("device Philox equals the host's and cuRAND's", "[verify][small]")
{
  auto g      = test::seeded_engine("philox");
  int const n = 4096;
  std::vector<std::uint32_t> ctr(6 * n);
  for (auto& x : ctr) { x = std::uint32_t(g()); }
  device_vector<std::uint32_t> d_ctr(ctr), ours(4 * n), theirs(4 * n);
  philox_both<<<(n + 255) / 256, 256>>>(d_ctr.data(), ours.data(), theirs.data(), n);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  auto const a = ours.download(), b = theirs.download();
  CHECK(a == b);
  for (int i = 0; i < n; ++i) {
    auto const r = dhisparse::detail::philox4x32_10({ctr[6 * i], ctr[6 * i + 1], ctr[6 * i + 2], ctr[6 * i + 3]},
                                                    ctr[6 * i + 4], ctr[6 * i + 5]);
    REQUIRE(r.x == a[4 * i]);
    REQUIRE(r.w == a[4 * i + 3]);
  }
}

TEST_CASE("GPU verification equals the host reference on random problems", "[verify][small]")
{
  auto g = test::seeded_engine("gpu vs host");
  struct shape {
    int V;
    int row_pad;
    int padding;
  };
  // V % 4 != 0 → scalar loads; V % 4 == 0 with aligned strides → 16-byte loads; padded
  // strides and padding requests hold NaN that must never be read.
  std::vector<shape> shapes{{37, 0, 0}, {64, 0, 3}, {1000, 4, 2}, {2053, 3, 1}};
  if (small_run()) { shapes = {{37, 0, 0}, {64, 4, 3}}; }
  for (shape const s : shapes) {
    for (kind const& k : all_kinds()) {
      test::case_options o;
      o.padding    = s.padding;
      o.row_pad    = s.row_pad;
      o.target_ids = k.ids;
      test::verify_case c = test::make_case(k.rule, k.topo, k.dist, small_run() ? 8 : 24, 6, s.V, 9, g, o);
      for (int const ctas : ctas_choices()) {
        INFO("V " << s.V << " rule " << int(k.rule) << " tree " << int(k.topo) << " q " << int(k.dist) << " ids "
                  << k.ids << " ctas " << ctas);
        c.a.validate_all          = false;
        test::verify_case const r = run_both(c, ctas);
        CHECK(r.status[0] == 0);
        c.a.validate_all = true;
        run_both(c, ctas);
      }
    }
  }
}

TEST_CASE("GPU verification equals the host reference at full vocabulary size", "[verify]")
{
  auto g = test::seeded_engine("large vocab");
  for (kind const& k : all_kinds()) {
    test::case_options o;
    o.target_ids        = k.ids;
    test::verify_case c = test::make_case(k.rule, k.topo, k.dist, 6, 4, 151552, 32, g, o);
    for (int const ctas : ctas_choices()) {
      INFO("rule " << int(k.rule) << " tree " << int(k.topo) << " q " << int(k.dist) << " ctas " << ctas);
      CHECK(run_both(c, ctas).status[0] == 0);
    }
  }
  // Over 2^20 tokens a chunk spans two 512-element units.
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::chain, draft_distribution::dense,
                                        3, 2, 1100003, 0, g);
  for (int const ctas : ctas_choices()) {
    INFO("ctas " << ctas);
    CHECK(run_both(c, ctas).status[0] == 0);
  }
}

TEST_CASE("GPU input checks: status bits name the argument; nothing else is touched", "[verify][small]")
{
  auto g = test::seeded_engine("gpu errors");
  int applied = 0;
  std::vector<kind> kinds = all_kinds();
  if (small_run()) {  // one greedy, every sampling q form, both topologies
    kinds = {kinds[1], kinds[2], kinds[8], kinds[9]};
  }
  for (kind const& k : kinds) {
    test::case_options o;
    o.vary_drafts = false;
    o.target_ids  = k.ids;
    test::verify_case const clean = test::make_case(k.rule, k.topo, k.dist, 4, 5, 64, 12, g, o);
    for (test::corruption const& bad : test::corruptions()) {
      test::verify_case c = clean;
      c.bind();
      if (!bad.apply(c, 2)) { continue; }
      ++applied;
      INFO(bad.name << " (rule " << int(k.rule) << ", tree " << int(k.topo) << ", q " << int(k.dist) << ")");
      // validate_all: exactly the host's bits; the bad request emptied, the rest intact.
      // Both kernel shapes: the default (a cluster on sm_90+) and one CTA per request.
      c.a.validate_all          = true;
      test::verify_case const r = run_both(c);
      run_both(c, 1);
      CHECK((r.request_status[2] & bad.bit) != 0);
      CHECK(r.emitted_of(2).empty());
      // Without validate_all the kernel checks what it reads: a subset of the bits, and a
      // flagged request is emptied; the others equal the clean run.
      c.a.validate_all = false;
      device_case d(c);
      d.poison();
      d.run();
      test::verify_case const dev = d.download(c);
      CHECK((dev.request_status[2] & ~r.request_status[2]) == 0);
      if (dev.request_status[2] != 0) {
        CHECK(dev.emitted_of(2).empty());
        CHECK(dev.next_token[2] == -1);
        CHECK_THROWS_WITH(check_verify_status_sync(d.a.status, nullptr),
                          Catch::Contains(describe_status(dev.request_status[2], status_format::explained)));
      }
      test::verify_case ref = clean;
      ref.bind();
      host::verify(ref.a);
      for (int b : {0, 1, 3}) {
        CHECK(dev.emitted_of(b) == ref.emitted_of(b));
        CHECK(dev.request_status[b] == 0);
      }
    }
  }
  CHECK(applied >= (small_run() ? 25 : 60));
}

TEST_CASE("GPU: device batch size beyond capacity is flagged and clamped; bad params refused",
          "[verify][small]")
{
  auto g              = test::seeded_engine("batch size");
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::chain, draft_distribution::dense,
                                        5, 3, 40, 0, g);
  c.batch_size = {9};
  c.bind();
  test::verify_case const r = run_both(c);
  CHECK(r.status[0] == verify_status::bad_batch_size);
  CHECK(r.request_status[0] == 0);

  device_case d(c);
  verify_params bad = d.a;
  bad.max_drafts    = max_verify_drafts + 1;
  CHECK(verify_async(bad, nullptr) == cudaErrorInvalidValue);
  CHECK(verify_params_problem(bad).find("max_drafts") != std::string::npos);
  bad     = d.a;
  bad.rng = nullptr;
  CHECK(verify_async(bad, nullptr) == cudaErrorInvalidValue);
  bad                  = d.a;
  bad.ctas_per_request = 3;
  CHECK(verify_async(bad, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("GPU: a cluster per request is run exactly where the device has clusters", "[verify][small]")
{
  auto g              = test::seeded_engine("cluster choice");
  test::verify_case c = test::make_case(verify_rule::greedy, draft_topology::chain, draft_distribution::dense, 5,
                                        3, 4096, 0, g);
  device_case d(c);
  d.a.ctas_per_request = verify_cluster_ctas;
  cudaError_t const launched = verify_async(d.a, nullptr);
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  if (device_has_clusters()) {
    CHECK(launched == cudaSuccess);  // the tests' builds are sm_90: the cluster kernel is there
  } else {
    CHECK(launched == cudaErrorNotSupported);
    cudaGetLastError();
  }
}

TEST_CASE("GPU sampling is deterministic; a captured graph replays with a new offset", "[verify][small]")
{
  auto g              = test::seeded_engine("graph");
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::tree, draft_distribution::dense,
                                        small_run() ? 8 : 32, 6, 300, 0, g);
  device_case d(c);
  d.poison();
  d.run();
  test::verify_case const first = d.download(c);
  d.poison();
  d.run();
  require_same(first, d.download(c));

  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  DHISPARSE_CUDA_TRY(verify_async(d.a, stream));
  DHISPARSE_CUDA_TRY(advance_rng_offset_async(d.rng.data(), 1, stream));
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<std::vector<std::int32_t>> seen;
  for (int replay = 0; replay < 3; ++replay) {
    d.poison();
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    test::verify_case ref = c;
    ref.rng[1] += replay;
    ref.bind();
    host::verify(ref.a);
    require_same(ref, d.download(c));
    seen.push_back(ref.emitted);
  }
  CHECK(seen[0] != seen[1]);
  // A new offset written from the host between replays is read by the next one.
  std::vector<std::uint64_t> const state{c.rng[0], 12345};
  d.rng.upload(state);
  d.poison();
  DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  test::verify_case ref = c;
  ref.rng               = state;
  ref.bind();
  host::verify(ref.a);
  require_same(ref, d.download(c));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("GPU sampling preserves the target distribution (65536 trials per rule)", "[verify][stats]")
{
  auto g = test::seeded_engine("gpu stats");
  for (auto dist : {draft_distribution::dense, draft_distribution::candidates, draft_distribution::one_hot}) {
    INFO("distribution " << int(dist));
    test::chain_stats_problem s = test::make_chain_stats(dist, 65536, 4, 8, 5, g);
    s.c                         = run_both(s.c);  // outputs identical on GPU and host
    test::chain_stats_report const r = test::check_chain_stats(s, test::random_distribution(8, g, 1.2));
    INFO(r.text);
    CHECK(r.worst_token_z <= 6.0);
    CHECK(r.worst_length_z <= 6.0);
    CHECK(r.tv_large <= r.tv_bound_large);

    test::tree_stats_problem t = test::make_tree_stats(dist, 65536, 6, 6, 4, g);
    t.c                        = run_both(t.c);
    test::tree_stats_report const tr = test::check_tree_stats(t);
    INFO(tr.text);
    CHECK(tr.worst_first_z <= 6.0);
    CHECK(tr.worst_transition_z <= 6.0);
  }
}
