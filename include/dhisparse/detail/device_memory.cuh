/**
 * @file detail/device_memory.cuh
 * @brief The library's two owners of memory: `device_array` (device memory) and
 *        `pinned_array` (pinned host memory), each one allocation from a memory resource
 *        (memory_resource.cuh) returned on destruction, or a non-owning view of caller
 *        memory.
 */
#pragma once

#include <dhisparse/error.cuh>
#include <dhisparse/memory_resource.cuh>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <utility>

namespace dhisparse::detail {

inline void* allocate_from(device_memory_resource& r, std::size_t bytes, cudaStream_t stream)
{
  return r.allocate(bytes, resource_alignment, stream);
}
inline void deallocate_to(device_memory_resource& r, void* p, std::size_t bytes, cudaStream_t stream) noexcept
{
  r.deallocate(p, bytes, resource_alignment, stream);
}
inline void* allocate_from(pinned_memory_resource& r, std::size_t bytes, cudaStream_t)
{
  return r.allocate(bytes, resource_alignment);
}
inline void deallocate_to(pinned_memory_resource& r, void* p, std::size_t bytes, cudaStream_t) noexcept
{
  r.deallocate(p, bytes, resource_alignment);
}
inline device_memory_resource& default_resource(device_memory_resource*) { return default_device_resource(); }
inline pinned_memory_resource& default_resource(pinned_memory_resource*) { return default_pinned_resource(); }

/**
 * @brief `n` elements of `T` from a `Resource` (`device_memory_resource` or
 *        `pinned_memory_resource`), returned to it on destruction with the size and stream
 *        of the allocation; or adopted caller memory (not freed). Move-only. Nothing is
 *        allocated for n == 0.
 */
template <class T, class Resource>
class resource_array {
 public:
  using value_type = T;

  resource_array() = default;

  /// Allocates `n` elements from the default resource.
  explicit resource_array(std::size_t n) : resource_array(n, default_resource(static_cast<Resource*>(nullptr)), nullptr) {}

  /// Allocates `n` elements from `resource`, usable on `stream` (and returned on it).
  resource_array(std::size_t n, Resource& resource, cudaStream_t stream) : size_{n}, stream_{stream}
  {
    if (n > 0) {
      data_     = static_cast<T*>(allocate_from(resource, n * sizeof(T), stream));
      resource_ = &resource;
    }
  }

  /// Adopts caller memory (not freed by this object).
  resource_array(T* caller_memory, std::size_t n) noexcept : data_{caller_memory}, size_{n} {}

  resource_array(resource_array&& o) noexcept
    : data_{std::exchange(o.data_, nullptr)},
      size_{std::exchange(o.size_, 0)},
      resource_{std::exchange(o.resource_, nullptr)},
      stream_{o.stream_}
  {
  }
  resource_array& operator=(resource_array&& o) noexcept
  {
    if (this != &o) {
      release();
      data_     = std::exchange(o.data_, nullptr);
      size_     = std::exchange(o.size_, 0);
      resource_ = std::exchange(o.resource_, nullptr);
      stream_   = o.stream_;
    }
    return *this;
  }
  resource_array(resource_array const&)            = delete;
  resource_array& operator=(resource_array const&) = delete;
  ~resource_array() { release(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  /// Bytes this object took from its resource (0 for adopted memory).
  [[nodiscard]] std::size_t owned_bytes() const noexcept { return resource_ != nullptr ? bytes() : 0; }

  /// Stream-ordered fill of every byte with `value`.
  void fill_bytes(int value, cudaStream_t stream)
  {
    if (size_ > 0) { DHISPARSE_CUDA_TRY(cudaMemsetAsync(data_, value, bytes(), stream)); }
  }

 private:
  void release() noexcept
  {
    if (resource_ != nullptr) { deallocate_to(*resource_, data_, bytes(), stream_); }
    data_     = nullptr;
    resource_ = nullptr;
  }
  T* data_               = nullptr;
  std::size_t size_      = 0;
  Resource* resource_    = nullptr;  // nullptr: nothing owned
  cudaStream_t stream_   = nullptr;
};

/// Allocates `a` (each element of an array of owners) with `n` elements from `resource`.
template <class T, class Resource>
void allocate(resource_array<T, Resource>& a, std::size_t n, Resource& resource, cudaStream_t stream)
{
  a = resource_array<T, Resource>(n, resource, stream);
}
template <class T, class Resource, std::size_t N>
void allocate(std::array<resource_array<T, Resource>, N>& a, std::size_t n, Resource& resource, cudaStream_t stream)
{
  for (auto& each : a) { allocate(each, n, resource, stream); }
}
/// Element type and number of owners of an owner or array of owners.
template <class Owner>
struct owner_traits;
template <class T, class Resource>
struct owner_traits<resource_array<T, Resource>> {
  using element                      = T;
  static constexpr std::size_t owners = 1;
};
template <class T, class Resource, std::size_t N>
struct owner_traits<std::array<resource_array<T, Resource>, N>> {
  using element                      = T;
  static constexpr std::size_t owners = N;
};
/// Bytes `allocate` takes for an `Owner` (owner or array of owners) of `n` elements each.
template <class Owner>
constexpr std::size_t allocated_bytes(std::size_t n) noexcept
{
  return owner_traits<Owner>::owners * n * sizeof(typename owner_traits<Owner>::element);
}
/// `allocated_bytes` of the owner that a pointer to a member names.
template <class Class, class Owner>
constexpr std::size_t allocated_bytes(Owner Class::*, std::size_t n) noexcept
{
  return allocated_bytes<Owner>(n);
}

/// Device memory owner (see `resource_array`).
template <class T>
using device_array = resource_array<T, device_memory_resource>;
/// Pinned host memory owner (see `resource_array`).
template <class T>
using pinned_array = resource_array<T, pinned_memory_resource>;

}  // namespace dhisparse::detail
