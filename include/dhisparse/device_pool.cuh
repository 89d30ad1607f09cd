/**
 * @file device_pool.cuh
 * @brief The device slab of one layer group, its slot metadata, the free-slot stack and
 *        the per-request lists that eviction and reclaim use.
 *
 * Slab layout: `[num_slots][group row]`, a group row being the rows of all layers of the
 * group for one (request, position): the same bytes, in the same order, as the host
 * store's group row, so a miss is one contiguous copy. Layer l of slot s is at
 * `slab + s * group_row_bytes + l * row_bytes`; attention kernels take `layer_rows(l)`
 * and the stride `group_row_bytes`.
 *
 * Slot metadata (structure of arrays, one entry per slot):
 * | array          | meaning                                                        |
 * |----------------|----------------------------------------------------------------|
 * | `owner`        | request index owning the slot, -1 = free                       |
 * | `position`     | position whose rows the slot holds, -1 = owned but empty       |
 * | `state`        | 64-bit state of the eviction policy                            |
 * | `touched`      | epoch of the last step that selected it (= pinned this step)   |
 * | `dirty`        | 1 while the host store has no copy yet (tail rows, committed   |
 * |                | rows not backed up); dirty slots are never evicted             |
 *
 * Beside them, one *key floor* per four slots (`key_floor`, one 32-byte sector of states):
 * a lower bound of the eviction keys of the rows in those slots, saturated to 32 bits, so
 * that reclaim's candidate pass reads the states of only the slots whose floor lies under
 * its key bound (see `lower_key_floor`).
 *
 * Only slots below the pool *limit* (`set_pool_limit`) are used: the free stack
 * (`free_stack[0, *free_count)`) holds free slots below it, and slots at or above it are
 * owned by nobody, so an engine may use that part of a caller-owned slab.
 *
 * Per request: `owned_count` (slots it owns), a small stack of *spare* slots (owned, empty:
 * rejected tail rows, reused first by its next step). Budgets with a per-request cap add
 * the request's owned list (`owned[r][0, owned_count)`, in the order the slots were
 * taken), the CLOCK hand, and a *victim cache*: the smallest eviction keys of the
 * request's rows found by its last scan, so that a step needing a few victims does not
 * scan the whole list (see detail/resolve/victims.cuh).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/group_counters.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse {

/**
 * @brief The victim cache of per-request budgets: per request, up to `capacity` of its rows
 *        in ascending (eviction key, position) order, entries `[head, count)` still unused.
 *        `flags` bit 0 = valid, bit 1 = complete (the scan held every row of the request).
 */
struct victim_cache_ref {
  std::int32_t* slot;      ///< [max_requests][capacity]
  std::int32_t* position;  ///< [max_requests][capacity]
  std::uint64_t* key;      ///< [max_requests][capacity]
  std::int32_t* head;      ///< [max_requests]
  std::int32_t* count;     ///< [max_requests]
  std::uint32_t* flags;    ///< [max_requests]
  std::int32_t capacity;   ///< 0: no cache
};
static_assert(std::is_trivially_copyable_v<victim_cache_ref>);

/**
 * Policy state of a slot that holds no row. It is the largest key of the policies whose
 * key is their state (`key_is_state_v`, LRU): reclaim's candidate pass, which reads only
 * states for those, then finds free slots above every key bound without reading their
 * owner or position (with 0, a free slot's key would be the smallest and each would cost
 * a dependent load). Every row's state comes from `on_insert`, so nothing reads this
 * value as a policy's state.
 */
inline constexpr policy_state free_slot_state = ~policy_state{0};

/// Slots per key floor: 2^key_floor_shift (four 8-byte states, one 32-byte sector).
inline constexpr int key_floor_shift = 2;

/// The key floor of eviction key `key`: the key saturated to 32 bits (a floor of 2^32 − 1
/// says "no key below 2^32 − 1", which a key bound under it still skips).
DHISPARSE_HOST_DEVICE constexpr std::uint32_t key_floor_of(std::uint64_t key) noexcept
{
  return key > 0xFFFFFFFFull ? 0xFFFFFFFFu : std::uint32_t(key);
}

/**
 * @brief Trivially copyable device view of one group's `device_pool`.
 */
struct device_pool_ref {
  std::byte* slab;              ///< [num_slots][group_row_bytes]
  std::size_t group_row_bytes;  ///< layers × row bytes
  std::int32_t num_slots;
  // Slot metadata, [num_slots] each.
  std::int32_t* owner;          ///< request index, -1 = free
  std::int32_t* position;       ///< position, -1 = empty
  policy_state* state;          ///< eviction policy state (`free_slot_state` when free)
  std::uint32_t* touched;       ///< epoch of the last selection
  std::uint32_t* dirty;         ///< 1 = no host copy yet
  std::uint32_t* sel_count;     ///< per-step selection count accumulator, 0 between kernels
  std::uint32_t* sel_score;     ///< per-step highest score (ordered bits), 0 between kernels
  std::uint64_t* keys;          ///< reclaim scratch
  std::uint32_t* key_floor;     ///< [⌈num_slots / 4⌉] lower bound of the keys of 4 slots' rows
  // Free slots.
  std::int32_t* free_stack;     ///< [num_slots]
  std::int32_t* free_count;     ///< scalar
  std::int32_t* limit;          ///< scalar: slots [0, limit) are in use
  // Per request.
  std::int32_t* owned_count;    ///< [max_requests] slots owned (resident + spare)
  std::int32_t* spare;          ///< [max_requests][spare_capacity] owned empty slots
  std::int32_t* spare_count;    ///< [max_requests]
  std::int32_t spare_capacity;
  std::int32_t* owned;          ///< [max_requests][max_owned] (per-request budgets), else null
  std::int32_t max_owned;       ///< 0 without owned lists
  std::int32_t* hand;           ///< [max_requests] CLOCK hand (index into the owned list)
  victim_cache_ref cache;
  // Group scalars.
  std::uint32_t* epoch;         ///< steps resolved so far for this group
  std::int32_t* dirty_list;     ///< [dirty_capacity] slots committed since the last backup
  std::int32_t* dirty_count;    ///< scalar
  std::int32_t* dirty_overflow; ///< scalar: 1 when rows were committed past a full dirty list
  std::int32_t dirty_capacity;
  group_counters* counters;     ///< scalar struct
  std::int32_t max_requests;
};
static_assert(std::is_trivially_copyable_v<device_pool_ref>);

/**
 * Keeps the key floor of `slot` at most `key`. Invariant: every row's eviction key is at
 * least its slot's floor. Every write that may give a row a key below its floor calls it:
 * an insert, a move, a commit that relabels a row to a lower position, a cleared CLOCK
 * reference, and a hit of a policy whose hits may lower keys (`hits_raise_keys_v` off); a
 * floor only rises when reclaim's pass sets it to the least key it read in those slots.
 * A fire-and-forget atomic, off the caller's latency chain.
 */
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE void lower_key_floor(device_pool_ref const& pool, std::int32_t slot,
                                                            std::uint64_t key)
{
  atomicMin(pool.key_floor + (slot >> key_floor_shift), key_floor_of(key));
}

/// Shapes of a `device_pool`.
struct device_pool_shape {
  std::int32_t num_slots        = 0;
  std::size_t group_row_bytes   = 0;  ///< layers × row bytes (multiple of 16)
  int max_requests              = 0;
  std::int32_t max_owned        = 0;  ///< owned-list length per request (0: no lists)
  std::int32_t cache_capacity   = 0;  ///< victim cache entries per request (0: none)
  std::int32_t spare_capacity   = 1;  ///< spare slots per request (≥ max_queries)
  std::int32_t dirty_capacity   = 1;  ///< committed rows the dirty list holds between backups
};

namespace detail {
/// Initial metadata: every slot free and empty, the free stack full, lists empty
/// (detail/device_pool/kernels.cuh).
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) init_pool_kernel(device_pool_ref pool);
}  // namespace detail

/**
 * @brief Owning, move-only device pool of one layer group (see the file comment).
 */
class device_pool {
 public:
  /**
   * @param shape        slots, row bytes and per-request list sizes
   * @param caller_slab  optional caller-owned device memory for the slab (16-byte aligned,
   *                     num_slots × group_row_bytes); nullptr = allocate
   * @param stream       stream on which the metadata is initialised
   * @param resources    where the slab (unless the caller's) and the metadata come from
   */
  device_pool(device_pool_shape const& shape, void* caller_slab, cudaStream_t stream,
              memory_resources const& resources = {})
    : shape_{shape}
  {
    check(shape);
    std::size_t const slab_bytes = std::size_t(shape.num_slots) * shape.group_row_bytes;
    device_memory_resource& device = detail::device_resource(resources);
    if (caller_slab != nullptr) {
      DHISPARSE_EXPECTS(reinterpret_cast<std::uintptr_t>(caller_slab) % row_alignment == 0,
                        "device_pool: caller slab memory must be 16-byte aligned");
      slab_ = detail::device_array<std::byte>(static_cast<std::byte*>(caller_slab), slab_bytes);
    } else {
      slab_ = detail::device_array<std::byte>(slab_bytes, device, stream);
    }
    metadata_arrays(shape, [&](auto member, std::size_t n) { detail::allocate(this->*member, n, device, stream); });
    constexpr int block = 256;
    std::int64_t const work = std::max<std::int64_t>(shape.num_slots, shape.max_requests);
    int const blocks        = int(std::min<std::int64_t>(1024, (work + block - 1) / block));
    detail::init_pool_kernel<block><<<blocks, block, 0, stream>>>(ref());
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }

  /**
   * @brief Memory a pool of `shape` allocates (device only): the slab unless
   *        `caller_slab`, and the metadata.
   * @throws dhisparse::error on an invalid shape, as the constructor
   */
  static memory_footprint bytes_required(device_pool_shape const& shape, bool caller_slab)
  {
    check(shape);
    memory_footprint f{};
    f.slab_bytes = caller_slab ? 0 : std::size_t(shape.num_slots) * shape.group_row_bytes;
    f.device_bytes = f.slab_bytes;
    metadata_arrays(shape, [&](auto member, std::size_t n) {
      f.device_bytes += detail::allocated_bytes(member, n);
    });
    return f;
  }

  [[nodiscard]] std::int32_t num_slots() const noexcept { return shape_.num_slots; }
  [[nodiscard]] std::size_t group_row_bytes() const noexcept { return shape_.group_row_bytes; }
  [[nodiscard]] std::byte* slab() const noexcept { return slab_.data(); }
  [[nodiscard]] device_pool_shape const& shape() const noexcept { return shape_; }

  /// Device view for kernels.
  [[nodiscard]] device_pool_ref ref() const noexcept
  {
    std::size_t const slots    = std::size_t(shape_.num_slots);
    std::size_t const requests = std::size_t(shape_.max_requests);
    std::size_t const cache    = requests * std::size_t(shape_.cache_capacity);
    device_pool_ref p{};
    p.slab            = slab_.data();
    p.group_row_bytes = shape_.group_row_bytes;
    p.num_slots       = shape_.num_slots;
    p.owner           = slot_i32_.data();
    p.position        = slot_i32_.data() + slots;
    p.free_stack      = slot_i32_.data() + 2 * slots;
    p.touched         = slot_u32_.data();
    p.dirty           = slot_u32_.data() + slots;
    p.sel_count       = slot_u32_.data() + 2 * slots;
    p.sel_score       = slot_u32_.data() + 3 * slots;
    p.state           = state_.data();
    p.keys            = keys_.data();
    p.key_floor       = key_floor_.data();
    p.free_count      = scalars_.data() + 0;
    p.limit           = scalars_.data() + 1;
    p.epoch           = reinterpret_cast<std::uint32_t*>(scalars_.data() + 2);
    p.dirty_count     = scalars_.data() + 3;
    p.dirty_overflow  = scalars_.data() + 4;
    p.owned_count     = request_i32_.data();
    p.spare_count     = request_i32_.data() + requests;
    p.hand            = request_i32_.data() + 2 * requests;
    p.spare           = request_i32_.data() + 3 * requests;
    p.spare_capacity  = shape_.spare_capacity;
    p.owned           = shape_.max_owned > 0 ? owned_.data() : nullptr;
    p.max_owned       = shape_.max_owned;
    if (cache > 0) {
      p.cache.slot     = cache_i32_.data();
      p.cache.position = cache_i32_.data() + cache;
      p.cache.head     = cache_i32_.data() + 2 * cache;
      p.cache.count    = cache_i32_.data() + 2 * cache + requests;
      p.cache.key      = cache_key_.data();
      p.cache.flags    = cache_flags_.data();
      p.cache.capacity = shape_.cache_capacity;
    }
    p.dirty_list     = dirty_list_.data();
    p.dirty_capacity = shape_.dirty_capacity;
    p.counters       = counters_.data();
    p.max_requests   = shape_.max_requests;
    return p;
  }

  /// Bytes of device memory held for metadata (everything but the slab).
  [[nodiscard]] std::size_t metadata_bytes() const noexcept
  {
    return slot_i32_.bytes() + slot_u32_.bytes() + state_.bytes() + keys_.bytes() + key_floor_.bytes() +
           request_i32_.bytes() + owned_.bytes() + cache_i32_.bytes() + cache_key_.bytes() + cache_flags_.bytes() +
           dirty_list_.bytes() + scalars_.bytes() + counters_.bytes();
  }

 private:
  static void check(device_pool_shape const& shape)
  {
    DHISPARSE_EXPECTS(shape.num_slots > 0, "device_pool: num_slots must be positive");
    DHISPARSE_EXPECTS(shape.group_row_bytes > 0 && shape.group_row_bytes % row_alignment == 0,
                      "device_pool: group_row_bytes (" + std::to_string(shape.group_row_bytes) +
                        ") must be a positive multiple of 16");
    DHISPARSE_EXPECTS(shape.max_requests > 0, "device_pool: max_requests must be positive");
    DHISPARSE_EXPECTS(shape.max_owned >= 0 && shape.cache_capacity >= 0,
                      "device_pool: max_owned and cache_capacity must not be negative");
    DHISPARSE_EXPECTS(shape.spare_capacity > 0, "device_pool: spare_capacity must be positive");
    DHISPARSE_EXPECTS(shape.dirty_capacity > 0, "device_pool: dirty_capacity must be positive");
  }

  /// Calls `f(member, elements)` for every metadata array of a pool of `shape`: the
  /// constructor allocates them, `bytes_required` sums them.
  template <class F>
  static void metadata_arrays(device_pool_shape const& shape, F&& f)
  {
    std::size_t const slots    = std::size_t(shape.num_slots);
    std::size_t const requests = std::size_t(shape.max_requests);
    std::size_t const cache    = requests * std::size_t(shape.cache_capacity);
    f(&device_pool::slot_i32_, 3 * slots);  // owner, position, free stack
    f(&device_pool::slot_u32_, 4 * slots);  // touched, dirty, count, score
    f(&device_pool::state_, slots);
    f(&device_pool::keys_, slots);
    f(&device_pool::key_floor_, (slots + (1u << key_floor_shift) - 1) >> key_floor_shift);
    f(&device_pool::request_i32_, requests * (3 + std::size_t(shape.spare_capacity)));
    f(&device_pool::owned_, requests * std::size_t(shape.max_owned));
    f(&device_pool::cache_i32_, cache > 0 ? 2 * cache + 2 * requests : 0);
    f(&device_pool::cache_key_, cache);
    f(&device_pool::cache_flags_, cache > 0 ? requests : 0);
    f(&device_pool::dirty_list_, std::size_t(shape.dirty_capacity));
    f(&device_pool::scalars_, 5);  // free_count, limit, epoch, dirty count, overflow
    f(&device_pool::counters_, 1);
  }

  device_pool_shape shape_;
  detail::device_array<std::byte> slab_;
  detail::device_array<std::int32_t> slot_i32_;
  detail::device_array<std::uint32_t> slot_u32_;
  detail::device_array<policy_state> state_;
  detail::device_array<std::uint64_t> keys_;
  detail::device_array<std::uint32_t> key_floor_;
  detail::device_array<std::int32_t> request_i32_;
  detail::device_array<std::int32_t> owned_;
  detail::device_array<std::int32_t> cache_i32_;
  detail::device_array<std::uint64_t> cache_key_;
  detail::device_array<std::uint32_t> cache_flags_;
  detail::device_array<std::int32_t> dirty_list_;
  detail::device_array<std::int32_t> scalars_;
  detail::device_array<group_counters> counters_;
};

}  // namespace dhisparse

#include <dhisparse/detail/device_pool/kernels.cuh>
