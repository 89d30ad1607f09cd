/**
 * @file soak.hpp
 * @brief A long randomized run of a KV hierarchy (issue 18, item 1), the same driver for
 *        the host reference (`host_backend.hpp`) and the GPU (`gpu_backend.cuh`).
 *
 * The driver plays an engine and a model at once. Between steps it admits requests (their
 * prefill rows written into the host store), releases them, reserves room for decoding,
 * moves the pool limit between the admitted floors and the whole slab, reclaims, prewarms
 * and makes bad calls that must be refused with `dhisparse::error`. Each step takes a
 * random batch with 1..Qmax queries per request, random selections with the locality of
 * sparse attention (sometimes shuffled, repeated, holed, or with invalid entries that must
 * be flagged and served as empty), writes the tail rows the model would write, commits a
 * random accepted length per request (sometimes an invalid one, which must keep nothing)
 * and backs up at random intervals no longer than `backup_interval_steps`.
 *
 * Every committed row has a version (0 for prefill, the step's number for a tail row),
 * and its bytes are a pure function of (salt, request, group, layer, position, version),
 * so a rejected draft row is different from the row accepted later at its position. After
 * every step the driver checks:
 *
 * - every slot of every group is accounted for: owned + free = the pool limit, and the
 *   floors fit it (the GPU backend also checks its free stack and owner array);
 * - every slot a resolve hands out is below the limit, serves one (request, position)
 *   only, belongs to the request that selected it (GPU: owner array), and holds exactly
 *   the bytes of that request's committed row — or, for a tail position, is that query's
 *   tail slot and holds the row just written; invalid entries are -1;
 * - every kept query got its tail row in every group; the status word holds exactly the
 *   flags of the bad entries injected;
 * - GPU: every resident committed row of every request holds its exact bytes;
 * - a refused call changed nothing (admission: not admitted, floors and free host pages
 *   unchanged; pool limits unchanged);
 * - before a request is released (sometimes) and at the end (all): every committed row in
 *   the host store equals the truth.
 *
 * A broken invariant is a violation: recorded with the step and the seed (the run stops
 * after `options::max_violations`). `DHISPARSE_SOAK_VERBOSE=1` prints each event.
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/status.hpp>

#include "workload.hpp"  // tests/hierarchy: splitmix64, make_selection

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse::test::soak {

/// What the backends show of a group after the layers of a step (resolve, retrieve, tail writes).
struct group_view {
  std::vector<std::int32_t> slot_table;  ///< [max_batch][max_queries][top_k]
  std::vector<std::int32_t> tail_slots;  ///< [max_batch][max_queries]
  std::byte const* slab = nullptr;       ///< group rows of every slot (all layers contiguous)
  std::size_t row_bytes = 0;             ///< bytes of one group row
  std::int32_t num_slots = 0;
  std::vector<std::int32_t> owner;     ///< per slot: request index or -1 (empty: not shown)
  std::vector<std::int32_t> position;  ///< per slot (empty: not shown)
};

/// Slot accounting of a group.
struct accounting {
  std::int64_t owned = 0, free = 0, limit = 0;
  std::string problem;  ///< what the backend found wrong in its own structures, or empty
};

/// The inputs of a step's layers, for every group.
struct layer_inputs {
  int top_k = 0;
  std::vector<std::vector<std::int32_t>> selections;  ///< per group [max_batch][max_queries][top_k]
  std::vector<std::vector<float>> scores;             ///< per group, same shape
  std::vector<std::vector<std::byte>> tail_rows;      ///< per group [max_batch][max_queries][group row]
};

struct options {
  std::uint64_t seed   = 1;
  std::int64_t steps   = 1000;
  int max_violations   = 20;
  /// Probabilities of the events between two steps.
  double p_admit = 0.25, p_release = 0.08, p_pool = 0.05, p_reclaim = 0.03, p_prewarm = 0.03, p_bad_call = 0.08;
  /// Probabilities of bad entries within a step.
  double p_bad_selection = 0.05, p_bad_accepted = 0.04;
  /// Probability that a release first checks the request's rows in the host store.
  double p_check_release = 0.5;
  bool verbose = std::getenv("DHISPARSE_SOAK_VERBOSE") != nullptr;
};

struct report {
  std::uint64_t seed = 0;
  std::int64_t steps = 0, rows_checked = 0, host_rows_checked = 0, violations = 0;
  std::int64_t admitted = 0, refused_admissions = 0, released = 0, reserves = 0, pool_changes = 0, backups = 0;
  std::int64_t bad_calls_refused = 0, flagged_entries = 0, committed_rows = 0, rejected_rows = 0;
  std::vector<std::string> messages;  ///< the first violations

  [[nodiscard]] std::string summary() const
  {
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "seed %llu: %lld steps, %lld rows checked (%lld of them in the host store), %lld violations; "
                  "%lld admitted, %lld admissions refused, %lld released, %lld reserves, %lld pool-limit changes, "
                  "%lld backups, %lld bad calls refused, %lld bad entries flagged, %lld rows committed, %lld "
                  "draft rows rejected",
                  static_cast<unsigned long long>(seed), static_cast<long long>(steps),
                  static_cast<long long>(rows_checked), static_cast<long long>(host_rows_checked),
                  static_cast<long long>(violations), static_cast<long long>(admitted),
                  static_cast<long long>(refused_admissions), static_cast<long long>(released),
                  static_cast<long long>(reserves), static_cast<long long>(pool_changes),
                  static_cast<long long>(backups), static_cast<long long>(bad_calls_refused),
                  static_cast<long long>(flagged_entries), static_cast<long long>(committed_rows),
                  static_cast<long long>(rejected_rows));
    return buf;
  }
};

/// The bytes of one layer's row of (request, group, layer, position) at `version`.
inline void row_bytes(std::uint64_t salt, std::uint64_t request, int group, int layer, std::int64_t position,
                      std::uint32_t version, std::byte* out, std::size_t bytes)
{
  std::uint64_t h = splitmix64(salt ^ splitmix64(request * 0x9E3779B97F4A7C15ull + std::uint64_t(group) * 1000003ull +
                                                 std::uint64_t(layer) * 7919ull +
                                                 std::uint64_t(position) * 2654435761ull +
                                                 (std::uint64_t(version) << 40)));
  for (std::size_t i = 0; i < bytes; i += 8) {
    h               = splitmix64(h);
    std::uint64_t v = h | 1;  // never an all-zero word
    std::memcpy(out + i, &v, std::min<std::size_t>(8, bytes - i));
  }
}

/**
 * @brief The driver (see the file comment). `Backend` adapts one hierarchy: see
 *        `host_backend` for the operations it provides.
 */
template <class Backend>
class driver {
 public:
  driver(Backend& backend, options const& o)
    : b_{backend}, o_{o}, c_{backend.config()}, rng_{o.seed}, salt_{splitmix64(o.seed ^ 0x5A17ull)}
  {
    for (int l : c_.group_layers) { group_row_bytes_.push_back(std::size_t(l) * Backend::row_bytes); }
    report_.seed = o.seed;
  }

  /// Runs the soak; returns its report (violations included).
  report run()
  {
    check_accounting("construction");
    for (step_ = 0; step_ < o_.steps && report_.violations < o_.max_violations; ++step_) {
      between_steps();
      step();
      report_.steps = step_ + 1;
    }
    final_check();
    return report_;
  }

  // ---- scripted use (tests/peers): the same checks on a chosen sequence ---------------------

  /// One step as an engine chose it; unset fields are drawn at random as in the soak.
  struct step_spec {
    std::vector<std::uint64_t> ids;      ///< the batch (admitted requests)
    std::vector<std::int32_t> queries;   ///< per entry, 1..max_queries (with room reserved)
    int top_k = 0;                       ///< 0: random
    std::vector<std::int32_t> accepted;  ///< per entry; empty: random; plain: ignored
    bool plain         = false;          ///< commit with accepted = null (keep every query)
    bool bad_entries   = false;          ///< inject invalid selections / accepted counts
    int backup         = -1;             ///< 1: back up after commit, 0: do not, -1: when due
    /// Fills one query's selection [top_k] (-1 = none); null: random with locality.
    std::function<void(std::uint64_t id, int q, std::int32_t length, std::int32_t* row, int top_k)> select;
  };

  /// Admits `id` with its prefill rows; false (nothing changed, checked) when refused.
  bool admit_request(std::uint64_t id, std::int32_t length, std::int64_t capacity, std::string* refusal = nullptr)
  {
    next_id_ = std::max(next_id_, id + 1);
    return admit_exact(id, length, capacity, refusal);
  }
  /// Reserves room for `id`; false when refused.
  bool reserve_request(std::uint64_t id, std::int64_t capacity, std::string* refusal = nullptr)
  {
    try {
      b_.reserve(rid(id), capacity);
    } catch (::dhisparse::error const& e) {
      if (refusal != nullptr) { *refusal = e.what(); }
      check_accounting("a refused reserve");
      return false;
    }
    live_[id].capacity = std::max<std::int64_t>(live_[id].capacity, capacity);
    ++report_.reserves;
    check_accounting("reserve");
    return true;
  }
  /// Releases `id`, checking its host rows first when `check_rows`, and the slot accounting
  /// after it when `check_slots` (the GPU backend synchronizes the stream for that: a
  /// scenario that wants work still in flight after the release passes false).
  void release_request(std::uint64_t id, bool check_rows, bool check_slots = true)
  {
    release_exact(id, check_rows, check_slots);
  }
  /// Runs one step of `spec` with every check of the soak.
  void run_step(step_spec const& spec)
  {
    execute(spec);
    ++step_;
    report_.steps = step_;
  }
  /// Enqueues a backup and does not wait for it (GPU: the next calls overtake it on the host).
  void backup_async()
  {
    b_.backup();
    ++report_.backups;
    since_backup_ = 0;
  }
  /// Every committed row of `id` in the host store equals the truth (backs up first).
  void check_host(std::uint64_t id) { check_host_rows(id); }
  /// Every request's rows in the host store, and the slot accounting.
  void check_all() { final_check(); }
  [[nodiscard]] soak::report const& current_report() const { return report_; }
  [[nodiscard]] std::int32_t length(std::uint64_t id) const { return live_.at(id).length; }
  [[nodiscard]] std::int64_t capacity(std::uint64_t id) const { return live_.at(id).capacity; }
  Backend& backend() { return b_; }

 private:
  struct request {
    std::int32_t length   = 0;
    std::int64_t capacity = 0;
    std::int32_t focus    = 0;
    std::vector<std::uint32_t> version;  ///< per committed position
  };

  // ---- helpers -----------------------------------------------------------------------------

  void violation(std::string const& what)
  {
    ++report_.violations;
    std::string m = "step " + std::to_string(step_) + " (seed " + std::to_string(o_.seed) + "): " + what;
    if (o_.verbose) { std::fprintf(stderr, "VIOLATION %s\n", m.c_str()); }
    if (report_.messages.size() < 20) { report_.messages.push_back(std::move(m)); }
  }
  void log(std::string const& what) const
  {
    if (o_.verbose) { std::fprintf(stderr, "[%lld] %s\n", static_cast<long long>(step_), what.c_str()); }
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  T uniform(T lo, T hi)  // inclusive
  {
    return std::uniform_int_distribution<T>(lo, hi)(rng_);
  }
  std::uint64_t pick_live()
  {
    auto it = live_.begin();
    std::advance(it, uniform<std::size_t>(0, live_.size() - 1));
    return it->first;
  }
  request_id rid(std::uint64_t id) const { return request_id{id}; }

  void group_row(std::uint64_t id, int g, std::int64_t position, std::uint32_t version, std::byte* out) const
  {
    for (int l = 0; l < c_.group_layers[g]; ++l) {
      row_bytes(salt_, id, g, l, position, version, out + std::size_t(l) * Backend::row_bytes, Backend::row_bytes);
    }
  }

  /// Runs `op`, which must throw `dhisparse::error`; returns whether it did.
  template <class Op>
  bool must_refuse(char const* what, Op&& op)
  {
    try {
      op();
    } catch (::dhisparse::error const& e) {
      ++report_.bad_calls_refused;
      log(std::string("refused as it should: ") + what + ": " + e.what());
      return true;
    } catch (std::exception const& e) {
      violation(std::string(what) + ": an exception other than dhisparse::error: " + e.what());
      return false;
    }
    violation(std::string(what) + ": accepted");
    return false;
  }

  // ---- between steps -------------------------------------------------------------------------

  void between_steps()
  {
    if (live_.size() < std::size_t(c_.max_requests) && (live_.empty() || chance(o_.p_admit))) { admit(); }
    if (!live_.empty() && chance(o_.p_release)) { release(pick_live()); }
    if (chance(o_.p_pool)) { change_pool_limit(); }
    if (Backend::shared_budget && chance(o_.p_reclaim)) {
      int const g = uniform(0, c_.num_groups() - 1);
      b_.reclaim(g, uniform<std::int32_t>(0, std::int32_t(c_.device_slots_per_group / 4)));
      check_accounting("reclaim");
    }
    if (!live_.empty() && chance(o_.p_prewarm)) {
      std::uint64_t const id = pick_live();
      b_.prewarm(rid(id), uniform<std::int32_t>(0, 2 * c_.max_top_k));
      check_accounting("prewarm");
    }
    if (chance(o_.p_bad_call)) { bad_call(); }
  }

  void admit()
  {
    // Mostly short prompts, sometimes long ones near max_context.
    std::int32_t const longest = c_.max_context - 8 * c_.max_queries;
    std::int32_t const length  = chance(0.2) ? uniform<std::int32_t>(longest / 2, longest)
                                             : uniform<std::int32_t>(0, std::max(1, longest / 8));
    // Room for decoding: what the request will write before its next reserve.
    std::int64_t const capacity =
      std::min<std::int64_t>(c_.max_context, std::int64_t(length) + c_.max_queries * uniform(1, 24));
    admit_exact(next_id_++, length, capacity, nullptr);
  }

  bool admit_exact(std::uint64_t id, std::int32_t length, std::int64_t capacity, std::string* refusal)
  {
    std::int64_t const floors = b_.floor_sum();
    std::size_t const pages   = b_.free_host_pages();
    bool const known          = b_.contains(rid(id));
    try {
      b_.admit(rid(id), length, capacity);
    } catch (::dhisparse::error const& e) {
      ++report_.refused_admissions;
      if (refusal != nullptr) { *refusal = e.what(); }
      log("admission refused: " + std::string(e.what()));
      if (b_.contains(rid(id)) != known) { violation("a refused admission changed whether the request is admitted"); }
      if (b_.floor_sum() != floors) { violation("a refused admission changed the floors"); }
      if (b_.free_host_pages() != pages) { violation("a refused admission changed the free host pages"); }
      return false;
    }
    if (known) { violation("admit succeeded for an admitted request"); }
    ++report_.admitted;
    request& r = live_[id];
    r.length   = length;
    r.capacity = capacity < 0 ? std::int64_t(length) + c_.max_queries : capacity;
    r.focus    = length / 2;
    r.version.assign(std::size_t(length), 0);
    for (int g = 0; g < c_.num_groups(); ++g) {
      for (int l = 0; l < c_.group_layers[g]; ++l) {
        for (std::int32_t p = 0; p < length; ++p) {
          row_bytes(salt_, id, g, l, p, 0, b_.host_row(rid(id), g, l, p), Backend::row_bytes);
        }
      }
    }
    log("admitted " + std::to_string(id) + " length " + std::to_string(length) + " capacity " +
        std::to_string(capacity));
    check_accounting("admit");
    return true;
  }

  void release(std::uint64_t id) { release_exact(id, chance(o_.p_check_release), true); }

  void release_exact(std::uint64_t id, bool check_rows, bool check_slots)
  {
    if (check_rows) { check_host_rows(id); }
    b_.release(rid(id));
    live_.erase(id);
    ++report_.released;
    log("released " + std::to_string(id));
    if (check_slots) { check_accounting("release"); }
  }

  void change_pool_limit()
  {
    int const g               = uniform(0, c_.num_groups() - 1);
    std::int64_t const floors = std::max<std::int64_t>(1, b_.floor_sum());
    // Swings: often all the way down to the floors, often back up to the whole slab.
    std::int64_t const limit = chance(0.3)   ? floors
                               : chance(0.3) ? c_.device_slots_per_group
                                             : uniform<std::int64_t>(floors, c_.device_slots_per_group);
    b_.set_pool_limit(g, limit);
    ++report_.pool_changes;
    if (b_.pool_limit(g) != limit) { violation("set_pool_limit: the limit reads back as another value"); }
    log("pool limit of group " + std::to_string(g) + ": " + std::to_string(limit));
    check_accounting("set_pool_limit");
  }

  /// One bad call, which must be refused with dhisparse::error and change nothing.
  void bad_call()
  {
    int const g               = uniform(0, c_.num_groups() - 1);
    std::int64_t const limit  = b_.pool_limit(g);
    std::int64_t const floors = b_.floor_sum();
    std::size_t const pages   = b_.free_host_pages();
    std::uint64_t const known = live_.empty() ? 0 : pick_live();
    std::uint64_t const unknown = next_id_ + 1000;
    std::vector<std::int32_t> const sel(c_.step_entries() + 1, -1);
    switch (uniform(0, 10)) {
      case 0:
        if (!live_.empty()) { must_refuse("admit of an admitted id", [&] { b_.admit(rid(known), 1, -1); }); }
        break;
      case 1:
        must_refuse("admit beyond max_context", [&] { b_.admit(rid(unknown), c_.max_context + 1, -1); });
        break;
      case 2: must_refuse("admit with capacity < length", [&] { b_.admit(rid(unknown), 8, 4); }); break;
      case 3: must_refuse("release of an unknown id", [&] { b_.release(rid(unknown)); }); break;
      case 4:
        if (!live_.empty()) {
          must_refuse("reserve beyond max_context", [&] { b_.reserve(rid(known), c_.max_context + 1); });
        } else {
          must_refuse("reserve of an unknown id", [&] { b_.reserve(rid(unknown), 8); });
        }
        break;
      case 5: {
        std::vector<request_id> ids{rid(unknown)};
        std::vector<std::int32_t> q{1};
        if (!live_.empty() && chance(0.5)) {
          ids = {rid(known), rid(known)};  // twice
          q   = {1, 1};
        } else if (!live_.empty() && chance(0.5)) {
          ids = {rid(known)};
          q   = {std::int32_t(c_.max_queries + 1)};
        }
        must_refuse("set_batch with a bad entry", [&] { b_.set_batch(ids, q); });
      } break;
      case 6:
        if (has_batch_) {
          must_refuse("resolve with top_k above max_top_k", [&] { b_.resolve_only(g, sel, c_.max_top_k + 1); });
        }
        break;
      case 7:
        if (floors > 1) {
          must_refuse("set_pool_limit below the floors", [&] { b_.set_pool_limit(g, floors - 1); });
        } else {
          must_refuse("set_pool_limit above the slab",
                      [&] { b_.set_pool_limit(g, c_.device_slots_per_group + 1); });
        }
        break;
      case 8:
        if (!live_.empty()) {
          must_refuse("host_row beyond the capacity",
                      [&] { static_cast<void>(b_.host_row(rid(known), g, 0, live_[known].capacity + 64 * 1024)); });
        }
        break;
      case 9:
        if (!live_.empty()) { must_refuse("prewarm of a negative count", [&] { b_.prewarm(rid(known), -1); }); }
        break;
      default: must_refuse("retrieve of a bad layer range", [&] { b_.retrieve_only(g, 1, 0); }); break;
    }
    if (b_.pool_limit(g) != limit) { violation("a refused call changed a pool limit"); }
    if (b_.floor_sum() != floors) { violation("a refused call changed the floors"); }
    if (b_.free_host_pages() != pages) { violation("a refused call changed the free host pages"); }
    if (!live_.empty() && !b_.contains(rid(known))) { violation("a refused call dropped a request"); }
    check_accounting("a refused call");
  }

  // ---- the step ----------------------------------------------------------------------------

  void step()
  {
    if (live_.empty()) { return; }
    // The batch: a random subset, each with 1..Qmax queries (fewer drafts are likelier).
    std::vector<std::uint64_t> ids;
    for (auto const& [id, r] : live_) { ids.push_back(id); }
    std::shuffle(ids.begin(), ids.end(), rng_);
    ids.resize(std::min<std::size_t>(ids.size(), std::size_t(uniform(1, c_.max_batch))));
    std::vector<std::uint64_t> batch;
    std::vector<std::int32_t> queries;
    for (std::uint64_t id : ids) {
      request& r          = live_[id];
      std::int32_t q      = std::min(c_.max_queries, uniform(1, c_.max_queries + 1));
      if (r.length + q > r.capacity) {  // decoding needs room: the engine reserves it
        std::int64_t const want =
          std::min<std::int64_t>(c_.max_context, std::int64_t(r.length) + q + c_.max_queries * uniform(1, 16));
        try {
          b_.reserve(rid(id), want);
          r.capacity = std::max<std::int64_t>(r.capacity, want);
          ++report_.reserves;
          check_accounting("reserve");
        } catch (::dhisparse::error const& e) {
          log("reserve refused: " + std::string(e.what()));
        }
      }
      q = std::int32_t(std::min<std::int64_t>(q, r.capacity - r.length));
      if (q < 1) {  // at max_context, or no room: the request finishes
        release(id);
        continue;
      }
      batch.push_back(id);
      queries.push_back(q);
    }
    if (batch.empty()) { return; }
    step_spec spec;
    spec.ids         = std::move(batch);
    spec.queries     = std::move(queries);
    spec.bad_entries = true;
    execute(spec);
  }

  void execute(step_spec const& spec)
  {
    std::vector<std::uint64_t> const& batch = spec.ids;
    std::vector<std::int32_t> const& queries = spec.queries;
    std::vector<request_id> rids;
    for (auto id : batch) { rids.push_back(rid(id)); }
    b_.set_batch(rids, queries);
    has_batch_ = true;

    std::uint32_t const version = std::uint32_t(step_ + 1);
    int const top_k             = spec.top_k > 0 ? spec.top_k : chance(0.7) ? c_.max_top_k : uniform(1, c_.max_top_k);
    std::size_t const per_b     = std::size_t(c_.max_queries) * top_k;
    std::uint32_t expected_status = 0;
    layer_inputs in;
    in.top_k = top_k;
    std::vector<std::vector<char>> invalid(std::size_t(c_.num_groups()));  // per entry: injected as invalid
    for (int g = 0; g < c_.num_groups(); ++g) {
      std::vector<std::int32_t> sel(std::size_t(c_.max_batch) * per_b, -1);
      invalid[g].assign(sel.size(), 0);
      for (std::size_t b = 0; b < batch.size(); ++b) {
        request& r = live_[batch[b]];
        r.focus    = std::clamp<std::int32_t>(r.focus + uniform(-30, 30), 0, std::max(0, r.length));
        for (int q = 0; q < queries[b]; ++q) {
          std::int32_t* row = sel.data() + b * per_b + std::size_t(q) * top_k;
          if (spec.select) {
            spec.select(batch[b], q, r.length, row, top_k);
          } else {
            make_selection(rng_, r.length, q, top_k, r.focus, row);
            restyle(row, top_k);
          }
          if (spec.bad_entries && chance(o_.p_bad_selection)) {
            std::size_t const e = uniform<std::size_t>(0, std::size_t(top_k) - 1);
            row[e]              = chance(0.5) ? r.length + q + uniform(1, 1000) : -uniform(2, 1000);
            invalid[g][b * per_b + std::size_t(q) * top_k + e] = 1;
            expected_status |= status_invalid_selection;
            ++report_.flagged_entries;
          }
        }
      }
      std::vector<float> scores(sel.size());
      std::normal_distribution<float> score(0.f, 2.f);
      for (auto& s : scores) { s = score(rng_); }
      std::vector<std::byte> tails(std::size_t(c_.max_batch) * c_.max_queries * group_row_bytes_[g]);
      for (std::size_t b = 0; b < batch.size(); ++b) {
        for (int j = 0; j < queries[b]; ++j) {
          group_row(batch[b], g, live_[batch[b]].length + j, version,
                    tails.data() + (b * c_.max_queries + j) * group_row_bytes_[g]);
        }
      }
      in.selections.push_back(std::move(sel));
      in.scores.push_back(std::move(scores));
      in.tail_rows.push_back(std::move(tails));
    }

    std::vector<group_view> const views = b_.layers(in);
    std::vector<std::vector<char>> has_tail(batch.size(), std::vector<char>(std::size_t(c_.max_queries), 1));
    for (int g = 0; g < c_.num_groups(); ++g) { check_group(g, views[g], in, invalid[g], batch, queries, has_tail); }

    // Accepted lengths: the first drafts survive more often than the last; sometimes plain
    // decoding (accepted = null keeps every query's row), sometimes an invalid count.
    bool const plain = spec.plain || (spec.accepted.empty() && chance(0.1));
    std::vector<std::int32_t> accepted(std::size_t(c_.max_batch), 0);
    std::vector<std::int32_t> keep(batch.size(), 0);
    for (std::size_t b = 0; b < batch.size(); ++b) {
      std::int32_t a = 1;
      while (a < queries[b] && chance(0.7)) { ++a; }
      if (chance(0.1)) { a = uniform(0, queries[b]); }
      if (!spec.accepted.empty()) { a = spec.accepted[b]; }
      accepted[b] = a;
      keep[b]     = plain ? queries[b] : a >= 0 && a <= queries[b] ? a : 0;
      if (!spec.accepted.empty() && keep[b] != a && !plain) {
        expected_status |= status_invalid_accept_count;
        ++report_.flagged_entries;
      }
      if (!plain && spec.bad_entries && chance(o_.p_bad_accepted)) {
        accepted[b] = chance(0.5) ? -uniform(1, 5) : queries[b] + uniform(1, 5);
        keep[b]     = 0;
        expected_status |= status_invalid_accept_count;
        ++report_.flagged_entries;
      }
      for (std::int32_t j = 0; j < keep[b]; ++j) {
        if (!has_tail[b][std::size_t(j)]) {
          violation("request " + std::to_string(batch[b]) + ": kept query " + std::to_string(j) +
                    " has no tail row in some group");
        }
      }
    }
    b_.commit(plain ? nullptr : &accepted);
    ++since_backup_;
    if (spec.backup == 1 || (spec.backup < 0 && (since_backup_ >= c_.backup_interval_steps || chance(0.3)))) {
      b_.backup();
      ++report_.backups;
      since_backup_ = 0;
    }
    std::uint32_t const status = b_.status();
    if (status != expected_status) {
      violation("status word " + describe_status(status) + ", expected " + describe_status(expected_status));
    }
    b_.clear_status();
    for (std::size_t b = 0; b < batch.size(); ++b) {
      request& r = live_[batch[b]];
      for (std::int32_t j = 0; j < keep[b]; ++j) { r.version.push_back(version); }
      r.length += keep[b];
      report_.committed_rows += keep[b];
      report_.rejected_rows += queries[b] - keep[b];
    }
    check_accounting("step");
    if (Backend::shows_slots) { check_resident(views); }
  }

  /// Shuffles, repeats and punches holes into a query's sorted selection, sometimes.
  void restyle(std::int32_t* row, int top_k)
  {
    int n = 0;
    while (n < top_k && row[n] >= 0) { ++n; }
    if (n > 1 && chance(0.3)) {
      for (int i = 0; i < 3; ++i) { row[uniform(0, n - 1)] = row[uniform(0, n - 1)]; }
    }
    if (n > 0 && chance(0.3)) {
      for (int i = 0; i < 3; ++i) { row[uniform(0, n - 1)] = -1; }
    }
    if (chance(0.5)) { std::shuffle(row, row + top_k, rng_); }
  }

  /// The slot table and tail slots of group g after the step's layers (see the file comment).
  void check_group(int g, group_view const& v, layer_inputs const& in, std::vector<char> const& invalid,
                   std::vector<std::uint64_t> const& batch, std::vector<std::int32_t> const& queries,
                   std::vector<std::vector<char>>& has_tail)
  {
    std::string const at  = "group " + std::to_string(g) + ": ";
    std::size_t const grb = group_row_bytes_[g];
    std::int64_t const limit = b_.pool_limit(g);
    std::size_t const per_b  = std::size_t(c_.max_queries) * in.top_k;
    std::map<std::int32_t, std::pair<std::size_t, std::int32_t>> served;  // slot → (batch entry, position)
    std::vector<std::byte> want(grb);
    auto const claim = [&](std::int32_t s, std::size_t b, std::int32_t pos, char const* what) {
      if (s < 0 || s >= limit || s >= v.num_slots) {
        violation(at + what + " slot " + std::to_string(s) + " outside [0, pool limit " + std::to_string(limit) + ")");
        return false;
      }
      auto const [it, fresh] = served.emplace(s, std::make_pair(b, pos));
      if (!fresh && it->second != std::make_pair(b, pos)) {
        violation(at + "slot " + std::to_string(s) + " serves request " + std::to_string(batch[it->second.first]) +
                  " position " + std::to_string(it->second.second) + " and request " + std::to_string(batch[b]) +
                  " position " + std::to_string(pos));
        return false;
      }
      if (!v.owner.empty()) {
        int const index = b_.request_index(request_id{batch[b]});
        if (v.owner[std::size_t(s)] != index) {
          violation(at + "slot " + std::to_string(s) + " handed to request " + std::to_string(batch[b]) +
                    " is owned by request index " + std::to_string(v.owner[std::size_t(s)]));
          return false;
        }
        if (v.position[std::size_t(s)] != pos) {
          violation(at + "slot " + std::to_string(s) + " records position " +
                    std::to_string(v.position[std::size_t(s)]) + ", serves " + std::to_string(pos));
          return false;
        }
      }
      return fresh;
    };
    for (std::size_t b = 0; b < batch.size(); ++b) {
      request const& r = live_[batch[b]];
      for (int j = 0; j < queries[b]; ++j) {
        std::int32_t const s = v.tail_slots[b * c_.max_queries + std::size_t(j)];
        if (s < 0) {
          has_tail[b][std::size_t(j)] = 0;
          continue;
        }
        if (!claim(s, b, r.length + j, "tail")) { continue; }
        std::byte const* tail = in.tail_rows[std::size_t(g)].data() + (b * c_.max_queries + j) * grb;
        ++report_.rows_checked;
        if (std::memcmp(v.slab + std::size_t(s) * v.row_bytes, tail, grb) != 0) {
          violation(at + "tail slot " + std::to_string(s) + " of request " + std::to_string(batch[b]) +
                    " does not hold the row the model wrote");
        }
      }
      for (int q = 0; q < c_.max_queries; ++q) {
        for (int k = 0; k < in.top_k; ++k) {
          std::size_t const i    = b * per_b + std::size_t(q) * in.top_k + std::size_t(k);
          std::int32_t const pos = in.selections[std::size_t(g)][i];
          std::int32_t const s   = v.slot_table[i];
          if (q >= queries[b] || pos == -1 || invalid[i]) {
            if (s != -1) {
              violation(at + "entry " + std::to_string(i) + " (" + (invalid[i] ? "invalid" : "empty") +
                        ", position " + std::to_string(pos) + ") has slot " + std::to_string(s));
            }
            continue;
          }
          if (pos >= r.length) {  // this step's own tail row
            std::int32_t const tail = v.tail_slots[b * c_.max_queries + std::size_t(pos - r.length)];
            if (s != tail) {
              violation(at + "request " + std::to_string(batch[b]) + " query " + std::to_string(q) +
                        " selects its tail position " + std::to_string(pos) + ": slot " + std::to_string(s) +
                        ", tail slot " + std::to_string(tail));
            }
            continue;
          }
          if (s < 0) {
            violation(at + "request " + std::to_string(batch[b]) + " position " + std::to_string(pos) +
                      " selected but not served");
            continue;
          }
          if (!claim(s, b, pos, "slot table")) { continue; }
          group_row(batch[b], g, pos, r.version[std::size_t(pos)], want.data());
          ++report_.rows_checked;
          if (std::memcmp(v.slab + std::size_t(s) * v.row_bytes, want.data(), grb) != 0) {
            violation(at + "slot " + std::to_string(s) + " served to request " + std::to_string(batch[b]) +
                      " for position " + std::to_string(pos) + " does not hold its committed row (version " +
                      std::to_string(r.version[std::size_t(pos)]) + ")");
          }
        }
      }
    }
  }

  /// Backends that show owners and positions: every resident committed row is exact.
  void check_resident(std::vector<group_view> const& views)
  {
    std::map<int, std::uint64_t> id_of;
    for (auto const& [id, r] : live_) { id_of[b_.request_index(rid(id))] = id; }
    for (int g = 0; g < c_.num_groups(); ++g) {
      group_view const& v = views[std::size_t(g)];
      std::vector<std::byte> want(group_row_bytes_[g]);
      for (std::int32_t s = 0; s < v.num_slots; ++s) {
        if (v.owner[std::size_t(s)] < 0 || v.position[std::size_t(s)] < 0) { continue; }
        auto const it = id_of.find(v.owner[std::size_t(s)]);
        if (it == id_of.end()) {
          violation("group " + std::to_string(g) + ": slot " + std::to_string(s) + " owned by request index " +
                    std::to_string(v.owner[std::size_t(s)]) + ", which is not admitted");
          continue;
        }
        request const& r = live_[it->second];
        std::int32_t const p = v.position[std::size_t(s)];
        if (p >= r.length) { continue; }  // a rejected tail slot kept for reuse
        group_row(it->second, g, p, r.version[std::size_t(p)], want.data());
        ++report_.rows_checked;
        if (std::memcmp(v.slab + std::size_t(s) * v.row_bytes, want.data(), want.size()) != 0) {
          violation("group " + std::to_string(g) + ": resident slot " + std::to_string(s) + " of request " +
                    std::to_string(it->second) + " position " + std::to_string(p) + " does not hold its row");
        }
      }
    }
  }

  void check_accounting(char const* after)
  {
    for (int g = 0; g < c_.num_groups(); ++g) {
      accounting const a = b_.slots(g);
      std::string const at = std::string("after ") + after + ", group " + std::to_string(g) + ": ";
      if (!a.problem.empty()) { violation(at + a.problem); }
      if (a.owned + a.free != a.limit) {
        violation(at + "owned " + std::to_string(a.owned) + " + free " + std::to_string(a.free) +
                  " slots != pool limit " + std::to_string(a.limit));
      }
      if (a.limit != b_.pool_limit(g)) { violation(at + "the pool's limit differs from pool_limit()"); }
      if (b_.floor_sum() > a.limit) { violation(at + "the floors exceed the pool limit"); }
    }
    if (b_.num_requests() != live_.size()) {
      violation(std::string("after ") + after + ": " + std::to_string(b_.num_requests()) + " requests admitted, " +
                std::to_string(live_.size()) + " expected");
    }
  }

  /// Every committed row of `id` in the host store equals the truth (after a backup).
  void check_host_rows(std::uint64_t id)
  {
    b_.backup();
    ++report_.backups;
    since_backup_ = 0;
    b_.sync();
    request const& r = live_[id];
    std::vector<std::byte> want(Backend::row_bytes);
    for (int g = 0; g < c_.num_groups(); ++g) {
      for (int l = 0; l < c_.group_layers[g]; ++l) {
        for (std::int32_t p = 0; p < r.length; ++p) {
          row_bytes(salt_, id, g, l, p, r.version[std::size_t(p)], want.data(), want.size());
          ++report_.rows_checked;
          ++report_.host_rows_checked;
          if (std::memcmp(b_.host_row(rid(id), g, l, p), want.data(), want.size()) != 0) {
            violation("host store: request " + std::to_string(id) + " group " + std::to_string(g) + " layer " +
                      std::to_string(l) + " position " + std::to_string(p) + " (version " +
                      std::to_string(r.version[std::size_t(p)]) + ") differs from the truth");
            return;
          }
        }
      }
    }
  }

  void final_check()
  {
    for (auto const& [id, r] : live_) { check_host_rows(id); }
    check_accounting("the end");
  }

  Backend& b_;
  options o_;
  hierarchy_config const& c_;
  std::mt19937_64 rng_;
  std::uint64_t salt_;
  std::vector<std::size_t> group_row_bytes_;
  std::map<std::uint64_t, request> live_;
  std::uint64_t next_id_ = 1;
  std::int64_t step_     = 0;
  int since_backup_      = 0;
  bool has_batch_        = false;
  report report_;
};

/// Steps from `DHISPARSE_SOAK_STEPS`, else `fallback`.
inline std::int64_t steps_from_env(std::int64_t fallback)
{
  char const* env = std::getenv("DHISPARSE_SOAK_STEPS");
  return env != nullptr ? std::max<std::int64_t>(1, std::strtoll(env, nullptr, 10)) : fallback;
}

}  // namespace dhisparse::test::soak
