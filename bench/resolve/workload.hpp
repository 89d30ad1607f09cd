/**
 * @file bench/resolve/workload.hpp
 * @brief The resolve benchmark's synthetic workload, plain C++: row contents as a pure
 *        function, a host store layout with pages scattered over the pool, and drifting
 *        top-K selections whose miss fraction is set, not sampled.
 *
 * Drift: every step keeps a fraction `keep` of the previous step's selection and replaces
 * the rest. With `replace_with_misses` the replacements are positions no hot buffer row
 * holds (the host model knows which), so a HiSparse-style buffer misses exactly
 * (1 − keep) of the selected rows: keep = 0.99 and 0.86 give the 1% and 14% points.
 * Lengths grow by one per step (position n − 1 is each step's new token).
 */
#pragma once

#include <resolve/hisparse_reference.hpp>

#include <dhisparse/detail/config.hpp>
#include <dhisparse/detail/philox.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace dhisparse::bench::resolve {

/// The i-th seed derived from `seed` (independent streams for cases and layouts).
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t i)
{
  return dhisparse::detail::philox_u64(seed, i, 0x5EEDu, 0);
}

/**
 * @brief 16-byte vector `vector` of the row of (request, position) under `salt`: a Philox
 *        block, never all zero. Rows are a pure function, so any row can be checked
 *        anywhere (host store, hot buffer) without a copy of the truth.
 */
DHISPARSE_HOST_DEVICE inline dhisparse::detail::philox_block row_vector(std::uint64_t salt, std::int32_t request,
                                                                        std::int32_t position, std::uint32_t vector)
{
  dhisparse::detail::philox_block v = dhisparse::detail::philox4x32_10(
    {vector, std::uint32_t(position), std::uint32_t(request), 0x7E57u}, std::uint32_t(salt),
    std::uint32_t(salt >> 32));
  v.x |= 1u;
  return v;
}

/**
 * @brief Placement of the per-request histories in a paged host store with the library's
 *        addressing (`host_store_ref`): pages of 2^page_shift tokens of one-layer rows,
 *        the pages of all requests shuffled over the pool (what a long-running server's
 *        allocator leaves).
 */
struct paged_layout {
  int num_requests      = 0;
  int max_context       = 0;  ///< positions per request
  int page_shift        = 6;  ///< log2(tokens per page)
  int pages_per_request = 0;
  std::size_t row_bytes = 0;
  std::vector<std::int32_t> page_table;  ///< [num_requests][pages_per_request] page index

  [[nodiscard]] std::size_t page_bytes() const { return (std::size_t{1} << page_shift) * row_bytes; }
  [[nodiscard]] std::size_t pool_bytes() const
  {
    return std::size_t(num_requests) * std::size_t(pages_per_request) * page_bytes();
  }

  static paged_layout scattered(int num_requests, int max_context, std::size_t row_bytes, int page_shift,
                                std::uint64_t seed)
  {
    paged_layout l;
    l.num_requests      = num_requests;
    l.max_context       = max_context;
    l.page_shift        = page_shift;
    l.pages_per_request = (max_context + (1 << page_shift) - 1) >> page_shift;
    l.row_bytes         = row_bytes;
    l.page_table.resize(std::size_t(num_requests) * std::size_t(l.pages_per_request));
    std::iota(l.page_table.begin(), l.page_table.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(l.page_table.begin(), l.page_table.end(), rng);
    return l;
  }
};

/// Shape and drift of a workload.
struct workload_options {
  int batch        = 1;
  int num_requests = 1;  ///< ≥ batch: batch entries serve distinct random requests
  int top_k        = 2048;
  int hot_slots    = 4096;
  std::int32_t initial_length = 100000;  ///< length at the first step; +1 per step
  double resident_fill = 1.0;   ///< fraction of slots holding a row at the start
  bool scatter_empty   = false; ///< empty slots anywhere in the LRU order, not first
  std::vector<double> keep = {0.86};  ///< fraction of the last selection kept, cycled per step
  bool replace_with_misses = true;    ///< replacements are not resident (exact misses)
  bool sorted          = true;   ///< valid positions increasing, padding last (resolve's rule)
  double padding       = 0.0;    ///< probability that an entry is padding
  double select_newest = 0.0;    ///< probability that the newest position is selected
};

/// The inputs of one step.
struct step_input {
  std::vector<std::int32_t> top_k;    ///< [batch][top_k]
  std::vector<std::int32_t> lengths;  ///< [batch]
};

/**
 * @brief Generates drifting selections against the state of a host model, which the caller
 *        steps with the same inputs (see `make_trace`).
 */
class drift_workload {
 public:
  drift_workload(workload_options options, std::uint64_t seed) : o_{std::move(options)}, rng_{seed}
  {
    if (o_.batch < 0 || o_.num_requests < o_.batch || o_.top_k < 1 || o_.hot_slots < o_.top_k + 1 ||
        o_.keep.empty() || o_.initial_length < 2 * o_.hot_slots + o_.top_k) {
      throw std::invalid_argument(
        "drift_workload: needs num_requests ≥ batch, hot_slots ≥ top_k + 1, keep fractions, and "
        "initial_length ≥ 2 × hot_slots + top_k (room for rows that are not resident)");
    }
    requests_.resize(std::size_t(o_.num_requests));
    std::iota(requests_.begin(), requests_.end(), 0);
    std::shuffle(requests_.begin(), requests_.end(), rng_);
    requests_.resize(std::size_t(o_.batch));
    previous_.resize(std::size_t(o_.num_requests));
  }

  [[nodiscard]] workload_options const& options() const noexcept { return o_; }
  /// [batch] request of each batch entry.
  [[nodiscard]] std::vector<std::int32_t> const& requests() const noexcept { return requests_; }

  /**
   * @brief Sets the state every request starts from: the "previous" selection resident and
   *        most recently used, other resident rows before it, empty slots first (or, with
   *        `scatter_empty`, the whole order shuffled).
   */
  void initialize(hisparse::hisparse_reference& ref)
  {
    int const H = o_.hot_slots;
    int const resident = std::clamp(int(std::lround(o_.resident_fill * H)), 0, H);
    for (int r = 0; r < o_.num_requests; ++r) {
      std::vector<std::int32_t> picks = distinct_positions(resident, o_.initial_length - 1);
      auto& prev = previous_[std::size_t(r)];
      prev.assign(picks.begin(), picks.begin() + std::min(resident, o_.top_k));
      std::vector<std::int32_t> slots(static_cast<std::size_t>(H));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng_);
      hisparse::buffer_state& st = ref.request(r);
      st.slot_position.assign(std::size_t(H), -1);
      // Order: empty slots, then resident rows not in prev, then prev (most recent last).
      st.lru.clear();
      for (int i = resident; i < H; ++i) { st.lru.push_back(slots[std::size_t(i)]); }
      for (int i = resident - 1; i >= 0; --i) {
        st.slot_position[std::size_t(slots[std::size_t(i)])] = picks[std::size_t(i)];
        st.lru.push_back(slots[std::size_t(i)]);
      }
      if (o_.scatter_empty) { std::shuffle(st.lru.begin(), st.lru.end(), rng_); }
    }
  }

  /// Inputs of the next step given the model's state before it.
  step_input next(hisparse::hisparse_reference const& ref)
  {
    int const K = o_.top_k;
    std::int32_t const length = o_.initial_length + step_;
    std::int32_t const newest = length - 1;
    double const keep = o_.keep[std::size_t(step_) % o_.keep.size()];
    step_input in;
    in.top_k.assign(std::size_t(o_.batch) * std::size_t(K), -1);
    in.lengths.assign(std::size_t(o_.batch), length);
    std::vector<char> taken(std::size_t(length), 0);
    std::vector<char> resident(std::size_t(length), 0);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<std::int32_t> any(0, newest - 1);
    for (int b = 0; b < o_.batch; ++b) {
      std::int32_t const r = requests_[std::size_t(b)];
      auto& prev = previous_[std::size_t(r)];
      std::fill(taken.begin(), taken.end(), 0);
      std::fill(resident.begin(), resident.end(), 0);
      for (std::int32_t q : ref.request(r).slot_position) {
        if (q >= 0 && q < length) { resident[std::size_t(q)] = 1; }
      }
      std::vector<std::int32_t> chosen;
      if (coin(rng_) < o_.select_newest) {
        chosen.push_back(newest);
        taken[std::size_t(newest)] = 1;
      }
      std::shuffle(prev.begin(), prev.end(), rng_);
      std::size_t const kept = std::min(prev.size(), std::size_t(std::lround(keep * K)));
      for (std::size_t i = 0; i < kept && int(chosen.size()) < K; ++i) {
        if (!taken[std::size_t(prev[i])]) {
          taken[std::size_t(prev[i])] = 1;
          chosen.push_back(prev[i]);
        }
      }
      // Replacements: not taken and, when asked (and while such rows can be found), not
      // resident either.
      for (long tries = 0; int(chosen.size()) < K; ++tries) {
        std::int32_t const q = any(rng_);
        bool const avoid = o_.replace_with_misses && tries < 64L * K;
        if (taken[std::size_t(q)] || (avoid && resident[std::size_t(q)])) { continue; }
        taken[std::size_t(q)] = 1;
        chosen.push_back(q);
      }
      prev.clear();
      std::int32_t* const row = in.top_k.data() + std::size_t(b) * std::size_t(K);
      int n = 0;
      for (std::int32_t q : chosen) {
        if (coin(rng_) < o_.padding) {
          // Padding: -1, or (unsorted only) a position past the end, which is padding too.
          row[n++] = (!o_.sorted && coin(rng_) < 0.25) ? length + std::int32_t(coin(rng_) * 1000) : -1;
        } else {
          row[n++] = q;
          prev.push_back(q);
        }
      }
      if (o_.sorted) {
        std::sort(row, row + K, [](std::int32_t a, std::int32_t c) {
          return (a < 0) != (c < 0) ? c < 0 : a < c;  // valid increasing, -1 last
        });
      } else {
        std::shuffle(row, row + K, rng_);
      }
    }
    ++step_;
    return in;
  }

 private:
  /// `count` distinct positions in [0, limit), random order.
  std::vector<std::int32_t> distinct_positions(int count, std::int32_t limit)
  {
    std::vector<char> seen(std::size_t(limit), 0);
    std::vector<std::int32_t> out;
    std::uniform_int_distribution<std::int32_t> any(0, limit - 1);
    while (int(out.size()) < count) {
      std::int32_t const q = any(rng_);
      if (!seen[std::size_t(q)]) {
        seen[std::size_t(q)] = 1;
        out.push_back(q);
      }
    }
    return out;
  }

  workload_options o_;
  std::mt19937_64 rng_;
  std::vector<std::int32_t> requests_;
  std::vector<std::vector<std::int32_t>> previous_;  // [num_requests] last valid selection
  int step_ = 0;
};

/// A precomputed run: the start state, every step's inputs and the host model's outputs.
struct trace {
  workload_options options;
  std::vector<std::int32_t> requests;             ///< [batch]
  hisparse::hisparse_reference initial;           ///< state before step 0
  std::vector<step_input> steps;
  std::vector<hisparse::step_result> expected;    ///< per step
  std::vector<hisparse::hisparse_reference> after;  ///< per step, when recorded
  hisparse::hisparse_reference final_state;       ///< after the last step

  [[nodiscard]] int max_context() const { return options.initial_length + int(steps.size()); }
  /// Rows the model copies over steps [first, last), and the fraction of selected ones.
  [[nodiscard]] double miss_fraction(int first, int last) const
  {
    double copied = 0, selected = 0;
    for (int s = first; s < last; ++s) {
      for (std::int32_t c : expected[std::size_t(s)].copied_rows) { copied += c; }
      for (std::int32_t q : steps[std::size_t(s)].top_k) { selected += q >= 0; }
    }
    return selected > 0 ? copied / selected : 0.0;
  }
};

/**
 * @brief Runs the workload through the host model for `steps` steps.
 * @param record_states keep the model's state after every step (checks), not only the last
 */
inline trace make_trace(workload_options const& options, int steps, std::uint64_t seed, bool record_states)
{
  drift_workload w(options, seed);
  hisparse::hisparse_reference ref(options.num_requests, options.hot_slots);
  w.initialize(ref);
  trace t{options, w.requests(), ref, {}, {}, {}, ref};
  for (int s = 0; s < steps; ++s) {
    step_input in = w.next(ref);
    t.expected.push_back(ref.step(in.top_k, options.top_k, t.requests, in.lengths));
    t.steps.push_back(std::move(in));
    if (record_states) { t.after.push_back(ref); }
  }
  t.final_state = std::move(ref);
  return t;
}

}  // namespace dhisparse::bench::resolve
