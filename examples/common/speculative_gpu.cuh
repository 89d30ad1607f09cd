/**
 * @file examples/common/speculative_gpu.cuh
 * @brief The CUDA backend of `examples::decoder` (speculative_loop.hpp): `kv_hierarchy`,
 *        `sparse_attention::run`, `verify_async`, `commit_verified` and a device draft ring.
 *
 * The loop hands host arrays to every call (it is a test and example driver, not a
 * graph-captured engine): each call uploads what it needs, enqueues the library's calls on
 * one stream, and downloads what the loop reads. The library calls themselves are the ones
 * an engine would capture.
 */
#pragma once

#include "speculative_loop.hpp"

#include <dhisparse/draft_ring.cuh>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/sparse_attention.cuh>
#include <dhisparse/verify.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace examples {

namespace detail {

/// The model writes its tail rows: entry e of `rows` ([max_batch × max_queries][group row])
/// into tail slot e of the group (skipped where resolve gave none).
template <int Unused = 0>
__global__ void write_tail_rows(std::byte* slab, std::size_t group_row_bytes, std::int32_t const* tail_slots,
                                std::byte const* rows, int entries)
{
  int const e = blockIdx.x;
  if (e >= entries || tail_slots[e] < 0) { return; }
  auto* to         = reinterpret_cast<int4*>(slab + std::size_t(tail_slots[e]) * group_row_bytes);
  auto const* from = reinterpret_cast<int4 const*>(rows + std::size_t(e) * group_row_bytes);
  for (std::size_t i = threadIdx.x; i < group_row_bytes / 16; i += blockDim.x) { to[i] = from[i]; }
}

/// A device buffer of `n` T (owning, move-only).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_{n}
  {
    if (n > 0) { DHISPARSE_CUDA_TRY(cudaMalloc(&p_, n * sizeof(T))); }
  }
  device_buffer(device_buffer&& o) noexcept : p_{o.p_}, n_{o.n_} { o.p_ = nullptr; }
  device_buffer& operator=(device_buffer&& o) noexcept
  {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_buffer() { cudaFree(p_); }
  T* data() const noexcept { return p_; }
  void upload(T const* host, std::size_t n, cudaStream_t s) const
  {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(p_, host, n * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  std::vector<T> download(std::size_t n, cudaStream_t s) const
  {
    std::vector<T> v(n);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(v.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost, s));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(s));
    return v;
  }

 private:
  T* p_          = nullptr;
  std::size_t n_ = 0;
};

}  // namespace detail

/**
 * @brief The CUDA backend of `decoder`: one `kv_hierarchy`, attention with one split (so
 *        that every query's output is independent of the batch and query shapes), greedy
 *        verification on the device, a device draft ring with one slot per request index.
 */
template <class Hierarchy>
class gpu_ops {
 public:
  static constexpr char const* name = "CUDA backend";
  using row                         = tiny_model::row;

  gpu_ops(dhisparse::hierarchy_config const& c, int ring_window, cudaStream_t stream)
    : stream_{stream}, h_{c, stream}, ring_{c.max_requests, ring_window, 1, sizeof(ring_tag)}
  {
    std::size_t const B = std::size_t(c.max_batch), Q = std::size_t(c.max_queries), R = std::size_t(c.max_requests);
    std::size_t const width = std::size_t(tiny_model::heads) * tiny_model::dim;
    sel_     = detail::device_buffer<std::int32_t>(c.step_entries());
    rows_    = detail::device_buffer<std::byte>(B * Q * std::size_t(*std::max_element(c.group_layers.begin(), c.group_layers.end())) * row::bytes);
    queries_ = detail::device_buffer<dhisparse::bf16>(B * Q * width);
    out_     = detail::device_buffer<dhisparse::bf16>(B * Q * width);
    ints_    = detail::device_buffer<std::int32_t>(10 * B * Q + 2 * R * Q + 16);
    words_   = detail::device_buffer<std::uint32_t>(B + 4);
    ring_rows_ = detail::device_buffer<ring_tag>(R * Q);
    DHISPARSE_CUDA_TRY(cudaMemsetAsync(words_.data(), 0, (B + 4) * sizeof(std::uint32_t), stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  Hierarchy& hierarchy() { return h_; }
  [[nodiscard]] dhisparse::hierarchy_config const& config() const { return h_.config(); }
  [[nodiscard]] int request_index(std::uint64_t id) const { return h_.request_index(dhisparse::request_id{id}); }

  void admit(std::uint64_t id, std::int32_t length, std::int64_t capacity)
  {
    h_.admit(dhisparse::request_id{id}, length, stream_, capacity);
    std::int32_t const r     = request_index(id);
    std::int64_t const start = length;
    std::int32_t* d_r        = ints_.data();
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_r, &r, sizeof r, cudaMemcpyHostToDevice, stream_));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_r + 2, &start, sizeof start, cudaMemcpyHostToDevice, stream_));
    ring_.reset_async(d_r, reinterpret_cast<std::int64_t const*>(d_r + 2), 1, stream_);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  void reserve(std::uint64_t id, std::int64_t capacity) { h_.reserve(dhisparse::request_id{id}, capacity, stream_); }
  void release(std::uint64_t id) { h_.release(dhisparse::request_id{id}, stream_); }
  std::byte* host_row(std::uint64_t id, int g, int l, std::int64_t p)
  {
    return h_.host_row(dhisparse::request_id{id}, g, l, p);  // admit synchronized the stream
  }
  void set_batch(dhisparse::request_id const* ids, std::int32_t const* queries, int n)
  {
    h_.set_batch(ids, queries, n, stream_);
  }
  void set_drafts(std::int32_t const* num_drafts, std::int32_t const* parents)
  {
    std::size_t const B = std::size_t(config().max_batch), Q = std::size_t(config().max_queries);
    std::int32_t* d_num = slot(0), *d_parents = slot(1);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_num, num_drafts, B * 4, cudaMemcpyHostToDevice, stream_));
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_parents, parents, B * Q * 4, cudaMemcpyHostToDevice, stream_));
    h_.set_drafts(d_num, d_parents, stream_);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  void resolve(int g, std::int32_t const* selections, int top_k)
  {
    sel_.upload(selections, std::size_t(config().max_batch) * config().max_queries * top_k, stream_);
    h_.resolve(g, sel_.data(), top_k, stream_);
    h_.retrieve(g, stream_);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  void write_tails(int g, std::byte const* rows)
  {
    auto const view   = h_.layer_rows(g, 0);
    int const entries = config().max_batch * config().max_queries;
    rows_.upload(rows, std::size_t(entries) * view.stride, stream_);
    detail::write_tail_rows<<<entries, 128, 0, stream_>>>(view.rows, view.stride, h_.tail_slots(g), rows_.data(),
                                                          entries);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  void attention(int g, int l, dhisparse::bf16 const* queries, dhisparse::bf16* out, int top_k)
  {
    namespace sa         = dhisparse::sparse_attention;
    auto const& c        = config();
    std::size_t const n  = std::size_t(c.max_batch) * c.max_queries * tiny_model::heads * tiny_model::dim;
    auto const view      = h_.layer_rows(g, l);
    queries_.upload(queries, n, stream_);
    sa::params p;
    p.batch       = c.max_batch;
    p.num_queries = c.max_queries;
    p.num_heads   = tiny_model::heads;
    p.top_k       = top_k;
    sa::set_contiguous_strides<row>(p);
    p.queries       = queries_.data();
    p.rows          = view.rows;
    p.row_stride    = view.stride;
    p.num_slots     = c.device_slots_per_group;
    p.slots         = h_.slot_table(g);
    p.batch_size    = h_.batch_ref().size;
    p.out           = out_.data();
    p.softmax_scale = tiny_model::softmax_scale();
    p.status        = words_.data() + 1;
    p.num_splits    = 1;  // every query's output independent of the launch shape
    DHISPARSE_CUDA_TRY(sa::run<row>(p, nullptr, 0, stream_));
    auto const o = out_.download(n, stream_);
    std::copy(o.begin(), o.end(), out);
  }
  void commit_plain() { h_.commit(nullptr, stream_); }
  [[nodiscard]] std::vector<std::int32_t> committed_rows() const
  {
    return download(h_.committed_rows(), std::size_t(config().max_batch));
  }

  /// Greedy verification on the device, then the verified commit (with the draft ring)
  /// straight from its outputs.
  verify_outputs verify_and_commit(dhisparse::verify_params v, std::int32_t batch)
  {
    int const B = config().max_batch, d = v.max_drafts;
    std::size_t const rows_tokens = std::size_t(B) * (v.topology == dhisparse::draft_topology::tree ? d + 1 : d);
    std::int32_t* num      = slot(0);
    std::int32_t* drafts   = slot(2);
    std::int32_t* first    = slot(3);
    std::int32_t* sibling  = slot(4);
    std::int32_t* targets  = slot(5);
    std::int32_t* accepted = slot(6);
    std::int32_t* nodes    = slot(7);
    std::int32_t* emitted  = slot(8);
    std::int32_t* next     = slot(9);
    std::int32_t* size     = ints_.data() + 10 * std::size_t(B) * config().max_queries;
    auto up = [&](std::int32_t* to, std::int32_t const* from, std::size_t n) {
      if (from != nullptr) { DHISPARSE_CUDA_TRY(cudaMemcpyAsync(to, from, n * 4, cudaMemcpyHostToDevice, stream_)); }
    };
    up(num, v.num_drafts, std::size_t(B));
    up(drafts, v.draft_tokens, rows_tokens);
    up(first, v.first_child, std::size_t(B) * (d + 1));
    up(sibling, v.next_sibling, std::size_t(B) * (d + 1));
    up(targets, v.target_tokens, std::size_t(B) * (d + 1));
    up(size, &batch, 1);
    v.batch_size     = size;
    v.num_drafts     = num;
    v.draft_tokens   = drafts;
    v.first_child    = v.first_child ? first : nullptr;
    v.next_sibling   = v.next_sibling ? sibling : nullptr;
    v.target_tokens  = targets;
    v.accepted       = accepted;
    v.accepted_nodes = nodes;
    v.emitted        = emitted;
    v.next_token     = next;
    v.status         = words_.data();
    v.request_status = words_.data() + 4;
    DHISPARSE_CUDA_TRY(dhisparse::verify_async(v, stream_));
    dhisparse::check_verify_status_sync(v.status, stream_);
    dhisparse::verified_step s = dhisparse::verified_step::from(v);
    s.ring        = ring_.ref();
    s.ring_index  = h_.batch_ref().requests;
    s.ring_status = ring_.status();
    h_.commit_verified(s, stream_);
    ring_.check_status_sync(stream_);
    verify_outputs out;
    out.accepted       = download(accepted, std::size_t(B));
    out.accepted_nodes = download(nodes, std::size_t(B) * d);
    out.emitted        = download(emitted, std::size_t(B) * (d + 1));
    out.next_token     = download(next, std::size_t(B));
    out.committed      = download(h_.committed_rows(), std::size_t(B));
    out.commit_status  = download(h_.commit_status(), std::size_t(B));
    return out;
  }

  void ring_append(std::vector<std::int32_t> const& counts, std::vector<ring_tag> const& rows)
  {
    std::int32_t* d_counts = ints_.data() + 10 * std::size_t(config().max_batch) * config().max_queries + 4;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_counts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice, stream_));
    ring_rows_.upload(rows.data(), rows.size(), stream_);
    dhisparse::draft_ring_rows staged;
    staged.rows = reinterpret_cast<std::byte const*>(ring_rows_.data());
    ring_.append_async(staged, d_counts, config().max_queries, nullptr, stream_);
    ring_.check_status_sync(stream_);
  }
  void ring_rollback(int request, std::int32_t count)
  {
    std::vector<std::int32_t> drafted(std::size_t(config().max_requests), 0);
    drafted[std::size_t(request)] = count;
    std::int32_t* d_counts = ints_.data() + 10 * std::size_t(config().max_batch) * config().max_queries + 4;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_counts, drafted.data(), drafted.size() * 4, cudaMemcpyHostToDevice, stream_));
    ring_.rollback_async(d_counts, nullptr, nullptr, stream_);
    ring_.check_status_sync(stream_);
  }
  [[nodiscard]] ring_snapshot ring_view() const
  {
    auto const r = ring_.ref();
    ring_snapshot s;
    s.end    = download(r.end, std::size_t(r.capacity));
    s.length = download(r.length, std::size_t(r.capacity));
    s.rows   = download(r.data, std::size_t(r.data_bytes()));
    s.window = r.window;
    return s;
  }

  void backup() { h_.backup(stream_); }
  [[nodiscard]] dhisparse::group_counters counters() const
  {
    std::vector<dhisparse::group_counters> groups(std::size_t(config().num_groups()));
    for (int g = 0; g < config().num_groups(); ++g) { h_.read_counters(g, &groups[std::size_t(g)], stream_); }
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    return add_counters(groups);
  }
  [[nodiscard]] std::uint32_t status() const
  {
    return h_.status_sync(stream_) | download(words_.data() + 1, 1)[0];
  }

 private:
  /// The k-th [max_batch][max_queries] scratch array of int32.
  std::int32_t* slot(int k) const { return ints_.data() + std::size_t(k) * config().max_batch * config().max_queries; }

  template <class T>
  std::vector<T> download(T const* p, std::size_t n) const
  {
    std::vector<T> v(n);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream_));
    return v;
  }

  cudaStream_t stream_;
  Hierarchy h_;
  dhisparse::draft_ring ring_;
  detail::device_buffer<std::int32_t> sel_, ints_;
  detail::device_buffer<std::byte> rows_;
  detail::device_buffer<dhisparse::bf16> queries_, out_;
  detail::device_buffer<std::uint32_t> words_;  // [0] verify status, [1] attention status, [4 …] request status
  detail::device_buffer<ring_tag> ring_rows_;
};

}  // namespace examples
