// dhisparse-sim: replays a recorded selection trace or the standard drift workload through
// the host reference hierarchy (no GPU) over eviction policies × budget policies × pool
// sizes × concurrency, and reports per run the host fetch fraction, PCIe bytes per
// generated token, reclaimed and evicted rows, refused admissions and the simulator's own
// speed (resolved selections per second). docs/sim.md explains the model.
//
//   dhisparse-sim [--trace FILE | --requests LIST --context N --steps N --warmup N
//                  --top-k K --queries Q --seed S] [--policies LIST] [--budgets LIST]
//                 [--static-slots LIST] [--pool LIST] [--backup-interval N]
//                 [--row-bytes N] [--json FILE] [--plot FILE.png] [--write-trace FILE]
#include "simulator.hpp"
#include "workload.hpp"

#include <common/drift.hpp>
#include <common/report.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#ifndef DHISPARSE_SIM_PLOT_SCRIPT
#define DHISPARSE_SIM_PLOT_SCRIPT "plot.py"
#endif

namespace sim = dhisparse::sim;
using dhisparse::error;

namespace {

char const usage[] = R"(usage: dhisparse-sim [workload] [sweep] [output]

workload (the drift workload of bench/common/drift.hpp unless --trace is given):
  --trace FILE           replay a recorded trace (docs/trace.md)
  --requests LIST        concurrency: requests in the batch, e.g. 1,4,16 (default 4;
                         with --trace: the first N requests of the trace, default all)
  --context N            drift: tokens of context per request (default 100000)
  --top-k K              drift: positions selected per query (default 2048)
  --queries Q            drift: queries per request and step (default 1)
  --seed S               drift: seed (default 1)
  --drift E, --jump J    drift: query drift and jump probability (default: calibrated)
  --accept A             drift with --queries > 1: probability that each draft token is
                         accepted (default 1: every query is committed)
  --steps N              drift: measured steps (default 512)
  --warmup N             steps run before counting (default 64)
  --write-trace FILE     drift: also write the generated workload as a trace file
sweep:
  --policies LIST        lru,clock,lfu_decay,score_ema (default: all; score_ema needs scores)
  --budgets LIST         static,global,fair_share (default: all)
  --static-slots LIST    H of the static budget, slots per request (default 4096)
  --pool LIST            device slots per group: a number with a '.' is a fraction of the
                         live KV (0.25,0.5,1.0), an integer is slots (default
                         0.05,0.1,0.25,0.5,1.0)
  --backup-interval N    steps between two backups (default 1)
  --prewarm N|all        rows per request prewarmed at admission, its most recent ones
                         (default 0; 'all': its whole context, as if prefill stayed on
                         the device)
output:
  --row-bytes N          bytes of one fetched row, for PCIe bytes per token (default 656)
  --json FILE            flat records (scenario, policy, budget, pool_slots, requests,
                         fetch_fraction, h2d_bytes_per_token, reclaimed_rows, ...)
  --plot FILE.png        fetch fraction and PCIe bytes per token against pool size
                         (runs tools/sim/plot.py; needs matplotlib)
  --plot-script FILE     the plot script (default: the source tree's tools/sim/plot.py)
  --python EXE           interpreter for the plot (default /usr/bin/python3, else python3)
  --quick                a small drift workload (smoke run)
)";

std::vector<std::string> split(std::string const& s)
{
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) { out.push_back(item); }
  }
  return out;
}

long long to_integer(std::string const& text, char const* option, long long lo)
{
  char* end          = nullptr;
  long long const v  = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < lo) {
    throw error("dhisparse-sim: " + std::string(option) + " takes integers >= " + std::to_string(lo) + ", not '" +
                text + "'");
  }
  return v;
}

double to_number(std::string const& text, char const* option)
{
  char* end      = nullptr;
  double const v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= 0)) {
    throw error("dhisparse-sim: " + std::string(option) + " takes non-negative numbers, not '" + text + "'");
  }
  return v;
}

/// A pool size as given: a fraction of the live KV or a number of slots.
struct pool_size {
  bool fraction;
  double value;
  [[nodiscard]] std::int64_t slots(std::int64_t live_kv) const
  {
    return fraction ? std::int64_t(std::llround(value * double(live_kv))) : std::int64_t(value);
  }
};

struct options {
  std::string trace_path, write_trace, json_path, plot_path;
  std::string plot_script = DHISPARSE_SIM_PLOT_SCRIPT;
  std::string python      = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  dhisparse::bench::drift_config drift;
  std::vector<int> requests;
  long long steps = 512, warmup = 64;
  double accept   = 1.0;
  bool steps_given = false;
  std::vector<sim::eviction> policies;
  std::vector<sim::budget> budgets{std::begin(sim::all_budgets), std::end(sim::all_budgets)};
  std::vector<std::int32_t> static_slots{4096};
  std::vector<pool_size> pools{{true, 0.05}, {true, 0.1}, {true, 0.25}, {true, 0.5}, {true, 1.0}};
  int backup_interval       = 1;
  std::int32_t prewarm_rows = 0;
  double row_bytes          = 656;

  static options parse(int argc, char** argv)
  {
    options o;
    for (int i = 1; i < argc; ++i) {
      std::string const a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(usage, stdout);
        std::exit(0);
      }
      if (a == "--quick") {
        o.drift.context = 20000;
        o.drift.top_k   = 512;
        o.steps         = 64;
        o.warmup        = 16;
        continue;
      }
      if (i + 1 >= argc) { throw error("dhisparse-sim: unknown option or missing value: " + a + "\n" + usage); }
      std::string const v = argv[++i];
      auto const integers = [&](long long lo) {
        std::vector<long long> out;
        for (auto const& item : split(v)) { out.push_back(to_integer(item, a.c_str(), lo)); }
        if (out.empty()) { throw error("dhisparse-sim: " + a + " needs a value"); }
        return out;
      };
      auto const integer = [&](long long lo) { return to_integer(v, a.c_str(), lo); };
      std::pair<char const*, std::string*> const texts[] = {
        {"--trace", &o.trace_path}, {"--write-trace", &o.write_trace}, {"--json", &o.json_path},
        {"--plot", &o.plot_path},   {"--plot-script", &o.plot_script}, {"--python", &o.python}};
      auto const text = std::find_if(std::begin(texts), std::end(texts), [&](auto const& t) { return a == t.first; });
      if (text != std::end(texts)) {
        *text->second = v;
      } else if (a == "--requests") {
        o.requests.clear();
        for (long long r : integers(1)) { o.requests.push_back(int(r)); }
      } else if (a == "--context") {
        o.drift.context = std::int32_t(integer(1));
      } else if (a == "--top-k") {
        o.drift.top_k = int(integer(1));
      } else if (a == "--queries") {
        o.drift.queries = int(integer(1));
      } else if (a == "--seed") {
        o.drift.seed = std::uint64_t(integer(0));
      } else if (a == "--drift") {
        o.drift.drift = o.drift.verify_drift = to_number(v, "--drift");
      } else if (a == "--jump") {
        o.drift.jump = to_number(v, "--jump");
      } else if (a == "--accept") {
        o.accept = to_number(v, "--accept");
        if (o.accept > 1.0) { throw error("dhisparse-sim: --accept is a probability, not " + v); }
      } else if (a == "--steps") {
        o.steps       = integer(1);
        o.steps_given = true;
      } else if (a == "--warmup") {
        o.warmup = integer(0);
      } else if (a == "--policies") {
        o.policies.clear();
        for (auto const& p : split(v)) { o.policies.push_back(sim::parse(p, sim::all_evictions, "policy")); }
      } else if (a == "--budgets") {
        o.budgets.clear();
        for (auto const& b : split(v)) { o.budgets.push_back(sim::parse(b, sim::all_budgets, "budget")); }
      } else if (a == "--static-slots") {
        o.static_slots.clear();
        for (long long h : integers(1)) { o.static_slots.push_back(std::int32_t(h)); }
      } else if (a == "--pool") {
        o.pools.clear();
        for (auto const& p : split(v)) {
          bool const fraction = p.find('.') != std::string::npos;
          try {
            o.pools.push_back({fraction, fraction ? to_number(p, "--pool") : double(to_integer(p, "--pool", 1))});
          } catch (error const&) {
            throw error("dhisparse-sim: --pool takes fractions of the live KV (0.5) or slot counts (65536), not '" +
                        p + "'");
          }
        }
      } else if (a == "--backup-interval") {
        o.backup_interval = int(integer(1));
      } else if (a == "--prewarm") {
        o.prewarm_rows = v == "all" ? -1 : std::int32_t(integer(0));
      } else if (a == "--row-bytes") {
        o.row_bytes = to_number(v, "--row-bytes");
      } else {
        throw error("dhisparse-sim: unknown option " + a + "\n" + usage);
      }
    }
    if (!o.trace_path.empty() && (o.steps_given || !o.write_trace.empty() || o.accept < 1.0)) {
      throw error("dhisparse-sim: --steps, --accept and --write-trace apply to the drift workload, not to --trace");
    }
    if (o.requests.empty() && o.trace_path.empty()) { o.requests = {4}; }
    if (o.requests.empty()) { o.requests = {0}; }  // a trace's requests, all of them
    return o;
  }
};

std::string quoted(std::string const& s)
{
  std::string out = "'";
  for (char c : s) { out += c == '\'' ? std::string("'\\''") : std::string(1, c); }
  return out + "'";
}

/// A library error without its "dhisparse: " prefix and " (file:line)" suffix.
std::string brief(std::string text)
{
  if (text.rfind("dhisparse: ", 0) == 0) { text.erase(0, 11); }
  if (auto const at = text.rfind(" ("); at != std::string::npos && text.back() == ')') { text.erase(at); }
  return text;
}

/// Runs the plot script on the JSON document; returns its exit status.
int plot(options const& o, std::string const& json_path)
{
  std::string const cmd = quoted(o.python) + " " + quoted(o.plot_script) + " " + quoted(json_path) + " " + quoted(o.plot_path);
  int const rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::fprintf(stderr, "dhisparse-sim: the plot failed (%s)\n", cmd.c_str());
    return 3;
  }
  return 0;
}

int run(options const& o)
{
  std::unique_ptr<sim::workload> w;
  dhisparse::bench::json_report report("dhisparse_sim");
  report.set("date", dhisparse::bench::today());
  int const max_requests = *std::max_element(o.requests.begin(), o.requests.end());
  bool const want_scores = o.policies.empty() || std::find(o.policies.begin(), o.policies.end(),
                                                            sim::eviction::score_ema) != o.policies.end();
  if (!o.trace_path.empty()) {
    w = std::make_unique<sim::trace_workload>(o.trace_path);
    auto const& s = w->shape();
    std::printf("trace %s: %d group(s), up to %d requests x %d queries, top_k %d, %s scores, %s accepted counts\n",
                o.trace_path.c_str(), s.groups, s.max_requests, s.max_queries, s.top_k, s.scores ? "with" : "no",
                s.accepted ? "with" : "no");
    report.set("trace", o.trace_path);
  } else {
    dhisparse::bench::drift_config c = o.drift;
    c.requests                       = max_requests;
    std::printf("drift workload: %d request(s), context %d, top_k %d, queries %d (draft acceptance %g), drift %g, "
                "jump %g, seed %llu; generating %lld steps...\n",
                c.requests, c.context, c.top_k, c.queries, o.accept, c.drift, c.jump,
                static_cast<unsigned long long>(c.seed), o.warmup + o.steps);
    std::fflush(stdout);
    w = std::make_unique<sim::memory_workload>(sim::make_drift_workload(c, int(o.warmup + o.steps), want_scores, o.accept));
    report.set("context", double(c.context));
    report.set("top_k", double(c.top_k));
    report.set("queries", double(c.queries));
    report.set("accept", o.accept);
    report.set("seed", double(c.seed));
    report.set("drift", c.drift);
    report.set("jump", c.jump);
    if (!o.write_trace.empty()) {
      std::printf("wrote %llu steps to %s\n", static_cast<unsigned long long>(sim::write_trace(*w, o.write_trace)),
                  o.write_trace.c_str());
    }
  }
  report.set("scenario", w->scenario());
  report.set("warmup_steps", double(o.warmup));
  report.set("row_bytes", o.row_bytes);
  report.set("backup_interval", double(o.backup_interval));
  report.set("prewarm_rows", double(o.prewarm_rows));

  std::vector<sim::eviction> policies = o.policies;
  if (policies.empty()) {
    for (auto e : sim::all_evictions) {
      if (!sim::needs_scores(e) || w->shape().scores) { policies.push_back(e); }
    }
  }
  for (auto e : policies) {
    if (sim::needs_scores(e) && !w->shape().scores) {
      throw error(std::string("dhisparse-sim: policy ") + sim::name(e) + " needs selection scores; the trace has none");
    }
  }

  std::printf("\n%-10s %-12s %10s %6s %5s %5s %8s %10s %10s %10s %8s  %s\n", "policy", "budget", "pool_slots",
              "/live", "reqs", "refus", "fetch_%", "h2d_B/tok", "reclaimed", "evicted", "Msel/s", "status");
  double all_selections = 0, all_seconds = 0, slowest = 0;
  std::string slowest_run;
  for (int concurrency : o.requests) {
    auto const plan = sim::request_plan::of(*w, concurrency);
    if (plan.steps <= std::uint64_t(o.warmup)) {
      throw error("dhisparse-sim: the workload has " + std::to_string(plan.steps) +
                  " steps, not more than the --warmup of " + std::to_string(o.warmup));
    }
    for (auto const& pool : o.pools) {
      std::int64_t const slots = pool.slots(plan.live_kv);
      for (auto b : o.budgets) {
        std::vector<std::int32_t> const hs =
          b == sim::budget::static_slots ? o.static_slots : std::vector<std::int32_t>{0};
        for (std::int32_t h : hs) {
          std::string const budget = b == sim::budget::static_slots ? "static " + std::to_string(h) : sim::name(b);
          for (auto e : policies) {
            sim::run_config rc;
            rc.pool_slots      = slots;
            rc.warmup_steps    = std::uint64_t(o.warmup);
            rc.backup_interval = o.backup_interval;
            rc.static_slots    = h > 0 ? h : rc.static_slots;
            rc.prewarm_rows    = o.prewarm_rows;
            auto const r       = sim::simulate(*w, plan, e, b, rc);
            int const requests = int(plan.requests.size());
            if (!r.error.empty()) {
              std::printf("%-10s %-12s %10lld %6.3f %5d  not run: %s\n", sim::name(e), budget.c_str(),
                          static_cast<long long>(slots), double(slots) / double(plan.live_kv), requests,
                          brief(r.error).c_str());
            } else {
              std::printf("%-10s %-12s %10lld %6.3f %5d %5d %8.3f %10.1f %10llu %10llu %8.2f  %s\n", sim::name(e),
                          budget.c_str(), static_cast<long long>(slots), double(slots) / double(plan.live_kv),
                          requests, r.refused, 100.0 * r.fetch_fraction(), r.h2d_bytes_per_token(o.row_bytes),
                          r.counters.reclaimed_rows, r.counters.evicted_rows, r.selections_per_s() / 1e6,
                          dhisparse::describe_status(r.status).c_str());
              all_selections += double(r.selections);
              all_seconds += r.seconds;
              if (r.selections > 0 && (slowest == 0 || r.selections_per_s() < slowest)) {
                slowest     = r.selections_per_s();
                slowest_run = std::string(sim::name(e)) + " / " + budget + " / " + std::to_string(slots) + " slots";
              }
            }
            std::fflush(stdout);
            report.add_record();
            report.field("scenario", w->scenario());
            report.field("policy", sim::name(e));
            report.field("budget", sim::name(b));
            report.field("static_slots", double(b == sim::budget::static_slots ? h : 0));
            report.field("pool_slots", double(slots));
            report.field("pool_fraction", double(slots) / double(plan.live_kv));
            report.field("live_kv", double(plan.live_kv));
            report.field("requests", double(requests));
            report.field("admitted", double(r.admitted));
            report.field("refused_admissions", double(r.refused));
            report.field("measured_steps", double(r.measured_steps));
            report.field("tokens", double(r.tokens));
            report.field("selected_rows", double(r.counters.selected_rows));
            report.field("fetched_rows", double(r.counters.fetched_rows));
            report.field("fetch_fraction", r.fetch_fraction());
            report.field("h2d_bytes_per_token", r.h2d_bytes_per_token(o.row_bytes));
            report.field("d2h_bytes_per_token", r.d2h_bytes_per_token(o.row_bytes));
            report.field("prewarmed_rows", double(r.counters.prewarmed_rows));
            report.field("reclaimed_rows", double(r.counters.reclaimed_rows));
            report.field("reclaims", double(r.counters.reclaims));
            report.field("evicted_rows", double(r.counters.evicted_rows));
            report.field("selections", double(r.selections));
            report.field("selections_per_s", r.selections_per_s());
            report.field("status", r.error.empty() ? dhisparse::describe_status(r.status) : "not run: " + brief(r.error));
          }
        }
      }
    }
  }
  if (all_seconds > 0) {
    std::printf("\nsimulator speed (one core, host reference): %.2f M resolved selections/s over all runs; "
                "slowest run %.2f M/s (%s)\n",
                all_selections / all_seconds / 1e6, slowest / 1e6, slowest_run.c_str());
  }

  report.write(o.json_path);
  if (o.plot_path.empty()) { return 0; }
  std::string json_path = o.json_path;
  std::filesystem::path temp;
  if (json_path.empty()) {
    temp      = std::filesystem::path(o.plot_path).concat(".json");
    json_path = temp.string();
    report.write(json_path);
  }
  int const rc = plot(o, json_path);
  if (!temp.empty()) { std::filesystem::remove(temp); }
  return rc;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    return run(options::parse(argc, argv));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
