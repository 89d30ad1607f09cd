/**
 * @file bench/attention/attention.cu
 * @brief Sparse MLA attention over slot tables (BENCH.md `attention`): B = 128, h_q ∈ {64,
 *        128}, K = 2048, Q ∈ {1, 4}, bf16 (1152-B) and FP8-656 rows.
 *
 * For every configuration it reports the median time, TFLOP/s (2 x h_q x (576 + 512) FLOP
 * per selected row and query), the rows read per second (logical: Q x K rows per request)
 * and the unique rows per second (the union of a request's Q selections), and the fraction
 * of the applicable roofline: min time = max(FLOP / bf16 tensor peak, unique row bytes /
 * HBM copy bandwidth), both ceilings measured in the same run.
 *
 * For Q = 1 it also times a plain gather of the same rows (`gather_rows`: every byte read with
 * 16-byte loads at full occupancy, nothing computed) and reports the kernel's time against
 * it: random rows of 656 bytes cannot be read at the copy bandwidth, so for FP8 rows at
 * h_q = 64 this, not the HBM roofline, is the ceiling the kernel runs into.
 *
 * Workload: a pool of 512 Ki slots (one layer per slot), queries and rows drawn from a
 * hash (non-zero, no NaN codes), four rotating slot tables so that no call finds its rows in
 * L2. Q = 4: each request draws K distinct slots for its first query; the others replace 10%
 * of them (consecutive verify positions share most of their selection). Q = 4 runs twice:
 * with every selection in random order, and sorted by slot id (an engine can hand sorted
 * tables; the queries of a request then read shared rows at nearly the same time, so the
 * second read hits L2).
 */
#include <dhisparse/sparse_attention.cuh>

#include "common/bench.cuh"
#include "tensor_peak.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace dhisparse;
namespace sa = dhisparse::sparse_attention;

DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mla_bf16_576);
DHISPARSE_SPARSE_ATTENTION_INSTANTIATE(row_format::mla_fp8_656);

namespace {

__device__ __forceinline__ std::uint32_t hash32(std::uint64_t x)
{
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return std::uint32_t(x);
}

/// bf16 bits of a value in ±[0.25, 2) from a hash (never zero, never NaN).
__device__ __forceinline__ std::uint16_t hash_bf16(std::uint64_t i)
{
  std::uint32_t const h = hash32(i);
  return std::uint16_t(((h & 1u) << 15) | ((0x7Du + (h >> 1) % 3u) << 7) | ((h >> 8) & 0x7Fu));
}

/// Fills `count` elements of bf16 (queries or bf16 rows).
__global__ void fill_bf16(std::uint16_t* dst, std::size_t count, std::uint64_t seed)
{
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    dst[i] = hash_bf16(seed + i);
  }
}

/// Fills FP8-656 rows: random e4m3 codes (NaN codes avoided), 4 positive scales, bf16 rope.
__global__ void fill_fp8_rows(unsigned char* rows, std::size_t num_rows, std::uint64_t seed)
{
  std::size_t const total = num_rows * 656;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < total;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::size_t const r = i / 656;
    int const byte      = int(i % 656);
    if (byte < 512) {
      std::uint8_t v = std::uint8_t(hash32(seed + i));
      if ((v & 0x7Fu) == 0x7Fu) { v ^= 1u; }
      rows[i] = v;
    } else if (byte < 528) {
      if ((byte - 512) % 4 == 0) {
        float const scale = (1.f + float(hash32(seed + i) % 1000u) / 1000.f) / 256.f;
        *reinterpret_cast<float*>(rows + r * 656 + byte) = scale;
      }
    } else if ((byte - 528) % 2 == 0) {
      *reinterpret_cast<std::uint16_t*>(rows + r * 656 + byte) = hash_bf16(seed + i);
    }
  }
}

struct selection_set {
  std::vector<std::int32_t> slots;  // [batch][queries][top_k]
  std::int64_t unique_rows = 0;     // sum over requests of |union of its queries' selections|
};

selection_set make_selections(std::mt19937_64& rng, int batch, int queries, int top_k,
                              std::int64_t num_slots, bool sorted)
{
  selection_set s;
  s.slots.resize(std::size_t(batch) * queries * top_k);
  std::vector<char> used(std::size_t(num_slots), 0);
  std::uniform_int_distribution<std::int64_t> any(0, num_slots - 1);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (int b = 0; b < batch; ++b) {
    std::vector<std::int32_t> touched;
    std::vector<std::int32_t> base;
    while (int(base.size()) < top_k) {
      auto const c = std::int32_t(any(rng));
      if (!used[std::size_t(c)]) {
        used[std::size_t(c)] = 1;
        base.push_back(c);
      }
    }
    touched = base;
    for (int q = 0; q < queries; ++q) {
      std::vector<std::int32_t> sel = base;
      if (q > 0) {
        for (auto& v : sel) {
          if (unit(rng) < 0.1f) {
            std::int32_t c;
            do { c = std::int32_t(any(rng)); } while (used[std::size_t(c)]);
            used[std::size_t(c)] = 1;
            touched.push_back(c);
            v = c;
          }
        }
      }
      if (sorted) {
        std::sort(sel.begin(), sel.end());
      } else {
        std::shuffle(sel.begin(), sel.end(), rng);
      }
      std::copy(sel.begin(), sel.end(), s.slots.begin() + (std::size_t(b) * queries + q) * top_k);
    }
    s.unique_rows += std::int64_t(touched.size());
    for (auto c : touched) { used[std::size_t(c)] = 0; }
  }
  return s;
}

/**
 * Reads every 16-byte chunk of the rows a slot table names — four loads in flight per thread,
 * full occupancy, nothing computed — so the time is what a gather of exactly these rows
 * costs on its own (the attention kernel cannot read them faster). The XOR of everything
 * read goes to `sink` only in the unlikely case it equals a marker, so the loads stay.
 */
__global__ void gather_rows(std::byte const* rows, int row_bytes, std::int32_t const* slots, std::int64_t count,
                            uint4* sink)
{
  int const chunks          = row_bytes / 16;
  std::int64_t const total  = count * chunks;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x;
  uint4 acc                 = make_uint4(0, 0, 0, 0);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      std::int64_t const j = i + k * stride;
      v[k]                 = make_uint4(0, 0, 0, 0);
      if (j < total) {
        std::int64_t const r = j / chunks;
        v[k] = __ldg(reinterpret_cast<uint4 const*>(rows + std::int64_t(slots[r]) * row_bytes) + (j - r * chunks));
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc.x ^= v[k].x;
      acc.y ^= v[k].y;
      acc.z ^= v[k].z;
      acc.w ^= v[k].w;
    }
  }
  if (acc.x == 0x9E3779B9u && acc.y == 0x7F4A7C15u) { sink[threadIdx.x] = acc; }
}

struct config {
  bool fp8;
  int heads;
  int queries;
  bool sorted;
};

}  // namespace

int main(int argc, char** argv)
{
  auto const opt = bench::options::parse(argc, argv);
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  int const batch             = opt.quick ? 16 : 128;
  int const top_k             = 2048;
  std::int64_t const num_slots = opt.quick ? (1 << 16) : (1 << 19);
  int const tables            = 4;

  // Physical limits, measured in this run.
  double const hbm_gbps   = bench::measure_d2d_copy_gbps(std::size_t(1) << 30, stream);
  double const peak_tflop = bench::measure_bf16_tensor_peak_tflops(stream);
  std::string const device = bench::device_name();
  std::printf("device: %s\nHBM device-to-device copy: %.0f GB/s (read + write)\n", device.c_str(), hbm_gbps);
  std::printf("bf16 tensor-core peak (wgmma loop, this run): %.0f TFLOP/s (BENCH.md 8192^3 GEMM: ~790)\n",
              peak_tflop);
  DHISPARSE_EXPECTS(peak_tflop > 0, "bench_attention must be built for sm_90a");

  // Device data: both slabs, queries for Q = 4, outputs, rotating slot tables.
  std::byte* slab_bf16 = nullptr;
  std::byte* slab_fp8  = nullptr;
  bf16* queries        = nullptr;
  bf16* out            = nullptr;
  float* lse           = nullptr;
  int const max_q = 4, max_heads = 128;
  DHISPARSE_CUDA_TRY(cudaMalloc(&slab_bf16, std::size_t(num_slots) * 1152));
  DHISPARSE_CUDA_TRY(cudaMalloc(&slab_fp8, std::size_t(num_slots) * 656));
  DHISPARSE_CUDA_TRY(cudaMalloc(&queries, std::size_t(batch) * max_q * max_heads * 576 * sizeof(bf16)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&out, std::size_t(batch) * max_q * max_heads * 512 * sizeof(bf16)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&lse, std::size_t(batch) * max_q * max_heads * sizeof(float)));
  fill_bf16<<<1024, 256, 0, stream>>>(reinterpret_cast<std::uint16_t*>(slab_bf16), std::size_t(num_slots) * 576, 1);
  fill_fp8_rows<<<1024, 256, 0, stream>>>(reinterpret_cast<unsigned char*>(slab_fp8), std::size_t(num_slots), 2);
  fill_bf16<<<1024, 256, 0, stream>>>(reinterpret_cast<std::uint16_t*>(queries),
                                      std::size_t(batch) * max_q * max_heads * 576, 3);
  DHISPARSE_CUDA_TRY(cudaGetLastError());

  std::mt19937_64 rng{20261202};
  std::vector<config> const configs = {
    {false, 64, 1, false}, {false, 128, 1, false}, {false, 64, 4, false}, {false, 128, 4, false},
    {false, 64, 4, true},  {false, 128, 4, true},  {true, 64, 1, false},  {true, 128, 1, false},
    {true, 64, 4, false},  {true, 128, 4, false},  {true, 64, 4, true},   {true, 128, 4, true},
  };

  bench::json_report report("attention");
  report.set("device", device);
  report.set("date", bench::today());
  report.set("hbm_copy_gbps", hbm_gbps);
  report.set("bf16_tensor_peak_tflops", peak_tflop);
  report.set("batch", double(batch));
  report.set("top_k", double(top_k));
  report.set("num_slots", double(num_slots));

  uint4* sink = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&sink, 1024 * sizeof(uint4)));
  int sm_count = 0;
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));

  std::printf("\n%-5s %5s %2s %-6s %6s %9s %8s %10s %10s %-6s %9s %8s %9s %7s\n", "rows", "h_q", "Q", "order",
              "splits", "time_us", "TFLOP/s", "rows_GB/s", "uniq_GB/s", "bound", "floor_us", "roofline",
              "gather_us", "of_gath");
  for (auto const& c : configs) {
    // Selections: `tables` rotating tables of the same shape.
    std::vector<std::int32_t*> slot_tables(tables, nullptr);
    std::int64_t unique_rows = 0;
    for (int t = 0; t < tables; ++t) {
      auto const sel = make_selections(rng, batch, c.queries, top_k, num_slots, c.sorted);
      unique_rows += sel.unique_rows;
      DHISPARSE_CUDA_TRY(cudaMalloc(&slot_tables[t], sel.slots.size() * sizeof(std::int32_t)));
      DHISPARSE_CUDA_TRY(cudaMemcpy(slot_tables[t], sel.slots.data(), sel.slots.size() * sizeof(std::int32_t),
                                    cudaMemcpyHostToDevice));
    }
    double const unique_per_call = double(unique_rows) / tables;

    sa::params p;
    p.batch       = batch;
    p.num_queries = c.queries;
    p.num_heads   = c.heads;
    p.top_k       = top_k;
    std::size_t const row_bytes = c.fp8 ? 656 : 1152;
    if (c.fp8) {
      sa::set_contiguous_strides<row_format::mla_fp8_656>(p);
    } else {
      sa::set_contiguous_strides<row_format::mla_bf16_576>(p);
    }
    p.queries       = queries;
    p.rows          = c.fp8 ? slab_fp8 : slab_bf16;
    p.row_stride    = row_bytes;
    p.num_slots     = num_slots;
    p.out           = out;
    p.lse           = lse;
    p.softmax_scale = 1.f / std::sqrt(576.f);
    p.slots         = slot_tables[0];
    std::size_t const ws_bytes =
      c.fp8 ? sa::workspace_size<row_format::mla_fp8_656>(p) : sa::workspace_size<row_format::mla_bf16_576>(p);
    int sms = 0;
    DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int const splits =
      c.fp8 ? sa::num_splits<row_format::mla_fp8_656>(p, sms) : sa::num_splits<row_format::mla_bf16_576>(p, sms);
    void* workspace = nullptr;
    if (ws_bytes > 0) { DHISPARSE_CUDA_TRY(cudaMalloc(&workspace, ws_bytes)); }

    auto const ms = bench::time_ms(stream, opt.warmup, opt.reps, [&](int rep) {
      p.slots = slot_tables[rep % tables];
      cudaError_t const e = c.fp8 ? sa::run<row_format::mla_fp8_656>(p, workspace, ws_bytes, stream)
                                  : sa::run<row_format::mla_bf16_576>(p, workspace, ws_bytes, stream);
      DHISPARSE_CUDA_TRY(e);
    });
    // Every output finite (the data has no NaN; an unwritten output would be garbage).
    std::vector<std::uint16_t> host_out(std::size_t(batch) * c.queries * c.heads * 512);
    DHISPARSE_CUDA_TRY(cudaMemcpy(host_out.data(), out, host_out.size() * 2, cudaMemcpyDeviceToHost));
    std::size_t non_finite = 0;
    for (auto v : host_out) { non_finite += (v & 0x7F80u) == 0x7F80u; }
    DHISPARSE_EXPECTS(non_finite == 0, "attention output has non-finite values");

    // Q = 1: the same rows gathered with nothing computed (a ceiling of this access pattern).
    double gather_us = 0;
    if (c.queries == 1) {
      std::int64_t const count = std::int64_t(batch) * top_k;
      auto const gms = bench::time_ms(stream, opt.warmup, opt.reps, [&](int rep) {
        gather_rows<<<unsigned(sm_count) * 8, 256, 0, stream>>>(c.fp8 ? slab_fp8 : slab_bf16, int(row_bytes),
                                                                slot_tables[rep % tables], count, sink);
        DHISPARSE_CUDA_TRY(cudaGetLastError());
      });
      gather_us = bench::median(gms) * 1e3;
    }
    double const t_us        = bench::median(ms) * 1e3;
    double const flops       = 2.0 * batch * c.queries * c.heads * double(top_k) * (576 + 512);
    double const rows_bytes  = double(batch) * c.queries * top_k * row_bytes;
    double const uniq_bytes  = unique_per_call * row_bytes;
    double const t_compute   = flops / (peak_tflop * 1e12) * 1e6;
    double const t_memory    = uniq_bytes / (hbm_gbps * 1e9) * 1e6;
    double const floor_us    = std::max(t_compute, t_memory);
    char const* bound        = t_compute >= t_memory ? "tensor" : "HBM";
    double const tflops      = flops / (t_us * 1e-6) / 1e12;
    double const rows_gbps   = rows_bytes / (t_us * 1e-6) / 1e9;
    double const unique_gbps = uniq_bytes / (t_us * 1e-6) / 1e9;
    double const fraction    = floor_us / t_us;
    char const* order        = c.queries == 1 ? "-" : (c.sorted ? "sorted" : "random");
    std::printf("%-5s %5d %2d %-6s %6d %9.1f %8.1f %10.0f %10.0f %-6s %9.1f %7.1f%%", c.fp8 ? "fp8" : "bf16",
                c.heads, c.queries, order, splits, t_us, tflops, rows_gbps, unique_gbps, bound, floor_us,
                100.0 * fraction);
    if (gather_us > 0) {
      std::printf(" %9.1f %6.1f%%\n", gather_us, 100.0 * gather_us / t_us);
    } else {
      std::printf(" %9s %7s\n", "-", "-");
    }
    report.add_record();
    report.field("rows", c.fp8 ? "mla_fp8_656" : "mla_bf16_576");
    report.field("heads", double(c.heads));
    report.field("queries", double(c.queries));
    report.field("order", order);
    report.field("splits", double(splits));
    report.field("time_us", t_us);
    report.field("tflops", tflops);
    report.field("rows_gbps", rows_gbps);
    report.field("unique_rows_gbps", unique_gbps);
    report.field("unique_rows_per_call", unique_per_call);
    report.field("bound", bound);
    report.field("floor_compute_us", t_compute);
    report.field("floor_memory_us", t_memory);
    report.field("roofline_fraction", fraction);
    if (gather_us > 0) {
      report.field("gather_us", gather_us);
      report.field("gather_fraction", gather_us / t_us);
    }

    for (auto* t : slot_tables) { cudaFree(t); }
    if (workspace) { cudaFree(workspace); }
  }
  report.write(opt.json_path);

  cudaFree(sink);
  cudaFree(slab_bf16);
  cudaFree(slab_fp8);
  cudaFree(queries);
  cudaFree(out);
  cudaFree(lse);
  cudaStreamDestroy(stream);
  return 0;
}
