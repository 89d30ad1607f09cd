/**
 * @file bench/resolve/workload.cuh
 * @brief Device side of the resolve benchmark's workload: the mapped pinned host store
 *        filled with `row_vector` rows, row writes and row checks against that function,
 *        and a trace's inputs and hot-buffer state uploaded for the baseline kernel.
 */
#pragma once

#include <resolve/hisparse_baseline.cuh>
#include <resolve/workload.hpp>

#include <dhisparse/detail/device_memory.cuh>
#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/host_store.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace dhisparse::bench::resolve {

/// A hot-buffer row and the (request, position) whose bytes it must hold.
struct row_binding {
  std::int64_t row;  ///< buffer row (r × H + slot)
  std::int32_t request;
  std::int32_t position;
};

namespace detail {

DHISPARSE_DEVICE DHISPARSE_FORCEINLINE int4 row_int4(std::uint64_t salt, std::int32_t request, std::int32_t position,
                                                     std::uint32_t vector)
{
  dhisparse::detail::philox_block const v = row_vector(salt, request, position, vector);
  return make_int4(int(v.x), int(v.y), int(v.z), int(v.w));
}

/// Writes every row of every request's history into the host store (through the mapping).
DHISPARSE_KERNEL void fill_store_kernel(host_store_ref store, group_layout layout, int num_requests,
                                        int max_context, int vectors, std::uint64_t salt)
{
  std::int64_t const total = std::int64_t(num_requests) * max_context * vectors;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const row     = i / vectors;
    auto const vec             = std::uint32_t(i - row * vectors);
    auto const request         = std::int32_t(row / max_context);
    auto const position        = std::int32_t(row - std::int64_t(request) * max_context);
    auto* dst = reinterpret_cast<int4*>(store.group_row(request, position, layout));
    dst[vec]  = row_int4(salt, request, position, vec);
  }
}

/// Writes the bound rows (row_bytes each) into `rows`.
DHISPARSE_KERNEL void write_rows_kernel(std::byte* rows, int vectors, row_binding const* bindings,
                                        std::int64_t count, std::uint64_t salt)
{
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count * vectors;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    row_binding const bd = bindings[i / vectors];
    auto const vec       = std::uint32_t(i % vectors);
    reinterpret_cast<int4*>(rows + bd.row * vectors * 16)[vec] = row_int4(salt, bd.request, bd.position, vec);
  }
}

/// Compares the bound rows with `row_vector`; the smallest failing binding index goes to
/// `first_bad` (left untouched when all match).
DHISPARSE_KERNEL void verify_rows_kernel(std::byte const* rows, int vectors, row_binding const* bindings,
                                         std::int64_t count, std::uint64_t salt, unsigned long long* first_bad)
{
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count * vectors;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    row_binding const bd = bindings[i / vectors];
    auto const vec       = std::uint32_t(i % vectors);
    int4 const got  = reinterpret_cast<int4 const*>(rows + bd.row * vectors * 16)[vec];
    int4 const want = row_int4(salt, bd.request, bd.position, vec);
    if (got.x != want.x || got.y != want.y || got.z != want.z || got.w != want.w) {
      atomicMin(first_bad, static_cast<unsigned long long>(i / vectors));
    }
  }
}

inline constexpr int helper_blocks  = 1024;
inline constexpr int helper_threads = 256;

}  // namespace detail

/// Copies a host vector into a new device array (synchronous).
template <class T>
dhisparse::detail::device_array<T> to_device(std::vector<T> const& v)
{
  dhisparse::detail::device_array<T> d(v.size());
  if (!v.empty()) { DHISPARSE_CUDA_TRY(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  return d;
}

/// Copies `n` elements of device memory into a host vector (synchronous).
template <class T>
std::vector<T> to_host(T const* d, std::size_t n)
{
  std::vector<T> v(n);
  if (n > 0) { DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost)); }
  return v;
}

/**
 * @brief Move-only owner of a pinned, mapped, paged host store laid out by a
 *        `paged_layout` and holding `row_vector(salt, …)` in every row.
 */
class mapped_store {
 public:
  /// Allocates and fills the store (the fill runs on the device through the mapping; synchronises).
  mapped_store(paged_layout layout, std::uint64_t salt) : layout_{std::move(layout)}, salt_{salt}
  {
    DHISPARSE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_), layout_.pool_bytes(),
                                     cudaHostAllocMapped | cudaHostAllocPortable));
    DHISPARSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
    page_table_ = to_device(layout_.page_table);
    detail::fill_store_kernel<<<detail::helper_blocks, detail::helper_threads>>>(
      ref(), group(), layout_.num_requests, layout_.max_context, int(layout_.row_bytes / 16), salt_);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  }
  mapped_store(mapped_store&& o) noexcept
    : layout_{std::move(o.layout_)},
      salt_{o.salt_},
      host_{std::exchange(o.host_, nullptr)},
      device_{std::exchange(o.device_, nullptr)},
      page_table_{std::move(o.page_table_)}
  {
  }
  mapped_store& operator=(mapped_store&&)      = delete;
  mapped_store(mapped_store const&)            = delete;
  mapped_store& operator=(mapped_store const&) = delete;
  ~mapped_store()
  {
    if (host_ != nullptr) { cudaFreeHost(host_); }
  }

  /// Device view with the library's addressing.
  [[nodiscard]] host_store_ref ref() const
  {
    return host_store_ref{device_, page_table_.data(), layout_.pages_per_request, layout_.page_shift,
                          layout_.page_bytes()};
  }
  /// One-layer groups at the start of each page.
  [[nodiscard]] group_layout group() const { return group_layout{0, layout_.row_bytes}; }
  [[nodiscard]] paged_layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] std::uint64_t salt() const noexcept { return salt_; }

 private:
  paged_layout layout_;
  std::uint64_t salt_;
  std::byte* host_   = nullptr;
  std::byte* device_ = nullptr;
  dhisparse::detail::device_array<std::int32_t> page_table_;
};

/// Writes `row_vector` rows into buffer rows (synchronous).
inline void write_rows(std::byte* rows, std::size_t row_bytes, std::vector<row_binding> const& bindings,
                       std::uint64_t salt)
{
  if (bindings.empty()) { return; }
  auto const d = to_device(bindings);
  detail::write_rows_kernel<<<detail::helper_blocks, detail::helper_threads>>>(
    rows, int(row_bytes / 16), d.data(), std::int64_t(bindings.size()), salt);
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
}

/// Index of the first binding whose buffer row differs from `row_vector`, -1 if none (synchronous).
inline std::int64_t first_wrong_row(std::byte const* rows, std::size_t row_bytes,
                                     std::vector<row_binding> const& bindings, std::uint64_t salt)
{
  if (bindings.empty()) { return -1; }
  auto const d = to_device(bindings);
  auto const first_bad = to_device(std::vector<unsigned long long>{~0ull});
  detail::verify_rows_kernel<<<detail::helper_blocks, detail::helper_threads>>>(
    rows, int(row_bytes / 16), d.data(), std::int64_t(bindings.size()), salt, first_bad.data());
  DHISPARSE_CUDA_TRY(cudaGetLastError());
  unsigned long long const bad = to_host(first_bad.data(), 1)[0];
  return bad == ~0ull ? -1 : std::int64_t(bad);
}

/**
 * @brief A trace on the device: every step's inputs, the hot-buffer state (reset to the
 *        trace's start on demand) and the outputs, with the kernel parameters of each step.
 */
class baseline_run {
 public:
  baseline_run(trace const& t, mapped_store const& store)
    : t_{t},
      store_{store},
      K_{t.options.top_k},
      H_{t.options.hot_slots},
      batch_{t.options.batch},
      slots_{std::size_t(t.options.num_requests) * std::size_t(t.options.hot_slots)},
      buffer_rows_(slots_ * store.layout().row_bytes),
      slot_position_(slots_),
      lru_(slots_),
      requests_{to_device(t.requests)},
      slot_table_(std::size_t(batch_) * std::size_t(K_)),
      newest_slot_(std::size_t(batch_)),
      copied_rows_(std::size_t(batch_) * t.steps.size())
  {
    std::vector<std::int32_t> top_k, lengths;
    for (step_input const& in : t.steps) {
      top_k.insert(top_k.end(), in.top_k.begin(), in.top_k.end());
      lengths.insert(lengths.end(), in.lengths.begin(), in.lengths.end());
    }
    top_k_   = to_device(top_k);
    lengths_ = to_device(lengths);
  }

  /**
   * @brief Puts back the trace's start: state arrays, resident rows holding their truth,
   *        empty rows poisoned (0xCD), outputs poisoned (0xAB). Synchronises the device.
   */
  void reset()
  {
    std::vector<std::int32_t> positions, order;
    std::vector<row_binding> resident;
    for (int r = 0; r < t_.initial.num_requests(); ++r) {
      hisparse::buffer_state const& st = t_.initial.request(r);
      positions.insert(positions.end(), st.slot_position.begin(), st.slot_position.end());
      order.insert(order.end(), st.lru.begin(), st.lru.end());
      for (int slot = 0; slot < H_; ++slot) {
        std::int32_t const q = st.slot_position[std::size_t(slot)];
        if (q >= 0) { resident.push_back({std::int64_t(r) * H_ + slot, r, q}); }
      }
    }
    DHISPARSE_CUDA_TRY(cudaMemcpy(slot_position_.data(), positions.data(), slot_position_.bytes(), cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemcpy(lru_.data(), order.data(), lru_.bytes(), cudaMemcpyHostToDevice));
    DHISPARSE_CUDA_TRY(cudaMemset(buffer_rows_.data(), 0xCD, buffer_rows_.bytes()));
    write_rows(buffer_rows_.data(), store_.layout().row_bytes, resident, store_.salt());
    DHISPARSE_CUDA_TRY(cudaMemset(copied_rows_.data(), 0xAB, copied_rows_.bytes()));
    poison_outputs();
  }

  /// Poisons the slot table and newest slots (0xABABABAB); synchronises the device.
  void poison_outputs()
  {
    DHISPARSE_CUDA_TRY(cudaMemset(slot_table_.data(), 0xAB, slot_table_.bytes()));
    DHISPARSE_CUDA_TRY(cudaMemset(newest_slot_.data(), 0xAB, newest_slot_.bytes()));
    DHISPARSE_CUDA_TRY(cudaDeviceSynchronize());
  }

  /// Kernel parameters of step `s`.
  [[nodiscard]] hisparse::swap_in_params params(int s) const
  {
    hisparse::swap_in_params p{};
    p.top_k         = top_k_.data() + std::size_t(s) * std::size_t(batch_) * std::size_t(K_);
    p.requests      = requests_.data();
    p.lengths       = lengths_.data() + std::size_t(s) * std::size_t(batch_);
    p.host          = store_.ref();
    p.layout        = store_.group();
    p.layer_offset  = 0;
    p.buffer_rows   = buffer_rows_.data();
    p.slot_position = slot_position_.data();
    p.lru           = lru_.data();
    p.slot_table    = slot_table_.data();
    p.newest_slot   = newest_slot_.data();
    p.copied_rows   = copied_rows_.data() + std::size_t(s) * std::size_t(batch_);
    p.batch         = batch_;
    p.top_k_count   = K_;
    p.hot_slots     = H_;
    p.row_bytes     = store_.layout().row_bytes;
    return p;
  }

  [[nodiscard]] std::vector<std::int32_t> slot_position() const { return to_host(slot_position_.data(), slots_); }
  [[nodiscard]] std::vector<std::int32_t> lru() const { return to_host(lru_.data(), slots_); }
  [[nodiscard]] std::vector<std::int32_t> slot_table() const { return to_host(slot_table_.data(), slot_table_.size()); }
  [[nodiscard]] std::vector<std::int32_t> newest_slot() const { return to_host(newest_slot_.data(), newest_slot_.size()); }
  /// [steps][batch] rows each step copied.
  [[nodiscard]] std::vector<std::int32_t> copied_rows() const { return to_host(copied_rows_.data(), copied_rows_.size()); }
  [[nodiscard]] std::byte* buffer_rows() const { return buffer_rows_.data(); }

  /// Bindings of every valid slot-table entry of step `s` (from the downloaded table).
  [[nodiscard]] std::vector<row_binding> named_rows(int s, std::vector<std::int32_t> const& table) const
  {
    std::vector<row_binding> out;
    step_input const& in = t_.steps[std::size_t(s)];
    for (int b = 0; b < batch_; ++b) {
      for (int k = 0; k < K_; ++k) {
        std::size_t const i = std::size_t(b) * std::size_t(K_) + std::size_t(k);
        std::int32_t const q = in.top_k[i];
        if (q >= 0 && q < in.lengths[std::size_t(b)] && table[i] >= 0) {
          out.push_back({table[i], t_.requests[std::size_t(b)], q});
        }
      }
    }
    return out;
  }

 private:
  trace const& t_;
  mapped_store const& store_;
  int K_, H_, batch_;
  std::size_t slots_;
  dhisparse::detail::device_array<std::byte> buffer_rows_;
  dhisparse::detail::device_array<std::int32_t> slot_position_, lru_;
  dhisparse::detail::device_array<std::int32_t> requests_, top_k_, lengths_;
  dhisparse::detail::device_array<std::int32_t> slot_table_, newest_slot_, copied_rows_;
};

}  // namespace dhisparse::bench::resolve
