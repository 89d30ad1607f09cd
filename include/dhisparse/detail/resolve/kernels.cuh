/**
 * @file detail/resolve/kernels.cuh
 * @brief Kernels of `resolve_async` (see resolve.cuh for the contract).
 *
 * Four launches with fixed shapes:
 * - `begin`:    advance the group's epoch, reset the plan;
 * - `lookup`:   one thread per selection entry: validate, hit → pin, miss → claim (the
 *               claiming entry records the position);
 * - `allocate`: one block per request: compact its claims in entry order, free-pool pops,
 *               radix selection of the victims (8 passes of 8 bits over the 64-bit
 *               internal key), assignment, plan;
 * - `tables`:   one thread per selection entry: the slot table.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/status.hpp>

#include <cub/block/block_scan.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dhisparse {
namespace detail::resolve {

/// Map entry of a missed position claimed by a query during `lookup`.
inline constexpr std::int32_t claimed = -2;

inline constexpr int block_size = 256;

/// Scratch of one resolve, carved from the caller's workspace.
struct workspace_view {
  /// [max_batch][max_queries][top_k]: the position where this entry claimed a miss,
  /// else -1; compacted in place (in entry order) by `allocate`.
  std::int32_t* miss_positions;
  std::int32_t* victims;         ///< [max_batch][miss_capacity + max_queries]
  std::uint64_t* keys;           ///< [max_batch][max_owned] eviction keys (~0 = not eligible)
  std::int32_t miss_capacity;    ///< max_queries × top_k
};

inline std::size_t align_up(std::size_t v) { return (v + 255) & ~std::size_t{255}; }

inline workspace_view carve(void* workspace, int max_batch, int max_queries, int top_k,
                            int max_owned, std::size_t* bytes = nullptr)
{
  std::size_t const cap = std::size_t(max_queries) * top_k;
  std::size_t offset    = 0;
  auto take             = [&](std::size_t n) {
    std::size_t const at = offset;
    offset += align_up(n);
    return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(workspace) + at);
  };
  workspace_view v{};
  v.miss_positions = reinterpret_cast<std::int32_t*>(take(max_batch * cap * sizeof(std::int32_t)));
  v.victims = reinterpret_cast<std::int32_t*>(take(max_batch * (cap + max_queries) * sizeof(std::int32_t)));
  v.keys    = reinterpret_cast<std::uint64_t*>(take(std::size_t(max_batch) * max_owned * sizeof(std::uint64_t)));
  v.miss_capacity = std::int32_t(cap);
  if (bytes != nullptr) { *bytes = offset; }
  return v;
}

/// The selection rule of resolve.cuh: in range for its query, above its predecessor.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE bool valid_selection(std::int32_t const* query, int k,
                                                            std::int32_t p, std::int32_t limit)
{
  if (p < 0 || p > limit) { return false; }
  if (k == 0) { return true; }
  std::int32_t const prev = query[k - 1];
  return prev >= 0 && prev < p;
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  begin_kernel(resolve_params p)
{
  if (threadIdx.x == 0) {
    *p.pool.epoch += 1;
    *p.plan.count = 0;
  }
}

template <class Eviction, int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  lookup_kernel(resolve_params p, workspace_view w)
{
  std::int64_t const idx = std::int64_t(blockIdx.x) * BlockSize + threadIdx.x;
  std::int64_t const per_b = std::int64_t(p.batch.max_queries) * p.top_k;
  int const b              = int(idx / per_b);
  if (b >= *p.batch.size) { return; }
  w.miss_positions[idx] = -1;
  int const q = int((idx % per_b) / p.top_k);
  int const k = int(idx % p.top_k);
  if (q >= p.batch.queries[b]) { return; }
  std::int32_t const* query = p.selections + idx - k;
  std::int32_t const pos    = query[k];
  if (pos == -1) { return; }
  std::int32_t const r   = p.batch.requests[b];
  std::int32_t const len = p.batch.lengths[r];
  if (!valid_selection(query, k, pos, len + q)) {
    atomicOr(p.status, status_invalid_selection);
    return;
  }
  if (pos >= len) { return; }  // a tail row of this step: allocated with the tails
  std::int32_t* entry = p.map.entry(r, p.group, pos);
  if (entry == nullptr) {
    atomicOr(p.status, status_capacity_exceeded);
    return;
  }
  std::int32_t const slot = *reinterpret_cast<std::int32_t volatile*>(entry);
  std::uint32_t const epoch = *p.pool.epoch;
  if (slot >= 0) {
    // Pin for this step; the first query to touch the slot updates the policy state.
    if (atomicExch(p.pool.touched + slot, epoch) != epoch) {
      p.pool.policy_state[slot] = Eviction::on_hit(p.pool.policy_state[slot], epoch);
    }
  } else if (atomicCAS(entry, not_resident, claimed) == not_resident) {
    w.miss_positions[idx] = pos;
  }
}

/// Internal eviction key: empty owned slots first (by list index), then the policy's key.
template <class Eviction>
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE std::uint64_t internal_key(device_pool_ref const& pool,
                                                                  std::int32_t slot, int index,
                                                                  std::uint32_t epoch)
{
  if (pool.touched[slot] == epoch || pool.dirty[slot] != 0) { return ~std::uint64_t{0}; }
  std::int32_t const pos = pool.position[slot];
  if (pos < 0) { return std::uint64_t(index); }
  return (std::uint64_t{1} << 63) | Eviction::eviction_key(pool.policy_state[slot], pos);
}

/**
 * Selects the `count` smallest keys of `keys[0, n)` (all distinct; ~0 = not eligible) and
 * writes the slots they belong to into `out`. Returns how many were written (fewer than
 * `count` only when fewer are eligible). Block-wide; every thread gets the result.
 */
template <int BlockSize>
DHISPARSE_DEVICE int select_smallest(std::uint64_t const* keys, std::int32_t const* slots, int n,
                                     int count, std::int32_t* out)
{
  __shared__ unsigned hist[256];
  __shared__ std::uint64_t prefix;
  __shared__ int remaining;
  __shared__ int written;
  __shared__ int eligible;
  if (threadIdx.x == 0) {
    prefix    = 0;
    remaining = count;
    written   = 0;
    eligible  = 0;
  }
  __syncthreads();
  int mine = 0;
  for (int i = threadIdx.x; i < n; i += BlockSize) { mine += keys[i] != ~std::uint64_t{0}; }
  atomicAdd(&eligible, mine);
  __syncthreads();
  std::uint64_t threshold = ~std::uint64_t{0} - 1;  // all eligible keys
  if (eligible > count) {
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += BlockSize) { hist[i] = 0; }
      __syncthreads();
      std::uint64_t const high = shift == 56 ? 0 : ~std::uint64_t{0} << (shift + 8);
      std::uint64_t const want = prefix;
      for (int i = threadIdx.x; i < n; i += BlockSize) {
        std::uint64_t const key = keys[i];
        if (key != ~std::uint64_t{0} && (key & high) == want) {
          atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned acc = 0;
        for (int d = 0; d < 256; ++d) {
          if (acc + hist[d] >= unsigned(remaining)) {
            prefix |= std::uint64_t(d) << shift;
            remaining -= int(acc);
            break;
          }
          acc += hist[d];
        }
      }
      __syncthreads();
    }
    threshold = prefix;
  }
  for (int i = threadIdx.x; i < n; i += BlockSize) {
    std::uint64_t const key = keys[i];
    if (key != ~std::uint64_t{0} && key <= threshold) { out[atomicAdd(&written, 1)] = slots[i]; }
  }
  __syncthreads();
  return written;
}

/// In-place, order-preserving compaction of the non-negative values of `list[0, n)`;
/// returns their number. Block-wide.
template <int BlockSize>
DHISPARSE_DEVICE int compact_claims(std::int32_t* list, int n)
{
  using scan = cub::BlockScan<int, BlockSize>;
  __shared__ typename scan::TempStorage temp;
  int written = 0;
  for (int base = 0; base < n; base += BlockSize) {
    int const i           = base + int(threadIdx.x);
    std::int32_t const v  = i < n ? list[i] : -1;
    int offset = 0, total = 0;
    scan(temp).ExclusiveSum(v >= 0 ? 1 : 0, offset, total);
    __syncthreads();  // the chunk is read (and temp reusable) before anything is written
    if (v >= 0) { list[written + offset] = v; }  // never beyond i: only earlier slots
    written += total;
  }
  return written;
}

template <class Eviction, int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  allocate_kernel(resolve_params p, workspace_view w)
{
  int const b = blockIdx.x;
  if (b >= *p.batch.size) { return; }
  auto& pool                = p.pool;
  std::int32_t const r      = p.batch.requests[b];
  std::int32_t const nq     = p.batch.queries[b];
  std::int32_t const len    = p.batch.lengths[r];
  std::uint32_t const epoch = *pool.epoch;
  std::int32_t* owned       = pool.owned + std::int64_t(r) * pool.max_owned;
  std::int32_t const owned_n = pool.owned_count[r];
  std::int32_t* const victims = w.victims + std::int64_t(b) * (w.miss_capacity + p.batch.max_queries);
  std::int32_t* const miss_pos = w.miss_positions + std::int64_t(b) * w.miss_capacity;
  // Compact the claimed positions in entry order (for one query: ascending positions, so
  // the plan walks each request's host pages in address order, and the assignment is
  // deterministic).
  std::int32_t const misses = compact_claims<BlockSize>(miss_pos, nq * p.top_k);

  __shared__ int tails;      // tail rows with capacity (a prefix of the Q tails)
  __shared__ int popped;     // slots taken from the free stack
  __shared__ int pop_base;   // their place in the free stack
  __shared__ int plan_base;  // first plan entry of this request
  if (threadIdx.x == 0) {
    int t = 0;
    while (t < nq) {
      std::int32_t const* entry = p.map.entry(r, p.group, len + t);
      if (len + t >= p.batch.capacities[r] || entry == nullptr ||
          p.host.group_row(r, len + t, p.layout) == nullptr) {
        atomicOr(p.status, status_capacity_exceeded);
        break;
      }
      if (*entry != not_resident) {  // an earlier resolve's tail was never committed
        atomicOr(p.status, status_uncommitted_tail);
        break;
      }
      ++t;
    }
    tails          = t;
    int const need = misses + t;
    int const want = min(need, max(0, p.slot_budget - owned_n));
    int cur        = *reinterpret_cast<int volatile*>(pool.free_count);
    int take       = 0;
    while (true) {
      take = min(want, cur);
      if (take == 0) { break; }
      int const prev = atomicCAS(pool.free_count, cur, cur - take);
      if (prev == cur) { break; }
      cur = prev;
    }
    if (take < want) { atomicOr(p.status, status_pool_exhausted); }
    popped   = take;
    pop_base = cur - take;
  }
  __syncthreads();
  int const need  = misses + tails;
  int const evict = need - popped;
  int evicted     = 0;
  if (evict > 0) {
    std::uint64_t* keys = w.keys + std::int64_t(b) * pool.max_owned;
    for (int i = threadIdx.x; i < owned_n; i += BlockSize) {
      keys[i] = internal_key<Eviction>(pool, owned[i], i, epoch);
    }
    __syncthreads();
    evicted = select_smallest<BlockSize>(keys, owned, owned_n, evict, victims);
    if (evicted < evict && threadIdx.x == 0) { atomicOr(p.status, status_budget_exceeded); }
  }
  int const total    = popped + evicted;
  int const assigned_misses = max(0, total - tails);
  if (threadIdx.x == 0) {
    plan_base = assigned_misses > 0 ? atomicAdd(p.plan.count, assigned_misses) : 0;
    if (total < tails) { atomicOr(p.status, status_budget_exceeded); }
  }
  __syncthreads();

  for (int i = threadIdx.x; i < total; i += BlockSize) {
    bool const from_stack  = i < popped;
    std::int32_t const slot = from_stack ? pool.free_stack[pop_base + i] : victims[i - popped];
    if (from_stack) {
      owned[owned_n + i] = slot;
      pool.owner[slot]   = r;
    } else if (pool.position[slot] >= 0) {
      *p.map.entry(r, p.group, pool.position[slot]) = not_resident;  // evicted
    }
    bool const tail         = i < tails;
    std::int32_t const pos  = tail ? len + i : miss_pos[i - tails];
    pool.position[slot]     = pos;
    pool.policy_state[slot] = Eviction::on_insert(epoch);
    pool.touched[slot]      = epoch;
    pool.dirty[slot]        = tail ? 1u : 0u;
    *p.map.entry(r, p.group, pos) = slot;
    if (tail) {
      p.tail_slots[std::int64_t(b) * p.batch.max_queries + i] = slot;
    } else {
      p.plan.entries[plan_base + (i - tails)] =
        miss_entry{p.host.group_row(r, pos, p.layout), slot, pos};
    }
  }
  // Tails left without a slot, and unused tail entries.
  for (int j = threadIdx.x; j < p.batch.max_queries; j += BlockSize) {
    if (j >= min(tails, total)) { p.tail_slots[std::int64_t(b) * p.batch.max_queries + j] = -1; }
  }
  // Misses left without a slot go back to "not resident".
  for (int m = assigned_misses + threadIdx.x; m < misses; m += BlockSize) {
    *p.map.entry(r, p.group, miss_pos[m]) = not_resident;
  }
  if (threadIdx.x == 0) { pool.owned_count[r] = owned_n + popped; }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) tables_kernel(resolve_params p)
{
  std::int64_t const idx   = std::int64_t(blockIdx.x) * BlockSize + threadIdx.x;
  std::int64_t const per_b = std::int64_t(p.batch.max_queries) * p.top_k;
  if (idx >= per_b * p.batch.max_batch) { return; }
  int const b   = int(idx / per_b);
  int const q   = int((idx % per_b) / p.top_k);
  int const k   = int(idx % p.top_k);
  std::int32_t slot = -1;
  if (b < *p.batch.size && q < p.batch.queries[b]) {
    std::int32_t const* query = p.selections + idx - k;
    std::int32_t const pos    = query[k];
    std::int32_t const r      = p.batch.requests[b];
    if (pos != -1 && valid_selection(query, k, pos, p.batch.lengths[r] + q)) {
      std::int32_t const* entry = p.map.entry(r, p.group, pos);
      if (entry != nullptr) { slot = *entry; }
    }
  }
  p.slot_table[idx] = slot;
}

}  // namespace detail::resolve

inline std::size_t resolve_workspace_size(int max_batch, int max_queries, int top_k, int max_owned)
{
  std::size_t bytes = 0;
  detail::resolve::carve(nullptr, max_batch, max_queries, top_k, max_owned, &bytes);
  return bytes;
}

template <class Eviction>
cudaError_t resolve_async(resolve_params const& params, void* workspace,
                          std::size_t workspace_bytes, cudaStream_t stream)
{
  static_assert(is_eviction_policy_v<Eviction>,
                "Eviction must provide on_insert, on_hit and eviction_key (see policy/lru.cuh)");
  namespace rd = detail::resolve;
  if (params.top_k <= 0 || params.batch.max_batch <= 0 || params.batch.max_queries <= 0 ||
      workspace_bytes < resolve_workspace_size(params.batch.max_batch, params.batch.max_queries,
                                               params.top_k, params.pool.max_owned) ||
      params.plan.capacity < params.batch.max_batch * params.batch.max_queries * params.top_k) {
    return cudaErrorInvalidValue;
  }
  auto const w = rd::carve(workspace, params.batch.max_batch, params.batch.max_queries,
                           params.top_k, params.pool.max_owned);
  std::int64_t const entries = std::int64_t(params.batch.max_batch) * params.batch.max_queries * params.top_k;
  unsigned const grid        = unsigned((entries + rd::block_size - 1) / rd::block_size);
  rd::begin_kernel<32><<<1, 32, 0, stream>>>(params);
  rd::lookup_kernel<Eviction, rd::block_size><<<grid, rd::block_size, 0, stream>>>(params, w);
  rd::allocate_kernel<Eviction, rd::block_size>
    <<<params.batch.max_batch, rd::block_size, 0, stream>>>(params, w);
  rd::tables_kernel<rd::block_size><<<grid, rd::block_size, 0, stream>>>(params);
  return detail::check_launch(stream);
}

}  // namespace dhisparse
