/**
 * @file detail/hierarchy/step_kernels.cuh
 * @brief Kernels of `kv_hierarchy`'s step contract around verification: the batch read
 *        from device memory (`load_batch`), the draft tree of a step (`set_drafts`, and the
 *        chains `set_batch` sets), and a request leaving the step it is part of (`release`
 *        mid-step). The host reference mirrors them (`host::kv_hierarchy::load_batch`,
 *        `prepare_drafts`, `leave_step`).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/host_store.cuh>
#include <dhisparse/miss_plan.cuh>
#include <dhisparse/status.hpp>

#include <cstdint>

namespace dhisparse::detail::hierarchy {

/// Arguments of the load-batch kernel.
struct load_batch_params {
  std::int32_t const* source;    ///< [1 + 2 max_batch]: count, request indices, queries
  std::int32_t* batch;           ///< out [1 + 2 max_batch]: the hierarchy's batch, same layout
  std::int32_t const* admitted;  ///< [max_requests]: 1 for an admitted request index
  std::uint32_t* status;
  std::int32_t max_batch;
  std::int32_t max_queries;
  std::int32_t max_requests;
};

/// One block, a thread per batch entry: the batch of `source`, validated. A count outside
/// [0, max_batch] is clamped; an entry whose index is not an admitted request, repeats an
/// earlier entry's index, or whose queries lie outside [1, max_queries] gets 0 queries
/// (the state of an entry released mid-step: every kernel skips it) and keeps its index
/// where it is a valid one (0 otherwise), so no kernel reads out of range. Both raise
/// `status_invalid_batch`. Entries from the count to max_batch are padding (0, 0).
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) load_batch_kernel(load_batch_params p)
{
  std::int32_t const asked = p.source[0];
  std::int32_t const count = asked < 0 ? 0 : asked > p.max_batch ? p.max_batch : asked;
  bool bad                 = count != asked;
  std::int32_t const* requests_in = p.source + 1;
  std::int32_t const* queries_in  = p.source + 1 + p.max_batch;
  for (int b = threadIdx.x; b < p.max_batch; b += BlockSize) {
    std::int32_t request = 0, queries = 0;
    if (b < count) {
      std::int32_t const r  = requests_in[b];
      std::int32_t const nq = queries_in[b];
      bool const in_range   = r >= 0 && r < p.max_requests;
      bool ok               = in_range && p.admitted[r] != 0 && nq >= 1 && nq <= p.max_queries;
      for (int e = 0; ok && e < b; ++e) { ok = requests_in[e] != r; }
      request = in_range ? r : 0;
      queries = ok ? nq : 0;
      bad     = bad || !ok;
    }
    p.batch[1 + b]               = request;
    p.batch[1 + p.max_batch + b] = queries;
  }
  if (threadIdx.x == 0) { p.batch[0] = count; }
  if (bad) { atomicOr(p.status, status_invalid_batch); }
}

/// Arguments of the drafts kernel.
struct drafts_params {
  std::int32_t const* batch_size;  ///< scalar
  std::int32_t const* requests;    ///< [max_batch]
  std::int32_t* queries;           ///< [max_batch] in/out: 1 + drafts (0: left the step)
  std::int32_t const* lengths;     ///< [max_requests]
  std::int32_t const* num_drafts;  ///< [max_batch] or nullptr: keep the query counts, chains
  std::int32_t const* parents_in;  ///< [max_batch][max_queries] or nullptr (chains)
  std::int32_t* parents;           ///< out [max_batch][max_queries]: -1 = root / none
  std::int32_t* depths;            ///< out [max_batch][max_queries]
  std::int32_t* positions;         ///< out [max_batch][max_queries]: length + depth, -1 = none
  std::uint32_t* status;
  std::int32_t max_batch;
  std::int32_t max_queries;
};

/// One thread per batch entry: its query count, draft tree, depths and positions; an
/// invalid count or tree leaves it one query (no drafts) and raises
/// `status_invalid_drafts`. Entries with 0 queries (released mid-step) stay out.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) drafts_kernel(drafts_params p)
{
  int const b = blockIdx.x * BlockSize + threadIdx.x;
  if (b >= p.max_batch) { return; }
  int const Q              = p.max_queries;
  std::int64_t const row   = std::int64_t(b) * Q;
  std::int32_t* parent     = p.parents + row;
  std::int32_t* depth      = p.depths + row;
  std::int32_t* position   = p.positions + row;
  std::int32_t const batch = *p.batch_size;
  std::int32_t const nq    = b < batch ? p.queries[b] : 0;
  std::int32_t d           = nq - 1;
  bool tree                = false;
  if (nq > 0 && p.num_drafts != nullptr) {
    d        = p.num_drafts[b];
    bool bad = d < 0 || d > Q - 1;
    if (!bad && p.parents_in != nullptr) {
      for (int q = 1; q <= d; ++q) {
        std::int32_t const up = p.parents_in[row + q];
        bad                   = bad || up < 0 || up >= q;
      }
      tree = true;
    }
    if (bad) {
      atomicOr(p.status, status_invalid_drafts);
      d    = 0;
      tree = false;
    }
    p.queries[b] = 1 + d;
  }
  std::int32_t const len = nq > 0 ? p.lengths[p.requests[b]] : 0;
  for (int q = 0; q < Q; ++q) {
    if (nq == 0 || q > d) {
      parent[q]   = -1;
      depth[q]    = 0;
      position[q] = -1;
      continue;
    }
    parent[q]   = q == 0 ? -1 : tree ? p.parents_in[row + q] : q - 1;
    depth[q]    = q == 0 ? 0 : depth[parent[q]] + 1;
    position[q] = len + depth[q];
  }
}

/// Arguments of the leave-step kernels (one request leaves the step it is part of).
struct leave_step_params {
  std::int32_t const* batch_size;  ///< scalar
  std::int32_t const* requests;    ///< [max_batch]
  std::int32_t* queries;           ///< [max_batch]: 0 for the request's entry
  std::int32_t* tail_slots;        ///< [num_groups][max_batch][max_queries]
  std::int32_t* positions;         ///< [max_batch][max_queries]
  std::int32_t num_groups;
  std::int32_t max_batch;
  std::int32_t max_queries;
  std::int32_t request;
  miss_plan_ref plans[2];          ///< the miss plans of both group parities
  host_store_ref host;             ///< to recognise the request's host rows
};

/// One block: the request's batch entry gets 0 queries, its tail entries -1 (its slots are
/// released right after), its positions -1.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) leave_batch_kernel(leave_step_params p)
{
  std::int32_t const batch = *p.batch_size;
  int const Q              = p.max_queries;
  for (int b = 0; b < batch; ++b) {
    if (p.requests[b] != p.request) { continue; }
    if (threadIdx.x == 0) { p.queries[b] = 0; }
    for (int i = threadIdx.x; i < p.num_groups * Q; i += BlockSize) {
      p.tail_slots[(std::int64_t(i / Q) * p.max_batch + b) * Q + i % Q] = -1;
    }
    for (int q = threadIdx.x; q < Q; q += BlockSize) { p.positions[std::int64_t(b) * Q + q] = -1; }
  }
}

/// Grid-stride over both plans: entries that copy one of the request's host rows are
/// emptied (retrieve skips a null source), so that a retrieve after the release never
/// writes into slots the release handed back.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) leave_plans_kernel(leave_step_params p)
{
  std::int64_t const stride = std::int64_t(gridDim.x) * BlockSize;
  for (int parity = 0; parity < 2; ++parity) {
    miss_plan_ref const plan = p.plans[parity];
    std::int64_t const n     = min(*plan.count, plan.capacity);
    for (std::int64_t i = std::int64_t(blockIdx.x) * BlockSize + threadIdx.x; i < n; i += stride) {
      miss_entry& e = plan.entries[i];
      if (e.src == nullptr || e.position < 0) { continue; }
      std::int32_t const page_index = e.position >> p.host.page_shift;
      if (page_index >= p.host.max_pages_per_request) { continue; }
      std::int32_t const page =
        p.host.page_table[std::int64_t(p.request) * p.host.max_pages_per_request + page_index];
      if (page >= 0 && e.src >= p.host.base &&
          std::size_t(e.src - p.host.base) / p.host.page_bytes == std::size_t(page)) {
        e.src = nullptr;
      }
    }
  }
}

}  // namespace dhisparse::detail::hierarchy
