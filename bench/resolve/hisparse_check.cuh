/**
 * @file bench/resolve/hisparse_check.cuh
 * @brief Self-checks of the HiSparse-style baseline against its host model
 *        (`hisparse_reference.hpp`): `check_against_reference` runs a few drifting steps
 *        on fresh random data and compares everything after each; `check_trace_end`
 *        checks a timed run once it is over.
 */
#pragma once

#include <resolve/hisparse_baseline.cuh>
#include <resolve/hisparse_reference.hpp>
#include <resolve/workload.cuh>
#include <resolve/workload.hpp>

#include <dhisparse/error.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace dhisparse::bench::hisparse {

/// Shape of one self-check.
struct check_case {
  int batch            = 1;
  int top_k            = 256;
  int hot_slots        = 512;
  std::size_t row_bytes = 656;
  int steps            = 6;
};

namespace detail {

/// First difference between the device state and the model's, "" when equal: resident
/// positions as sets per request first (the meaningful message), then slot by slot and
/// the LRU order.
inline std::string state_mismatch(hisparse_reference const& want, std::vector<std::int32_t> const& positions,
                                  std::vector<std::int32_t> const& order)
{
  std::size_t const H = std::size_t(want.hot_slots());
  std::ostringstream os;
  for (int r = 0; r < want.num_requests(); ++r) {
    buffer_state const& st = want.request(r);
    std::set<std::int32_t> expected, got;
    for (std::size_t i = 0; i < H; ++i) {
      if (st.slot_position[i] >= 0) { expected.insert(st.slot_position[i]); }
      if (positions[std::size_t(r) * H + i] >= 0) { got.insert(positions[std::size_t(r) * H + i]); }
    }
    for (std::int32_t q : expected) {
      if (!got.count(q)) {
        os << "request " << r << ": position " << q << " resident in the model, not on the device";
        return os.str();
      }
    }
    for (std::int32_t q : got) {
      if (!expected.count(q)) {
        os << "request " << r << ": position " << q << " resident on the device, not in the model";
        return os.str();
      }
    }
    for (std::size_t i = 0; i < H; ++i) {
      if (positions[std::size_t(r) * H + i] != st.slot_position[i]) {
        os << "request " << r << " slot " << i << " holds position " << positions[std::size_t(r) * H + i]
           << ", model " << st.slot_position[i];
        return os.str();
      }
      if (order[std::size_t(r) * H + i] != st.lru[i]) {
        os << "request " << r << " LRU order index " << i << " is slot " << order[std::size_t(r) * H + i]
           << ", model slot " << st.lru[i] << " (0 = least recently used)";
        return os.str();
      }
    }
  }
  return {};
}

/// First difference in one vector of outputs, "" when equal.
inline std::string output_mismatch(char const* what, std::vector<std::int32_t> const& got,
                                   std::vector<std::int32_t> const& want, std::size_t stride)
{
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      std::ostringstream os;
      os << what << "[" << i / stride << "][" << i % stride << "] = " << got[i] << ", model " << want[i];
      return os.str();
    }
  }
  return {};
}

/// Checks the bytes of the bound rows; "" when they all hold their row.
inline std::string row_mismatch(char const* what, resolve::baseline_run const& run, std::size_t row_bytes,
                                std::vector<resolve::row_binding> const& rows, std::uint64_t salt)
{
  std::int64_t const bad = resolve::first_wrong_row(run.buffer_rows(), row_bytes, rows, salt);
  if (bad < 0) { return {}; }
  resolve::row_binding const& bd = rows[std::size_t(bad)];
  std::ostringstream os;
  os << what << ": buffer row " << bd.row << " does not hold the host row of request " << bd.request
     << " position " << bd.position;
  return os.str();
}

/// Rows of every resident slot of the downloaded state.
inline std::vector<resolve::row_binding> resident_rows(std::vector<std::int32_t> const& positions, int hot_slots)
{
  std::vector<resolve::row_binding> out;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] >= 0) { out.push_back({std::int64_t(i), std::int32_t(i / std::size_t(hot_slots)), positions[i]}); }
  }
  return out;
}

}  // namespace detail

/**
 * @brief Runs `c.steps` steps of drifting random selections (hits, stale hits, misses,
 *        padding, any order, the newest token selected or not, empty slots scattered in
 *        the LRU order) through the kernel and the host model; after every step compares
 *        the resident positions (as sets, then slot by slot), the LRU order, the slot
 *        table, the newest slots, the copy counts, and the bytes of every named and every
 *        resident buffer row against the host rows. The newest row is written between
 *        steps, as the step's KV write would. Synchronous.
 * @tparam Config the kernel configuration to check
 * @return a description of the first mismatch, or "" when everything matches
 */
template <class Config>
std::string check_against_reference(check_case const& c, std::uint64_t seed, cudaStream_t stream)
{
  if (c.hot_slots < c.top_k + 1 || c.top_k > Config::max_top_k || c.hot_slots > Config::max_hot_slots) {
    return "unsupported shape (needs top_k + 1 ≤ hot_slots ≤ MaxHotSlots, top_k ≤ MaxTopK)";
  }
  resolve::workload_options o;
  o.batch               = c.batch;
  o.num_requests        = c.batch + 3;  // requests outside the batch must stay untouched
  o.top_k               = c.top_k;
  o.hot_slots           = c.hot_slots;
  o.initial_length      = 2 * c.hot_slots + c.top_k;
  o.resident_fill       = 0.75;
  o.scatter_empty       = true;
  o.keep                = {0.5, 0.86, 0.99, 0.0, 1.0, 0.86};
  o.replace_with_misses = false;  // replacements may be stale resident rows: hits too
  o.sorted              = false;
  o.padding             = 0.05;
  o.select_newest       = 0.5;
  resolve::trace const t = resolve::make_trace(o, c.steps, seed, true);
  resolve::mapped_store const store(
    resolve::paged_layout::scattered(o.num_requests, t.max_context(), c.row_bytes, 6, resolve::derive_seed(seed, 1)),
    resolve::derive_seed(seed, 2));
  resolve::baseline_run run(t, store);
  run.reset();

  for (int s = 0; s < c.steps; ++s) {
    std::string const at = "step " + std::to_string(s) + ": ";
    run.poison_outputs();
    DHISPARSE_CUDA_TRY(swap_in_async<Config>(run.params(s), stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));

    std::vector<std::int32_t> const positions = run.slot_position();
    step_result const& want = t.expected[std::size_t(s)];
    std::vector<std::int32_t> const table = run.slot_table();
    std::vector<std::int32_t> const newest = run.newest_slot();
    std::vector<std::int32_t> const copied_all = run.copied_rows();
    std::vector<std::int32_t> const copied(copied_all.begin() + std::ptrdiff_t(s) * c.batch,
                                           copied_all.begin() + std::ptrdiff_t(s + 1) * c.batch);
    for (std::string m : {detail::state_mismatch(t.after[std::size_t(s)], positions, run.lru()),
                          detail::output_mismatch("slot_table", table, want.slot_table, std::size_t(c.top_k)),
                          detail::output_mismatch("newest_slot", newest, want.newest_slot, newest.size()),
                          detail::output_mismatch("copied_rows", copied, want.copied_rows, copied.size())}) {
      if (!m.empty()) { return at + m; }
    }
    // The step's KV write fills the newest rows; then every named and resident row must
    // hold its host row.
    std::vector<resolve::row_binding> written;
    for (int b = 0; b < c.batch; ++b) {
      if (newest[std::size_t(b)] >= 0) {
        written.push_back({newest[std::size_t(b)], t.requests[std::size_t(b)], t.steps[std::size_t(s)].lengths[std::size_t(b)] - 1});
      }
    }
    resolve::write_rows(run.buffer_rows(), c.row_bytes, written, store.salt());
    for (std::string m : {detail::row_mismatch("slot table", run, c.row_bytes, run.named_rows(s, table), store.salt()),
                          detail::row_mismatch("resident", run, c.row_bytes, detail::resident_rows(positions, c.hot_slots),
                                               store.salt())}) {
      if (!m.empty()) { return at + m; }
    }
  }
  return {};
}

/**
 * @brief After a timed run of every step of `t` from `run.reset()`, without KV writes:
 *        the final state must equal the model's, and every row the last step's slot table
 *        names (except newest positions, which only the KV write fills) must hold its
 *        host row. Synchronous.
 * @return a description of the first mismatch, or "" when everything matches
 */
inline std::string check_trace_end(resolve::trace const& t, resolve::baseline_run const& run,
                                   resolve::mapped_store const& store)
{
  if (std::string m = detail::state_mismatch(t.final_state, run.slot_position(), run.lru()); !m.empty()) {
    return "final state: " + m;
  }
  int const last = int(t.steps.size()) - 1;
  if (std::string m = detail::output_mismatch("last slot_table", run.slot_table(),
                                              t.expected[std::size_t(last)].slot_table, std::size_t(t.options.top_k));
      !m.empty()) {
    return m;
  }
  std::vector<resolve::row_binding> rows;
  for (resolve::row_binding const& bd : run.named_rows(last, run.slot_table())) {
    if (bd.position != t.steps[std::size_t(last)].lengths[0] - 1) { rows.push_back(bd); }
  }
  return detail::row_mismatch("last slot table", run, store.layout().row_bytes, rows, store.salt());
}

}  // namespace dhisparse::bench::hisparse
