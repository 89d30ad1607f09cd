/**
 * @file verify_stats.hpp
 * @brief Statistical checks of verification outputs and the problems they run on: a
 *        chain whose position distributions are fixed, and a tree over a Markov target
 *        (plain C++, shared by host and GPU tests).
 */
#pragma once

#include "verify_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace dhisparse::test {

/**
 * @brief Largest |count − n·p| / (σ + 1), σ = sqrt(n·p·(1 − p)), over the categories
 *        (each count is binomial(n, p) under the hypothesis); +inf when a category of
 *        probability 0 (or 1) is off.
 *
 * The +1 keeps cells with tiny expected counts (where the binomial tail is far heavier than
 * a Gaussian's) from false alarms: "z ≤ 6" means |count − n·p| ≤ 6σ + 6.
 */
inline double max_z(std::vector<double> const& counts, std::vector<double> const& probs)
{
  double n = 0;
  for (double c : counts) { n += c; }
  double worst = 0;
  for (std::size_t v = 0; v < counts.size(); ++v) {
    double const mean = n * probs[v];
    double const var  = n * probs[v] * (1 - probs[v]);
    if (var <= 0) {
      if (std::fabs(counts[v] - mean) > 0.5) { return std::numeric_limits<double>::infinity(); }
      continue;
    }
    worst = std::max(worst, std::fabs(counts[v] - mean) / (std::sqrt(var) + 1));
  }
  return worst;
}

/// Total variation distance between the normalized counts and a distribution.
inline double tv_distance(std::vector<double> const& counts, std::vector<double> const& probs)
{
  double n = 0;
  for (double c : counts) { n += c; }
  double d = 0;
  for (std::size_t v = 0; v < counts.size(); ++v) { d += std::fabs(counts[v] / n - probs[v]); }
  return 0.5 * d;
}

/**
 * TV distances of the first-token counts to p0 and to an unrelated distribution, after the
 * first 1024 trials and after all T; the expected TV of n samples from p0 (sum over tokens
 * of sqrt(2 p (1 - p) / (pi n)), halved) for those first trials, and the bound for all T:
 * 3× its expected TV. The distance after all trials is compared with the *expected* one
 * after few (the measured one after few trials is itself noisy: comparing with it failed
 * a run whose first 1024 trials happened to lie unusually close to p0).
 */
template <class Result>
void fill_tv(Result& r, std::vector<double> const& first_small, std::vector<double> const& first_all,
             std::vector<double> const& p0, std::vector<double> const& other, double T)
{
  r.tv_small       = tv_distance(first_small, p0);
  r.tv_large       = tv_distance(first_all, p0);
  r.tv_other_small = tv_distance(first_small, other);
  r.tv_other_large = tv_distance(first_all, other);
  auto const expected_tv = [&](double n) {
    double e = 0;
    for (double pv : p0) { e += std::sqrt(2 * pv * (1 - pv) / (3.14159265 * n)); }
    return 0.5 * e;
  };
  double n_small = 0;
  for (double c : first_small) { n_small += c; }
  r.tv_expected_small = expected_tv(n_small);
  r.tv_bound_large    = 3 * expected_tv(T);
}


inline std::vector<double> to_double(std::vector<float> const& v) { return {v.begin(), v.end()}; }

/// A sampling problem of `trials` requests (one per trial), all with `drafts` nodes.
inline void init_stats_params(verify_params& a, draft_topology topo, draft_distribution dist, int trials,
                              int drafts, int V, int K)
{
  a.rule           = verify_rule::sampling;
  a.topology       = topo;
  a.distribution   = dist;
  a.capacity       = trials;
  a.max_drafts     = drafts;
  a.vocab          = V;
  a.num_candidates = dist == draft_distribution::candidates ? K : 0;
}

/// A chain problem whose position distributions are the same in every request: request =
/// trial. Drafts are drawn per trial from q_i (one-hot: fixed tokens x_i).
struct chain_stats_problem {
  verify_case c;
  std::vector<std::vector<float>> p;  ///< [d+1][V]
  std::vector<std::vector<float>> q;  ///< [d][V] (one-hot: indicator of x_i)

  /// a_i = Σ_v min(p_i(v), q_i(v)): the probability that draft i is accepted.
  std::vector<double> acceptance() const
  {
    std::vector<double> a;
    for (std::size_t i = 0; i < q.size(); ++i) {
      double s = 0;
      for (std::size_t v = 0; v < q[i].size(); ++v) { s += std::min<double>(p[i][v], q[i][v]); }
      a.push_back(s);
    }
    return a;
  }
};

inline chain_stats_problem make_chain_stats(draft_distribution dist, int trials, int d, int V, int K,
                                            std::mt19937_64& g)
{
  chain_stats_problem s;
  verify_case& c = s.c;
  init_stats_params(c.a, draft_topology::chain, dist, trials, d, V, K);
  for (int i = 0; i <= d; ++i) { s.p.push_back(random_distribution(V, g, 1.2)); }
  std::vector<std::int32_t> fixed_tokens(d);
  std::vector<std::vector<std::int32_t>> ids(d);
  for (int i = 0; i < d; ++i) {
    std::vector<float> q = random_distribution(V, g, 1.2);
    for (int v = 0; v < V; ++v) { q[v] = 0.5f * q[v] + 0.5f * s.p[i][v]; }  // overlap with p
    if (dist == draft_distribution::candidates) {
      std::vector<int> perm(V);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      double sum = 0;
      for (int j = 0; j < K; ++j) { sum += q[perm[j]]; }
      std::vector<float> cq(V, 0.f);
      for (int j = 0; j < K; ++j) {
        cq[perm[j]] = float(q[perm[j]] / sum);
        ids[i].push_back(perm[j]);
      }
      q = cq;
    } else if (dist == draft_distribution::one_hot) {
      fixed_tokens[i] = draw_index(s.p[i].data(), V, g);
      q.assign(V, 0.f);
      q[fixed_tokens[i]] = 1.f;
    }
    s.q.push_back(q);
  }
  c.num_drafts.assign(trials, d);
  c.p.resize(std::size_t(trials) * (d + 1) * V);
  c.draft_tokens.resize(std::size_t(trials) * d);
  if (dist == draft_distribution::dense) { c.q.resize(std::size_t(trials) * d * V); }
  if (dist == draft_distribution::candidates) {
    c.candidate_ids.resize(std::size_t(trials) * d * K);
    c.candidate_probs.resize(std::size_t(trials) * d * K);
  }
  for (int b = 0; b < trials; ++b) {
    for (int i = 0; i <= d; ++i) {
      std::copy(s.p[i].begin(), s.p[i].end(), c.p.begin() + (std::size_t(b) * (d + 1) + i) * V);
    }
    for (int i = 0; i < d; ++i) {
      c.draft_tokens[std::size_t(b) * d + i] =
        dist == draft_distribution::one_hot ? fixed_tokens[i] : draw_index(s.q[i].data(), V, g);
      if (dist == draft_distribution::dense) {
        std::copy(s.q[i].begin(), s.q[i].end(), c.q.begin() + (std::size_t(b) * d + i) * V);
      }
      if (dist == draft_distribution::candidates) {
        for (int j = 0; j < K; ++j) {
          c.candidate_ids[(std::size_t(b) * d + i) * K + j]   = ids[i][j];
          c.candidate_probs[(std::size_t(b) * d + i) * K + j] = s.q[i][ids[i][j]];
        }
      }
    }
  }
  c.rng = {g(), g() >> 16};
  c.bind();
  c.poison();
  return s;
}

/// Result of checking a chain run against the rule's distributions.
struct chain_stats_report {
  double worst_token_z  = 0;  ///< over positions and tokens
  double worst_length_z = 0;  ///< accepted-length histogram vs [1−a0, a0(1−a1), …]
  double tv_small = 0, tv_large = 0;            ///< TV(first 1024 trials, p_0), TV(all, p_0)
  double tv_other_small = 0, tv_other_large = 0;  ///< same against an unrelated distribution
  double tv_expected_small = 0;                 ///< expected TV of the first 1024 trials from p_0
  double tv_bound_large = 0;                    ///< 3× the expected TV of n samples from p_0
  std::string text;
};

/**
 * @brief Emitted token at every position j against p_j (over the trials that reached j),
 *        the accepted-length histogram against the product formula, and the TV distance
 *        to p_0 and to an unrelated distribution after few and after all trials.
 */
inline chain_stats_report check_chain_stats(chain_stats_problem const& s, std::vector<float> const& unrelated)
{
  verify_case const& c = s.c;
  int const T = c.a.capacity, d = c.a.max_drafts, V = c.a.vocab;
  chain_stats_report r;
  std::ostringstream os;
  std::vector<std::vector<double>> counts(d + 1, std::vector<double>(V, 0));
  std::vector<double> lengths(d + 1, 0);
  std::vector<double> first_small(V, 0), first_all(V, 0);
  for (int b = 0; b < T; ++b) {
    std::vector<std::int32_t> const e = c.emitted_of(b);
    lengths[c.accepted[b]] += 1;
    for (std::size_t j = 0; j < e.size(); ++j) { counts[j][e[j]] += 1; }
    if (!e.empty()) {
      first_all[e[0]] += 1;
      if (b < 1024) { first_small[e[0]] += 1; }
    }
  }
  for (int j = 0; j <= d; ++j) {
    double const z = max_z(counts[j], to_double(s.p[j]));
    os << "position " << j << ": max z " << z << "\n";
    r.worst_token_z = std::max(r.worst_token_z, z);
  }
  std::vector<double> const acc = s.acceptance();
  std::vector<double> expect(d + 1);
  double reach = 1;
  for (int k = 0; k <= d; ++k) {
    expect[k] = k < d ? reach * (1 - acc[k]) : reach;
    if (k < d) { reach *= acc[k]; }
  }
  r.worst_length_z = max_z(lengths, expect);
  os << "accepted length: max z " << r.worst_length_z << "\n";
  std::vector<double> const p0 = to_double(s.p[0]), other = to_double(unrelated);
  fill_tv(r, first_small, first_all, p0, other, T);
  os << "TV to p0: " << r.tv_small << " (1024) → " << r.tv_large << " (" << T << "), bound "
     << r.tv_bound_large << "; TV to unrelated: " << r.tv_other_small << " → " << r.tv_other_large << "\n";
  r.text = os.str();
  return r;
}

/// A tree problem over a Markov target: p(next | path) = Tp[last token], drafter
/// Tq[last token]; per trial a random tree whose children are drawn i.i.d. from the
/// drafter (dense / candidates) or are distinct arbitrary tokens (one-hot).
struct tree_stats_problem {
  verify_case c;
  std::vector<std::vector<float>> Tp, Tq;  ///< [V][V]
  int root_token = 0;
};

inline tree_stats_problem make_tree_stats(draft_distribution dist, int trials, int n, int V, int K,
                                          std::mt19937_64& g)
{
  tree_stats_problem s;
  verify_case& c = s.c;
  init_stats_params(c.a, draft_topology::tree, dist, trials, n, V, K);
  for (int u = 0; u < V; ++u) {
    s.Tp.push_back(random_distribution(V, g, 1.0));
    std::vector<float> q = random_distribution(V, g, 1.0);
    for (int v = 0; v < V; ++v) { q[v] = 0.5f * q[v] + 0.5f * s.Tp[u][v]; }
    s.Tq.push_back(q);
  }
  s.root_token  = std::uniform_int_distribution<int>(0, V - 1)(g);
  int const R   = n + 1;
  c.num_drafts.assign(trials, n);
  c.p.resize(std::size_t(trials) * R * V);
  c.draft_tokens.resize(std::size_t(trials) * R);
  c.first_child.resize(std::size_t(trials) * R);
  c.next_sibling.resize(std::size_t(trials) * R);
  if (dist == draft_distribution::dense) { c.q.resize(std::size_t(trials) * R * V); }
  if (dist == draft_distribution::candidates) {
    c.candidate_ids.assign(std::size_t(trials) * R * K, -1);
    c.candidate_probs.assign(std::size_t(trials) * R * K, 0.f);
  }
  for (int b = 0; b < trials; ++b) {
    std::int32_t* fc = c.first_child.data() + std::size_t(b) * R;
    std::int32_t* ns = c.next_sibling.data() + std::size_t(b) * R;
    std::vector<int> const parent = random_tree(n, g, fc, ns, 3);
    std::vector<std::int32_t> tok(R, 0);
    tok[0] = s.root_token;
    // Per node: the distribution its children are drawn from.
    std::vector<std::vector<float>> child_q(R);
    for (int m = 0; m <= n; ++m) {
      if (m > 0) {
        int const r = parent[m];
        if (dist == draft_distribution::one_hot) {
          // Distinct arbitrary tokens among siblings.
          std::vector<std::int32_t> taken;
          for (int c2 = fc[r]; c2 != -1 && c2 != m; c2 = ns[c2]) { taken.push_back(tok[c2]); }
          std::int32_t x;
          do {
            x = std::uniform_int_distribution<int>(0, V - 1)(g);
          } while (std::find(taken.begin(), taken.end(), x) != taken.end() && int(taken.size()) < V);
          tok[m] = x;
        } else {
          tok[m] = draw_index(child_q[r].data(), V, g);
        }
      }
      std::copy(s.Tp[tok[m]].begin(), s.Tp[tok[m]].end(), c.p.begin() + (std::size_t(b) * R + m) * V);
      child_q[m] = s.Tq[tok[m]];
      if (dist == draft_distribution::dense) {
        std::copy(child_q[m].begin(), child_q[m].end(), c.q.begin() + (std::size_t(b) * R + m) * V);
      }
      if (dist == draft_distribution::candidates) {
        std::vector<int> perm(V);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g);
        double sum = 0;
        for (int j = 0; j < K; ++j) { sum += child_q[m][perm[j]]; }
        std::vector<float> cq(V, 0.f);
        for (int j = 0; j < K; ++j) {
          cq[perm[j]] = float(child_q[m][perm[j]] / sum);
          c.candidate_ids[(std::size_t(b) * R + m) * K + j]   = perm[j];
          c.candidate_probs[(std::size_t(b) * R + m) * K + j] = cq[perm[j]];
        }
        child_q[m] = cq;
      }
    }
    std::copy(tok.begin(), tok.end(), c.draft_tokens.begin() + std::size_t(b) * R);
  }
  c.rng = {g(), g() >> 16};
  c.bind();
  c.poison();
  return s;
}

struct tree_stats_report {
  double worst_first_z = 0;       ///< first emitted token vs Tp[root]
  double worst_transition_z = 0;  ///< every emitted token vs Tp[previous token], per depth and pooled
  double tv_small = 0, tv_large = 0, tv_other_small = 0, tv_other_large = 0, tv_bound_large = 0;
  double tv_expected_small = 0;
  double mean_accepted = 0;
  std::string text;
};

inline tree_stats_report check_tree_stats(tree_stats_problem const& s)
{
  verify_case const& c = s.c;
  int const T = c.a.capacity, n = c.a.max_drafts, V = c.a.vocab;
  tree_stats_report r;
  std::ostringstream os;
  std::vector<double> first_small(V, 0), first_all(V, 0);
  // [depth][previous][next] and pooled [previous][next]
  std::vector<std::vector<std::vector<double>>> depth(
    n + 1, std::vector<std::vector<double>>(V, std::vector<double>(V, 0)));
  std::vector<std::vector<double>> pooled(V, std::vector<double>(V, 0));
  double accepted = 0;
  for (int b = 0; b < T; ++b) {
    std::vector<std::int32_t> const e = c.emitted_of(b);
    accepted += c.accepted[b];
    first_all[e[0]] += 1;
    if (b < 1024) { first_small[e[0]] += 1; }
    for (std::size_t j = 1; j < e.size(); ++j) {
      depth[j][e[j - 1]][e[j]] += 1;
      pooled[e[j - 1]][e[j]] += 1;
    }
  }
  r.mean_accepted = accepted / T;
  std::vector<double> const p0 = to_double(s.Tp[s.root_token]);
  r.worst_first_z              = max_z(first_all, p0);
  for (int u = 0; u < V; ++u) {
    std::vector<double> const pu = to_double(s.Tp[u]);
    r.worst_transition_z         = std::max(r.worst_transition_z, max_z(pooled[u], pu));
    for (int j = 1; j <= n; ++j) { r.worst_transition_z = std::max(r.worst_transition_z, max_z(depth[j][u], pu)); }
  }
  std::vector<double> const other = to_double(s.Tq[s.root_token]);
  fill_tv(r, first_small, first_all, p0, other, T);
  os << "first token max z " << r.worst_first_z << ", transitions max z " << r.worst_transition_z
     << ", mean accepted " << r.mean_accepted << "; TV to p: " << r.tv_small << " → " << r.tv_large
     << " (bound " << r.tv_bound_large << "), TV to q: " << r.tv_other_small << " → " << r.tv_other_large
     << "\n";
  r.text = os.str();
  return r;
}

}  // namespace dhisparse::test
