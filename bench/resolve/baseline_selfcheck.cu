// bench/resolve/baseline_selfcheck: the HiSparse-style baseline kernel checked against its
// host model, then timed on the resolve benchmark's shapes (BENCH.md "resolve").
//
// Check: B ∈ {1, 8, 64} × K ∈ {256, 2048} × H ∈ {512, 4096} × rows of 656 / 2624 bytes,
// both kernel configurations, fresh seeds (DHISPARSE_TEST_SEED replays one); H < K + 1 is
// outside the design (n/a). Timing: B ∈ {1, 128}, K = 2048, H = 4096, 656-byte rows,
// 100 000-token histories per request in a pinned mapped store with pages scattered over
// the pool, 1% and 14% of the selected rows missing per step; median of --reps steps after
// --warmup, each step a new selection; the final state is checked against the model.
// Exit status: 0 when every check passes (or there is no CUDA device), 1 otherwise.
#include <resolve/hisparse_baseline.cuh>
#include <resolve/hisparse_check.cuh>
#include <resolve/workload.cuh>
#include <resolve/workload.hpp>

#include <common/bench.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace dhisparse;
namespace hs = dhisparse::bench::hisparse;
namespace rs = dhisparse::bench::resolve;

namespace {

/// 1024 threads, 4 loads in flight per lane; and 512 threads, 8 loads per lane.
using config_1024 = hs::kernel_config<1024, 2048, 4096, 4>;
using config_512  = hs::kernel_config<512, 2048, 4096, 8>;

std::uint64_t fresh_seed()
{
  if (char const* env = std::getenv("DHISPARSE_TEST_SEED")) { return std::strtoull(env, nullptr, 10); }
  std::random_device rd;
  return (std::uint64_t(rd()) << 32) ^ rd();
}

/// SGLang's fused swap-in on an H200, same shapes (BENCH.md), µs per call.
double peer_us(int batch, double miss)
{
  if (batch == 1) { return miss < 0.05 ? 25.6 : 55.5; }
  if (batch == 128) { return miss < 0.05 ? 118.0 : 1213.0; }
  return 0.0;
}

template <class Config>
bool run_check(hs::check_case const& c, char const* name, std::uint64_t seed, cudaStream_t stream)
{
  std::string const m = hs::check_against_reference<Config>(c, seed, stream);
  std::printf("%-5s B=%-3d K=%-5d H=%-5d row=%-5zu %s%s\n", name, c.batch, c.top_k, c.hot_slots, c.row_bytes,
              m.empty() ? "PASS" : "FAIL: ", m.c_str());
  return m.empty();
}

struct timing {
  double median_us;
  double miss_fraction;  ///< measured: rows the kernel copied / valid selected entries
  std::string check;     ///< "" = final state and rows exact
};

template <class Config>
timing time_trace(rs::trace const& t, rs::mapped_store const& store, int warmup, int reps, cudaStream_t stream)
{
  rs::baseline_run run(t, store);
  run.reset();
  auto const ms = bench::time_ms(stream, warmup, reps, [&](int s) {
    DHISPARSE_CUDA_TRY(hs::swap_in_async<Config>(run.params(s), stream));
  });
  DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<std::int32_t> const copied = run.copied_rows();
  double rows = 0, selected = 0;
  for (int s = warmup; s < warmup + reps; ++s) {
    for (int b = 0; b < t.options.batch; ++b) { rows += copied[std::size_t(s) * t.options.batch + b]; }
    for (std::int32_t q : t.steps[std::size_t(s)].top_k) { selected += q >= 0; }
  }
  return {bench::median(ms) * 1e3, selected > 0 ? rows / selected : 0.0, hs::check_trace_end(t, run, store)};
}

}  // namespace

int main(int argc, char** argv)
{
  auto const opt = bench::options::parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("skipped: no CUDA device\n");
    return 0;
  }
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::uint64_t const seed = fresh_seed();
  std::printf("device: %s   date: %s   seed: %llu (DHISPARSE_TEST_SEED replays it)\n\n",
              bench::device_name().c_str(), bench::today().c_str(), static_cast<unsigned long long>(seed));

  // ---- self-check against the host model ------------------------------------------------
  int failures = 0;
  std::uint64_t case_index = 0;
  for (int batch : {1, 8, 64}) {
    for (int top_k : {256, 2048}) {
      for (int hot_slots : {512, 4096}) {
        for (std::size_t row_bytes : {std::size_t{656}, std::size_t{2624}}) {
          hs::check_case const c{batch, top_k, hot_slots, row_bytes, 6};
          if (hot_slots < top_k + 1) {
            std::printf("      B=%-3d K=%-5d H=%-5d row=%-5zu n/a (HiSparse needs H >= K + 1)\n", batch, top_k,
                        hot_slots, row_bytes);
            continue;
          }
          std::uint64_t const case_seed = rs::derive_seed(seed, ++case_index);
          failures += !run_check<config_1024>(c, "1024", case_seed, stream);
          failures += !run_check<config_512>(c, "512", case_seed, stream);
        }
      }
    }
  }
  std::printf("\nself-check: %s\n\n", failures == 0 ? "all PASS" : "FAILURES");

  // ---- timing ---------------------------------------------------------------------------
  double const memcpy_gbps = bench::measure_h2d_memcpy_gbps(std::size_t{1} << 30, stream);
  std::printf("pinned host->device cudaMemcpyAsync (1 GiB): %.1f GB/s\n", memcpy_gbps);
  bench::json_report report("resolve_hisparse_baseline");
  report.set("device", bench::device_name());
  report.set("date", bench::today());
  report.set("memcpy_h2d_gbps", memcpy_gbps);
  report.set("self_check_failures", double(failures));

  int const top_k = 2048, hot_slots = 4096;
  std::size_t const row_bytes = 656;
  std::int32_t const history  = opt.quick ? 20000 : 100000;
  int const steps             = opt.warmup + opt.reps;
  std::printf("K = %d, H = %d, %zu-byte rows, %d-token histories, pages of 64 tokens scattered; median of %d steps\n\n",
              top_k, hot_slots, row_bytes, history, opt.reps);
  std::printf("%6s %5s %6s %9s %10s %8s %9s %9s %9s  %s\n", "config", "B", "miss", "measured", "median_us", "GB/s",
              "vs_memcpy", "peer_us", "peer/ours", "state");
  for (int batch : {1, 128}) {
    rs::mapped_store const store(
      rs::paged_layout::scattered(batch, history + steps, row_bytes, 6, rs::derive_seed(seed, 1000 + batch)),
      rs::derive_seed(seed, 2000 + batch));
    for (double miss : {0.01, 0.14}) {
      rs::workload_options o;
      o.batch          = batch;
      o.num_requests   = batch;
      o.top_k          = top_k;
      o.hot_slots      = hot_slots;
      o.initial_length = history;
      o.keep           = {1.0 - miss};
      rs::trace const t = rs::make_trace(o, steps, rs::derive_seed(seed, 3000 + batch * 100 + int(miss * 100)), false);
      auto report_one = [&](char const* name, timing const& r) {
        double const gbps = r.miss_fraction * batch * top_k * row_bytes / (r.median_us * 1e3);
        double const peer = peer_us(batch, miss);
        std::printf("%6s %5d %5.0f%% %8.2f%% %10.1f %8.1f %9.2f %9.1f %9.2f  %s\n", name, batch, miss * 100,
                    r.miss_fraction * 100, r.median_us, gbps, gbps / memcpy_gbps, peer, peer / r.median_us,
                    r.check.empty() ? "exact" : r.check.c_str());
        failures += !r.check.empty();
        report.add_record();
        report.field("config", name);
        report.field("batch", double(batch));
        report.field("miss_target", miss);
        report.field("miss_measured", r.miss_fraction);
        report.field("median_us", r.median_us);
        report.field("gbps", gbps);
        report.field("fraction_of_memcpy", gbps / memcpy_gbps);
        report.field("peer_us", peer);
        report.field("exact", r.check.empty() ? 1.0 : 0.0);
      };
      report_one("1024", time_trace<config_1024>(t, store, opt.warmup, opt.reps, stream));
      report_one("512", time_trace<config_512>(t, store, opt.warmup, opt.reps, stream));
    }
  }
  report.write(opt.json_path);
  cudaStreamDestroy(stream);
  std::printf("\n%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
