/**
 * @file verify_inputs.hpp
 * @brief Fuzz target `verify_inputs`: `verify_params` structs and their distributions
 *        decoded from the input, through the verify host reference
 *        (include/dhisparse/host/verify.hpp).
 *
 * Shapes, strides, enum values, the tolerance and which pointers are null are fuzzed;
 * every array the shapes promise is allocated at exactly its size (so a read past it is
 * an address-sanitizer report), and filled with valid distributions, trees and tokens or
 * with anything (negative, NaN, infinite, out-of-vocabulary, links that form no tree).
 * `verify_input_status`, `verify(flag)` and `verify(throw_error)` must each give a
 * `dhisparse::error` or a result, never undefined behaviour, and the results must agree:
 *
 * - every output is in range: accepted counts in [0, max_drafts], tokens in [-1, vocab),
 *   the emitted row ends with `next_token`, requests with status bits emit nothing;
 * - `throw_error` fails exactly when `flag` reports an invalid request, and otherwise
 *   writes the same outputs as `flag`.
 */
#pragma once

#include "fuzz_input.hpp"

#include <dhisparse/verify_params.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/host/verify.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace dhisparse::fuzz {

/// The arrays of one fuzzed call, each of exactly the size its shapes promise.
struct verify_arrays {
  buffer<std::int32_t> batch_size, num_drafts, draft_tokens, first_child, next_sibling, target_tokens, candidate_ids;
  buffer<float> p, q, candidate_probs;
  buffer<std::uint64_t> rng;
  buffer<std::int32_t> accepted, emitted, next_token, accepted_nodes;
  buffer<std::uint32_t> status, request_status;
  buffer<std::uint64_t> bytes_read;
};

/**
 * @brief Elements of each array as the contract of `verify_params` states them: the
 *        arrays a call's rule, topology and distribution do not use get none, so that a
 *        read of one is caught too. All zero when the shapes are unusable or too large.
 */
struct verify_sizes {
  std::int64_t p = 0, q = 0, candidates = 0, tokens = 0, links = 0, targets = 0, batch = 0, rows = 0, drafts = 0;
  bool fits = false;

  explicit verify_sizes(verify_params const& a)
  {
    auto const usable = [](std::int64_t stride) { return stride >= 0 && stride <= (std::int64_t{1} << 32); };
    if (a.capacity < 0 || a.max_drafts < 0 || a.max_drafts > max_verify_drafts || a.vocab <= 0 ||
        !usable(a.p_row_stride) || !usable(a.p_request_stride) || !usable(a.q_row_stride) ||
        !usable(a.q_request_stride)) {
      return;
    }
    bool const sampling = a.rule == verify_rule::sampling, tree = a.topology == draft_topology::tree;
    auto const l        = detail::verify::layout::of(a);
    double const B = a.capacity, rows_p = double(a.max_drafts) + 1, rows_q = double(l.rows_q);
    double const dp = B > 0 ? (B - 1) * double(l.p_request) + (rows_p - 1) * double(l.p_row) + a.vocab : 0;
    double const dq = sampling && a.distribution == draft_distribution::dense && B > 0 && rows_q > 0
                        ? (B - 1) * double(l.q_request) + (rows_q - 1) * double(l.q_row) + a.vocab
                        : 0;
    double const dc = sampling && a.distribution == draft_distribution::candidates
                        ? B * rows_q * std::max(a.num_candidates, 0)
                        : 0;
    if (std::max({dp, dq, dc}) > double(1 << 16)) { return; }
    p          = std::int64_t(dp);
    q          = std::int64_t(dq);
    candidates = std::int64_t(dc);
    tokens     = std::int64_t(a.capacity) * l.row_tokens;
    rows       = std::int64_t(a.capacity) * (a.max_drafts + 1);
    links      = tree ? rows : 0;
    targets    = sampling ? 0 : rows;
    batch      = a.capacity;
    drafts     = std::int64_t(a.capacity) * a.max_drafts;
    fits       = true;
  }
};

/// Fills one distribution row of `vocab` entries: normalized weights, a single token,
/// or anything.
inline void fill_row(input& in, float* row, int vocab)
{
  switch (in.byte() % 3) {
    case 0: {
      std::vector<float> w(vocab);
      float sum = 0;
      for (auto& x : w) { sum += x = float(in.byte()); }
      for (int i = 0; i < vocab; ++i) { row[i] = sum > 0 ? w[i] / sum : (i == 0 ? 1.f : 0.f); }
    } break;
    case 1: {
      int const token = int(in.integer<unsigned>(0, unsigned(vocab) - 1) % unsigned(vocab));
      for (int i = 0; i < vocab; ++i) { row[i] = i == token ? 1.f : 0.f; }
    } break;
    default:
      for (int i = 0; i < vocab; ++i) { row[i] = in.probability(); }
  }
}

/// Fills `tree`'s first_child / next_sibling of request b: a random valid tree (children
/// in index order) or random links.
inline void fill_links(input& in, verify_params const& a, std::int32_t* first_child, std::int32_t* next_sibling)
{
  int const d = a.max_drafts;
  if (in.boolean()) {
    std::fill(first_child, first_child + d + 1, -1);
    std::fill(next_sibling, next_sibling + d + 1, -1);
    std::vector<int> last_child(d + 1, -1);
    for (int m = 1; m <= d; ++m) {
      int const parent = int(in.integer<unsigned>(0, unsigned(m) - 1) % unsigned(m));
      (last_child[parent] < 0 ? first_child[parent] : next_sibling[last_child[parent]]) = m;
      last_child[parent] = m;
    }
  } else {
    for (int m = 0; m <= d; ++m) {
      first_child[m]  = in.integer<std::int32_t>(-1, d + 1);
      next_sibling[m] = in.integer<std::int32_t>(-1, d + 1);
    }
  }
}

/// Decodes a call's shapes and options into `a` (pointers unset).
inline verify_params decode_verify_shapes(input& in)
{
  verify_params a;
  a.rule           = static_cast<verify_rule>(in.integer<std::int32_t>(0, 1));
  a.topology       = static_cast<draft_topology>(in.integer<std::int32_t>(0, 1));
  a.distribution   = static_cast<draft_distribution>(in.integer<std::int32_t>(0, 2));
  a.capacity       = in.integer<int>(-1, 4);
  a.max_drafts     = in.integer<int>(-1, 8);
  a.vocab          = in.integer<int>(-1, 40);
  a.num_candidates = in.integer<int>(-1, 8);
  // Strides: mostly the default (0), else near the natural one (raw: anything).
  auto const stride = [&](std::int64_t rows, std::int64_t row) {
    std::int64_t const natural = std::int64_t(std::clamp(double(rows) * double(row), -1e15, 1e15));
    return in.boolean() ? 0 : in.integer<std::int64_t>(natural - 1, natural + 3);
  };
  std::int64_t const rows_q = a.topology == draft_topology::tree ? std::int64_t(a.max_drafts) + 1 : a.max_drafts;
  a.p_row_stride     = stride(1, a.vocab);
  a.p_request_stride = stride(std::int64_t(a.max_drafts) + 1, a.p_row_stride ? a.p_row_stride : a.vocab);
  a.q_row_stride     = stride(1, a.vocab);
  a.q_request_stride = stride(rows_q, a.q_row_stride ? a.q_row_stride : a.vocab);
  static constexpr float tolerances[] = {1e-3f, 0.f, 0.5f, 0.999f, 1.f, -1e-3f,
                                         std::numeric_limits<float>::quiet_NaN()};
  a.sum_tolerance = in.boolean() ? in.pick(tolerances) : in.raw<float>();
  a.validate_all  = in.boolean();
  return a;
}

/// Runs the three entry points on `a` and cross-checks them (see the file comment).
inline void check_verify(verify_params const& a)
{
  // Ends the input here if the shapes or pointers are bad (then all three must refuse).
  std::vector<std::uint32_t> const input_status = host::verify_input_status(a);
  expect(int(input_status.size()) == a.capacity, "verify_input_status: one status per request expected");

  int const B = a.capacity, width = a.max_drafts + 1;
  auto const outputs = [&] {
    std::vector<std::int64_t> out(a.accepted, a.accepted + B);
    out.insert(out.end(), a.next_token, a.next_token + B);
    out.insert(out.end(), a.emitted, a.emitted + std::int64_t(B) * width);
    if (a.accepted_nodes) {
      out.insert(out.end(), a.accepted_nodes, a.accepted_nodes + std::int64_t(B) * a.max_drafts);
    }
    if (a.request_status) { out.insert(out.end(), a.request_status, a.request_status + B); }
    out.push_back(*a.status);
    return out;
  };
  auto const poison = [&] {
    std::fill(a.accepted, a.accepted + B, 0x5A5A5A5A);
    std::fill(a.next_token, a.next_token + B, 0x5A5A5A5A);
    std::fill(a.emitted, a.emitted + std::int64_t(B) * width, 0x5A5A5A5A);
    *a.status = 0x5A5A5A5A;
  };

  poison();
  host::verify(a, host::on_invalid_input::flag);
  for (int b = 0; b < B; ++b) {
    std::int32_t const accepted = a.accepted[b];
    std::string const at        = "verify(flag): request " + std::to_string(b) + ": ";
    expect(accepted >= 0 && accepted <= a.max_drafts, at + "accepted count " + std::to_string(accepted));
    for (int j = 0; j < width; ++j) {
      std::int32_t const t = a.emitted[std::int64_t(b) * width + j];
      expect(t >= -1 && t < a.vocab, at + "emitted token " + std::to_string(t) + " outside [-1, vocab)");
      expect(j <= accepted || t == -1, at + "tokens emitted after the next token");
    }
    expect(a.emitted[std::int64_t(b) * width + accepted] == a.next_token[b],
           at + "the emitted row does not end with next_token");
    if (a.request_status && a.request_status[b] != 0) {
      expect(accepted == 0 && a.next_token[b] == -1, at + "a request with status bits emitted tokens");
    }
  }
  std::vector<std::int64_t> const flagged = outputs();
  std::uint32_t const flag_status         = *a.status;
  if (verbose()) {
    std::fprintf(stderr, "verify(flag): status 0x%x (%s), accepted[0] %d\n", flag_status,
                 describe_status(flag_status).c_str(), B > 0 ? a.accepted[0] : -1);
  }
  // Bits only validation raises (p_not_normalized also comes from degenerate residuals).
  bool const invalid = (flag_status & ~std::uint32_t(verify_status::p_not_normalized)) != 0;

  poison();
  bool threw = false;
  try {
    host::verify(a, host::on_invalid_input::throw_error);
  } catch (::dhisparse::error const&) {
    threw = true;
  }
  expect(threw || !invalid, "verify(throw_error) accepted inputs that verify(flag) reports as invalid");
  expect(!threw || flag_status != 0, "verify(throw_error) refused inputs that verify(flag) accepted");
  expect(threw || outputs() == flagged, "verify(throw_error) and verify(flag) disagree on valid inputs");
}

/// Target `verify_inputs` (see the file comment).
inline void verify_inputs_target(std::uint8_t const* data, std::size_t size)
{
  input in(data, size);
  verify_params a          = decode_verify_shapes(in);
  std::uint32_t const null = in.boolean() ? in.raw<std::uint32_t>() : 0;  // bit i: pointer i is null
  verify_sizes const n(a);
  auto const sized = [&](std::int64_t count) { return std::size_t(n.fits ? count : 0); };
  verify_arrays v{buffer<std::int32_t>(sized(1)),            buffer<std::int32_t>(sized(n.batch)),
                  buffer<std::int32_t>(sized(n.tokens)),     buffer<std::int32_t>(sized(n.links)),
                  buffer<std::int32_t>(sized(n.links)),      buffer<std::int32_t>(sized(n.targets)),
                  buffer<std::int32_t>(sized(n.candidates)), buffer<float>(sized(n.p)),
                  buffer<float>(sized(n.q)),                 buffer<float>(sized(n.candidates)),
                  buffer<std::uint64_t>(2),                  buffer<std::int32_t>(sized(n.batch)),
                  buffer<std::int32_t>(sized(n.rows)),       buffer<std::int32_t>(sized(n.batch)),
                  buffer<std::int32_t>(sized(n.drafts)),     buffer<std::uint32_t>(1),
                  buffer<std::uint32_t>(sized(n.batch)),     buffer<std::uint64_t>(1)};
  int bit         = 0;
  auto const bind = [&](auto& b) { return (null >> bit++) & 1u ? nullptr : b.data(); };
  a.batch_size      = bind(v.batch_size);
  a.num_drafts      = bind(v.num_drafts);
  a.draft_tokens    = bind(v.draft_tokens);
  a.first_child     = bind(v.first_child);
  a.next_sibling    = bind(v.next_sibling);
  a.target_tokens   = bind(v.target_tokens);
  a.candidate_ids   = bind(v.candidate_ids);
  a.p               = bind(v.p);
  a.q               = bind(v.q);
  a.candidate_probs = bind(v.candidate_probs);
  a.rng             = bind(v.rng);
  a.accepted        = bind(v.accepted);
  a.emitted         = bind(v.emitted);
  a.next_token      = bind(v.next_token);
  a.accepted_nodes  = bind(v.accepted_nodes);
  a.status          = bind(v.status);
  a.request_status  = bind(v.request_status);
  a.bytes_read      = bind(v.bytes_read);
  if (!n.fits) {
    // Unusable shapes (the arrays are empty: the library must refuse them), or shapes too
    // large for the harness.
    if (verify_params_problem(a).empty()) { return; }
  } else {
    int const B = a.capacity, d = a.max_drafts, V = a.vocab;
    auto const l = detail::verify::layout::of(a);
    v.batch_size[0] = in.integer<std::int32_t>(-1, B + 1);
    for (int b = 0; b < B; ++b) {
      v.num_drafts[b] = in.integer<std::int32_t>(-1, d + 1);
      if (n.links > 0) {
        std::int64_t const row = std::int64_t(b) * (d + 1);
        fill_links(in, a, v.first_child.data() + row, v.next_sibling.data() + row);
      }
      for (int m = 0; m <= d; ++m) {
        if (n.targets > 0) { v.target_tokens[std::int64_t(b) * (d + 1) + m] = in.integer<std::int32_t>(-1, V); }
        fill_row(in, v.p.data() + b * l.p_request + m * l.p_row, V);
        if (n.q > 0 && m < l.rows_q) { fill_row(in, v.q.data() + b * l.q_request + m * l.q_row, V); }
      }
    }
    for (auto& t : {&v.draft_tokens, &v.candidate_ids}) {
      for (std::size_t i = 0; i < t->size(); ++i) { (*t)[i] = in.integer<std::int32_t>(-1, V); }
    }
    for (std::size_t i = 0; i < v.candidate_probs.size(); ++i) { v.candidate_probs[i] = in.probability(); }
    v.rng[0] = in.raw<std::uint64_t>();
    v.rng[1] = in.raw<std::uint64_t>();
  }
  check_verify(a);
}

}  // namespace dhisparse::fuzz
