/**
 * @file bench/serving/run_resident.cu
 * @brief The serving benchmark's runs with `policy::resident_budget` (one translation unit per budget, so
 *        that the hierarchy's kernels of each budget compile once and in parallel).
 */
#include "runner.cuh"

DHISPARSE_INSTANTIATE_KV_HIERARCHY(dhisparse::row_format::mla_fp8_656, dhisparse::policy::lru,
                                   dhisparse::policy::resident_budget);

namespace dhisparse::bench::serving {
template run_result run_mode<policy::resident_budget>(scenario_setup const&, device_buffers&, run_config const&);
}  // namespace dhisparse::bench::serving
