/**
 * @file hierarchy_config.hpp
 * @brief Runtime configuration shared by `kv_hierarchy` and its host reference
 *        (`host::kv_hierarchy`), plus the engine-facing request id type (plain C++).
 */
#pragma once

#include <dhisparse/error.hpp>

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace dhisparse {

/// Most selected positions of one request in one step: Qmax × K (resolve's per-request
/// union; `hierarchy_config::validate` and trace shapes enforce it).
inline constexpr std::int64_t max_request_selections = 16384;
/// Most layers of all layer groups together (keeps every per-slot and per-row byte count
/// of a configuration far from overflowing).
inline constexpr std::int64_t max_total_layers = std::int64_t{1} << 16;
/// Most committed rows one layer group's dirty list holds between two backups:
/// max_batch × max_queries × backup_interval_steps must fit a 32-bit slot count.
inline constexpr std::int64_t max_dirty_rows = (std::int64_t{1} << 31) - 1;

/// The engine's id of a request (any 64-bit value). A strong type: it cannot be mixed up
/// with positions or slots.
enum class request_id : std::uint64_t {};

/// Rows of one layer in a group's slab: slot s's row is at `rows + s * stride`.
struct layer_view {
  std::byte* rows;
  std::size_t stride;
};

class device_memory_resource;  // memory_resource.cuh
class pinned_memory_resource;  // memory_resource.cuh
class shared_host_store;       // shared_host_store.cuh

/// The resources an owner allocates from (memory_resource.cuh); nullptr: the default
/// (`cudaMalloc`, `cudaHostAlloc`). Not owned: they must outlive the owner.
struct memory_resources {
  device_memory_resource* device = nullptr;  ///< every device allocation
  pinned_memory_resource* pinned = nullptr;  ///< every pinned host allocation (see `host_memory`)
};

/**
 * @brief Bytes an owner allocates, reported before construction by `bytes_required` and
 *        equal to what its constructor asks its resources for (sizes as asked, before any
 *        rounding by the resource). Nothing is allocated later: `admit` and `reserve` take
 *        pages from pools sized here; the host-side page lists are ordinary heap memory.
 */
struct memory_footprint {
  std::size_t device_bytes = 0;  ///< from the device resource (slabs included unless caller-owned)
  std::size_t pinned_bytes = 0;  ///< from the pinned resource (the store's pages with host_memory::pinned)
  std::size_t slab_bytes   = 0;  ///< of which device_bytes: the groups' slabs
  /// The host store's pages (capacity_pages × page bytes), wherever they come from: part of
  /// pinned_bytes with host_memory::pinned; mapped by the store itself with huge_pages
  /// (rounded up to 2 MiB, not through the resource); the caller's with host_memory::caller.
  std::size_t host_store_bytes = 0;

  memory_footprint& operator+=(memory_footprint const& o) noexcept
  {
    device_bytes += o.device_bytes;
    pinned_bytes += o.pinned_bytes;
    slab_bytes += o.slab_bytes;
    host_store_bytes += o.host_store_bytes;
    return *this;
  }
};

/// Where the host store's pages live.
enum class host_memory {
  pinned,      ///< the pinned memory resource (default: `cudaHostAlloc`, mapped, portable)
  huge_pages,  ///< anonymous `mmap` with `madvise(MADV_HUGEPAGE)`, then `cudaHostRegister`
  caller,      ///< memory the caller owns (`host_store_config::caller_memory`), registered
               ///< with `cudaHostRegister` unless `caller_memory_registered` says it is
};

/// Where one layer group's rows lie inside a host page (`host_store_config::groups`): the
/// group row of the page's position t (its layers' rows, one after another) starts at
/// `offset + t × token_stride`.
struct host_group_placement {
  std::size_t offset       = 0;  ///< bytes from the page's start to position 0's group row (16-aligned)
  std::size_t token_stride = 0;  ///< bytes between consecutive positions' group rows (16-aligned,
                                 ///< at least layers × row bytes)
};

/// Placement of one group's rows inside a host page.
struct group_layout {
  std::size_t page_offset;  ///< byte offset of position 0's group row inside a page
  std::size_t row_bytes;    ///< bytes from one position's group row to the next: the group
                            ///< row (layers × row format bytes) in the packed layout
};

/// Host store settings (see `host_store`).
struct host_store_config {
  std::size_t capacity_pages = 0;  ///< pages in the store; admission beyond fails
  int tokens_per_page        = 64; ///< P: tokens per page (a power of two)
  host_memory memory         = host_memory::pinned;
  void* caller_memory        = nullptr;  ///< with host_memory::caller
  std::size_t caller_bytes   = 0;        ///< with host_memory::caller
  bool caller_memory_registered = false; ///< caller memory is already pinned / registered
  /// NUMA node of the pages (pinned and huge_pages memory; Linux): -1 (`numa_device_local`,
  /// the default) the node closest to the current GPU where the machine has several,
  /// -2 (`numa_unbound`) no binding, ≥ 0 that node. See host_store.cuh and `host_store::numa()`.
  int numa_node = -1;
  /// Page layout, to describe an engine's existing host KV pool (with host_memory::caller)
  /// whose pages `kv_hierarchy::adopt` then uses in place. Each group row must hold its
  /// layers' rows contiguously in the row format; around that, groups may lie anywhere in a
  /// page (blocks, or interleaved position by position) as long as no two rows overlap.
  /// 0 / empty (the default): the packed layout, group blocks one after another.
  std::size_t page_bytes = 0;                  ///< bytes from one page to the next (16-aligned)
  std::vector<host_group_placement> groups{};  ///< one per layer group, or empty (packed)
};

/**
 * @brief Shapes and capacities of a `kv_hierarchy`. Everything that does not change code
 *        generation is runtime configuration.
 */
struct hierarchy_config {
  /// Layers of each layer group (groups share one top-K selection; DeepSeek-V3.2: all 1,
  /// GLM-5 IndexShare: 4). A slot of group g holds the rows of all its layers.
  std::vector<int> group_layers{1};
  int max_requests = 0;  ///< requests admitted at once
  int max_batch    = 0;  ///< padded batch size of a step (the capture size)
  int max_queries  = 1;  ///< Qmax: queries per request per step (1 + drafts when verifying)
  int max_top_k    = 2048;  ///< K: selected positions per query
  int max_context  = 0;     ///< positions a request may reach (sizes per-request tables)
  /// Slots of the device pool of each group. Admission refuses a request whose budget
  /// floor would not fit beside the floors already admitted (policy/concepts.hpp); a
  /// static budget of H slots takes max_requests × H to admit max_requests requests.
  std::int64_t device_slots_per_group = 0;
  /// Positions per residency-map page (a power of two).
  int map_page_positions = 1024;
  /// Steps between two `backup` calls the dirty list must absorb (and the essential floors
  /// cover: rows not yet backed up cannot be evicted).
  int backup_interval_steps = 4;
  /// Shared budgets: a step reclaims optional rows when its new rows would leave fewer free
  /// slots than this (0: only when they would not fit at all).
  int reclaim_low_watermark = 0;
  /// Shared budgets: optional rows a reclaim releases beyond what the step needs, so that one
  /// pass over the pool serves several steps (-1: device_slots_per_group / 64).
  std::int64_t reclaim_batch = -1;
  /// Shared budgets in global order: slots a reclaim samples to bound the keys it reads
  /// (0: no sample, every eligible row is a candidate), one per thread of the first blocks
  /// of the reclaim's grid (at most all of them). Speed only: which rows are released does
  /// not depend on it; tests use small samples to exercise the pass that follows a miss.
  int reclaim_sample_slots = 16384;
  /// Shared budgets: blocks of resolve's reclaim kernel (0: as many as fit on the device at
  /// once). Fewer leave SMs to other streams while a reclaim runs; with more, the blocks
  /// not started when a reclaim begins take no part. Speed only, like the sample.
  int reclaim_blocks = 0;
  /// Blocks (of 8 warps, a row in flight per warp) of each `backup`, shared by all groups
  /// (0: 64 per group, the fastest backup). A few blocks pace the backup so that it takes
  /// little from a retrieval running beside it on another stream while keeping up with a
  /// decode step's commits; bench/retrieval's overlap benchmark measures the trade
  /// (docs/benchmarks.md). Speed only: every dirty row is backed up whatever the value.
  int backup_blocks = 0;
  /// The first `retrieve(g)` after a resolve of g sorts its miss plan by host address over
  /// all requests (`order_plan_async`) before gathering; later retrieves of the same plan
  /// (layer ranges) keep that order. Small rows scattered over a large store reach about
  /// half of the pinned memcpy bandwidth in emission order and 0.8–0.9 in address order
  /// (docs/benchmarks.md). Costs a workspace of ≈ 0.5 MiB + 16 B per step entry per group
  /// parity (counted by `bytes_required`) and the four ordering kernels per resolve
  /// (≈ 27–30 µs per plan on the H200). Resolve's emission order is already close to
  /// address order while requests' pages are allocated in order (0.88 of memcpy either
  /// way in bench_retrieval_realistic): turn it on for stores whose page lists interleave.
  /// `resolve_and_retrieve` copies in emission order (its copy starts inside allocate).
  bool order_plans = false;
  /// With `order_plans`: plans of fewer entries are gathered as emitted (the ordering
  /// kernels return at once; every row is in flight together then). 0: order every plan.
  std::int32_t order_plans_min_entries = 8192;
  host_store_config host{};
  /// Optional caller-owned slab per group (device memory, 16-byte aligned, at least
  /// device_slots_per_group × layers × row bytes). Empty: the hierarchy allocates.
  std::vector<void*> slab_memory{};
  /// Where every device and pinned allocation comes from (nullptr: the defaults); see
  /// memory_resource.cuh and `kv_hierarchy::bytes_required`.
  memory_resources resources{};
  /// CUDA device ordinal the hierarchy lives on: every allocation, launch and copy of
  /// `kv_hierarchy` runs there whatever the caller's current device is (the caller's
  /// device is restored after each call). -1: the current device at construction. Streams
  /// handed to the hierarchy must belong to this device.
  int device = -1;
  /// A host store shared with other hierarchies (tensor-parallel ranks holding the same
  /// KV, shared_host_store.cuh) instead of one of its own; `host` must then describe the
  /// shared store (`host = shared_host->config()`). nullptr: the hierarchy owns its store.
  std::shared_ptr<shared_host_store> shared_host{};
  /// With `shared_host`: this hierarchy is the one rank that backs rows up into the shared
  /// pages (exactly one per store); the others only read them.
  bool shared_host_writer = false;

  [[nodiscard]] int num_groups() const noexcept { return int(group_layers.size()); }
  /// Layers of all groups (at most `max_total_layers` in a configuration `validate` accepts).
  [[nodiscard]] int total_layers() const noexcept
  {
    // Summed in 64 bits: an unvalidated configuration gives a wrapped value, never
    // undefined behaviour.
    return int(std::accumulate(group_layers.begin(), group_layers.end(), std::int64_t{0}));
  }
  /// Entries of one step's selection / slot table: max_batch × max_queries × max_top_k.
  [[nodiscard]] std::size_t step_entries() const noexcept
  {
    return std::size_t(max_batch) * max_queries * max_top_k;
  }
};

namespace detail {

inline bool is_power_of_two(long long v) { return v > 0 && (v & (v - 1)) == 0; }

/// Throws `dhisparse::error` naming the first invalid field (the budget policy's own
/// requirements are checked by the hierarchy, see policy/concepts.hpp).
inline void validate(hierarchy_config const& c)
{
  DHISPARSE_EXPECTS(!c.group_layers.empty(), "hierarchy_config.group_layers is empty");
  std::int64_t layers = 0;
  for (std::size_t g = 0; g < c.group_layers.size(); ++g) {
    DHISPARSE_EXPECTS(c.group_layers[g] > 0, "hierarchy_config.group_layers[" +
                                               std::to_string(g) + "] must be positive");
    layers += c.group_layers[g];  // at most 2^31 terms of at most 2^31 - 1: no overflow
    DHISPARSE_EXPECTS(layers <= max_total_layers, "hierarchy_config.group_layers: more than " +
                                                    std::to_string(max_total_layers) + " layers in all");
  }
  DHISPARSE_EXPECTS(c.max_requests > 0, "hierarchy_config.max_requests must be positive");
  DHISPARSE_EXPECTS(c.max_batch > 0 && c.max_batch <= c.max_requests,
                    "hierarchy_config.max_batch must be in [1, max_requests]");
  DHISPARSE_EXPECTS(c.max_queries > 0, "hierarchy_config.max_queries must be positive");
  DHISPARSE_EXPECTS(c.max_top_k > 0, "hierarchy_config.max_top_k must be positive");
  DHISPARSE_EXPECTS(std::int64_t(c.max_queries) * c.max_top_k <= max_request_selections,
                    "hierarchy_config: max_queries × max_top_k (" +
                      std::to_string(std::int64_t(c.max_queries) * c.max_top_k) + ") must be at most " +
                      std::to_string(max_request_selections));
  DHISPARSE_EXPECTS(c.max_context > 0, "hierarchy_config.max_context must be positive");
  DHISPARSE_EXPECTS(is_power_of_two(c.map_page_positions),
                    "hierarchy_config.map_page_positions must be a power of two");
  DHISPARSE_EXPECTS(is_power_of_two(c.host.tokens_per_page),
                    "hierarchy_config.host.tokens_per_page must be a power of two");
  DHISPARSE_EXPECTS(c.host.capacity_pages > 0, "hierarchy_config.host.capacity_pages must be positive");
  DHISPARSE_EXPECTS(c.backup_interval_steps > 0,
                    "hierarchy_config.backup_interval_steps must be positive");
  // max_batch ≤ max_requests < 2^31 and max_queries ≤ 16384 were checked: no overflow.
  std::int64_t const dirty = std::int64_t(c.max_batch) * c.max_queries;
  DHISPARSE_EXPECTS(c.backup_interval_steps <= max_dirty_rows / dirty,
                    "hierarchy_config.backup_interval_steps (" + std::to_string(c.backup_interval_steps) +
                      "): the dirty list of max_batch × max_queries × backup_interval_steps rows must hold at most " +
                      std::to_string(max_dirty_rows) + " rows");
  DHISPARSE_EXPECTS(c.reclaim_low_watermark >= 0, "hierarchy_config.reclaim_low_watermark must not be negative");
  DHISPARSE_EXPECTS(c.reclaim_sample_slots >= 0, "hierarchy_config.reclaim_sample_slots must not be negative");
  DHISPARSE_EXPECTS(c.reclaim_blocks >= 0, "hierarchy_config.reclaim_blocks must not be negative (0: the default)");
  DHISPARSE_EXPECTS(c.backup_blocks >= 0, "hierarchy_config.backup_blocks must not be negative (0: the default)");
  DHISPARSE_EXPECTS(c.order_plans_min_entries >= 0, "hierarchy_config.order_plans_min_entries must not be negative");
  DHISPARSE_EXPECTS(c.slab_memory.empty() || c.slab_memory.size() == c.group_layers.size(),
                    "hierarchy_config.slab_memory must be empty or hold one slab per group");
  DHISPARSE_EXPECTS(c.device >= -1, "hierarchy_config.device must be -1 (the current device) or a device ordinal");
  DHISPARSE_EXPECTS(c.shared_host != nullptr || !c.shared_host_writer,
                    "hierarchy_config.shared_host_writer needs a shared_host");
  DHISPARSE_EXPECTS(c.device_slots_per_group > 0 && c.device_slots_per_group < (std::int64_t{1} << 31),
                    "hierarchy_config.device_slots_per_group must be in [1, 2^31)");
}

/// Optional rows one reclaim releases beyond a step's need (`reclaim_batch`, resolved).
inline std::int32_t reclaim_batch(hierarchy_config const& c)
{
  return std::int32_t(c.reclaim_batch >= 0 ? c.reclaim_batch : std::max<std::int64_t>(1, c.device_slots_per_group / 64));
}

}  // namespace detail
}  // namespace dhisparse
