// The one translation unit that compiles dhisparse's kernels for the PyTorch extension
// (see mla_hierarchy.hpp). No PyTorch header is included here.
#include "mla_hierarchy.hpp"

#include <dhisparse/error.cuh>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/sparse_attention.cuh>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cstring>
#include <utility>

namespace dhisparse_torch {

namespace ds = dhisparse;
namespace sa = dhisparse::sparse_attention;

using row       = ds::row_format::mla_fp8_656;
using hierarchy = ds::kv_hierarchy<row, ds::policy::lru, ds::policy::adaptive_budget<>>;

static_assert(mla_hierarchy::row_bytes == row::bytes);
static_assert(mla_hierarchy::query_dim == sa::format_traits<row>::query_dim);
static_assert(mla_hierarchy::value_dim == sa::format_traits<row>::value_dim);

namespace {

ds::request_id rid(std::uint64_t id) { return ds::request_id{id}; }

/**
 * Attention workspace that serves every K up to max_top_k: `run` splits a selection by the
 * SM count and the number of tiles of K, and the split count is not monotonic in K, so the
 * largest over all K is taken once here (a captured step may then use any K).
 */
std::size_t workspace_for_every_top_k(mla_shape const& s, int num_sms)
{
  sa::params p{};  // only the shape matters for sizing (sparse_attention::shape_problem)
  p.batch       = s.max_batch;
  p.num_queries = s.max_queries;
  p.num_heads   = s.num_heads;
  std::size_t most = 0;
  for (int k = 1; k <= s.max_top_k; ++k) {
    p.top_k = k;
    most = std::max(most, sa::workspace_size<row>(p, num_sms));
  }
  return most;
}

int current_sm_count()
{
  int device = 0;
  int sms    = 0;
  DHISPARSE_CUDA_TRY(cudaGetDevice(&device));
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace

struct mla_hierarchy::impl {
  impl(mla_shape const& s, ds::memory_resources r, cudaStream_t stream_)
    : workspace_bytes{workspace_for_every_top_k(s, plan.num_sms())},  // checks num_heads before allocating
      h{make_config(s, r), stream_},
      heads{s.num_heads},
      device{r.device != nullptr ? *r.device : ds::default_device_resource()},
      stream{stream_}
  {
    if (workspace_bytes > 0) { workspace = device.allocate(workspace_bytes, ds::resource_alignment, stream); }
  }
  ~impl()
  {
    if (workspace != nullptr) { device.deallocate(workspace, workspace_bytes, ds::resource_alignment, stream); }
  }
  impl(impl const&)            = delete;
  impl& operator=(impl const&) = delete;

  sa::plan<row> const plan;  // current device: SM count, cluster support, kernel attributes
  std::size_t const workspace_bytes;
  hierarchy h;
  int const heads;
  ds::device_memory_resource& device;
  cudaStream_t const stream;
  void* workspace = nullptr;
};

ds::hierarchy_config mla_hierarchy::make_config(mla_shape const& s, ds::memory_resources resources)
{
  ds::hierarchy_config c;
  c.group_layers           = s.group_layers;
  c.max_requests           = s.max_requests;
  c.max_batch              = s.max_batch;
  c.max_queries            = s.max_queries;
  c.max_top_k              = s.max_top_k;
  c.max_context            = s.max_context;
  c.device_slots_per_group = s.device_slots_per_group;
  c.host.capacity_pages    = s.host_capacity_pages;
  c.resources              = resources;
  return c;
}

ds::memory_footprint mla_hierarchy::bytes_required(mla_shape const& s)
{
  ds::memory_footprint f = hierarchy::bytes_required(make_config(s, {}));
  f.device_bytes += workspace_for_every_top_k(s, current_sm_count());
  return f;
}

mla_hierarchy::mla_hierarchy(mla_shape const& s, ds::memory_resources r, cudaStream_t stream)
  : impl_{std::make_unique<impl>(s, r, stream)}
{
}
mla_hierarchy::~mla_hierarchy()                                   = default;
mla_hierarchy::mla_hierarchy(mla_hierarchy&&) noexcept            = default;
mla_hierarchy& mla_hierarchy::operator=(mla_hierarchy&&) noexcept = default;

void mla_hierarchy::admit(std::uint64_t id, std::int32_t length, std::int64_t capacity, cudaStream_t stream)
{
  impl_->h.admit(rid(id), length, stream, capacity);
}

void mla_hierarchy::write_host_rows(std::uint64_t id, int group, int layer, std::int64_t first, std::int64_t count,
                                    void const* source, std::size_t stride, cudaStream_t stream)
{
  impl_->h.write_host_rows(rid(id), group, layer, first, count, source, stride, stream);
}

void mla_hierarchy::read_host_rows(std::uint64_t id, int group, int layer, std::int64_t first, std::int64_t count,
                                   void* out) const
{
  auto* dst               = static_cast<std::byte*>(out);
  std::int64_t const last = first + count;
  for (std::int64_t pos = first; pos < last;) {
    ds::host_row_run const run = impl_->h.host_rows(rid(id), group, layer, pos);  // to the end of its page
    std::int64_t const n       = std::min(run.count, last - pos);
    DHISPARSE_EXPECTS(n > 0, "read_host_rows: position " + std::to_string(pos) + " has no host row");
    for (std::int64_t k = 0; k < n; ++k) {
      std::memcpy(dst + std::size_t(pos - first + k) * row_bytes, run.first + std::size_t(k) * run.stride, row_bytes);
    }
    pos += n;
  }
}

void mla_hierarchy::set_batch(std::uint64_t const* ids, std::int32_t const* queries, int count, cudaStream_t stream)
{
  std::vector<ds::request_id> requests(std::size_t(std::max(count, 0)));
  std::transform(ids, ids + requests.size(), requests.begin(), rid);
  impl_->h.set_batch(requests.data(), queries, count, stream);
}

void mla_hierarchy::release(std::uint64_t id, cudaStream_t stream) { impl_->h.release(rid(id), stream); }

bool mla_hierarchy::contains(std::uint64_t id) const { return impl_->h.contains(rid(id)); }

std::int32_t mla_hierarchy::length_sync(std::uint64_t id, cudaStream_t stream) const
{
  return impl_->h.length_sync(rid(id), stream);
}

void mla_hierarchy::resolve(int group, std::int32_t const* selections, int top_k, cudaStream_t stream)
{
  impl_->h.resolve(group, selections, top_k, stream);
}

void mla_hierarchy::retrieve(int group, cudaStream_t stream) { impl_->h.retrieve(group, stream); }

void mla_hierarchy::attention(int group, int layer, void const* queries, void* out, float* lse, float softmax_scale,
                              cudaStream_t stream)
{
  sa::params p = impl_->h.attention_params(group, layer);
  p.num_heads  = impl_->heads;
  sa::set_contiguous_strides<row>(p);  // queries, out, lse; the slot strides stay
  p.queries       = static_cast<ds::bf16 const*>(queries);
  p.out           = static_cast<ds::bf16*>(out);
  p.lse           = lse;
  p.softmax_scale = softmax_scale;
  p.status        = impl_->h.status();
  std::string const problem = sa::check<row>(p);
  DHISPARSE_EXPECTS(problem.empty(), "attention: " + problem);
  DHISPARSE_CUDA_TRY(sa::run(impl_->plan, p, impl_->workspace, impl_->workspace_bytes, stream));
}

void mla_hierarchy::commit(std::int32_t const* accepted, cudaStream_t stream) { impl_->h.commit(accepted, stream); }

void mla_hierarchy::backup(cudaStream_t stream) { impl_->h.backup(stream); }

std::int32_t const* mla_hierarchy::tail_slots(int group) const { return impl_->h.tail_slots(group); }
std::int32_t const* mla_hierarchy::slot_table(int group) const { return impl_->h.slot_table(group); }
int mla_hierarchy::resolved_top_k(int group) const { return impl_->h.resolved_top_k(group); }
std::byte* mla_hierarchy::layer_rows(int group, int layer) const { return impl_->h.layer_rows(group, layer).rows; }
std::size_t mla_hierarchy::group_row_bytes(int group) const { return impl_->h.group_row_bytes(group); }
ds::group_counters const* mla_hierarchy::counters(int group) const { return impl_->h.counters(group); }
std::int32_t const* mla_hierarchy::committed_rows() const { return impl_->h.committed_rows(); }
std::uint32_t const* mla_hierarchy::commit_status() const { return impl_->h.commit_status(); }

ds::group_counters mla_hierarchy::read_counters_sync(int group, cudaStream_t stream) const
{
  ds::group_counters c{};
  impl_->h.read_counters(group, &c, stream);
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  return c;
}

std::uint32_t mla_hierarchy::status_sync(cudaStream_t stream) const { return impl_->h.status_sync(stream); }
std::string mla_hierarchy::describe_status(std::uint32_t status) { return ds::describe_status(status); }

ds::hierarchy_config const& mla_hierarchy::config() const { return impl_->h.config(); }
int mla_hierarchy::num_heads() const { return impl_->heads; }
std::size_t mla_hierarchy::attention_workspace_bytes() const { return impl_->workspace_bytes; }

}  // namespace dhisparse_torch
