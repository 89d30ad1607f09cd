// PyTorch glue for dhisparse: `torch.classes.dhisparse.Hierarchy`, one KV hierarchy of
// FP8 MLA rows (LRU, adaptive budget) with sparse attention over it (mla_hierarchy.hpp).
//
// * Memory: every device allocation of the hierarchy comes from PyTorch's CUDA caching
//   allocator (`hierarchy_config::resources`), so it shows in torch.cuda.memory_allocated()
//   and shares the pool of the model's tensors.
// * Streams: every call runs on torch's current stream of the hierarchy's device, so the
//   step is captured by torch.cuda.graph like any torch op.
// * Views: tail slots, slot tables, layer rows, counters are tensors over the hierarchy's
//   device buffers (no copy); each keeps the hierarchy alive.
//
// Compiled by the host compiler; the kernels are in mla_hierarchy.cu (nvcc, no torch headers).
#include "mla_hierarchy.hpp"

#include <dhisparse/memory_resource.cuh>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using dhisparse_torch::mla_hierarchy;

/// Device memory from PyTorch's CUDA caching allocator, on the stream the library names.
/// Its blocks are 512-byte aligned, above the 256 the library asks for.
class torch_device_resource final : public dhisparse::device_memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t alignment, cudaStream_t stream) override
  {
    void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
    if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
      c10::cuda::CUDACachingAllocator::raw_delete(p);
      TORCH_CHECK(false, "dhisparse: the CUDA caching allocator returned memory aligned below ", alignment, " bytes");
    }
    return p;
  }
  void do_deallocate(void* p, std::size_t, std::size_t, cudaStream_t) noexcept override
  {
    try {
      c10::cuda::CUDACachingAllocator::raw_delete(p);
    } catch (...) {  // deallocation never throws (memory_resource.cuh)
    }
  }
};

dhisparse_torch::mla_shape make_shape(std::vector<int64_t> const& group_layers, int64_t max_requests,
                                      int64_t max_batch, int64_t max_queries, int64_t max_top_k, int64_t max_context,
                                      int64_t device_slots_per_group, int64_t host_capacity_pages, int64_t num_heads)
{
  auto const in_int = [](int64_t v, char const* name) {
    TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "Hierarchy: ", name, " (", v, ") out of range");
    return int(v);
  };
  dhisparse_torch::mla_shape s;
  for (int64_t layers : group_layers) { s.group_layers.push_back(in_int(layers, "group_layers")); }
  s.max_requests           = in_int(max_requests, "max_requests");
  s.max_batch              = in_int(max_batch, "max_batch");
  s.max_queries            = in_int(max_queries, "max_queries");
  s.max_top_k              = in_int(max_top_k, "max_top_k");
  s.max_context            = in_int(max_context, "max_context");
  s.device_slots_per_group = device_slots_per_group;
  TORCH_CHECK(host_capacity_pages > 0, "Hierarchy: host_capacity_pages must be positive");
  s.host_capacity_pages = std::size_t(host_capacity_pages);
  s.num_heads           = in_int(num_heads, "num_heads");
  return s;
}

/// Brings up torch's CUDA state (the caching allocator is created lazily) on the current
/// device and returns that device.
c10::DeviceIndex initialized_device()
{
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return c10::cuda::current_device();
}

int to_int(int64_t v) { return int(v); }

}  // namespace

/**
 * torch.classes.dhisparse.Hierarchy(group_layers, max_requests, max_batch, max_queries,
 * max_top_k, max_context, device_slots_per_group, host_capacity_pages, num_heads), on the
 * current CUDA device. See examples/torch/README.md for the calls.
 */
class Hierarchy : public torch::CustomClassHolder {
 public:
  Hierarchy(std::vector<int64_t> group_layers, int64_t max_requests, int64_t max_batch, int64_t max_queries,
            int64_t max_top_k, int64_t max_context, int64_t device_slots_per_group, int64_t host_capacity_pages,
            int64_t num_heads)
    : device_{initialized_device()},
      shape_{make_shape(group_layers, max_requests, max_batch, max_queries, max_top_k, max_context,
                        device_slots_per_group, host_capacity_pages, num_heads)},
      footprint_{mla_hierarchy::bytes_required(shape_)},
      h_{shape_, dhisparse::memory_resources{&device_memory_, &pinned_memory_}, stream()}
  {
  }

  /// The step may still run (a replayed graph on any stream): the device finishes before
  /// the memory goes back to torch's pool. Never throws.
  ~Hierarchy() override
  {
    c10::cuda::CUDAGuard guard(device_);
    cudaDeviceSynchronize();
    cudaGetLastError();
  }

  // ---- requests and batches: between steps ------------------------------------------------

  void admit(int64_t id, int64_t prompt_len, int64_t capacity)
  {
    c10::cuda::CUDAGuard guard(device_);
    TORCH_CHECK(prompt_len >= 0 && prompt_len <= std::numeric_limits<int32_t>::max(), "admit: bad prompt_len");
    h_.admit(uint64_t(id), int32_t(prompt_len), capacity, stream());
  }

  /// rows: uint8 [count, 656] on this device or on the CPU, rows contiguous (any row
  /// stride). A device source is copied asynchronously on the current stream; a CPU source
  /// has been read when this returns.
  void write_host_rows(int64_t id, int64_t group, int64_t layer, int64_t first, at::Tensor const& rows)
  {
    c10::cuda::CUDAGuard guard(device_);
    TORCH_CHECK(rows.scalar_type() == at::kByte && rows.dim() == 2 && rows.size(1) == int64_t(mla_hierarchy::row_bytes),
                "write_host_rows: rows must be uint8 [count, ", mla_hierarchy::row_bytes, "]");
    TORCH_CHECK(rows.stride(1) == 1 && rows.stride(0) >= int64_t(mla_hierarchy::row_bytes),
                "write_host_rows: each row must be contiguous");
    TORCH_CHECK(rows.is_cpu() || (rows.is_cuda() && rows.get_device() == device_),
                "write_host_rows: rows must be on the CPU or on the hierarchy's device");
    if (rows.size(0) == 0) { return; }
    h_.write_host_rows(uint64_t(id), to_int(group), to_int(layer), first, rows.size(0), rows.data_ptr(),
                       std::size_t(rows.stride(0)), stream());
    if (rows.is_cpu()) { C10_CUDA_CHECK(cudaStreamSynchronize(stream())); }
  }

  /// Rows [first, first + count) of (id, group, layer) from the host store: a CPU uint8
  /// [count, 656] copy. Synchronizes the current stream first (a backup enqueued before
  /// has written its rows).
  at::Tensor host_rows(int64_t id, int64_t group, int64_t layer, int64_t first, int64_t count)
  {
    c10::cuda::CUDAGuard guard(device_);
    TORCH_CHECK(first >= 0 && count >= 0, "host_rows: first and count must not be negative");
    C10_CUDA_CHECK(cudaStreamSynchronize(stream()));
    at::Tensor out = at::empty({count, int64_t(mla_hierarchy::row_bytes)}, at::TensorOptions().dtype(at::kByte));
    if (count > 0) { h_.read_host_rows(uint64_t(id), to_int(group), to_int(layer), first, count, out.data_ptr()); }
    return out;
  }

  /// ids: integer tensor [n] (request ids); queries: integer tensor [n] (queries per
  /// request this step; 1 for plain decoding). Entries n … max_batch − 1 are padding.
  void set_batch(at::Tensor const& ids, at::Tensor const& queries)
  {
    c10::cuda::CUDAGuard guard(device_);
    TORCH_CHECK(ids.dim() == 1 && queries.dim() == 1 && ids.numel() == queries.numel(),
                "set_batch: ids and queries must be 1-D of one length");
    at::Tensor const id64 = ids.cpu().to(at::kLong).contiguous();
    at::Tensor const q32  = queries.cpu().to(at::kInt).contiguous();
    std::vector<uint64_t> requests(std::size_t(id64.numel()));
    for (std::size_t i = 0; i < requests.size(); ++i) { requests[i] = uint64_t(id64.data_ptr<int64_t>()[i]); }
    h_.set_batch(requests.data(), q32.data_ptr<int32_t>(), int(requests.size()), stream());
  }

  void release(int64_t id)
  {
    c10::cuda::CUDAGuard guard(device_);
    h_.release(uint64_t(id), stream());
  }

  bool contains(int64_t id) { return h_.contains(uint64_t(id)); }

  /// Committed length of `id` (synchronizes the current stream).
  int64_t length(int64_t id)
  {
    c10::cuda::CUDAGuard guard(device_);
    return h_.length_sync(uint64_t(id), stream());
  }

  // ---- the step: capturable -------------------------------------------------------------

  /// selections: int32 [max_batch, max_queries, K] on this device, -1 = none, any order;
  /// K (≤ max_top_k) is this step's top-K.
  void resolve(int64_t group, at::Tensor const& selections)
  {
    c10::cuda::CUDAGuard guard(device_);
    auto const& c = h_.config();
    TORCH_CHECK(selections.is_cuda() && selections.get_device() == device_ && selections.scalar_type() == at::kInt &&
                  selections.is_contiguous() && selections.dim() == 3 && selections.size(0) == c.max_batch &&
                  selections.size(1) == c.max_queries,
                "resolve: selections must be a contiguous int32 CUDA tensor [max_batch, max_queries, K] on the "
                "hierarchy's device");
    h_.resolve(to_int(group), selections.data_ptr<int32_t>(), int(selections.size(2)), stream());
  }

  void retrieve(int64_t group)
  {
    c10::cuda::CUDAGuard guard(device_);
    h_.retrieve(to_int(group), stream());
  }

  /// queries: bf16 [max_batch, max_queries, num_heads, 576] on this device. Returns
  /// (out bf16 [max_batch, max_queries, num_heads, 512], lse float32 [max_batch,
  /// max_queries, num_heads]); entries beyond the real batch stay 0.
  std::tuple<at::Tensor, at::Tensor> attention(int64_t group, int64_t layer, at::Tensor const& queries,
                                               double softmax_scale)
  {
    c10::cuda::CUDAGuard guard(device_);
    auto const& c          = h_.config();
    int64_t const heads    = h_.num_heads();
    TORCH_CHECK(queries.is_cuda() && queries.get_device() == device_ && queries.scalar_type() == at::kBFloat16 &&
                  queries.is_contiguous() && queries.dim() == 4 && queries.size(0) == c.max_batch &&
                  queries.size(1) == c.max_queries && queries.size(2) == heads &&
                  queries.size(3) == mla_hierarchy::query_dim,
                "attention: queries must be a contiguous bf16 CUDA tensor [max_batch, max_queries, num_heads, ",
                mla_hierarchy::query_dim, "]");
    auto const on_device = at::TensorOptions().device(at::Device(at::kCUDA, device_));
    at::Tensor out = at::zeros({c.max_batch, c.max_queries, heads, int64_t(mla_hierarchy::value_dim)},
                               on_device.dtype(at::kBFloat16));
    at::Tensor lse = at::zeros({c.max_batch, c.max_queries, heads}, on_device.dtype(at::kFloat));
    h_.attention(to_int(group), to_int(layer), queries.data_ptr(), out.data_ptr(), lse.data_ptr<float>(),
                 float(softmax_scale), stream());
    return {out, lse};
  }

  /// accepted: None (keep every tail row) or int32 [max_batch] on this device.
  void commit(std::optional<at::Tensor> accepted)
  {
    c10::cuda::CUDAGuard guard(device_);
    int32_t const* counts = nullptr;
    if (accepted.has_value()) {
      TORCH_CHECK(accepted->is_cuda() && accepted->get_device() == device_ && accepted->scalar_type() == at::kInt &&
                    accepted->is_contiguous() && accepted->numel() == h_.config().max_batch,
                  "commit: accepted must be a contiguous int32 CUDA tensor [max_batch] on the hierarchy's device");
      counts = accepted->data_ptr<int32_t>();
    }
    h_.commit(counts, stream());
  }

  void backup()
  {
    c10::cuda::CUDAGuard guard(device_);
    h_.backup(stream());
  }

  // ---- views over the hierarchy's device buffers (no copy) ---------------------------------

  /// int32 [max_batch, max_queries]: the slot of each query's new row after resolve (-1: none;
  /// reset to -1 by commit).
  at::Tensor tail_slots(int64_t group)
  {
    auto const& c = h_.config();
    return view(h_.tail_slots(to_int(group)), {c.max_batch, c.max_queries}, {c.max_queries, 1}, at::kInt);
  }

  /// int32 [max_batch, max_queries, K] of the last resolve of `group` (K of that resolve).
  /// Groups of one parity share the buffer; valid until the next resolve of that parity.
  at::Tensor slot_table(int64_t group)
  {
    auto const& c   = h_.config();
    int64_t const k = h_.resolved_top_k(to_int(group));
    TORCH_CHECK(k > 0, "slot_table: group ", group, " has not been resolved");
    return view(h_.slot_table(to_int(group)), {c.max_batch, c.max_queries, k}, {c.max_queries * k, k, 1}, at::kInt);
  }

  /// uint8 [device_slots_per_group, 656]: row s is layer `layer`'s row in slot s.
  at::Tensor layer_rows(int64_t group, int64_t layer)
  {
    int64_t const slots  = h_.config().device_slots_per_group;
    int64_t const stride = int64_t(h_.group_row_bytes(to_int(group)));
    return view(h_.layer_rows(to_int(group), to_int(layer)), {slots, int64_t(mla_hierarchy::row_bytes)}, {stride, 1},
                at::kByte);
  }

  /// int32 [max_batch]: tail rows the last commit kept per batch entry.
  at::Tensor committed_rows()
  {
    int64_t const b = h_.config().max_batch;
    return view(h_.committed_rows(), {b}, {1}, at::kInt);
  }

  /// int32 [max_batch]: the status bits (status.hpp) of the last commit per batch entry.
  at::Tensor commit_status()
  {
    int64_t const b = h_.config().max_batch;
    return view(h_.commit_status(), {b}, {1}, at::kInt);
  }

  /// int64 [8]: the device counters of `group`, in the order of `counter_names()`.
  at::Tensor counters(int64_t group)
  {
    constexpr int64_t n = int64_t(std::size(dhisparse::group_counter_names));
    static_assert(sizeof(dhisparse::group_counters) == n * sizeof(int64_t));
    return view(h_.counters(to_int(group)), {n}, {1}, at::kLong);
  }

  // ---- host reads ------------------------------------------------------------------------

  std::vector<std::string> counter_names()
  {
    return {std::begin(dhisparse::group_counter_names), std::end(dhisparse::group_counter_names)};
  }

  /// The counters of `group` (synchronizes the current stream), with the bytes they moved.
  c10::Dict<std::string, int64_t> read_counters(int64_t group)
  {
    c10::cuda::CUDAGuard guard(device_);
    dhisparse::group_counters const c = h_.read_counters_sync(to_int(group), stream());
    std::size_t const row             = h_.group_row_bytes(to_int(group));
    c10::Dict<std::string, int64_t> d;
    auto const* value = reinterpret_cast<unsigned long long const*>(&c);  // the fields, in name order
    for (std::size_t i = 0; i < std::size(dhisparse::group_counter_names); ++i) {
      d.insert(dhisparse::group_counter_names[i], int64_t(value[i]));
    }
    d.insert("group_row_bytes", int64_t(row));
    d.insert("h2d_bytes", int64_t(c.h2d_bytes(row)));
    d.insert("d2h_bytes", int64_t(c.d2h_bytes(row)));
    return d;
  }

  /// The status word (synchronizes the current stream); 0 = ok.
  int64_t status()
  {
    c10::cuda::CUDAGuard guard(device_);
    return int64_t(h_.status_sync(stream()));
  }

  std::string describe_status(int64_t status) { return mla_hierarchy::describe_status(uint32_t(status)); }

  /// What construction takes from the resources, computed before it: the hierarchy's
  /// `bytes_required` plus the attention workspace.
  c10::Dict<std::string, int64_t> bytes_required()
  {
    c10::Dict<std::string, int64_t> d;
    d.insert("device_bytes", int64_t(footprint_.device_bytes));
    d.insert("pinned_bytes", int64_t(footprint_.pinned_bytes));
    d.insert("slab_bytes", int64_t(footprint_.slab_bytes));
    d.insert("host_store_bytes", int64_t(footprint_.host_store_bytes));
    d.insert("attention_workspace_bytes", int64_t(h_.attention_workspace_bytes()));
    return d;
  }

  /// What the two resources have seen: live bytes and allocations (device: torch's
  /// caching allocator; pinned: cudaHostAlloc).
  c10::Dict<std::string, int64_t> memory()
  {
    dhisparse::allocation_counts const dev = device_memory_.counts();
    dhisparse::allocation_counts const pin = pinned_memory_.counts();
    c10::Dict<std::string, int64_t> d;
    d.insert("device_bytes", int64_t(dev.bytes));
    d.insert("device_allocations", int64_t(dev.allocations));
    d.insert("device_mismatches", int64_t(dev.mismatches));
    d.insert("pinned_bytes", int64_t(pin.bytes));
    d.insert("pinned_allocations", int64_t(pin.allocations));
    d.insert("pinned_mismatches", int64_t(pin.mismatches));
    return d;
  }

  c10::Dict<std::string, int64_t> info()
  {
    auto const& c = h_.config();
    c10::Dict<std::string, int64_t> d;
    d.insert("device", int64_t(device_));
    d.insert("num_groups", int64_t(c.num_groups()));
    d.insert("max_requests", int64_t(c.max_requests));
    d.insert("max_batch", int64_t(c.max_batch));
    d.insert("max_queries", int64_t(c.max_queries));
    d.insert("max_top_k", int64_t(c.max_top_k));
    d.insert("max_context", int64_t(c.max_context));
    d.insert("device_slots_per_group", int64_t(c.device_slots_per_group));
    d.insert("num_heads", int64_t(h_.num_heads()));
    d.insert("row_bytes", int64_t(mla_hierarchy::row_bytes));
    return d;
  }

  std::vector<int64_t> group_layers()
  {
    auto const& layers = h_.config().group_layers;
    return {layers.begin(), layers.end()};
  }

 private:
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(device_).stream(); }

  /// A tensor over device memory of the hierarchy; it holds a reference to this object.
  at::Tensor view(void const* data, at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType type)
  {
    c10::intrusive_ptr<Hierarchy> keep = c10::intrusive_ptr<Hierarchy>::reclaim_copy(this);
    std::function<void(void*)> const release = [keep](void*) {};
    return at::from_blob(const_cast<void*>(data), sizes, strides, release,
                         at::TensorOptions().dtype(type).device(at::Device(at::kCUDA, device_)));
  }

  c10::DeviceIndex const device_;
  dhisparse_torch::mla_shape const shape_;
  dhisparse::memory_footprint const footprint_;
  torch_device_resource torch_memory_;
  dhisparse::counting_device_resource device_memory_{torch_memory_};
  dhisparse::counting_pinned_resource pinned_memory_{};  // over cudaHostAlloc (mapped, portable)
  mla_hierarchy h_;  // last: destroyed before the resources it allocated from
};

TORCH_LIBRARY(dhisparse, m)
{
  m.class_<Hierarchy>("Hierarchy")
    .def(torch::init<std::vector<int64_t>, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>())
    .def("admit", &Hierarchy::admit)
    .def("write_host_rows", &Hierarchy::write_host_rows)
    .def("host_rows", &Hierarchy::host_rows)
    .def("set_batch", &Hierarchy::set_batch)
    .def("release", &Hierarchy::release)
    .def("contains", &Hierarchy::contains)
    .def("length", &Hierarchy::length)
    .def("resolve", &Hierarchy::resolve)
    .def("retrieve", &Hierarchy::retrieve)
    .def("attention", &Hierarchy::attention)
    .def("commit", &Hierarchy::commit)
    .def("backup", &Hierarchy::backup)
    .def("tail_slots", &Hierarchy::tail_slots)
    .def("slot_table", &Hierarchy::slot_table)
    .def("layer_rows", &Hierarchy::layer_rows)
    .def("committed_rows", &Hierarchy::committed_rows)
    .def("commit_status", &Hierarchy::commit_status)
    .def("counters", &Hierarchy::counters)
    .def("counter_names", &Hierarchy::counter_names)
    .def("read_counters", &Hierarchy::read_counters)
    .def("status", &Hierarchy::status)
    .def("describe_status", &Hierarchy::describe_status)
    .def("bytes_required", &Hierarchy::bytes_required)
    .def("memory", &Hierarchy::memory)
    .def("info", &Hierarchy::info)
    .def("group_layers", &Hierarchy::group_layers);
}
