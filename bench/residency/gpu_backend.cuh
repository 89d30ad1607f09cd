/**
 * @file bench/residency/gpu_backend.cuh
 * @brief The GPU's `kv_hierarchy` as a backend of the simulator (`sim::simulate`): the
 *        host reference's calls, with host arrays, each ordered on one stream.
 *
 * Selections, scores and accepted counts are copied to the device before the call that
 * reads them; every resolve also retrieves (`resolve_and_retrieve`), so the rows a run
 * fetches really cross PCIe. `status`, `counters` and `owned_slots` synchronize the stream.
 */
#pragma once

#include <sim/simulator.hpp>

#include <dhisparse/hierarchy.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace dhisparse::bench::residency {

/// `sim::simulate`'s backend over `kv_hierarchy<RowFormat, Eviction, Budget>`.
template <class RowFormat>
struct gpu_backend {
  template <class Eviction, class Budget>
  class hierarchy {
   public:
    explicit hierarchy(hierarchy_config const& config)
      : stream_{make_stream()},
        h_{config, stream_.get()},
        entries_{std::size_t(config.max_batch) * std::size_t(config.max_queries) * std::size_t(config.max_top_k)},
        selections_{entries_},
        scores_{Eviction::needs_scores ? entries_ : 0},
        accepted_{std::size_t(config.max_batch)},
        pinned_{make_pinned()}
    {
    }

    [[nodiscard]] hierarchy_config const& config() const noexcept { return h_.config(); }
    [[nodiscard]] std::size_t num_requests() const noexcept { return h_.num_requests(); }

    void admit(request_id id, std::int32_t length, std::int64_t capacity) { h_.admit(id, length, stream(), capacity); }
    void prewarm(request_id id, std::int32_t count) { h_.prewarm(id, count, stream()); }
    void release(request_id id) { h_.release(id, stream()); }
    void set_batch(request_id const* ids, std::int32_t const* queries, int count)
    {
      h_.set_batch(ids, queries, count, stream());
    }

    /// `selections` (and `scores`): host `[batch][max_queries][top_k]`.
    void resolve(int group, std::int32_t const* selections, int top_k, float const* scores = nullptr)
    {
      std::size_t const n = std::size_t(h_.batch_count()) * std::size_t(config().max_queries) * std::size_t(top_k);
      upload(selections_.data(), selections, n);
      float* device_scores = nullptr;
      if (scores != nullptr && scores_.size() > 0) {
        upload(scores_.data(), scores, n);
        device_scores = scores_.data();
      }
      h_.resolve_and_retrieve(group, selections_.data(), top_k, stream(), device_scores);
    }

    /// `accepted`: host `[batch]`, or nullptr (every query kept).
    void commit(std::int32_t const* accepted)
    {
      if (accepted != nullptr) { upload(accepted_.data(), accepted, std::size_t(h_.batch_count())); }
      h_.commit(accepted != nullptr ? accepted_.data() : nullptr, stream());
    }
    void backup() { h_.backup(stream()); }

    [[nodiscard]] std::uint32_t status() const { return h_.status_sync(stream()); }
    [[nodiscard]] group_counters counters(int group) const
    {
      h_.read_counters(group, &pinned_->counters, stream());
      synchronize();
      return pinned_->counters;
    }
    /// Slots of `group` owned by requests (the pool limit less the free stack).
    [[nodiscard]] std::int64_t owned_slots(int group) const
    {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&pinned_->free_count, h_.pool_ref(group).free_count, sizeof(std::int32_t),
                                         cudaMemcpyDeviceToHost, stream()));
      synchronize();
      return h_.pool_limit(group) - pinned_->free_count;
    }
    /// Bytes of one row of `group` (all its layers), as it crosses PCIe.
    [[nodiscard]] std::size_t group_row_bytes(int group) const { return h_.group_row_bytes(group); }

   private:
    struct stream_destroy {
      void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
    };
    struct host_side {
      group_counters counters;
      std::int32_t free_count;
    };
    struct pinned_free {
      void operator()(host_side* p) const noexcept { cudaFreeHost(p); }
    };
    using stream_ptr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, stream_destroy>;

    static stream_ptr make_stream()
    {
      cudaStream_t s = nullptr;
      DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      return stream_ptr(s);
    }
    static std::unique_ptr<host_side, pinned_free> make_pinned()
    {
      void* p = nullptr;
      DHISPARSE_CUDA_TRY(cudaHostAlloc(&p, sizeof(host_side), cudaHostAllocDefault));
      return std::unique_ptr<host_side, pinned_free>(static_cast<host_side*>(p));
    }
    cudaStream_t stream() const noexcept { return stream_.get(); }
    void synchronize() const { DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream())); }
    template <class T>
    void upload(T* to, T const* from, std::size_t n)
    {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyHostToDevice, stream()));
    }

    stream_ptr stream_;
    kv_hierarchy<RowFormat, Eviction, Budget> h_;
    std::size_t entries_;
    dhisparse::detail::device_array<std::int32_t> selections_;
    dhisparse::detail::device_array<float> scores_;
    dhisparse::detail::device_array<std::int32_t> accepted_;
    std::unique_ptr<host_side, pinned_free> pinned_;
  };
};

}  // namespace dhisparse::bench::residency
