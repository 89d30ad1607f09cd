/**
 * @file dhisparse.cuh
 * @brief Umbrella header: every public component of dhisparse.
 */
#pragma once

#include <dhisparse/detail/config.hpp>
#include <dhisparse/error.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/memory_resource.cuh>
#include <dhisparse/group_counters.hpp>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/clock.cuh>
#include <dhisparse/policy/lfu_decay.cuh>
#include <dhisparse/policy/score_ema.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/policy/resident_budget.cuh>
#include <dhisparse/host_store.cuh>
#include <dhisparse/shared_host_store.cuh>
#include <dhisparse/device_pool.cuh>
#include <dhisparse/residency_map.cuh>
#include <dhisparse/step_batch.cuh>
#include <dhisparse/miss_plan.cuh>
#include <dhisparse/reclaim.cuh>
#include <dhisparse/resolve.cuh>
#include <dhisparse/retrieve.cuh>
#include <dhisparse/commit.cuh>
#include <dhisparse/backup.cuh>
#include <dhisparse/hierarchy.cuh>
#include <dhisparse/sparse_attention.cuh>
#include <dhisparse/verify.cuh>
#include <dhisparse/draft_ring.cuh>
#include <dhisparse/trace.hpp>
#include <dhisparse/trace_recorder.cuh>
