/**
 * @file bench/serving/run_hisparse.cu
 * @brief The serving benchmark's runs with `policy::static_budget<4096>` (one translation unit per budget, so
 *        that the hierarchy's kernels of each budget compile once and in parallel).
 */
#include "runner.cuh"

DHISPARSE_INSTANTIATE_KV_HIERARCHY(dhisparse::row_format::mla_fp8_656, dhisparse::policy::lru,
                                   dhisparse::policy::static_budget<4096>);

namespace dhisparse::bench::serving {
template run_result run_mode<policy::static_budget<4096>>(scenario_setup const&, device_buffers&, run_config const&);
}  // namespace dhisparse::bench::serving
