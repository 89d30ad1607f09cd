/**
 * @file status.hpp
 * @brief The library's status word: kernels never trap on bad input, they treat the bad
 *        entry as empty and set a bit that the host can read. One 32-bit layout for every
 *        component, each owning a range of bits, so one word can collect the bits of all
 *        of them and one reader, `describe_status`, names every bit set (plain C++).
 *
 * | bits   | component                                  | mask                     | constants |
 * |--------|--------------------------------------------|--------------------------|-----------|
 * | 0..9   | hierarchy: resolve, commit, set_drafts, load_batch | `status_mask_hierarchy` | `status_invalid_selection` … `status_invalid_batch` |
 * | 10     | sparse attention                           | `status_mask_attention`  | `sparse_attention::status_invalid_slot` |
 * | 11..16 | draft ring                                 | `status_mask_draft_ring` | `draft_ring_status::…` |
 * | 17..29 | speculative verification                   | `status_mask_verify`     | `verify_status::…` |
 * | 30..31 | no component (`describe_status`: unknown)  |                          | |
 *
 * The words in device memory: `kv_hierarchy::status()` collects the hierarchy's bits, and
 * also attention's and the draft ring's where `sparse_attention::params::status` or
 * `verified_step::ring_status` point to it; `kv_hierarchy::commit_status()` holds the
 * hierarchy bits of the last commit per batch entry; `draft_ring::status()` the ring's;
 * `verify_params::status` / `request_status` verification's (each verify call clears its
 * `status` word: give it a word of its own, its bits then OR into any other word without
 * colliding).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dhisparse {

namespace detail {
/// The bits `count` (< 32) bits wide from bit `first`: a component's range of the word.
constexpr std::uint32_t status_range(unsigned first, unsigned count) noexcept
{
  return ((1u << count) - 1u) << first;
}
}  // namespace detail

/// Bits 0..9: the hierarchy (`status_bit`).
inline constexpr std::uint32_t status_mask_hierarchy = detail::status_range(0, 10);
/// Bit 10: sparse attention (`sparse_attention::status_invalid_slot`).
inline constexpr std::uint32_t status_mask_attention = detail::status_range(10, 1);
/// Bits 11..16: the draft ring (`draft_ring_status`).
inline constexpr std::uint32_t status_mask_draft_ring = detail::status_range(11, 6);
/// Bits 17..29: speculative verification (`verify_status`).
inline constexpr std::uint32_t status_mask_verify = detail::status_range(17, 13);
/// Every bit some component owns (bits 30 and 31 are nobody's).
inline constexpr std::uint32_t status_mask_all =
  status_mask_hierarchy | status_mask_attention | status_mask_draft_ring | status_mask_verify;

static_assert((status_mask_hierarchy & status_mask_attention) == 0 &&
                (status_mask_hierarchy & status_mask_draft_ring) == 0 &&
                (status_mask_hierarchy & status_mask_verify) == 0 &&
                (status_mask_attention & status_mask_draft_ring) == 0 &&
                (status_mask_attention & status_mask_verify) == 0 &&
                (status_mask_draft_ring & status_mask_verify) == 0,
              "status.hpp: the components' bit ranges overlap");

/// Bits of the hierarchy (`kv_hierarchy` and the host reference), bits 0..9.
enum status_bit : std::uint32_t {
  /// A selection entry was out of range (negative other than -1, or beyond the causal
  /// limit of its query); it was treated as empty. (Order, duplicates and -1 padding
  /// anywhere are valid.)
  status_invalid_selection = 1u << 0,
  /// A request needed more slots than its budget allows even after evicting every
  /// evictable slot; the rows left without a slot appear as -1 in the slot table.
  status_budget_exceeded = 1u << 1,
  /// The device pool had no free slot where the budget allowed one.
  status_pool_exhausted = 1u << 2,
  /// A tail position lies beyond the capacity reserved for its request (`reserve`).
  status_capacity_exceeded = 1u << 3,
  /// More rows were committed than the dirty list holds between two backups; the extra
  /// rows stay resident and dirty (never evicted) until the next backup finds them with a
  /// scan of the pool.
  status_dirty_list_overflow = 1u << 4,
  /// An accepted count passed to `commit` was outside [0, queries of the request], or one
  /// passed to `commit_verified` outside [0, drafts of the request], or its accepted nodes
  /// do not form a path of the step's draft tree; the request's tail was rejected entirely.
  status_invalid_accept_count = 1u << 5,
  /// resolve found a tail position still held by the tail of an earlier resolve that was
  /// never committed (every resolve of a group must be followed by one `commit`); the
  /// request got no new tail rows.
  status_uncommitted_tail = 1u << 6,
  /// `commit` / `commit_verified` reached a tail row to keep that has no slot in some group
  /// (resolve refused it for capacity, budget or pool, or the group was not resolved since
  /// the last commit): the request was committed up to that row and not beyond.
  status_missing_tail = 1u << 7,
  /// `set_drafts` found a draft count outside [0, max_queries − 1] or a parent link that
  /// does not point to an earlier query of the request; that request drafts nothing this
  /// step (one query).
  status_invalid_drafts = 1u << 8,
  /// `load_batch` found a count outside [0, max_batch] (clamped) or an entry whose request
  /// index is not an admitted request, repeats an earlier entry's, or whose query count is
  /// outside [1, max_queries]; that entry takes no part in the step (0 queries).
  status_invalid_batch = 1u << 9,
};

namespace sparse_attention {
/// Bit 10: a selection entry is neither -1 nor a slot id in `[0, num_slots)`; attention
/// treated it as empty.
inline constexpr std::uint32_t status_invalid_slot = 1u << 10;
}  // namespace sparse_attention

/// Bits of a draft ring's operations (bits 11..16); each names the argument at fault.
struct draft_ring_status {
  enum : std::uint32_t {
    ok                   = 0,
    bad_batch_size       = 1u << 11,  ///< `*batch_size` outside [0, capacity] (clamped)
    bad_count            = 1u << 12,  ///< a count outside [0, max_count], or a rollback before position 0 (skipped)
    rollback_past_window = 1u << 13,  ///< a rollback longer than the rows held: older rows were already overwritten
    bad_request          = 1u << 14,  ///< a reset names a request outside [0, capacity) (skipped)
    bad_start            = 1u << 15,  ///< a reset to a negative start position (skipped)
    bad_path             = 1u << 16,  ///< a keep's nodes are not increasing within [1, drafted], or
                                      ///< are more than their row holds (skipped)
  };
};

/**
 * @brief Bits of verification (bits 17..29), in the call's status word and per request.
 *        Each names the argument at fault.
 *
 * A request whose status is non-zero gets empty outputs (accepted 0, emitted and
 * next_token -1); other requests are unaffected.
 */
struct verify_status {
  enum : std::uint32_t {
    ok               = 0,
    bad_batch_size   = 1u << 17,  ///< `*batch_size` outside [0, capacity] (clamped)
    bad_num_drafts   = 1u << 18,  ///< `num_drafts[b]` outside [0, max_drafts]
    bad_draft_token  = 1u << 19,  ///< a draft token outside [0, vocab)
    bad_tree         = 1u << 20,  ///< links that do not form a forward tree
    bad_candidates   = 1u << 21,  ///< a candidate id outside [0, vocab) or repeated in a row
    p_not_finite     = 1u << 22,  ///< NaN or ±inf in p (greedy: NaN only)
    p_negative       = 1u << 23,  ///< a negative target probability
    p_not_normalized = 1u << 24,  ///< p > 1, or a row read in full sums to 1 ± more than tolerance
    q_not_finite     = 1u << 25,  ///< NaN or ±inf in q or candidate_probs
    q_negative       = 1u << 26,  ///< a negative draft probability
    q_not_normalized = 1u << 27,  ///< q > 1, or a q / candidate row sums to 1 ± more than tolerance
    draft_not_in_q   = 1u << 28,  ///< a draft token the drafter gave probability 0 (or no candidate slot)
    bad_target_token = 1u << 29,  ///< a `target_tokens` entry outside [0, vocab)
  };
};

namespace detail {

/// One bit of the status word: its name and what it means, naming the argument at fault.
struct status_bit_text {
  std::uint32_t bit;
  char const* name;
  char const* meaning;
};

/// Every bit a component owns, grouped by component in bit order.
inline constexpr status_bit_text status_bit_texts[] = {
  {status_invalid_selection, "invalid_selection",
   "selections: an entry is negative other than -1 or beyond its query's causal limit"},
  {status_budget_exceeded, "budget_exceeded",
   "a request needed more slots than its budget allows; rows without a slot are -1 in the slot table"},
  {status_pool_exhausted, "pool_exhausted", "the device pool had no free slot where the budget allowed one"},
  {status_capacity_exceeded, "capacity_exceeded", "a tail position lies beyond its request's capacity (reserve)"},
  {status_dirty_list_overflow, "dirty_list_overflow",
   "more rows were committed than the dirty list holds between two backups (they stay dirty until a backup)"},
  {status_invalid_accept_count, "invalid_accept_count",
   "accepted: a count outside [0, queries] (commit) or [0, drafts] (commit_verified), or accepted nodes that "
   "are not a path of the draft tree"},
  {status_uncommitted_tail, "uncommitted_tail",
   "resolve found the tail of an earlier resolve that was never committed"},
  {status_missing_tail, "missing_tail",
   "commit reached a row to keep without a slot in some group; the request was committed up to it"},
  {status_invalid_drafts, "invalid_drafts",
   "num_drafts / parents: a count outside [0, max_queries - 1] or a parent that is not an earlier query"},
  {status_invalid_batch, "invalid_batch",
   "load_batch: a count outside [0, max_batch], or an entry with a request index not admitted, repeated, or "
   "queries outside [1, max_queries]"},
  {sparse_attention::status_invalid_slot, "attention.invalid_slot",
   "slots: a selection entry is neither -1 nor a slot id in [0, num_slots)"},
  {draft_ring_status::bad_batch_size, "draft_ring.bad_batch_size", "batch_size: *batch_size is outside [0, capacity]"},
  {draft_ring_status::bad_count, "draft_ring.bad_count",
   "counts: a count is outside [0, max_count] (rollback: drafted < accepted, or before position 0)"},
  {draft_ring_status::rollback_past_window, "draft_ring.rollback_past_window",
   "drafted/accepted: a rollback removed more rows than the ring held (older rows were overwritten)"},
  {draft_ring_status::bad_request, "draft_ring.bad_request",
   "requests / ring_index: a request index is outside [0, capacity)"},
  {draft_ring_status::bad_start, "draft_ring.bad_start", "start: a negative start position"},
  {draft_ring_status::bad_path, "draft_ring.bad_path",
   "nodes: the kept nodes are not increasing within [1, drafted], or exceed their row"},
  {verify_status::bad_batch_size, "verify.bad_batch_size", "batch_size: *batch_size is outside [0, capacity]"},
  {verify_status::bad_num_drafts, "verify.bad_num_drafts", "num_drafts: a request's count is outside [0, max_drafts]"},
  {verify_status::bad_draft_token, "verify.bad_draft_token", "draft_tokens: a token id is outside [0, vocab)"},
  {verify_status::bad_tree, "verify.bad_tree",
   "first_child/next_sibling: links do not form a tree (each link must point to a higher node index in "
   "[1, max_drafts], every node linked exactly once)"},
  {verify_status::bad_candidates, "verify.bad_candidates",
   "candidate_ids: an id is outside [0, vocab) or repeated within a row"},
  {verify_status::p_not_finite, "verify.p_not_finite", "p: a NaN or infinite value"},
  {verify_status::p_negative, "verify.p_negative", "p: a negative probability"},
  {verify_status::p_not_normalized, "verify.p_not_normalized",
   "p: a probability above 1 or a row whose sum differs from 1 by more than sum_tolerance"},
  {verify_status::q_not_finite, "verify.q_not_finite", "q/candidate_probs: a NaN or infinite value"},
  {verify_status::q_negative, "verify.q_negative", "q/candidate_probs: a negative probability"},
  {verify_status::q_not_normalized, "verify.q_not_normalized",
   "q/candidate_probs: a probability above 1 or a row whose sum differs from 1 by more than sum_tolerance"},
  {verify_status::draft_not_in_q, "verify.draft_not_in_q",
   "draft_tokens: a draft token has draft probability 0 (candidates: no candidate slot)"},
  {verify_status::bad_target_token, "verify.bad_target_token", "target_tokens: a token id is outside [0, vocab)"},
};

/// The OR of the bits in the table (checked against the masks below).
constexpr std::uint32_t status_bits_named() noexcept
{
  std::uint32_t all = 0;
  for (auto const& e : status_bit_texts) { all |= e.bit; }
  return all;
}

/// Whether every bit of the table is one bit, inside `status_mask_all`, and named once.
constexpr bool status_bit_texts_valid() noexcept
{
  std::uint32_t seen = 0;
  for (auto const& e : status_bit_texts) {
    if (e.bit == 0 || (e.bit & (e.bit - 1)) != 0 || (e.bit & ~status_mask_all) != 0 || (seen & e.bit) != 0) {
      return false;
    }
    seen |= e.bit;
  }
  return true;
}
static_assert(status_bit_texts_valid(), "status.hpp: a status bit is not a single owned bit, or named twice");
static_assert((status_bits_named() & status_mask_hierarchy) == status_mask_hierarchy &&
                (status_bits_named() & status_mask_attention) == status_mask_attention &&
                (status_bits_named() & status_mask_draft_ring) == status_mask_draft_ring &&
                (status_bits_named() & status_mask_verify) == status_mask_verify,
              "status.hpp: a component's bit has no name in status_bit_texts");

}  // namespace detail

/// How much `describe_status` says of each bit.
enum class status_format {
  names,      ///< `invalid_selection|verify.bad_tree` (tables, logs)
  explained,  ///< `invalid_selection (selections: …); verify.bad_tree (first_child/…)` (exceptions)
};

/**
 * @brief The one reader of status words: names every bit set in `bits`, of every
 *        component (non-hierarchy bits prefixed by their component: `attention.`,
 *        `draft_ring.`, `verify.`), and `unknown` for set bits no component owns.
 * @param bits a status word, or the OR of several
 * @param format names only (joined by `|`), or each name with what it means, naming the
 *        argument at fault (joined by `; `)
 * @return "ok" when no bit is set
 */
inline std::string describe_status(std::uint32_t bits, status_format format = status_format::names)
{
  if (bits == 0) { return "ok"; }
  bool const explained  = format == status_format::explained;
  char const* separator = explained ? "; " : "|";
  std::string out;
  for (auto const& e : detail::status_bit_texts) {
    if ((bits & e.bit) == 0) { continue; }
    out += (out.empty() ? "" : separator) + std::string(e.name);
    if (explained) { out += std::string(" (") + e.meaning + ")"; }
  }
  if (bits & ~detail::status_bits_named()) {
    out += (out.empty() ? "" : separator) + std::string("unknown");
    if (explained) { out += " (bits no component owns)"; }
  }
  return out;
}

namespace detail {
/// What the per-component readers said: the component's bits explained, "" for none.
inline std::string describe_component_status(std::uint32_t bits, std::uint32_t mask)
{
  return (bits & mask) == 0 ? std::string() : describe_status(bits & mask, status_format::explained);
}
}  // namespace detail

/// Deprecated: `describe_status(bits, status_format::explained)` of the verify bits ("" for none).
[[deprecated("use describe_status(bits, status_format::explained)")]] inline std::string
describe_verify_status(std::uint32_t bits)
{
  return detail::describe_component_status(bits, status_mask_verify);
}

/// Deprecated: `describe_status(bits, status_format::explained)` of the ring's bits ("" for none).
[[deprecated("use describe_status(bits, status_format::explained)")]] inline std::string
describe_draft_ring_status(std::uint32_t bits)
{
  return detail::describe_component_status(bits, status_mask_draft_ring);
}

}  // namespace dhisparse
