/**
 * @file verify_step.hpp
 * @brief Random verified steps for the tests of the step contract (set_drafts,
 *        commit_verified): per batch entry a chain or a random draft tree, the accepted
 *        path a verifier would report (sometimes an invalid one), verify's outputs for it,
 *        and what commit_verified must do with them — computed here independently of the
 *        library.
 */
#pragma once

#include <dhisparse/verified_step.hpp>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace dhisparse::test {

/// One step's drafts and verification outcome for a batch (shapes [max_batch][…]).
struct verified_drafts {
  int max_batch = 0, max_queries = 0;
  std::vector<std::int32_t> num_drafts;      ///< [B]
  std::vector<std::int32_t> parents;         ///< [B][Q], -1 for the root and unused
  std::vector<std::int32_t> depth;           ///< [B][Q]
  std::vector<std::int32_t> accepted;        ///< [B] verify's accepted drafts
  std::vector<std::int32_t> accepted_nodes;  ///< [B][Q − 1], -1 after the path
  std::vector<std::int32_t> emitted;         ///< [B][Q]: path tokens, next token, -1
  std::vector<std::int32_t> next_token;      ///< [B]
  std::vector<std::uint32_t> request_status; ///< [B] verify's per-request status
  std::vector<bool> path_valid;              ///< [B] whether the accepted path is a path of the tree
  std::vector<bool> refused;                 ///< [B] verification refused the request

  /// The path (root, accepted nodes) of entry b; an accepted count outside [0, Q − 1] (the
  /// invalid verify outputs some steps inject) reads no further than the entry's row.
  std::vector<std::int32_t> path(int b) const
  {
    std::vector<std::int32_t> p = {0};
    int const n = std::clamp(accepted[std::size_t(b)], 0, max_queries - 1);
    for (int k = 0; k < n; ++k) {
      p.push_back(accepted_nodes[std::size_t(b) * (max_queries - 1) + std::size_t(k)]);
    }
    return p;
  }
  /// Whether node j of entry b lies on the accepted path.
  bool on_path(int b, int j) const
  {
    auto const p = path(b);
    return std::find(p.begin(), p.end(), j) != p.end();
  }
  /// The token verification assigns to node m of entry b (drafts), or to "next".
  static std::int32_t token(int b, int m) { return 1000 * (b + 1) + m; }

  /// `verified_step` over these host arrays (max_drafts = Q − 1).
  verified_step step()
  {
    return verified_arrays(accepted.data(), accepted_nodes.data(), max_queries - 1, emitted.data(),
                           next_token.data(), request_status.data());
  }

  /// `verified_step` over arrays shaped like these (host or device memory).
  static verified_step verified_arrays(std::int32_t const* accepted, std::int32_t const* nodes, int max_drafts,
                                       std::int32_t* emitted, std::int32_t* next_token,
                                       std::uint32_t const* request_status)
  {
    verified_step v;
    v.accepted       = accepted;
    v.accepted_nodes = nodes;
    v.max_drafts     = max_drafts;
    v.emitted        = emitted;
    v.next_token     = next_token;
    v.request_status = request_status;
    return v;
  }
};

/**
 * @brief Random drafts for `entries` batch entries: d_b ≤ Q − 1 nodes each (a chain, or a
 *        tree whose node m hangs below one of the 3 nodes before it), an accepted path
 *        (root-to-node, in index order), and with probability `invalid` per entry one of:
 *        an out-of-range count, a path that is not a tree path, a refused verification.
 */
inline verified_drafts random_verified_drafts(std::mt19937_64& g, int entries, int max_batch, int max_queries,
                                              bool tree, double invalid)
{
  int const Q = max_queries, D = Q - 1;
  verified_drafts v;
  v.max_batch = max_batch;
  v.max_queries = Q;
  v.num_drafts.assign(std::size_t(max_batch), 0);
  v.parents.assign(std::size_t(max_batch) * Q, -1);
  v.depth.assign(std::size_t(max_batch) * Q, 0);
  v.accepted.assign(std::size_t(max_batch), 0);
  v.accepted_nodes.assign(std::size_t(max_batch) * D, -1);
  v.emitted.assign(std::size_t(max_batch) * Q, -1);
  v.next_token.assign(std::size_t(max_batch), -1);
  v.request_status.assign(std::size_t(max_batch), 0);
  v.path_valid.assign(std::size_t(max_batch), true);
  v.refused.assign(std::size_t(max_batch), false);
  std::uniform_real_distribution<double> chance(0.0, 1.0);
  for (int b = 0; b < entries; ++b) {
    int const n = int(g() % std::uint64_t(Q));
    v.num_drafts[b] = n;
    std::int32_t* parent = v.parents.data() + std::size_t(b) * Q;
    std::int32_t* depth  = v.depth.data() + std::size_t(b) * Q;
    for (int m = 1; m <= n; ++m) {
      parent[m] = tree ? std::int32_t(m - 1 - int(g() % std::uint64_t(std::min(m, 3)))) : m - 1;
      depth[m]  = depth[parent[m]] + 1;
    }
    // A random root-to-node path: pick a node, walk up.
    std::vector<std::int32_t> path;
    for (std::int32_t m = std::int32_t(g() % std::uint64_t(n + 1)); m > 0; m = parent[m]) { path.push_back(m); }
    std::reverse(path.begin(), path.end());
    std::int32_t a = std::int32_t(path.size());
    std::uint32_t status = 0;
    if (chance(g) < invalid) {
      switch (g() % 4) {
        case 0: a = n + 1 + int(g() % 2); break;  // more accepted drafts than drafted
        case 1: a = -1; break;
        case 2:  // a node that is not a child of the previous one
          if (n >= 2) {
            path = {std::int32_t(1 + g() % std::uint64_t(n))};
            path.push_back(path[0] == n ? n - 1 : n);
            a = 2;
            v.path_valid[b] = parent[path[1]] == path[0] && parent[path[0]] == 0;
          }
          break;
        default: status = verify_status::bad_tree; break;  // verification refused it
      }
      if (a != std::int32_t(path.size())) { v.path_valid[b] = false; }
    }
    v.accepted[b] = a;
    v.request_status[b] = status;
    v.refused[b]        = status != 0;
    for (std::size_t k = 0; k < path.size() && k < std::size_t(D); ++k) {
      v.accepted_nodes[std::size_t(b) * D + k] = path[k];
    }
    if (status == 0) {  // the path's tokens, then the next token (what verify emits)
      std::vector<std::int32_t> tokens;
      for (std::int32_t m : path) { tokens.push_back(verified_drafts::token(b, m)); }
      tokens.push_back(verified_drafts::token(b, 999));
      for (std::size_t k = 0; k < tokens.size() && k < std::size_t(Q); ++k) {
        v.emitted[std::size_t(b) * Q + k] = tokens[k];
      }
      v.next_token[b] = tokens.back();
    }
  }
  return v;
}

/**
 * @brief What commit_verified must do with entry b: the rows it keeps (`kept`) and the bits
 *        it raises, given `tails` = the number of tail rows resolve gave the entry in every
 *        group (a prefix of the queries) and its query count.
 */
struct expected_commit {
  int kept = 0;
  std::uint32_t bits = 0;
};
inline expected_commit expect_commit(verified_drafts const& v, int b, int queries, int tails)
{
  expected_commit e;
  if (v.refused[std::size_t(b)]) { return e; }
  std::int32_t const a = v.accepted[std::size_t(b)];
  if (a < 0 || a > queries - 1 || !v.path_valid[std::size_t(b)]) {
    e.bits = status_invalid_accept_count;
    return e;
  }
  auto const path = v.path(b);
  while (e.kept < int(path.size()) && path[std::size_t(e.kept)] < tails) { ++e.kept; }
  if (e.kept < int(path.size())) { e.bits |= status_missing_tail; }
  return e;
}

}  // namespace dhisparse::test
