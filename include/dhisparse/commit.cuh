/**
 * @file commit.cuh
 * @brief After the model wrote (and, when speculating, verification judged) the tail rows
 *        of a step: the kept tail rows become committed, the others are recycled.
 *
 * Batch entry b (request r, committed length n, Q_b tail rows: row j written by query j at
 * slot `tail_slots[g][b][j]`, mapped at position n + j during the step) keeps a *path* of
 * its tail rows:
 * - `commit_mode::plain`: rows 0 … a−1 with a = `accepted[b]` (all Q_b when `accepted` is
 *   null, as in plain decoding); a outside [0, Q_b] keeps nothing and raises
 *   `status_invalid_accept_count`;
 * - `commit_mode::verified`: the root (row 0) and the accepted drafts of verification in
 *   path order (`verified_step`: a = accepted drafts, nodes = accepted_nodes or 1 … a);
 *   a outside [0, Q_b − 1], or nodes that are not a path of the step's draft tree
 *   (`parents`), keep nothing and raise `status_invalid_accept_count`; an entry that
 *   verification refused (non-zero request status, or -1 as first emitted token) keeps
 *   nothing;
 * - `commit_mode::abandon`: nothing, and lengths, outputs and statuses are left alone (what
 *   `set_batch` does to a step left open).
 * The path is cut at its first row that is not the request's tail row in every group (a
 * tail refused by resolve for capacity, budget or pool, or no resolve since the last
 * commit); the cut raises `status_missing_tail`. The c rows kept become the committed
 * positions n … n + c − 1 in path order — a tree node at a deeper index moves to the
 * position of its depth (metadata only: the slot is relabelled, no byte moves) — stay
 * dirty (never evicted) and join the dirty list until `backup` copied them; every other
 * tail row of the step, and any row still mapped at or beyond n + c (the tail of an
 * earlier resolve that was never committed), is unmapped and becomes a spare slot of the
 * request. The length grows by c. Entries with 0 queries (a request released mid-step)
 * are skipped.
 *
 * Per entry: `committed[b]` = c (the request's new tokens: with verify, `emitted[b][0 … c)`
 * — the outputs are cut to them, and `next_token[b]` becomes the last of them) and
 * `request_status[b]` = the bits raised for it. With a draft ring, its rows follow the
 * kept path (`draft_ring_keep_async`, in the same launch). One kernel for all groups and
 * entries; tail slot entries are consumed (set to -1). Stream-ordered, no host sync,
 * capturable.
 */
#pragma once

#include <dhisparse/verified_step.hpp>
#include <dhisparse/detail/config.hpp>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/step_batch.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace dhisparse {

/// What a commit keeps (see the file comment).
enum class commit_mode : std::int32_t {
  plain,     ///< `accepted[b]` tail rows (all when null)
  verified,  ///< the root and the accepted path of `verified_step`
  abandon,   ///< nothing; lengths, outputs and statuses untouched
};

/// Arguments of one commit. Grid-invariant, passed by value.
struct commit_params {
  step_batch_ref batch;
  std::int32_t const* accepted;   ///< plain: [max_batch] tail rows kept per entry; nullptr = all
  device_pool_ref const* pools;   ///< [num_groups] in device memory
  std::int32_t* tail_slots;       ///< [num_groups][max_batch][max_queries], consumed
  residency_map_ref map;
  std::int32_t num_groups;
  std::uint32_t* status;          ///< status word, OR-ed into
  commit_mode mode;               ///< plain (the zero value), verified or abandon
  verified_step verified;         ///< mode verified: verify's outputs and the optional ring
  std::int32_t const* parents;    ///< verified: [max_batch][max_queries] the step's draft tree
  std::int32_t const* depths;     ///< optional [max_batch][max_queries]: depth of each query …
  std::int32_t* positions;        ///< … and its position, refreshed to new length + depth
  std::int32_t* committed;        ///< optional out [max_batch]: tail rows kept
  std::uint32_t* request_status;  ///< optional out [max_batch]: the bits raised per entry
};

/// Enqueues the commit of a step on `stream`. Returns `cudaErrorInvalidValue` (nothing
/// enqueued) when `commit_params_problem` reports a problem, else the launch status.
cudaError_t commit_async(commit_params const& params, cudaStream_t stream);

/// The arguments `commit_async` checks (shapes; a verified commit: `verified_step_problem`
/// and the step's tree): a message naming the first bad one, or empty.
std::string commit_params_problem(commit_params const& params);

}  // namespace dhisparse

#include <dhisparse/detail/commit/kernels.cuh>
