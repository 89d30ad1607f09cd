/**
 * @file bench/serving/workload.hpp
 * @brief Selection templates: per request template and layer group, the top-K selection of
 *        the query at every position the run will reach — from the drift workload
 *        (bench/common/drift_gpu.cuh, the standard workload of BENCH.md) or from a recorded
 *        trace (include/dhisparse/trace.hpp).
 *
 * Why templates: selections are a property of positions, not of steps. A template row t is
 * the selection of the query at position start + t, so a verify step of Q queries at
 * positions n … n + Q − 1 reads rows n − start … n + Q − 1 − start, and after accepting a
 * drafts the next step continues at n + a + 1 — speculative and plain decoding see the same
 * selection for the same position, whatever was accepted. Rows are generated once before
 * the timed loop (the generator's O(N) per step sort is not part of what we measure; the
 * indexer stand-in is), and a kernel gathers each step's rows from device memory, so the
 * whole step is a CUDA graph.
 */
#pragma once

#include <dhisparse/detail/device_memory.cuh>

#include <cstdint>
#include <string>
#include <vector>

namespace dhisparse::bench::serving {

struct selection_templates {
  int count          = 0;  ///< R templates (request b uses template b % R)
  int groups         = 1;  ///< layer groups with their own rows (group g uses g % groups)
  int top_k          = 0;
  std::int64_t tokens = 0; ///< rows per (template, group)
  std::vector<std::int32_t> start;                  ///< [R] position of row 0
  dhisparse::detail::device_array<std::int32_t> rows;       ///< [R][groups][tokens][top_k]
  dhisparse::detail::device_array<std::int32_t> start_dev;  ///< [R]
  std::string source;      ///< what the rows come from, for the report
  double build_s = 0.0;    ///< seconds spent building them
};

/**
 * @brief R × groups independent drift-workload requests (standard parameters, seeds
 *        derived from `seed`), each stepped `tokens` times with Q = 1 on the GPU, built in
 *        parallel host threads.
 */
selection_templates make_drift_templates(int count, int groups, std::int32_t context, int top_k, std::int64_t tokens,
                                         std::uint64_t seed);

/**
 * @brief Templates from a recorded trace: the first `max_templates` request ids, each from
 *        its first recorded length, every group of the trace; a position's row is the
 *        selection of the query recorded there (the latest one if several steps recorded it).
 * @throws dhisparse::error when some template covers fewer than `tokens_needed` positions
 */
selection_templates load_trace_templates(std::string const& path, int max_templates, std::int64_t tokens_needed);

}  // namespace dhisparse::bench::serving
