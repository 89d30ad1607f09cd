// run_gpu_global: the residency benchmark's GPU runs with budget policy::adaptive_budget<reclaim_order::global>.
#include "run_budget.cuh"

namespace dhisparse::bench::residency {
sim::run_result run_gpu_global(sim::workload& w, sim::request_plan const& plan, sim::eviction e,
                                 sim::run_config const& rc, std::vector<step_sample>* series)
{
  return run_gpu_budget<policy::adaptive_budget<reclaim_order::global>>(w, plan, e, rc, series);
}
}  // namespace dhisparse::bench::residency
