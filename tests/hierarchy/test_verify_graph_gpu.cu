// The whole verify step in one CUDA graph (issue 14, item 2): load_batch → set_drafts →
// draft ring append → per group (resolve, retrieve, the model's tail writes, sparse
// attention per layer) → verify (sampling, trees, one-hot drafts, Philox offset advanced
// on the device) → commit_verified (draft ring kept in step) → backup, captured ONCE and
// replayed for every step while batches, requests, d_b, trees, RNG offsets and all inputs
// change. Every step is compared with the same calls launched directly on a twin
// hierarchy (bit-identical: statuses, committed rows and lengths, verify's outputs, the
// RNG words, attention outputs and LSE, query positions, draft rings) and with the host
// reference (hierarchy, host::verify, host::draft_ring; everything but attention, whose
// reference agrees within dtype tolerance only). The host stores agree at the end.
//
// Finding F19 (docs/reliability.md) came from this test: with about 1 seed in 8 one side read
// other bytes for a committed row, because the step's repeated entry ran allocate and undid
// its request's allocation (fixed in 5ce5ddc). An attention output that differs prints which
// selected rows differ from the reference's (`diagnose`); DHISPARSE_DIAG=1 also checks every
// resident committed row of both sides after each replay and prints the admissions and
// releases between replays, to find the first step where a side goes wrong.
#include "random.hpp"
#include "twin.cuh"

#include <dhisparse/draft_ring.cuh>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/row_format.hpp>
#include <dhisparse/host/verify.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/sparse_attention.cuh>
#include <dhisparse/verify.cuh>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

using namespace dhisparse;
using test::device_vector;

using row = row_format::mha<1, 128, bf16>;  // 512-byte rows: K and V of one head
DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mha<1, 128, bf16>);

namespace {

constexpr int K      = 64;
constexpr int Q      = 5;
constexpr int B      = 6;   // max_batch
constexpr int R      = 8;   // max_requests
constexpr int V      = 64;  // vocabulary
constexpr int heads  = 4;   // query heads (one KV head)
constexpr int budget = 360;  // ≥ the essential set at Q = 5: 5 × 64 + 5 × (4 + 2)
constexpr int window = 8;    // draft ring slots per request

hierarchy_config graph_config(bool shared)
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = R;
  c.max_batch              = B;
  c.max_queries            = Q;
  c.max_top_k              = K;
  c.max_context            = 8192;
  c.device_slots_per_group = shared ? 5 * 350 + 48 : R * budget + 64;  // shared: 5 floors and little more: reclaim works
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 32;
  c.host.capacity_pages    = R * 8192 / 32;
  return c;
}

/// The drafter's ring row of (request index, node, step).
struct ring_row {
  std::int32_t request, node, step, pad;
};
static_assert(sizeof(ring_row) == 16);

/// Row bytes of (salt, request, group, layer, position): bf16 values in [-1, 1), so
/// attention's outputs are finite and every bit of them means something.
void fill_row(std::uint64_t salt, std::uint64_t id, int g, int l, std::int64_t position, std::byte* out)
{
  std::uint64_t h = test::splitmix64(salt ^ test::splitmix64(id * 1315423911ull + std::uint64_t(g) * 977 +
                                                             std::uint64_t(l) * 131 +
                                                             std::uint64_t(position) * 2654435761ull));
  bf16* v = reinterpret_cast<bf16*>(out);
  for (std::size_t i = 0; i < row::bytes / sizeof(bf16); ++i) {
    h = test::splitmix64(h);
    v[i] = host::float_to_bf16(float(double(h >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  }
}

template <class T>
std::vector<T> download(T const* p, std::size_t n)
{
  std::vector<T> v(n);
  if (n > 0) { DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost)); }
  return v;
}

/// Every step's verification: sampling over one-hot trees (EAGLE-style), the fixture's
/// shapes, over device buffers (GPU sides) or host ones (host::verify).
verify_params step_verify_params(std::int32_t const* batch_size, std::int32_t const* num_drafts,
                                 std::int32_t const* draft_tokens, std::int32_t const* first_child,
                                 std::int32_t const* next_sibling, float const* p, std::uint64_t const* rng,
                                 std::int32_t* accepted, std::int32_t* emitted, std::int32_t* next_token,
                                 std::int32_t* nodes, std::uint32_t* status, std::uint32_t* request_status)
{
  verify_params v{};
  v.rule           = verify_rule::sampling;
  v.topology       = draft_topology::tree;
  v.distribution   = draft_distribution::one_hot;
  v.capacity       = B;
  v.max_drafts     = Q - 1;
  v.vocab          = V;
  v.batch_size     = batch_size;
  v.num_drafts     = num_drafts;
  v.draft_tokens   = draft_tokens;
  v.first_child    = first_child;
  v.next_sibling   = next_sibling;
  v.p              = p;
  v.rng            = rng;
  v.accepted       = accepted;
  v.emitted        = emitted;
  v.next_token     = next_token;
  v.accepted_nodes = nodes;
  v.status         = status;
  v.request_status = request_status;
  return v;
}

/// What one step's inputs are, on the host (uploaded to both GPU sides, fed to the reference).
struct step_inputs {
  std::vector<std::int32_t> batch;                   ///< [1 + 2B]
  std::vector<std::int32_t> num_drafts, parents;     ///< [B], [B][Q]
  std::vector<std::int32_t> first_child, next_sibling, draft_tokens;  ///< [B][Q]
  std::vector<float> p;                              ///< [B][Q][V]
  std::vector<std::vector<std::int32_t>> selections; ///< per group [B][Q][K]
  std::vector<std::vector<std::byte>> tails;         ///< per group [B][Q][group row]
  std::vector<bf16> queries;                         ///< [B][Q][heads][128]
  std::vector<ring_row> ring_rows;                   ///< [R][Q]
  std::vector<std::int32_t> ring_counts;             ///< [R]
};

/// One GPU hierarchy with everything a verify step reads and writes in fixed buffers, and
/// the step enqueued by one function: the same calls captured (graph side) or launched
/// directly (direct side).
template <class Budget>
struct gpu_side {
  using hierarchy = kv_hierarchy<row, policy::lru, Budget>;

  hierarchy h;
  draft_ring ring{R, window, 1, sizeof(ring_row)};
  device_vector<std::int32_t> batch{1 + 2 * B}, num{B}, parents{std::size_t(B) * Q};
  device_vector<std::int32_t> first_child{std::size_t(B) * Q}, next_sibling{std::size_t(B) * Q};
  device_vector<std::int32_t> draft_tokens{std::size_t(B) * Q};
  device_vector<float> p{std::size_t(B) * Q * V};
  device_vector<std::uint64_t> rng{2};
  device_vector<std::int32_t> accepted{B}, emitted{std::size_t(B) * Q}, next_token{B}, nodes{std::size_t(B) * (Q - 1)};
  device_vector<std::uint32_t> verify_status{1}, request_status{B};
  std::vector<device_vector<std::int32_t>> selections;
  std::vector<device_vector<std::byte>> tails;
  device_vector<bf16> queries{std::size_t(B) * Q * heads * 128};
  std::vector<device_vector<bf16>> out;       // per layer [B][Q][heads][128]
  std::vector<device_vector<float>> lse;      // per layer [B][Q][heads]
  device_vector<std::byte> workspace;
  device_vector<ring_row> ring_rows{std::size_t(R) * Q};
  device_vector<std::int32_t> ring_counts{R};

  gpu_side(hierarchy_config const& c, cudaStream_t s) : h{c, s}
  {
    DHISPARSE_CUDA_TRY(cudaMemset(ring.ref().data, 0x77, std::size_t(ring.ref().data_bytes())));
    for (int g = 0; g < c.num_groups(); ++g) {
      selections.emplace_back(c.step_entries());
      tails.emplace_back(std::size_t(B) * Q * c.group_layers[std::size_t(g)] * row::bytes);
      for (int l = 0; l < c.group_layers[std::size_t(g)]; ++l) {
        out.emplace_back(std::size_t(B) * Q * heads * 128);
        lse.emplace_back(std::size_t(B) * Q * heads);
        out.back().fill_bytes(0xFF);  // poisoned: unwritten elements show (identically on both sides)
        lse.back().fill_bytes(0xFF);
      }
    }
    for (auto* v : {&accepted, &emitted, &next_token, &nodes}) { v->fill_bytes(0xFF); }
  }

  verify_params verify_args()
  {
    return step_verify_params(h.batch_ref().size, num.data(), draft_tokens.data(), first_child.data(),
                              next_sibling.data(), p.data(), rng.data(), accepted.data(), emitted.data(),
                              next_token.data(), nodes.data(), verify_status.data(), request_status.data());
  }

  /// The whole verify step, enqueued on `s` (capturable: no host work depends on the device).
  void enqueue(cudaStream_t s)
  {
    hierarchy_config const& c = h.config();
    h.load_batch(batch.data(), s);
    h.set_drafts(num.data(), parents.data(), s);
    draft_ring_rows staged;
    staged.rows = reinterpret_cast<std::byte const*>(ring_rows.data());
    ring.append_async(staged, ring_counts.data(), Q, nullptr, s);
    int layer = 0;
    for (int g = 0; g < c.num_groups(); ++g) {
      h.resolve(g, selections[std::size_t(g)].data(), K, s);
      h.retrieve(g, s);
      layer_view const view = h.layer_rows(g, 0);
      int const entries     = B * Q;
      test::write_tails_kernel<<<entries, 128, 0, s>>>(view.rows, view.stride, h.tail_slots(g),
                                                       tails[std::size_t(g)].data(), entries);
      DHISPARSE_CUDA_TRY(cudaGetLastError());
      for (int l = 0; l < c.group_layers[std::size_t(g)]; ++l, ++layer) {
        sparse_attention::params a = h.attention_params(g, l);
        a.num_heads                = heads;
        sparse_attention::set_contiguous_strides<row>(a);
        a.queries       = queries.data();
        a.out           = out[std::size_t(layer)].data();
        a.lse           = lse[std::size_t(layer)].data();
        a.softmax_scale = 1.f / std::sqrt(128.f);
        a.status        = h.status();
        std::size_t const ws = sparse_attention::workspace_size<row>(a);
        if (ws > workspace.size()) {  // sized by the eager steps before the capture
          cudaStreamCaptureStatus capturing{};
          DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(s, &capturing));
          DHISPARSE_EXPECTS(capturing == cudaStreamCaptureStatusNone, "test: attention workspace sized while capturing");
          DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
          workspace = device_vector<std::byte>(ws);
        }
        DHISPARSE_CUDA_TRY(sparse_attention::run<row>(a, workspace.data(), workspace.size(), s));
      }
    }
    verify_params const v = verify_args();
    DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(v));
    DHISPARSE_CUDA_TRY(verify_async(v, s));
    DHISPARSE_CUDA_TRY(advance_rng_offset_async(rng.data(), 1, s));
    verified_step vs = verified_step::from(v);
    vs.ring          = ring.ref();
    vs.ring_index    = h.batch_ref().requests;
    vs.ring_status   = ring.status();
    h.commit_verified(vs, s);
    h.backup(s);
  }

  void upload(step_inputs const& in, std::uint64_t const* rng_words)
  {
    batch.upload(in.batch);
    num.upload(in.num_drafts);
    parents.upload(in.parents);
    first_child.upload(in.first_child);
    next_sibling.upload(in.next_sibling);
    draft_tokens.upload(in.draft_tokens);
    p.upload(in.p);
    for (std::size_t g = 0; g < selections.size(); ++g) {
      selections[g].upload_prefix(in.selections[g]);
      tails[g].upload(in.tails[g]);
    }
    queries.upload(in.queries);
    ring_rows.upload(in.ring_rows);
    ring_counts.upload(in.ring_counts);
    if (rng_words != nullptr) { rng.upload(std::vector<std::uint64_t>(rng_words, rng_words + 2)); }
  }
};

template <class Budget>
class graph_fixture {
 public:
  using ref_type = host::kv_hierarchy<row, policy::lru, Budget>;

  graph_fixture(hierarchy_config const& c, std::uint64_t salt, cudaStream_t s)
    : c_{c}, salt_{salt}, s_{s}, graph_side_{c, s}, direct_{c, s}, ref_{c},
      ref_ring_{R, window, 1, sizeof(ring_row), std::byte{0x77}}
  {
  }

  ~graph_fixture()
  {
    if (exec_ != nullptr) { cudaGraphExecDestroy(exec_); }
    if (graph_ != nullptr) { cudaGraphDestroy(graph_); }
  }

  void admit(std::uint64_t id, std::int32_t length)
  {
    request_id const rid{id};
    graph_side_.h.admit(rid, length, s_, 8000);
    direct_.h.admit(rid, length, s_, 8000);
    ref_.admit(rid, length, 8000);
    std::int32_t const r = ref_.request_index(rid);
    if (std::getenv("DHISPARSE_DIAG") != nullptr) {
      std::printf("event before step %d: admit %llu (index %d, length %d)\n", step_ + 1, (unsigned long long)id, r, length);
    }
    REQUIRE(graph_side_.h.request_index(rid) == r);
    REQUIRE(direct_.h.request_index(rid) == r);
    for (std::int32_t pos = 0; pos < length; ++pos) {
      for (int g = 0; g < c_.num_groups(); ++g) {
        for (int l = 0; l < c_.group_layers[std::size_t(g)]; ++l) {
          fill_row(salt_, id, g, l, pos, graph_side_.h.host_row(rid, g, l, pos));
          fill_row(salt_, id, g, l, pos, direct_.h.host_row(rid, g, l, pos));
          fill_row(salt_, id, g, l, pos, ref_.host_row(rid, g, l, pos));
        }
      }
    }
    std::int64_t const start = length;
    ref_ring_.reset(&r, &start, 1);
    device_vector<std::int32_t> dr(std::vector<std::int32_t>{r});
    device_vector<std::int64_t> ds(std::vector<std::int64_t>{start});
    graph_side_.ring.reset_async(dr.data(), ds.data(), 1, s_);
    direct_.ring.reset_async(dr.data(), ds.data(), 1, s_);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s_));
    live_.push_back(id);
  }

  void release(std::uint64_t id)
  {
    if (std::getenv("DHISPARSE_DIAG") != nullptr) {
      std::printf("event before step %d: release %llu (index %d)\n", step_ + 1, (unsigned long long)id,
                  ref_.request_index(request_id{id}));
    }
    graph_side_.h.release(request_id{id}, s_);
    direct_.h.release(request_id{id}, s_);
    ref_.release(request_id{id});
    live_.erase(std::find(live_.begin(), live_.end(), id));
  }

  std::vector<std::uint64_t> const& live() const { return live_; }

  /// Random inputs of a step over `ids` (entries in that order); `repeat` adds an entry that
  /// repeats the first one's request (load_batch leaves it out and raises its bit).
  step_inputs make_inputs(std::mt19937_64& rng, std::vector<std::uint64_t> const& ids, bool repeat, int step)
  {
    step_inputs in;
    in.batch.assign(1 + 2 * B, 0);
    in.num_drafts.assign(B, 0);
    in.parents.assign(std::size_t(B) * Q, -1);
    in.first_child.assign(std::size_t(B) * Q, -1);
    in.next_sibling.assign(std::size_t(B) * Q, -1);
    in.draft_tokens.assign(std::size_t(B) * Q, 0);
    in.p.assign(std::size_t(B) * Q * V, 0.f);
    in.ring_rows.assign(std::size_t(R) * Q, ring_row{-1, -1, -1, -1});
    in.ring_counts.assign(R, 0);
    int const entries = int(ids.size()) + (repeat ? 1 : 0);
    in.batch[0]       = entries;
    std::vector<std::int32_t> depth(std::size_t(B) * Q, 0);
    for (int b = 0; b < entries; ++b) {
      bool const extra     = b == int(ids.size());
      std::uint64_t const id = extra ? ids[0] : ids[std::size_t(b)];
      std::int32_t const r = ref_.request_index(request_id{id});
      in.batch[std::size_t(1 + b)]     = r;
      in.batch[std::size_t(1 + B + b)] = 1;  // set_drafts sets 1 + d_b
      int const d = extra ? 0 : int(rng() % Q);
      in.num_drafts[std::size_t(b)] = d;
      std::int32_t* parent = in.parents.data() + std::size_t(b) * Q;
      std::int32_t* fc     = in.first_child.data() + std::size_t(b) * Q;
      std::int32_t* ns     = in.next_sibling.data() + std::size_t(b) * Q;
      std::int32_t* dep    = depth.data() + std::size_t(b) * Q;
      for (int m = 1; m <= d; ++m) {
        parent[m] = std::int32_t(m - 1 - int(rng() % std::uint64_t(std::min(m, 3))));
        dep[m]    = dep[parent[m]] + 1;
        if (fc[parent[m]] < 0) {  // first child, else the last sibling's next
          fc[parent[m]] = m;
        } else {
          std::int32_t c = fc[parent[m]];
          while (ns[c] >= 0) { c = ns[c]; }
          ns[c] = m;
        }
        in.draft_tokens[std::size_t(b) * Q + std::size_t(m)] = std::int32_t((7 * m + 3 * b + step) % V);
      }
      // The target's rows: mass on a random token, and often on a child's draft token.
      for (int node = 0; node < Q; ++node) {
        float* prow = in.p.data() + (std::size_t(b) * Q + std::size_t(node)) * V;
        std::vector<double> w(V);
        double sum = 0;
        for (int t = 0; t < V; ++t) { sum += (w[std::size_t(t)] = 0.05 + double(rng() % 1000) / 1000.0); }
        if (node <= d && fc[node] >= 0 && rng() % 4 != 0) {
          std::int32_t const child = rng() % 2 == 0 || ns[fc[node]] < 0 ? fc[node] : ns[fc[node]];
          std::int32_t const t = in.draft_tokens[std::size_t(b) * Q + std::size_t(child)];
          w[std::size_t(t)] += 4.0 * sum;  // the child's token gets 80% of the mass
          sum *= 5.0;
        }
        for (int t = 0; t < V; ++t) { prow[t] = float(w[std::size_t(t)] / sum); }
      }
      if (!extra) {  // the drafter's ring rows: the root, then one per node
        in.ring_counts[std::size_t(r)] = 1 + d;
        for (int m = 0; m <= d; ++m) { in.ring_rows[std::size_t(r) * Q + std::size_t(m)] = {r, m, step, 0}; }
      }
    }
    // Selections: committed positions, then each query's own path (tails by node index).
    for (int g = 0; g < c_.num_groups(); ++g) {
      std::vector<std::int32_t> sel(c_.step_entries(), -1);
      std::size_t const grb = std::size_t(c_.group_layers[std::size_t(g)]) * row::bytes;
      std::vector<std::byte> tails(std::size_t(B) * Q * grb, std::byte{0});
      for (std::size_t b = 0; b < ids.size(); ++b) {
        request_id const id{ids[b]};
        std::int32_t const len = ref_.length(id);
        int const d            = in.num_drafts[b];
        for (int q = 0; q <= d; ++q) {
          std::int32_t* query = sel.data() + (b * Q + std::size_t(q)) * K;
          test::make_selection(rng, len - 1, 0, K - Q, std::int32_t(rng() % std::uint64_t(len)), query);
          int k = K - Q;
          for (std::int32_t m = q; m >= 0; m = in.parents[b * Q + std::size_t(m)]) { query[k++] = len + m; }
          for (int l = 0; l < c_.group_layers[std::size_t(g)]; ++l) {
            fill_row(salt_ ^ (std::uint64_t(step + 1) << 32), ids[b], g, l, len + depth[b * Q + std::size_t(q)] + 100000 * q,
                     tails.data() + (b * Q + std::size_t(q)) * grb + std::size_t(l) * row::bytes);
          }
        }
      }
      in.selections.push_back(std::move(sel));
      in.tails.push_back(std::move(tails));
    }
    in.queries.resize(std::size_t(B) * Q * heads * 128);
    std::uniform_real_distribution<float> value(-1.f, 1.f);
    for (auto& v : in.queries) { v = host::float_to_bf16(value(rng)); }
    return in;
  }

  /// An eager step on both GPU sides (before capture), compared.
  void eager(step_inputs const& in)
  {
    upload(in);
    graph_side_.enqueue(s_);
    direct_.enqueue(s_);
    reference(in);
    compare();
  }

  void capture()
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s_));
    DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    graph_side_.enqueue(s_);
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(s_, &graph_));
    DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec_, graph_, 0));
  }

  /// One step: the graph replayed on one side, the same calls launched on the other.
  void replay(step_inputs const& in)
  {
    upload(in);
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec_, s_));
    direct_.enqueue(s_);
    reference(in);
    ++step_;
    if (std::getenv("DHISPARSE_DIAG") != nullptr) { sweep(); }
    compare();
  }

  /// Every resident committed row of both sides against the reference's host store.
  void sweep()
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s_));
    for (auto* side : {&graph_side_, &direct_}) {
      char const* name = side == &graph_side_ ? "graph" : "direct";
      auto const lengths = download(side->h.committed_lengths(), R);
      for (int g = 0; g < c_.num_groups(); ++g) {
        device_pool_ref const p = side->h.pool_ref(g);
        auto const owner = download(p.owner, std::size_t(p.num_slots));
        auto const position = download(p.position, std::size_t(p.num_slots));
        auto const dirty = download(p.dirty, std::size_t(p.num_slots));
        auto const slab = download(p.slab, std::size_t(p.num_slots) * p.group_row_bytes);
        int bad = 0;
        for (std::int32_t slot = 0; slot < p.num_slots; ++slot) {
          std::int32_t const r = owner[std::size_t(slot)], pos = position[std::size_t(slot)];
          if (r < 0 || pos < 0 || pos >= lengths[std::size_t(r)]) { continue; }
          std::uint64_t id = 0;
          for (std::uint64_t i : live_) { if (ref_.request_index(request_id{i}) == r) { id = i; } }
          if (id == 0) { std::printf("sweep step %d %s g%d slot %d owner %d not live\n", step_, name, g, slot, r); continue; }
          for (int l = 0; l < c_.group_layers[std::size_t(g)]; ++l) {
            if (std::memcmp(slab.data() + std::size_t(slot) * p.group_row_bytes + std::size_t(l) * row::bytes,
                            ref_.host_row(request_id{id}, g, l, pos), row::bytes) != 0) {
              if (bad++ < 12) {
                std::printf("sweep step %d %s g%d slot %d: request %llu (index %d, length %d) position %d layer %d WRONG dirty %d\n",
                            step_, name, g, slot, (unsigned long long)id, r, lengths[std::size_t(r)], pos, l,
                            int(dirty[std::size_t(slot)]));
              }
            }
          }
        }
        if (bad > 0) { std::printf("sweep step %d %s g%d: %d wrong rows\n", step_, name, g, bad); }
      }
    }
    std::fflush(stdout);
  }

  /// The engine sets a new RNG offset (outside the graph) on every side.
  void set_rng(std::uint64_t offset) { rng_[1] = offset; rng_dirty_ = true; }

  void check_host_stores()
  {
    graph_side_.h.backup(s_);
    direct_.h.backup(s_);
    ref_.backup();
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s_));
    for (std::uint64_t id : live_) {
      request_id const rid{id};
      for (std::int32_t pos = 0; pos < ref_.length(rid); ++pos) {
        for (int g = 0; g < c_.num_groups(); ++g) {
          for (int l = 0; l < c_.group_layers[std::size_t(g)]; ++l) {
            INFO("request " << id << " group " << g << " layer " << l << " position " << pos);
            REQUIRE(std::memcmp(graph_side_.h.host_row(rid, g, l, pos), ref_.host_row(rid, g, l, pos), row::bytes) == 0);
            REQUIRE(std::memcmp(direct_.h.host_row(rid, g, l, pos), ref_.host_row(rid, g, l, pos), row::bytes) == 0);
          }
        }
      }
    }
  }

  ref_type& ref() { return ref_; }
  std::uint64_t seed() const { return rng_[0]; }
  void seed(std::uint64_t s)
  {
    rng_[0]    = s;
    rng_[1]    = 0;
    rng_dirty_ = true;
  }

 private:
  void upload(step_inputs const& in)
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s_));
    graph_side_.upload(in, rng_dirty_ ? rng_ : nullptr);
    direct_.upload(in, rng_dirty_ ? rng_ : nullptr);
    rng_dirty_ = false;
  }

  /// The same step on the host reference.
  void reference(step_inputs const& in)
  {
    ref_.load_batch(in.batch.data());
    ref_.set_drafts(in.num_drafts.data(), in.parents.data());
    step_queries_.assign(std::size_t(ref_.batch_count()), 0);
    for (int e = 0; e < ref_.batch_count(); ++e) { step_queries_[std::size_t(e)] = ref_.batch_queries(e); }
    draft_ring_rows staged;
    staged.rows = reinterpret_cast<std::byte const*>(in.ring_rows.data());
    ref_ring_.append(staged, in.ring_counts.data(), Q, nullptr);
    for (int g = 0; g < c_.num_groups(); ++g) {
      ref_.resolve(g, in.selections[std::size_t(g)].data(), K);
      ref_.retrieve(g);
      auto const view = ref_.layer_rows(g, 0);
      for (int e = 0; e < B * Q; ++e) {
        std::int32_t const slot = ref_.tail_slots(g)[e];
        if (slot < 0) { continue; }
        std::copy_n(in.tails[std::size_t(g)].begin() + std::ptrdiff_t(std::size_t(e) * view.stride), view.stride,
                    view.rows + std::size_t(slot) * view.stride);
      }
    }
    std::int32_t const batch_size = std::clamp(in.batch[0], 0, B);
    verify_params const v = step_verify_params(
      &batch_size, in.num_drafts.data(), in.draft_tokens.data(), in.first_child.data(), in.next_sibling.data(),
      in.p.data(), rng_, accepted_.data(), emitted_.data(), next_token_.data(), nodes_.data(), &verify_status_,
      request_status_.data());
    host::verify(v);  // valid inputs: throws otherwise
    rng_[1] += 1;
    std::vector<std::int32_t> ring_index(in.batch.begin() + 1, in.batch.begin() + 1 + B);
    verified_step vs = verified_step::from(v);
    vs.ring          = ref_ring_.ref();
    vs.ring_index    = ring_index.data();
    vs.ring_status   = ref_ring_.status_word();
    ref_.commit_verified(vs);
    ref_.backup();
  }

  /// Graph side, direct side and reference agree on everything the step wrote.
  void compare()
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s_));
    auto& gs = graph_side_;
    auto& ds = direct_;
    std::size_t const n = std::size_t(B) * Q;
    // The hierarchy: one status word (attention's bit included), per-entry commit outputs,
    // lengths, the next step's positions.
    REQUIRE(gs.h.status_sync(s_) == ds.h.status_sync(s_));
    REQUIRE(gs.h.status_sync(s_) == ref_.status());
    auto const committed = download(gs.h.committed_rows(), B);
    REQUIRE(committed == download(ds.h.committed_rows(), B));
    REQUIRE(committed == std::vector<std::int32_t>(ref_.committed_rows(), ref_.committed_rows() + B));
    auto const commit_status = download(gs.h.commit_status(), B);
    REQUIRE(commit_status == download(ds.h.commit_status(), B));
    REQUIRE(commit_status == std::vector<std::uint32_t>(ref_.commit_status(), ref_.commit_status() + B));
    auto const lengths = download(gs.h.committed_lengths(), R);
    REQUIRE(lengths == download(ds.h.committed_lengths(), R));
    for (std::uint64_t id : live_) {
      REQUIRE(lengths[std::size_t(ref_.request_index(request_id{id}))] == ref_.length(request_id{id}));
    }
    auto const positions = download(gs.h.query_positions(), n);
    REQUIRE(positions == download(ds.h.query_positions(), n));
    REQUIRE(positions == std::vector<std::int32_t>(ref_.query_positions(), ref_.query_positions() + n));
    // Verification (its outputs as commit_verified cut them) and the RNG words.
    REQUIRE(gs.verify_status.download() == ds.verify_status.download());
    REQUIRE(gs.verify_status.download()[0] == verify_status_);
    REQUIRE(gs.request_status.download() == ds.request_status.download());
    REQUIRE(gs.request_status.download() == request_status_);
    REQUIRE(gs.accepted.download() == ds.accepted.download());
    REQUIRE(gs.accepted.download() == accepted_);
    REQUIRE(gs.nodes.download() == ds.nodes.download());
    REQUIRE(gs.nodes.download() == nodes_);
    REQUIRE(gs.emitted.download() == ds.emitted.download());
    REQUIRE(gs.emitted.download() == emitted_);
    REQUIRE(gs.next_token.download() == ds.next_token.download());
    REQUIRE(gs.next_token.download() == next_token_);
    REQUIRE(gs.rng.download() == ds.rng.download());
    REQUIRE(gs.rng.download() == std::vector<std::uint64_t>(rng_, rng_ + 2));
    // Attention: every output and LSE bit of every layer, for the queries of the step's
    // entries. Rows of dropped entries and of queries beyond 1 + d_b read slot tables the
    // step did not fill; slot numbers (not row contents) may differ between two runs (free
    // slots are popped by concurrent blocks), so those rows are not compared.
    for (std::size_t l = 0; l < gs.out.size(); ++l) {
      INFO("layer " << l);
      auto const a = gs.out[l].download(), b = ds.out[l].download();
      auto const la = gs.lse[l].download(), lb = ds.lse[l].download();
      for (std::size_t e = 0; e < step_queries_.size(); ++e) {
        for (int q = 0; q < step_queries_[e]; ++q) {
          INFO("entry " << e << " query " << q);
          std::size_t const row = e * Q + std::size_t(q);
          if (std::memcmp(a.data() + row * heads * 128, b.data() + row * heads * 128, heads * 128 * sizeof(bf16)) != 0) {
            diagnose(int(l), e, q);
          }
          REQUIRE(std::memcmp(a.data() + row * heads * 128, b.data() + row * heads * 128, heads * 128 * sizeof(bf16)) == 0);
          REQUIRE(std::memcmp(la.data() + row * heads, lb.data() + row * heads, heads * sizeof(float)) == 0);
        }
      }
    }
    // The draft rings.
    for (draft_ring* ring : {&gs.ring, &ds.ring}) {
      draft_ring_ref const r = ring->ref();
      REQUIRE(download(r.end, std::size_t(r.capacity)) == ref_ring_.end());
      REQUIRE(download(r.length, std::size_t(r.capacity)) == ref_ring_.length());
      REQUIRE(download(ring->status(), 1)[0] == ref_ring_.status());
      REQUIRE(download(r.data, std::size_t(r.data_bytes())) == ref_ring_.rows());
    }
  }

  /// Prints, for an attention output that differs between the sides, what each side's
  /// slot table and slab rows hold for that query against the reference's.
  void diagnose(int layer, std::size_t e, int q)
  {
    int g = 0, li = layer;
    while (li >= c_.group_layers[std::size_t(g)]) { li -= c_.group_layers[std::size_t(g)]; ++g; }
    std::size_t const at = (e * Q + std::size_t(q)) * K;
    std::vector<std::int32_t> ta(K), tb(K);
    DHISPARSE_CUDA_TRY(cudaMemcpy(ta.data(), graph_side_.h.slot_table(g) + at, K * 4, cudaMemcpyDeviceToHost));
    DHISPARSE_CUDA_TRY(cudaMemcpy(tb.data(), direct_.h.slot_table(g) + at, K * 4, cudaMemcpyDeviceToHost));
    std::int32_t const* tr = ref_.slot_table(g) + at;
    auto const sel         = graph_side_.selections[std::size_t(g)].download();
    auto const ref_rows    = ref_.layer_rows(g, li);
    auto row_of            = [&](gpu_side<Budget>& side, std::int32_t slot) {
      layer_view const v = side.h.layer_rows(g, li);
      std::vector<std::byte> r(row::bytes);
      DHISPARSE_CUDA_TRY(cudaMemcpy(r.data(), v.rows + std::size_t(slot) * v.stride, row::bytes, cudaMemcpyDeviceToHost));
      return r;
    };
    std::printf("diagnose: layer %d (group %d layer %d) entry %zu query %d\n", layer, g, li, e, q);
    int differing = 0;
    for (int k = 0; k < K; ++k) {
      std::byte const* want = tr[k] >= 0 ? ref_rows.rows + std::size_t(tr[k]) * ref_rows.stride : nullptr;
      bool const a_ok = ta[k] < 0 ? want == nullptr : want != nullptr && std::memcmp(row_of(graph_side_, ta[k]).data(), want, row::bytes) == 0;
      bool const b_ok = tb[k] < 0 ? want == nullptr : want != nullptr && std::memcmp(row_of(direct_, tb[k]).data(), want, row::bytes) == 0;
      if (!a_ok || !b_ok) {
        ++differing;
        std::printf("  k %d position %d: graph slot %d %s, direct slot %d %s, reference slot %d\n", k,
                    sel[at + std::size_t(k)], ta[k], a_ok ? "ok" : "WRONG", tb[k], b_ok ? "ok" : "WRONG", tr[k]);
        for (auto* side : {&graph_side_, &direct_}) {  // where the wrong slot is now
          std::int32_t const slot = side == &graph_side_ ? ta[k] : tb[k];
          if (slot < 0) { continue; }
          device_pool_ref const pr = side->h.pool_ref(g);
          std::int32_t owner = 0, position = 0;
          DHISPARSE_CUDA_TRY(cudaMemcpy(&owner, pr.owner + slot, 4, cudaMemcpyDeviceToHost));
          DHISPARSE_CUDA_TRY(cudaMemcpy(&position, pr.position + slot, 4, cudaMemcpyDeviceToHost));
          // After this step's commit: the selected position (still committed there), a
          // position of this step's path (the slot was also handed out as a tail), or -1.
          std::printf("    %s slot %d after the commit: owner %d position %d\n",
                      side == &graph_side_ ? "graph" : "direct", slot, owner, position);
        }
      }
    }
    std::printf("diagnose: %d of %d selected rows differ from the reference's\n", differing, K);
    std::fflush(stdout);
  }

  hierarchy_config c_;
  int step_ = 1;  // replays so far, for DHISPARSE_DIAG's messages
  std::uint64_t salt_;
  cudaStream_t s_;
  gpu_side<Budget> graph_side_, direct_;
  ref_type ref_;
  host::draft_ring ref_ring_;
  std::vector<std::uint64_t> live_;
  std::uint64_t rng_[2] = {0, 0};
  bool rng_dirty_       = true;
  std::vector<std::int32_t> accepted_ = std::vector<std::int32_t>(B), emitted_ = std::vector<std::int32_t>(std::size_t(B) * Q),
                            next_token_ = std::vector<std::int32_t>(B),
                            nodes_      = std::vector<std::int32_t>(std::size_t(B) * (Q - 1));
  std::vector<std::uint32_t> request_status_ = std::vector<std::uint32_t>(B);
  std::uint32_t verify_status_               = 0;
  std::vector<std::int32_t> step_queries_;  ///< queries of each entry of the last step (0: dropped)
  cudaGraph_t graph_{};
  cudaGraphExec_t exec_{};
};

}  // namespace

TEMPLATE_TEST_CASE("the whole verify step captured once in a CUDA graph replays exactly with new batches, d_b and "
                   "RNG offsets",
                   "[hierarchy][gpu][verify_step][graph]", policy::static_budget<budget>, policy::adaptive_budget<>)
{
  auto rng                 = test::seeded_engine("whole verify step graph");
  std::uint64_t const salt = rng();
  test::stream_guard stream;
  constexpr bool shared = TestType::kind == budget_kind::shared;
  graph_fixture<TestType> f(graph_config(shared), salt, stream.s);
  f.seed(rng());
  std::uint64_t next_id = 1;
  for (int i = 0; i < 5; ++i) { f.admit(next_id++, 200 + std::int32_t(rng() % 2000)); }

  // One eager step on both sides (lazy initialisation, the attention workspace sized from
  // resolved groups), then the capture of the graph side.
  auto ids = f.live();
  f.eager(f.make_inputs(rng, ids, false, 0));
  f.eager(f.make_inputs(rng, ids, false, 1));
  f.capture();

  int const steps = 10 * test::test_scale();
  for (int s = 2; s < steps + 2; ++s) {
    INFO("step " << s);
    if (s % 7 == 0) {  // a request finishes, a new one comes (host side, between replays)
      f.release(f.live()[std::size_t(rng() % f.live().size())]);
      f.admit(next_id++, 100 + std::int32_t(rng() % 1500));
    }
    if (s % 5 == 0) { f.set_rng(rng()); }  // the engine moves the offset itself
    // A new batch: a random subset of the live requests in random order, sometimes with
    // an invalid entry (a repeated request) that load_batch leaves out.
    ids = f.live();
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(1 + rng() % std::min<std::size_t>(ids.size(), B - 1));
    f.replay(f.make_inputs(rng, ids, s % 4 == 3, s));  // status words are sticky on every side
  }
  f.check_host_stores();
}
