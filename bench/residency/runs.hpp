/**
 * @file bench/residency/runs.hpp
 * @brief One run of the residency benchmark on the GPU or on the host reference, with the
 *        budget policy chosen at run time (one translation unit per budget on the GPU).
 */
#pragma once

#include <sim/simulator.hpp>

#include <cstdint>
#include <vector>

namespace dhisparse::bench::residency {

/// The hierarchy after one step: what the load-ramp plot shows.
struct step_sample {
  std::uint64_t step;
  int live;                    ///< admitted requests
  std::int64_t owned_slots;    ///< slots owned by requests (group 0)
  unsigned long long fetched;  ///< rows fetched since the start (group 0)
  unsigned long long reclaimed;
};

/// `sim::simulate`'s observer: appends a `step_sample` after every step (when `out` is set).
struct step_recorder {
  std::vector<step_sample>* out = nullptr;
  template <class H>
  void operator()(H const& h, std::uint64_t step) const
  {
    if (out == nullptr) { return; }
    group_counters const c = h.counters(0);
    out->push_back({step, int(h.num_requests()), h.owned_slots(0), c.fetched_rows, c.reclaimed_rows});
  }
};

/// A run on the GPU's `kv_hierarchy` (656-byte rows, `resolve_and_retrieve`).
sim::run_result run_gpu(sim::workload& w, sim::request_plan const& plan, sim::eviction e, sim::budget b,
                        sim::run_config const& rc, std::vector<step_sample>* series);
sim::run_result run_gpu_static(sim::workload& w, sim::request_plan const& plan, sim::eviction e,
                               sim::run_config const& rc, std::vector<step_sample>* series);
sim::run_result run_gpu_global(sim::workload& w, sim::request_plan const& plan, sim::eviction e,
                               sim::run_config const& rc, std::vector<step_sample>* series);
sim::run_result run_gpu_fair_share(sim::workload& w, sim::request_plan const& plan, sim::eviction e,
                                   sim::run_config const& rc, std::vector<step_sample>* series);

/// The same run on the host reference (`dhisparse-sim`'s path).
inline sim::run_result run_host(sim::workload& w, sim::request_plan const& plan, sim::eviction e, sim::budget b,
                                sim::run_config const& rc, std::vector<step_sample>* series)
{
  return sim::simulate(w, plan, e, b, rc, step_recorder{series});
}

inline sim::run_result run_gpu(sim::workload& w, sim::request_plan const& plan, sim::eviction e, sim::budget b,
                               sim::run_config const& rc, std::vector<step_sample>* series)
{
  switch (b) {
    case sim::budget::static_slots: return run_gpu_static(w, plan, e, rc, series);
    case sim::budget::global: return run_gpu_global(w, plan, e, rc, series);
    case sim::budget::fair_share: return run_gpu_fair_share(w, plan, e, rc, series);
  }
  throw error("bench_residency: unknown budget");
}

}  // namespace dhisparse::bench::residency
