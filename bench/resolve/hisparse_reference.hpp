/**
 * @file bench/resolve/hisparse_reference.hpp
 * @brief Sequential host model of the HiSparse-style swap-in (`hisparse_baseline.cuh`):
 *        the same hits, victims, LRU order and slot table, one request at a time.
 *
 * Plain C++ (no CUDA needed to include it). The semantics, shared with the kernel:
 *
 * * Required rows of a batch entry with request r and length n: every valid top-K position
 *   (0 ≤ p < n; other values are padding) and the newest position n − 1, whether it is
 *   selected or not (HiSparse reserves a slot for the token the step writes).
 * * Walk `lru` from least to most recently used: a slot whose position is required is a
 *   *hit*; every other slot (empty ones included) is a *non-hit*, kept in walk order.
 * * V = required − hits victims are the first V non-hits. The i-th missing top-K entry in
 *   selection order (k ascending) takes victim i; the newest position, when it is neither
 *   resident nor selected, takes victim V − 1 (the last).
 * * New order: [non-hits V … end][victims 0 … V − 1][hits in walk order], i.e. stale
 *   rows keep their relative order at the front, rows filled this step come next and hits
 *   become the most recently used (the order SGLang's kernel writes).
 * * Every missing row except the newest is copied from the host store into its victim
 *   slot; the newest row's slot is only reserved: the step's KV write fills it.
 * * Preconditions: hot_slots ≥ top_k + 1; valid positions of one row are distinct; the
 *   batch entries of one step name distinct requests; `lru` is a permutation of the slots.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dhisparse::bench::hisparse {

/// Residency state of one request's hot buffer (the kernel keeps the same in device memory).
struct buffer_state {
  std::vector<std::int32_t> slot_position;  ///< [hot_slots] position held, -1 = empty
  std::vector<std::int32_t> lru;            ///< [hot_slots] slots, least recently used first

  /// All slots empty, order 0 … hot_slots − 1.
  static buffer_state empty(int hot_slots)
  {
    buffer_state s;
    s.slot_position.assign(std::size_t(hot_slots), -1);
    s.lru.resize(std::size_t(hot_slots));
    std::iota(s.lru.begin(), s.lru.end(), 0);
    return s;
  }
};

/// A row the swap-in copies from the host store.
struct row_copy {
  std::int32_t position;
  std::int32_t slot;  ///< slot within the request's buffer
};

/// What one swap-in did for one batch entry.
struct entry_result {
  std::vector<std::int32_t> slot_table;  ///< [top_k] slot within the buffer, -1 = padding
  std::int32_t newest_slot = -1;         ///< slot reserved for position n − 1, -1 when n < 1
  std::vector<row_copy> copies;          ///< in miss order (what the kernel copies)
  int hits = 0;                          ///< required rows found resident
};

/**
 * @brief One swap-in of one request (see the file comment): updates `state`, returns the
 *        slot of every top-K entry and the rows to copy.
 * @throws std::invalid_argument when the buffer is smaller than top_k + 1
 */
inline entry_result swap_in_reference(buffer_state& state, std::int32_t const* top_k, int k,
                                      std::int32_t length)
{
  int const hot_slots = int(state.lru.size());
  if (hot_slots < k + 1) {
    throw std::invalid_argument("swap_in_reference: hot_slots (" + std::to_string(hot_slots) +
                                ") must be at least top_k + 1 (" + std::to_string(k + 1) + ")");
  }
  std::int32_t const newest = length - 1;
  // Required positions → entry: k for a selected one (its first occurrence), k_count for
  // the newest when it is not selected.
  std::unordered_map<std::int32_t, int> entry;
  entry.reserve(std::size_t(2 * k + 2));
  auto valid = [&](std::int32_t p) { return p >= 0 && p < length; };
  for (int i = 0; i < k; ++i) {
    if (valid(top_k[i])) { entry.emplace(top_k[i], i); }
  }
  if (newest >= 0) { entry.emplace(newest, k); }

  std::vector<std::int32_t> entry_slot(std::size_t(k) + 1, -1);
  std::vector<std::int32_t> hits, non_hits;
  for (std::int32_t slot : state.lru) {
    std::int32_t const p = state.slot_position[std::size_t(slot)];
    auto const it        = p >= 0 ? entry.find(p) : entry.end();
    if (it != entry.end()) {
      entry_slot[std::size_t(it->second)] = slot;
      hits.push_back(slot);
    } else {
      non_hits.push_back(slot);
    }
  }
  std::size_t const victims = entry.size() - hits.size();

  entry_result out;
  out.hits = int(hits.size());
  std::size_t next_victim = 0;
  auto take_victim = [&](int e, std::int32_t p) {
    std::int32_t const slot = non_hits[next_victim++];
    entry_slot[std::size_t(e)] = slot;
    state.slot_position[std::size_t(slot)] = p;
    if (p != newest) { out.copies.push_back({p, slot}); }
  };
  for (int i = 0; i < k; ++i) {
    if (valid(top_k[i]) && entry_slot[std::size_t(i)] < 0) { take_victim(i, top_k[i]); }
  }
  if (newest >= 0 && entry.at(newest) == k && entry_slot[std::size_t(k)] < 0) { take_victim(k, newest); }
  if (next_victim != victims) {
    throw std::invalid_argument("swap_in_reference: a top-K row repeats a position");
  }

  out.slot_table.resize(std::size_t(k));
  for (int i = 0; i < k; ++i) { out.slot_table[std::size_t(i)] = valid(top_k[i]) ? entry_slot[std::size_t(i)] : -1; }
  out.newest_slot = newest >= 0 ? entry_slot[std::size_t(entry.at(newest))] : -1;

  std::vector<std::int32_t> order(non_hits.begin() + std::ptrdiff_t(victims), non_hits.end());
  order.insert(order.end(), non_hits.begin(), non_hits.begin() + std::ptrdiff_t(victims));
  order.insert(order.end(), hits.begin(), hits.end());
  state.lru = std::move(order);
  return out;
}

/// One step's outputs for a whole batch, in the kernel's format (global rows r × H + slot).
struct step_result {
  std::vector<std::int32_t> slot_table;   ///< [batch][top_k], -1 = padding
  std::vector<std::int32_t> newest_slot;  ///< [batch]
  std::vector<std::int32_t> copied_rows;  ///< [batch] rows copied from the host store
};

/**
 * @brief The host model of a whole set of request buffers: `step` does for a batch what one
 *        launch of the kernel does.
 */
class hisparse_reference {
 public:
  hisparse_reference(int num_requests, int hot_slots)
    : hot_slots_{hot_slots}, states_(std::size_t(num_requests), buffer_state::empty(hot_slots))
  {
  }

  [[nodiscard]] int num_requests() const noexcept { return int(states_.size()); }
  [[nodiscard]] int hot_slots() const noexcept { return hot_slots_; }
  [[nodiscard]] buffer_state& request(int r) { return states_.at(std::size_t(r)); }
  [[nodiscard]] buffer_state const& request(int r) const { return states_.at(std::size_t(r)); }

  /**
   * @param top_k    [batch][k] positions, -1 = none
   * @param requests [batch] request of each entry (distinct)
   * @param lengths  [batch] length of each entry's request after this step's token
   */
  step_result step(std::vector<std::int32_t> const& top_k, int k, std::vector<std::int32_t> const& requests,
                   std::vector<std::int32_t> const& lengths)
  {
    std::size_t const batch = requests.size();
    step_result out;
    out.slot_table.resize(batch * std::size_t(k));
    out.newest_slot.resize(batch);
    out.copied_rows.resize(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      std::int32_t const r = requests[b];
      std::int64_t const base = std::int64_t(r) * hot_slots_;
      entry_result const e = swap_in_reference(request(r), top_k.data() + b * std::size_t(k), k, lengths[b]);
      for (int i = 0; i < k; ++i) {
        std::int32_t const s = e.slot_table[std::size_t(i)];
        out.slot_table[b * std::size_t(k) + std::size_t(i)] = s < 0 ? -1 : std::int32_t(base + s);
      }
      out.newest_slot[b] = e.newest_slot < 0 ? -1 : std::int32_t(base + e.newest_slot);
      out.copied_rows[b] = std::int32_t(e.copies.size());
    }
    return out;
  }

 private:
  int hot_slots_;
  std::vector<buffer_state> states_;
};

}  // namespace dhisparse::bench::hisparse
