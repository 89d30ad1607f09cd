/**
 * @file gpu_test.cuh
 * @brief Helpers for GPU tests: the skip code, checked CUDA calls, small RAII buffers and a
 *        captured CUDA graph.
 */
#pragma once

#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

namespace dhisparse::test {

/// Exit code of a GPU test executable on a machine without a CUDA device (CTest
/// SKIP_RETURN_CODE).
inline constexpr int skip_return_code = 77;

/// Owning device allocation of `n` elements of `T`, for tests.
template <class T>
class device_vector {
 public:
  device_vector() = default;
  explicit device_vector(std::size_t n) : size_{n}
  {
    if (n > 0) { DHISPARSE_CUDA_TRY(cudaMalloc(&data_, n * sizeof(T))); }
  }
  explicit device_vector(std::vector<T> const& host) : device_vector(host.size()) { upload(host); }
  device_vector(device_vector&& o) noexcept : data_{o.data_}, size_{o.size_}
  {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  device_vector& operator=(device_vector&& o) noexcept
  {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  device_vector(device_vector const&)            = delete;
  device_vector& operator=(device_vector const&) = delete;
  ~device_vector() { cudaFree(data_); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

  void upload(std::vector<T> const& host)
  {
    DHISPARSE_EXPECTS(host.size() == size_, "device_vector::upload: size mismatch");
    DHISPARSE_CUDA_TRY(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());  // see fill_bytes
  }
  /// Uploads `host` into the first host.size() elements.
  void upload_prefix(std::vector<T> const& host)
  {
    DHISPARSE_EXPECTS(host.size() <= size_, "device_vector::upload_prefix: too many elements");
    DHISPARSE_CUDA_TRY(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());  // see fill_bytes
  }
  std::vector<T> download() const
  {
    std::vector<T> host(size_);
    DHISPARSE_CUDA_TRY(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Fills every byte with `byte` (e.g. 0xFF makes every int32 -1, 0x7F poisons floats).
  /// Done when it returns: a `cudaMemset` (and a pageable `cudaMemcpy`'s DMA) runs on the
  /// legacy default stream, which work on a `cudaStreamNonBlocking` stream does not wait
  /// for (finding F17: a graph replayed on such a stream raced the poisoning of its outputs).
  void fill_bytes(int byte)
  {
    DHISPARSE_CUDA_TRY(cudaMemset(data_, byte, size_ * sizeof(T)));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  }

 private:
  T* data_          = nullptr;
  std::size_t size_ = 0;
};

/// A stream of its own and a CUDA graph captured on it from `record(stream)` (called once,
/// at construction); `replay()` launches the graph and waits for it. Owns all three.
class captured_graph {
 public:
  template <class Record>
  explicit captured_graph(Record&& record)
  {
    DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream_));
    DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    record(stream_);
    DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream_, &graph_));
    DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  captured_graph(captured_graph const&)            = delete;
  captured_graph& operator=(captured_graph const&) = delete;
  ~captured_graph()
  {
    if (exec_) { cudaGraphExecDestroy(exec_); }
    if (graph_) { cudaGraphDestroy(graph_); }
    if (stream_) { cudaStreamDestroy(stream_); }
  }

  void replay()
  {
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec_, stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_  = nullptr;
  cudaGraph_t graph_    = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace dhisparse::test
