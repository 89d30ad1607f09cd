/**
 * @file detail/commit/kernels.cuh
 * @brief The kernel of `commit_async`: one block per batch entry; its thread 0 decides the
 *        path to keep, each thread then commits the entry in one or more groups, and the
 *        whole block moves the draft ring's rows.
 *
 * The host reference (`host::kv_hierarchy::commit_rows`) makes the same decisions in the
 * same order per (entry, group) — unmap the step's tails, keep the path, recycle the other
 * tails in ascending query order, then the stale rows in ascending position order — so
 * that the spare stacks match.
 */
#pragma once

#include <dhisparse/commit.cuh>  // this file is included at its bottom
#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/draft_ring/kernels.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace dhisparse {
namespace detail::commit {

inline constexpr int block_size = 64;
/// Rows of a verified path: the root and at most `max_verify_drafts` drafts.
inline constexpr int max_path = max_verify_drafts + 1;

/// Whether tail entry j of an entry (`tails`) is request r's tail row of this step at
/// position len + j in `pool` (slot, owner, position and map all agree).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool own_tail(device_pool_ref const& pool, residency_map_ref const& map,
                                                     int group, std::int32_t const* tails, std::int32_t r,
                                                     std::int32_t len, int j)
{
  std::int32_t const s = tails[j];
  if (s < 0 || pool.owner[s] != r || pool.position[s] != len + j) { return false; }
  std::int32_t const* entry = map.entry(r, group, len + j);
  return entry != nullptr && *entry == s;
}

/// An empty slot of request r onto its spare stack (one thread per (request, group)).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void make_spare(device_pool_ref const& pool, std::int32_t r, std::int32_t s)
{
  pool.position[s]     = -1;
  pool.dirty[s]        = 0;
  std::int32_t const n = pool.spare_count[r];
  if (n < pool.spare_capacity) {  // always: a request never holds more than Qmax spares
    pool.spare[std::int64_t(r) * pool.spare_capacity + n] = s;
    pool.spare_count[r]                                    = n + 1;
  }
}

/// The commit of one entry in one group, by one thread (see commit.cuh). `path` is null
/// for the identity path (plain commits).
DHISPARSE_DEVICE inline void commit_group(commit_params const& p, int g, int b, std::int32_t r, std::int32_t len,
                                          std::int32_t const* path, int kept)
{
  device_pool_ref const pool = p.pools[g];
  int const Q                = p.batch.max_queries;
  std::int32_t* tails        = p.tail_slots + (std::int64_t(g) * p.batch.max_batch + b) * Q;
  // 1. Every tail row of the step leaves the map.
  for (int j = 0; j < Q; ++j) {
    if (own_tail(pool, p.map, g, tails, r, len, j)) { *p.map.entry(r, g, len + j) = not_resident; }
  }
  // 2. The path: committed rows len … len + kept − 1, dirty until backed up.
  bool relabelled = false;
  for (int k = 0; k < kept; ++k) {
    int const j             = path != nullptr ? path[k] : k;
    std::int32_t const slot = tails[j];
    tails[j]                = -1;
    pool.position[slot]     = len + k;
    *p.map.entry(r, g, len + k) = slot;
    relabelled              = relabelled || j != k;
    if (j != k) { lower_key_floor(pool, slot, 0); }  // a key that depends on the position may be lower now
    std::int32_t const at   = atomicAdd(pool.dirty_count, 1);
    if (at < pool.dirty_capacity) {
      pool.dirty_list[at] = slot;
    } else {
      atomicOr(p.status, status_dirty_list_overflow);  // stays dirty; backup scans for it
      *pool.dirty_overflow = 1;
    }
  }
  // A tree node moved to a lower position: its eviction key may now sort below the
  // request's victim cache (detail/resolve/victims.cuh), which is rebuilt on next use.
  if (relabelled && pool.cache.capacity > 0) { pool.cache.flags[r] = 0; }
  // 3. The other tail rows become spares, in query order.
  for (int j = 0; j < Q; ++j) {
    std::int32_t const slot = tails[j];
    if (slot < 0) { continue; }
    tails[j] = -1;
    if (pool.owner[slot] == r && pool.position[slot] == len + j) { make_spare(pool, r, slot); }
  }
  // 4. Rows still mapped at or beyond the new length: tails of an earlier resolve that was
  //    never committed (a second resolve of the group found them and gave no new tails).
  for (int q = kept; q < Q; ++q) {
    std::int32_t* entry = p.map.entry(r, g, len + q);
    if (entry == nullptr) { break; }
    std::int32_t const slot = *entry;
    if (slot < 0) { continue; }
    *entry = not_resident;
    make_spare(pool, r, slot);
  }
}

/// Thread 0: the rows entry b asks to keep (`path` filled for verified commits). Returns
/// their number; ORs invalid-input bits into `bits`.
DHISPARSE_DEVICE inline int wanted_rows(commit_params const& p, int b, std::int32_t nq, std::int32_t* path,
                                        std::uint32_t& bits)
{
  if (p.mode == commit_mode::abandon) { return 0; }
  if (p.mode == commit_mode::plain) {
    std::int32_t const keep = p.accepted != nullptr ? p.accepted[b] : nq;
    if (keep < 0 || keep > nq) {
      bits |= status_invalid_accept_count;
      return 0;
    }
    return keep;
  }
  verified_step const& v = p.verified;
  if (v.request_status != nullptr && v.request_status[b] != 0) { return 0; }
  if (v.emitted != nullptr && v.emitted[std::int64_t(b) * (v.max_drafts + 1)] < 0) { return 0; }
  std::int32_t const a = v.accepted[b];
  if (a < 0 || a > nq - 1 || a >= max_path || (v.accepted_nodes != nullptr && a > v.max_drafts)) {
    bits |= status_invalid_accept_count;
    return 0;
  }
  std::int32_t const* parents = p.parents + std::int64_t(b) * p.batch.max_queries;
  path[0]                     = 0;
  for (int k = 1; k <= a; ++k) {
    std::int32_t const n = v.accepted_nodes ? v.accepted_nodes[std::int64_t(b) * v.max_drafts + k - 1] : k;
    if (n <= path[k - 1] || n >= nq || parents[n] != path[k - 1]) {
      bits |= status_invalid_accept_count;
      return 0;
    }
    path[k] = n;
  }
  return a + 1;
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) commit_kernel(commit_params p)
{
  __shared__ std::int32_t path[max_path];
  __shared__ int want, kept_rows;
  __shared__ std::uint32_t bits;
  int const b = blockIdx.x;
  if (b >= *p.batch.size) { return; }
  bool const report = p.mode != commit_mode::abandon;
  std::int32_t const r   = p.batch.requests[b];
  std::int32_t const nq  = p.batch.queries[b];
  std::int32_t const len = p.batch.lengths[r];
  if (threadIdx.x == 0) {
    bits = 0;
    want = nq > 0 ? wanted_rows(p, b, nq, path, bits) : 0;
    kept_rows = want;
  }
  __syncthreads();
  if (nq == 0) {  // released mid-step: not part of the step any more
    if (report && threadIdx.x == 0) {
      if (p.committed != nullptr) { p.committed[b] = 0; }
      if (p.request_status != nullptr) { p.request_status[b] = 0; }
    }
    return;
  }
  std::int32_t const* nodes = p.mode == commit_mode::verified ? path : nullptr;
  // Kept rows: up to the first one that is not the request's tail in every group.
  for (int g = threadIdx.x; g < p.num_groups; g += BlockSize) {
    std::int32_t const* tails =
      p.tail_slots + (std::int64_t(g) * p.batch.max_batch + b) * p.batch.max_queries;
    for (int k = 0; k < want; ++k) {
      if (!own_tail(p.pools[g], p.map, g, tails, r, len, nodes ? nodes[k] : k)) {
        atomicMin(&kept_rows, k);
        break;
      }
    }
  }
  __syncthreads();
  int const kept = kept_rows;
  for (int g = threadIdx.x; g < p.num_groups; g += BlockSize) { commit_group(p, g, b, r, len, nodes, kept); }
  if (report) {
    if (p.positions != nullptr) {
      std::int64_t const row = std::int64_t(b) * p.batch.max_queries;
      for (int q = threadIdx.x; q < nq; q += BlockSize) {
        p.positions[row + q] = len + kept + (p.depths != nullptr ? p.depths[row + q] : q);
      }
    }
    if (threadIdx.x == 0) {
      std::uint32_t const raised = bits | (kept < want ? std::uint32_t(status_missing_tail) : 0u);
      p.batch.lengths[r] += kept;
      if (p.committed != nullptr) { p.committed[b] = kept; }
      if (p.request_status != nullptr) { p.request_status[b] = raised; }
      if (raised != 0) { atomicOr(p.status, raised); }
      verified_step const& v = p.verified;
      if (p.mode == commit_mode::verified && v.emitted != nullptr) {
        std::int32_t* e         = v.emitted + std::int64_t(b) * (v.max_drafts + 1);
        std::int32_t const last = kept > 0 ? e[kept - 1] : -1;
        for (int i = kept; i <= v.max_drafts; ++i) { e[i] = -1; }
        if (v.next_token != nullptr) { v.next_token[b] = last; }
      }
    }
  }
  // The draft ring follows the kept path (every thread of the block takes part).
  verified_step const& v = p.verified;
  if (p.mode == commit_mode::verified && v.ring.capacity > 0) {
    int const ri = v.ring_index != nullptr ? v.ring_index[b] : b;
    if (ri < 0 || ri >= v.ring.capacity) {
      if (threadIdx.x == 0) { atomicOr(v.ring_status, draft_ring_status::bad_request); }
      return;
    }
    __syncthreads();  // path is read below by every thread
    std::int32_t const keep    = kept > 0 ? kept - 1 : 0;
    std::uint32_t const ring_bits =
      draft_ring::keep_rows_block(v.ring, ri, nq - 1, keep, keep > 0 ? path + 1 : nullptr, nq - 1);
    if (ring_bits != 0 && threadIdx.x == 0) { atomicOr(v.ring_status, ring_bits); }
  }
}

}  // namespace detail::commit

inline std::string commit_params_problem(commit_params const& params)
{
  if (params.num_groups <= 0) { return "commit: num_groups must be positive"; }
  if (params.batch.max_batch <= 0) { return "commit: batch.max_batch must be positive"; }
  if (params.mode == commit_mode::verified) {
    std::string const problem = verified_step_problem(params.verified);
    if (!problem.empty()) { return problem; }
    if (params.parents == nullptr) { return "commit: parents is null (a verified commit reads the step's tree)"; }
  }
  return {};
}

inline cudaError_t commit_async(commit_params const& params, cudaStream_t stream)
{
  namespace cm = detail::commit;
  if (!commit_params_problem(params).empty()) { return cudaErrorInvalidValue; }
  cm::commit_kernel<cm::block_size><<<unsigned(params.batch.max_batch), cm::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
