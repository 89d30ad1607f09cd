/**
 * @file device_pool.cuh
 * @brief The device slab of one layer group, its slot metadata and free-slot stack.
 *
 * Slab layout: `[num_slots][group row]`, a group row being the rows of all layers of the
 * group for one (request, position): the same bytes, in the same order, as the host
 * store's group row, so a miss is one contiguous copy. Layer l of slot s is at
 * `slab + s * group_row_bytes + l * row_bytes`; attention kernels take
 * `layer_rows(l)` and the stride `group_row_bytes`.
 *
 * Slot metadata (structure of arrays, one entry per slot):
 * | array          | meaning                                                        |
 * |----------------|----------------------------------------------------------------|
 * | `owner`        | request index owning the slot, -1 = in the free stack          |
 * | `position`     | position whose rows the slot holds, -1 = owned but empty       |
 * | `policy_state` | 32-bit state of the eviction policy                            |
 * | `touched`      | epoch of the last step that selected it (= pinned this step)   |
 * | `dirty`        | 1 while the host store has no copy yet (tail rows, committed   |
 * |                | rows not backed up); dirty slots are never evicted             |
 *
 * Each request owns a list of slots (`owned`, `[max_requests][max_owned]`); eviction
 * under a budget picks victims from the request's own list. Slots not owned by anyone
 * are on the free stack (`free_stack[0, *free_count)`), popped by resolve and pushed
 * by release; the two never run concurrently (stream order).
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/row_format.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dhisparse {

/**
 * @brief Trivially copyable device view of one group's `device_pool`.
 */
struct device_pool_ref {
  std::byte* slab;              ///< [num_slots][group_row_bytes]
  std::size_t group_row_bytes;  ///< layers × row bytes
  std::int32_t num_slots;
  std::int32_t* owner;           ///< [num_slots] request index, -1 = free
  std::int32_t* position;        ///< [num_slots] position, -1 = empty
  std::uint32_t* policy_state;   ///< [num_slots]
  std::uint32_t* touched;        ///< [num_slots] epoch of last selection
  std::uint32_t* dirty;          ///< [num_slots] 1 = no host copy yet
  std::int32_t* free_stack;      ///< [num_slots]
  std::int32_t* free_count;      ///< scalar
  std::int32_t* owned;           ///< [max_requests][max_owned]
  std::int32_t* owned_count;     ///< [max_requests]
  std::int32_t max_owned;
  std::uint32_t* epoch;          ///< scalar: steps resolved so far for this group
  std::int32_t* dirty_list;      ///< [dirty_capacity] slots committed since the last backup
  std::int32_t* dirty_count;     ///< scalar
  std::int32_t dirty_capacity;
};
static_assert(std::is_trivially_copyable_v<device_pool_ref>);

namespace detail {
/// Initial metadata: every slot free and empty, the free stack full.
template <int BlockSize>
DHISPARSE_KERNEL void __launch_bounds__(BlockSize) init_pool_kernel(device_pool_ref pool, int max_requests)
{
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pool.num_slots;
       i += stride) {
    pool.owner[i]        = -1;
    pool.position[i]     = -1;
    pool.policy_state[i] = 0;
    pool.touched[i]      = 0;
    pool.dirty[i]        = 0;
    // Popped from the top: the lowest slots go first.
    pool.free_stack[i] = std::int32_t(pool.num_slots - 1 - i);
  }
  for (std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < max_requests;
       r += stride) {
    pool.owned_count[r] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *pool.free_count  = pool.num_slots;
    *pool.epoch       = 0;
    *pool.dirty_count = 0;
  }
}
}  // namespace detail

/**
 * @brief Owning, move-only device pool of one layer group (see the file comment).
 */
class device_pool {
 public:
  /**
   * @param num_slots        slots in the slab
   * @param group_row_bytes  layers × row bytes (multiple of 16)
   * @param max_requests     request indices
   * @param max_owned        most slots one request may own (the budget)
   * @param dirty_capacity   committed rows the dirty list holds between backups
   * @param caller_slab      optional caller-owned device memory for the slab (16-byte
   *                         aligned, num_slots × group_row_bytes); nullptr = allocate
   * @param stream           stream on which the metadata is initialised
   */
  device_pool(std::int32_t num_slots, std::size_t group_row_bytes, int max_requests,
              std::int32_t max_owned, std::int32_t dirty_capacity, void* caller_slab,
              cudaStream_t stream)
    : group_row_bytes_{group_row_bytes}, max_owned_{max_owned}, dirty_capacity_{dirty_capacity}
  {
    DHISPARSE_EXPECTS(num_slots > 0, "device_pool: num_slots must be positive");
    DHISPARSE_EXPECTS(group_row_bytes > 0 && group_row_bytes % row_alignment == 0,
                      "device_pool: group_row_bytes (" + std::to_string(group_row_bytes) +
                        ") must be a positive multiple of 16");
    DHISPARSE_EXPECTS(max_owned > 0, "device_pool: max_owned must be positive");
    DHISPARSE_EXPECTS(dirty_capacity > 0, "device_pool: dirty_capacity must be positive");
    std::size_t const slab_bytes = std::size_t(num_slots) * group_row_bytes;
    if (caller_slab != nullptr) {
      DHISPARSE_EXPECTS(reinterpret_cast<std::uintptr_t>(caller_slab) % row_alignment == 0,
                        "device_pool: caller slab memory must be 16-byte aligned");
      slab_ = detail::device_array<std::byte>(static_cast<std::byte*>(caller_slab), slab_bytes);
    } else {
      slab_ = detail::device_array<std::byte>(slab_bytes);
    }
    owner_        = detail::device_array<std::int32_t>(num_slots);
    position_     = detail::device_array<std::int32_t>(num_slots);
    policy_state_ = detail::device_array<std::uint32_t>(num_slots);
    touched_      = detail::device_array<std::uint32_t>(num_slots);
    dirty_        = detail::device_array<std::uint32_t>(num_slots);
    free_stack_   = detail::device_array<std::int32_t>(num_slots);
    owned_        = detail::device_array<std::int32_t>(std::size_t(max_requests) * max_owned);
    owned_count_  = detail::device_array<std::int32_t>(max_requests);
    dirty_list_   = detail::device_array<std::int32_t>(dirty_capacity);
    scalars_      = detail::device_array<std::int32_t>(3);  // free_count, epoch, dirty_count
    constexpr int block = 256;
    int const blocks    = int(std::min<std::int64_t>(1024, (std::int64_t(num_slots) + block - 1) / block));
    detail::init_pool_kernel<block><<<blocks, block, 0, stream>>>(ref(), max_requests);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }

  [[nodiscard]] std::int32_t num_slots() const noexcept { return std::int32_t(owner_.size()); }
  [[nodiscard]] std::size_t group_row_bytes() const noexcept { return group_row_bytes_; }
  [[nodiscard]] std::byte* slab() const noexcept { return slab_.data(); }

  /// Device view for kernels.
  [[nodiscard]] device_pool_ref ref() const noexcept
  {
    return {slab_.data(),
            group_row_bytes_,
            num_slots(),
            owner_.data(),
            position_.data(),
            policy_state_.data(),
            touched_.data(),
            dirty_.data(),
            free_stack_.data(),
            scalars_.data() + 0,
            owned_.data(),
            owned_count_.data(),
            max_owned_,
            reinterpret_cast<std::uint32_t*>(scalars_.data() + 1),
            dirty_list_.data(),
            scalars_.data() + 2,
            dirty_capacity_};
  }

  /// Bytes of device memory held for metadata (everything but the slab).
  [[nodiscard]] std::size_t metadata_bytes() const noexcept
  {
    return owner_.bytes() + position_.bytes() + policy_state_.bytes() + touched_.bytes() +
           dirty_.bytes() + free_stack_.bytes() + owned_.bytes() + owned_count_.bytes() +
           dirty_list_.bytes() + scalars_.bytes();
  }

 private:
  std::size_t group_row_bytes_;
  std::int32_t max_owned_;
  std::int32_t dirty_capacity_;
  detail::device_array<std::byte> slab_;
  detail::device_array<std::int32_t> owner_, position_;
  detail::device_array<std::uint32_t> policy_state_, touched_, dirty_;
  detail::device_array<std::int32_t> free_stack_, owned_, owned_count_, dirty_list_, scalars_;
};

}  // namespace dhisparse
