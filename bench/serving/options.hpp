/**
 * @file bench/serving/options.hpp
 * @brief The serving benchmark's scenarios (BENCH.md "Serving scenarios") and command line
 *        (plain C++).
 *
 * A scenario describes the full model (layers, rows, K, layer groups, context) and how much
 * of it one run simulates. The benchmark simulates `layers_sim` of the model's
 * `layers_full` layers and sizes every group's device pool so that each mode admits the
 * number of requests it would admit in the full model: the pool is `pool_fraction` of the
 * live KV of `pool_ref` requests, counted per simulated group (the HBM-to-KV ratio is what
 * decides who fits, and it does not depend on how many layers are simulated).
 */
#pragma once

#include <dhisparse/error.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace dhisparse::bench::serving {

/// The four serving modes of BENCH.md.
enum class mode { resident, hisparse, adaptive, adaptive_spec };

inline char const* mode_name(mode m)
{
  switch (m) {
    case mode::resident: return "resident";
    case mode::hisparse: return "hisparse";
    case mode::adaptive: return "adaptive";
    case mode::adaptive_spec: return "adaptive+spec";
  }
  return "?";
}

inline mode parse_mode(std::string const& s)
{
  for (mode m : {mode::resident, mode::hisparse, mode::adaptive, mode::adaptive_spec}) {
    if (s == mode_name(m)) { return m; }
  }
  if (s == "spec" || s == "adaptive_spec") { return mode::adaptive_spec; }
  throw error("unknown mode '" + s + "' (resident, hisparse, adaptive, adaptive+spec)");
}

/// How each group's missed rows reach the slab.
enum class fetch_kind {
  fused,    ///< resolve_and_retrieve: each request's block copies its own misses
  split,    ///< resolve, then retrieve of all layers of the group
  layered,  ///< resolve, retrieve of layer 0, then the group's other layers on a side stream
            ///< while layer 0 attends (HiSparse's layer-wise prefetch)
};

/// One scenario: the full model, what is simulated, and the sweep.
struct scenario {
  std::string name;             ///< "A" or "B"
  std::string model;            ///< what it stands for, printed with the results
  int top_k         = 2048;     ///< K
  int group_layers  = 4;        ///< layers sharing one selection (IndexShare group)
  int layers_sim    = 8;        ///< layers simulated (a multiple of group_layers)
  int layers_full   = 78;       ///< layers of the full model (per-layer time is scaled by full/sim)
  int row_bytes_model = 656;    ///< the model's KV row bytes (reported; the benchmark stores 656-B rows)
  std::int32_t context = 100000;  ///< tokens of every request before the first step
  std::vector<int> concurrency{8, 16, 32, 64, 128};
  double pool_fraction = 0.5;   ///< device pool = this fraction of the live KV of `pool_ref` requests
  int pool_ref         = 128;   ///< 0: the largest concurrency of the sweep
  int heads            = 64;    ///< query heads of the MLA attention
  int index_heads      = 64;    ///< indexer heads (DSA lightning indexer: 64 heads of 128 dims)
  int index_stride     = 1;     ///< positions per index key (1: DSA; > 1: a compressed indexer)
};

/// The standard scenarios (BENCH.md): A = GLM-5.3-like, B = DeepSeek-V4-Flash-like.
inline scenario scenario_a()
{
  scenario s;
  s.name            = "A";
  s.model           = "GLM-5.3-like: FP8-656 rows, K = 2048, IndexShare groups of 4 layers, 100K context";
  s.top_k           = 2048;
  s.group_layers    = 4;
  s.layers_sim      = 8;
  s.layers_full     = 78;
  s.row_bytes_model = 656;
  s.context         = 100000;
  s.concurrency     = {8, 16, 32, 48, 64, 96, 128};
  s.pool_fraction   = 0.5;
  s.pool_ref        = 128;
  return s;
}

inline scenario scenario_b()
{
  scenario s;
  s.name            = "B";
  s.model           = "DeepSeek-V4-Flash-like: 584-B rows (stored as FP8-656), K = 512, groups of 1, 500K context";
  s.top_k           = 512;
  s.group_layers    = 1;
  s.layers_sim      = 1;  // 500K-token histories: host memory, not HBM, bounds the sweep
  s.layers_full     = 61;
  s.row_bytes_model = 584;
  s.context         = 500000;
  s.concurrency     = {8, 16, 32, 64, 128, 192};
  s.pool_fraction   = 0.125;  // HBM holds 1/8 of the live KV at the top of the sweep
  s.pool_ref        = 192;
  return s;
}

/// Per-position survival of a DSpark-like chain of 7 drafts: draft i is accepted (with all
/// before it) with probability survival[i]; the 1st > 70%, the 7th < 10% (docs/PEERS).
inline std::vector<double> dspark_survival() { return {0.72, 0.60, 0.48, 0.36, 0.25, 0.15, 0.08}; }

/// Everything the command line sets.
struct options {
  std::vector<std::string> scenarios{"A", "B"};
  std::vector<mode> modes{mode::resident, mode::hisparse, mode::adaptive, mode::adaptive_spec};
  std::vector<int> concurrency;     ///< empty: the scenario's sweep
  bool quick          = false;
  bool check          = false;      ///< run the correctness self-check only
  bool plan           = false;      ///< print the sizing (sweep, pools, host memory, who fits); no GPU
  std::string json_path;
  std::string trace_path;           ///< replay a recorded trace instead of the drift workload
  int steps           = 96;         ///< timed steps per (mode, concurrency)
  int warmup          = 8;          ///< untimed graph replays before them
  int phase_steps     = 2;          ///< eager, instrumented steps for the phase breakdown
  int union_steps     = 4;          ///< speculative runs: eager steps probing the union's saving
  int templates       = 16;         ///< distinct drift requests per group (requests reuse them, shifted)
  int layers_sim      = 0;          ///< 0: the scenario's
  int layers_full     = 0;          ///< 0: the scenario's
  int heads           = 0;          ///< 0: the scenario's
  int index_heads     = 0;          ///< 0: the scenario's (32 or 64)
  int index_stride    = 0;          ///< 0: the scenario's
  std::int32_t context = 0;         ///< 0: the scenario's
  double pool_fraction = -1.0;      ///< < 0: the scenario's
  int pool_ref        = -1;         ///< < 0: the scenario's
  double host_gib     = 100.0;      ///< most pinned host memory for the host store
  double latency_bound_ms = 50.0;   ///< p99 per-token latency bound of the full model
  double dense_mb     = 64.0;       ///< per layer: one GPU's share of the active weights
  double lm_head_mb   = 232.0;      ///< per step: one GPU's share of the LM head (151552 × 6144 bf16 / 8)
  double draft_mb     = 128.0;      ///< per step: the drafter's weights (one GEMM)
  int vocab           = 151552;
  int drafts          = 7;          ///< chain length d of adaptive+spec (Q = 1 + d)
  std::vector<double> survival;     ///< per-draft survival; empty: DSpark-like profile
  std::string draft_dist = "one_hot";  ///< one_hot (deterministic draft) or candidates (DFlash2-like)
  std::string spec_length = "controller";  ///< adaptive+spec: controller (speculation_controller picks d_b per
                                           ///< request and step) or fixed (every request verifies `drafts`)
  int calibration_steps = 2;        ///< controller: timed replays per step shape for its cost model
  std::string fetch   = "auto";     ///< auto, fused, split, layered
  bool indexer        = true;       ///< run the indexer stand-in (scores + top-K pass)
  int hisparse_buffer = 4096;       ///< fixed; static_budget<4096> is compiled in
  /// hierarchy_config::order_plans: -1 off; N ≥ 0 on, for plans of at least N entries
  /// (split and layered fetches; the fused one copies in emission order).
  int order_plans     = -1;
  int backup_blocks   = 0;          ///< hierarchy_config::backup_blocks (0: 64 per group)
  std::uint64_t seed  = 1;

  static std::vector<int> int_list(std::string const& s)
  {
    std::vector<int> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) { v.push_back(std::atoi(item.c_str())); }
    return v;
  }
  static std::vector<std::string> str_list(std::string const& s)
  {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) { v.push_back(item); }
    return v;
  }

  static void usage(char const* argv0)
  {
    std::printf(
      "usage: %s [--quick] [--check] [--plan] [--json FILE] [--scenario A|B|A,B] [--modes m1,m2,...]\n"
      "          [--concurrency c1,c2,...] [--steps N] [--warmup N] [--layers N] [--layers-full N]\n"
      "          [--heads N] [--index-heads 32|64] [--index-stride S] [--context N] [--pool-fraction F] [--pool-ref C] [--host-gib G]\n"
      "          [--latency-bound-ms MS] [--dense-mb MB] [--lm-head-mb MB] [--draft-mb MB]\n"
      "          [--vocab V] [--drafts D] [--survival s1,s2,...] [--alpha A] [--draft-dist one_hot|candidates]\n"
      "          [--fetch auto|fused|split|layered] [--no-indexer] [--templates R] [--trace FILE] [--seed S]\n"
      "          [--union-steps N] [--spec-length controller|fixed] [--calibration-steps N]\n"
      "          [--order-plans MIN_ENTRIES] [--backup-blocks N]\n"
      "modes: resident, hisparse, adaptive, adaptive+spec\n",
      argv0);
  }

  static options parse(int argc, char** argv)
  {
    options o;
    bool steps_set = false, warmup_set = false, templates_set = false;
    double alpha   = -1.0;
    for (int i = 1; i < argc; ++i) {
      std::string const a = argv[i];
      auto value          = [&]() -> std::string {
        DHISPARSE_EXPECTS(i + 1 < argc, "missing value after " + a);
        return argv[++i];
      };
      if (a == "--quick") {
        o.quick = true;
      } else if (a == "--check") {
        o.check = true;
      } else if (a == "--plan") {
        o.plan = true;
      } else if (a == "--json") {
        o.json_path = value();
      } else if (a == "--trace") {
        o.trace_path = value();
      } else if (a == "--scenario") {
        o.scenarios = str_list(value());
      } else if (a == "--modes") {
        o.modes.clear();
        for (auto const& m : str_list(value())) { o.modes.push_back(parse_mode(m)); }
      } else if (a == "--concurrency") {
        o.concurrency = int_list(value());
      } else if (a == "--steps") {
        o.steps   = std::max(4, std::atoi(value().c_str()));
        steps_set = true;
      } else if (a == "--warmup") {
        o.warmup   = std::max(1, std::atoi(value().c_str()));
        warmup_set = true;
      } else if (a == "--union-steps") {
        o.union_steps = std::max(0, std::atoi(value().c_str()));
      } else if (a == "--layers") {
        o.layers_sim = std::atoi(value().c_str());
      } else if (a == "--layers-full") {
        o.layers_full = std::atoi(value().c_str());
      } else if (a == "--heads") {
        o.heads = std::atoi(value().c_str());
      } else if (a == "--index-heads") {
        o.index_heads = std::atoi(value().c_str());
      } else if (a == "--index-stride") {
        o.index_stride = std::max(1, std::atoi(value().c_str()));
      } else if (a == "--context") {
        o.context = std::atoi(value().c_str());
      } else if (a == "--pool-fraction") {
        o.pool_fraction = std::atof(value().c_str());
      } else if (a == "--pool-ref") {
        o.pool_ref = std::atoi(value().c_str());
      } else if (a == "--host-gib") {
        o.host_gib = std::atof(value().c_str());
      } else if (a == "--latency-bound-ms") {
        o.latency_bound_ms = std::atof(value().c_str());
      } else if (a == "--dense-mb") {
        o.dense_mb = std::atof(value().c_str());
      } else if (a == "--lm-head-mb") {
        o.lm_head_mb = std::atof(value().c_str());
      } else if (a == "--draft-mb") {
        o.draft_mb = std::atof(value().c_str());
      } else if (a == "--vocab") {
        o.vocab = std::atoi(value().c_str());
      } else if (a == "--drafts") {
        o.drafts = std::atoi(value().c_str());
      } else if (a == "--survival") {
        o.survival.clear();
        for (auto const& s : str_list(value())) { o.survival.push_back(std::atof(s.c_str())); }
      } else if (a == "--alpha") {  // constant per-token acceptance α: survival α, α², …
        alpha = std::atof(value().c_str());
        DHISPARSE_EXPECTS(alpha > 0.0 && alpha <= 1.0, "--alpha must be in (0, 1]");
      } else if (a == "--draft-dist") {
        o.draft_dist = value();
      } else if (a == "--spec-length") {
        o.spec_length = value();
      } else if (a == "--calibration-steps") {
        o.calibration_steps = std::max(1, std::atoi(value().c_str()));
      } else if (a == "--fetch") {
        o.fetch = value();
      } else if (a == "--order-plans") {
        o.order_plans = std::atoi(value().c_str());
        DHISPARSE_EXPECTS(o.order_plans >= 0, "--order-plans needs a minimum plan size ≥ 0");
      } else if (a == "--backup-blocks") {
        o.backup_blocks = std::atoi(value().c_str());
        DHISPARSE_EXPECTS(o.backup_blocks >= 0, "--backup-blocks must be ≥ 0 (0: 64 per group)");
      } else if (a == "--no-indexer") {
        o.indexer = false;
      } else if (a == "--templates") {
        o.templates   = std::max(1, std::atoi(value().c_str()));
        templates_set = true;
      } else if (a == "--seed") {
        o.seed = std::strtoull(value().c_str(), nullptr, 10);
      } else if (a == "--help" || a == "-h") {
        usage(argv[0]);
        std::exit(0);
      } else {
        std::fprintf(stderr, "unknown argument: %s\n", a.c_str());
        usage(argv[0]);
        std::exit(2);
      }
    }
    if (o.quick) {
      if (!steps_set) { o.steps = 12; }
      if (!warmup_set) { o.warmup = 3; }
      if (!templates_set) { o.templates = 4; }
      o.phase_steps = 1;
    }
    if (alpha > 0.0) {
      double s = 1.0;
      o.survival.clear();
      for (int d = 0; d < std::max(1, o.drafts); ++d) { o.survival.push_back(s *= alpha); }
    } else if (o.survival.empty()) {
      o.survival = dspark_survival();
      o.survival.resize(std::size_t(std::max(1, o.drafts)), o.survival.back() * 0.5);
    }
    o.drafts = int(o.survival.size());
    DHISPARSE_EXPECTS(o.drafts >= 1 && o.drafts <= 15, "--drafts must be in [1, 15]");
    for (std::size_t i = 0; i < o.survival.size(); ++i) {
      double const prev = i == 0 ? 1.0 : o.survival[i - 1];
      DHISPARSE_EXPECTS(o.survival[i] > 0.0 && o.survival[i] <= prev,
                        "--survival must be positive and non-increasing, at most 1");
    }
    DHISPARSE_EXPECTS(o.draft_dist == "one_hot" || o.draft_dist == "candidates",
                      "--draft-dist must be one_hot or candidates");
    DHISPARSE_EXPECTS(o.spec_length == "controller" || o.spec_length == "fixed",
                      "--spec-length must be controller or fixed");
    DHISPARSE_EXPECTS(o.fetch == "auto" || o.fetch == "fused" || o.fetch == "split" || o.fetch == "layered",
                      "--fetch must be auto, fused, split or layered");
    return o;
  }

  /// The scenario `name` with this command line's overrides and the quick-mode sizes.
  scenario resolve_scenario(std::string const& name) const
  {
    scenario s;
    if (name == "A" || name == "a") {
      s = scenario_a();
      if (quick) {
        s.layers_sim  = 4;
        s.concurrency = {8, 32};
      }
    } else if (name == "B" || name == "b") {
      s = scenario_b();
      if (quick) {
        s.layers_sim  = 1;
        s.concurrency = {8, 32};
      }
    } else {
      throw error("unknown scenario '" + name + "' (A or B)");
    }
    if (layers_sim > 0) { s.layers_sim = layers_sim; }
    if (layers_full > 0) { s.layers_full = layers_full; }
    if (heads > 0) { s.heads = heads; }
    if (index_heads > 0) { s.index_heads = index_heads; }
    if (index_stride > 0) { s.index_stride = index_stride; }
    DHISPARSE_EXPECTS(s.index_heads == 32 || s.index_heads == 64, "--index-heads must be 32 or 64");
    DHISPARSE_EXPECTS(s.heads == 16 || s.heads == 32 || s.heads == 64 || s.heads == 128,
                      "--heads must be 16, 32, 64 or 128 (the MLA kernel's head counts)");
    if (context > 0) { s.context = context; }
    if (pool_fraction >= 0.0) { s.pool_fraction = pool_fraction; }
    if (pool_ref >= 0) { s.pool_ref = pool_ref; }
    if (!concurrency.empty()) { s.concurrency = concurrency; }
    std::sort(s.concurrency.begin(), s.concurrency.end());
    DHISPARSE_EXPECTS(s.layers_sim > 0 && s.layers_sim % s.group_layers == 0,
                      "scenario " + s.name + ": simulated layers (" + std::to_string(s.layers_sim) +
                        ") must be a positive multiple of the group size (" + std::to_string(s.group_layers) + ")");
    DHISPARSE_EXPECTS(s.layers_full >= s.layers_sim, "scenario " + s.name + ": --layers-full below --layers");
    DHISPARSE_EXPECTS(!s.concurrency.empty() && s.concurrency.front() > 0,
                      "scenario " + s.name + ": concurrencies must be positive");
    return s;
  }

  /// The fetch path for groups of `group_layers` layers.
  fetch_kind fetch_for(int group_layers) const
  {
    if (fetch == "fused") { return fetch_kind::fused; }
    if (fetch == "split") { return fetch_kind::split; }
    if (fetch == "layered") { return group_layers > 1 ? fetch_kind::layered : fetch_kind::split; }
    return group_layers > 1 ? fetch_kind::layered : fetch_kind::fused;
  }
};

}  // namespace dhisparse::bench::serving
