// custom_policy: an eviction policy written in one file, without touching the library.
//
// `lru_keep_sinks<S>` is LRU, except that the first S positions (attention sinks) are
// evicted only when nothing else is left. The contract (policy/concepts.hpp): static
// __host__ __device__ hooks over a 64-bit per-slot state; `eviction_defaults` supplies LRU's,
// so a policy overrides only what differs. kv_hierarchy checks it with a static_assert at
// compile time. The same policy runs in the GPU kernels and in the host reference; this
// example uses the GPU when present, the host reference otherwise, and compares the rows
// fetched from host with plain LRU on one selection trace where the sinks are selected
// only every eighth step.
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/host/hierarchy.hpp>

#include <common/synthetic.hpp>

#include <cstdio>
#include <random>
#include <vector>

namespace ds = dhisparse;

template <std::int32_t Sinks>
struct lru_keep_sinks : ds::policy::eviction_defaults {
  /// Smallest key goes first (ties: lower position); sinks get the largest key there is.
  DHISPARSE_HOST_DEVICE static constexpr std::uint64_t eviction_key(ds::policy_state state,
                                                                    std::int32_t position) noexcept
  {
    return position < Sinks ? ~std::uint64_t{0} : state;
  }
};
static_assert(ds::is_eviction_policy_v<lru_keep_sinks<4>>);

using row    = ds::row_format::opaque<64>;
using budget = ds::policy::static_budget<160>;
constexpr int top_k = 64;

ds::hierarchy_config make_config()
{
  ds::hierarchy_config c;
  c.max_requests = c.max_batch = 1;
  c.max_top_k                  = top_k;
  c.max_context                = 4096;
  c.device_slots_per_group     = 160;
  c.host.capacity_pages        = 4096 / 64;
  return c;
}

/// Selections of step `step`: sinks every eighth step, otherwise a drifting topic.
std::vector<std::int32_t> trace(std::mt19937_64& rng, int step, std::int32_t length, std::int32_t& topic)
{
  std::vector<std::int32_t> sel(top_k);
  topic = std::clamp<std::int32_t>(topic + int(rng() % 161) - 80, 64, length);
  examples::synthetic_topk(rng, length, top_k, topic, sel.data());
  if (step % 8 != 0) {  // drop the sinks (positions 0..3): shift the list left
    auto first = std::find_if(sel.begin(), sel.end(), [](std::int32_t p) { return p >= 4; });
    std::vector<std::int32_t> rest(first, sel.end());
    rest.resize(top_k, -1);
    sel = rest;
  }
  return sel;
}

/// Rows fetched from host over the trace, on the host reference backend.
template <class Eviction>
long fetched_host()
{
  ds::host::kv_hierarchy<row, Eviction, budget> h(make_config());
  ds::request_id const id{1};
  std::int32_t const one = 1;
  std::int32_t length    = 2000;
  h.admit(id, length, 3000);
  h.set_batch(&id, &one, 1);
  std::mt19937_64 rng(7);
  std::int32_t topic = 1000;
  long fetched       = 0;
  for (int step = 0; step < 400; ++step, ++length) {
    auto const sel = trace(rng, step, length, topic);
    h.resolve(0, sel.data(), top_k);
    h.retrieve(0);
    fetched += long(h.misses(0).size());
    h.commit(nullptr);
    h.backup();
  }
  return fetched;
}

/// The same on the GPU.
template <class Eviction>
long fetched_gpu(cudaStream_t stream)
{
  ds::kv_hierarchy<row, Eviction, budget> h(make_config(), stream);
  ds::request_id const id{1};
  std::int32_t const one = 1;
  std::int32_t length    = 2000;
  h.admit(id, length, stream, 3000);
  h.set_batch(&id, &one, 1, stream);
  std::int32_t* d_sel = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&d_sel, top_k * sizeof(std::int32_t)));
  std::mt19937_64 rng(7);
  std::int32_t topic = 1000;
  long fetched       = 0;
  for (int step = 0; step < 400; ++step, ++length) {
    auto const sel = trace(rng, step, length, topic);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_sel, sel.data(), top_k * 4, cudaMemcpyHostToDevice, stream));
    h.resolve(0, d_sel, top_k, stream);
    h.retrieve(0, stream);
    std::int32_t n = 0;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&n, h.plan_ref(0).count, 4, cudaMemcpyDeviceToHost, stream));
    h.commit(nullptr, stream);
    h.backup(stream);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    fetched += n;
  }
  cudaFree(d_sel);
  return fetched;
}

int main()
{
  int devices = 0;
  bool const gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  long lru = 0, keep = 0;
  if (gpu) {
    cudaStream_t stream;
    DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
    lru  = fetched_gpu<ds::policy::lru>(stream);
    keep = fetched_gpu<lru_keep_sinks<4>>(stream);
    cudaStreamDestroy(stream);
  } else {
    lru  = fetched_host<ds::policy::lru>();
    keep = fetched_host<lru_keep_sinks<4>>();
  }
  std::printf("custom_policy (%s backend): rows fetched from host over 400 steps: lru %ld, "
              "lru_keep_sinks<4> %ld\n", gpu ? "GPU" : "host reference", lru, keep);
  // Keeping the sinks saves their refetch every eighth step.
  return keep < lru ? 0 : 1;
}
