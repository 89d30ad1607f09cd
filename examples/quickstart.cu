// quickstart: build a KV hierarchy, admit two requests, decode with random top-K
// selections, and check that every row attention would read is exactly the committed one.
//
// Runs on the GPU when one is present, on the host reference backend otherwise; the two
// backends take the same calls (the GPU ones also take a stream).
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/host/hierarchy.hpp>

#include <common/synthetic.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace ds = dhisparse;

using row      = ds::row_format::mla_fp8_656;               // 656-byte FP8 MLA rows
using eviction = ds::policy::lru;                           // HiSparse's eviction order
using budget   = ds::policy::static_budget<512>;            // 512 device rows per request

constexpr int top_k = 128;

ds::hierarchy_config make_config()
{
  ds::hierarchy_config c;
  c.group_layers           = {2, 2};   // 4 layers, each pair sharing one top-K selection
  c.max_requests           = 2;
  c.max_batch              = 2;
  c.max_top_k              = top_k;
  c.max_context            = 8192;
  c.device_slots_per_group = 2 * 512;  // the essential floor of both requests
  c.host.capacity_pages    = 2 * 8192 / 64;
  return c;
}

/// The same decode loop on either backend. `Ops` hides the three places where memory lives
/// elsewhere on the GPU: selections, the model's tail writes, reading a slot back.
template <class Hierarchy, class Ops>
bool decode(Hierarchy& h, Ops& ops)
{
  ds::request_id const ids[2] = {ds::request_id{1}, ds::request_id{2}};
  std::int32_t lengths[2]     = {900, 2500};
  std::int32_t const one[2]   = {1, 1};
  auto const& c               = h.config();
  // Admission: the engine writes prefill rows straight into the host store.
  for (int r = 0; r < 2; ++r) {
    ops.admit(h, ids[r], lengths[r], 4096);
    for (std::int32_t p = 0; p < lengths[r]; ++p)
      for (int g = 0; g < c.num_groups(); ++g)
        for (int l = 0; l < c.group_layers[g]; ++l)
          examples::synthetic_row(r + 1, g, l, p, h.host_row(ids[r], g, l, p), row::bytes);
  }
  ops.set_batch(h, ids, one, 2);

  std::mt19937_64 rng(2026);
  std::vector<std::int32_t> sel(std::size_t(c.max_batch) * top_k);
  std::vector<std::byte> want(row::bytes), got(row::bytes);
  std::int32_t topic[2] = {300, 1800};
  long checked = 0, misses = 0, selected = 0;
  for (int step = 0; step < 64; ++step) {
    for (int g = 0; g < c.num_groups(); ++g) {
      for (int r = 0; r < 2; ++r) {
        topic[r] = std::clamp<std::int32_t>(topic[r] + int(rng() % 101) - 50, 0, lengths[r]);
        examples::synthetic_topk(rng, lengths[r], top_k, topic[r], sel.data() + r * top_k);
      }
      ops.resolve(h, g, sel);  // hits, evictions, tail slots, miss plan, slot table
      ops.retrieve(h, g);      // missed rows host → device, both layers of the group
      misses += ops.misses(h, g);
      // What attention would read: slot table entry → exactly the committed row.
      std::vector<std::int32_t> const table = ops.slot_table(h, g);
      for (int r = 0; r < 2; ++r)
        for (int k = 0; k < top_k && sel[r * top_k + k] >= 0; ++k) {
          std::int32_t const pos = sel[r * top_k + k];
          ++selected;
          if (pos == lengths[r]) continue;  // the new token's own row: written below
          for (int l = 0; l < c.group_layers[g]; ++l) {
            examples::synthetic_row(r + 1, g, l, pos, want.data(), row::bytes);
            ops.read_row(h, g, l, table[r * top_k + k], got.data());
            if (want != got) return false;
            ++checked;
          }
        }
      // The model writes this step's new rows into the tail slots.
      ops.write_tails(h, g, lengths);
    }
    ops.commit_and_backup(h);  // new rows are committed, then copied to the host store
    for (auto& len : lengths) ++len;
  }
  ops.finish(h);
  // Every decoded row is in the host store, bit for bit.
  for (int r = 0; r < 2; ++r)
    for (std::int32_t p = 0; p < lengths[r]; ++p) {
      examples::synthetic_row(r + 1, 0, 0, p, want.data(), row::bytes);
      if (std::memcmp(h.host_row(ids[r], 0, 0, p), want.data(), row::bytes) != 0) return false;
    }
  std::printf("%ld rows read through slot tables, all exact; %ld of %ld selected rows fetched "
              "from host (%.1f%%); host store holds every decoded row exactly\n",
              checked, misses, selected, 100.0 * misses / selected);
  return true;
}

/// GPU backend: selections and slabs live in device memory.
struct gpu_ops {
  cudaStream_t stream{};
  std::int32_t* d_sel = nullptr;
  std::byte* d_row    = nullptr;
  gpu_ops()
  {
    DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
    DHISPARSE_CUDA_TRY(cudaMalloc(&d_sel, 2 * top_k * sizeof(std::int32_t)));
    DHISPARSE_CUDA_TRY(cudaMalloc(&d_row, 2 * row::bytes));
  }
  ~gpu_ops() { cudaFree(d_sel); cudaFree(d_row); cudaStreamDestroy(stream); }
  template <class H> void admit(H& h, ds::request_id id, int len, int cap) { h.admit(id, len, stream, cap); }
  template <class H> void set_batch(H& h, ds::request_id const* ids, std::int32_t const* q, int n) { h.set_batch(ids, q, n, stream); }
  template <class H> void resolve(H& h, int g, std::vector<std::int32_t> const& sel)
  {
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(d_sel, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice, stream));
    h.resolve(g, d_sel, top_k, stream);
  }
  template <class H> void retrieve(H& h, int g) { h.retrieve(g, stream); }
  template <class H> long misses(H& h, int g)
  {
    std::int32_t n = 0;
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(&n, h.plan_ref(g).count, 4, cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    return n;
  }
  template <class H> std::vector<std::int32_t> slot_table(H& h, int g)
  {
    std::vector<std::int32_t> t(2 * top_k);
    DHISPARSE_CUDA_TRY(cudaMemcpy(t.data(), h.slot_table(g), t.size() * 4, cudaMemcpyDeviceToHost));
    return t;
  }
  template <class H> void read_row(H& h, int g, int l, std::int32_t slot, std::byte* out)
  {
    auto const v = h.layer_rows(g, l);
    DHISPARSE_CUDA_TRY(cudaMemcpy(out, v.rows + std::size_t(slot) * v.stride, row::bytes, cudaMemcpyDeviceToHost));
  }
  template <class H> void write_tails(H& h, int g, std::int32_t const* lengths)
  {
    std::int32_t tails[2];
    DHISPARSE_CUDA_TRY(cudaMemcpy(tails, h.tail_slots(g), sizeof tails, cudaMemcpyDeviceToHost));
    std::vector<std::byte> bytes(row::bytes);
    for (int r = 0; r < 2; ++r)
      for (int l = 0; l < h.config().group_layers[g]; ++l) {
        examples::synthetic_row(r + 1, g, l, lengths[r], bytes.data(), row::bytes);
        auto const v = h.layer_rows(g, l);
        DHISPARSE_CUDA_TRY(cudaMemcpy(v.rows + std::size_t(tails[r]) * v.stride, bytes.data(), row::bytes,
                                      cudaMemcpyHostToDevice));
      }
  }
  template <class H> void commit_and_backup(H& h) { h.commit(nullptr, stream); h.backup(stream); }
  template <class H> void finish(H& h)
  {
    if (std::uint32_t const s = h.status_sync(stream)) std::printf("status: %s\n", ds::describe_status(s).c_str());
  }
};

/// Host reference backend: everything is host memory, every call completes at once.
struct host_ops {
  template <class H> void admit(H& h, ds::request_id id, int len, int cap) { h.admit(id, len, cap); }
  template <class H> void set_batch(H& h, ds::request_id const* ids, std::int32_t const* q, int n) { h.set_batch(ids, q, n); }
  template <class H> void resolve(H& h, int g, std::vector<std::int32_t> const& sel) { h.resolve(g, sel.data(), top_k); }
  template <class H> void retrieve(H& h, int g) { h.retrieve(g); }
  template <class H> long misses(H& h, int g) { return long(h.misses(g).size()); }
  template <class H> std::vector<std::int32_t> slot_table(H& h, int g)
  {
    return {h.slot_table(g), h.slot_table(g) + 2 * top_k};
  }
  template <class H> void read_row(H& h, int g, int l, std::int32_t slot, std::byte* out)
  {
    auto const v = h.layer_rows(g, l);
    std::memcpy(out, v.rows + std::size_t(slot) * v.stride, row::bytes);
  }
  template <class H> void write_tails(H& h, int g, std::int32_t const* lengths)
  {
    for (int r = 0; r < 2; ++r)
      for (int l = 0; l < h.config().group_layers[g]; ++l) {
        auto const v = h.layer_rows(g, l);
        examples::synthetic_row(r + 1, g, l, lengths[r], v.rows + std::size_t(h.tail_slots(g)[r]) * v.stride,
                                row::bytes);
      }
  }
  template <class H> void commit_and_backup(H& h) { h.commit(nullptr); h.backup(); }
  template <class H> void finish(H& h)
  {
    if (h.status() != 0) std::printf("status: %s\n", ds::describe_status(h.status()).c_str());
  }
};

int main()
{
  int devices = 0;
  bool const gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  bool ok = false;
  if (gpu) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("quickstart: GPU backend on %s\n", prop.name);
    gpu_ops ops;
    ds::kv_hierarchy<row, eviction, budget> h(make_config(), ops.stream);
    ok = decode(h, ops);
  } else {
    std::printf("quickstart: no CUDA device, host reference backend\n");
    host_ops ops;
    ds::host::kv_hierarchy<row, eviction, budget> h(make_config());
    ok = decode(h, ops);
  }
  std::printf("quickstart: %s\n", ok ? "OK" : "FAILED: a row differed");
  return ok ? 0 : 1;
}
