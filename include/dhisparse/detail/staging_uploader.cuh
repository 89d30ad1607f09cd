/**
 * @file detail/staging_uploader.cuh
 * @brief Stream-ordered host→device uploads of small tables through a pinned ring.
 *
 * Host-side mutations between steps (admission, page table growth, a new batch) write
 * their bytes into the next free part of a pinned ring and enqueue one
 * `cudaMemcpyAsync` per contiguous piece. The ring is cut into blocks; a block is reused
 * only after the event recorded behind its last copy has completed (a host wait that
 * happens only when the GPU lags several blocks behind). Uploads are therefore ordered
 * with the caller's stream like any other stream work, and the caller's host buffer can
 * be reused as soon as `upload` returns.
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/memory_resource.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <utility>

namespace dhisparse::detail {

class staging_uploader {
 public:
  static constexpr std::size_t block_bytes = std::size_t{256} << 10;
  static constexpr int num_blocks          = 8;
  /// Pinned bytes of the ring (its only allocation).
  static constexpr std::size_t ring_bytes = block_bytes * num_blocks;

  /// @param pinned resource of the ring (default: `cudaHostAlloc`)
  explicit staging_uploader(pinned_memory_resource& pinned = default_pinned_resource())
    : ring_{ring_bytes, pinned, nullptr}
  {
    for (auto& e : events_) {
      DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  staging_uploader(staging_uploader&& o) noexcept
    : ring_{std::move(o.ring_)},
      events_{std::exchange(o.events_, {})},
      pending_{o.pending_},
      block_{o.block_},
      offset_{o.offset_},
      stream_{o.stream_}
  {
  }
  staging_uploader& operator=(staging_uploader&& o) noexcept
  {
    std::swap(ring_, o.ring_);
    std::swap(events_, o.events_);
    std::swap(pending_, o.pending_);
    std::swap(block_, o.block_);
    std::swap(offset_, o.offset_);
    std::swap(stream_, o.stream_);
    return *this;
  }
  staging_uploader(staging_uploader const&)            = delete;
  staging_uploader& operator=(staging_uploader const&) = delete;
  ~staging_uploader()
  {
    for (auto& e : events_) {  // the ring is returned once no copy reads it
      if (e) { cudaEventSynchronize(e); cudaEventDestroy(e); }
    }
  }

  /// Copies `bytes` from host `src` to device `dst`, ordered on `stream`.
  void upload(void* dst, void const* src, std::size_t bytes, cudaStream_t stream)
  {
    auto* d       = static_cast<std::byte*>(dst);
    auto const* s = static_cast<std::byte const*>(src);
    // A block serves one stream, so the event recorded behind its last copy covers all.
    if (offset_ > 0 && stream != stream_) { next_block(); }
    stream_ = stream;
    while (bytes > 0) {
      if (offset_ == block_bytes) { next_block(); }
      std::size_t const n = std::min(bytes, block_bytes - offset_);
      std::byte* stage    = ring_.data() + block_ * block_bytes + offset_;
      std::memcpy(stage, s, n);
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d, stage, n, cudaMemcpyHostToDevice, stream));
      DHISPARSE_CUDA_TRY(cudaEventRecord(events_[block_], stream));
      pending_[block_] = true;
      offset_ += (n + 15) & ~std::size_t{15};
      offset_ = std::min(offset_, block_bytes);
      d += n;
      s += n;
      bytes -= n;
    }
  }

  /// Uploads one trivially copyable value.
  template <class T>
  void upload_value(T* dst, T const& value, cudaStream_t stream)
  {
    upload(dst, &value, sizeof(T), stream);
  }

 private:
  void next_block()
  {
    block_  = (block_ + 1) % num_blocks;
    offset_ = 0;
    if (pending_[block_]) {
      DHISPARSE_CUDA_TRY(cudaEventSynchronize(events_[block_]));
      pending_[block_] = false;
    }
  }

  pinned_array<std::byte> ring_;
  std::array<cudaEvent_t, num_blocks> events_{};
  std::array<bool, num_blocks> pending_{};
  int block_          = 0;
  std::size_t offset_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace dhisparse::detail
