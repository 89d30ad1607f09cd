/**
 * @file bench/residency/run_budget.cuh
 * @brief `run_gpu_<budget>`: included by one translation unit per budget policy, so that
 *        the hierarchy's kernels for the four eviction policies compile in parallel.
 */
#pragma once

#include "gpu_backend.cuh"
#include "runs.hpp"

#include <dhisparse/row_format.cuh>

namespace dhisparse::bench::residency {

/// Rows of one FP8 MLA layer (656 bytes), as BENCH.md's standard workload.
using gpu_rows = gpu_backend<row_format::opaque<656>>;

template <class Budget>
sim::run_result run_gpu_budget(sim::workload& w, sim::request_plan const& plan, sim::eviction e,
                               sim::run_config const& rc, std::vector<step_sample>* series)
{
  return sim::simulate_budget<Budget, gpu_rows>(w, plan, e, rc, step_recorder{series});
}

}  // namespace dhisparse::bench::residency
