// bench/drift_calibrate: sweeps the drift workload's ε (query drift) and j (jump
// probability) and prints, per setting, the fraction of selected rows that a
// HiSparse-style fixed buffer fetches from host: 4096 rows per request, exact LRU (ties:
// lower position first), each step's tail row inserted — the host reference
// kv_hierarchy<opaque<16>, lru, static_budget<4096>> — over 512 steps after 64 warm-up
// steps at N = 100 000, K = 2048, Q = 1 (BENCH.md: the target is 14% ± 2%).
//
//   bench_drift_calibrate [--drift a,b,…] [--jump a,b,…] [--seeds N] [--steps N]
//                         [--warmup N] [--context N] [--json FILE] [--quick]
#include <common/drift.hpp>
#include <common/drift_lru.hpp>
#include <common/report.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

std::vector<double> parse_list(std::string const& s)
{
  std::vector<double> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) { v.push_back(std::atof(item.c_str())); }
  return v;
}

}  // namespace

int main(int argc, char** argv)
{
  dhisparse::bench::drift_config const defaults;
  std::vector<double> drifts = {0.02, 0.025, 0.03, 0.031, 0.032, 0.033, 0.035, 0.04, 0.05};
  std::vector<double> jumps  = {0.0, 0.01, 0.02, 0.03, 0.05};
  int seeds = 3, steps = 512, warmup = 64;
  std::int32_t context = defaults.context;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    bool const more     = i + 1 < argc;
    if (a == "--drift" && more) {
      drifts = parse_list(argv[++i]);
    } else if (a == "--jump" && more) {
      jumps = parse_list(argv[++i]);
    } else if (a == "--seeds" && more) {
      seeds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--steps" && more) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && more) {
      warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--context" && more) {
      context = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && more) {
      json_path = argv[++i];
    } else if (a == "--quick") {
      drifts = {defaults.drift};
      jumps  = {defaults.jump};
      seeds  = 1;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--drift a,b,...] [--jump a,b,...] [--seeds N] [--steps N] [--warmup N] "
                   "[--context N] [--json FILE] [--quick]\n",
                   argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }

  std::printf("drift workload calibration, %s: N = %d, K = %d, Q = 1, LRU buffer of 4096 rows, "
              "%d warm-up + %d measured steps, %d seed(s) per setting\n",
              dhisparse::bench::today().c_str(), context, defaults.top_k, warmup, steps, seeds);
  std::printf("target: 14%% +- 2%% of selected rows fetched (BENCH.md)\n\n");
  std::printf("%7s %6s %10s %10s %10s %12s %9s\n", "drift", "jump", "fetch_%", "min_%", "max_%", "gen_ms/step",
              "build_s");

  dhisparse::bench::json_report report("drift_calibrate");
  report.set("date", dhisparse::bench::today());
  report.set("context", double(context));
  report.set("top_k", double(defaults.top_k));
  report.set("buffer_rows", 4096.0);
  report.set("warmup_steps", double(warmup));
  report.set("steps", double(steps));
  for (double drift : drifts) {
    for (double jump : jumps) {
      std::uint64_t fetched = 0, selected = 0;
      double lo = 1.0, hi = 0.0, generate_s = 0.0, build_s = 0.0;
      for (int s = 0; s < seeds; ++s) {
        dhisparse::bench::drift_config c = defaults;
        c.context      = context;
        c.drift        = drift;
        c.verify_drift = drift;
        c.jump         = jump;
        c.seed         = std::uint64_t(s) + 1;
        auto const r        = dhisparse::bench::measure_lru_fetch(c, warmup, steps);
        double const f      = double(r.fetched) / double(r.selected);
        lo = std::min(lo, f);
        hi = std::max(hi, f);
        fetched += r.fetched;
        selected += r.selected;
        generate_s += r.steps_s;
        build_s += r.generator_s - r.steps_s;
      }
      double const fraction = double(fetched) / double(selected);
      double const ms_step  = 1e3 * generate_s / (double(seeds) * (warmup + steps));
      std::printf("%7.3f %6.3f %10.2f %10.2f %10.2f %12.2f %9.2f\n", drift, jump, 100 * fraction, 100 * lo,
                  100 * hi, ms_step, build_s / seeds);
      std::fflush(stdout);
      report.add_record();
      std::pair<char const*, double> const fields[] = {
        {"drift", drift}, {"jump", jump}, {"seeds", double(seeds)}, {"fetch_fraction", fraction},
        {"fetch_fraction_min", lo}, {"fetch_fraction_max", hi}, {"generator_ms_per_step", ms_step},
        {"context_build_s", build_s / seeds}};
      for (auto const& [key, value] : fields) { report.field(key, value); }
    }
  }
  report.write(json_path);
  return 0;
}
