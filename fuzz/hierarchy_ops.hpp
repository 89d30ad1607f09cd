/**
 * @file hierarchy_ops.hpp
 * @brief Fuzz targets `hierarchy_config` and `selections`: a configuration decoded from the
 *        input, then a `host::kv_hierarchy` driven with operations decoded from the rest,
 *        checking after every one that the library kept its promises.
 *
 * Each operation is an opcode byte followed by its arguments (`step`); arguments are
 * mostly valid, sometimes just out of range, sometimes anything. A `dhisparse::error` is
 * the expected answer to a bad argument and the driver goes on with the next operation:
 * a rejected call must leave the hierarchy as it was and usable. After every operation:
 *
 * - every slot of every group is accounted for: owned + free = the pool limit;
 * - the budget floors of the admitted requests fit every pool limit;
 * - the admitted requests are exactly those whose admission succeeded and were not
 *   released;
 * - after a resolve: every slot-table and tail entry is -1 or a slot below the pool
 *   limit, and no slot appears for two requests of the batch (no request reads
 *   another's rows).
 *
 * Inputs whose host memory would exceed `memory_cap` bytes (host-store rows, selection
 * buffers) are skipped, so that no fuzz input allocates gigabytes.
 */
#pragma once

#include "fuzz_input.hpp"

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lfu_decay.cuh>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/policy/score_ema.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace dhisparse::fuzz {

/// The row format of the fuzzed hierarchies (the smallest a row can be).
using fuzz_row = row_format::opaque<16>;

/**
 * @brief Calls `f(h)` with a `host::kv_hierarchy` of `config` and one of five policy
 *        combinations (`choice` modulo 5); the constructor may throw `dhisparse::error`.
 */
template <class F>
void with_hierarchy(int choice, hierarchy_config const& config, F&& f)
{
  switch (((choice % 5) + 5) % 5) {
    case 0: {
      host::kv_hierarchy<fuzz_row, policy::lru, policy::static_budget<64>> h(config);
      f(h);
    } break;
    case 1: {
      host::kv_hierarchy<fuzz_row, policy::clock, policy::static_budget<64>> h(config);
      f(h);
    } break;
    case 2: {
      host::kv_hierarchy<fuzz_row, policy::lfu_decay<>, policy::adaptive_budget<reclaim_order::global>> h(config);
      f(h);
    } break;
    case 3: {
      host::kv_hierarchy<fuzz_row, policy::score_ema<>, policy::adaptive_budget<reclaim_order::fair_share>> h(config);
      f(h);
    } break;
    default: {
      host::kv_hierarchy<fuzz_row, policy::lru, policy::resident_budget> h(config);
      f(h);
    } break;
  }
}

/// Host bytes a `host::kv_hierarchy` of `c` allocates when constructed (an upper bound).
inline double construction_bytes(hierarchy_config const& c)
{
  double const groups = double(c.group_layers.size());
  double const layers = double(c.total_layers());  // c is validated: at most max_total_layers
  double const slots  = double(c.device_slots_per_group);
  return slots * (layers * double(fuzz_row::bytes) + groups * 48.0) +
         groups * double(c.max_requests) * 160.0 + groups * double(c.step_entries()) * 4.0 +
         groups * double(c.max_batch) * double(c.max_queries) * 4.0 + double(c.max_requests) * 64.0;
}

/// Runs operations decoded from `in` on `h` (see the file comment).
template <class H>
class hierarchy_driver {
 public:
  hierarchy_driver(H& h, input& in, double memory_cap) : h_{h}, in_{in}, c_{h.config()}, cap_{memory_cap}
  {
    check("construction");
  }

  /// Runs up to `max_ops` operations (fewer when the input ends).
  void run(int max_ops)
  {
    for (int op = 0; op < max_ops && !in_.empty(); ++op) { step(); }
  }

 private:
  /// Decodes and runs one operation, then checks the invariants.
  void step()
  {
    static char const* const names[] = {"admit",    "release",  "reserve",       "set_batch", "resolve",
                                        "retrieve", "commit",   "backup",        "set_pool_limit",
                                        "reclaim",  "prewarm",  "prewarm_range", "host_row",  "views"};
    int const op = in_.byte() % int(sizeof names / sizeof names[0]);
    // Arguments are decoded in separate statements: the order of reads must not depend on
    // the compiler's order of evaluating function arguments (regression tests replay the
    // fuzzer's inputs with another compiler).
    try {
      switch (op) {
        case 0: admit(); break;
        case 1: release(); break;
        case 2: reserve(); break;
        case 3: set_batch(); break;
        case 4: resolve(); break;
        case 5: {
          int const g = group(), begin = in_.integer<int>(-1, 4), end = in_.integer<int>(-2, 4);
          h_.retrieve(g, begin, end);
        } break;
        case 6: commit(); break;
        case 7: h_.backup(); break;
        case 8: {
          int const g = group();
          h_.set_pool_limit(g, around(c_.device_slots_per_group));
        } break;
        case 9: {
          int const g = group();
          h_.reclaim(g, std::int32_t(around(c_.device_slots_per_group)));
        } break;
        case 10: {
          request_id const id = some_id();
          h_.prewarm(id, std::int32_t(around(longest())));
        } break;
        case 11: {
          request_id const id = some_id();
          int const g         = group();
          std::int64_t const first = around(longest()), count = around(longest());
          h_.prewarm_range(id, g, std::int32_t(first), std::int32_t(count));
        } break;
        case 12: host_row(); break;
        default: views(); break;
      }
      log(names[op], "ok");
    } catch (::dhisparse::error const& e) {  // a rejected call: the checks below still hold
      log(names[op], e.what());
    } catch (finding const&) {
      throw;
    } catch (std::exception const& e) {
      throw finding(std::string(names[op]) + ": an exception other than dhisparse::error: " + e.what());
    }
    check(names[op]);
  }

  /// Prints every operation and its outcome when `verbose()`.
  static void log(char const* op, char const* outcome)
  {
    if (verbose()) { std::fprintf(stderr, "%-14s %s\n", op, outcome); }
  }

  // ---- arguments -------------------------------------------------------------------------

  /// Mostly a small value, sometimes one next to `limit`, sometimes anything.
  std::int64_t around(std::int64_t limit)
  {
    return in_.boolean() ? in_.integer<std::int64_t>(-1, 40) : in_.integer<std::int64_t>(limit - 2, limit + 1);
  }
  int group() { return in_.integer<int>(-1, c_.num_groups()); }
  /// An admitted request's id (the i-th, when `known`) or the id i; reads the same bytes
  /// whatever is admitted.
  request_id some_id()
  {
    bool const known    = in_.boolean();
    std::uint64_t const i = in_.integer<std::uint64_t>(0, 9);
    if (!known || admitted_.empty()) { return request_id{i}; }
    auto it = admitted_.begin();
    std::advance(it, i % admitted_.size());
    return request_id{it->first};
  }
  std::int64_t longest() const
  {
    std::int64_t n = 0;
    for (auto const& [id, bytes] : admitted_) { n = std::max<std::int64_t>(n, h_.length(request_id{id})); }
    return n;
  }
  /// Host-store bytes of a request of `capacity` positions (whole pages, up to max_context).
  double store_bytes(std::int64_t capacity) const
  {
    double const positions = std::min(double(capacity) + c_.host.tokens_per_page, double(c_.max_context));
    return positions * (double(c_.total_layers()) * double(fuzz_row::bytes) + 4.0 * c_.num_groups());
  }
  bool fits(double more) const
  {
    double used = 0;
    for (auto const& [id, bytes] : admitted_) { used += bytes; }
    return used + more <= cap_;
  }

  // ---- operations ------------------------------------------------------------------------

  void admit()
  {
    request_id const id       = some_id();
    std::int32_t const length = std::int32_t(around(c_.max_context));
    std::int64_t const capacity = in_.boolean() ? -1 : around(c_.max_context);
    double const bytes = store_bytes(capacity < 0 ? std::int64_t(length) + c_.max_queries : capacity);
    if (!fits(bytes)) { return; }
    bool const before = h_.contains(id);
    try {
      h_.admit(id, length, capacity);
    } catch (::dhisparse::error const&) {
      expect(h_.contains(id) == before, "a rejected admit changed whether the request is admitted");
      throw;
    }
    expect(!before, "admit succeeded for a request that was already admitted");
    admitted_[static_cast<std::uint64_t>(id)] = bytes;
  }

  void release()
  {
    request_id const id = some_id();
    bool const known    = admitted_.count(static_cast<std::uint64_t>(id)) != 0;
    try {
      h_.release(id);
    } catch (::dhisparse::error const&) {
      expect(!known, "release of an admitted request was rejected");
      throw;
    }
    expect(known, "release succeeded for a request that was not admitted");
    admitted_.erase(static_cast<std::uint64_t>(id));
  }

  void reserve()
  {
    request_id const id         = some_id();
    std::int64_t const capacity = around(c_.max_context);
    auto const it               = admitted_.find(static_cast<std::uint64_t>(id));
    double const bytes          = store_bytes(capacity);
    if (it != admitted_.end() && !fits(bytes - it->second)) { return; }
    h_.reserve(id, capacity);
    expect(it != admitted_.end(), "reserve succeeded for a request that was not admitted");
    it->second = std::max(it->second, bytes);
  }

  void set_batch()
  {
    int const count = in_.integer<int>(-1, c_.max_batch + 1);
    if (count > 64) { return; }  // a raw count: only its sign and size matter
    buffer<request_id> ids(std::size_t(std::max(count, 0)));
    buffer<std::int32_t> queries(std::size_t(std::max(count, 0)));
    for (int b = 0; b < count; ++b) {
      ids[b]     = some_id();
      queries[b] = in_.integer<std::int32_t>(0, c_.max_queries + 1);
    }
    h_.set_batch(ids.data(), queries.data(), count);
    batch_.assign(ids.data(), ids.data() + count);
    batch_queries_.assign(queries.data(), queries.data() + count);
  }

  void resolve()
  {
    int const g     = group();
    int const top_k = in_.integer<int>(0, c_.max_top_k + 1);
    if (double(c_.max_batch) * c_.max_queries * std::max(top_k, 1) * 8.0 > cap_) { return; }
    std::size_t const entries = std::size_t(c_.max_queries) * std::size_t(std::max(top_k, 1));
    std::size_t const total   = std::size_t(c_.max_batch) * entries;
    buffer<std::int32_t> selections(total, -1);
    buffer<float> scores(total, 0.f);
    // The batch's rows: a few entries each near the request's causal limit (length + q).
    for (std::size_t b = 0; b < batch_.size() && b < std::size_t(c_.max_batch); ++b) {
      std::int64_t const length = h_.contains(batch_[b]) ? h_.length(batch_[b]) : 0;
      int const filled          = in_.byte() % 9;
      for (int i = 0; i < filled; ++i) {
        std::size_t const e = in_.integer<std::size_t>(0, entries - 1) % entries;
        std::int64_t const q = std::int64_t(e) / std::max(top_k, 1);
        selections[b * entries + e] = std::int32_t(in_.integer<std::int64_t>(-2, length + q + 1));
        scores[b * entries + e]     = in_.probability();
      }
    }
    h_.resolve(g, selections.data(), top_k, in_.boolean() ? scores.data() : nullptr);
    check_tables(g, top_k);
  }

  void commit()
  {
    buffer<std::int32_t> accepted(std::size_t(h_.batch_count()));
    for (std::size_t b = 0; b < accepted.size(); ++b) {
      accepted[b] = in_.integer<std::int32_t>(-1, c_.max_queries + 1);
    }
    bool const with_counts = in_.boolean();
    h_.commit(with_counts ? accepted.data() : nullptr);
  }

  void host_row()
  {
    request_id const id = some_id();
    int const g         = group();
    int const layer     = in_.integer<int>(-1, 4);
    std::int64_t const position = around(longest());
    std::byte* row              = h_.host_row(id, g, layer, position);
    std::memset(row, in_.byte(), fuzz_row::bytes);
  }

  /// The read-only views with a fuzzed group: a bad group must be rejected with
  /// `dhisparse::error` like everywhere else.
  void views()
  {
    int const g = group();
    int const view = in_.byte() % 7;
    switch (view) {
      case 0: static_cast<void>(h_.slot_table(g)); break;
      case 1: static_cast<void>(h_.misses(g)); break;
      case 2: static_cast<void>(h_.counters(g)); break;
      case 3: static_cast<void>(h_.resident_positions(some_id(), g)); break;
      case 4: static_cast<void>(h_.owned_slots(g) + h_.free_slots(g)); break;
      case 5: static_cast<void>(h_.pool_limit(g)); break;
      default: static_cast<void>(h_.layer_rows(g, in_.integer<int>(-1, 4))); break;
    }
  }

  // ---- checks ----------------------------------------------------------------------------

  void check(char const* after)
  {
    std::string const at = std::string("after ") + after + ": ";
    for (int g = 0; g < c_.num_groups(); ++g) {
      std::int64_t const owned = h_.owned_slots(g), free = h_.free_slots(g), limit = h_.pool_limit(g);
      expect(owned + free == limit, at + "group " + std::to_string(g) + ": owned " + std::to_string(owned) +
                                      " + free " + std::to_string(free) + " slots != pool limit " +
                                      std::to_string(limit));
      expect(h_.floor_sum() <= limit, at + "the budget floors (" + std::to_string(h_.floor_sum()) +
                                        ") exceed the pool limit of group " + std::to_string(g));
    }
    expect(h_.num_requests() == admitted_.size(), at + "the hierarchy holds " + std::to_string(h_.num_requests()) +
                                                    " requests, " + std::to_string(admitted_.size()) +
                                                    " were admitted");
    for (auto const& [id, bytes] : admitted_) {
      expect(h_.contains(request_id{id}), at + "admitted request " + std::to_string(id) + " is gone");
    }
  }

  /// Slot table and tail slots of the resolve that just ran on group `g`.
  void check_tables(int g, int top_k)
  {
    std::int64_t const limit  = h_.pool_limit(g);
    std::size_t const entries = std::size_t(c_.max_queries) * std::size_t(top_k);
    std::map<std::int32_t, int> user;  // slot → batch entry
    auto const claim = [&](std::int32_t s, int b, char const* what) {
      expect(s >= -1 && s < limit, std::string(what) + " entry " + std::to_string(s) + " of batch entry " +
                                     std::to_string(b) + " is outside [-1, pool limit " + std::to_string(limit) + ")");
      if (s < 0) { return; }
      auto const [it, fresh] = user.emplace(s, b);
      expect(fresh || it->second == b, std::string(what) + ": slot " + std::to_string(s) +
                                         " appears for batch entries " + std::to_string(it->second) + " and " +
                                         std::to_string(b));
    };
    for (int b = 0; b < h_.batch_count(); ++b) {
      for (std::size_t i = 0; i < entries; ++i) { claim(h_.slot_table(g)[b * entries + i], b, "slot table"); }
      for (int q = 0; q < c_.max_queries; ++q) { claim(h_.tail_slots(g)[b * c_.max_queries + q], b, "tail slots"); }
    }
  }

  H& h_;
  input& in_;
  hierarchy_config const& c_;
  double cap_;
  std::map<std::uint64_t, double> admitted_;  ///< id → host-store bytes (estimate)
  std::vector<request_id> batch_;            ///< the last batch set
  std::vector<std::int32_t> batch_queries_;  ///< its queries
};

/// Constructs a hierarchy of `config` (policies chosen by `choice`) when it fits
/// `memory_cap`, then runs up to `max_ops` operations decoded from `in` on it.
inline void drive_hierarchy(int choice, hierarchy_config const& config, input& in, double memory_cap, int max_ops)
{
  detail::validate(config);  // before estimating: the estimate assumes a valid configuration
  if (construction_bytes(config) > memory_cap) { return; }
  with_hierarchy(choice, config, [&](auto& h) {
    hierarchy_driver<std::decay_t<decltype(h)>>(h, in, memory_cap).run(max_ops);
  });
}

/**
 * @brief A configuration decoded from `in`: small and valid (`wide` false), or with every
 *        field also just outside its valid range (`wide` true); through the raw form of
 *        `input::integer` any field can take any value either way.
 */
inline hierarchy_config decode_config(input& in, bool wide)
{
  std::int64_t const slack = wide ? 2 : 0;
  auto const field = [&](std::int64_t lo, std::int64_t hi) { return in.integer<std::int64_t>(lo - slack, hi + slack); };
  auto const power_of_two = [&](unsigned max_log) {
    return wide && in.boolean() ? field(0, std::int64_t{1} << max_log)
                                : std::int64_t{1} << (in.integer<unsigned>(0, max_log) % (max_log + 1));
  };
  hierarchy_config c;
  c.group_layers.resize(std::size_t(std::clamp<std::int64_t>(field(1, 3), 0, 8)));
  for (auto& layers : c.group_layers) { layers = int(field(1, 2)); }
  c.max_requests           = int(field(1, 6));
  c.max_batch              = int(field(1, std::max(1, c.max_requests)));
  c.max_queries            = int(field(1, 3));
  c.max_top_k              = int(field(1, 8));
  c.max_context            = int(field(1, 256));
  c.device_slots_per_group = field(1, 512);
  c.map_page_positions     = int(power_of_two(10));
  c.host.tokens_per_page   = int(power_of_two(5));
  c.host.capacity_pages    = std::size_t(field(1, 512));
  c.backup_interval_steps  = int(field(1, 4));
  c.reclaim_low_watermark  = int(field(0, 8));
  c.reclaim_batch          = field(-1, 8);
  if (wide) { c.slab_memory.resize(std::size_t(std::clamp<std::int64_t>(field(0, c.num_groups()), 0, 8)), nullptr); }
  return c;
}

/**
 * @brief Target `hierarchy_config`: configurations at and beyond their limits through
 *        `detail::validate` and the constructor of `host::kv_hierarchy` (five policy
 *        combinations), then a few operations on what was built (64 MiB at most).
 */
inline void hierarchy_config_target(std::uint8_t const* data, std::size_t size)
{
  input in(data, size);
  hierarchy_config const c = decode_config(in, true);
  int const choice         = in.byte();
  drive_hierarchy(choice, c, in, 64.0 * (1 << 20), 24);
}

/**
 * @brief Target `selections`: a small valid hierarchy driven through long sequences of
 *        admissions, batches, selections, accepted counts, backups and pool changes
 *        (16 MiB at most).
 */
inline void selections_target(std::uint8_t const* data, std::size_t size)
{
  input in(data, size);
  hierarchy_config const c = decode_config(in, false);
  int const choice         = in.byte();
  drive_hierarchy(choice, c, in, 16.0 * (1 << 20), 128);
}

}  // namespace dhisparse::fuzz
