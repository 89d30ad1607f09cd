/**
 * @file host/verify.hpp
 * @brief Reference backend of speculative verification (plain C++, no CUDA needed).
 *
 * The oracle the CUDA kernels are tested against, and a CPU fallback. For the same
 * `verify_params` contents (host pointers instead of device pointers) and the same
 * {seed, offset}, `host::verify` and `dhisparse::verify_async` produce identical outputs
 * and the same `bytes_read`: both draw the same Philox numbers and do the same exact
 * integer arithmetic (detail/verify/fixed_point.hpp). docs/verify.md states the rules.
 */
#pragma once

#include <dhisparse/detail/philox.hpp>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/verify_params.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace dhisparse::host {

/// What `host::verify` does with a request whose inputs are invalid.
enum class on_invalid_input {
  throw_error,  ///< throw `dhisparse::error` naming the argument, before writing any output
  flag,         ///< behave like the kernel: empty outputs for that request, status bits set
};

namespace detail {

namespace dv = ::dhisparse::detail::verify;

/// One request's view of a `verify_params` (host pointers).
class verify_request {
 public:
  verify_request(verify_params const& a, int b) : a_{a}, l_{dv::layout::of(a)}, b_{b} {}

  int request() const { return b_; }
  bool tree() const { return a_.topology == draft_topology::tree; }

  /// Nodes to verify (num_drafts[b], or max_drafts).
  int drafts() const { return a_.num_drafts ? a_.num_drafts[b_] : a_.max_drafts; }

  /// Token of draft node m ≥ 1.
  std::int32_t token(int m) const
  {
    return tree() ? a_.draft_tokens[std::int64_t(b_) * l_.row_tokens + m]
                  : a_.draft_tokens[std::int64_t(b_) * l_.row_tokens + m - 1];
  }
  float const* p_row(int m) const { return a_.p + b_ * l_.p_request + m * l_.p_row; }
  float const* q_row(int m) const { return a_.q + b_ * l_.q_request + m * l_.q_row; }
  std::int32_t const* candidate_ids(int m) const
  {
    return a_.candidate_ids + (b_ * l_.rows_q + m) * std::int64_t(a_.num_candidates);
  }
  float const* candidate_probs(int m) const
  {
    return a_.candidate_probs + (b_ * l_.rows_q + m) * std::int64_t(a_.num_candidates);
  }
  std::int32_t target_token(int m) const
  {
    return a_.target_tokens[std::int64_t(b_) * (a_.max_drafts + 1) + m];
  }

  /// Link `v` of node m with n nodes in play: -1 for none (or a pruned node > n).
  static int link(std::int32_t v, int n) { return v > n ? -1 : v; }

  /// Children of node m in sibling order (the tree must be valid).
  std::vector<int> children(int m, int n) const
  {
    std::vector<int> out;
    if (!tree()) {
      if (m < n) { out.push_back(m + 1); }
      return out;
    }
    std::int64_t const base = std::int64_t(b_) * (a_.max_drafts + 1);
    for (int c = link(a_.first_child[base + m], n); c != -1; c = link(a_.next_sibling[base + c], n)) {
      out.push_back(c);
    }
    return out;
  }

  /// Parent of every node 0..n (root: -1), for a valid tree.
  std::vector<int> parents(int n) const
  {
    std::vector<int> parent(n + 1, -1);
    for (int m = 0; m <= n; ++m) {
      for (int c : children(m, n)) { parent[c] = m; }
    }
    return parent;
  }

  /// Full validation of this request: the status bits the kernel raises with
  /// `validate_all` (a superset of what it raises without).
  std::uint32_t validate() const
  {
    int const n = drafts();
    int const d = a_.max_drafts;
    int const V = a_.vocab;
    if (n < 0 || n > d) { return verify_status::bad_num_drafts; }
    std::uint32_t bits = 0;
    if (tree()) {
      std::int64_t const base = std::int64_t(b_) * (d + 1);
      std::vector<int> refs(n + 1, 0);
      for (int m = 0; m <= n; ++m) {
        std::int32_t const links[2] = {a_.first_child[base + m], m > 0 ? a_.next_sibling[base + m] : -1};
        for (std::int32_t v : links) {
          if (v != -1 && (v <= m || v > d)) {
            bits |= verify_status::bad_tree;
          } else if (v != -1 && v <= n) {
            ++refs[v];
          }
        }
      }
      for (int m = 1; m <= n; ++m) {
        if (refs[m] != 1) { bits |= verify_status::bad_tree; }
      }
      if (bits) { return bits; }
    }
    for (int m = 1; m <= n; ++m) {
      if (token(m) < 0 || token(m) >= V) { bits |= verify_status::bad_draft_token; }
    }
    if (a_.rule == verify_rule::greedy) {
      for (int m = 0; m <= n; ++m) {
        if (a_.target_tokens) {
          if (target_token(m) < 0 || target_token(m) >= V) { bits |= verify_status::bad_target_token; }
        } else {
          for (int i = 0; i < V; ++i) {
            if (p_row(m)[i] != p_row(m)[i]) { bits |= verify_status::p_not_finite; }
          }
        }
      }
      return bits;
    }
    for (int m = 0; m <= n; ++m) { bits |= check_row(p_row(m), false); }
    std::vector<int> const parent = parents(n);
    for (int m = 0; m <= n; ++m) {
      if (children(m, n).empty()) { continue; }
      if (a_.distribution == draft_distribution::dense) {
        bits |= check_row(q_row(m), true);
      } else if (a_.distribution == draft_distribution::candidates) {
        bits |= check_candidates(m);
      }
    }
    if (a_.distribution != draft_distribution::one_hot) {
      for (int m = 1; m <= n; ++m) {
        std::int32_t const x = token(m);
        if (x < 0 || x >= V) { continue; }
        if (draft_q(parent[m], x) == 0) { bits |= verify_status::draft_not_in_q; }
      }
    }
    return bits;
  }

  /// Bytes the kernel reads for `validate_all` (counted in `bytes_read`).
  std::uint64_t validate_all_bytes() const
  {
    int const n             = drafts();
    std::uint64_t const row = 4ull * std::uint64_t(a_.vocab);
    if (a_.rule == verify_rule::greedy) { return a_.target_tokens ? 0 : std::uint64_t(n + 1) * row; }
    std::uint64_t bytes = std::uint64_t(n + 1) * row;
    for (int m = 0; m <= n; ++m) {
      if (children(m, n).empty()) { continue; }
      if (a_.distribution == draft_distribution::dense) { bytes += row; }
      if (a_.distribution == draft_distribution::candidates) { bytes += 8ull * std::uint64_t(a_.num_candidates); }
    }
    return bytes;
  }

  /// Fixed-point q(x) of the distribution node m's children were drawn from.
  std::uint64_t draft_q(int m, std::int32_t x) const
  {
    if (a_.distribution == draft_distribution::dense) { return dv::to_fixed(q_row(m)[x]); }
    if (a_.distribution == draft_distribution::candidates) {
      for (int j = 0; j < a_.num_candidates; ++j) {
        if (candidate_ids(m)[j] == x) { return dv::to_fixed(candidate_probs(m)[j]); }
      }
      return 0;
    }
    return dv::fixed_one;
  }

 private:
  std::uint32_t check_row(float const* row, bool is_q) const
  {
    std::uint32_t bits  = 0;
    std::uint64_t mass  = 0;
    for (int i = 0; i < a_.vocab; ++i) {
      bits |= dv::probability_flags(row[i], is_q);
      mass = dv::sat_add(mass, dv::to_fixed(row[i]));
    }
    if (!dv::mass_is_one(mass, a_.sum_tolerance)) {
      bits |= is_q ? verify_status::q_not_normalized : verify_status::p_not_normalized;
    }
    return bits;
  }

  std::uint32_t check_candidates(int m) const
  {
    std::uint32_t bits = 0;
    std::uint64_t mass = 0;
    std::int32_t const* ids = candidate_ids(m);
    float const* probs      = candidate_probs(m);
    for (int j = 0; j < a_.num_candidates; ++j) {
      if (ids[j] == -1) { continue; }
      if (ids[j] < 0 || ids[j] >= a_.vocab) {
        bits |= verify_status::bad_candidates;
        continue;
      }
      for (int k = 0; k < j; ++k) {
        if (ids[k] == ids[j]) { bits |= verify_status::bad_candidates; }
      }
      bits |= dv::probability_flags(probs[j], true);
      mass = dv::sat_add(mass, dv::to_fixed(probs[j]));
    }
    if (!dv::mass_is_one(mass, a_.sum_tolerance)) { bits |= verify_status::q_not_normalized; }
    return bits;
  }

  verify_params const& a_;
  dv::layout l_;
  int b_;
};

/// Outputs of one request.
struct verify_result {
  std::vector<std::int32_t> tokens;  ///< accepted drafts then the target's token
  std::vector<std::int32_t> nodes;   ///< node index of each accepted draft
  std::uint64_t bytes = 0;           ///< bytes read in full passes (see verify_params::bytes_read)
  std::uint32_t status = 0;          ///< bits raised while walking (degenerate distributions)
};

/// The walk: the rules themselves, for one validated request.
class verify_walker {
 public:
  verify_walker(verify_params const& a, int b, std::uint64_t seed, std::uint64_t offset)
    : a_{a}, r_{a, b}, b_{b}, seed_{seed}, offset_{offset}, chunk_{dv::chunk_length(a.vocab)}
  {
  }

  verify_result run()
  {
    verify_result out;
    int const n         = r_.drafts();
    int cur             = 0;
    std::uint32_t event = 0;
    bool const one_hot  = a_.distribution == draft_distribution::one_hot;
    for (;;) {
      std::vector<int> const kids = r_.children(cur, n);
      if (a_.rule == verify_rule::greedy) {
        std::int32_t const t = a_.target_tokens ? r_.target_token(cur) : argmax(cur, out);
        auto const hit = std::find_if(kids.begin(), kids.end(), [&](int c) { return r_.token(c) == t; });
        out.tokens.push_back(t);
        if (hit == kids.end() || t < 0) { return out; }
        out.nodes.push_back(*hit);
        cur = *hit;
        continue;
      }
      // Sampling: children in sibling order, each tested against what is left of the
      // target distribution after its earlier siblings were rejected.
      std::vector<std::uint64_t> mass{dv::fixed_one};  // S_0 (nominal), S_1, … (passes)
      std::vector<std::int32_t> removed;                // one-hot: rejected tokens
      std::uint64_t onehot_mass = dv::fixed_one;
      int rejected              = 0;
      int accepted              = -1;
      for (int child : kids) {
        std::int32_t const x  = r_.token(child);
        std::uint64_t const P = dv::to_fixed(r_.p_row(cur)[x]);
        std::uint64_t R, D;
        if (one_hot) {
          R = std::find(removed.begin(), removed.end(), x) != removed.end() ? 0 : P;
          D = onehot_mass;
        } else {
          while (int(mass.size()) <= rejected) { mass.push_back(pass(cur, int(mass.size()), removed, mass, out)); }
          std::uint64_t const Q = r_.draft_q(cur, x);
          R = P;
          for (int s = 0; s < rejected; ++s) { R = dv::residual_step(R, mass[s], Q); }
          D = dv::mul_fixed(mass[rejected], Q);
        }
        std::uint64_t const bits = ::dhisparse::detail::philox_u64(seed_, offset_, std::uint32_t(b_), event++);
        if (dv::accepts(R, D, bits)) {
          accepted = child;
          break;
        }
        ++rejected;
        if (one_hot && R > 0) {
          removed.push_back(x);
          onehot_mass = dv::sub_floor0(onehot_mass, R);
        }
      }
      if (accepted >= 0) {
        out.tokens.push_back(r_.token(accepted));
        out.nodes.push_back(accepted);
        cur = accepted;
        continue;
      }
      // Every child rejected (or none): sample from the residual.
      std::uint64_t const bits = ::dhisparse::detail::philox_u64(seed_, offset_, std::uint32_t(b_), event++);
      int k                    = one_hot ? 0 : rejected;
      std::uint64_t total      = pass(cur, k, removed, mass, out);
      if (total == 0 && (k > 0 || !removed.empty())) {
        // Degenerate residual (q covers p up to rounding): sample from p itself.
        k = 0;
        removed.clear();
        total = pass(cur, 0, removed, mass, out);
      }
      if (total == 0) {
        out.status |= verify_status::p_not_normalized;
        out.tokens.push_back(-1);
        return out;
      }
      out.tokens.push_back(locate(cur, k, removed, mass, total, bits, out));
      return out;
    }
  }

 private:
  /// R_k(i): what is left of p at token i after k rejected drafts drawn from q (one-hot:
  /// p with the rejected tokens removed). `mass` holds S_0..S_{k-1}.
  std::uint64_t residual(int row, int k, std::vector<std::int32_t> const& removed,
                         std::vector<std::uint64_t> const& mass, std::int64_t i) const
  {
    std::uint64_t R = dv::to_fixed(r_.p_row(row)[i]);
    if (a_.distribution == draft_distribution::one_hot) {
      return std::find(removed.begin(), removed.end(), std::int32_t(i)) != removed.end() ? 0 : R;
    }
    if (k == 0) { return R; }
    std::uint64_t const Q = r_.draft_q(row, std::int32_t(i));
    for (int s = 0; s < k; ++s) { R = dv::residual_step(R, mass[s], Q); }
    return R;
  }

  /// Total mass of R_k over the vocabulary: one full pass (bytes as the kernel counts them).
  std::uint64_t pass(int row, int k, std::vector<std::int32_t> const& removed,
                     std::vector<std::uint64_t> const& mass, verify_result& out) const
  {
    std::uint64_t total = 0;
    for (std::int64_t i = 0; i < a_.vocab; ++i) {
      total = dv::sat_add(total, residual(row, k, removed, mass, i));
    }
    std::uint64_t bytes = 4ull * std::uint64_t(a_.vocab);
    if (k > 0 && a_.distribution == draft_distribution::dense) { bytes *= 2; }
    if (k > 0 && a_.distribution == draft_distribution::candidates) {
      bytes += 8ull * std::uint64_t(a_.num_candidates);
    }
    out.bytes += bytes;
    return total;
  }

  /// Inverse CDF: the smallest token whose inclusive prefix mass exceeds the target.
  std::int32_t locate(int row, int k, std::vector<std::int32_t> const& removed,
                      std::vector<std::uint64_t> const& mass, std::uint64_t total,
                      std::uint64_t bits, verify_result& out) const
  {
    std::uint64_t const target = dv::sample_target(total, bits);
    std::uint64_t acc          = 0;
    for (std::int64_t i = 0; i < a_.vocab; ++i) {
      acc = dv::sat_add(acc, residual(row, k, removed, mass, i));
      if (acc > target) {
        // The kernel re-reads the chunk holding the token to find it.
        std::int64_t const c0  = i / chunk_ * chunk_;
        std::int64_t const len = std::min<std::int64_t>(chunk_, a_.vocab - c0);
        bool const two_rows    = k > 0 && a_.distribution == draft_distribution::dense;
        out.bytes += std::uint64_t(len) * 4u * (two_rows ? 2u : 1u);
        return std::int32_t(i);
      }
    }
    return -1;  // unreachable for total > 0
  }

  /// Greedy: the largest value, the smallest index among ties; NaN is skipped (flagged).
  std::int32_t argmax(int row, verify_result& out) const
  {
    float best       = -std::numeric_limits<float>::infinity();
    std::int32_t arg = std::numeric_limits<std::int32_t>::max();
    float const* p   = r_.p_row(row);
    for (std::int32_t i = 0; i < a_.vocab; ++i) {
      float const x = p[i];
      if (x != x) {
        out.status |= verify_status::p_not_finite;
        continue;
      }
      if (x > best || (x == best && i < arg)) {
        best = x;
        arg  = i;
      }
    }
    out.bytes += 4ull * std::uint64_t(a_.vocab);
    return arg == std::numeric_limits<std::int32_t>::max() ? -1 : arg;
  }

  verify_params const& a_;
  verify_request r_;
  int b_;
  std::uint64_t seed_, offset_;
  std::int64_t chunk_;
};

}  // namespace detail

/**
 * @brief Full validation of every request of a call (host pointers): the status bits the
 *        kernel raises with `validate_all`, per request (0 for padding requests).
 * @param a the call's arguments; must pass `verify_params_problem`
 */
inline std::vector<std::uint32_t> verify_input_status(verify_params const& a)
{
  DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(a));
  int batch = a.batch_size ? *a.batch_size : a.capacity;
  batch     = std::clamp(batch, 0, a.capacity);
  std::vector<std::uint32_t> status(a.capacity, 0);
  for (int b = 0; b < batch; ++b) { status[b] = detail::verify_request(a, b).validate(); }
  return status;
}

/**
 * @brief Reference speculative verification (host pointers): the same outputs as
 *        `verify_async` for the same inputs and {seed, offset}.
 *
 * @param a the call's arguments, every pointer to host memory (`rng` too)
 * @param mode `throw_error`: throws `dhisparse::error` naming the argument and request
 *        before writing anything when any input is invalid; `flag`: behaves like the
 *        kernel with `validate_all` (empty outputs and status bits for bad requests)
 * @throws dhisparse::error on invalid shapes or pointers (both modes)
 */
inline void verify(verify_params const& a, on_invalid_input mode = on_invalid_input::throw_error)
{
  DHISPARSE_EXPECTS_NO_PROBLEM(verify_params_problem(a));
  int const capacity = a.capacity;
  int batch          = a.batch_size ? *a.batch_size : capacity;
  std::uint32_t all  = 0;
  if (batch < 0 || batch > capacity) {
    DHISPARSE_EXPECTS(mode == on_invalid_input::flag,
                      "verify: batch_size (" + std::to_string(batch) + ") is outside [0, capacity = " +
                        std::to_string(capacity) + "]");
    all |= verify_status::bad_batch_size;
    batch = std::clamp(batch, 0, capacity);
  }
  std::vector<std::uint32_t> status(capacity, 0);
  for (int b = 0; b < batch; ++b) {
    status[b] = detail::verify_request(a, b).validate();
    if (status[b] != 0 && mode == on_invalid_input::throw_error) {
      DHISPARSE_EXPECTS(false, "verify: request " + std::to_string(b) + ": " +
                                 describe_status(status[b], status_format::explained));
    }
  }
  std::uint64_t const seed   = a.rule == verify_rule::sampling ? a.rng[0] : 0;
  std::uint64_t const offset = a.rule == verify_rule::sampling ? a.rng[1] : 0;
  int const width            = a.max_drafts + 1;
  std::uint64_t bytes        = 0;
  for (int b = 0; b < capacity; ++b) {
    detail::verify_result res;
    if (b < batch && status[b] == 0) {
      res = detail::verify_walker(a, b, seed, offset).run();
      status[b] |= res.status;
      if (a.validate_all) { res.bytes += detail::verify_request(a, b).validate_all_bytes(); }
      if (status[b] == 0) { bytes += res.bytes; }
    }
    if (status[b] != 0 || b >= batch) { res = {}; }
    a.accepted[b]   = res.tokens.empty() ? 0 : std::int32_t(res.tokens.size()) - 1;
    a.next_token[b] = res.tokens.empty() ? -1 : res.tokens.back();
    for (int j = 0; j < width; ++j) {
      a.emitted[std::int64_t(b) * width + j] = j < int(res.tokens.size()) ? res.tokens[j] : -1;
    }
    if (a.accepted_nodes) {
      for (int j = 0; j < a.max_drafts; ++j) {
        a.accepted_nodes[std::int64_t(b) * a.max_drafts + j] = j < int(res.nodes.size()) ? res.nodes[j] : -1;
      }
    }
    if (a.request_status) { a.request_status[b] = status[b]; }
    all |= status[b];
  }
  *a.status = all;
  if (a.bytes_read) { *a.bytes_read += bytes; }
}

}  // namespace dhisparse::host
