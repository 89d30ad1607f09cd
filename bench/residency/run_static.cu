// run_gpu_static: the residency benchmark's GPU runs with budget sim::static_slots_budget.
#include "run_budget.cuh"

namespace dhisparse::bench::residency {
sim::run_result run_gpu_static(sim::workload& w, sim::request_plan const& plan, sim::eviction e,
                                 sim::run_config const& rc, std::vector<step_sample>* series)
{
  return run_gpu_budget<sim::static_slots_budget>(w, plan, e, rc, series);
}
}  // namespace dhisparse::bench::residency
