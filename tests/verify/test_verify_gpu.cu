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

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <utility>
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

/// Stands for the wide greedy path in the lists of kernel shapes: `ctas_per_request` 0 and
/// a workspace (other greedy calls ignore it; sampling calls run one CTA per request and,
/// over trees with dense q, share their later passes through it: `library_tuning`).
constexpr int wide = -1;
/// Stands for one CTA per request with shared row passes (detail/verify/shared_pass.cuh):
/// a workspace and `shared_tuning`, every sampling pass shared; greedy calls run one CTA.
constexpr int shared = -2;

/// The tuning of the `shared` shape: every pass shared (the library shares only later ones),
/// 7 groups (uneven chunk ranges; fewer where a row has fewer chunks).
detail::verify::pass_tuning shared_tuning()
{
  detail::verify::pass_tuning t;
  t.share_from   = 0;
  t.share_groups = 7;
  return t;
}

/// The kernel shapes every exactness test runs: one CTA per request, and where the device
/// has clusters a cluster per request, asked for explicitly (so that a fallback to one CTA
/// would fail the launch, not pass silently); the wide greedy path; shared row passes.
std::vector<int> ctas_choices()
{
  if (device_has_clusters()) { return {1, verify_cluster_ctas, wide, shared}; }
  return {1, 0, wide, shared};
}

/// A name for a kernel shape in test messages.
std::string shape_name(int ctas)
{
  if (ctas == wide) { return "wide"; }
  if (ctas == shared) { return "shared passes"; }
  return std::to_string(ctas) + " CTAs";
}

/// A `verify_case` uploaded to the device, with device outputs.
struct device_case {
  verify_params a;
  device_vector<std::int32_t> batch_size, num_drafts, draft_tokens, first_child, next_sibling, target_tokens,
    candidate_ids, accepted, emitted, next_token, accepted_nodes;
  device_vector<float> p, q, candidate_probs;
  device_vector<std::uint64_t> rng, bytes_read;
  device_vector<std::uint32_t> request_status, status;
  device_vector<unsigned char> workspace;
  detail::verify::pass_tuning tuning;
  bool share = false;

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

  /// Kernel shape `ctas` (`ctas_per_request`, or `wide`: the launcher's choice with a
  /// workspace of exactly `verify_workspace_bytes`, or `shared`: one CTA per request, that
  /// workspace and `tuning`).
  void use(int ctas, detail::verify::pass_tuning const& t = shared_tuning())
  {
    a.ctas_per_request = ctas == wide ? 0 : ctas == shared ? 1 : ctas;
    tuning             = ctas == shared ? t : detail::verify::pass_tuning{};
    share              = ctas == shared;
    if (ctas == wide || ctas == shared) {
      workspace         = device_vector<unsigned char>(verify_workspace_bytes(a));
      a.workspace       = workspace.data();
      a.workspace_bytes = workspace.size();
    } else {
      a.workspace       = nullptr;
      a.workspace_bytes = 0;
    }
  }

  /// Every output byte set to 0x7F: int32 0x7F7F7F7F is no token, no count, no status.
  /// The workspace, if any, gets 0xFF (every count -1, every key the largest): the call
  /// must not depend on its contents.
  void poison()
  {
    if (workspace.size()) { workspace.fill_bytes(0xFF); }
    accepted.fill_bytes(0x7F);
    emitted.fill_bytes(0x7F);
    next_token.fill_bytes(0x7F);
    accepted_nodes.fill_bytes(0x7F);
    request_status.fill_bytes(0x7F);
    status.fill_bytes(0x7F);
    bytes_read.fill_bytes(0);
  }

  /// Enqueues the call: `verify_async`, or for shared passes the launcher with `tuning`
  /// after the same checks and status reset.
  void enqueue(cudaStream_t stream)
  {
    if (!share) {
      DHISPARSE_CUDA_TRY(verify_async(a, stream));
      return;
    }
    DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(a));
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(a.status, 0, sizeof(std::uint32_t), stream));
    DHISPARSE_CUDA_TRY(detail::verify::vector_width(a) == 4 ? detail::verify::launch<4>(a, stream, tuning)
                                                            : detail::verify::launch<1>(a, stream, tuning));
  }

  void run(cudaStream_t stream = nullptr)
  {
    enqueue(stream);
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

/// Runs a case on the device (with `ctas` CTAs per request: `ctas_per_request`; `shared`:
/// with `tuning`) and on the host (flag mode, as the kernel behaves) and requires identical
/// outputs; returns the host result.
test::verify_case run_both(test::verify_case c, int ctas = 0,
                           detail::verify::pass_tuning const& tuning = shared_tuning())
{
  device_case d(c);
  d.use(ctas, tuning);
  d.poison();
  d.run();
  test::verify_case const dev = d.download(c);
  host::verify(c.a, host::on_invalid_input::flag);
  require_same(c, dev);
  return c;
}

/// The device outputs of a case run with kernel shape `ctas` (no host comparison).
test::verify_case run_device(test::verify_case const& c, int ctas)
{
  device_case d(c);
  d.use(ctas);
  d.poison();
  d.run();
  return d.download(c);
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
                  << k.ids << " " << shape_name(ctas));
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
      INFO("rule " << int(k.rule) << " tree " << int(k.topo) << " q " << int(k.dist) << " " << shape_name(ctas));
      CHECK(run_both(c, ctas).status[0] == 0);
    }
  }
  // Over 2^20 tokens a chunk spans two 512-element units.
  test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::chain, draft_distribution::dense,
                                        3, 2, 1100003, 0, g);
  for (int const ctas : ctas_choices()) {
    INFO(shape_name(ctas));
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
      // The wide greedy path and shared row passes read what the per-request kernels read:
      // the same outputs, statuses and bytes, bit for bit (for the rules each does not
      // apply to it is the one-CTA kernel).
      require_same(dev, run_device(c, wide));
      require_same(dev, run_device(c, shared));
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
  // Shared passes: the helpers stop at the clamped batch (every request) and at a negative
  // one (none).
  CHECK(run_both(c, shared).status[0] == verify_status::bad_batch_size);
  c.batch_size = {-2};
  c.bind();
  CHECK(run_both(c, shared).status[0] == verify_status::bad_batch_size);
  c.batch_size = {9};
  c.bind();

  // Greedy, on every kernel shape: too large a batch size, then a negative one (every
  // request padding).
  test::verify_case greedy = test::make_case(verify_rule::greedy, draft_topology::tree, draft_distribution::dense,
                                             5, 3, 40, 0, g);
  for (int const batch : {9, -2}) {
    greedy.batch_size = {batch};
    greedy.bind();
    for (int const ctas : ctas_choices()) {
      INFO("batch " << batch << " " << shape_name(ctas));
      test::verify_case const gr = run_both(greedy, ctas);
      CHECK(gr.status[0] == verify_status::bad_batch_size);
    }
  }

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
  d.use(wide);
  bad = d.a;
  bad.workspace_bytes -= 16;
  CHECK(verify_async(bad, nullptr) == cudaErrorInvalidValue);
  CHECK(verify_params_problem(bad).find("workspace_bytes") != std::string::npos);
  bad           = d.a;
  bad.workspace = static_cast<unsigned char*>(bad.workspace) + 8;
  CHECK(verify_async(bad, nullptr) == cudaErrorInvalidValue);
  CHECK(verify_params_problem(bad).find("aligned") != std::string::npos);
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

namespace {

/// The host reference's argmax of a row: largest value, smallest index among ties, NaN
/// skipped; -1 when every element is NaN.
std::int32_t row_argmax(float const* row, int V)
{
  float best       = -std::numeric_limits<float>::infinity();
  std::int32_t arg = -1;
  for (int i = 0; i < V; ++i) {
    if (row[i] != row[i]) { continue; }
    if (arg < 0 || row[i] > best) {
      best = row[i];
      arg  = i;
    }
  }
  return arg;
}

/// A token other than `t` (for a draft the target must reject).
std::int32_t other_than(std::int32_t t, int V) { return (t + 1 + V) % V; }

/// A greedy case whose every request b accepts exactly `accept[b]` drafts (at most its
/// count): chain drafts carry their row's argmax up to there, the next one does not. In a
/// tree (two spines: nodes 1, 3, 5, … and 2, 4, 6, … under the root) the path is the
/// second spine, so the root's first child is always rejected (sibling order).
test::verify_case accepting_case(draft_topology topo, int d, int V, std::vector<int> const& accept,
                                 std::mt19937_64& g, int padding = 0)
{
  int const B = int(accept.size());
  test::case_options o;
  o.vary_drafts       = false;
  o.padding           = padding;
  test::verify_case c = test::make_case(verify_rule::greedy, topo, draft_distribution::dense, B, d, V, 0, g, o);
  bool const tree = topo == draft_topology::tree;
  for (int b = 0; b < B; ++b) {
    if (tree) {
      std::int32_t* fc = c.first_child.data() + std::size_t(b) * (d + 1);
      std::int32_t* ns = c.next_sibling.data() + std::size_t(b) * (d + 1);
      for (int m = 0; m <= d; ++m) {
        fc[m] = m + 2 <= d ? m + 2 : -1;  // node m's child: m + 2 (the root's: 1, then 2)
        ns[m] = -1;
      }
      fc[0] = 1;
      if (d >= 2) { ns[1] = 2; }
    }
    // Path: chain 1, 2, 3, …; tree 2, 4, 6, … (parent of node m: m − 1, or m − 2 in a tree).
    auto parent = [&](int m) { return tree ? (m <= 2 ? 0 : m - 2) : m - 1; };
    for (int m = 1; m <= d; ++m) {
      c.token(b, m) = other_than(row_argmax(c.p_row(b, parent(m)), V), V);
    }
    int node = 0;
    for (int k = 1; k <= accept[b]; ++k) {
      int const next = tree ? 2 * k : k;
      if (next > d) { break; }
      c.token(b, next) = row_argmax(c.p_row(b, node), V);
      node             = next;
    }
  }
  c.bind();
  return c;
}

}  // namespace

TEST_CASE("GPU wide greedy path: one long accepted path among requests that accept nothing", "[verify][small]")
{
  auto g      = test::seeded_engine("wide long path");
  int const d = small_run() ? 8 : 16;
  for (int const V : small_run() ? std::vector<int>{20484} : std::vector<int>{151552, 20483}) {
    for (auto topo : {draft_topology::chain, draft_topology::tree}) {
      int const deepest = topo == draft_topology::tree ? d / 2 : d;
      std::vector<int> accept(small_run() ? 12 : 40, 0);
      accept[5]                 = deepest;  // the whole path
      accept[accept.size() - 1] = 2;
      test::verify_case c = accepting_case(topo, d, V, accept, g);
      for (int const ctas : ctas_choices()) {
        INFO("V " << V << " tree " << int(topo) << " " << shape_name(ctas));
        test::verify_case const r = run_both(c, ctas);
        CHECK(r.status[0] == 0);
        CHECK(r.accepted[5] == deepest);
        CHECK(r.accepted[0] == 0);
        CHECK(r.accepted[accept.size() - 1] == 2);
      }
    }
  }
}

TEST_CASE("GPU wide greedy path: every greedy case, with and without num_drafts and padding", "[verify][small]")
{
  auto g = test::seeded_engine("wide greedy");
  struct shape {
    int V, row_pad, padding;
  };
  std::vector<shape> shapes{{37, 0, 0}, {1000, 4, 2}, {4097, 0, 3}, {40000, 3, 1}, {151552, 0, 2}};
  if (small_run()) { shapes = {{37, 0, 1}, {4097, 0, 3}, {5000, 4, 2}}; }
  for (shape const s : shapes) {
    for (auto topo : {draft_topology::chain, draft_topology::tree}) {
      for (bool const counts : {true, false}) {
        for (bool const logits : {false, true}) {
          test::case_options o;
          o.padding           = s.padding;
          o.row_pad           = s.row_pad;
          int const batch     = s.V > 100000 ? 24 : (small_run() ? 10 : 48);
          test::verify_case c = test::make_case(verify_rule::greedy, topo, draft_distribution::dense, batch, 7, s.V,
                                                0, g, o);
          if (logits) {  // arbitrary values with ties at the top (a few levels only)
            std::uniform_int_distribution<int> level(-6, 2);
            for (int b = 0; b < batch; ++b) {
              for (int r = 0; r <= 7; ++r) {
                float* row = c.p_row(b, r);
                for (int i = 0; i < s.V; ++i) { row[i] = float(level(g)); }
              }
            }
            for (int b = 0; b < batch; ++b) {
              std::vector<int> parent(8, 0);
              if (topo == draft_topology::tree) {
                std::int32_t const* fc = c.first_child.data() + std::size_t(b) * 8;
                std::int32_t const* ns = c.next_sibling.data() + std::size_t(b) * 8;
                for (int m = 0; m <= 7; ++m) {
                  for (int k = fc[m]; k != -1; k = ns[k]) { parent[k] = m; }
                }
              } else {
                for (int m = 1; m <= 7; ++m) { parent[m] = m - 1; }
              }
              for (int m = 1; m <= 7; ++m) {
                std::int32_t const t = row_argmax(c.p_row(b, parent[m]), s.V);
                c.token(b, m)        = std::uniform_real_distribution<double>(0, 1)(g) < 0.6 ? t : other_than(t, s.V);
              }
            }
          }
          if (!counts) { c.num_drafts.clear(); }
          c.bind();
          INFO("V " << s.V << " tree " << int(topo) << " num_drafts " << counts << " logits " << logits);
          test::verify_case const r = run_both(c, wide);
          CHECK(r.status[0] == 0);
          require_same(r, run_device(c, 1));
        }
      }
    }
  }
}

TEST_CASE("GPU wide greedy path: argmax ties, signed zeros, infinities, denormals and NaN", "[verify][small]")
{
  auto g          = test::seeded_engine("wide argmax");
  float const nan = std::numeric_limits<float>::quiet_NaN();
  // Row patterns; each request's rows are drafted along so that every row is visited.
  using pattern = void (*)(float*, int, std::mt19937_64&);
  std::vector<std::pair<char const*, pattern>> const patterns = {
    {"ties across chunks",
     [](float* r, int V, std::mt19937_64& g) {
       std::uniform_real_distribution<float> u(-1.f, 0.f);
       for (int i = 0; i < V; ++i) { r[i] = u(g); }
       for (int i : {V - 1, V / 2, 3 * 1024 + 7, 1024, 1023}) {
         if (i < V) { r[i] = 5.f; }
       }
     }},
    {"all -inf", [](float* r, int V, std::mt19937_64&) { std::fill(r, r + V, -std::numeric_limits<float>::infinity()); }},
    {"-0 before +0",
     [](float* r, int V, std::mt19937_64&) {
       std::fill(r, r + V, -1.f);
       r[V / 3]     = -0.f;
       r[V / 3 + 1] = 0.f;
       r[V - 2]     = 0.f;
     }},
    {"zeros of both signs",
     [](float* r, int V, std::mt19937_64&) {
       std::fill(r, r + V, -2.f);
       r[1500 % V] = 0.f;
       r[V - 1]    = -0.f;
       r[2]        = -0.f;
     }},
    {"+inf twice",
     [](float* r, int V, std::mt19937_64& g) {
       std::uniform_real_distribution<float> u(-3.f, 3.f);
       for (int i = 0; i < V; ++i) { r[i] = u(g); }
       r[V - 5]     = std::numeric_limits<float>::infinity();
       r[V / 2 + 1] = std::numeric_limits<float>::infinity();
     }},
    {"a denormal above zeros",
     [](float* r, int V, std::mt19937_64&) {
       std::fill(r, r + V, 0.f);
       r[V - 3] = std::numeric_limits<float>::denorm_min() * 5;
       r[0]     = -std::numeric_limits<float>::denorm_min();
     }},
    {"-inf and the lowest float",
     [](float* r, int V, std::mt19937_64&) {
       std::fill(r, r + V, -std::numeric_limits<float>::infinity());
       r[V - 7] = std::numeric_limits<float>::lowest();
     }},
  };
  int const d = 4;
  for (int const V : small_run() ? std::vector<int>{20484, 20483} : std::vector<int>{151552, 20484, 20483, 3001}) {
    for (auto topo : {draft_topology::chain, draft_topology::tree}) {
      int const B = 12;
      std::vector<int> accept(B, d);  // every row of the path read
      test::verify_case c = accepting_case(topo, d, V, accept, g);
      auto parent         = [&](int m) { return topo == draft_topology::tree ? (m <= 2 ? 0 : m - 2) : m - 1; };
      for (int b = 0; b < B; ++b) {
        for (int r = 0; r <= d; ++r) {
          std::size_t const k = std::size_t(b * (d + 1) + r) % patterns.size();
          patterns[k].second(c.p_row(b, r), V, g);
        }
        int node = 0;  // redraft along the path for the new rows
        for (int m = 1; m <= d; ++m) { c.token(b, m) = other_than(row_argmax(c.p_row(b, parent(m)), V), V); }
        for (int k = 1;; ++k) {
          int const next = topo == draft_topology::tree ? 2 * k : k;
          if (next > d) { break; }
          c.token(b, next) = row_argmax(c.p_row(b, node), V);
          node             = next;
        }
      }
      // NaN on a visited row (request 3, row 1: flagged, emptied); every element NaN
      // (request 4, row 0); NaN in a row no walk reaches (request 6 stops at the root and
      // has NaN in its last row: not read, not flagged by the kernels).
      int const row3 = topo == draft_topology::tree ? 2 : 1;
      c.p_row(3, row3)[V / 2] = nan;
      std::fill(c.p_row(4, 0), c.p_row(4, 0) + V, nan);
      c.token(6, topo == draft_topology::tree ? 2 : 1) = other_than(row_argmax(c.p_row(6, 0), V), V);
      c.p_row(6, d)[7]                                 = nan;
      c.bind();
      std::vector<test::verify_case> outs;
      for (int const ctas : ctas_choices()) {
        INFO("V " << V << " tree " << int(topo) << " " << shape_name(ctas));
        outs.push_back(run_device(c, ctas));
        test::verify_case const& r = outs.back();
        CHECK(r.request_status[3] == verify_status::p_not_finite);
        CHECK(r.request_status[4] == verify_status::p_not_finite);
        CHECK(r.request_status[6] == 0);
        CHECK(r.accepted[6] == 0);
        CHECK(r.emitted_of(3).empty());
        require_same(outs.front(), r);
      }
      // The host reference (which checks every row for NaN) on the same case without the
      // unread NaN: identical outputs.
      c.p_row(6, d)[7] = 0.f;
      c.bind();
      for (int const ctas : ctas_choices()) {
        INFO("V " << V << " tree " << int(topo) << " " << shape_name(ctas) << " against the host");
        test::verify_case const r = run_both(c, ctas);
        for (int b : {0, 1, 2, 5, 7}) { CHECK(r.accepted[b] == (topo == draft_topology::tree ? d / 2 : d)); }
      }
    }
  }
}

TEST_CASE("GPU wide greedy path: a captured graph replays with a new batch each time", "[verify][small]")
{
  auto g            = test::seeded_engine("wide graph");
  int const batch   = small_run() ? 12 : 64;
  int const padding = 3;
  test::case_options o;
  o.padding                     = padding;
  test::verify_case const first = test::make_case(verify_rule::greedy, draft_topology::tree, draft_distribution::dense,
                                                  batch, 6, 5000, 0, g, o);
  device_case d(first);
  d.use(wide);
  test::captured_graph graph([&](cudaStream_t s) { DHISPARSE_CUDA_TRY(verify_async(d.a, s)); });
  for (int replay = 0; replay < 4; ++replay) {
    // A new problem of the same shapes in the same buffers, and a new batch size.
    test::verify_case c = replay == 0 ? first
                                      : test::make_case(verify_rule::greedy, draft_topology::tree,
                                                        draft_distribution::dense, batch, 6, 5000, 0, g, o);
    if (replay == 3) {  // one long path (the whole second spine of request 1), the rest reject
      std::vector<int> accept(batch, 0);
      accept[1] = 3;
      c         = accepting_case(draft_topology::tree, 6, 5000, accept, g, padding);
    }
    c.batch_size = {batch - 2 * replay};
    c.bind();
    d.batch_size.upload(c.batch_size);
    d.num_drafts.upload(c.num_drafts);
    d.draft_tokens.upload(c.draft_tokens);
    d.first_child.upload(c.first_child);
    d.next_sibling.upload(c.next_sibling);
    d.p.upload(c.p);
    d.poison();
    graph.replay();
    INFO("replay " << replay);
    test::verify_case const dev = d.download(c);
    host::verify(c.a, host::on_invalid_input::flag);
    require_same(c, dev);
    if (replay == 3) { CHECK(dev.accepted[1] == 3); }
  }
}

TEST_CASE("GPU sampling: residuals without mass are sampled from p, as on the host", "[verify][small]")
{
  // q = min(1, 1.25·p) lies on or above p everywhere: a rejected draft leaves max(0, p − q)
  // = 0, so the residual has no mass and the token is drawn from p itself (a pass more; in
  // a tree every later sibling sees a residual without mass).
  auto g = test::seeded_engine("degenerate residual");
  for (auto topo : {draft_topology::chain, draft_topology::tree}) {
    int const batch     = small_run() ? 10 : 40;
    int const V         = 3000;
    test::verify_case c = test::make_case(verify_rule::sampling, topo, draft_distribution::dense, batch, 6, V, 0, g);
    test::make_residuals_massless(c);
    for (int const ctas : ctas_choices()) {
      INFO("tree " << int(topo) << " " << shape_name(ctas));
      test::verify_case const r = run_both(c, ctas);
      CHECK(r.status[0] == 0);
      int rejected = 0;
      for (int b = 0; b < batch; ++b) { rejected += r.accepted[b] < r.num_drafts[b]; }
      CHECK(rejected > 0);
    }
  }
}

TEST_CASE("GPU shared row passes: every grouping gives the one-CTA outputs", "[verify][small]")
{
  // Trees with dense q make the most passes per request (a residual after each rejected
  // sibling, then the bonus); chains and the other q forms share their passes over p.
  auto g = test::seeded_engine("shared passes");
  struct grouping {
    int from, groups;
  };
  std::vector<grouping> const groupings{{0, 1}, {0, 3}, {1, 7}, {1, 64}, {2, 16}};
  for (kind const& k : all_kinds()) {
    if (k.rule != verify_rule::sampling) { continue; }
    test::verify_case c = test::make_case(k.rule, k.topo, k.dist, small_run() ? 24 : 96, 8, 5000, 16, g);
    for (grouping const gr : groupings) {
      INFO("tree " << int(k.topo) << " q " << int(k.dist) << " from " << gr.from << " groups " << gr.groups);
      detail::verify::pass_tuning t;
      t.share_from   = gr.from;
      t.share_groups = gr.groups;
      CHECK(run_both(c, shared, t).status[0] == 0);
    }
  }
  // More requests than the GPU holds at once: until the last CTAs have started, a finished
  // CTA must not wait for work (it would hold an SM a request needs); then it helps.
  test::verify_case big = test::make_case(verify_rule::sampling, draft_topology::tree, draft_distribution::dense,
                                          small_run() ? 600 : 2500, 6, 1200, 0, g);
  CHECK(run_both(big, shared).status[0] == 0);
  // Residuals without mass: the pass over p that follows is shared as well.
  test::verify_case flat = test::make_case(verify_rule::sampling, draft_topology::tree, draft_distribution::dense,
                                           small_run() ? 10 : 40, 6, 3000, 0, g);
  test::make_residuals_massless(flat);
  CHECK(run_both(flat, shared).status[0] == 0);
}

TEST_CASE("GPU sampling is deterministic; a captured graph replays with a new offset", "[verify][small]")
{
  // The default shape, and shared row passes (whose claims the captured launch must clear
  // on every replay: the poisoned workspace holds 0xFF everywhere).
  for (int const shape : {0, shared}) {
    INFO(shape_name(shape));
    auto g              = test::seeded_engine("graph");
    test::verify_case c = test::make_case(verify_rule::sampling, draft_topology::tree, draft_distribution::dense,
                                          small_run() ? 8 : 32, 6, 4000, 0, g);
    device_case d(c);
    d.use(shape);
    d.poison();
    d.run();
    test::verify_case const first = d.download(c);
    d.poison();
    d.run();
    require_same(first, d.download(c));

    test::captured_graph graph([&](cudaStream_t s) {
      d.enqueue(s);
      DHISPARSE_CUDA_TRY(advance_rng_offset_async(d.rng.data(), 1, s));
    });
    std::vector<std::vector<std::int32_t>> seen;
    for (int replay = 0; replay < 3; ++replay) {
      d.poison();
      graph.replay();
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
    graph.replay();
    test::verify_case ref = c;
    ref.rng               = state;
    ref.bind();
    host::verify(ref.a);
    require_same(ref, d.download(c));
  }
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
