/**
 * @file policy/concepts.hpp
 * @brief The contracts of eviction and budget policies, in one place, with the traits that
 *        check them and the essential-floor rule (plain C++: the host reference and the
 *        CUDA kernels include the same hooks).
 *
 * ## Eviction policy
 * A struct of `static` `DHISPARSE_HOST_DEVICE` hooks over a 64-bit per-slot state. Derive
 * from `eviction_defaults` and override what differs (a policy stays ~10 lines):
 * - `policy_state on_insert(selection_context)`: state of a row just brought in (a miss,
 *   a tail row of this step, or a prewarmed row);
 * - `policy_state on_hit(policy_state, selection_context)`: state after the row was
 *   selected again; called once per row and step, whatever the number of queries that
 *   selected it;
 * - `std::uint64_t eviction_key(policy_state, std::int32_t position)`: priority, the
 *   smallest key is evicted first; ties are broken by the lower position (and, across
 *   requests, by the lower request index). A key must depend only on the state and the
 *   position — not on the current epoch — so that it changes only when the row is selected
 *   or inserted (time-based policies make keys comparable across time instead, as LRU's
 *   "epoch of last use" is);
 * - `static constexpr bool needs_scores`: resolve must be given per-selection scores
 *   (`selection_context::score`); the hierarchy refuses a resolve without them;
 * - `static constexpr bool counts_selections`: the hooks read
 *   `selection_context::selections` and `score` (aggregated over the queries of a step);
 *   off, they see `selections = 1` and `score = 0`, and resolve skips the aggregation;
 * - `static constexpr victim_search search`: `smallest_key` (the default: victims are the
 *   smallest keys) or `sweep` (CLOCK: a hand walks the request's slots in order, clearing
 *   `referenced` rows with `clear_reference`, evicting the first unreferenced ones; needs
 *   the hooks `bool referenced(policy_state)` and `policy_state clear_reference(policy_state)`).
 *   A sweep applies to per-request eviction (`static_budget`); global reclaim always orders
 *   rows by `eviction_key`.
 * Rows selected in the current step (pinned) and rows not yet backed up (dirty) are never
 * evicted, whatever their key. The host reference and the GPU evaluate the same hooks, so
 * they must be exact (integer arithmetic, or IEEE `+ - * /` without contraction).
 *
 * ## Budget policy
 * A struct saying how many device slots each request is guaranteed (its *floor*) and may
 * hold (its *cap*) in every layer group:
 * - `static constexpr budget_kind kind`: `per_request` (a request at its cap evicts its own
 *   rows: HiSparse's hot buffer) or `shared` (no cap: rows stay while the pool has free
 *   slots; when it runs short a global reclaim releases clean optional rows);
 * - `static std::int64_t floor(budget_inputs)` and `static std::int64_t cap(budget_inputs)`:
 *   evaluated on the host at admission and `reserve`; the hierarchy keeps them in device
 *   memory. Admission refuses a request (changing nothing) when the floors of all admitted
 *   requests would exceed a group's pool limit; every floor must cover the essential set
 *   (`essential_floor`), so a step never lacks a slot that a floor promised;
 * - `static constexpr reclaim_order reclaim` (shared budgets): which optional rows a
 *   global reclaim releases first.
 */
#pragma once

#include <dhisparse/detail/config.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace dhisparse {

/// 64-bit state an eviction policy keeps per slot.
using policy_state = std::uint64_t;

/// What the eviction hooks know about one selected or inserted row in one step.
struct selection_context {
  std::uint32_t epoch;       ///< step counter of the layer group, from 1
  std::int32_t position;     ///< the row's position
  float score;               ///< highest score among the entries that selected it (0: none)
  std::uint32_t selections;  ///< entries (queries) that selected it this step
};

/// How victims are found for per-request eviction.
enum class victim_search { smallest_key, sweep };

/// Whether a request evicts its own rows at a cap, or the pool is shared with a reclaim.
enum class budget_kind { per_request, shared };

/// Which optional rows a global reclaim releases first.
enum class reclaim_order {
  global,      ///< the smallest eviction keys over all requests
  fair_share,  ///< from the requests furthest above their floor, each in its own key order
  none,        ///< the budget never reclaims (every row it admits fits)
};

/// Inputs of a budget policy's floor and cap for one request.
struct budget_inputs {
  std::int64_t capacity;      ///< positions backed by storage for the request
  int max_queries;            ///< Qmax
  int max_top_k;              ///< K
  int backup_interval_steps;  ///< steps between two backups
};

/**
 * @brief The essential set of one request in one group, worst case: one step's union of
 *        selections (Qmax × K, or every position it has), its Qmax tail rows, the rows
 *        committed since the last backup (Qmax per step), and up to Qmax rejected tail
 *        slots kept for reuse.
 *
 * Computed in 64 bits throughout: every term is at most 2^31 × 2^31, so any `int` inputs
 * give a correct (non-negative for non-negative inputs) floor.
 */
DHISPARSE_HOST_DEVICE constexpr std::int64_t essential_floor(budget_inputs in) noexcept
{
  std::int64_t const selections = std::int64_t(in.max_queries) * in.max_top_k;
  return (in.capacity < selections ? in.capacity : selections) +
         std::int64_t(in.max_queries) * (std::int64_t(in.backup_interval_steps) + 2);
}

/// A cap that never binds.
inline constexpr std::int64_t unlimited_slots = std::numeric_limits<std::int32_t>::max();

namespace policy {

/**
 * @brief Default hooks (LRU): state = epoch of last use, key = state. Derive from it and
 *        override what differs.
 */
struct eviction_defaults {
  static constexpr bool needs_scores        = false;
  static constexpr bool counts_selections   = false;
  static constexpr victim_search search     = victim_search::smallest_key;

  DHISPARSE_HOST_DEVICE static constexpr policy_state on_insert(selection_context c) noexcept
  {
    return c.epoch;
  }
  DHISPARSE_HOST_DEVICE static constexpr policy_state on_hit(policy_state, selection_context c) noexcept
  {
    return c.epoch;
  }
  DHISPARSE_HOST_DEVICE static constexpr std::uint64_t eviction_key(policy_state s, std::int32_t) noexcept
  {
    return s;
  }
};

}  // namespace policy

// ---------------------------------------------------------------------------------------
// Traits checked by the hierarchy's static_asserts.
// ---------------------------------------------------------------------------------------

template <class P, class = void>
struct is_eviction_policy : std::false_type {};

template <class P>
struct is_eviction_policy<
  P, std::enable_if_t<
       std::is_same_v<decltype(P::on_insert(selection_context{})), policy_state> &&
       std::is_same_v<decltype(P::on_hit(policy_state{}, selection_context{})), policy_state> &&
       std::is_same_v<decltype(P::eviction_key(policy_state{}, std::int32_t{})), std::uint64_t> &&
       std::is_same_v<std::decay_t<decltype(P::needs_scores)>, bool> &&
       std::is_same_v<std::decay_t<decltype(P::counts_selections)>, bool> &&
       std::is_same_v<std::decay_t<decltype(P::search)>, victim_search>>> : std::true_type {};

/// True when `P` has the eviction hooks (see the file comment).
template <class P>
inline constexpr bool is_eviction_policy_v = is_eviction_policy<P>::value;

/// True when `P` keeps the default key (key = state, LRU and what derives from it without
/// overriding `eviction_key`): the key is known from the state alone, so a pass over the
/// pool may test it before loading positions (reclaim's candidate pass does).
template <class P>
inline constexpr bool key_is_state_v = &P::eviction_key == &policy::eviction_defaults::eviction_key;

/// True when selecting a row never lowers its key (the default hooks, LRU: the key is the
/// epoch of last use, and epochs only grow): hits then leave the pool's key floors alone
/// (`lower_key_floor` in device_pool.cuh); other policies lower them on every hit.
template <class P>
inline constexpr bool hits_raise_keys_v = key_is_state_v<P> && &P::on_hit == &policy::eviction_defaults::on_hit;

template <class P, class = void>
struct has_sweep_hooks : std::false_type {};

template <class P>
struct has_sweep_hooks<
  P, std::enable_if_t<std::is_same_v<decltype(P::referenced(policy_state{})), bool> &&
                      std::is_same_v<decltype(P::clear_reference(policy_state{})), policy_state>>>
  : std::true_type {};

/// True when `P` is a valid eviction policy and, if it sweeps, has the sweep hooks.
template <class P>
inline constexpr bool is_complete_eviction_policy_v = [] {
  if constexpr (is_eviction_policy_v<P>) {
    return P::search != victim_search::sweep || has_sweep_hooks<P>::value;
  } else {
    return false;
  }
}();

template <class P, class = void>
struct is_budget_policy : std::false_type {};

template <class P>
struct is_budget_policy<
  P, std::enable_if_t<std::is_same_v<std::decay_t<decltype(P::kind)>, budget_kind> &&
                      std::is_same_v<std::decay_t<decltype(P::reclaim)>, reclaim_order> &&
                      std::is_same_v<decltype(P::floor(budget_inputs{})), std::int64_t> &&
                      std::is_same_v<decltype(P::cap(budget_inputs{})), std::int64_t>>>
  : std::true_type {};

/// True when `P` has the budget policy members (see the file comment).
template <class P>
inline constexpr bool is_budget_policy_v = is_budget_policy<P>::value;

}  // namespace dhisparse
