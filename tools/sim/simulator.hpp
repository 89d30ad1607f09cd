/**
 * @file tools/sim/simulator.hpp
 * @brief The core of `dhisparse-sim`: replays a workload (tools/sim/workload.hpp) through
 *        the host reference `host::kv_hierarchy` for one eviction policy, budget policy,
 *        pool size and concurrency, and counts what the GPU would have done (plain C++).
 *
 * The host reference makes the decisions of the GPU's `kv_hierarchy` (which rows hit,
 * which are fetched, evicted or reclaimed), so the counters of a run are the GPU's for the
 * same selections. Rows are opaque 16-byte stand-ins: the simulator needs decisions, not
 * bytes; bytes over PCIe are reported from the real row size the caller gives.
 *
 * One step of a run is what an engine's decode step does with the hierarchy: admit the
 * requests that appear for the first time, `set_batch`, `resolve` every group, `commit`
 * (the recorded accepted counts, or every query), `backup` every `backup_interval` steps,
 * release the requests that do not appear again (optionally `prewarm` after admission).
 * `retrieve` is left out: it only copies
 * the bytes of rows that resolve already decided to fetch.
 */
#pragma once

#include "workload.hpp"

#include <dhisparse/error.hpp>
#include <dhisparse/group_counters.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/policy/lfu_decay.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/score_ema.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/trace.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse::sim {

/**
 * @brief `policy::static_budget<H>` with H chosen at run time (the simulator sweeps H).
 *
 * The hierarchy reads a budget's floor and cap only when it is constructed and when a
 * request is admitted or reserved, so H is fixed for a run by a `scope` that lives as
 * long as the hierarchy. The value is thread-local: concurrent simulations on other
 * threads keep their own. The tests check that it decides exactly as `static_budget<H>`.
 */
struct static_slots_budget {
  static constexpr budget_kind kind      = budget_kind::per_request;
  static constexpr reclaim_order reclaim = reclaim_order::none;

  static std::int64_t floor(budget_inputs) noexcept { return slots(); }
  static std::int64_t cap(budget_inputs) noexcept { return slots(); }

  /// @brief H of this thread's current run.
  static std::int32_t& slots() noexcept
  {
    static thread_local std::int32_t h = 4096;
    return h;
  }
  /// Sets H for its lifetime and restores the previous value.
  class scope {
   public:
    explicit scope(std::int32_t h) : previous_{slots()} { slots() = h; }
    scope(scope const&)            = delete;
    scope& operator=(scope const&) = delete;
    ~scope() { slots() = previous_; }

   private:
    std::int32_t previous_;
  };
};
static_assert(is_budget_policy_v<static_slots_budget>);

/// The eviction policies the simulator sweeps (with their library defaults).
enum class eviction { lru, clock, lfu_decay, score_ema };
/// The budget policies the simulator sweeps.
enum class budget { static_slots, global, fair_share };

/// Every eviction policy, in report order.
inline constexpr eviction all_evictions[] = {eviction::lru, eviction::clock, eviction::lfu_decay, eviction::score_ema};
/// Every budget policy, in report order.
inline constexpr budget all_budgets[] = {budget::static_slots, budget::global, budget::fair_share};

/// @brief "lru", "clock", "lfu_decay", "score_ema".
inline char const* name(eviction e)
{
  switch (e) {
    case eviction::lru: return "lru";
    case eviction::clock: return "clock";
    case eviction::lfu_decay: return "lfu_decay";
    case eviction::score_ema: return "score_ema";
  }
  return "?";
}
/// @brief "static", "global" (adaptive, global reclaim), "fair_share" (adaptive, water filling).
inline char const* name(budget b)
{
  switch (b) {
    case budget::static_slots: return "static";
    case budget::global: return "global";
    case budget::fair_share: return "fair_share";
  }
  return "?";
}
/// @brief Whether the policy needs per-selection scores (`score_ema`).
inline bool needs_scores(eviction e) { return e == eviction::score_ema; }

/// @brief Parses a name as printed by `name` (throws `dhisparse::error` naming the choices).
template <class Enum, std::size_t N>
Enum parse(std::string const& text, Enum const (&all)[N], char const* what)
{
  std::string choices;
  for (Enum e : all) {
    if (text == name(e)) { return e; }
    choices += (choices.empty() ? "" : ", ") + std::string(name(e));
  }
  throw error("dhisparse-sim: unknown " + std::string(what) + " '" + text + "' (choose from " + choices + ")");
}

/// What one run replays and with which resources.
struct run_config {
  std::int64_t pool_slots    = 0;     ///< device slots per group
  std::uint64_t warmup_steps = 0;     ///< steps run before counting
  int backup_interval        = 1;     ///< steps between two backups
  std::int32_t static_slots  = 4096;  ///< H of the static budget
  /// Rows `prewarm` brings in for each request right after its admission (its most recent
  /// ones, as an engine would keep its prefill on the device): 0 none, -1 all of them.
  std::int32_t prewarm_rows = 0;
};

/// What one run counted over its measured steps (those after the warm-up).
struct run_result {
  group_counters counters{};        ///< the hierarchy's counters, summed over groups
  std::uint64_t measured_steps = 0;
  std::uint64_t tokens         = 0;  ///< tokens committed (the generated tokens)
  std::uint64_t selections     = 0;  ///< valid selection entries resolved (all groups)
  double seconds               = 0;  ///< in the hierarchy's calls
  int admitted                 = 0;  ///< requests admitted (whole run)
  int refused                  = 0;  ///< admissions refused (whole run): budget floors did not fit
  std::uint32_t status         = 0;  ///< OR of the hierarchy's status words after every step
  std::string error;                 ///< why no hierarchy could be built (empty: it ran)

  /// @brief Fetched rows / selected rows (`group_counters::fetch_fraction`).
  [[nodiscard]] double fetch_fraction() const noexcept { return counters.fetch_fraction(); }
  /// @brief Bytes copied host → device (fetched rows) per committed token, rows of `row_bytes`.
  [[nodiscard]] double h2d_bytes_per_token(double row_bytes) const noexcept
  {
    return per_token(counters.fetched_rows, row_bytes);
  }
  /// @brief Bytes copied device → host (backed-up rows) per committed token.
  [[nodiscard]] double d2h_bytes_per_token(double row_bytes) const noexcept
  {
    return per_token(counters.backed_up_rows, row_bytes);
  }
  /// @brief `rows` × `row_bytes` / `tokens`.
  [[nodiscard]] double per_token(unsigned long long rows, double row_bytes) const noexcept
  {
    return tokens == 0 ? 0.0 : double(rows) * row_bytes / double(tokens);
  }
  /// @brief Valid selection entries resolved per second of the simulator.
  [[nodiscard]] double selections_per_s() const noexcept { return seconds > 0 ? double(selections) / seconds : 0.0; }
};

namespace detail {

/// `to` += `c` (`subtract`: `to` -= `c`), field by field.
inline void accumulate(group_counters& to, group_counters const& c, bool subtract = false)
{
  using field = unsigned long long group_counters::*;
  for (field f : {&group_counters::selected_rows, &group_counters::fetched_rows, &group_counters::tail_rows,
                  &group_counters::evicted_rows, &group_counters::reclaimed_rows, &group_counters::reclaims,
                  &group_counters::prewarmed_rows, &group_counters::backed_up_rows}) {
    to.*f = subtract ? to.*f - c.*f : to.*f + c.*f;
  }
}

template <class H>
group_counters total_counters(H const& h)
{
  group_counters sum{};
  for (int g = 0; g < h.config().num_groups(); ++g) { accumulate(sum, h.counters(g)); }
  return sum;
}

/// Valid entries of the rows of `queries` queries of one request ([max_queries][top_k]).
inline std::uint64_t valid_entries(std::int32_t const* rows, int queries, int top_k)
{
  return std::uint64_t(std::count_if(rows, rows + std::ptrdiff_t(queries) * top_k, [](std::int32_t p) { return p != -1; }));
}

}  // namespace detail

/// An observer that does nothing.
struct no_observer {
  template <class H>
  void operator()(H const&, std::uint64_t) const noexcept {}
};

/// @brief The hierarchy configuration of a run of `plan` over a workload of shape `s`.
inline hierarchy_config make_config(trace::shape const& s, request_plan const& plan, run_config const& rc)
{
  hierarchy_config hc;
  hc.group_layers.assign(std::size_t(s.groups), 1);
  hc.max_requests           = std::max(plan.max_live, 1);
  hc.max_batch              = std::max(plan.max_batch, 1);
  hc.max_queries            = s.max_queries;
  hc.max_top_k              = s.top_k;
  hc.max_context            = std::int32_t(plan.max_capacity);
  hc.device_slots_per_group = rc.pool_slots;
  hc.backup_interval_steps  = rc.backup_interval;
  hc.host.capacity_pages    = std::max<std::size_t>(plan.host_pages, 1);
  return hc;
}

/**
 * @brief What `simulate` replays through: the host reference with 16-byte stand-in rows.
 *
 * A backend names the hierarchy type for an (eviction, budget) pair. Its hierarchy is built
 * from a `hierarchy_config` and offers the host reference's calls with host arrays:
 * `admit`, `prewarm`, `set_batch`, `resolve(group, selections, top_k, scores)`,
 * `commit(accepted)`, `backup`, `release`, `status()`, `counters(group)` and `config()`.
 * `bench/residency` supplies one over the GPU's `kv_hierarchy` (the same runs on the GPU).
 */
struct host_backend {
  template <class Eviction, class Budget>
  using hierarchy = host::kv_hierarchy<row_format::opaque<16>, Eviction, Budget>;
};

/**
 * @brief Replays `w` (the requests of `plan`) through `Backend::hierarchy<Eviction,
 *        Budget>` (default: `host::kv_hierarchy<opaque<16>, Eviction, Budget>`) and counts
 *        the measured steps.
 * @param after_step called as `after_step(hierarchy, step)` after every step
 * @throws dhisparse::error when the workload contradicts itself (a request's recorded
 *         length differs from the tokens it committed), or a policy needs scores the
 *         workload lacks. A configuration the hierarchy refuses (a pool smaller than one
 *         floor, H below the essential set) is not an exception: `run_result::error`.
 */
template <class Eviction, class Budget, class Backend = host_backend, class Observer = no_observer>
run_result simulate(workload& w, request_plan const& plan, run_config const& rc, Observer&& after_step = {})
{
  using hierarchy       = typename Backend::template hierarchy<Eviction, Budget>;
  trace::shape const& s = w.shape();
  DHISPARSE_EXPECTS(!Eviction::needs_scores || s.scores,
                    "dhisparse-sim: the eviction policy needs selection scores; the workload has none");
  DHISPARSE_EXPECTS(rc.backup_interval > 0, "dhisparse-sim: backup interval must be positive");
  run_result out;
  static_slots_budget::scope const slots(rc.static_slots);
  std::optional<hierarchy> h;
  try {
    h.emplace(make_config(s, plan, rc));
  } catch (dhisparse::error const& e) {
    out.error   = e.what();
    out.refused = int(plan.requests.size());
    return out;
  }

  enum : char { waiting, admitted, refused, released };
  std::vector<char> state(plan.requests.size(), waiting);
  std::vector<std::int32_t> length(plan.requests.size(), 0);
  std::vector<request_id> ids;
  std::vector<std::int32_t> queries, accepted, entry, life, rows;
  std::size_t const row_entries = std::size_t(s.max_queries) * std::size_t(s.top_k);
  bool const pass_scores        = Eviction::needs_scores;
  group_counters at_warmup{};
  using clock = std::chrono::steady_clock;

  w.rewind();
  std::uint64_t step = 0;
  for (trace::step_record const* rec; (rec = w.next()) != nullptr; ++step) {
    bool const measured = step >= rc.warmup_steps;
    if (step == rc.warmup_steps) { at_warmup = detail::total_counters(*h); }
    auto const t0 = clock::now();

    // The batch: replayed requests that are (or now become) admitted, in record order.
    ids.clear(), queries.clear(), accepted.clear(), entry.clear(), life.clear();
    bool prefix = true;  // the batch is the record's first entries: resolve reads it in place
    int const count = int(rec->requests.size());
    for (int r = 0; r < count; ++r) {
      trace::request_record const& q = rec->requests[std::size_t(r)];
      int const i                    = plan.find(q.id);
      if (i < 0) { continue; }
      if (state[i] == waiting) {
        try {
          h->admit(q.id, q.length, plan.requests[i].capacity);
          if (rc.prewarm_rows != 0) {
            h->prewarm(q.id, rc.prewarm_rows < 0 ? q.length : std::min(rc.prewarm_rows, q.length));
          }
          state[i]  = admitted;
          length[i] = q.length;
          ++out.admitted;
        } catch (dhisparse::error const&) {
          state[i] = refused;
          ++out.refused;
        }
      }
      if (state[i] != admitted) { continue; }
      DHISPARSE_EXPECTS(q.length == length[i],
                        "dhisparse-sim: step " + std::to_string(rec->step) + ", request " +
                          std::to_string(static_cast<std::uint64_t>(q.id)) + ": recorded length " +
                          std::to_string(q.length) + ", but it committed " + std::to_string(length[i]) +
                          " tokens (a trace must commit through its steps)");
      prefix = prefix && r == int(ids.size());
      ids.push_back(q.id);
      queries.push_back(q.queries);
      accepted.push_back(s.accepted ? q.accepted : q.queries);
      entry.push_back(r);
      life.push_back(i);
    }
    int const batch = int(ids.size());
    h->set_batch(ids.data(), queries.data(), batch);
    for (int g = 0; g < s.groups; ++g) {
      std::size_t const part = std::size_t(g) * std::size_t(count) * row_entries;
      std::int32_t const* sel = rec->positions.data() + part;
      float const* scores     = pass_scores ? rec->scores.data() + part : nullptr;
      std::vector<float> picked_scores;
      if (!prefix) {  // gather the batch's rows (rare: requests left out or refused)
        rows.resize(std::size_t(batch) * row_entries);
        for (int b = 0; b < batch; ++b) {
          std::copy_n(sel + std::size_t(entry[b]) * row_entries, row_entries, rows.begin() + std::ptrdiff_t(b * row_entries));
        }
        if (pass_scores) {
          picked_scores.resize(rows.size());
          for (int b = 0; b < batch; ++b) {
            std::copy_n(scores + std::size_t(entry[b]) * row_entries, row_entries,
                        picked_scores.begin() + std::ptrdiff_t(b * row_entries));
          }
          scores = picked_scores.data();
        }
        sel = rows.data();
      }
      h->resolve(g, sel, s.top_k, scores);
    }
    h->commit(s.accepted ? accepted.data() : nullptr);
    if ((step + 1) % std::uint64_t(rc.backup_interval) == 0) { h->backup(); }
    for (int b = 0; b < batch; ++b) {
      int const i = life[b];
      length[i] += accepted[b];
      if (plan.requests[i].last_step == step) {
        h->release(ids[b]);
        state[i] = released;
      }
    }
    auto const t1 = clock::now();

    out.status |= h->status();
    if (measured) {
      out.seconds += std::chrono::duration<double>(t1 - t0).count();
      ++out.measured_steps;
      for (int b = 0; b < batch; ++b) {
        out.tokens += std::uint64_t(accepted[b]);
        for (int g = 0; g < s.groups; ++g) {
          std::size_t const at = (std::size_t(g) * std::size_t(count) + std::size_t(entry[b])) * row_entries;
          out.selections += detail::valid_entries(rec->positions.data() + at, queries[b], s.top_k);
        }
      }
    }
    after_step(std::as_const(*h), step);
  }
  if (step <= rc.warmup_steps) { at_warmup = detail::total_counters(*h); }
  out.counters = detail::total_counters(*h);
  detail::accumulate(out.counters, at_warmup, true);
  return out;
}

/**
 * @brief `simulate` with the eviction policy chosen at run time (its library defaults:
 *        `lfu_decay<32>`, `score_ema<1, 4, 10>`) and the budget policy fixed.
 */
template <class Budget, class Backend = host_backend, class Observer = no_observer>
run_result simulate_budget(workload& w, request_plan const& plan, eviction e, run_config const& rc,
                           Observer&& after_step = {})
{
  switch (e) {
    case eviction::lru: return simulate<policy::lru, Budget, Backend>(w, plan, rc, after_step);
    case eviction::clock: return simulate<policy::clock, Budget, Backend>(w, plan, rc, after_step);
    case eviction::lfu_decay: return simulate<policy::lfu_decay<>, Budget, Backend>(w, plan, rc, after_step);
    case eviction::score_ema: return simulate<policy::score_ema<>, Budget, Backend>(w, plan, rc, after_step);
  }
  throw error("dhisparse-sim: unknown eviction policy");
}

/**
 * @brief `simulate` with the policies chosen at run time.
 * @param e eviction policy (its library defaults: `lfu_decay<32>`, `score_ema<1, 4, 10>`)
 * @param b budget policy (`static_slots`: H = `rc.static_slots`)
 */
template <class Backend = host_backend, class Observer = no_observer>
run_result simulate(workload& w, request_plan const& plan, eviction e, budget b, run_config const& rc,
                    Observer&& after_step = {})
{
  switch (b) {
    case budget::static_slots: return simulate_budget<static_slots_budget, Backend>(w, plan, e, rc, after_step);
    case budget::global:
      return simulate_budget<policy::adaptive_budget<reclaim_order::global>, Backend>(w, plan, e, rc, after_step);
    case budget::fair_share:
      return simulate_budget<policy::adaptive_budget<reclaim_order::fair_share>, Backend>(w, plan, e, rc, after_step);
  }
  throw error("dhisparse-sim: unknown budget");
}

}  // namespace dhisparse::sim
