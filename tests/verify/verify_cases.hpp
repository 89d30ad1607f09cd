/**
 * @file verify_cases.hpp
 * @brief Random verification problems for the host and GPU tests (plain C++): a
 *        `verify_case` owns every input and output array in host memory and binds them
 *        into a `verify_params`.
 */
#pragma once

#include <dhisparse/verify_params.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace dhisparse::test {

/// A verification problem with its outputs, in host memory.
struct verify_case {
  verify_params a;  ///< bound to the vectors below by `bind()`

  std::vector<std::int32_t> batch_size, num_drafts, draft_tokens, first_child, next_sibling,
    target_tokens, candidate_ids;
  std::vector<float> p, q, candidate_probs;
  std::vector<std::uint64_t> rng;

  std::vector<std::int32_t> accepted, emitted, next_token, accepted_nodes;
  std::vector<std::uint32_t> request_status, status;
  std::vector<std::uint64_t> bytes_read;

  /// Points every pointer of `a` at the vectors (nullptr for empty ones) and sizes the
  /// outputs.
  void bind()
  {
    auto ptr = [](auto& v) { return v.empty() ? nullptr : v.data(); };
    int const B = a.capacity, d = a.max_drafts;
    accepted.resize(B);
    next_token.resize(B);
    emitted.resize(std::size_t(B) * (d + 1));
    accepted_nodes.resize(std::size_t(B) * d);
    request_status.resize(B);
    status.resize(1);
    bytes_read.resize(1);
    a.batch_size      = ptr(batch_size);
    a.num_drafts      = ptr(num_drafts);
    a.draft_tokens    = ptr(draft_tokens);
    a.first_child     = ptr(first_child);
    a.next_sibling    = ptr(next_sibling);
    a.target_tokens   = ptr(target_tokens);
    a.candidate_ids   = ptr(candidate_ids);
    a.p               = ptr(p);
    a.q               = ptr(q);
    a.candidate_probs = ptr(candidate_probs);
    a.rng             = ptr(rng);
    a.accepted        = accepted.data();
    a.next_token      = next_token.data();
    a.emitted         = emitted.data();
    a.accepted_nodes  = d > 0 ? accepted_nodes.data() : nullptr;
    a.request_status  = request_status.data();
    a.status          = status.data();
    a.bytes_read      = bytes_read.data();
  }

  verify_case() = default;
  /// Copies keep `a` pointing at their own vectors (a pointer that named one of the
  /// source's vectors names the copy's; null or foreign pointers are kept).
  verify_case(verify_case const& o)
    : a{o.a},
      batch_size{o.batch_size}, num_drafts{o.num_drafts}, draft_tokens{o.draft_tokens},
      first_child{o.first_child}, next_sibling{o.next_sibling}, target_tokens{o.target_tokens},
      candidate_ids{o.candidate_ids}, p{o.p}, q{o.q}, candidate_probs{o.candidate_probs}, rng{o.rng},
      accepted{o.accepted}, emitted{o.emitted}, next_token{o.next_token}, accepted_nodes{o.accepted_nodes},
      request_status{o.request_status}, status{o.status}, bytes_read{o.bytes_read}
  {
    rebind_from(o);
  }
  verify_case& operator=(verify_case const& o)
  {
    if (this != &o) {
      verify_case copy(o);
      *this = std::move(copy);
    }
    return *this;
  }
  // Moving a vector keeps its buffer, so `a` stays valid.
  verify_case(verify_case&&) noexcept            = default;
  verify_case& operator=(verify_case&&) noexcept = default;

  /// Fills the outputs with values no run produces.
  void poison()
  {
    std::fill(accepted.begin(), accepted.end(), -777);
    std::fill(next_token.begin(), next_token.end(), -777);
    std::fill(emitted.begin(), emitted.end(), -777);
    std::fill(accepted_nodes.begin(), accepted_nodes.end(), -777);
    std::fill(request_status.begin(), request_status.end(), 0xDEADBEEFu);
    status[0]     = 0xDEADBEEFu;
    bytes_read[0] = 0;
  }

  int rows_p() const { return a.max_drafts + 1; }

 private:
  void rebind_from(verify_case const& o)
  {
    auto fix = [](auto& field, auto const& mine, auto const& theirs) {
      if (field != nullptr && !theirs.empty() && field == theirs.data()) { field = const_cast<std::decay_t<decltype(field)>>(mine.data()); }
    };
    fix(a.batch_size, batch_size, o.batch_size);
    fix(a.num_drafts, num_drafts, o.num_drafts);
    fix(a.draft_tokens, draft_tokens, o.draft_tokens);
    fix(a.first_child, first_child, o.first_child);
    fix(a.next_sibling, next_sibling, o.next_sibling);
    fix(a.target_tokens, target_tokens, o.target_tokens);
    fix(a.candidate_ids, candidate_ids, o.candidate_ids);
    fix(a.p, p, o.p);
    fix(a.q, q, o.q);
    fix(a.candidate_probs, candidate_probs, o.candidate_probs);
    fix(a.rng, rng, o.rng);
    fix(a.accepted, accepted, o.accepted);
    fix(a.emitted, emitted, o.emitted);
    fix(a.next_token, next_token, o.next_token);
    fix(a.accepted_nodes, accepted_nodes, o.accepted_nodes);
    fix(a.request_status, request_status, o.request_status);
    fix(a.status, status, o.status);
    fix(a.bytes_read, bytes_read, o.bytes_read);
  }

 public:
  int rows_q() const { return a.topology == draft_topology::tree ? a.max_drafts + 1 : a.max_drafts; }
  std::int64_t p_row_stride() const { return a.p_row_stride ? a.p_row_stride : a.vocab; }
  std::int64_t p_request_stride() const
  {
    return a.p_request_stride ? a.p_request_stride : rows_p() * p_row_stride();
  }
  std::int64_t q_row_stride() const { return a.q_row_stride ? a.q_row_stride : a.vocab; }
  std::int64_t q_request_stride() const
  {
    return a.q_request_stride ? a.q_request_stride : rows_q() * q_row_stride();
  }
  float* p_row(int b, int r) { return p.data() + b * p_request_stride() + r * p_row_stride(); }
  float* q_row(int b, int r) { return q.data() + b * q_request_stride() + r * q_row_stride(); }
  std::int32_t* candidate_id_row(int b, int r)
  {
    return candidate_ids.data() + (std::int64_t(b) * rows_q() + r) * a.num_candidates;
  }
  float* candidate_prob_row(int b, int r)
  {
    return candidate_probs.data() + (std::int64_t(b) * rows_q() + r) * a.num_candidates;
  }
  /// Draft token of node m ≥ 1 of request b.
  std::int32_t& token(int b, int m)
  {
    return a.topology == draft_topology::tree ? draft_tokens[std::size_t(b) * (a.max_drafts + 1) + m]
                                              : draft_tokens[std::size_t(b) * a.max_drafts + m - 1];
  }
  /// Emitted tokens of request b (up to the first -1).
  std::vector<std::int32_t> emitted_of(int b) const
  {
    std::vector<std::int32_t> out;
    for (int j = 0; j <= a.max_drafts; ++j) {
      std::int32_t const t = emitted[std::size_t(b) * (a.max_drafts + 1) + j];
      if (t < 0) { break; }
      out.push_back(t);
    }
    return out;
  }
};

/// A distribution over V tokens, w_i = exp(c·z_i) normalized in double (sums to 1 within
/// float rounding); `c` sets how peaked it is.
inline std::vector<float> random_distribution(int V, std::mt19937_64& g, double c)
{
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<double> w(V);
  double sum = 0;
  for (auto& x : w) { sum += x = std::exp(c * z(g)); }
  std::vector<float> out(V);
  for (int i = 0; i < V; ++i) { out[i] = float(w[i] / sum); }
  return out;
}

/// Index drawn from (unnormalized) weights.
template <class T>
int draw_index(T const* w, int n, std::mt19937_64& g)
{
  double total = 0;
  for (int i = 0; i < n; ++i) { total += std::max<double>(w[i], 0.0); }
  double u = std::uniform_real_distribution<double>(0.0, total)(g);
  for (int i = 0; i < n; ++i) {
    u -= std::max<double>(w[i], 0.0);
    if (u < 0) { return i; }
  }
  for (int i = n - 1; i >= 0; --i) {
    if (w[i] > 0) { return i; }
  }
  return 0;
}

/// A random tree on nodes 0..n (parent of m uniform in [0, m)), in first-child /
/// next-sibling form with children in index order. Returns the parents.
inline std::vector<int> random_tree(int n, std::mt19937_64& g, std::int32_t* first_child,
                                    std::int32_t* next_sibling, int max_children = 1 << 30)
{
  std::vector<int> parent(n + 1, -1), count(n + 1, 0);
  for (int m = 1; m <= n; ++m) {
    for (int tries = 0;; ++tries) {
      int const r = std::uniform_int_distribution<int>(0, m - 1)(g);
      if (count[r] < max_children || tries > 64) {
        parent[m] = r;
        ++count[r];
        break;
      }
    }
  }
  std::vector<int> last(n + 1, -1);
  for (int m = 0; m <= n; ++m) { first_child[m] = next_sibling[m] = -1; }
  for (int m = 1; m <= n; ++m) {
    int const r = parent[m];
    if (last[r] == -1) {
      first_child[r] = m;
    } else {
      next_sibling[last[r]] = m;
    }
    last[r] = m;
  }
  return parent;
}

/// Options of `make_case`.
struct case_options {
  bool vary_drafts  = true;   ///< num_drafts random in [0, d] (else d for all)
  int padding       = 0;      ///< requests past the batch size (their inputs are garbage)
  int row_pad       = 0;      ///< extra elements between rows of p and q (filled with NaN)
  bool target_ids   = false;  ///< greedy: give target_tokens instead of p
  double overlap    = 0.6;    ///< weight of p in the drafter's q (acceptance rate)
};

/**
 * @brief A random, valid problem of the given kind: distributions of random sharpness, q
 *        a mixture of p and noise, drafts drawn from q (greedy / one-hot: the argmax or a
 *        random token), random trees, random per-request counts.
 */
inline verify_case make_case(verify_rule rule, draft_topology topo, draft_distribution dist, int batch,
                             int d, int V, int K, std::mt19937_64& g, case_options const& o = {})
{
  verify_case c;
  verify_params& a = c.a;
  a.rule           = rule;
  a.topology       = topo;
  a.distribution   = dist;
  a.capacity       = batch + o.padding;
  a.max_drafts     = d;
  a.vocab          = V;
  a.num_candidates = dist == draft_distribution::candidates ? K : 0;
  bool const tree  = topo == draft_topology::tree;
  bool const dense = rule == verify_rule::sampling && dist == draft_distribution::dense;
  bool const cands = rule == verify_rule::sampling && dist == draft_distribution::candidates;
  int const B      = a.capacity;
  if (o.row_pad) {
    a.p_row_stride     = V + o.row_pad;
    a.p_request_stride = c.rows_p() * a.p_row_stride + o.row_pad;
    a.q_row_stride     = V + o.row_pad;
    a.q_request_stride = c.rows_q() * a.q_row_stride + 2 * o.row_pad;
  }
  float const nan = std::numeric_limits<float>::quiet_NaN();
  if (!(rule == verify_rule::greedy && o.target_ids)) { c.p.assign(B * c.p_request_stride(), nan); }
  if (dense) { c.q.assign(B * c.q_request_stride(), nan); }
  if (cands) {
    c.candidate_ids.assign(std::size_t(B) * c.rows_q() * K, -5);
    c.candidate_probs.assign(std::size_t(B) * c.rows_q() * K, nan);
  }
  c.batch_size = {batch};
  c.num_drafts.assign(B, 1000);  // garbage for padding requests
  c.draft_tokens.assign(std::size_t(B) * (tree ? d + 1 : d), -3);
  if (tree) {
    c.first_child.assign(std::size_t(B) * (d + 1), -9);
    c.next_sibling.assign(std::size_t(B) * (d + 1), -9);
  }
  if (rule == verify_rule::greedy && o.target_ids) { c.target_tokens.assign(std::size_t(B) * (d + 1), -4); }
  std::uniform_real_distribution<double> sharp(0.5, 4.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> any_token(0, V - 1);
  for (int b = 0; b < batch; ++b) {
    c.num_drafts[b] = o.vary_drafts ? std::uniform_int_distribution<int>(0, d)(g) : d;
    std::vector<int> parent(d + 1);
    if (tree) {
      parent = random_tree(d, g, c.first_child.data() + std::size_t(b) * (d + 1),
                           c.next_sibling.data() + std::size_t(b) * (d + 1));
    } else {
      std::iota(parent.begin(), parent.end(), -1);
    }
    std::vector<std::vector<float>> prow(d + 1);
    for (int r = 0; r <= d; ++r) {
      prow[r] = random_distribution(V, g, sharp(g));
      if (!c.p.empty()) { std::copy(prow[r].begin(), prow[r].end(), c.p_row(b, r)); }
      if (!c.target_tokens.empty()) {
        c.target_tokens[std::size_t(b) * (d + 1) + r] =
          std::int32_t(std::max_element(prow[r].begin(), prow[r].end()) - prow[r].begin());
      }
    }
    std::vector<std::vector<float>> qrow(c.rows_q());
    for (int r = 0; r < c.rows_q(); ++r) {
      std::vector<float> const noise = random_distribution(V, g, sharp(g));
      std::vector<double> mix(V);
      double sum = 0;
      for (int i = 0; i < V; ++i) { sum += mix[i] = o.overlap * prow[r][i] + (1 - o.overlap) * noise[i]; }
      qrow[r].resize(V);
      for (int i = 0; i < V; ++i) { qrow[r][i] = float(mix[i] / sum); }
      if (dense) { std::copy(qrow[r].begin(), qrow[r].end(), c.q_row(b, r)); }
      if (cands) {
        // K slots: distinct ids (likely ones first), some slots empty (-1).
        std::vector<int> ids;
        std::vector<double> w(qrow[r].begin(), qrow[r].end());
        int const used = std::max(1, std::min(V, K - std::uniform_int_distribution<int>(0, K / 3)(g)));
        while (int(ids.size()) < used) {
          int const t = unit(g) < 0.7 ? draw_index(w.data(), V, g) : any_token(g);
          if (std::find(ids.begin(), ids.end(), t) == ids.end()) { ids.push_back(t); }
          w[t] = 0;
          if (std::all_of(w.begin(), w.end(), [](double x) { return x <= 0; })) { break; }
        }
        std::vector<double> pw(ids.size());
        double psum = 0;
        for (std::size_t j = 0; j < ids.size(); ++j) { psum += pw[j] = qrow[r][ids[j]] + 0.05 * unit(g) + 1e-3; }
        std::vector<int> slot(K);
        std::iota(slot.begin(), slot.end(), 0);
        std::shuffle(slot.begin(), slot.end(), g);
        std::int32_t* id_row = c.candidate_id_row(b, r);
        float* pr_row        = c.candidate_prob_row(b, r);
        std::fill(id_row, id_row + K, -1);
        std::fill(pr_row, pr_row + K, 0.25f);  // ignored for empty slots
        std::fill(qrow[r].begin(), qrow[r].end(), 0.f);
        for (std::size_t j = 0; j < ids.size(); ++j) {
          id_row[slot[j]] = ids[j];
          pr_row[slot[j]] = float(pw[j] / psum);
          qrow[r][ids[j]] = pr_row[slot[j]];
        }
      }
    }
    for (int m = 1; m <= d; ++m) {
      int const r = parent[m];
      std::int32_t x;
      if (rule == verify_rule::greedy || dist == draft_distribution::one_hot) {
        x = unit(g) < 0.6 ? std::int32_t(std::max_element(prow[r].begin(), prow[r].end()) - prow[r].begin())
                          : any_token(g);
      } else {
        x = draw_index(qrow[r].data(), V, g);
      }
      c.token(b, m) = x;
    }
  }
  c.rng = {g(), g() >> 8};
  c.bind();
  c.poison();
  return c;
}


/// One way to make a request's input invalid.
struct corruption {
  char const* name;
  char const* argument;  ///< the argument the error message must name
  std::uint32_t bit;     ///< the status bit it must raise (others may come with it)
  /// Applies to request b of `c`; false when it does not apply to this kind of problem.
  bool (*apply)(verify_case& c, int b);
};

namespace detail {
inline bool sampling(verify_case const& c) { return c.a.rule == verify_rule::sampling; }
inline bool dense(verify_case const& c) { return sampling(c) && c.a.distribution == draft_distribution::dense; }
inline bool cands(verify_case const& c)
{
  return sampling(c) && c.a.distribution == draft_distribution::candidates;
}
inline bool tree(verify_case const& c) { return c.a.topology == draft_topology::tree; }
/// Slot of token x in a candidate row, or -1.
inline int slot_of(verify_case& c, int b, int r, std::int32_t x)
{
  for (int j = 0; j < c.a.num_candidates; ++j) {
    if (c.candidate_id_row(b, r)[j] == x) { return j; }
  }
  return -1;
}
}  // namespace detail

/// Dense q rows made min(1, 1.25·p): on or above p everywhere, so a rejected draft leaves a
/// residual max(0, p − q) without mass and the token is drawn from p itself; the mass
/// tolerance is widened to 0.5 (q sums to at most 1.25).
inline void make_residuals_massless(verify_case& c)
{
  c.a.sum_tolerance = 0.5f;
  for (int b = 0; b < c.a.capacity; ++b) {
    for (int r = 0; r < c.rows_q(); ++r) {
      float const* p = c.p_row(b, r);
      float* q       = c.q_row(b, r);
      for (int i = 0; i < c.a.vocab; ++i) { q[i] = std::min(1.f, 1.25f * p[i]); }
    }
  }
}

/// Every corruption the tests apply; each needs num_drafts[b] = max_drafts ≥ 2.
inline std::vector<corruption> const& corruptions()
{
  using namespace detail;
  static std::vector<corruption> const all = {
    {"num_drafts above max_drafts", "num_drafts", verify_status::bad_num_drafts,
     [](verify_case& c, int b) { return c.num_drafts[b] = c.a.max_drafts + 1, true; }},
    {"negative num_drafts", "num_drafts", verify_status::bad_num_drafts,
     [](verify_case& c, int b) { return c.num_drafts[b] = -1, true; }},
    {"draft token = vocab", "draft_tokens", verify_status::bad_draft_token,
     [](verify_case& c, int b) { return c.token(b, 2) = c.a.vocab, true; }},
    {"negative draft token", "draft_tokens", verify_status::bad_draft_token,
     [](verify_case& c, int b) { return c.token(b, 1) = -2, true; }},
    {"NaN in p", "p", verify_status::p_not_finite,
     [](verify_case& c, int b) {
       if (c.p.empty()) { return false; }
       c.p_row(b, 0)[c.token(b, 1)] = std::numeric_limits<float>::quiet_NaN();
       return true;
     }},
    {"+inf in p", "p", verify_status::p_not_finite,
     [](verify_case& c, int b) {
       if (!sampling(c)) { return false; }
       c.p_row(b, 0)[c.token(b, 1)] = std::numeric_limits<float>::infinity();
       return true;
     }},
    {"negative p", "p", verify_status::p_negative,
     [](verify_case& c, int b) { return sampling(c) && (c.p_row(b, 0)[c.token(b, 1)] = -0.01f, true); }},
    {"p above 1", "p", verify_status::p_not_normalized,
     [](verify_case& c, int b) { return sampling(c) && (c.p_row(b, 0)[c.token(b, 1)] = 1.25f, true); }},
    {"p row sums to 0.9", "p", verify_status::p_not_normalized,
     [](verify_case& c, int b) {
       if (!sampling(c)) { return false; }
       for (int i = 0; i < c.a.vocab; ++i) { c.p_row(b, 0)[i] *= 0.9f; }
       return true;
     }},
    {"NaN in q", "q", verify_status::q_not_finite,
     [](verify_case& c, int b) {
       return dense(c) && (c.q_row(b, 0)[c.token(b, 1)] = std::numeric_limits<float>::quiet_NaN(), true);
     }},
    {"negative q", "q", verify_status::q_negative,
     [](verify_case& c, int b) { return dense(c) && (c.q_row(b, 0)[c.token(b, 1)] = -0.5f, true); }},
    {"q row sums to 1.1", "q", verify_status::q_not_normalized,
     [](verify_case& c, int b) {
       if (!dense(c)) { return false; }
       for (int i = 0; i < c.a.vocab; ++i) { c.q_row(b, 0)[i] *= 1.1f; }
       return true;
     }},
    {"draft token with q = 0", "draft_tokens", verify_status::draft_not_in_q,
     [](verify_case& c, int b) {
       std::int32_t const x = c.token(b, 1);
       if (dense(c)) {
         float* q                   = c.q_row(b, 0);
         q[(x + 1) % c.a.vocab] += q[x];  // keep the row normalized
         q[x] = 0.f;
         return true;
       }
       if (cands(c)) {
         int const j = slot_of(c, b, 0, x);
         for (std::int32_t y = 0; y < c.a.vocab && j >= 0; ++y) {
           if (slot_of(c, b, 0, y) < 0) { return c.candidate_id_row(b, 0)[j] = y, true; }
         }
       }
       return false;
     }},
    {"candidate id = vocab", "candidate_ids", verify_status::bad_candidates,
     [](verify_case& c, int b) {
       if (!cands(c)) { return false; }
       int const j = slot_of(c, b, 0, -1);  // an empty slot: the row's mass is unchanged
       if (j < 0) { return false; }
       c.candidate_id_row(b, 0)[j]   = c.a.vocab + 3;
       c.candidate_prob_row(b, 0)[j] = 0.f;
       return true;
     }},
    {"repeated candidate id", "candidate_ids", verify_status::bad_candidates,
     [](verify_case& c, int b) {
       if (!cands(c)) { return false; }
       int const j = slot_of(c, b, 0, -1);
       if (j < 0) { return false; }
       c.candidate_id_row(b, 0)[j]   = c.token(b, 1);
       c.candidate_prob_row(b, 0)[j] = 0.f;
       return true;
     }},
    {"NaN candidate probability", "candidate_probs", verify_status::q_not_finite,
     [](verify_case& c, int b) {
       if (!cands(c)) { return false; }
       c.candidate_prob_row(b, 0)[slot_of(c, b, 0, c.token(b, 1))] = std::numeric_limits<float>::quiet_NaN();
       return true;
     }},
    {"candidate probabilities sum to 0.8", "candidate_probs", verify_status::q_not_normalized,
     [](verify_case& c, int b) {
       if (!cands(c)) { return false; }
       for (int j = 0; j < c.a.num_candidates; ++j) { c.candidate_prob_row(b, 0)[j] *= 0.8f; }
       return true;
     }},
    {"tree link pointing backwards", "first_child", verify_status::bad_tree,
     [](verify_case& c, int b) {
       return tree(c) && (c.first_child[std::size_t(b) * (c.a.max_drafts + 1) + 2] = 1, true);
     }},
    {"tree link beyond max_drafts", "first_child", verify_status::bad_tree,
     [](verify_case& c, int b) {
       return tree(c) && (c.first_child[std::size_t(b) * (c.a.max_drafts + 1) + c.a.max_drafts] =
                            c.a.max_drafts + 1,
                          true);
     }},
    {"tree node never linked", "first_child", verify_status::bad_tree,
     [](verify_case& c, int b) {
       if (!tree(c)) { return false; }
       std::int32_t const last = c.a.max_drafts;
       std::size_t const base  = std::size_t(b) * (last + 1);
       for (int m = 0; m <= last; ++m) {
         if (c.first_child[base + m] == last) { c.first_child[base + m] = -1; }
         if (c.next_sibling[base + m] == last) { c.next_sibling[base + m] = -1; }
       }
       return true;
     }},
    {"target token = vocab", "target_tokens", verify_status::bad_target_token,
     [](verify_case& c, int b) {
       return !c.target_tokens.empty() &&
              (c.target_tokens[std::size_t(b) * (c.a.max_drafts + 1)] = c.a.vocab, true);
     }},
  };
  return all;
}

}  // namespace dhisparse::test
