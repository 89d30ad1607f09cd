/**
 * @file trace_recorder.cuh
 * @brief Records an engine's selections into a trace file (trace.hpp) from its step
 *        loop on the GPU, without stalling the step.
 *
 * `record` enqueues, on the caller's stream, one device→host `cudaMemcpyAsync` per
 * group (and per group for scores, one for accepted counts) into the next slot of a pinned
 * staging ring, followed by one event; it returns at once. A host thread waits for the
 * event of the oldest filled slot, validates and appends the step to the file, and frees
 * the slot. `record` waits only when every slot is still in flight (the GPU or the disk is
 * more than `ring_steps` steps behind); each such wait is counted in
 * `recorder_stats::ring_full_waits`. Nothing is allocated after construction.
 *
 * CUDA graphs: `record` is stream-ordered work that never synchronizes, so an engine
 * that replays a captured step graph calls `record` right after `cudaGraphLaunch` on the
 * same stream; the copies then see that step's selections. `record` must not itself be
 * captured (a replayed copy would land in a slot nobody is waiting for): it throws on a
 * capturing stream.
 *
 * Errors of the host thread (an invalid selection, a full disk) are kept and thrown by
 * the next `record`, `flush` or `close`; after one, later steps are not written.
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/trace.hpp>

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace dhisparse::trace {

/**
 * @brief One step as the engine holds it: request metadata on the host, selections (and
 *        optionally scores and accepted counts) on the device.
 */
struct device_step {
  request_id const* ids         = nullptr;  ///< host [count]: the batch's request ids
  std::int32_t const* queries   = nullptr;  ///< host [count]: queries per request, 1 .. max_queries
  std::int32_t const* lengths   = nullptr;  ///< host [count]: committed tokens before the step
  std::int32_t count            = 0;        ///< requests in the step, 0 .. max_requests
  /// Host array [groups] of device pointers, each int32 [count ..][max_queries][top_k]
  /// (the buffer given to `resolve`; the first `count` rows are recorded).
  std::int32_t const* const* selections = nullptr;
  /// Host array [groups] of device pointers, each float [count ..][max_queries][top_k];
  /// required iff the trace's shape has scores, else nullptr.
  float const* const* scores = nullptr;
  /// Device int32 [count]: accepted tail tokens per request (verify steps); required iff
  /// the trace's shape has accepted counts, else nullptr.
  std::int32_t const* accepted = nullptr;
};

/// Counters of a `recorder`.
struct recorder_stats {
  std::uint64_t recorded        = 0;  ///< steps passed to `record`
  std::uint64_t written         = 0;  ///< steps the host thread has finished (written or dropped after an error)
  std::uint64_t ring_full_waits = 0;  ///< `record` calls that had to wait for a free ring slot
};

/**
 * @brief Asynchronous trace writer fed from the GPU: device → pinned ring → file.
 *
 * Owns the file, the pinned ring (`ring_steps` slots, each sized for a full step) and the
 * host thread. Neither copyable nor movable (the thread refers to it). The destructor
 * completes the file like `close` but never throws.
 */
class recorder {
 public:
  /**
   * @brief Creates the trace file, allocates the ring and starts the host thread.
   * @param path the trace file (created or truncated)
   * @param s shapes of the steps to record; `max_queries` and `top_k` are those of the
   *        engine's selection buffers
   * @param ring_steps slots of the pinned staging ring (at least 1)
   * @param pinned resource of the ring (nullptr: `cudaHostAlloc`)
   */
  recorder(std::string path, trace::shape const& s, int ring_steps = 4, pinned_memory_resource* pinned = nullptr)
    : writer_{std::move(path), s}, shape_{s}
  {
    DHISPARSE_EXPECTS(ring_steps >= 1, "recorder: ring_steps must be at least 1");
    DHISPARSE_CUDA_TRY(cudaGetDevice(&device_));
    entries_        = shape_.group_entries(shape_.max_requests) * std::size_t(shape_.groups);
    slot_bytes_     = entries_ * sizeof(std::int32_t) * (shape_.scores ? 2 : 1) +
                      std::size_t(shape_.max_requests) * sizeof(std::int32_t);
    ring_ = dhisparse::detail::pinned_array<std::byte>(slot_bytes_ * std::size_t(ring_steps),
                                                       pinned != nullptr ? *pinned : default_pinned_resource(), nullptr);
    slots_.resize(std::size_t(ring_steps));
    for (auto& slot : slots_) {
      cudaEvent_t event = nullptr;
      DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
      slot.copied.reset(event);
      slot.requests.resize(std::size_t(shape_.max_requests));
    }
    thread_ = std::thread([this] { run(); });
  }
  recorder(recorder const&)            = delete;
  recorder& operator=(recorder const&) = delete;
  recorder(recorder&&)                 = delete;
  recorder& operator=(recorder&&)      = delete;

  /// Waits for the recorded steps, completes the file; never throws (call `close` to see errors).
  ~recorder()
  {
    stop_thread();
    try {
      writer_.close();
    } catch (...) {  // a destructor never throws; `close` reports errors
    }
  }

  /**
   * @brief Enqueues the copies of one step on `stream` and returns; waits only if all ring
   *        slots are in flight (counted in `ring_full_waits`).
   * @param step the step's metadata (host) and buffers (device)
   * @param stream the stream that produced the selections; must not be capturing
   * @throws dhisparse::error on invalid arguments, a CUDA failure, or an earlier error
   *         of the host thread
   */
  void record(device_step const& step, cudaStream_t stream)
  {
    rethrow_error();
    DHISPARSE_EXPECTS(!closed_, "recorder::record: the recorder is closed");
    check_arguments(step);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DHISPARSE_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    DHISPARSE_EXPECTS(capture == cudaStreamCaptureStatusNone,
                      "recorder::record: the stream is capturing a CUDA graph; call record after launching "
                      "the graph, on the same stream");

    std::unique_lock<std::mutex> lock(mutex_);
    if (recorded_ - written_ == slots_.size()) {
      ++ring_full_waits_;
      changed_.wait(lock, [&] { return recorded_ - written_ < slots_.size(); });
    }
    std::size_t const index = std::size_t(recorded_ % slots_.size());
    lock.unlock();

    slot& s      = slots_[index];
    s.count      = step.count;
    std::byte* base = ring_.data() + index * slot_bytes_;
    for (int r = 0; r < step.count; ++r) {
      s.requests[r] = request_record{step.ids[r], step.lengths[r], step.queries[r], -1};
    }
    try {
      std::size_t const group_bytes = shape_.group_entries(step.count) * sizeof(std::int32_t);
      for (int g = 0; g < shape_.groups && group_bytes > 0; ++g) {
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(base + g * group_bytes, step.selections[g], group_bytes,
                                           cudaMemcpyDeviceToHost, stream));
        if (shape_.scores) {
          DHISPARSE_CUDA_TRY(cudaMemcpyAsync(base + scores_offset() + g * group_bytes, step.scores[g], group_bytes,
                                             cudaMemcpyDeviceToHost, stream));
        }
      }
      if (shape_.accepted && step.count > 0) {
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(base + accepted_offset(), step.accepted,
                                           std::size_t(step.count) * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                                           stream));
      }
      DHISPARSE_CUDA_TRY(cudaEventRecord(s.copied.get(), stream));
    } catch (...) {
      // A copy may still target this slot: no later step may reuse it.
      fail(std::current_exception());
      throw;
    }
    lock.lock();
    ++recorded_;
    lock.unlock();
    changed_.notify_all();
  }

  /**
   * @brief Blocks until every recorded step is in the file (or dropped after an error).
   * @throws dhisparse::error if the host thread failed
   */
  void flush()
  {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return written_ == recorded_; });
    }
    rethrow_error();
  }

  /**
   * @brief Blocks until every recorded step is written, stops the host thread and
   *        completes the file. Idempotent.
   * @throws dhisparse::error if the host thread failed or the file cannot be completed
   */
  void close()
  {
    stop_thread();
    writer_.close();
    rethrow_error();
  }

  /// @brief The counters (a consistent snapshot).
  [[nodiscard]] recorder_stats stats() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return {recorded_, written_, ring_full_waits_};
  }
  /// @brief The trace's shapes.
  [[nodiscard]] trace::shape const& shape() const noexcept { return shape_; }

 private:
  struct event_destroy {
    void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
  };
  struct slot {
    std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_destroy> copied;
    std::int32_t count = 0;
    std::vector<request_record> requests;  // [max_requests], host metadata of the step
  };

  std::size_t scores_offset() const noexcept { return entries_ * sizeof(std::int32_t); }
  std::size_t accepted_offset() const noexcept
  {
    return entries_ * sizeof(std::int32_t) * (shape_.scores ? 2 : 1);
  }

  void check_arguments(device_step const& step) const
  {
    DHISPARSE_EXPECTS(step.count >= 0 && step.count <= shape_.max_requests,
                      "recorder::record: count (" + std::to_string(step.count) + ") is not in [0, max_requests = " +
                        std::to_string(shape_.max_requests) + "]");
    if (step.count > 0) {
      DHISPARSE_EXPECTS(step.ids != nullptr && step.queries != nullptr && step.lengths != nullptr,
                        "recorder::record: ids, queries and lengths are required");
      DHISPARSE_EXPECTS(step.selections != nullptr, "recorder::record: selections are required");
      for (int g = 0; g < shape_.groups; ++g) {
        DHISPARSE_EXPECTS(step.selections[g] != nullptr,
                          "recorder::record: selections[" + std::to_string(g) + "] is null");
        DHISPARSE_EXPECTS(!shape_.scores || (step.scores != nullptr && step.scores[g] != nullptr),
                          "recorder::record: the trace carries scores: scores[" + std::to_string(g) + "] is required");
      }
      DHISPARSE_EXPECTS(!shape_.accepted || step.accepted != nullptr,
                        "recorder::record: the trace carries accepted counts: accepted is required");
      // Everything known on the host is checked now; positions and accepted counts are
      // checked by the host thread once copied.
      std::vector<request_record> requests(std::size_t(step.count));
      for (int r = 0; r < step.count; ++r) {
        requests[r] = request_record{step.ids[r], step.lengths[r], step.queries[r], -1};
      }
      trace::shape host_part = shape_;
      host_part.accepted     = false;
      detail::check_requests(host_part, requests.data(), step.count, stats().recorded, "recorder::record");
    }
    DHISPARSE_EXPECTS(shape_.scores || step.scores == nullptr,
                      "recorder::record: scores given but the trace carries none");
    DHISPARSE_EXPECTS(shape_.accepted || step.accepted == nullptr,
                      "recorder::record: accepted counts given but the trace carries none");
  }

  /// The host thread: writes filled slots in order once their copies completed.
  void run()
  {
    cudaError_t const device_status = cudaSetDevice(device_);
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || written_ < recorded_; });
      if (written_ == recorded_) { return; }  // stop_ and drained
      slot& s          = slots_[std::size_t(written_ % slots_.size())];
      bool const write = error_ == nullptr;
      lock.unlock();
      // The slot is freed only after its copies completed, whatever happens.
      cudaError_t const copied = device_status == cudaSuccess ? cudaEventSynchronize(s.copied.get()) : device_status;
      if (write) {
        try {
          DHISPARSE_CUDA_TRY(copied);
          write_slot(s, std::size_t(written_ % slots_.size()));
        } catch (...) {
          fail(std::current_exception());
        }
      }
      lock.lock();
      ++written_;
      lock.unlock();
      changed_.notify_all();
    }
  }

  void write_slot(slot& s, std::size_t index)
  {
    std::byte const* base = ring_.data() + index * slot_bytes_;
    if (shape_.accepted) {
      auto const* accepted = reinterpret_cast<std::int32_t const*>(base + accepted_offset());
      for (int r = 0; r < s.count; ++r) { s.requests[r].accepted = accepted[r]; }
    }
    step_view v;
    v.requests  = s.requests.data();
    v.count     = s.count;
    v.positions = reinterpret_cast<std::int32_t const*>(base);
    v.scores    = shape_.scores ? reinterpret_cast<float const*>(base + scores_offset()) : nullptr;
    writer_.write(v);
  }

  void fail(std::exception_ptr e)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_ == nullptr) { error_ = std::move(e); }
  }
  void rethrow_error() const
  {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      e = error_;
    }
    if (e != nullptr) { std::rethrow_exception(e); }
  }

  /// Lets the thread drain the ring, then joins it. Never throws.
  void stop_thread() noexcept
  {
    if (!thread_.joinable()) { return; }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
    closed_ = true;
  }

  writer writer_;  // used by the host thread only, until it is joined
  trace::shape shape_;
  int device_              = 0;
  std::size_t entries_     = 0;  // int32 entries of one slot's positions
  std::size_t slot_bytes_  = 0;
  dhisparse::detail::pinned_array<std::byte> ring_;
  std::vector<slot> slots_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t recorded_        = 0;  // slots filled (copies enqueued)
  std::uint64_t written_         = 0;  // slots finished by the host thread
  std::uint64_t ring_full_waits_ = 0;
  bool stop_                     = false;
  bool closed_                   = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace dhisparse::trace
