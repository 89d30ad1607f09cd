// The verify-step contract on the GPU against the host reference (tests/hierarchy/twin.cuh
// pattern, issue 14 item 1): random chains and trees with per-request draft counts
// (set_drafts), commit_verified straight from device-side verify outputs — the accepted
// path kept and compacted, the rest recycled, cut at missing tails, verify's outputs cut,
// a draft ring kept in step — compared after every step (statuses, per-entry outputs,
// lengths, positions, residency, slot accounting, counters, ring contents, host store);
// the step captured once in a CUDA graph and replayed with new drafts; a request released
// mid-step; set_batch abandoning an open step; a second resolve without commit; the ring's
// status bits and the hierarchy's in one word.
#include "random.hpp"
#include "twin.cuh"
#include "verify_step.hpp"

#include <dhisparse/draft_ring.cuh>
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

using namespace dhisparse;
using test::device_vector;
using test::stream_guard;
using test::test_scale;

namespace {

constexpr int K      = 64;
constexpr int Q      = 5;
constexpr int budget = 360;  // ≥ the essential set at Q = 5: 5 × 64 + 5 × (4 + 2)
constexpr int ring_window = 8;

hierarchy_config step_config()
{
  hierarchy_config c;
  c.group_layers           = {2, 1};
  c.max_requests           = 6;
  c.max_batch              = 6;
  c.max_queries            = Q;
  c.max_top_k              = K;
  c.max_context            = 8192;
  c.device_slots_per_group = 6 * budget + 64;
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 32;
  c.host.capacity_pages    = 6 * 8192 / 32;
  return c;
}

template <class T>
std::vector<T> download(T const* p, std::size_t n)
{
  std::vector<T> v(n);
  DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// The drafter's ring row of (request, position, node, step).
struct ring_row {
  std::int32_t request, position, node, step;
};
static_assert(sizeof(ring_row) == 16);

/**
 * A twin plus what a verify step adds: device copies of the step's drafts and of verify's
 * outputs, a draft ring on each side (one slot per request index), and the checks after a
 * verified commit.
 */
template <class Row, class Eviction, class Budget>
class verify_twin {
 public:
  using twin_type = test::twin<Row, Eviction, Budget>;

  verify_twin(hierarchy_config const& c, std::uint64_t salt, cudaStream_t stream)
    : c_{c}, salt_{salt}, stream_{stream}, t_{c, salt, stream},
      dev_ring_{c.max_requests, ring_window, 1, sizeof(ring_row)},
      ref_ring_{c.max_requests, ring_window, 1, sizeof(ring_row), std::byte{0x77}}
  {
    DHISPARSE_CUDA_TRY(cudaMemset(dev_ring_.ref().data, 0x77, std::size_t(dev_ring_.ref().data_bytes())));
    std::size_t const B = std::size_t(c.max_batch);
    d_num_ = device_vector<std::int32_t>(B);
    d_parents_ = device_vector<std::int32_t>(B * Q);
    d_accepted_ = device_vector<std::int32_t>(B);
    d_nodes_ = device_vector<std::int32_t>(B * (Q - 1));
    d_emitted_ = device_vector<std::int32_t>(B * Q);
    d_next_ = device_vector<std::int32_t>(B);
    d_rstatus_ = device_vector<std::uint32_t>(B);
    d_ring_rows_ = device_vector<ring_row>(std::size_t(c.max_requests) * Q);
    d_ring_counts_ = device_vector<std::int32_t>(std::size_t(c.max_requests));
    for (int g = 0; g < c.num_groups(); ++g) { d_sel_.emplace_back(c.step_entries()); }
  }

  twin_type& twin() { return t_; }
  auto& gpu() { return t_.gpu(); }
  auto& ref() { return t_.ref(); }

  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    t_.admit(id, length, capacity);
    std::int32_t const r     = gpu().request_index(request_id{id});
    std::int64_t const start = length;
    ref_ring_.reset(&r, &start, 1);
    device_vector<std::int32_t> dr(std::vector<std::int32_t>{r});
    device_vector<std::int64_t> ds(std::vector<std::int64_t>{start});
    dev_ring_.reset_async(dr.data(), ds.data(), 1, stream_);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }

  void set_batch(std::vector<std::uint64_t> const& ids)
  {
    ids_ = ids;
    t_.set_batch(ids, std::vector<std::int32_t>(ids.size(), 1));
  }

  /// Drafts of the step: uploaded and set on both sides (set_drafts), positions compared.
  test::verified_drafts draft(std::mt19937_64& rng, bool tree, double invalid)
  {
    auto d = test::random_verified_drafts(rng, int(ids_.size()), c_.max_batch, Q, tree, invalid);
    d_num_.upload(d.num_drafts);
    d_parents_.upload(d.parents);
    gpu().set_drafts(d_num_.data(), d_parents_.data(), stream_);
    ref().set_drafts(d.num_drafts.data(), d.parents.data());
    std::size_t const n = std::size_t(c_.max_batch) * Q;
    REQUIRE(download(gpu().query_positions(), n) == std::vector<std::int32_t>(ref().query_positions(), ref().query_positions() + n));
    REQUIRE(download(gpu().query_parents(), n) == std::vector<std::int32_t>(ref().query_parents(), ref().query_parents() + n));
    return d;
  }

  /// The drafter's ring rows of the step (root, then one per node) on both sides.
  void append_ring_rows(test::verified_drafts const& d, std::int32_t step)
  {
    std::vector<ring_row> rows(std::size_t(c_.max_requests) * Q, ring_row{-1, -1, -1, -1});
    std::vector<std::int32_t> counts(std::size_t(c_.max_requests), 0);
    for (std::size_t b = 0; b < ids_.size(); ++b) {
      int const r = gpu().request_index(request_id{ids_[b]});
      counts[std::size_t(r)] = 1 + d.num_drafts[b];
      for (int m = 0; m <= d.num_drafts[b]; ++m) {
        rows[std::size_t(r) * Q + std::size_t(m)] = {r, t_.lengths()[ids_[b]] + d.depth[b * Q + std::size_t(m)], m, step};
      }
    }
    draft_ring_rows staged;
    staged.rows = reinterpret_cast<std::byte const*>(rows.data());
    ref_ring_.append(staged, counts.data(), Q, nullptr);
    d_ring_rows_.upload(rows);
    d_ring_counts_.upload(counts);
    staged.rows = reinterpret_cast<std::byte const*>(d_ring_rows_.data());
    dev_ring_.append_async(staged, d_ring_counts_.data(), Q, nullptr, stream_);
  }

  /// Selections for group g: committed positions, then each query's own path by node index.
  std::vector<std::int32_t> selections(std::mt19937_64& rng, test::verified_drafts const& d)
  {
    std::vector<std::int32_t> sel(c_.step_entries(), -1);
    for (std::size_t b = 0; b < ids_.size(); ++b) {
      std::int32_t const len = t_.lengths()[ids_[b]];
      for (int q = 0; q <= d.num_drafts[b]; ++q) {
        std::int32_t* query = sel.data() + (b * Q + std::size_t(q)) * K;
        test::make_selection(rng, len - 1, 0, K - Q, std::int32_t(rng() % std::uint64_t(len)), query);
        int k = K - Q;
        for (std::int32_t m = q; m >= 0; m = d.parents[b * Q + std::size_t(m)]) { query[k++] = len + m; }
      }
    }
    return sel;
  }

  /// Tail rows of group g: the truth of its position for nodes on the accepted path,
  /// other bytes for the rest (so committing a wrong node shows in the bytes).
  std::vector<std::byte> tail_rows(int g, test::verified_drafts const& d)
  {
    std::size_t const grb = std::size_t(c_.group_layers[std::size_t(g)]) * Row::bytes;
    std::vector<std::byte> rows(std::size_t(c_.max_batch) * Q * grb, std::byte{0});
    for (std::size_t b = 0; b < ids_.size(); ++b) {
      std::int32_t const len = t_.lengths()[ids_[b]];
      for (int j = 0; j <= d.num_drafts[b]; ++j) {
        bool const on = d.on_path(int(b), j);
        auto const row = test::truth_group_row(on ? salt_ : salt_ ^ (0xBADull << 20) ^ std::uint64_t(j), ids_[b], g,
                                               c_.group_layers[std::size_t(g)], Row::bytes,
                                               len + d.depth[b * Q + std::size_t(j)]);
        std::copy(row.begin(), row.end(), rows.begin() + std::ptrdiff_t((b * Q + std::size_t(j)) * grb));
      }
    }
    return rows;
  }

  /// Per group: resolve + retrieve (compared), the model writes the tails on both sides.
  void forward(std::mt19937_64& rng, test::verified_drafts const& d)
  {
    for (int g = 0; g < c_.num_groups(); ++g) {
      t_.resolve(g, selections(rng, d), K);
      t_.stage_tail_rows(g, tail_rows(g, d));
      t_.write_tails_gpu(g);
      t_.write_tails_ref(g);
    }
  }

  /// verified_step over the device copies of verify's outputs (uploaded from `d`).
  verified_step device_step(test::verified_drafts const& d, bool with_ring)
  {
    d_accepted_.upload(d.accepted);
    d_nodes_.upload(d.accepted_nodes);
    d_emitted_.upload(d.emitted);
    d_next_.upload(d.next_token);
    d_rstatus_.upload(d.request_status);
    verified_step v = test::verified_drafts::verified_arrays(d_accepted_.data(), d_nodes_.data(), Q - 1,
                                                             d_emitted_.data(), d_next_.data(), d_rstatus_.data());
    if (with_ring) {
      v.ring        = dev_ring_.ref();
      v.ring_index  = gpu().batch_ref().requests;
      v.ring_status = dev_ring_.status();
    }
    return v;
  }

  /// The host reference's commit of the same step (with its ring).
  void ref_commit(test::verified_drafts& d, bool with_ring)
  {
    verified_step v = d.step();
    std::vector<std::int32_t> index(std::size_t(c_.max_batch), 0);
    if (with_ring) {
      for (std::size_t b = 0; b < ids_.size(); ++b) { index[b] = ref().request_index(request_id{ids_[b]}); }
      v.ring        = ref_ring_.ref();
      v.ring_index  = index.data();
      v.ring_status = ref_ring_.status_word();
    }
    ref().commit_verified(v);
  }

  /// Everything observable after a verified commit agrees; lengths advance.
  void compare_commit(test::verified_drafts const& d)
  {
    std::size_t const B = std::size_t(c_.max_batch);
    REQUIRE(gpu().status_sync(stream_) == ref().status());
    REQUIRE(download(gpu().committed_rows(), B) ==
            std::vector<std::int32_t>(ref().committed_rows(), ref().committed_rows() + B));
    REQUIRE(download(gpu().commit_status(), B) ==
            std::vector<std::uint32_t>(ref().commit_status(), ref().commit_status() + B));
    REQUIRE(d_emitted_.download() == d.emitted);
    REQUIRE(d_next_.download() == d.next_token);
    std::size_t const n = B * Q;
    REQUIRE(download(gpu().query_positions(), n) ==
            std::vector<std::int32_t>(ref().query_positions(), ref().query_positions() + n));
    auto const lengths = download(gpu().committed_lengths(), std::size_t(c_.max_requests));
    for (std::size_t b = 0; b < ids_.size(); ++b) {
      request_id const id{ids_[b]};
      t_.lengths()[ids_[b]] += ref().committed_rows()[b];
      REQUIRE(ref().length(id) == t_.lengths()[ids_[b]]);
      REQUIRE(lengths[std::size_t(gpu().request_index(id))] == ref().length(id));
    }
    REQUIRE(gpu().length_sync(request_id{ids_[0]}, stream_) == ref().length(request_id{ids_[0]}));
    compare_ring();
    for (int g = 0; g < c_.num_groups(); ++g) {
      t_.check_pool(g);
      t_.check_residency(g);
      t_.check_resident_bytes(g);
    }
  }

  void compare_ring()
  {
    draft_ring_ref const r = dev_ring_.ref();
    REQUIRE(download(r.end, std::size_t(r.capacity)) == ref_ring_.end());
    REQUIRE(download(r.length, std::size_t(r.capacity)) == ref_ring_.length());
    REQUIRE(download(dev_ring_.status(), 1)[0] == ref_ring_.status());
    REQUIRE(download(r.data, std::size_t(r.data_bytes())) == ref_ring_.rows());
  }

  /// One eager verified step of the current batch, compared.
  test::verified_drafts step(std::mt19937_64& rng, bool tree, double invalid, std::int32_t number)
  {
    auto d = draft(rng, tree, invalid);
    append_ring_rows(d, number);
    forward(rng, d);
    gpu().commit_verified(device_step(d, true), stream_);
    ref_commit(d, true);
    compare_commit(d);
    gpu().backup(stream_);
    ref().backup();
    for (int g = 0; g < c_.num_groups(); ++g) { t_.check_counters(g); }
    return d;
  }

  std::vector<device_vector<std::int32_t>>& selection_buffers() { return d_sel_; }
  device_vector<std::int32_t>& d_num() { return d_num_; }
  device_vector<std::int32_t>& d_parents() { return d_parents_; }
  std::vector<std::uint64_t> const& ids() const { return ids_; }

 private:
  hierarchy_config c_;
  std::uint64_t salt_;
  cudaStream_t stream_;
  twin_type t_;
  draft_ring dev_ring_;
  host::draft_ring ref_ring_;
  std::vector<std::uint64_t> ids_;
  device_vector<std::int32_t> d_num_, d_parents_, d_accepted_, d_nodes_, d_emitted_, d_next_, d_ring_counts_;
  device_vector<std::uint32_t> d_rstatus_;
  device_vector<ring_row> d_ring_rows_;
  std::vector<device_vector<std::int32_t>> d_sel_;
};

template <class Eviction, class Budget>
using vtwin = verify_twin<row_format::mla_fp8_656, Eviction, Budget>;

/// Requests 1, 2 and 3 admitted and batched, one clean verify step taken.
template <class Twin>
void start_three_requests(Twin& t, std::mt19937_64& rng)
{
  t.admit(1, 800, 8000);
  t.admit(2, 1300, 8000);
  t.admit(3, 500, 8000);
  t.set_batch({1, 2, 3});
  t.step(rng, false, 0.0, 0);
}

}  // namespace

TEMPLATE_TEST_CASE("GPU commit_verified matches the host reference on random chains and trees",
                   "[hierarchy][gpu][verify_step]", (vtwin<policy::lru, policy::static_budget<budget>>),
                   (vtwin<policy::clock, policy::static_budget<budget>>), (vtwin<policy::lru, policy::adaptive_budget<>>))
{
  auto rng                 = test::seeded_engine("verify step gpu");
  std::uint64_t const salt = rng();
  stream_guard stream;
  auto config = step_config();
  if constexpr (TestType::twin_type::gpu_type::budget_policy::kind == budget_kind::shared) {
    config.device_slots_per_group = 6 * 350 + 48;  // the floors, and little more: reclaim works
  }
  TestType t(config, salt, stream.s);
  t.admit(1, 1200, 8000);
  t.admit(2, 300, 8000);
  t.admit(3, 2500, 8000);
  t.admit(4, 700, 705);  // tight capacity: its tails run out, commits are cut
  t.set_batch({1, 2, 3, 4});
  int const steps = 12 * test_scale();
  for (int s = 0; s < steps; ++s) {
    if (s == steps / 2) { t.set_batch({3, 4, 2, 1}); }  // entries move: ring slots follow request indices
    t.step(rng, s % 2 == 1, s < steps / 3 ? 0.0 : 0.25, s);
  }
  t.twin().check_host_store();
}

TEST_CASE("GPU verify step captured in a CUDA graph replays with new drafts and trees", "[hierarchy][gpu][verify_step][graph]")
{
  auto rng                 = test::seeded_engine("verify step gpu graph");
  std::uint64_t const salt = rng();
  stream_guard stream;
  vtwin<policy::lru, policy::static_budget<budget>> t(step_config(), salt, stream.s);
  t.admit(1, 900, 8000);
  t.admit(2, 1500, 8000);
  t.admit(3, 400, 8000);
  t.set_batch({1, 2, 3});
  t.step(rng, true, 0.0, 0);  // one eager step first

  // set_drafts → (resolve, retrieve, model writes tails) per group → commit_verified →
  // backup, captured once over fixed buffers.
  auto& gpu = t.gpu();
  test::verified_drafts shape = test::random_verified_drafts(rng, 3, step_config().max_batch, Q, true, 0.0);
  verified_step const v       = t.device_step(shape, false);
  cudaGraph_t graph{};
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
  gpu.set_drafts(t.d_num().data(), t.d_parents().data(), stream.s);
  for (int g = 0; g < step_config().num_groups(); ++g) {
    gpu.resolve(g, t.selection_buffers()[std::size_t(g)].data(), K, stream.s);
    gpu.retrieve(g, stream.s);
    t.twin().write_tails_gpu(g);
  }
  gpu.commit_verified(v, stream.s);
  gpu.backup(stream.s);
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream.s, &graph));
  cudaGraphExec_t exec{};
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));

  int const steps = 8 * test_scale();
  for (int s = 0; s < steps; ++s) {
    if (s == steps / 2) { t.set_batch({3, 1}); }  // a new batch between replays
    auto d = test::random_verified_drafts(rng, int(t.ids().size()), step_config().max_batch, Q, s % 2 == 0, 0.1);
    t.d_num().upload(d.num_drafts);
    t.d_parents().upload(d.parents);
    t.ref().set_drafts(d.num_drafts.data(), d.parents.data());
    for (int g = 0; g < step_config().num_groups(); ++g) {
      auto const sel = t.selections(rng, d);
      t.selection_buffers()[std::size_t(g)].upload_prefix(sel);
      t.twin().stage_tail_rows(g, t.tail_rows(g, d));
      t.ref().resolve(g, sel.data(), K);
      t.ref().retrieve(g);
      t.twin().write_tails_ref(g);
    }
    t.device_step(d, false);  // verify's outputs into the captured buffers
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream.s));
    t.ref_commit(d, false);
    t.ref().backup();
    t.compare_commit(d);
  }
  t.twin().check_host_store();
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(exec));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(graph));
}

TEST_CASE("GPU step contract: release mid-step, set_batch abandoning a step, a resolve never committed",
          "[hierarchy][gpu][verify_step]")
{
  auto rng                 = test::seeded_engine("verify step gpu contract");
  std::uint64_t const salt = rng();
  stream_guard stream;
  vtwin<policy::lru, policy::static_budget<budget>> t(step_config(), salt, stream.s);
  auto& gpu = t.gpu();
  auto& ref = t.ref();
  start_three_requests(t, rng);

  // Request 2 is released between resolve and commit: it leaves the step, the others commit.
  auto d = t.draft(rng, true, 0.0);
  t.forward(rng, d);
  gpu.release(request_id{2}, stream.s);
  ref.release(request_id{2});
  t.twin().lengths().erase(2);
  std::vector<std::int32_t> tails(std::size_t(step_config().max_batch) * Q);
  for (int g = 0; g < 2; ++g) {
    DHISPARSE_CUDA_TRY(cudaMemcpy(tails.data(), gpu.tail_slots(g), tails.size() * 4, cudaMemcpyDeviceToHost));
    for (int j = 0; j < Q; ++j) { REQUIRE(tails[std::size_t(Q + j)] == -1); }
    t.twin().check_pool(g);
  }
  gpu.retrieve(0, stream.s);  // the released request's misses are no longer in the plan
  ref.retrieve(0);
  gpu.commit_verified(t.device_step(d, false), stream.s);
  t.ref_commit(d, false);
  REQUIRE(gpu.status_sync(stream.s) == ref.status());
  for (int g = 0; g < 2; ++g) {
    t.twin().check_pool(g);
    t.twin().check_residency(g);
  }
  t.twin().lengths()[1] += ref.committed_rows()[0];
  t.twin().lengths()[3] += ref.committed_rows()[2];
  REQUIRE(download(gpu.committed_rows(), 3) == std::vector<std::int32_t>(ref.committed_rows(), ref.committed_rows() + 3));

  // set_batch with a step left open abandons it on both sides.
  t.admit(4, 200, 8000);  // takes request 2's index (and its ring slot, reset)
  t.set_batch({1, 3, 4});
  d = t.draft(rng, false, 0.0);
  t.forward(rng, d);
  t.set_batch({4, 1});
  for (int g = 0; g < 2; ++g) {
    t.twin().check_pool(g);
    t.twin().check_residency(g);
  }
  for (int s = 0; s < 3; ++s) { t.step(rng, true, 0.0, 100 + s); }

  // A group resolved twice without a commit: the stale tails are recycled by the commit.
  std::vector<std::int32_t> none(step_config().step_entries(), -1);
  for (int g = 0; g < 2; ++g) { t.twin().resolve(g, none, K); }
  t.twin().resolve(0, none, K);
  REQUIRE((gpu.status_sync(stream.s) & status_uncommitted_tail) != 0);
  gpu.commit(nullptr, stream.s);
  ref.commit(nullptr);
  REQUIRE(gpu.status_sync(stream.s) == ref.status());
  REQUIRE(download(gpu.commit_status(), 2) == std::vector<std::uint32_t>{status_missing_tail, status_missing_tail});
  for (int g = 0; g < 2; ++g) {
    t.twin().check_pool(g);
    t.twin().check_residency(g);
  }
  gpu.clear_status(stream.s);
  ref.clear_status();
  t.set_batch({4, 1});  // plain decoding again: one query each
  for (int s = 0; s < 3; ++s) { t.twin().step(rng, K, nullptr, true); }
  REQUIRE(gpu.status_sync(stream.s) == 0u);
  t.twin().check_host_store();
}

TEST_CASE("GPU one status word: commit_verified's ring bits and the hierarchy's share h.status()",
          "[hierarchy][gpu][verify_step][status]")
{
  auto rng                 = test::seeded_engine("verify step gpu shared status");
  std::uint64_t const salt = rng();
  stream_guard stream;
  vtwin<policy::lru, policy::static_budget<budget>> t(step_config(), salt, stream.s);
  start_three_requests(t, rng);
  auto& gpu = t.gpu();
  auto& ref = t.ref();
  gpu.clear_status(stream.s);
  ref.clear_status();

  // Entry 0 asks for more drafts than it has (a hierarchy bit, status_invalid_accept_count)
  // and names a ring slot outside the ring (a ring bit, draft_ring_status::bad_request).
  auto d = t.draft(rng, true, 0.0);
  t.append_ring_rows(d, 1);
  t.forward(rng, d);
  d.accepted[0] = d.num_drafts[0] + 2;
  std::size_t const B     = std::size_t(step_config().max_batch);
  std::vector<std::int32_t> ring_index = download(gpu.batch_ref().requests, B);
  ring_index[0]                        = -1;
  device_vector<std::int32_t> d_ring_index(ring_index);
  verified_step v = t.device_step(d, true);
  v.ring_index    = d_ring_index.data();
  v.ring_status   = gpu.status();  // one word for the hierarchy and the ring
  gpu.commit_verified(v, stream.s);
  t.ref_commit(d, false);

  std::uint32_t const bits = gpu.status_sync(stream.s);
  REQUIRE((bits & status_mask_hierarchy) == ref.status());
  REQUIRE((ref.status() & status_invalid_accept_count) != 0);
  REQUIRE((bits & status_mask_draft_ring) == draft_ring_status::bad_request);
  REQUIRE((bits & ~(status_mask_hierarchy | status_mask_draft_ring)) == 0u);
  std::string const text = describe_status(bits);
  CHECK(text.find("invalid_accept_count") != std::string::npos);
  CHECK(text.find("draft_ring.bad_request") != std::string::npos);
  // Per entry, commit_status holds the hierarchy's bits only.
  REQUIRE(download(gpu.commit_status(), B) == std::vector<std::uint32_t>(ref.commit_status(), ref.commit_status() + B));
  REQUIRE((ref.commit_status()[0] & status_invalid_accept_count) != 0);
}
