/**
 * @file detail/device_memory.cuh
 * @brief Move-only owner of one device allocation, or a non-owning view of caller memory.
 */
#pragma once

#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

namespace dhisparse::detail {

/// @brief `n` elements of `T` in device memory: allocated with `cudaMalloc` (owned) or
/// adopted from the caller (not freed). Move-only.
template <class T>
class device_array {
 public:
  device_array() = default;

  /// Allocates `n` elements (nothing for n == 0).
  explicit device_array(std::size_t n) : size_{n}, owned_{true}
  {
    if (n > 0) { DHISPARSE_CUDA_TRY(cudaMalloc(&data_, n * sizeof(T))); }
  }

  /// Adopts caller memory (not freed by this object).
  device_array(T* caller_memory, std::size_t n) noexcept
    : data_{caller_memory}, size_{n}, owned_{false}
  {
  }

  device_array(device_array&& o) noexcept
    : data_{std::exchange(o.data_, nullptr)},
      size_{std::exchange(o.size_, 0)},
      owned_{std::exchange(o.owned_, false)}
  {
  }
  device_array& operator=(device_array&& o) noexcept
  {
    if (this != &o) {
      release();
      data_  = std::exchange(o.data_, nullptr);
      size_  = std::exchange(o.size_, 0);
      owned_ = std::exchange(o.owned_, false);
    }
    return *this;
  }
  device_array(device_array const&)            = delete;
  device_array& operator=(device_array const&) = delete;
  ~device_array() { release(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }

  /// Stream-ordered fill of every byte with `value`.
  void fill_bytes(int value, cudaStream_t stream)
  {
    if (size_ > 0) { DHISPARSE_CUDA_TRY(cudaMemsetAsync(data_, value, bytes(), stream)); }
  }

 private:
  void release() noexcept
  {
    if (owned_ && data_ != nullptr) { cudaFree(data_); }
    data_ = nullptr;
  }
  T* data_    = nullptr;
  std::size_t size_ = 0;
  bool owned_ = false;
};

}  // namespace dhisparse::detail
