/**
 * @file memory_resource.cuh
 * @brief Memory from the caller: the resources every device and pinned host allocation of
 *        the library goes through, their defaults, a counting resource, and the footprint
 *        a configuration reports before construction.
 *
 * Two small interfaces in the style of `cuda::mr` / RMM:
 *
 * | resource                 | allocate                              | default                          |
 * |--------------------------|---------------------------------------|----------------------------------|
 * | `device_memory_resource` | `allocate(bytes, alignment, stream)`  | `cuda_device_resource`: `cudaMalloc` |
 * | `pinned_memory_resource` | `allocate(bytes, alignment)`          | `cuda_pinned_resource`: `cudaHostAlloc` (mapped, portable) |
 *
 * An engine passes its own (one that draws from the PyTorch caching allocator, an RMM pool,
 * or its memory profiler) in `hierarchy_config::resources`, or to the constructors of
 * `host_store`, `device_pool`, `residency_map`, `draft_ring` and `trace::recorder`;
 * nullptr means the default. The library only allocates in constructors (and `admit` /
 * `reserve` never allocate device or pinned memory), so `kv_hierarchy::bytes_required`
 * reports before construction exactly what construction will ask for.
 *
 * Contract of a resource:
 * * `allocate` returns `bytes` (> 0) at an address aligned to `alignment` (a power of two,
 *   at most 256) or throws; the library never asks for 0 bytes.
 * * Device memory is on the current device and may be used by work ordered after the
 *   allocation on `stream`. The owner returns it with the same size, alignment and stream
 *   (the stream it was allocated on, so that stream must outlive the owner, as with RMM's
 *   `device_buffer`); kernels of other streams that used it must be ordered before the
 *   owner is destroyed.
 * * Pinned memory is page-locked and mapped into the device address space
 *   (`cudaHostGetDevicePointer` succeeds on it): kernels read and write the host store's
 *   rows directly. `cudaHostAlloc`, `cudaMallocHost` and PyTorch's pinned memory allocator
 *   give such memory on every system with unified addressing.
 * * The resource outlives every object that allocated from it; `deallocate` does not throw.
 */
#pragma once

#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>

namespace dhisparse {

/// Alignment the library asks its resources for (what `cudaMalloc` guarantees).
inline constexpr std::size_t resource_alignment = 256;

/// @brief Device memory for the library (RMM / `cuda::mr` style; see the file comment).
class device_memory_resource {
 public:
  virtual ~device_memory_resource() = default;

  /// @brief `bytes` of device memory aligned to `alignment`, usable on `stream`; throws on failure.
  void* allocate(std::size_t bytes, std::size_t alignment, cudaStream_t stream)
  {
    return do_allocate(bytes, alignment, stream);
  }
  /// @brief Returns memory from `allocate` with the same size, alignment and stream.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment, cudaStream_t stream) noexcept
  {
    do_deallocate(p, bytes, alignment, stream);
  }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment, cudaStream_t stream)             = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, cudaStream_t stream) noexcept = 0;
};

/// @brief Page-locked host memory mapped into the device address space (see the file comment).
class pinned_memory_resource {
 public:
  virtual ~pinned_memory_resource() = default;

  /// @brief `bytes` of pinned, device-mapped host memory aligned to `alignment`; throws on failure.
  void* allocate(std::size_t bytes, std::size_t alignment) { return do_allocate(bytes, alignment); }
  /// @brief Returns memory from `allocate` with the same size and alignment.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { do_deallocate(p, bytes, alignment); }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment)                   = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
};

namespace detail {
inline void check_alignment(std::size_t alignment, char const* who)
{
  DHISPARSE_EXPECTS(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= resource_alignment,
                    std::string(who) + ": alignment (" + std::to_string(alignment) +
                      ") must be a power of two of at most 256");
}
}  // namespace detail

/// @brief The default device resource: `cudaMalloc` / `cudaFree` (the stream is not used).
class cuda_device_resource final : public device_memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t alignment, cudaStream_t) override
  {
    detail::check_alignment(alignment, "cuda_device_resource");
    void* p = nullptr;
    DHISPARSE_CUDA_TRY(cudaMalloc(&p, bytes));
    return p;
  }
  void do_deallocate(void* p, std::size_t, std::size_t, cudaStream_t) noexcept override { cudaFree(p); }
};

/// @brief The default pinned resource: `cudaHostAlloc(cudaHostAllocMapped | cudaHostAllocPortable)`.
/// It touches its pages in the calling thread, so the host store's NUMA thread policy
/// (host_store.cuh) places them.
class cuda_pinned_resource final : public pinned_memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t alignment) override
  {
    detail::check_alignment(alignment, "cuda_pinned_resource");
    void* p = nullptr;
    DHISPARSE_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    return p;
  }
  void do_deallocate(void* p, std::size_t, std::size_t) noexcept override { cudaFreeHost(p); }
};

/// The process-wide `cuda_device_resource` used where no resource is given.
inline device_memory_resource& default_device_resource()
{
  static cuda_device_resource r;
  return r;
}
/// The process-wide `cuda_pinned_resource` used where no resource is given.
inline pinned_memory_resource& default_pinned_resource()
{
  static cuda_pinned_resource r;
  return r;
}

/// What a counting resource has seen (bytes as asked for, not rounded).
struct allocation_counts {
  std::size_t bytes            = 0;  ///< live bytes: allocated and not yet returned
  std::size_t peak_bytes       = 0;  ///< most live bytes at any time
  std::size_t allocations      = 0;  ///< live allocations
  std::size_t total_allocations = 0; ///< allocations ever made
  std::size_t mismatches       = 0;  ///< deallocations of unknown pointers or with another size
};

namespace detail {
/// Live allocations by address, for the counting resources (thread-safe).
class allocation_tracker {
 public:
  void add(void* p, std::size_t bytes)
  {
    std::lock_guard<std::mutex> lock{mutex_};
    live_[p] = bytes;
    counts_.bytes += bytes;
    counts_.peak_bytes = std::max(counts_.peak_bytes, counts_.bytes);
    ++counts_.allocations;
    ++counts_.total_allocations;
  }
  /// Forgets `p`; false (and a mismatch counted) if it is unknown or had another size.
  bool remove(void* p, std::size_t bytes) noexcept
  {
    std::lock_guard<std::mutex> lock{mutex_};
    auto const it = live_.find(p);
    if (it == live_.end()) {
      ++counts_.mismatches;
      return false;
    }
    bool const same_size = it->second == bytes;
    if (!same_size) { ++counts_.mismatches; }
    forget(it);
    return same_size;
  }
  allocation_counts counts() const
  {
    std::lock_guard<std::mutex> lock{mutex_};
    return counts_;
  }

 private:
  void forget(std::unordered_map<void*, std::size_t>::iterator it) noexcept
  {
    counts_.bytes -= it->second;
    --counts_.allocations;
    live_.erase(it);
  }
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> live_;
  allocation_counts counts_{};
};
}  // namespace detail

/**
 * @brief Device resource that forwards to `upstream` and counts what passes: live and peak
 *        bytes, allocations, and deallocations that match no allocation. For tests and
 *        for an engine's memory accounting.
 */
class counting_device_resource final : public device_memory_resource {
 public:
  explicit counting_device_resource(device_memory_resource& upstream = default_device_resource()) noexcept
    : upstream_{&upstream}
  {
  }
  [[nodiscard]] allocation_counts counts() const { return tracker_.counts(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, cudaStream_t stream) override
  {
    void* p = upstream_->allocate(bytes, alignment, stream);
    tracker_.add(p, bytes);
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, cudaStream_t stream) noexcept override
  {
    tracker_.remove(p, bytes);
    upstream_->deallocate(p, bytes, alignment, stream);
  }
  device_memory_resource* upstream_;
  detail::allocation_tracker tracker_;
};

/// @brief Pinned resource that forwards to `upstream` and counts (see `counting_device_resource`).
class counting_pinned_resource final : public pinned_memory_resource {
 public:
  explicit counting_pinned_resource(pinned_memory_resource& upstream = default_pinned_resource()) noexcept
    : upstream_{&upstream}
  {
  }
  [[nodiscard]] allocation_counts counts() const { return tracker_.counts(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override
  {
    void* p = upstream_->allocate(bytes, alignment);
    tracker_.add(p, bytes);
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override
  {
    tracker_.remove(p, bytes);
    upstream_->deallocate(p, bytes, alignment);
  }
  pinned_memory_resource* upstream_;
  detail::allocation_tracker tracker_;
};

namespace detail {
inline device_memory_resource& device_resource(memory_resources const& r) noexcept
{
  return r.device != nullptr ? *r.device : default_device_resource();
}
inline pinned_memory_resource& pinned_resource(memory_resources const& r) noexcept
{
  return r.pinned != nullptr ? *r.pinned : default_pinned_resource();
}
}  // namespace detail

}  // namespace dhisparse
