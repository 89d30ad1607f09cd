/**
 * @file verify_params.hpp
 * @brief The arguments of speculative verification and their checks, shared by the CUDA
 *        kernels (`dhisparse/verify.cuh`) and the host reference (`dhisparse/host/verify.hpp`),
 *        so it is plain C++. Its status bits, `verify_status`, are in status.hpp.
 *
 * The types are public (namespace `dhisparse`); they live here so that the plain-C++ host
 * reference can use them without including a `.cuh` header.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/verify/fixed_point.hpp>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace dhisparse {

/// Most draft tokens (chain) or draft nodes (tree) one request can carry.
inline constexpr int max_verify_drafts = 256;
/// Most candidate slots per row for `draft_distribution::candidates`.
inline constexpr int max_verify_candidates = 128;
/// CTAs of the thread-block cluster that shares one request's row passes on sm_90 and later.
inline constexpr int verify_cluster_ctas = 8;

/// How a draft is judged.
enum class verify_rule : std::int32_t {
  greedy,    ///< accept while the draft equals the target's argmax
  sampling,  ///< lossless speculative sampling: accept x with probability min(1, p(x)/q(x))
};

/// Shape of a draft.
enum class draft_topology : std::int32_t {
  chain,  ///< d tokens in a row (block drafters, MTP heads)
  tree,   ///< EAGLE-style token tree in first-child / next-sibling form
};

/// What the verifier knows of the distribution each draft token was drawn from.
enum class draft_distribution : std::int32_t {
  one_hot,     ///< nothing: the draft is deterministic (q = 1 at the drafted token)
  dense,       ///< a full distribution q over the vocabulary per drafting position
  candidates,  ///< per drafting position a list of candidate ids and probabilities (DFlash2)
};

/**
 * @brief Everything one verification call reads and writes. Device pointers for
 *        `verify_async`, host pointers for `host::verify`.
 *
 * Node numbering (both topologies): node 0 is the root (the last committed token), nodes
 * 1..n are the drafts. Chain: node i is draft token i-1 and its parent is node i-1. Row r
 * of `p` is the target's distribution of the token that follows node r (chain: position
 * r); row r of `q` / the candidate lists is the distribution node r's children were drawn
 * from. Shapes below use B = capacity, d = max_drafts, V = vocab, K = num_candidates,
 * rows_q = d (chain) or d + 1 (tree).
 */
struct verify_params {
  verify_rule rule                = verify_rule::greedy;
  draft_topology topology         = draft_topology::chain;
  draft_distribution distribution = draft_distribution::dense;  ///< sampling only

  int capacity       = 0;  ///< B: rows of every per-request array (the padded batch)
  int max_drafts     = 0;  ///< d: chain tokens / tree nodes (root excluded), ≤ max_verify_drafts
  int vocab          = 0;  ///< V
  int num_candidates = 0;  ///< K (candidates only), ≤ max_verify_candidates

  std::int32_t const* batch_size = nullptr;  ///< [1] real batch; requests ≥ it are padding. nullptr: B
  std::int32_t const* num_drafts = nullptr;  ///< [B] drafts / nodes to verify, in [0, d]. nullptr: d

  std::int32_t const* draft_tokens = nullptr;  ///< chain [B][d]; tree [B][d+1] (entry 0 ignored)
  std::int32_t const* first_child  = nullptr;  ///< tree [B][d+1]: -1 or a node index > this node's
  std::int32_t const* next_sibling = nullptr;  ///< tree [B][d+1]: -1 or a node index > this node's

  float const* p                 = nullptr;  ///< [B][d+1][V] target probabilities (greedy: or logits)
  std::int64_t p_request_stride  = 0;        ///< elements between requests; 0: (d+1)·V
  std::int64_t p_row_stride      = 0;        ///< elements between rows; 0: V
  std::int32_t const* target_tokens = nullptr;  ///< greedy, instead of p: [B][d+1] argmax per row

  float const* q                        = nullptr;  ///< dense: [B][rows_q][V]
  std::int64_t q_request_stride         = 0;        ///< 0: rows_q·V
  std::int64_t q_row_stride             = 0;        ///< 0: V
  std::int32_t const* candidate_ids     = nullptr;  ///< candidates: [B][rows_q][K], -1 = empty slot
  float const* candidate_probs          = nullptr;  ///< candidates: [B][rows_q][K]

  std::uint64_t const* rng = nullptr;  ///< sampling: [2] {seed, offset}, read at run time

  float sum_tolerance = 1e-3f;  ///< allowed |Σ − 1| of a p / q row read in full
  bool validate_all   = false;  ///< also read and check every row a request could use

  /// CTAs per request (CUDA only; the outputs are the same for every choice): 0 = the
  /// launcher's choice (the wide greedy path where a `workspace` is given and a greedy rule
  /// reads p; else a cluster of `verify_cluster_ctas` where the device and the build
  /// support clusters and a greedy rule reads full rows, else 1); 1 = one CTA walks each request;
  /// `verify_cluster_ctas` = a cluster splits each row pass (`verify_async` returns
  /// `cudaErrorNotSupported` where clusters are not available).
  int ctas_per_request = 0;

  /// Optional caller-owned device scratch, 16-byte aligned, of `workspace_bytes` ≥
  /// `verify_workspace_bytes(*this)` bytes. With it, greedy verification from p (no
  /// `target_tokens`, no `validate_all`) and `ctas_per_request` = 0 runs the wide greedy
  /// path: the rows of every request at one depth of its accepted path are argmaxed
  /// together by the whole GPU, one launch per depth (docs/verify.md); the outputs are the
  /// same. Sampling calls with one CTA per request may use it to share a request's later
  /// row passes with the CTAs that have finished theirs (detail/verify/tuning.hpp; off in
  /// `verify_async` until measured); other calls ignore it. Nothing needs initializing (the
  /// call resets what it uses, so a captured graph replays as is); one call at a time may
  /// use it.
  void* workspace             = nullptr;
  std::size_t workspace_bytes = 0;  ///< size of `workspace`

  std::int32_t* accepted        = nullptr;  ///< [B] number of accepted drafts
  std::int32_t* emitted         = nullptr;  ///< [B][d+1] accepted drafts, then the target's token, then -1
  std::int32_t* next_token      = nullptr;  ///< [B] the token after the accepted drafts (correction or bonus)
  std::int32_t* accepted_nodes  = nullptr;  ///< optional [B][d]: node index of each accepted draft, -1 after
  std::uint32_t* status         = nullptr;  ///< [1] OR of the `verify_status` bits of this call (cleared by the call)
  std::uint32_t* request_status = nullptr;  ///< optional [B] `verify_status` bits per request
  std::uint64_t* bytes_read     = nullptr;  ///< optional [1]: += bytes of p / q / candidate rows read in full
};

namespace detail::verify {

/// True when `capacity` × `rows` × `stride` elements (every offset a call computes from
/// these, `layout::of`'s default strides included) fit `std::int64_t`. Checked by division,
/// so the check itself cannot overflow; `capacity`, `rows` and `stride` are non-negative.
inline bool extent_fits(std::int64_t capacity, std::int64_t rows, std::int64_t stride)
{
  std::int64_t const most = std::numeric_limits<std::int64_t>::max();
  std::int64_t const n    = std::max<std::int64_t>(capacity, 1) * std::max<std::int64_t>(rows, 1);  // < 2^40
  return stride <= most / n;
}

/// Most groups a shared row pass is cut into (`pass_tuning::share_groups`,
/// detail/verify/shared_pass.cuh).
inline constexpr int max_share_groups = 64;

/**
 * @brief Where the arrays of the wide greedy path and of shared row passes lie in
 *        `verify_params::workspace`: byte offsets from its start. The wide path (greedy,
 *        detail/verify/wide.cuh) keeps two of each per-row array — depth L uses set L mod 2
 *        while depth L + 1's rows are appended to the other; shared passes (sampling,
 *        detail/verify/shared_pass.cuh) keep per request a pass descriptor, its chunk masses
 *        and one partial sum per group, and a control block the launch clears.
 */
struct workspace_layout {
  std::size_t keys;      ///< u64 [2][capacity]: packed argmax of each row of a depth so far
  std::size_t progress;  ///< u64 [2][capacity]: chunks of the row done (low half), with NaN (high half)
  std::size_t entries;   ///< int32 pairs [2][capacity]: (request, node) of each row of a depth
  std::size_t counts;    ///< int32 [max_drafts + 1]: rows of depth L (L ≥ 1)
  std::size_t control;   ///< u32: started, finished, pad, pad, claim [capacity], done [capacity], open bits
  std::size_t control_bytes;  ///< bytes of `control` (cleared by each launch that shares passes)
  std::size_t descs;     ///< per request: int32 {row, k, dense, pad}, then u64 masses [max_drafts + 1]
  std::size_t chunks;    ///< u64 [capacity][nchunks]: chunk masses of a request's shared pass
  std::size_t partials;  ///< `share_partial` [capacity][max_share_groups]
  std::size_t bytes;     ///< total, a multiple of 16

  /// Bytes of one request's descriptor (16-byte multiple).
  DHISPARSE_HOST_DEVICE static std::size_t desc_bytes(int max_drafts)
  {
    return (16 + 8 * (std::size_t(max_drafts > 0 ? max_drafts : 0) + 1) + 15) / 16 * 16;
  }
  /// Bytes of one group's partial sums (`share_partial`).
  static constexpr std::size_t partial_bytes = 48;

  /// The wide path's arrays for `capacity` and `max_drafts`; with `sampling`, the shared
  /// passes' arrays for a vocabulary of `vocab` tokens after them.
  DHISPARSE_HOST_DEVICE static workspace_layout of(int capacity, int max_drafts, std::int64_t vocab = 0,
                                                   bool sampling = false)
  {
    std::size_t const cap  = std::size_t(capacity > 0 ? capacity : 0);
    std::size_t const rows = 2 * cap;
    auto const align16     = [](std::size_t n) { return (n + 15) / 16 * 16; };
    workspace_layout w{};
    w.keys     = 0;
    w.progress = w.keys + 8 * rows;
    w.entries  = w.progress + 8 * rows;
    w.counts   = w.entries + 8 * rows;
    w.control  = align16(w.counts + 4 * (std::size_t(max_drafts > 0 ? max_drafts : 0) + 1));
    if (!sampling || vocab <= 0) {
      w.descs = w.chunks = w.partials = w.bytes = w.control;
      w.control_bytes                         = 0;
      return w;
    }
    std::size_t const nchunks = std::size_t(chunk_count(vocab));
    w.control_bytes           = align16(4 * (4 + 2 * cap + (cap + 31) / 32));
    w.descs                   = w.control + w.control_bytes;
    w.chunks                  = w.descs + cap * desc_bytes(max_drafts);
    w.partials                = align16(w.chunks + 8 * cap * nchunks);
    w.bytes                   = w.partials + cap * max_share_groups * partial_bytes;
    return w;
  }
};

}  // namespace detail::verify

/**
 * @brief Bytes of device scratch for these shapes (`verify_params::workspace`). Greedy
 *        rules (the wide path): 48 per request of `capacity`, plus 4 per draft. Sampling
 *        rules also get room for shared row passes: per request a descriptor (16 + 8 per
 *        node), 8 bytes per vocabulary chunk and 3 KB of group sums (≈ 5.5 KB per request at
 *        V = 151 552, d = 8). It depends on `rule`, `capacity`, `max_drafts` and `vocab`,
 *        so one allocation serves every call of those sizes.
 */
inline std::size_t verify_workspace_bytes(verify_params const& a)
{
  return detail::verify::workspace_layout::of(a.capacity, a.max_drafts, a.vocab, a.rule == verify_rule::sampling)
    .bytes;
}

/**
 * @brief Checks the host-visible arguments (shapes, pointers, strides, tolerance) of a
 *        verification call; returns a message naming the first bad argument, or an empty
 *        string. Per-request data (token ids, probabilities, counts) is checked by the
 *        kernel and reported through `status`.
 */
inline std::string verify_params_problem(verify_params const& a)
{
  bool const tree     = a.topology == draft_topology::tree;
  bool const sampling = a.rule == verify_rule::sampling;
  auto bad            = [](char const* what) { return std::string("verify: ") + what; };
  if (a.rule != verify_rule::greedy && !sampling) { return bad("rule is not a verify_rule"); }
  if (!tree && a.topology != draft_topology::chain) { return bad("topology is not a draft_topology"); }
  if (a.capacity < 0) { return bad("capacity is negative"); }
  if (a.max_drafts < 0 || a.max_drafts > max_verify_drafts) {
    return bad("max_drafts is outside [0, max_verify_drafts = 256]");
  }
  if (a.vocab <= 0) { return bad("vocab must be positive"); }
  if (a.max_drafts > 0 && a.draft_tokens == nullptr) { return bad("draft_tokens is null"); }
  if (tree && (a.first_child == nullptr || a.next_sibling == nullptr)) {
    return bad("first_child / next_sibling are null for a tree");
  }
  if (a.p == nullptr && !(a.rule == verify_rule::greedy && a.target_tokens != nullptr)) {
    return bad("p is null (greedy verification needs p or target_tokens)");
  }
  std::int64_t const rows_p = std::int64_t(a.max_drafts) + 1;
  std::int64_t const rows_q = tree ? rows_p : a.max_drafts;
  if (a.p_row_stride < 0 || (a.p_row_stride > 0 && a.p_row_stride < a.vocab)) {
    return bad("p_row_stride is smaller than vocab");
  }
  std::int64_t const p_row = a.p_row_stride ? a.p_row_stride : a.vocab;
  if (!detail::verify::extent_fits(a.capacity, rows_p, p_row)) {
    return bad("p_row_stride is too large: capacity × (max_drafts + 1) rows overflow 64-bit offsets");
  }
  if (a.p_request_stride < 0 || (a.p_request_stride > 0 && a.p_request_stride < rows_p * p_row)) {
    return bad("p_request_stride is smaller than (max_drafts + 1) rows");
  }
  if (!detail::verify::extent_fits(a.capacity, 1, a.p_request_stride)) {
    return bad("p_request_stride is too large: capacity requests overflow 64-bit offsets");
  }
  if (sampling) {
    if (a.rng == nullptr) { return bad("rng is null (sampling needs {seed, offset} in device memory)"); }
    if (a.distribution == draft_distribution::dense) {
      if (a.q == nullptr && rows_q > 0) { return bad("q is null for dense draft distributions"); }
      if (a.q_row_stride < 0 || (a.q_row_stride > 0 && a.q_row_stride < a.vocab)) {
        return bad("q_row_stride is smaller than vocab");
      }
      std::int64_t const q_row = a.q_row_stride ? a.q_row_stride : a.vocab;
      if (!detail::verify::extent_fits(a.capacity, rows_q, q_row)) {
        return bad("q_row_stride is too large: capacity × the rows of q overflow 64-bit offsets");
      }
      if (a.q_request_stride < 0 || (a.q_request_stride > 0 && a.q_request_stride < rows_q * q_row)) {
        return bad("q_request_stride is smaller than the rows of q");
      }
      if (!detail::verify::extent_fits(a.capacity, 1, a.q_request_stride)) {
        return bad("q_request_stride is too large: capacity requests overflow 64-bit offsets");
      }
    } else if (a.distribution == draft_distribution::candidates) {
      if (a.num_candidates <= 0 || a.num_candidates > max_verify_candidates) {
        return bad("num_candidates is outside [1, max_verify_candidates = 128]");
      }
      if (rows_q > 0 && (a.candidate_ids == nullptr || a.candidate_probs == nullptr)) {
        return bad("candidate_ids / candidate_probs are null");
      }
    } else if (a.distribution != draft_distribution::one_hot) {
      return bad("distribution is not a draft_distribution");
    }
    if (!(a.sum_tolerance >= 0.f && a.sum_tolerance < 1.f)) {
      return bad("sum_tolerance must be in [0, 1)");
    }
  }
  if (a.accepted == nullptr || a.emitted == nullptr || a.next_token == nullptr) {
    return bad("accepted / emitted / next_token are null");
  }
  if (a.status == nullptr) { return bad("status is null"); }
  if (a.ctas_per_request != 0 && a.ctas_per_request != 1 && a.ctas_per_request != verify_cluster_ctas) {
    return bad("ctas_per_request is not 0, 1 or verify_cluster_ctas = 8");
  }
  if (a.workspace != nullptr) {
    if (reinterpret_cast<std::uintptr_t>(a.workspace) % 16 != 0) { return bad("workspace is not 16-byte aligned"); }
    if (a.workspace_bytes < verify_workspace_bytes(a)) {
      return bad("workspace_bytes is smaller than verify_workspace_bytes(params)");
    }
  }
  return {};
}

namespace detail::verify {

/// Resolved addressing of one call (strides filled in), shared by kernel and reference.
struct layout {
  std::int64_t p_request, p_row, q_request, q_row, rows_q;
  int row_tokens;  ///< entries per request of draft_tokens (chain d, tree d+1)

  DHISPARSE_HOST_DEVICE static layout of(verify_params const& a)
  {
    layout l{};
    bool const tree = a.topology == draft_topology::tree;
    l.rows_q        = tree ? std::int64_t(a.max_drafts) + 1 : a.max_drafts;
    l.p_row         = a.p_row_stride ? a.p_row_stride : a.vocab;
    l.p_request     = a.p_request_stride ? a.p_request_stride : (std::int64_t(a.max_drafts) + 1) * l.p_row;
    l.q_row         = a.q_row_stride ? a.q_row_stride : a.vocab;
    l.q_request     = a.q_request_stride ? a.q_request_stride : l.rows_q * l.q_row;
    l.row_tokens    = tree ? a.max_drafts + 1 : a.max_drafts;
    return l;
  }
};

/// Status bits of one probability read as part of p (`is_q` false) or q.
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE std::uint32_t probability_flags(float x, bool is_q)
{
  std::uint32_t f = 0;
  if (!(x - x == 0.f)) {  // NaN or ±inf
    f = verify_status::p_not_finite;
  } else if (x < 0.f) {
    f = verify_status::p_negative;
  } else if (x > 1.f) {
    f = verify_status::p_not_normalized;
  }
  return is_q ? f << 3 : f;  // the q_* bits are the p_* bits shifted by 3
}
static_assert(verify_status::q_not_finite == verify_status::p_not_finite << 3 &&
              verify_status::q_negative == verify_status::p_negative << 3 &&
              verify_status::q_not_normalized == verify_status::p_not_normalized << 3);

/// True when a row's fixed-point mass is 1 within `tolerance` (computed identically on
/// host and device: uint64 → double rounds to nearest on both).
DHISPARSE_HOST_DEVICE DHISPARSE_FORCEINLINE bool mass_is_one(std::uint64_t mass, float tolerance)
{
  double const m = double(mass) * 0x1p-62;
  return m - 1.0 <= double(tolerance) && 1.0 - m <= double(tolerance);
}

}  // namespace detail::verify
}  // namespace dhisparse
