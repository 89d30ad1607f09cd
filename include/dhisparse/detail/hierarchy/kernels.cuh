/**
 * @file detail/hierarchy/kernels.cuh
 * @brief Kernels of `kv_hierarchy`'s host-side operations between steps: `release` (a
 *        request's slots back to the free pool, its map cleared), `set_pool_limit` (rows
 *        above a new limit moved down on the device, the free stack rebuilt) and `prewarm`
 *        (free slots filled with a request's rows by one address-ordered gather).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/warp_copy.cuh>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/host_store.cuh>
#include <dhisparse/miss_plan.cuh>
#include <dhisparse/reclaim.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/resolve.cuh>

#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace dhisparse::detail::hierarchy {

inline constexpr int block_size = 256;

/// Resets one slot to free and empty (the caller pushes it or rebuilds the stack).
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void clear_slot(device_pool_ref const& pool, std::int32_t slot)
{
  pool.owner[slot]    = -1;
  pool.position[slot] = -1;
  pool.state[slot]    = free_slot_state;
  pool.touched[slot]  = 0;
  pool.dirty[slot]    = 0;
}

/// Per-request lists back to empty.
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void clear_request(device_pool_ref const& pool, std::int32_t request)
{
  pool.owned_count[request] = 0;
  pool.spare_count[request] = 0;
  pool.hand[request]        = 0;
  if (pool.cache.capacity > 0) {
    pool.cache.flags[request] = 0;
    pool.cache.head[request]  = 0;
    pool.cache.count[request] = 0;
  }
}

/// One block per group: drop the request's slots from the dirty list (a later backup must
/// never write through a slot that now belongs to another request).
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  scrub_dirty_kernel(device_pool_ref const* pools, std::int32_t request)
{
  device_pool_ref const pool = pools[blockIdx.x];
  std::int32_t const n       = min(*pool.dirty_count, pool.dirty_capacity);
  for (int i = threadIdx.x; i < n; i += BlockSize) {
    std::int32_t const slot = pool.dirty_list[i];
    if (slot >= 0 && pool.owner[slot] == request) { pool.dirty_list[i] = -1; }
  }
}

/// Per-request budgets, one block per group: every slot on the request's owned list back
/// onto the free stack.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  release_owned_kernel(device_pool_ref const* pools, std::int32_t request)
{
  device_pool_ref const pool = pools[blockIdx.x];
  std::int32_t const n       = pool.owned_count[request];
  std::int32_t const base    = *pool.free_count;
  std::int32_t const* owned  = pool.owned + std::int64_t(request) * pool.max_owned;
  for (int i = threadIdx.x; i < n; i += BlockSize) {
    std::int32_t const slot   = owned[i];
    clear_slot(pool, slot);
    pool.free_stack[base + i] = slot;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *pool.free_count = base + n;
    clear_request(pool, request);
  }
}

/// Shared budgets (no owned lists), grid (blocks, groups): every slot the request owns,
/// found by a scan of the pool, back onto the free stack.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  release_scan_kernel(device_pool_ref const* pools, std::int32_t request)
{
  device_pool_ref const pool = pools[blockIdx.y];
  std::int32_t const limit   = *pool.limit;
  std::int64_t const threads = std::int64_t(gridDim.x) * BlockSize;
  for (std::int64_t base = std::int64_t(blockIdx.x) * BlockSize; base < limit; base += threads) {
    std::int32_t const slot = std::int32_t(base + threadIdx.x);
    bool const mine         = slot < limit && pool.owner[slot] == request;
    int const at            = reclaim::warp_append(pool.free_count, mine);
    if (mine) {
      clear_slot(pool, slot);
      pool.free_stack[at] = slot;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) { clear_request(pool, request); }
}

/// One block per directory entry of the request: reset its map page to "not resident".
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) clear_map_kernel(residency_map_ref map, std::int32_t request)
{
  std::int32_t const page =
    map.directory[std::int64_t(request) * map.max_pages_per_request + blockIdx.x];
  if (page < 0) { return; }
  std::int64_t const per_page = std::int64_t(map.num_groups) << map.page_shift;
  std::int32_t* entries       = map.pages + std::int64_t(page) * per_page;
  for (std::int64_t i = threadIdx.x; i < per_page; i += BlockSize) { entries[i] = not_resident; }
}

// ---------------------------------------------------------------------------------------
// Pool limit.
// ---------------------------------------------------------------------------------------

/// The free stack rebuilt from the unowned slots below `limit` (the count was zeroed).
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) rebuild_free_kernel(device_pool_ref pool, std::int32_t limit)
{
  std::int64_t const threads = std::int64_t(gridDim.x) * BlockSize;
  for (std::int64_t base = std::int64_t(blockIdx.x) * BlockSize; base < limit; base += threads) {
    std::int32_t const slot = std::int32_t(base + threadIdx.x);
    bool const free         = slot < limit && pool.owner[slot] < 0;
    int const at            = reclaim::warp_append(pool.free_count, free);
    if (free) { pool.free_stack[at] = slot; }
  }
}

/// Owned slots in [limit, old_limit) move to free slots below `limit` (one warp per slot):
/// row bytes, metadata and map entry; `moved[s - limit]` records the new slot.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  move_down_kernel(device_pool_ref pool, residency_map_ref map, std::int32_t group, std::int32_t limit,
                   std::int32_t old_limit, std::int32_t* moved)
{
  int const lane  = threadIdx.x & 31;
  int const warps = BlockSize / 32;
  for (std::int32_t s = limit + blockIdx.x * warps + threadIdx.x / 32; s < old_limit; s += gridDim.x * warps) {
    std::int32_t const owner = pool.owner[s];
    if (owner < 0) {
      if (lane == 0) { moved[s - limit] = -1; }
      continue;
    }
    std::int32_t to = 0;
    if (lane == 0) { to = pool.free_stack[atomicSub(pool.free_count, 1) - 1]; }
    to = __shfl_sync(0xFFFFFFFFu, to, 0);
    warp_copy(reinterpret_cast<int4*>(pool.slab + std::size_t(to) * pool.group_row_bytes),
              reinterpret_cast<int4 const*>(pool.slab + std::size_t(s) * pool.group_row_bytes),
              int(pool.group_row_bytes / 16), lane);
    if (lane == 0) {
      std::int32_t const pos = pool.position[s];
      pool.owner[to]         = owner;
      pool.position[to]      = pos;
      pool.state[to]         = pool.state[s];
      lower_key_floor(pool, to, pool.key_floor[s >> key_floor_shift]);  // a bound of the row's key
      pool.touched[to]       = pool.touched[s];
      pool.dirty[to]         = 0;  // the caller backed everything up first
      if (pos >= 0) { *map.entry(owner, group, pos) = to; }
      clear_slot(pool, s);
      moved[s - limit] = to;
    }
  }
}

/// One block per request: its owned list and spare stack follow the moved slots; its
/// victim cache is invalidated (slot ids changed).
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  renumber_lists_kernel(device_pool_ref pool, std::int32_t limit, std::int32_t const* moved)
{
  std::int32_t const r = blockIdx.x;
  auto const renumber  = [&](std::int32_t* list, std::int32_t n) {
    for (int i = threadIdx.x; i < n; i += BlockSize) {
      if (list[i] >= limit) { list[i] = moved[list[i] - limit]; }
    }
  };
  if (pool.owned != nullptr) { renumber(pool.owned + std::int64_t(r) * pool.max_owned, pool.owned_count[r]); }
  renumber(pool.spare + std::int64_t(r) * pool.spare_capacity, pool.spare_count[r]);
  if (threadIdx.x == 0 && pool.cache.capacity > 0) { pool.cache.flags[r] = 0; }
}

/// The limit rises: slots [old_limit, limit) join the free stack.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  grow_pool_kernel(device_pool_ref pool, std::int32_t old_limit, std::int32_t limit)
{
  std::int32_t const base = *pool.free_count;
  std::int64_t const i    = std::int64_t(blockIdx.x) * BlockSize + threadIdx.x;
  if (i < limit - old_limit) { pool.free_stack[base + i] = std::int32_t(old_limit + i); }
}

template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize)
  set_limit_kernel(device_pool_ref pool, std::int32_t old_limit, std::int32_t limit)
{
  if (threadIdx.x == 0) {
    if (limit > old_limit) { *pool.free_count += limit - old_limit; }
    *pool.limit = limit;
  }
}

// ---------------------------------------------------------------------------------------
// Prewarm.
// ---------------------------------------------------------------------------------------

/// Arguments of one prewarm launch: one request, one group, one chunk of a position range.
struct prewarm_params {
  device_pool_ref pool;
  residency_map_ref map;
  host_store_ref host;
  group_layout layout;
  std::int32_t group;
  std::int32_t request;
  std::int32_t first;            ///< first position, or -1: the last `count` committed ones
  std::int32_t count;            ///< positions in the range
  std::int32_t chunk;            ///< this launch covers chunk `chunk` counted from the top
  std::int32_t const* lengths;   ///< [max_requests]
  std::int32_t const* caps;      ///< [max_requests]
  bool per_request;              ///< cap the request at caps[request]
  std::int32_t reserve;          ///< free slots to leave (shared budgets: the low watermark)
  miss_plan_ref plan;            ///< out: the rows to copy; capacity = the chunk length
};

/**
 * One block: the committed rows of its chunk of the range that are not resident, the most
 * recent first as far as free slots allow (up to the cap, leaving `reserve` free), get
 * slots (no eviction); their plan entries come out in ascending position order.
 */
template <class Eviction, int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) prewarm_kernel(prewarm_params p)
{
  using scan = cub::BlockScan<int, BlockSize>;
  __shared__ typename scan::TempStorage temp;
  __shared__ int allowed, chosen, cut, popped, top;
  auto const& pool        = p.pool;
  std::int32_t const r    = p.request;
  std::int32_t const len  = p.lengths[r];
  std::int32_t const lo   = p.first >= 0 ? p.first : max(0, len - p.count);
  std::int32_t const hi   = p.first >= 0 ? std::int32_t(min(std::int64_t(len), std::int64_t(p.first) + p.count)) : len;
  std::int32_t const end  = hi - p.chunk * p.plan.capacity;
  std::int32_t const first = max(lo, end - p.plan.capacity);
  if (threadIdx.x == 0) {
    int room = max(0, *pool.free_count - p.reserve);
    if (p.per_request) { room = min(room, max(0, p.caps[r] - pool.owned_count[r])); }
    allowed = end > first ? room : 0;
    chosen  = 0;
    cut     = first;
    *p.plan.count = 0;
  }
  __syncthreads();
  // Walk down from the end: the most recent missing rows first, until `allowed` are chosen.
  for (std::int32_t top_pos = end; top_pos > first && chosen < allowed; top_pos -= BlockSize) {
    std::int32_t const pos = top_pos - 1 - std::int32_t(threadIdx.x);
    bool const missing     = pos >= first && *p.map.entry(r, p.group, pos) == not_resident;
    int rank = 0, total = 0;
    scan(temp).ExclusiveSum(int(missing), rank, total);
    int const before = chosen;
    __syncthreads();
    if (missing && before + rank == allowed - 1) { cut = pos; }  // the last one that fits
    if (threadIdx.x == 0) {
      chosen = min(allowed, before + total);
      if (before + total < allowed) { cut = max(first, top_pos - BlockSize); }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) { popped = resolve::pop_free(pool, chosen, top); }
  __syncthreads();
  // Assign in ascending order over [cut, end).
  std::uint32_t const epoch = *pool.epoch;
  int assigned              = 0;
  for (std::int32_t base = cut; base < end && assigned < popped; base += BlockSize) {
    std::int32_t const pos = base + std::int32_t(threadIdx.x);
    std::int32_t* entry    = pos < end ? p.map.entry(r, p.group, pos) : nullptr;
    bool const missing     = entry != nullptr && *entry == not_resident;
    int rank = 0, total = 0;
    scan(temp).ExclusiveSum(int(missing), rank, total);
    if (missing && assigned + rank < popped) {
      int const i             = assigned + rank;
      std::int32_t const slot = pool.free_stack[top - 1 - i];
      pool.owner[slot]        = r;
      pool.position[slot]     = pos;
      pool.state[slot]        = Eviction::on_insert(selection_context{epoch, pos, 0.f, 0u});
      lower_key_floor(pool, slot, Eviction::eviction_key(pool.state[slot], pos));
      pool.touched[slot]      = 0;
      pool.dirty[slot]        = 0;
      *entry                  = slot;
      if (p.per_request) { pool.owned[std::int64_t(r) * pool.max_owned + pool.owned_count[r] + i] = slot; }
      p.plan.entries[i] = miss_entry{p.host.group_row(r, pos, p.layout), slot, pos};
    }
    assigned += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    pool.owned_count[r] += popped;
    *p.plan.count = popped;
    if (popped > 0) { atomicAdd(&pool.counters->prewarmed_rows, static_cast<unsigned long long>(popped)); }
    invalidate_cache(pool.cache, r);
  }
}

}  // namespace dhisparse::detail::hierarchy
