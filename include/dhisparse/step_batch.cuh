/**
 * @file step_batch.cuh
 * @brief The batch of one step as the kernels see it: fixed-shape arrays in device memory
 *        whose real size also lives in device memory, so that a captured step replays
 *        with new batches.
 */
#pragma once

#include <cstdint>
#include <type_traits>

namespace dhisparse {

/**
 * @brief Device view of a step's batch and of the per-request state the step kernels read
 *        (lengths, capacities, budget floors and caps). Entries b ≥ *size are padding and
 *        ignored.
 */
struct step_batch_ref {
  std::int32_t const* size;      ///< scalar: requests in this step, ≤ max_batch
  std::int32_t const* requests;  ///< [max_batch] request index of batch entry b
  std::int32_t const* queries;   ///< [max_batch] queries (= tail rows) of entry b, ≤ max_queries
  std::int32_t* lengths;         ///< [max_requests] committed positions of each request
  std::int32_t const* capacities;  ///< [max_requests] positions backed by storage (`reserve`)
  std::int32_t const* floors;   ///< [max_requests] slots per group the budget guarantees
  std::int32_t const* caps;     ///< [max_requests] slots per group a request may own
  std::int32_t max_batch;
  std::int32_t max_queries;
};
static_assert(std::is_trivially_copyable_v<step_batch_ref>);

}  // namespace dhisparse
