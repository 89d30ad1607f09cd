/**
 * @file verified_step.hpp
 * @brief What `kv_hierarchy::commit_verified` (and its host reference) reads of a
 *        verification: verify's outputs, unchanged, plus an optional draft ring to keep in
 *        step. Plain C++, so that the host reference can use it; the type is public
 *        (namespace `dhisparse`).
 */
#pragma once

#include <dhisparse/draft_ring_ref.hpp>
#include <dhisparse/verify_params.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse {

/**
 * @brief The outputs of one `verify_async` (or `host::verify`) call as `commit_verified`
 *        consumes them, directly on the device: batch entry b of the hierarchy is request b
 *        of the verification. Device pointers for `kv_hierarchy`, host pointers for
 *        `host::kv_hierarchy`.
 *
 * Node numbering is verify's: query 0 of a batch entry is the root (the request's last
 * token, whose row sits at the committed length), query j ≥ 1 is draft node j. The rows
 * kept are the root's and those of the accepted nodes, in path order, compacted onto the
 * positions length, length + 1, …; everything else of the step is recycled.
 */
struct verified_step {
  /// [max_batch] accepted drafts per entry (`verify_params::accepted`). Required.
  std::int32_t const* accepted = nullptr;
  /// [max_batch][max_drafts] node index of each accepted draft, in path order
  /// (`verify_params::accepted_nodes`); nullptr: a chain (nodes 1, 2, …).
  std::int32_t const* accepted_nodes = nullptr;
  /// Row length of `accepted_nodes` (verify's `max_drafts`); `emitted` rows hold
  /// max_drafts + 1 tokens. Needed with `accepted_nodes` or `emitted`.
  int max_drafts = 0;
  /// In/out, optional: [max_batch][max_drafts + 1] verify's emitted tokens. An entry whose
  /// first token is -1 (verification refused the request) commits nothing; after the call
  /// each row holds exactly the tokens whose rows were committed (the request's new
  /// tokens: append them to its output), then -1.
  std::int32_t* emitted = nullptr;
  /// In/out, optional (needs `emitted`): [max_batch] verify's next token; after the call
  /// the request's new last token (the last token of its `emitted` row), or -1 when
  /// nothing was committed (the last token is unchanged).
  std::int32_t* next_token = nullptr;
  /// Optional: [max_batch] verify's per-request status (`verify_params::request_status`);
  /// an entry with a non-zero status commits nothing.
  std::uint32_t const* request_status = nullptr;

  /// Optional draft ring kept in step (capacity 0: none). The drafter advanced it by one
  /// row per draft node of this step (row j of the step ↔ node j + 1); the commit keeps
  /// the rows of the committed nodes, compacted in path order, and rolls back the rest
  /// (`draft_ring_keep_async`).
  draft_ring_ref ring{};
  /// Optional: [max_batch] the ring index of each batch entry; nullptr: the batch entry
  /// itself. `kv_hierarchy::batch_ref().requests` keeps one ring slot per admitted request.
  std::int32_t const* ring_index = nullptr;
  /// With a ring: its status word (`draft_ring_status` bits are ORed in). May be the
  /// hierarchy's own word (`kv_hierarchy::status()`): the ring's bits (11..16) are apart
  /// from the hierarchy's (status.hpp).
  std::uint32_t* ring_status = nullptr;

  /// The fields verify wrote, taken from its arguments (`accepted`, `accepted_nodes`,
  /// `max_drafts`, `emitted`, `next_token`, `request_status`).
  static verified_step from(verify_params const& v)
  {
    verified_step s;
    s.accepted       = v.accepted;
    s.accepted_nodes = v.accepted_nodes;
    s.max_drafts     = v.max_drafts;
    s.emitted        = v.emitted;
    s.next_token     = v.next_token;
    s.request_status = v.request_status;
    return s;
  }
};
static_assert(std::is_trivially_copyable_v<verified_step>);

/// Host-side checks of a `verified_step` (what `commit_verified` and `commit_async` check
/// before enqueuing anything): a message naming the first bad field, or empty.
inline std::string verified_step_problem(verified_step const& v)
{
  if (v.accepted == nullptr) { return "commit_verified: accepted is null"; }
  if ((v.accepted_nodes != nullptr || v.emitted != nullptr) &&
      (v.max_drafts < 0 || v.max_drafts > max_verify_drafts)) {
    return "commit_verified: max_drafts (" + std::to_string(v.max_drafts) +
           ") must be in [0, max_verify_drafts] with accepted_nodes or emitted";
  }
  if (v.next_token != nullptr && v.emitted == nullptr) {
    return "commit_verified: next_token needs emitted (the new last token is read from it)";
  }
  if (v.ring.capacity > 0) {
    if (v.ring.data == nullptr || v.ring.end == nullptr || v.ring.length == nullptr) {
      return "commit_verified: ring data / end / length are null";
    }
    if (v.ring_status == nullptr) { return "commit_verified: ring_status is null (a ring is given)"; }
  } else if (v.ring.capacity < 0) {
    return "commit_verified: ring capacity is negative";
  }
  return {};
}

}  // namespace dhisparse
