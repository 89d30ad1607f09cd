// bench/residency: load-adaptive residency on the GPU (issue 13, BENCH.md "residency").
//
// The standard drift workload (BENCH.md; generated on the GPU, the same selections as the
// CPU generator) replayed through the GPU's `kv_hierarchy` — 656-byte rows, one layer
// group, `resolve_and_retrieve`, commit, backup every step — for every eviction policy ×
// budget policy in three scenarios:
//   low   pool = 0.5 and 1.0 of the live KV (the requests' whole histories);
//   high  pool = the HiSparse-style baseline's floors + 10% (requests × H × 1.1);
//   ramp  pool = 0.5 of the steady live KV; request b arrives at step b · every and stays
//         until step b · every + life (life = steps − (requests − 1) · every), so the batch
//         grows to all requests and shrinks again: optional residency fills the pool, is
//         reclaimed as requests arrive, and grows back as they leave.
// Every request's prefill rows start on the device (`prewarm` of its whole history right
// after admission), as an engine that keeps its prefill KV resident would do.
//
// Each run also replays through the host reference (`dhisparse-sim`'s path, on worker
// threads while the GPU runs) and the two must agree exactly: every counter (selected,
// fetched, tail, evicted, reclaimed rows, reclaim passes, prewarmed, backed-up rows), the
// status word, admissions and, in the ramp, the owned slots after every step. A mismatch
// is reported and makes the exit status 1.
//
// Reported per run: fetch fraction (fetched / selected rows), bytes H2D and D2H per
// generated token (rows × 656 B from the GPU's counters), reclaimed rows and reclaim passes,
// reclaim_bytes (rows reclaim copied: reclaim returns a slot without copying — the host
// store already holds every committed row — so this is reclaimed rows × 0 bytes; the field
// is there so that a write-back design would show its cost), evicted rows, GPU seconds.
#include "runs.hpp"

#include <common/bench.cuh>
#include <common/drift_gpu.cuh>
#include <common/report.hpp>
#include <sim/workload.hpp>

#include <dhisparse/status.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace dhisparse;
namespace sim = dhisparse::sim;
namespace rb  = dhisparse::bench::residency;

struct options {
  int requests        = 16;
  std::int32_t context = 100000;
  int top_k           = 2048;
  int steps           = 512;
  int warmup          = 64;
  std::int32_t static_slots = 4096;
  int ramp_every      = 16;
  std::uint64_t seed  = 1;
  std::vector<sim::eviction> policies{std::begin(sim::all_evictions), std::end(sim::all_evictions)};
  std::vector<sim::budget> budgets{std::begin(sim::all_budgets), std::end(sim::all_budgets)};
  std::vector<double> low_pools{0.5, 1.0};
  bool cpu_only = false;
  int threads   = 0;
  std::string json_path, plot_path;
  std::string plot_script = DHISPARSE_RESIDENCY_PLOT_SCRIPT;
  std::string python      = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
};

char const usage[] = R"(usage: bench_residency [options]
  --requests N       concurrency (16)
  --context N        tokens of each request before step 0 (100000)
  --top-k K          selections per query (2048)
  --steps N          measured steps (512), after --warmup N (64)
  --static-slots H   the HiSparse-style baseline's buffer per request (4096)
  --ramp-every N     steps between two arrivals (and two departures) in the ramp (16)
  --low-pools LIST   low-load pools as fractions of the live KV (0.5,1.0)
  --policies LIST    lru,clock,lfu_decay,score_ema (all)
  --budgets LIST     static,global,fair_share (all)
  --seed S           workload seed (1)
  --threads N        host-reference threads (all cores but one)
  --cpu-only         host reference only, CPU-generated workload (no GPU needed)
  --quick            20000 tokens, K = 512, 4 requests, 16 + 64 steps, ramp every 8
  --json FILE, --plot FILE.png, --python EXE
)";

std::vector<std::string> split(std::string const& s)
{
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    std::size_t const end = std::min(s.find(',', at), s.size());
    if (end > at) { out.push_back(s.substr(at, end - at)); }
    at = end + 1;
  }
  return out;
}

long long integer(std::string const& v, char const* option, long long lo)
{
  char* end         = nullptr;
  long long const x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo) {
    throw error(std::string("bench_residency: ") + option + " takes an integer >= " + std::to_string(lo) + ", not '" +
                v + "'");
  }
  return x;
}

options parse(int argc, char** argv)
{
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (a == "--quick") {
      o.context = 20000, o.top_k = 512, o.requests = 4, o.warmup = 16, o.steps = 64, o.ramp_every = 8;
      continue;
    }
    if (a == "--cpu-only") {
      o.cpu_only = true;
      continue;
    }
    if (i + 1 >= argc) { throw error("bench_residency: unknown option or missing value: " + a + "\n" + usage); }
    std::string const v = argv[++i];
    if (a == "--requests") {
      o.requests = int(integer(v, "--requests", 1));
    } else if (a == "--context") {
      o.context = std::int32_t(integer(v, "--context", 1));
    } else if (a == "--top-k") {
      o.top_k = int(integer(v, "--top-k", 1));
    } else if (a == "--steps") {
      o.steps = int(integer(v, "--steps", 1));
    } else if (a == "--warmup") {
      o.warmup = int(integer(v, "--warmup", 0));
    } else if (a == "--static-slots") {
      o.static_slots = std::int32_t(integer(v, "--static-slots", 1));
    } else if (a == "--ramp-every") {
      o.ramp_every = int(integer(v, "--ramp-every", 1));
    } else if (a == "--seed") {
      o.seed = std::uint64_t(integer(v, "--seed", 0));
    } else if (a == "--threads") {
      o.threads = int(integer(v, "--threads", 1));
    } else if (a == "--low-pools") {
      o.low_pools.clear();
      for (auto const& p : split(v)) { o.low_pools.push_back(std::stod(p)); }
    } else if (a == "--policies") {
      o.policies.clear();
      for (auto const& p : split(v)) { o.policies.push_back(sim::parse(p, sim::all_evictions, "policy")); }
    } else if (a == "--budgets") {
      o.budgets.clear();
      for (auto const& b : split(v)) { o.budgets.push_back(sim::parse(b, sim::all_budgets, "budget")); }
    } else if (a == "--json") {
      o.json_path = v;
    } else if (a == "--plot") {
      o.plot_path = v;
    } else if (a == "--python") {
      o.python = v;
    } else {
      throw error("bench_residency: unknown option " + a + "\n" + usage);
    }
  }
  DHISPARSE_EXPECTS(std::int64_t(o.ramp_every) * (o.requests - 1) < o.warmup + o.steps,
                    "bench_residency: the ramp's arrivals (requests x --ramp-every) must fit the workload's steps");
  return o;
}

/// `steps` steps of the drift workload of `c` with scores, the O(B·N·d) part on the GPU
/// (the same records as `sim::make_drift_workload(c, steps, true)`).
sim::memory_workload gpu_drift_workload(bench::drift_config const& c, int steps)
{
  cudaStream_t stream = nullptr;
  DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bench::drift_generator_gpu gen(c, steps, stream);
  trace::shape const s = sim::drift_shape(c, true, false);
  std::size_t const entries = s.group_entries(c.requests);
  dhisparse::detail::device_array<std::int32_t> selections(entries);
  dhisparse::detail::device_array<float> scores(entries);
  std::vector<trace::step_record> out(static_cast<std::size_t>(steps));
  for (int step = 0; step < steps; ++step) {
    auto& rec = out[std::size_t(step)];
    rec.step  = std::uint64_t(step);
    for (int b = 0; b < c.requests; ++b) {
      rec.requests.push_back({request_id(std::uint64_t(b) + 1), gen.host().length(b), c.queries, -1});
    }
    rec.positions.resize(entries);
    rec.scores.resize(entries);
    gen.next(selections.data(), scores.data(), stream);
    DHISPARSE_CUDA_TRY(cudaMemcpyAsync(rec.positions.data(), selections.data(), entries * sizeof(std::int32_t),
                                       cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(
      cudaMemcpyAsync(rec.scores.data(), scores.data(), entries * sizeof(float), cudaMemcpyDeviceToHost, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    gen.commit();
  }
  cudaStreamDestroy(stream);
  return sim::memory_workload(s, std::move(out), "drift");
}

/// The load ramp over `w`'s requests: request b (id b + 1) takes part in steps
/// [b · every, b · every + life), with life = steps − (requests − 1) · every.
sim::memory_workload ramp_workload(sim::memory_workload const& w, int every)
{
  trace::shape const& s      = w.shape();
  auto const& steps          = w.steps();
  int const n                = s.max_requests;
  std::int64_t const life    = std::int64_t(steps.size()) - std::int64_t(n - 1) * every;
  std::size_t const per      = std::size_t(s.max_queries) * std::size_t(s.top_k);
  std::vector<trace::step_record> out(steps.size());
  for (std::size_t t = 0; t < steps.size(); ++t) {
    auto const& in = steps[t];
    auto& rec      = out[t];
    rec.step       = in.step;
    for (int b = 0; b < n; ++b) {
      std::int64_t const first = std::int64_t(b) * every;
      if (std::int64_t(t) < first || std::int64_t(t) >= first + life) { continue; }
      rec.requests.push_back(in.requests[std::size_t(b)]);
      rec.positions.insert(rec.positions.end(), in.positions.begin() + std::ptrdiff_t(b * per),
                           in.positions.begin() + std::ptrdiff_t((b + 1) * per));
      rec.scores.insert(rec.scores.end(), in.scores.begin() + std::ptrdiff_t(b * per),
                        in.scores.begin() + std::ptrdiff_t((b + 1) * per));
    }
  }
  return sim::memory_workload(s, std::move(out), "ramp");
}

/// A read-only cursor over a `memory_workload` (one per thread; the steps are shared).
class cursor : public sim::workload {
 public:
  explicit cursor(sim::memory_workload const& w) : w_{w} {}
  [[nodiscard]] trace::shape const& shape() const override { return w_.shape(); }
  void rewind() override { next_ = 0; }
  trace::step_record const* next() override
  {
    return next_ < w_.steps().size() ? &w_.steps()[next_++] : nullptr;
  }
  [[nodiscard]] std::string scenario() const override { return w_.scenario(); }

 private:
  sim::memory_workload const& w_;
  std::size_t next_ = 0;
};

struct run_spec {
  std::string scenario;
  sim::memory_workload const* workload = nullptr;
  sim::request_plan const* plan        = nullptr;
  sim::eviction eviction               = sim::eviction::lru;
  sim::budget budget                   = sim::budget::static_slots;
  sim::run_config config;
  // Results.
  sim::run_result gpu, host;
  std::vector<rb::step_sample> gpu_series, host_series;
  std::string gpu_error;  // an exception of the GPU run
  std::string mismatch;   // where the GPU and the host reference differ
};

std::string compare(run_spec const& r)
{
  if (!r.gpu_error.empty()) { return "GPU run failed: " + r.gpu_error; }
  auto const& g = r.gpu;
  auto const& h = r.host;
  if (g.error.empty() != h.error.empty()) { return "one backend refused the configuration: " + g.error + h.error; }
  using field = unsigned long long group_counters::*;
  struct named {
    char const* name;
    field f;
  };
  for (named n : {named{"selected_rows", &group_counters::selected_rows}, {"fetched_rows", &group_counters::fetched_rows},
                  {"tail_rows", &group_counters::tail_rows}, {"evicted_rows", &group_counters::evicted_rows},
                  {"reclaimed_rows", &group_counters::reclaimed_rows}, {"reclaims", &group_counters::reclaims},
                  {"prewarmed_rows", &group_counters::prewarmed_rows},
                  {"backed_up_rows", &group_counters::backed_up_rows}}) {
    if (g.counters.*n.f != h.counters.*n.f) {
      return std::string(n.name) + " " + std::to_string(g.counters.*n.f) + " (GPU) vs " +
             std::to_string(h.counters.*n.f) + " (host)";
    }
  }
  if (g.status != h.status) { return "status " + describe_status(g.status) + " vs " + describe_status(h.status); }
  if (g.admitted != h.admitted || g.refused != h.refused || g.tokens != h.tokens) {
    return "admissions or tokens differ";
  }
  if (r.gpu_series.size() != r.host_series.size()) { return "step series lengths differ"; }
  for (std::size_t i = 0; i < r.gpu_series.size(); ++i) {
    auto const& a = r.gpu_series[i];
    auto const& b = r.host_series[i];
    if (a.live != b.live || a.owned_slots != b.owned_slots || a.fetched != b.fetched || a.reclaimed != b.reclaimed) {
      return "step " + std::to_string(a.step) + ": owned slots " + std::to_string(a.owned_slots) + " vs " +
             std::to_string(b.owned_slots) + ", fetched " + std::to_string(a.fetched) + " vs " +
             std::to_string(b.fetched);
    }
  }
  return {};
}

int run(options const& o)
{
  bench::json_report report("residency");
  report.set("date", bench::today());
  bench::drift_config c;
  c.context  = o.context;
  c.top_k    = o.top_k;
  c.requests = o.requests;
  c.seed     = o.seed;
  c.validate();
  int const total_steps = o.warmup + o.steps;
  std::string const device = o.cpu_only ? std::string("none (host reference only)") : bench::device_name();
  std::printf("residency: %s; drift workload %d requests, context %d, K %d, %d + %d steps, seed %llu\n",
              device.c_str(), o.requests, o.context, o.top_k, o.warmup, o.steps,
              static_cast<unsigned long long>(o.seed));
  std::fflush(stdout);
  sim::memory_workload const steady =
    o.cpu_only ? sim::make_drift_workload(c, total_steps, true) : gpu_drift_workload(c, total_steps);
  sim::memory_workload const ramp = ramp_workload(steady, o.ramp_every);
  cursor steady_cursor(steady), ramp_cursor(ramp);
  sim::request_plan const steady_plan = sim::request_plan::of(steady_cursor, 0);
  sim::request_plan const ramp_plan   = sim::request_plan::of(ramp_cursor, 0);

  constexpr double row_bytes = 656;
  std::int64_t const high_pool = std::int64_t(1.1 * double(o.requests) * double(o.static_slots));
  report.set("device", device);
  report.set("context", double(o.context));
  report.set("top_k", double(o.top_k));
  report.set("requests", double(o.requests));
  report.set("warmup_steps", double(o.warmup));
  report.set("measured_steps", double(o.steps));
  report.set("static_slots", double(o.static_slots));
  report.set("ramp_every", double(o.ramp_every));
  report.set("row_bytes", row_bytes);
  report.set("seed", double(o.seed));
  report.set("live_kv", double(steady_plan.live_kv));
  report.set("prewarm", "all (each request's history is brought onto the device at admission)");

  std::vector<run_spec> runs;
  auto const add = [&](std::string scenario, sim::memory_workload const& w, sim::request_plan const& plan,
                       std::int64_t pool, std::uint64_t warmup) {
    for (auto b : o.budgets) {
      for (auto e : o.policies) {
        run_spec r;
        r.scenario = scenario;
        r.workload = &w;
        r.plan     = &plan;
        r.eviction = e;
        r.budget   = b;
        r.config.pool_slots      = pool;
        r.config.warmup_steps    = warmup;
        r.config.backup_interval = 1;
        r.config.static_slots    = o.static_slots;
        r.config.prewarm_rows    = -1;
        runs.push_back(std::move(r));
      }
    }
  };
  for (double f : o.low_pools) {
    add("low", steady, steady_plan, std::int64_t(f * double(steady_plan.live_kv)), std::uint64_t(o.warmup));
  }
  add("high", steady, steady_plan, high_pool, std::uint64_t(o.warmup));
  // The ramp's pool holds half of the steady workload's live KV: a few requests fill it with
  // optional rows, later arrivals make reclaim shrink them, departures let them grow back.
  add("ramp", ramp, ramp_plan, std::int64_t(0.5 * double(steady_plan.live_kv)), 0);

  // The host reference on worker threads; the GPU runs here, one after the other.
  std::atomic<std::size_t> next_host{0};
  std::vector<std::thread> workers;
  int const threads =
    o.threads > 0 ? o.threads : std::max(1, int(std::thread::hardware_concurrency()) - (o.cpu_only ? 0 : 1));
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        for (std::size_t i; (i = next_host++) < runs.size();) {
          auto& r = runs[i];
          cursor w(*r.workload);
          r.host = rb::run_host(w, *r.plan, r.eviction, r.budget, r.config,
                                r.scenario == "ramp" ? &r.host_series : nullptr);
        }
      } catch (...) {
        failures[std::size_t(t)] = std::current_exception();
      }
    });
  }
  if (!o.cpu_only) {
    for (auto& r : runs) {
      cursor w(*r.workload);
      try {
        r.gpu = rb::run_gpu(w, *r.plan, r.eviction, r.budget, r.config, r.scenario == "ramp" ? &r.gpu_series : nullptr);
      } catch (std::exception const& e) {
        r.gpu_error = e.what();
      }
      std::printf("  GPU %-5s %-9s %-10s %9lld slots: fetch %.3f%% (%.1f s)\n", r.scenario.c_str(),
                  sim::name(r.eviction), sim::name(r.budget), static_cast<long long>(r.config.pool_slots),
                  100.0 * r.gpu.fetch_fraction(), r.gpu.seconds);
      std::fflush(stdout);
    }
  }
  for (auto& w : workers) { w.join(); }
  for (auto const& f : failures) {
    if (f) { std::rethrow_exception(f); }
  }

  int mismatches = 0;
  std::printf("\n%-5s %-10s %-10s %9s %6s %8s %8s %10s %10s %10s %8s %9s %6s  %s\n", "scen", "policy", "budget",
              "pool", "/live", "fetch_%", "sim_%", "h2d_B/tok", "d2h_B/tok", "reclaimed", "reclaims", "evicted",
              "gpu_s", "sim = GPU");
  for (auto& r : runs) {
    sim::run_result const& shown = o.cpu_only ? r.host : r.gpu;
    if (!o.cpu_only) {
      r.mismatch = compare(r);
      mismatches += !r.mismatch.empty();
    }
    std::string const budget =
      r.budget == sim::budget::static_slots ? "static " + std::to_string(o.static_slots) : sim::name(r.budget);
    double const live = double(r.plan->live_kv);
    if (!shown.error.empty()) {
      std::printf("%-5s %-10s %-10s %9lld %6.3f  not run: %s\n", r.scenario.c_str(), sim::name(r.eviction),
                  budget.c_str(), static_cast<long long>(r.config.pool_slots), double(r.config.pool_slots) / live,
                  shown.error.c_str());
    } else {
      std::printf("%-5s %-10s %-10s %9lld %6.3f %8.3f %8.3f %10.0f %10.0f %10llu %8llu %9llu %6.1f  %s\n",
                  r.scenario.c_str(), sim::name(r.eviction), budget.c_str(),
                  static_cast<long long>(r.config.pool_slots), double(r.config.pool_slots) / live,
                  100.0 * shown.fetch_fraction(), 100.0 * r.host.fetch_fraction(),
                  shown.h2d_bytes_per_token(row_bytes), shown.d2h_bytes_per_token(row_bytes),
                  shown.counters.reclaimed_rows, shown.counters.reclaims, shown.counters.evicted_rows, shown.seconds,
                  o.cpu_only ? "(host only)" : r.mismatch.empty() ? "yes" : ("NO: " + r.mismatch).c_str());
    }
    report.add_record();
    report.field("scenario", r.scenario);
    report.field("policy", sim::name(r.eviction));
    report.field("budget", sim::name(r.budget));
    report.field("static_slots", double(r.budget == sim::budget::static_slots ? o.static_slots : 0));
    report.field("pool_slots", double(r.config.pool_slots));
    report.field("pool_fraction", double(r.config.pool_slots) / live);
    report.field("requests", double(r.plan->requests.size()));
    report.field("refused_admissions", double(shown.refused));
    report.field("measured_steps", double(shown.measured_steps));
    report.field("tokens", double(shown.tokens));
    report.field("selected_rows", double(shown.counters.selected_rows));
    report.field("fetched_rows", double(shown.counters.fetched_rows));
    report.field("fetch_fraction", shown.fetch_fraction());
    report.field("sim_fetched_rows", double(r.host.counters.fetched_rows));
    report.field("h2d_bytes_per_token", shown.h2d_bytes_per_token(row_bytes));
    report.field("d2h_bytes_per_token", shown.d2h_bytes_per_token(row_bytes));
    report.field("prewarmed_rows", double(shown.counters.prewarmed_rows));
    report.field("reclaimed_rows", double(shown.counters.reclaimed_rows));
    report.field("reclaims", double(shown.counters.reclaims));
    report.field("reclaim_bytes", 0.0);  // reclaim copies nothing (see the top of this file)
    report.field("evicted_rows", double(shown.counters.evicted_rows));
    report.field("gpu_seconds", o.cpu_only ? 0.0 : r.gpu.seconds);
    report.field("sim_agrees", o.cpu_only ? "not run" : r.mismatch.empty() ? "yes" : r.mismatch);
    report.field("status", shown.error.empty() ? describe_status(shown.status) : "not run: " + shown.error);
  }
  // The ramp's owned slots step by step (every 4th step), for the plot.
  for (auto const& r : runs) {
    auto const& series = o.cpu_only ? r.host_series : r.gpu_series;
    for (std::size_t i = 0; i < series.size(); i += 4) {
      report.add_record();
      report.field("scenario", "ramp_step");
      report.field("policy", sim::name(r.eviction));
      report.field("budget", sim::name(r.budget));
      report.field("step", double(series[i].step));
      report.field("live", double(series[i].live));
      report.field("owned_slots", double(series[i].owned_slots));
      report.field("fetched_rows", double(series[i].fetched));
      report.field("reclaimed_rows", double(series[i].reclaimed));
    }
  }
  if (!o.cpu_only) {
    std::printf("\nsimulator and GPU: %s (%zu runs)\n",
                mismatches == 0 ? "identical counters in every run" : "MISMATCH (see the table)", runs.size());
  }
  report.write(o.json_path);
  if (!o.plot_path.empty()) {
    DHISPARSE_EXPECTS(!o.json_path.empty(), "bench_residency: --plot needs --json");
    std::string const cmd = o.python + " " + o.plot_script + " " + o.json_path + " " + o.plot_path;
    if (std::system(cmd.c_str()) != 0) { std::fprintf(stderr, "bench_residency: the plot failed (%s)\n", cmd.c_str()); }
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    return run(parse(argc, argv));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
