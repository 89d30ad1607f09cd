/**
 * @file soak_config.hpp
 * @brief The configuration of the soak runs (tests/soak), shared by the host and GPU runs.
 */
#pragma once

#include <dhisparse/hierarchy_config.hpp>

namespace dhisparse::test::soak {

/**
 * Two layer groups (1 and 2 layers), up to 10 requests, batches of up to 6 with up to 4
 * queries (1 + 3 drafts), K = 32, contexts to 1536. The pool holds the floors of about 13
 * adaptive requests (floor = min(capacity, Q·K) + Q·(backup interval + 2) = 152) and 8 of
 * static_budget<256>; the host store holds about 6.7 full contexts, so admissions are
 * refused for the floors, for the host store and for max_requests, and pool-limit swings
 * reclaim all the way down to the floors.
 */
inline hierarchy_config config()
{
  hierarchy_config c;
  c.group_layers           = {1, 2};
  c.max_requests           = 10;
  c.max_batch              = 6;
  c.max_queries            = 4;
  c.max_top_k              = 32;
  c.max_context            = 1536;
  c.device_slots_per_group = 2048;
  c.map_page_positions     = 256;
  c.backup_interval_steps  = 4;
  c.reclaim_low_watermark  = 8;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = 640;
  return c;
}

}  // namespace dhisparse::test::soak
