/**
 * @file examples/common/speculative_loop.hpp
 * @brief Greedy speculative decoding of `tiny_model` over a KV hierarchy, one loop for both
 *        backends: `decoder<Ops>` does what an engine's step loop does, `Ops` hides where
 *        memory lives (`host_ops` here: the host reference; `gpu_ops` in
 *        speculative_gpu.cuh: the CUDA hierarchy).
 *
 * One speculative step of a batch:
 * ```
 * drafter stand-in        per request d_b ≤ max_drafts draft tokens (a chain or a tree);
 *                         its own rows go to a draft ring (root row, then one per node)
 * set_batch + set_drafts  Q_b = 1 + d_b queries, the tree's parent links, positions
 * per layer group:        selections (indexer) → resolve + retrieve → the model writes the
 *                         Q_b tail rows → sparse attention per layer → logits
 * verify (greedy)         target's argmax per node against the drafts
 * commit_verified         the accepted path becomes committed (tree nodes compacted onto
 *                         positions), the rest recycled, the ring keeps the same path
 * backup
 * ```
 * Plain decoding is the same step with no drafts and `commit`.
 *
 * Tail rows are addressed in selections by their query index (length + j): a query at
 * depth t of the tree selects the rows of its own path (its ancestors, then itself), which
 * the indexer names by position (length + depth) and the loop translates to node indices.
 */
#pragma once

#include "tiny_model.hpp"

#include <dhisparse/status.hpp>
#include <dhisparse/verified_step.hpp>
#include <dhisparse/verify_params.hpp>
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/host/sparse_attention.hpp>
#include <dhisparse/host/verify.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace examples {

/// The drafter stand-in's settings.
struct speculation {
  speculation() = default;
  speculation(int max_drafts_, bool tree_, double accuracy_) : max_drafts{max_drafts_}, tree{tree_}, accuracy{accuracy_}
  {
  }

  int max_drafts  = 4;     ///< drafts (chain) or draft nodes (tree) per request and step, at most
  bool tree       = false;
  double accuracy = 0.7;   ///< chance that a draft on the target's path carries the target's token
  /// Optional: the drafts of a request in this step (e.g. from a speculation-length
  /// controller), at most `max_drafts`; default: uniform in [0, max_drafts].
  std::function<int(std::uint64_t)> drafts;
  /// Optional: a request's own drafter accuracy; default: `accuracy`.
  std::function<double(std::uint64_t)> accuracy_of;
};

/// One request's part of the last speculative step.
struct step_outcome {
  int drafted = 0, accepted = 0, committed = 0;
};

/// What a run of steps did (sums over steps and requests).
struct decode_stats {
  long steps = 0, queries = 0, tokens = 0, drafted = 0, accepted = 0, cut = 0;
  unsigned long long fetched = 0, selected = 0, evicted = 0, reclaimed = 0;
};

/// The drafter's own row for a token at a position (16 bytes, the draft ring's rows).
struct ring_tag {
  std::int32_t token, position, request, magic;
  static constexpr std::int32_t expected_magic = 0x5EC0DE;
};
static_assert(sizeof(ring_tag) == 16);

/// What `Ops::verify_and_commit` returns (host copies, [max_batch] and [max_batch][…]).
struct verify_outputs {
  std::vector<std::int32_t> accepted, accepted_nodes, emitted, next_token, committed;
  std::vector<std::uint32_t> commit_status;
};

/// A draft ring's metadata and rows as the loop reads them (host copies).
struct ring_snapshot {
  std::vector<std::int64_t> end;
  std::vector<std::int32_t> length;
  std::vector<std::byte> rows;  ///< [capacity][window][16]
  int window = 1;
  [[nodiscard]] ring_tag row(int request, std::int64_t position) const
  {
    ring_tag t;
    std::memcpy(&t, rows.data() + (std::size_t(request) * window + std::size_t(position % window)) * sizeof t, sizeof t);
    return t;
  }
};

/**
 * @brief The step loop of an engine, over backend `Ops` (see `host_ops` for its calls).
 *        Requests are admitted with a prompt; `tokens(id)` is the prompt followed by every
 *        token decoded, and invariantly holds committed length + 1 tokens (the last one is
 *        the next step's root, whose row the next step writes).
 */
template <class Ops>
class decoder {
 public:
  /// Target's greedy token at a position of a request (the drafter stand-in peeks at it).
  using oracle = std::function<std::int32_t(std::uint64_t, std::int32_t)>;

  decoder(Ops& ops, tiny_model const& model, int top_k) : ops_{ops}, model_{model}, top_k_{top_k} {}

  /// Admits a request with `prompt` (≥ 2 tokens): rows of all but the last prompt token are
  /// written into the host store, the last one is the first step's root.
  void admit(std::uint64_t id, std::vector<std::int32_t> const& prompt)
  {
    auto const& c            = ops_.config();
    std::int32_t const len   = std::int32_t(prompt.size()) - 1;
    std::int64_t const cap   = std::int64_t(len) + 4 * c.max_queries;
    ops_.admit(id, len, cap);
    for (std::int32_t p = 0; p < len; ++p) {
      for (int g = 0; g < c.num_groups(); ++g) {
        for (int l = 0; l < c.group_layers[std::size_t(g)]; ++l) {
          model_.write_row(model_.layer(g, l), prompt[std::size_t(p)], p, ops_.host_row(id, g, l, p));
        }
      }
    }
    requests_[id] = request{prompt, len, cap};
  }

  /// Ends a request (after a step: it is not part of an open step).
  void release(std::uint64_t id)
  {
    ops_.release(id);
    requests_.erase(id);
  }

  [[nodiscard]] std::vector<std::int32_t> const& tokens(std::uint64_t id) const { return requests_.at(id).tokens; }
  [[nodiscard]] std::int32_t length(std::uint64_t id) const { return requests_.at(id).length; }
  [[nodiscard]] decode_stats const& stats() const noexcept { return stats_; }
  /// Per request of the last speculative step: drafts verified, accepted, rows committed.
  [[nodiscard]] std::map<std::uint64_t, step_outcome> const& last_step() const noexcept { return last_; }
  /// Per (request, position): a digest of the attention outputs of every layer of the
  /// committed query at that position (so two runs can be compared bit for bit).
  [[nodiscard]] std::map<std::pair<std::uint64_t, std::int32_t>, std::uint64_t> const& digests() const noexcept
  {
    return digests_;
  }

  /// One plain decoding step of `ids`: one query each, one new token each.
  void step_plain(std::vector<std::uint64_t> const& ids)
  {
    std::vector<entry> batch;
    for (auto id : ids) { batch.push_back(root_entry(id)); }
    forward(batch, false);
    ops_.commit_plain();
    std::vector<std::int32_t> const committed = ops_.committed_rows();
    for (std::size_t b = 0; b < batch.size(); ++b) {
      request& rq = requests_.at(batch[b].id);
      if (committed[b] != 1) {
        ++stats_.cut;
        continue;
      }
      digests_[{batch[b].id, rq.length}] = batch[b].digest[0];
      rq.tokens.push_back(batch[b].target[0]);
      ++rq.length;
      ++stats_.tokens;
    }
    ops_.backup();
    ++stats_.steps;
  }

  /**
   * @brief One speculative step of `ids`: the drafter stand-in drafts d_b ≤ max_drafts
   *        tokens per request (chains, or random trees), each agreeing with `target` with
   *        probability `s.accuracy` while on the target's path; greedy verification; the
   *        verified commit; the draft ring checked against the committed tokens.
   */
  void step_speculative(std::vector<std::uint64_t> const& ids, speculation const& s, oracle const& target,
                        std::mt19937_64& rng)
  {
    auto const& c = ops_.config();
    int const Q   = c.max_queries;
    std::vector<entry> batch;
    last_.clear();
    std::vector<std::int32_t> ring_counts(std::size_t(c.max_requests), 0);
    std::vector<ring_tag> ring_rows(std::size_t(c.max_requests) * Q, ring_tag{});
    for (auto id : ids) {
      entry e = root_entry(id);
      draft(e, std::min(s.max_drafts, Q - 1), s, target, rng);
      // The drafter's rows: the root's, then one per draft node (node order).
      int const r = ops_.request_index(id);
      ring_counts[std::size_t(r)] = e.nodes();
      for (int m = 0; m < e.nodes(); ++m) {
        ring_rows[std::size_t(r) * Q + m] = {e.token[m], e.length + e.depth[m], std::int32_t(id), ring_tag::expected_magic};
      }
      batch.push_back(std::move(e));
    }
    ops_.ring_append(ring_counts, ring_rows);
    forward(batch, true);

    // Greedy verification from the target's argmax per node, then the verified commit.
    int const B = c.max_batch, d = Q - 1;
    std::vector<std::int32_t> num(B, 0), drafts(std::size_t(B) * (s.tree ? d + 1 : d), 0),
      first_child(std::size_t(B) * (d + 1), -1), next_sibling(std::size_t(B) * (d + 1), -1),
      targets(std::size_t(B) * (d + 1), 0);
    for (std::size_t b = 0; b < batch.size(); ++b) {
      entry const& e = batch[b];
      num[b]         = e.nodes() - 1;
      for (int m = 0; m < e.nodes(); ++m) {
        targets[b * (d + 1) + std::size_t(m)] = e.target[std::size_t(m)];
        if (m == 0) { continue; }
        drafts[b * (s.tree ? d + 1 : d) + std::size_t(s.tree ? m : m - 1)] = e.token[std::size_t(m)];
        std::int32_t const p = e.parent[std::size_t(m)];
        std::int32_t* link   = &first_child[b * (d + 1) + std::size_t(p)];
        while (*link != -1) { link = &next_sibling[b * (d + 1) + std::size_t(*link)]; }
        *link = m;  // children in index order
      }
    }
    dhisparse::verify_params v;
    v.rule          = dhisparse::verify_rule::greedy;
    v.topology      = s.tree ? dhisparse::draft_topology::tree : dhisparse::draft_topology::chain;
    v.capacity      = B;
    v.max_drafts    = d;
    v.vocab         = model_.vocab();
    v.num_drafts    = num.data();
    v.draft_tokens  = drafts.data();
    v.first_child   = s.tree ? first_child.data() : nullptr;
    v.next_sibling  = s.tree ? next_sibling.data() : nullptr;
    v.target_tokens = targets.data();
    verify_outputs out = ops_.verify_and_commit(v, std::int32_t(batch.size()));

    for (std::size_t b = 0; b < batch.size(); ++b) {
      entry const& e = batch[b];
      request& rq    = requests_.at(e.id);
      int const kept = out.committed[b];
      stats_.drafted += e.nodes() - 1;
      stats_.accepted += out.accepted[b];
      last_[e.id] = {e.nodes() - 1, out.accepted[b], kept};
      if (kept < out.accepted[b] + 1) { ++stats_.cut; }
      for (int k = 0; k < kept; ++k) {
        int const node = k == 0 ? 0 : out.accepted_nodes[b * std::size_t(d) + std::size_t(k - 1)];
        digests_[{e.id, rq.length + k}] = e.digest[std::size_t(node)];
        rq.tokens.push_back(out.emitted[b * std::size_t(d + 1) + std::size_t(k)]);
      }
      rq.length += kept;
      stats_.tokens += kept;
      if (kept == 0) { ops_.ring_rollback(ops_.request_index(e.id), 1); }  // the root's row
      if (kept > 0 && out.next_token[b] != rq.tokens.back()) { throw_error("next_token is not the last new token"); }
    }
    ops_.backup();
    ++stats_.steps;
    check_ring();
  }

  /// Checks that the draft ring holds, for every position it holds, the row the drafter
  /// wrote for the token now committed there (the root row of the last step at the end).
  void check_ring() const
  {
    auto const ring = ops_.ring_view();
    for (auto const& [id, rq] : requests_) {
      int const r = ops_.request_index(id);
      std::int64_t const end = ring.end[std::size_t(r)];
      if (end != rq.length) { throw_error("draft ring of request " + std::to_string(id) + " ends at " + std::to_string(end) + ", length " + std::to_string(rq.length)); }
      for (std::int64_t x = end - ring.length[std::size_t(r)]; x < end; ++x) {
        ring_tag const t = ring.row(r, x);
        if (t.magic != ring_tag::expected_magic || t.position != x || t.request != std::int32_t(id) ||
            t.token != rq.tokens[std::size_t(x)]) {
          throw_error("draft ring of request " + std::to_string(id) + " holds a wrong row at position " +
                      std::to_string(x));
        }
      }
    }
  }

 private:
  struct request {
    std::vector<std::int32_t> tokens;
    std::int32_t length;
    std::int64_t capacity;
  };

  /// One batch entry of a step: the root (node 0) and the draft nodes 1 … n.
  struct entry {
    std::uint64_t id;
    std::int32_t length;
    std::vector<std::int32_t> token, parent, depth, target;
    std::vector<std::uint64_t> digest;
    int nodes() const { return int(token.size()); }
    /// The ancestor of node m at depth t ≤ depth[m].
    std::int32_t ancestor(std::int32_t m, std::int32_t t) const
    {
      while (depth[std::size_t(m)] > t) { m = parent[std::size_t(m)]; }
      return m;
    }
  };

  [[noreturn]] static void throw_error(std::string const& what) { throw dhisparse::error("speculative loop: " + what); }

  entry root_entry(std::uint64_t id)
  {
    request& rq = requests_.at(id);
    int const Q = ops_.config().max_queries;
    if (std::int64_t(rq.length) + Q > rq.capacity) {
      rq.capacity = std::int64_t(rq.length) + 4 * Q;
      ops_.reserve(id, rq.capacity);
    }
    entry e;
    e.id     = id;
    e.length = rq.length;
    e.token  = {rq.tokens.back()};
    e.parent = {-1};
    e.depth  = {0};
    return e;
  }

  /// The drafter stand-in: up to `max_drafts` nodes; a chain, or a random tree whose node m
  /// hangs below one of the three nodes before it.
  void draft(entry& e, int max_drafts, speculation const& s, oracle const& target, std::mt19937_64& rng)
  {
    int const n = s.drafts ? std::clamp(s.drafts(e.id), 0, max_drafts) : int(rng() % std::uint64_t(max_drafts + 1));
    double const accuracy = s.accuracy_of ? s.accuracy_of(e.id) : s.accuracy;
    std::vector<bool> on_path = {true}, correct_child = {false};
    std::uniform_real_distribution<double> chance(0.0, 1.0);
    for (int m = 1; m <= n; ++m) {
      std::int32_t const p = s.tree ? std::int32_t(m - 1 - int(rng() % std::uint64_t(std::min(m, 3)))) : m - 1;
      std::int32_t const depth = e.depth[std::size_t(p)] + 1;
      std::int32_t const truth = on_path[std::size_t(p)] ? target(e.id, e.length + depth) : -1;
      bool const right = on_path[std::size_t(p)] && !correct_child[std::size_t(p)] && chance(rng) < accuracy;
      std::int32_t token = right ? truth : std::int32_t(rng() % std::uint64_t(model_.vocab()));
      if (!right && token == truth) { token = (token + 1) % model_.vocab(); }
      if (right) { correct_child[std::size_t(p)] = true; }
      e.token.push_back(token);
      e.parent.push_back(p);
      e.depth.push_back(depth);
      on_path.push_back(right);
      correct_child.push_back(false);
    }
  }

  /// The batch's forward pass over the hierarchy: per group, selections, resolve and
  /// retrieve, tail rows, attention per layer; then every node's target token.
  void forward(std::vector<entry>& batch, bool speculative)
  {
    auto const& c = ops_.config();
    int const B = c.max_batch, Q = c.max_queries, K = top_k_, V = model_.vocab();
    std::vector<dhisparse::request_id> ids;
    std::vector<std::int32_t> queries, num_drafts(std::size_t(B), 0), parents(std::size_t(B) * Q, -1);
    for (std::size_t b = 0; b < batch.size(); ++b) {
      ids.push_back(dhisparse::request_id{batch[b].id});
      queries.push_back(speculative ? 1 : batch[b].nodes());
      num_drafts[b] = batch[b].nodes() - 1;
      for (int m = 0; m < batch[b].nodes(); ++m) { parents[b * Q + std::size_t(m)] = batch[b].parent[std::size_t(m)]; }
    }
    ops_.set_batch(ids.data(), queries.data(), int(batch.size()));
    if (speculative) { ops_.set_drafts(num_drafts.data(), parents.data()); }

    std::vector<double> logits(batch.size() * Q * std::size_t(V), 0.0);
    for (auto& e : batch) { e.digest.assign(std::size_t(e.nodes()), 0); }
    std::vector<std::int32_t> chosen;
    for (int g = 0; g < c.num_groups(); ++g) {
      std::vector<std::int32_t> sel(std::size_t(B) * Q * K, -1);
      for (std::size_t b = 0; b < batch.size(); ++b) {
        entry const& e = batch[b];
        for (int m = 0; m < e.nodes(); ++m) {
          model_.select(g, e.length + e.depth[std::size_t(m)], K, chosen);
          std::int32_t* out = sel.data() + (b * Q + std::size_t(m)) * K;
          for (std::size_t k = 0; k < chosen.size(); ++k) {
            std::int32_t const x = chosen[k];  // a tail position names its node on m's path
            out[k] = x < e.length ? x : e.length + e.ancestor(m, x - e.length);
          }
        }
      }
      ops_.resolve(g, sel.data(), K);
      int const layers = c.group_layers[std::size_t(g)];
      std::size_t const group_row = std::size_t(layers) * tiny_model::row::bytes;
      std::vector<std::byte> rows(std::size_t(B) * Q * group_row);
      for (std::size_t b = 0; b < batch.size(); ++b) {
        entry const& e = batch[b];
        for (int m = 0; m < e.nodes(); ++m) {
          for (int l = 0; l < layers; ++l) {
            model_.write_row(model_.layer(g, l), e.token[std::size_t(m)], e.length + e.depth[std::size_t(m)],
                             rows.data() + (b * Q + std::size_t(m)) * group_row + std::size_t(l) * tiny_model::row::bytes);
          }
        }
      }
      ops_.write_tails(g, rows.data());
      std::size_t const width = std::size_t(tiny_model::heads) * tiny_model::dim;
      std::vector<dhisparse::bf16> q(std::size_t(B) * Q * width, dhisparse::bf16{0}), o(q.size());
      for (int l = 0; l < layers; ++l) {
        int const layer = model_.layer(g, l);
        for (std::size_t b = 0; b < batch.size(); ++b) {
          entry const& e = batch[b];
          for (int m = 0; m < e.nodes(); ++m) {
            model_.write_query(layer, e.token[std::size_t(m)], e.length + e.depth[std::size_t(m)],
                               q.data() + (b * Q + std::size_t(m)) * width);
          }
        }
        ops_.attention(g, l, q.data(), o.data(), K);
        for (std::size_t b = 0; b < batch.size(); ++b) {
          entry& e = batch[b];
          for (int m = 0; m < e.nodes(); ++m) {
            dhisparse::bf16 const* out = o.data() + (b * Q + std::size_t(m)) * width;
            model_.add_logits(layer, out, logits.data() + (b * Q + std::size_t(m)) * V);
            std::uint64_t h = e.digest[std::size_t(m)] ^ std::uint64_t(layer + 1);
            for (std::size_t i = 0; i < width; ++i) { h = tiny_model::mix(h ^ out[i].bits); }
            e.digest[std::size_t(m)] = h;
          }
        }
      }
    }
    for (std::size_t b = 0; b < batch.size(); ++b) {
      entry& e = batch[b];
      e.target.resize(std::size_t(e.nodes()));
      for (int m = 0; m < e.nodes(); ++m) {
        e.target[std::size_t(m)] = model_.argmax(logits.data() + (b * Q + std::size_t(m)) * V);
      }
    }
    stats_.queries += std::accumulate(batch.begin(), batch.end(), 0L, [](long n, entry const& e) { return n + e.nodes(); });
    auto const counters = ops_.counters();
    stats_.selected     = counters.selected_rows;
    stats_.fetched      = counters.fetched_rows;
    stats_.evicted      = counters.evicted_rows;
    stats_.reclaimed    = counters.reclaimed_rows;
  }

  Ops& ops_;
  tiny_model const& model_;
  int top_k_;
  std::map<std::uint64_t, request> requests_;
  std::map<std::pair<std::uint64_t, std::int32_t>, std::uint64_t> digests_;
  decode_stats stats_;
  std::map<std::uint64_t, step_outcome> last_;
};

/// Sum of every group's counters.
template <class Counters>
dhisparse::group_counters add_counters(std::vector<Counters> const& groups)
{
  dhisparse::group_counters sum{};
  for (auto const& c : groups) {
    sum.selected_rows += c.selected_rows;
    sum.fetched_rows += c.fetched_rows;
    sum.evicted_rows += c.evicted_rows;
    sum.reclaimed_rows += c.reclaimed_rows;
  }
  return sum;
}

/**
 * @brief The host reference backend of `decoder`: `host::kv_hierarchy`, host sparse
 *        attention, host verification, a host draft ring (one ring slot per request index,
 *        window `ring_window`).
 */
template <class Hierarchy>
class host_ops {
 public:
  static constexpr char const* name = "host reference backend";

  host_ops(dhisparse::hierarchy_config const& c, int ring_window)
    : h_{c}, ring_{c.max_requests, ring_window, 1, sizeof(ring_tag)}
  {
  }

  Hierarchy& hierarchy() { return h_; }
  [[nodiscard]] dhisparse::hierarchy_config const& config() const { return h_.config(); }
  [[nodiscard]] int request_index(std::uint64_t id) const { return h_.request_index(dhisparse::request_id{id}); }

  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    h_.admit(dhisparse::request_id{id}, length, capacity);
    std::int32_t const r     = request_index(id);
    std::int64_t const start = length;
    ring_.reset(&r, &start, 1);
  }
  void reserve(std::uint64_t id, std::int64_t capacity) { h_.reserve(dhisparse::request_id{id}, capacity); }
  void release(std::uint64_t id) { h_.release(dhisparse::request_id{id}); }
  std::byte* host_row(std::uint64_t id, int g, int l, std::int64_t p)
  {
    return h_.host_row(dhisparse::request_id{id}, g, l, p);
  }
  void set_batch(dhisparse::request_id const* ids, std::int32_t const* queries, int n)
  {
    h_.set_batch(ids, queries, n);
    entries_ = n;
    ring_index_.assign(std::size_t(config().max_batch), 0);
    for (int b = 0; b < n; ++b) { ring_index_[std::size_t(b)] = h_.request_index(ids[b]); }
  }
  void set_drafts(std::int32_t const* num_drafts, std::int32_t const* parents) { h_.set_drafts(num_drafts, parents); }
  void resolve(int g, std::int32_t const* selections, int top_k)
  {
    h_.resolve(g, selections, top_k);
    h_.retrieve(g);
  }
  void write_tails(int g, std::byte const* rows)
  {
    auto const view = h_.layer_rows(g, 0);
    int const n     = config().max_batch * config().max_queries;
    for (int i = 0; i < n; ++i) {
      std::int32_t const slot = h_.tail_slots(g)[i];
      if (slot >= 0) { std::memcpy(view.rows + std::size_t(slot) * view.stride, rows + std::size_t(i) * view.stride, view.stride); }
    }
  }
  void attention(int g, int l, dhisparse::bf16 const* queries, dhisparse::bf16* out, int top_k)
  {
    using row = tiny_model::row;
    namespace sa = dhisparse::sparse_attention;
    auto const view = h_.layer_rows(g, l);
    sa::params p;
    p.batch       = config().max_batch;
    p.num_queries = config().max_queries;
    p.num_heads   = tiny_model::heads;
    p.top_k       = top_k;
    sa::set_contiguous_strides<row>(p);
    p.queries       = queries;
    p.rows          = view.rows;
    p.row_stride    = view.stride;
    p.num_slots     = config().device_slots_per_group;
    p.slots         = h_.slot_table(g);
    p.batch_size    = &entries_;
    p.out           = out;
    p.softmax_scale = tiny_model::softmax_scale();
    p.status        = &attention_status_;
    dhisparse::host::sparse_attention<row>(p);
  }
  void commit_plain() { h_.commit(nullptr); }
  [[nodiscard]] std::vector<std::int32_t> committed_rows() const
  {
    return {h_.committed_rows(), h_.committed_rows() + config().max_batch};
  }

  /// Greedy verification (host), then the verified commit with the draft ring.
  verify_outputs verify_and_commit(dhisparse::verify_params v, std::int32_t batch)
  {
    int const B = config().max_batch, d = v.max_drafts;
    verify_outputs out;
    out.accepted.assign(std::size_t(B), 0);
    out.accepted_nodes.assign(std::size_t(B) * d, -1);
    out.emitted.assign(std::size_t(B) * (d + 1), -1);
    out.next_token.assign(std::size_t(B), -1);
    std::vector<std::uint32_t> request_status(std::size_t(B), 0);
    std::uint32_t status = 0;
    v.batch_size     = &batch;
    v.accepted       = out.accepted.data();
    v.accepted_nodes = out.accepted_nodes.data();
    v.emitted        = out.emitted.data();
    v.next_token     = out.next_token.data();
    v.status         = &status;
    v.request_status = request_status.data();
    dhisparse::host::verify(v, dhisparse::host::on_invalid_input::flag);
    if (status != 0) { throw dhisparse::error("verify: " + dhisparse::describe_status(status, dhisparse::status_format::explained)); }
    dhisparse::verified_step s = dhisparse::verified_step::from(v);
    s.ring        = ring_.ref();
    s.ring_index  = ring_index_.data();
    s.ring_status = ring_.status_word();
    h_.commit_verified(s);
    if (ring_.status() != 0) { throw dhisparse::error("draft ring: " + dhisparse::describe_status(ring_.status(), dhisparse::status_format::explained)); }
    out.committed.assign(h_.committed_rows(), h_.committed_rows() + B);
    out.commit_status.assign(h_.commit_status(), h_.commit_status() + B);
    return out;
  }

  void ring_append(std::vector<std::int32_t> const& counts, std::vector<ring_tag> const& rows)
  {
    dhisparse::draft_ring_rows staged;
    staged.rows = reinterpret_cast<std::byte const*>(rows.data());
    ring_.append(staged, counts.data(), config().max_queries, nullptr);
  }
  /// Drops the newest `count` rows of ring request `request`.
  void ring_rollback(int request, std::int32_t count)
  {
    std::vector<std::int32_t> drafted(std::size_t(config().max_requests), 0);
    drafted[std::size_t(request)] = count;
    ring_.rollback(drafted.data(), nullptr, nullptr);
  }
  [[nodiscard]] ring_snapshot ring_view() const
  {
    auto const& r = ring_.ref();
    return {ring_.end(), ring_.length(), ring_.rows(), r.window};
  }

  void backup() { h_.backup(); }
  [[nodiscard]] dhisparse::group_counters counters() const
  {
    std::vector<dhisparse::group_counters> groups;
    for (int g = 0; g < config().num_groups(); ++g) { groups.push_back(h_.counters(g)); }
    return add_counters(groups);
  }
  [[nodiscard]] std::uint32_t status() const { return h_.status() | attention_status_; }

 private:
  Hierarchy h_;
  dhisparse::host::draft_ring ring_;
  std::int32_t entries_ = 0;
  std::vector<std::int32_t> ring_index_;  // [max_batch] request index of each entry
  std::uint32_t attention_status_ = 0;
};

}  // namespace examples
