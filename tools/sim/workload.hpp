/**
 * @file tools/sim/workload.hpp
 * @brief What `dhisparse-sim` replays: a sequence of steps in the trace format's records
 *        (`trace::step_record`), either a recorded trace file or the standard drift
 *        workload generated in memory, and the request plan derived from it (plain C++).
 *
 * A workload is replayed many times (once per policy, budget, pool size and concurrency),
 * so both sources are rewindable: the drift workload is generated once and kept in
 * memory (4 bytes per entry, 8 with scores: B × Q × K entries per step); a trace file is
 * streamed through `trace::reader` again on every pass.
 */
#pragma once

#include <common/drift.hpp>

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/trace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dhisparse::sim {

/**
 * @brief A rewindable sequence of steps. Each step is a trace record: the requests of the
 *        batch and, per group, their selections [groups][count][max_queries][top_k].
 */
class workload {
 public:
  virtual ~workload() = default;
  /// @brief Shapes of every step (as in a trace header).
  [[nodiscard]] virtual trace::shape const& shape() const = 0;
  /// @brief Goes back to the first step.
  virtual void rewind() = 0;
  /// @brief The next step, valid until the next call; nullptr after the last one.
  virtual trace::step_record const* next() = 0;
  /// @brief What this workload is, for reports ("drift", "trace").
  [[nodiscard]] virtual std::string scenario() const = 0;
};

/// Steps held in memory (a generated workload, or a small trace loaded whole).
class memory_workload : public workload {
 public:
  memory_workload(trace::shape s, std::vector<trace::step_record> steps, std::string scenario)
    : shape_{s}, steps_{std::move(steps)}, scenario_{std::move(scenario)}
  {
    shape_.validate();
  }
  [[nodiscard]] trace::shape const& shape() const override { return shape_; }
  void rewind() override { next_ = 0; }
  trace::step_record const* next() override { return next_ < steps_.size() ? &steps_[next_++] : nullptr; }
  [[nodiscard]] std::string scenario() const override { return scenario_; }
  /// @brief Every step.
  [[nodiscard]] std::vector<trace::step_record> const& steps() const noexcept { return steps_; }

 private:
  trace::shape shape_;
  std::vector<trace::step_record> steps_;
  std::string scenario_;
  std::size_t next_ = 0;
};

/// The trace shape of the drift workload of `c`: one group, its requests, queries and K.
inline trace::shape drift_shape(bench::drift_config const& c, bool scores, bool accepted)
{
  trace::shape s;
  s.groups       = 1;
  s.max_requests = c.requests;
  s.max_queries  = c.queries;
  s.top_k        = c.top_k;
  s.scores       = scores;
  s.accepted     = accepted;
  return s;
}

/**
 * @brief `steps` steps of the drift workload (bench/common/drift.hpp) with the requests of
 *        `c`: request b has id b + 1. With `scores`, each entry carries its q·k (the
 *        scores `policy::score_ema` needs).
 * @param accept with Q > 1 (verify steps): the probability that each draft token is
 *        accepted; a request keeps its first query's token and then drafts up to the first
 *        rejection (seeded by `c.seed`). 1: every query is committed and the records carry
 *        no accepted counts.
 */
inline memory_workload make_drift_workload(bench::drift_config const& c, int steps, bool scores, double accept = 1.0)
{
  DHISPARSE_EXPECTS(accept >= 0.0 && accept <= 1.0, "make_drift_workload: accept must be a probability");
  bench::drift_generator gen(c);
  bench::drift_random coin(c.seed, ~std::uint64_t{0});  // a stream no request uses
  trace::shape const s = drift_shape(c, scores, accept < 1.0);
  std::size_t const entries = s.group_entries(c.requests);
  std::vector<trace::step_record> out(std::size_t(std::max(steps, 0)));
  std::vector<std::int32_t> accepted(std::size_t(c.requests));
  for (int step = 0; step < steps; ++step) {
    auto& rec = out[std::size_t(step)];
    rec.step  = std::uint64_t(step);
    for (int b = 0; b < c.requests; ++b) {
      std::int32_t a = c.queries;
      if (s.accepted) {
        for (a = 1; a < c.queries && coin.uniform() < accept; ++a) {}
      }
      accepted[std::size_t(b)] = a;
      rec.requests.push_back({request_id(std::uint64_t(b) + 1), gen.length(b), c.queries, s.accepted ? a : -1});
    }
    rec.positions.resize(entries);
    if (scores) { rec.scores.resize(entries); }
    gen.next(rec.positions.data(), scores ? rec.scores.data() : nullptr);
    gen.commit(accepted.data());
  }
  return memory_workload(s, std::move(out), "drift");
}

/// A trace file, streamed (validated by `trace::reader` on every pass).
class trace_workload : public workload {
 public:
  explicit trace_workload(std::string path) : reader_{std::move(path)} {}
  [[nodiscard]] trace::shape const& shape() const override { return reader_.shape(); }
  void rewind() override { reader_.rewind(); }
  trace::step_record const* next() override { return reader_.next(record_) ? &record_ : nullptr; }
  [[nodiscard]] std::string scenario() const override { return "trace"; }

 private:
  trace::reader reader_;
  trace::step_record record_;
};

/**
 * @brief Writes every step of `w` to the trace file `path` (rewinds `w` before and after).
 * @return steps written
 */
inline std::uint64_t write_trace(workload& w, std::string const& path)
{
  trace::writer out(path, w.shape());
  w.rewind();
  while (trace::step_record const* rec = w.next()) { out.write(rec->view()); }
  w.rewind();
  out.close();
  return out.steps();
}

/// One request of a workload: when it is live and how far it reaches.
struct request_life {
  request_id id{};
  std::uint64_t first_step = 0;  ///< the step it first appears in (admitted before it)
  std::uint64_t last_step  = 0;  ///< the step it last appears in (released after it)
  std::int64_t capacity    = 0;  ///< positions it reaches: max over its steps of length + queries
};

/**
 * @brief Which requests one run replays and the shapes its hierarchy needs: the first
 *        `concurrency` requests of the workload in order of first appearance (for the
 *        drift workload: requests 1 .. concurrency, whose selections do not depend on the
 *        other requests). A request is admitted before the first step it appears in and
 *        released after the last one.
 */
struct request_plan {
  std::vector<request_life> requests;  ///< the replayed requests, by first appearance
  std::unordered_map<std::uint64_t, int> index;  ///< request id → index in `requests`
  std::uint64_t steps       = 0;  ///< steps of the workload
  int max_live              = 0;  ///< replayed requests live at once, at most
  int max_batch             = 0;  ///< replayed requests in one step, at most
  std::int64_t max_capacity = 0;  ///< largest request capacity
  std::int64_t live_kv      = 0;  ///< peak over steps of Σ (length + queries) of its requests
  std::size_t host_pages    = 0;  ///< host store pages (64 tokens) for every replayed request

  /// @brief Index of request `id` in `requests`, -1 when it is not replayed.
  [[nodiscard]] int find(request_id id) const
  {
    auto const it = index.find(static_cast<std::uint64_t>(id));
    return it == index.end() ? -1 : it->second;
  }

  /**
   * @brief The plan of the first `concurrency` requests of `w` (all of them when
   *        `concurrency` ≤ 0). Reads `w` twice; leaves it rewound.
   */
  static request_plan of(workload& w, int concurrency)
  {
    request_plan p;
    w.rewind();
    for (trace::step_record const* rec; (rec = w.next()) != nullptr; ++p.steps) {
      for (auto const& r : rec->requests) {
        int i = p.find(r.id);
        if (i < 0) {
          if (concurrency > 0 && int(p.requests.size()) >= concurrency) { continue; }
          i = int(p.requests.size());
          p.index.emplace(static_cast<std::uint64_t>(r.id), i);
          p.requests.push_back({r.id, p.steps, p.steps, 0});
        }
        p.requests[i].last_step = p.steps;
        p.requests[i].capacity  = std::max<std::int64_t>(p.requests[i].capacity, std::int64_t(r.length) + r.queries);
      }
    }
    w.rewind();
    std::vector<int> starts(p.steps + 1, 0), ends(p.steps + 1, 0);
    for (auto const& r : p.requests) {
      ++starts[r.first_step];
      ++ends[r.last_step];
      p.max_capacity = std::max(p.max_capacity, r.capacity);
      p.host_pages += std::size_t((r.capacity + 63) / 64);
    }
    int live = 0;
    std::uint64_t step = 0;
    for (trace::step_record const* rec; (rec = w.next()) != nullptr; ++step) {
      live += starts[step];
      p.max_live = std::max(p.max_live, live);
      live -= ends[step];
      int batch        = 0;
      std::int64_t kv  = 0;
      for (auto const& r : rec->requests) {
        if (p.find(r.id) < 0) { continue; }
        ++batch;
        kv += std::int64_t(r.length) + r.queries;
      }
      p.max_batch = std::max(p.max_batch, batch);
      p.live_kv   = std::max(p.live_kv, kv);
    }
    w.rewind();
    DHISPARSE_EXPECTS(!p.requests.empty(), "dhisparse-sim: the workload has no requests");
    return p;
  }
};

}  // namespace dhisparse::sim
