/**
 * @file host/hierarchy.hpp
 * @brief Plain-C++ reference of `kv_hierarchy`: the oracle of the GPU tests and the
 *        backend of the examples and the simulator on machines without a GPU.
 *
 * Same configuration, same step API (minus streams: every call completes before it
 * returns) and the same decisions: which rows hit, which are fetched, which are evicted
 * or reclaimed (the policies' orders), what every slot holds, the counters. Slot *numbers*
 * may differ from the GPU's (the GPU's free stack is popped concurrently), so comparisons
 * are made on positions and bytes, not on slot ids.
 *
 * It is written as directly as possible — maps, sorted lists, sequential loops — so that
 * it can be checked by reading: victims are found by sorting all candidates (the GPU uses
 * a victim cache), reclaim by sorting the whole pool (the GPU uses a radix select). Its
 * host store is one byte vector per request, laid out `[position][group][layer][row
 * bytes]`, and is sized like the real one (same page accounting, so "host store
 * exhausted" happens at the same point).
 */
#pragma once

#include <dhisparse/detail/budget_ledger.hpp>
#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/verified_step.hpp>
#include <dhisparse/detail/request_table.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/group_counters.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/host/draft_ring.hpp>
#include <dhisparse/policy/concepts.hpp>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dhisparse::host {

template <class RowFormat, class Eviction = policy::lru, class Budget = policy::static_budget<4096>>
class kv_hierarchy {
  static_assert(is_row_format_v<RowFormat>, "RowFormat: see row_format.cuh");
  static_assert(is_complete_eviction_policy_v<Eviction>, "Eviction: see policy/concepts.hpp");
  static_assert(is_budget_policy_v<Budget>, "Budget: see policy/concepts.hpp");

  static constexpr bool per_request = Budget::kind == budget_kind::per_request;
  static constexpr bool reclaims    = Budget::kind == budget_kind::shared && Budget::reclaim != reclaim_order::none;

 public:
  using row_format      = RowFormat;
  using eviction_policy = Eviction;
  using budget_policy   = Budget;

  /// One fetched row of the last resolve of a group.
  struct miss {
    std::int32_t request;  ///< request index
    std::int32_t position;
    std::int32_t slot;
  };

  explicit kv_hierarchy(hierarchy_config config)
    : config_{std::move(config)}, ledger_{(detail::validate(config_), config_)}
  {
    std::size_t page_bytes = 0;  // a described page layout is checked as the GPU store checks it
    detail::make_group_layouts(config_.host, config_.group_layers, RowFormat::bytes, page_bytes);
    int const groups = config_.num_groups();
    for (int g = 0; g < groups; ++g) {
      group_offset_.push_back(total_row_bytes_);
      total_row_bytes_ += std::size_t(config_.group_layers[g]) * RowFormat::bytes;
    }
    std::size_t const slots = std::size_t(config_.device_slots_per_group);
    groups_.resize(groups);
    for (int g = 0; g < groups; ++g) {
      auto& gs     = groups_[g];
      gs.row_bytes = std::size_t(config_.group_layers[g]) * RowFormat::bytes;
      allocating("slab of group " + std::to_string(g), slots * gs.row_bytes,
                 [&] { gs.slab.assign(slots * gs.row_bytes, std::byte{0}); });
      gs.owner.assign(slots, -1);
      gs.position.assign(slots, -1);
      gs.state.assign(slots, 0);
      gs.touched.assign(slots, 0);
      gs.dirty.assign(slots, 0);
      for (std::size_t s = slots; s-- > 0;) { gs.free_stack.push_back(std::int32_t(s)); }
      gs.limit = std::int32_t(slots);
      gs.owned.resize(config_.max_requests);
      gs.owned_count.assign(config_.max_requests, 0);
      gs.spare.resize(config_.max_requests);
      gs.hand.assign(config_.max_requests, 0);
      gs.map.resize(config_.max_requests);
      gs.tail_slots.assign(std::size_t(config_.max_batch) * config_.max_queries, -1);
      gs.slot_table.assign(config_.step_entries(), -1);
    }
    requests_.resize(config_.max_requests);
    free_host_pages_ = config_.host.capacity_pages;
    std::size_t const step_queries = std::size_t(config_.max_batch) * config_.max_queries;
    parents_.assign(step_queries, -1);
    depths_.assign(step_queries, 0);
    positions_.assign(step_queries, -1);
    commit_status_.assign(std::size_t(config_.max_batch), 0);
    committed_.assign(std::size_t(config_.max_batch), 0);
  }

  // ---- requests -------------------------------------------------------------------------

  void admit(request_id id, std::int32_t length, std::int64_t capacity = -1)
  {
    int const index = table_.check_admit(id, length, capacity);
    check_pages(index, capacity);
    ledger_.check(index, backed(capacity), "admit");
    grow(index, capacity);
    table_.insert(id);
    requests_[index].length = length;
  }

  /**
   * Reference of `kv_hierarchy::adopt`: the rows of positions [0, length) are read from the
   * adopted pages of the caller's memory (`host_memory::caller`, laid out as
   * `host_store_config` describes) into the reference's own store. It does not track
   * which pages requests hold: the GPU store also refuses pages held or parked.
   */
  void adopt(request_id id, std::int32_t length, std::int32_t const* pages, std::size_t num_pages,
             std::int64_t capacity = -1)
  {
    table_.check_admit(id, length, capacity);
    auto const& host       = config_.host;
    std::int64_t const tpp = host.tokens_per_page;
    DHISPARSE_EXPECTS(host.memory == host_memory::caller && host.caller_memory != nullptr,
                      "adopt: the host reference reads adopted rows from host_memory::caller memory");
    DHISPARSE_EXPECTS(pages != nullptr || num_pages == 0, "adopt: pages is null");
    DHISPARSE_EXPECTS(std::int64_t(num_pages) * tpp >= length,
                      "adopt: " + std::to_string(num_pages) + " pages cover " + std::to_string(num_pages * tpp) +
                        " positions, fewer than length (" + std::to_string(length) + ")");
    DHISPARSE_EXPECTS(std::int64_t(num_pages) <= (config_.max_context + tpp - 1) / tpp,
                      "host store: " + std::to_string(num_pages) + " pages adopted, max_context needs at most " +
                        std::to_string((config_.max_context + tpp - 1) / tpp));
    std::size_t page_bytes = 0;
    auto const layouts     = detail::make_group_layouts(host, config_.group_layers, RowFormat::bytes, page_bytes);
    std::vector<char> seen(host.capacity_pages, 0);
    for (std::size_t k = 0; k < num_pages; ++k) {
      std::int32_t const page = pages[k];
      bool const inside       = page >= 0 && std::size_t(page) < host.capacity_pages &&
                          (std::size_t(page) + 1) * page_bytes <= host.caller_bytes;
      DHISPARSE_EXPECTS(inside && !seen[std::size_t(page)], "host store: adopted page " + std::to_string(page) +
                                                               " (entry " + std::to_string(k) + ") " +
                                                               (inside ? "is held or repeated" : "is outside the pool"));
      seen[std::size_t(page)] = 1;
    }
    admit(id, length, std::max(capacity, std::min<std::int64_t>(std::int64_t(num_pages) * tpp, config_.max_context)));
    auto const* base = static_cast<std::byte const*>(host.caller_memory);
    for (int g = 0; g < config_.num_groups(); ++g) {
      for (int l = 0; l < config_.group_layers[g]; ++l) {
        for (std::int32_t pos = 0; pos < length; ++pos) {
          std::byte const* from = base + std::size_t(pages[pos / tpp]) * page_bytes + layouts[g].page_offset +
                                  std::size_t(pos % tpp) * layouts[g].row_bytes + std::size_t(l) * RowFormat::bytes;
          std::memcpy(host_row(id, g, l, pos), from, RowFormat::bytes);
        }
      }
    }
  }

  void reserve(request_id id, std::int64_t capacity)
  {
    int const index = table_.index_of(id, "reserve");
    table_.check_reserve(capacity);
    check_pages(index, capacity);
    ledger_.check(index, std::max(backed(capacity), requests_[index].capacity), "reserve");
    grow(index, capacity);
  }

  /// Reference of `kv_hierarchy::release`: also mid-step, the request then leaves the step.
  void release(request_id id)
  {
    int const index = table_.index_of(id, "release");
    leave_step(index);
    for (auto& gs : groups_) {
      gs.dirty_list.erase(std::remove_if(gs.dirty_list.begin(), gs.dirty_list.end(),
                                         [&](std::int32_t s) { return gs.owner[s] == index; }),
                          gs.dirty_list.end());
      for (std::int32_t s = 0; s < gs.limit; ++s) {
        if (gs.owner[s] != index) { continue; }
        clear_slot(gs, s);
        gs.free_stack.push_back(s);
      }
      gs.owned[index].clear();
      gs.owned_count[index] = 0;
      gs.spare[index].clear();
      gs.hand[index] = 0;
      gs.map[index].clear();
    }
    auto& rq = requests_[index];
    free_host_pages_ += pages_for(rq.capacity);
    rq = request_state{};
    ledger_.clear(index);
    table_.erase(id);
  }

  [[nodiscard]] bool contains(request_id id) const { return table_.contains(id); }
  [[nodiscard]] std::size_t num_requests() const noexcept { return table_.size(); }
  [[nodiscard]] std::int64_t floor(request_id id) const { return ledger_.floor(table_.index_of(id, "floor")); }
  [[nodiscard]] std::int64_t floor_sum() const noexcept { return ledger_.floor_sum(); }

  /// Row of (request, group, layer, position) in the reference host store. Valid until the
  /// request's next `reserve` or `release`.
  [[nodiscard]] std::byte* host_row(request_id id, int group, int layer, std::int64_t position)
  {
    int const index = table_.index_of(id, "host_row");
    table_.check_layer(group, layer, "host_row");
    DHISPARSE_EXPECTS(position >= 0 && position < requests_[index].capacity,
                      "host_row: position " + std::to_string(position) + " is not backed by a page");
    return store_row(index, group, std::int32_t(position)) + std::size_t(layer) * RowFormat::bytes;
  }

  /// Reference of `kv_hierarchy::write_host_rows` (synchronous; `source` in host memory).
  void write_host_rows(request_id id, int group, int layer, std::int64_t first, std::int64_t count,
                       void const* source, std::size_t source_stride)
  {
    int const index = table_.index_of(id, "write_host_rows");
    table_.check_layer(group, layer, "write_host_rows");
    DHISPARSE_EXPECTS(first >= 0 && count >= 0 && first + count <= requests_[index].capacity,
                      "write_host_rows: positions [" + std::to_string(first) + ", " + std::to_string(first + count) +
                        ") are not all backed by pages (capacity " + std::to_string(requests_[index].capacity) + ")");
    DHISPARSE_EXPECTS(count == 0 || (source != nullptr && source_stride >= RowFormat::bytes),
                      "write_host_rows: source must not be null and source_stride must be at least the row size (" +
                        std::to_string(RowFormat::bytes) + " bytes)");
    auto const* from = static_cast<std::byte const*>(source);
    for (std::int64_t k = 0; k < count; ++k) {
      std::memcpy(host_row(id, group, layer, first + k), from + std::size_t(k) * source_stride, RowFormat::bytes);
    }
  }

  // ---- pool memory ----------------------------------------------------------------------

  /// Reference of `kv_hierarchy::set_pool_limit`.
  void set_pool_limit(int group, std::int64_t limit)
  {
    ledger_.check_limit(group, limit);
    auto& gs                     = groups_[group];
    std::int32_t const old_limit = gs.limit;
    std::int32_t const lim       = std::int32_t(limit);
    if (lim < old_limit) {
      backup();
      if constexpr (reclaims) { reclaim_rows(group, old_limit - lim - std::int32_t(gs.free_stack.size()), 0); }
      gs.free_stack.clear();
      for (std::int32_t s = 0; s < lim; ++s) {
        if (gs.owner[s] < 0) { gs.free_stack.push_back(s); }
      }
      std::map<std::int32_t, std::int32_t> moved;
      for (std::int32_t s = lim; s < old_limit; ++s) {
        if (gs.owner[s] < 0) { continue; }
        std::int32_t const to = gs.free_stack.back();
        gs.free_stack.pop_back();
        std::copy_n(gs.slab.begin() + std::ptrdiff_t(std::size_t(s) * gs.row_bytes), gs.row_bytes,
                    gs.slab.begin() + std::ptrdiff_t(std::size_t(to) * gs.row_bytes));
        gs.owner[to]    = gs.owner[s];
        gs.position[to] = gs.position[s];
        gs.state[to]    = gs.state[s];
        gs.touched[to]  = gs.touched[s];
        gs.dirty[to]    = 0;
        if (gs.position[s] >= 0) { gs.map[gs.owner[s]][gs.position[s]] = to; }
        clear_slot(gs, s);
        moved[s] = to;
      }
      for (int r = 0; r < config_.max_requests; ++r) {
        for (auto* list : {&gs.owned[r], &gs.spare[r]}) {
          for (auto& s : *list) {
            if (s >= lim) { s = moved.at(s); }
          }
        }
      }
    } else {
      for (std::int32_t s = old_limit; s < lim; ++s) { gs.free_stack.push_back(s); }
    }
    gs.limit = lim;
    ledger_.set_limit(group, limit);
  }

  [[nodiscard]] std::int64_t pool_limit(int group) const
  {
    table_.check_group(group, "pool_limit");
    return ledger_.limit(group);
  }

  /// Reference of `kv_hierarchy::reclaim`.
  void reclaim(int group, std::int32_t free_slots)
  {
    table_.check_group(group, "reclaim");
    if constexpr (reclaims) { reclaim_rows(group, free_slots - std::int32_t(groups_[group].free_stack.size()), 0); }
  }

  /// Reference of `kv_hierarchy::prewarm`.
  void prewarm(request_id id, std::int32_t count)
  {
    int const index = table_.index_of(id, "prewarm");
    DHISPARSE_EXPECTS(count >= 0, "prewarm: count must not be negative");
    for (int g = 0; g < config_.num_groups(); ++g) { prewarm_rows(index, g, -1, count); }
  }

  /// Reference of `kv_hierarchy::prewarm_range`.
  void prewarm_range(request_id id, int group, std::int32_t first, std::int32_t count)
  {
    int const index = table_.index_of(id, "prewarm_range");
    table_.check_group(group, "prewarm_range");
    DHISPARSE_EXPECTS(first >= 0 && count >= 0, "prewarm_range: first and count must not be negative");
    prewarm_rows(index, group, first, count);
  }

  // ---- batch ----------------------------------------------------------------------------

  /// Reference of `kv_hierarchy::set_batch`: a step left open (resolved, not committed) is
  /// abandoned first — its tail rows recycled, nothing committed.
  void set_batch(request_id const* ids, std::int32_t const* queries, int count)
  {
    auto indices = table_.batch_indices(ids, queries, count);
    abandon_step();
    batch_requests_ = std::move(indices);
    batch_queries_.assign(queries, queries + count);
    prepare_drafts(nullptr, nullptr);
  }

  /// Reference of `kv_hierarchy::load_batch`; `batch` is host memory `[1 + 2 max_batch]`
  /// (count, request indices, queries), validated as the kernel does: a count outside
  /// [0, max_batch] clamped; an entry with an index not admitted or repeated, or queries
  /// outside [1, max_queries], left out of the step (0 queries; its index kept where it is
  /// one, else 0); both raise `status_invalid_batch`.
  void load_batch(std::int32_t const* batch)
  {
    DHISPARSE_EXPECTS(batch != nullptr, "load_batch: batch must not be null");
    int const B               = config_.max_batch;
    std::int32_t const asked  = batch[0];
    std::int32_t const count  = std::clamp(asked, 0, B);
    bool bad                  = count != asked;
    std::vector<std::int32_t> requests(std::size_t(count), 0), queries(std::size_t(count), 0);
    for (int b = 0; b < count; ++b) {
      std::int32_t const r  = batch[1 + b];
      std::int32_t const nq = batch[1 + B + b];
      bool const in_range   = r >= 0 && r < config_.max_requests;
      bool ok = in_range && table_.admitted_index(r) && nq >= 1 && nq <= config_.max_queries &&
                std::find(batch + 1, batch + 1 + b, r) == batch + 1 + b;
      requests[std::size_t(b)] = in_range ? r : 0;
      queries[std::size_t(b)]  = ok ? nq : 0;
      bad                      = bad || !ok;
    }
    abandon_step();
    batch_requests_ = std::move(requests);
    batch_queries_  = std::move(queries);
    if (bad) { status_ |= status_invalid_batch; }
    prepare_drafts(nullptr, nullptr);
  }

  /// Reference of `kv_hierarchy::set_drafts`; host arrays.
  void set_drafts(std::int32_t const* num_drafts, std::int32_t const* parents)
  {
    DHISPARSE_EXPECTS(num_drafts != nullptr, "set_drafts: num_drafts must not be null");
    prepare_drafts(num_drafts, parents);
  }

  /// Positions of the step's queries, [max_batch][max_queries]: committed length + depth in
  /// the draft tree (chain: + q), -1 beyond a request's queries.
  [[nodiscard]] std::int32_t const* query_positions() const noexcept { return positions_.data(); }
  /// The step's draft tree, [max_batch][max_queries]: the parent query of each query (-1
  /// for the root and beyond a request's queries).
  [[nodiscard]] std::int32_t const* query_parents() const noexcept { return parents_.data(); }
  /// Queries of batch entry b in the current step (0: it left the step).
  [[nodiscard]] std::int32_t batch_queries(int b) const { return batch_queries_.at(std::size_t(b)); }

  [[nodiscard]] int batch_count() const noexcept { return int(batch_requests_.size()); }

  // ---- step -----------------------------------------------------------------------------

  /// Reference of resolve.cuh; `selections` (and `scores`) are host memory
  /// [max_batch][max_queries][top_k].
  void resolve(int group, std::int32_t const* selections, int top_k, float const* scores = nullptr)
  {
    table_.check_resolve(group, selections, top_k);
    DHISPARSE_EXPECTS(!Eviction::needs_scores || scores != nullptr,
                      "resolve: the eviction policy needs per-selection scores (scores is null)");
    auto& gs = groups_[group];
    std::uint32_t const epoch = ++gs.epoch;
    gs.misses.clear();
    std::fill(gs.tail_slots.begin(), gs.tail_slots.end(), -1);
    gs.slot_table.resize(std::size_t(config_.max_batch) * config_.max_queries * top_k);
    std::size_t const entries = std::size_t(config_.max_queries) * top_k;
    int const batch           = batch_count();
    std::vector<std::vector<std::int32_t>> misses(batch);
    std::vector<int> tails(batch, 0);

    // 1. lookup, every request: hits pinned (on_hit once per row), misses collected once.
    for (int b = 0; b < batch; ++b) {
      std::int32_t const r   = batch_requests_[b];
      std::int32_t const nq  = batch_queries_[b];
      std::int32_t const len = requests_[r].length;
      auto& map              = gs.map[r];
      int t = 0;
      while (t < nq) {
        std::int32_t const pos = len + t;
        if (pos >= requests_[r].capacity) {
          status_ |= status_capacity_exceeded;
          break;
        }
        if (map[pos] != -1) {
          status_ |= status_uncommitted_tail;
          break;
        }
        ++t;
      }
      tails[b] = t;
      std::set<std::int32_t> missed;
      std::map<std::int32_t, context_sum> hits;  // slot → aggregated selections
      std::int32_t* table = gs.slot_table.data() + b * entries;
      for (std::size_t i = 0; i < entries; ++i) {
        int const q            = int(i / std::size_t(top_k));
        std::int32_t const pos = q < nq ? selections[b * entries + i] : -1;
        table[i]               = -1;
        if (pos == -1) { continue; }
        if (pos < 0 || pos > len + q) {
          status_ |= status_invalid_selection;
        } else if (pos >= len) {
          table[i] = pos - len < t ? pending : -1;
        } else if (std::int32_t const slot = map[pos]; slot >= 0) {
          table[i]  = slot;
          auto& sum = hits[slot];
          sum.add(scores != nullptr ? scores[b * entries + i] : 0.f);
        } else {
          missed.insert(pos);
          table[i] = pending;
        }
      }
      for (auto const& [slot, sum] : hits) {
        gs.touched[slot] = epoch;
        gs.state[slot]   = Eviction::on_hit(gs.state[slot], sum.context(epoch, gs.position[slot], true));
      }
      misses[b].assign(missed.begin(), missed.end());
      gs.counters.selected_rows += hits.size() + missed.size();
    }

    // 2. reclaim (shared budgets), when the free slots cannot serve the step's new rows.
    if constexpr (reclaims) {
      long long rows = 0;
      for (int b = 0; b < batch; ++b) {
        rows += std::max<long long>(0, std::int64_t(misses[b].size()) + tails[b] -
                                         std::int64_t(gs.spare[batch_requests_[b]].size()));
      }
      long long const short_by = rows + config_.reclaim_low_watermark - std::int64_t(gs.free_stack.size());
      if (short_by > 0) {
        reclaim_rows(group, std::int32_t(std::min<long long>(short_by + detail::reclaim_batch(config_),
                                                             config_.device_slots_per_group)),
                     epoch);
      }
    }

    // 3. allocate, every request: spares, free pool up to the cap, then its own victims.
    for (int b = 0; b < batch; ++b) {
      std::int32_t const r   = batch_requests_[b];
      std::int32_t const len = requests_[r].length;
      int const t            = tails[b];
      int const rows         = int(misses[b].size()) + t;
      auto& spare            = gs.spare[r];
      int const spares       = std::min<int>(int(spare.size()), rows);
      int want               = rows - spares;
      if constexpr (per_request) { want = std::min(want, std::max(0, ledger_.cap(r) - gs.owned_count[r])); }
      int const popped = std::min<int>(want, int(gs.free_stack.size()));
      if (popped < want) { status_ |= status_pool_exhausted; }
      std::vector<std::int32_t> slots;
      for (int i = 0; i < spares; ++i) {
        slots.push_back(spare.back());
        spare.pop_back();
      }
      for (int i = 0; i < popped; ++i) {
        std::int32_t const s = gs.free_stack.back();
        gs.free_stack.pop_back();
        gs.owner[s] = r;
        if constexpr (per_request) { gs.owned[r].push_back(s); }
        slots.push_back(s);
      }
      gs.owned_count[r] += popped;
      int found = 0;
      if constexpr (per_request) {
        int const evict = rows - spares - popped;
        if (evict > 0) {
          auto const victims = Eviction::search == victim_search::sweep ? sweep(gs, r, epoch, evict)
                                                                       : smallest_keys(gs, r, epoch, evict);
          for (std::int32_t s : victims) {
            gs.map[r][gs.position[s]] = -1;
            slots.push_back(s);
          }
          found = int(victims.size());
          gs.counters.evicted_rows += victims.size();
        }
      }
      int const total = spares + popped + found;
      if (total < rows) { status_ |= status_budget_exceeded; }
      std::int32_t const* sel = selections + b * entries;
      std::int32_t* table     = gs.slot_table.data() + b * entries;
      for (int i = 0; i < total; ++i) {
        std::int32_t const s   = slots[i];
        bool const tail        = i < t;
        std::int32_t const pos = tail ? len + i : misses[b][i - t];
        gs.position[s]         = pos;
        gs.touched[s]          = epoch;
        gs.dirty[s]            = tail ? 1 : 0;
        gs.map[r][pos]         = s;
        if (tail) {
          gs.tail_slots[std::size_t(b) * config_.max_queries + i] = s;
        } else {
          gs.misses.push_back({r, pos, s});
        }
      }
      // Pending entries get their slots; the new rows' policy state from their selections.
      std::map<std::int32_t, context_sum> inserted;
      for (int i = 0; i < total; ++i) { inserted[slots[i]]; }
      for (std::size_t i = 0; i < entries; ++i) {
        if (table[i] != pending) { continue; }
        std::int32_t const slot = gs.map[r][sel[i]];
        table[i]                = slot;
        if (slot >= 0) { inserted[slot].add(scores != nullptr ? scores[b * entries + i] : 0.f); }
      }
      for (int i = 0; i < total; ++i) {
        std::int32_t const s = slots[i];
        gs.state[s]          = Eviction::on_insert(inserted[s].context(epoch, gs.position[s], i >= t));
      }
      gs.counters.fetched_rows += std::max(0, total - t);
      gs.counters.tail_rows += std::min(t, total);
    }
  }

  /// Copies the rows of the last resolve's misses of `group` from the host store.
  void retrieve(int group, int layer_begin = 0, int layer_end = -1)
  {
    table_.check_retrieve(group, layer_begin, layer_end);
    copy_rows(group, groups_[group].misses, layer_begin, layer_end);
  }

  /// Reference of `kv_hierarchy::commit`; `accepted` is host memory [batch] or nullptr.
  void commit(std::int32_t const* accepted) { commit_rows(accepted, nullptr); }

  /// Reference of `kv_hierarchy::commit_verified`; host pointers.
  void commit_verified(verified_step const& v)
  {
    DHISPARSE_EXPECTS_NO_PROBLEM(verified_step_problem(v));
    commit_rows(nullptr, &v);
  }

  /// Per batch entry, the status bits of the last commit (0: every row asked for was kept).
  [[nodiscard]] std::uint32_t const* commit_status() const noexcept { return commit_status_.data(); }
  /// Per batch entry, the tail rows the last commit kept (= tokens it emitted).
  [[nodiscard]] std::int32_t const* committed_rows() const noexcept { return committed_.data(); }

  /// Copies every committed, not yet backed-up row to the host store; they become clean.
  void backup()
  {
    for (int g = 0; g < config_.num_groups(); ++g) {
      auto& gs = groups_[g];
      auto const back_up = [&](std::int32_t s) {
        std::memcpy(store_row(gs.owner[s], g, gs.position[s]), gs.slab.data() + std::size_t(s) * gs.row_bytes,
                    gs.row_bytes);
        gs.dirty[s] = 0;
        ++gs.counters.backed_up_rows;
      };
      for (std::int32_t s : gs.dirty_list) {
        if (gs.owner[s] >= 0 && gs.position[s] >= 0) { back_up(s); }
      }
      // Rows committed past a full dirty list (the GPU finds them with a pool scan).
      for (std::int32_t s = 0; s < gs.limit; ++s) {
        if (gs.dirty[s] != 0 && gs.owner[s] >= 0 && gs.position[s] >= 0 &&
            gs.position[s] < requests_[gs.owner[s]].length) {
          back_up(s);
        }
      }
      gs.dirty_list.clear();
    }
  }

  // ---- views ----------------------------------------------------------------------------

  /// Slot table of the last resolve of `group`: [max_batch][max_queries][top_k].
  [[nodiscard]] std::int32_t const* slot_table(int group) const { return group_at(group, "slot_table").slot_table.data(); }
  /// Tail slots of the last resolve of `group`: [max_batch][max_queries], -1 = none.
  [[nodiscard]] std::int32_t const* tail_slots(int group) const { return group_at(group, "tail_slots").tail_slots.data(); }
  /// Rows of one layer of `group`'s slab.
  [[nodiscard]] layer_view layer_rows(int group, int layer)
  {
    table_.check_layer(group, layer, "layer_rows");
    auto& gs = groups_[group];
    return {gs.slab.data() + std::size_t(layer) * RowFormat::bytes, gs.row_bytes};
  }
  /// Rows fetched by the last resolve of `group`.
  [[nodiscard]] std::vector<miss> const& misses(int group) const { return group_at(group, "misses").misses; }
  /// Positions of request `id` resident in `group`, ascending.
  [[nodiscard]] std::vector<std::int32_t> resident_positions(request_id id, int group) const
  {
    int const index = table_.index_of(id, "resident_positions");
    std::vector<std::int32_t> out;
    auto const& map = group_at(group, "resident_positions").map[index];
    for (std::size_t p = 0; p < map.size(); ++p) {
      if (map[p] >= 0) { out.push_back(std::int32_t(p)); }
    }
    return out;
  }
  /// Slots of `group` owned by some request (resident rows and spare slots).
  [[nodiscard]] std::int64_t owned_slots(int group) const
  {
    auto const& gs = group_at(group, "owned_slots");
    return std::count_if(gs.owner.begin(), gs.owner.end(), [](std::int32_t o) { return o >= 0; });
  }
  /// Slots of `group` that request `id` owns (resident rows and spare slots).
  [[nodiscard]] std::int32_t owned_slots(request_id id, int group) const
  {
    return group_at(group, "owned_slots").owned_count[std::size_t(table_.index_of(id, "owned_slots"))];
  }
  /// Spare slots (owned, empty) of request `id` in `group`.
  [[nodiscard]] std::int32_t spare_slots(request_id id, int group) const
  {
    return std::int32_t(group_at(group, "spare_slots").spare[std::size_t(table_.index_of(id, "spare_slots"))].size());
  }
  /// Free slots of `group`.
  [[nodiscard]] std::int64_t free_slots(int group) const
  {
    return std::int64_t(group_at(group, "free_slots").free_stack.size());
  }
  /// Counters of `group` (see `group_counters`).
  [[nodiscard]] group_counters const& counters(int group) const { return group_at(group, "counters").counters; }
  /// Committed length of request `id`.
  [[nodiscard]] std::int32_t length(request_id id) const { return requests_[table_.index_of(id, "length")].length; }
  [[nodiscard]] int request_index(request_id id) const { return table_.index_of(id, "request_index"); }
  [[nodiscard]] std::size_t free_host_pages() const noexcept { return free_host_pages_; }
  [[nodiscard]] hierarchy_config const& config() const noexcept { return config_; }

  [[nodiscard]] std::uint32_t status() const noexcept { return status_; }
  void clear_status() noexcept { status_ = 0; }

 private:
  static constexpr std::int32_t pending = -2;

  struct request_state {
    std::int32_t length   = 0;
    std::int64_t capacity = 0;
    std::vector<std::byte> rows;  // [capacity][group][layer][row]
  };
  struct group_state {
    std::size_t row_bytes = 0;
    std::vector<std::byte> slab;
    std::vector<std::int32_t> owner, position;
    std::vector<policy_state> state;
    std::vector<std::uint32_t> touched, dirty;
    std::vector<std::int32_t> free_stack;
    std::int32_t limit = 0;
    std::vector<std::vector<std::int32_t>> owned;  // per request (per-request budgets)
    std::vector<std::int32_t> owned_count;         // per request
    std::vector<std::vector<std::int32_t>> spare;  // per request, a stack
    std::vector<std::int32_t> hand;                // per request (CLOCK)
    std::vector<std::vector<std::int32_t>> map;    // per request: position → slot
    std::vector<std::int32_t> dirty_list;
    std::vector<std::int32_t> tail_slots, slot_table;
    std::vector<miss> misses;
    std::uint32_t epoch = 0;
    group_counters counters{};
  };
  /// Selections of one row in one step, as the GPU aggregates them.
  struct context_sum {
    std::uint32_t count = 0;
    float best          = 0.f;
    bool scored         = false;
    void add(float score)
    {
      ++count;
      best   = scored ? std::max(best, score) : score;
      scored = true;
    }
    [[nodiscard]] selection_context context(std::uint32_t epoch, std::int32_t position, bool selected) const
    {
      if constexpr (Eviction::counts_selections) {
        return {epoch, position, count > 0 ? best : 0.f, count};
      } else {
        return {epoch, position, 0.f, selected ? 1u : 0u};
      }
    }
  };

  /// The state of `group`; throws `dhisparse::error` naming `what` when out of range.
  group_state const& group_at(int group, char const* what) const
  {
    table_.check_group(group, what);
    return groups_[std::size_t(group)];
  }

  static void clear_slot(group_state& gs, std::int32_t s)
  {
    gs.owner[s] = gs.position[s] = -1;
    gs.state[s]                  = 0;
    gs.touched[s] = gs.dirty[s] = 0;
  }

  // ---- the step contract: drafts, commit, abandon, leaving a step ------------------------

  /// Reference of the drafts kernel (detail/commit/kernels.cuh): query counts, parents,
  /// depths and positions of the current batch; num_drafts null keeps the counts and sets
  /// chains (set_batch). Entries that left the step (0 queries) stay out.
  void prepare_drafts(std::int32_t const* num_drafts, std::int32_t const* parents)
  {
    int const Q = config_.max_queries;
    for (int b = 0; b < config_.max_batch; ++b) {
      std::int32_t* parent   = parents_.data() + std::size_t(b) * Q;
      std::int32_t* depth    = depths_.data() + std::size_t(b) * Q;
      std::int32_t* position = positions_.data() + std::size_t(b) * Q;
      std::fill(parent, parent + Q, -1);
      std::fill(depth, depth + Q, 0);
      std::fill(position, position + Q, -1);
      if (b >= batch_count() || batch_queries_[b] == 0) { continue; }
      std::int32_t d = batch_queries_[b] - 1;
      bool tree      = false;
      if (num_drafts != nullptr) {
        d        = num_drafts[b];
        bool bad = d < 0 || d > Q - 1;
        if (!bad && parents != nullptr) {
          for (int q = 1; q <= d; ++q) {
            std::int32_t const p = parents[std::size_t(b) * Q + q];
            bad                  = bad || p < 0 || p >= q;
          }
          tree = true;
        }
        if (bad) {
          status_ |= status_invalid_drafts;
          d    = 0;
          tree = false;
        }
        batch_queries_[b] = 1 + d;
      }
      std::int32_t const len = requests_[batch_requests_[b]].length;
      for (int q = 0; q <= d; ++q) {
        parent[q]   = q == 0 ? -1 : tree ? parents[std::size_t(b) * Q + q] : q - 1;
        depth[q]    = q == 0 ? 0 : depth[parent[q]] + 1;
        position[q] = len + depth[q];
      }
    }
  }

  /// Whether tail entry j of batch entry b in `gs` is request r's tail row of this step.
  bool own_tail(group_state const& gs, int b, std::int32_t r, std::int32_t len, int j) const
  {
    std::int32_t const s = gs.tail_slots[std::size_t(b) * config_.max_queries + j];
    std::int64_t const p = std::int64_t(len) + j;
    return s >= 0 && gs.owner[s] == r && gs.position[s] == p && p < std::int64_t(gs.map[r].size()) &&
           gs.map[r][std::size_t(p)] == s;
  }

  /// An empty slot of request r back onto its spare stack.
  void make_spare(group_state& gs, std::int32_t r, std::int32_t s)
  {
    gs.position[s] = -1;
    gs.dirty[s]    = 0;
    if (gs.spare[r].size() < std::size_t(config_.max_queries)) { gs.spare[r].push_back(s); }
  }

  /**
   * The commit of batch entry b in one group, in the GPU's order (detail/commit/kernels.cuh
   * commit_group): every tail row of the step leaves the map; the slots of `path[0 .. kept)`
   * become the committed rows len … len + kept − 1 (dirty, on the dirty list); the other
   * tails (query order), then any row still mapped at or beyond the new length (an
   * uncommitted tail of an earlier resolve; position order), become spares.
   */
  void commit_group(group_state& gs, int b, std::int32_t r, std::int32_t len, std::vector<int> const& path,
                    int kept)
  {
    int const Q         = config_.max_queries;
    std::int32_t* tails = gs.tail_slots.data() + std::size_t(b) * Q;
    auto& map           = gs.map[r];
    for (int j = 0; j < Q; ++j) {
      if (own_tail(gs, b, r, len, j)) { map[std::size_t(len + j)] = -1; }
    }
    for (int k = 0; k < kept; ++k) {
      int const j          = path[std::size_t(k)];
      std::int32_t const s = tails[j];
      tails[j]             = -1;
      gs.position[s]       = len + k;
      map[std::size_t(len + k)] = s;
      if (gs.dirty_list.size() < dirty_capacity()) {
        gs.dirty_list.push_back(s);
      } else {
        status_ |= status_dirty_list_overflow;
      }
    }
    for (int j = 0; j < Q; ++j) {
      std::int32_t const s = tails[j];
      if (s < 0) { continue; }
      tails[j] = -1;
      if (gs.owner[s] == r && gs.position[s] == len + j) { make_spare(gs, r, s); }
    }
    std::int64_t const end = std::min<std::int64_t>(std::int64_t(len) + Q, std::int64_t(map.size()));
    for (std::int64_t p = std::int64_t(len) + kept; p < end; ++p) {
      std::int32_t const s = map[std::size_t(p)];
      if (s < 0) { continue; }
      map[std::size_t(p)] = -1;
      make_spare(gs, r, s);
    }
  }

  /**
   * Reference of the commit kernel (detail/commit/kernels.cuh): plain (`v` null: keep
   * accepted[b] tail rows, or all) or verified (keep the root and the accepted path), never
   * past a tail row that lacks a slot in some group.
   */
  void commit_rows(std::int32_t const* accepted, verified_step const* v)
  {
    int const Q = config_.max_queries;
    for (int b = 0; b < batch_count(); ++b) {
      std::int32_t const r  = batch_requests_[b];
      std::int32_t const nq = batch_queries_[b];
      std::int32_t const len = requests_[r].length;
      commit_status_[b] = 0;
      committed_[b]     = 0;
      if (nq == 0) { continue; }  // it left the step
      std::uint32_t bits = 0;
      std::vector<int> path;
      if (v == nullptr) {
        std::int32_t keep = accepted != nullptr ? accepted[b] : nq;
        if (keep < 0 || keep > nq) {
          bits |= status_invalid_accept_count;
          keep = 0;
        }
        for (int k = 0; k < keep; ++k) { path.push_back(k); }
      } else if (verified_output(*v, b)) {
        std::int32_t const a = v->accepted[b];
        if (a < 0 || a > nq - 1 || a > max_verify_drafts || (v->accepted_nodes != nullptr && a > v->max_drafts)) {
          bits |= status_invalid_accept_count;
        } else {
          path.push_back(0);
          for (int k = 1; k <= a; ++k) {
            std::int32_t const n = v->accepted_nodes ? v->accepted_nodes[std::size_t(b) * v->max_drafts + k - 1] : k;
            if (n <= path.back() || n >= nq || parents_[std::size_t(b) * Q + n] != path.back()) {
              bits |= status_invalid_accept_count;
              path.clear();
              break;
            }
            path.push_back(n);
          }
        }
      }
      int kept = 0;
      while (kept < int(path.size()) && std::all_of(groups_.begin(), groups_.end(), [&](group_state const& gs) {
               return own_tail(gs, b, r, len, path[std::size_t(kept)]);
             })) {
        ++kept;
      }
      if (kept < int(path.size())) { bits |= status_missing_tail; }
      for (auto& gs : groups_) { commit_group(gs, b, r, len, path, kept); }
      requests_[r].length += kept;
      committed_[b]     = kept;
      commit_status_[b] = bits;
      status_ |= bits;
      for (int q = 0; q < nq; ++q) { positions_[std::size_t(b) * Q + q] = len + kept + depths_[std::size_t(b) * Q + q]; }
      if (v != nullptr) { finish_verified(*v, b, nq, path, kept); }
    }
  }

  /// Whether verification produced tokens for entry b (its status is zero, its first
  /// emitted token is not -1).
  static bool verified_output(verified_step const& v, int b)
  {
    if (v.request_status != nullptr && v.request_status[b] != 0) { return false; }
    return v.emitted == nullptr || v.emitted[std::size_t(b) * (v.max_drafts + 1)] >= 0;
  }

  /// Verify's outputs cut to the committed rows; the draft ring kept in step.
  void finish_verified(verified_step const& v, int b, std::int32_t nq, std::vector<int> const& path, int kept)
  {
    if (v.emitted != nullptr) {
      std::int32_t* e = v.emitted + std::size_t(b) * (v.max_drafts + 1);
      std::int32_t const last = kept > 0 ? e[kept - 1] : -1;
      for (int i = kept; i <= v.max_drafts; ++i) { e[i] = -1; }
      if (v.next_token != nullptr) { v.next_token[b] = last; }
    }
    if (v.ring.capacity > 0) {
      int const ri = v.ring_index ? v.ring_index[b] : b;
      if (ri < 0 || ri >= v.ring.capacity) {
        *v.ring_status |= draft_ring_status::bad_request;
        return;
      }
      std::int32_t const keep = std::max(0, kept - 1);
      *v.ring_status |= draft_ring_keep_rows(v.ring, ri, nq - 1, keep, keep > 0 ? path.data() + 1 : nullptr, nq - 1);
    }
  }

  /// Reference of set_batch's abandon: every tail of the open step recycled, nothing kept.
  void abandon_step()
  {
    for (int b = 0; b < batch_count(); ++b) {
      if (batch_queries_[b] == 0) { continue; }
      std::int32_t const r = batch_requests_[b];
      for (auto& gs : groups_) { commit_group(gs, b, r, requests_[r].length, {}, 0); }
    }
  }

  /// Reference of release's first kernels: request `index` leaves the current step (its
  /// batch entry gets 0 queries, its tail entries and misses are dropped).
  void leave_step(int index)
  {
    int const Q = config_.max_queries;
    for (int b = 0; b < batch_count(); ++b) {
      if (batch_requests_[b] != index) { continue; }
      batch_queries_[b] = 0;
      for (auto& gs : groups_) {
        std::fill(gs.tail_slots.begin() + std::ptrdiff_t(b) * Q, gs.tail_slots.begin() + std::ptrdiff_t(b + 1) * Q, -1);
      }
      std::fill(positions_.begin() + std::ptrdiff_t(b) * Q, positions_.begin() + std::ptrdiff_t(b + 1) * Q, -1);
    }
    for (auto& gs : groups_) {
      gs.misses.erase(std::remove_if(gs.misses.begin(), gs.misses.end(), [&](miss const& m) { return m.request == index; }),
                      gs.misses.end());
    }
  }

  /// The `n` evictable rows of request r with the smallest (key, position).
  std::vector<std::int32_t> smallest_keys(group_state& gs, std::int32_t r, std::uint32_t epoch, int n)
  {
    std::vector<std::tuple<std::uint64_t, std::int32_t, std::int32_t>> candidates;  // key, position, slot
    for (std::int32_t s : gs.owned[r]) {
      std::int32_t const pos = gs.position[s];
      if (pos < 0 || gs.touched[s] == epoch || gs.dirty[s] != 0) { continue; }
      candidates.emplace_back(Eviction::eviction_key(gs.state[s], pos), pos, s);
    }
    if (std::size_t(n) < candidates.size()) {
      std::nth_element(candidates.begin(), candidates.begin() + n, candidates.end());
      candidates.resize(std::size_t(n));
    }
    std::sort(candidates.begin(), candidates.end());
    std::vector<std::int32_t> out;
    for (int i = 0; i < n && i < int(candidates.size()); ++i) {
      out.push_back(std::get<2>(candidates[i]));
      gs.touched[out.back()] = epoch;
    }
    return out;
  }

  /// CLOCK: the hand sweeps request r's owned list, at most twice around.
  std::vector<std::int32_t> sweep(group_state& gs, std::int32_t r, std::uint32_t epoch, int n)
  {
    std::vector<std::int32_t> out;
    auto const& owned = gs.owned[r];
    int const size    = int(owned.size());
    if (size == 0) { return out; }
    int hand = gs.hand[r] % size;
    for (int steps = 0; int(out.size()) < n && steps < 2 * size; ++steps) {
      std::int32_t const s = owned[hand];
      hand                 = (hand + 1) % size;
      if (gs.position[s] < 0 || gs.touched[s] == epoch || gs.dirty[s] != 0) { continue; }
      if constexpr (Eviction::search == victim_search::sweep) {
        if (Eviction::referenced(gs.state[s])) {
          gs.state[s] = Eviction::clear_reference(gs.state[s]);
          continue;
        }
      }
      out.push_back(s);
      gs.touched[s] = epoch;
    }
    gs.hand[r] = hand;
    return out;
  }

  /// Releases up to `want` clean rows not touched in `pin_epoch` (0: none pinned) in the
  /// budget's reclaim order (reclaim.cuh).
  void reclaim_rows(int group, std::int32_t want, std::uint32_t pin_epoch)
  {
    if (want <= 0) { return; }
    auto& gs           = groups_[group];
    int owner_bits     = 1;
    while ((1 << owner_bits) <= std::max(config_.max_requests - 1, 1)) { ++owner_bits; }
    // (key, tie-break, slot) of every eligible row.
    std::vector<std::tuple<std::uint64_t, std::uint64_t, std::int32_t>> rows;
    std::vector<std::int64_t> eligible(config_.max_requests, 0);
    for (std::int32_t s = 0; s < gs.limit; ++s) {
      std::int32_t const owner = gs.owner[s], pos = gs.position[s];
      if (owner < 0 || pos < 0 || gs.dirty[s] != 0 || (pin_epoch != 0 && gs.touched[s] == pin_epoch)) { continue; }
      rows.emplace_back(Eviction::eviction_key(gs.state[s], pos), (std::uint64_t(pos) << owner_bits) | owner, s);
      ++eligible[owner];
    }
    std::vector<std::int32_t> released;
    if (Budget::reclaim == reclaim_order::fair_share) {
      auto const give = [&](int r, long long level) {
        long long const x = (long long)gs.owned_count[r] - ledger_.floor(r) - level;
        return std::clamp<long long>(x, 0, eligible[r]);
      };
      auto const sum_at = [&](long long level) {
        long long s = 0;
        for (int r = 0; r < config_.max_requests; ++r) { s += give(r, level); }
        return s;
      };
      long long lo = -(1ll << 33), hi = 1ll << 33;
      while (hi - lo > 1) {
        long long const mid = lo + (hi - lo) / 2;
        (sum_at(mid) >= want ? lo : hi) = mid;
      }
      long long remainder = want - sum_at(lo + 1);
      std::vector<long long> target(config_.max_requests);
      for (int r = 0; r < config_.max_requests; ++r) {
        target[r] = give(r, lo + 1);
        if (give(r, lo) > give(r, lo + 1) && remainder > 0) {
          ++target[r];
          --remainder;
        }
      }
      // Each owner's target smallest rows (bucket by owner, select), then in global order.
      std::vector<std::size_t> begin(config_.max_requests + 1, 0);
      for (int r = 0; r < config_.max_requests; ++r) { begin[r + 1] = begin[r] + eligible[r]; }
      std::vector<std::tuple<std::uint64_t, std::uint64_t, std::int32_t>> bucketed(rows.size());
      std::vector<std::size_t> fill(begin.begin(), begin.end() - 1);
      for (auto const& row : rows) { bucketed[fill[gs.owner[std::get<2>(row)]]++] = row; }
      std::vector<std::tuple<std::uint64_t, std::uint64_t, std::int32_t>> picked;
      for (int r = 0; r < config_.max_requests; ++r) {
        auto const b = bucketed.begin() + std::ptrdiff_t(begin[r]);
        auto const e = bucketed.begin() + std::ptrdiff_t(begin[r + 1]);
        auto const t = std::min<long long>(target[r], e - b);
        if (t <= 0) { continue; }
        std::nth_element(b, b + t, e);
        picked.insert(picked.end(), b, b + t);
      }
      std::sort(picked.begin(), picked.end());
      for (auto const& row : picked) { released.push_back(std::get<2>(row)); }
    } else {
      if (std::size_t(want) < rows.size()) {
        std::nth_element(rows.begin(), rows.begin() + want, rows.end());
        rows.resize(std::size_t(want));
      }
      std::sort(rows.begin(), rows.end());
      for (auto const& row : rows) { released.push_back(std::get<2>(row)); }
    }
    for (std::int32_t s : released) {
      std::int32_t const owner = gs.owner[s];
      gs.map[owner][gs.position[s]] = -1;
      clear_slot(gs, s);
      gs.free_stack.push_back(s);
      --gs.owned_count[owner];
    }
    gs.counters.reclaimed_rows += released.size();
    ++gs.counters.reclaims;
  }

  /// Reference of the prewarm kernel (detail/hierarchy/kernels.cuh), chunk by chunk.
  void prewarm_rows(int r, int group, std::int32_t first, std::int32_t count)
  {
    auto& gs               = groups_[group];
    std::int32_t const len = requests_[r].length;
    std::int64_t const chunk = std::int64_t{1} << 16;  // kv_hierarchy::prewarm_chunk
    std::int32_t const lo  = first >= 0 ? first : std::max(0, len - count);
    std::int32_t const hi  = first >= 0 ? std::int32_t(std::min<std::int64_t>(len, std::int64_t(first) + count)) : len;
    for (std::int64_t c = 0; c * chunk < count; ++c) {
      std::int32_t const end   = std::int32_t(hi - c * chunk);
      std::int32_t const begin = std::int32_t(std::max<std::int64_t>(lo, end - chunk));
      int room = std::max<int>(0, int(gs.free_stack.size()) - (reclaims ? config_.reclaim_low_watermark : 0));
      if constexpr (per_request) { room = std::min(room, std::max(0, ledger_.cap(r) - gs.owned_count[r])); }
      std::vector<std::int32_t> chosen;  // descending
      for (std::int32_t pos = end - 1; pos >= begin && int(chosen.size()) < room; --pos) {
        if (gs.map[r][pos] == -1) { chosen.push_back(pos); }
      }
      std::reverse(chosen.begin(), chosen.end());
      std::vector<miss> rows;
      for (std::int32_t pos : chosen) {
        std::int32_t const s = gs.free_stack.back();
        gs.free_stack.pop_back();
        gs.owner[s]    = r;
        gs.position[s] = pos;
        gs.state[s]    = Eviction::on_insert(selection_context{gs.epoch, pos, 0.f, 0u});
        gs.touched[s]  = 0;
        gs.dirty[s]    = 0;
        gs.map[r][pos] = s;
        if constexpr (per_request) { gs.owned[r].push_back(s); }
        rows.push_back({r, pos, s});
      }
      gs.owned_count[r] += int(chosen.size());
      gs.counters.prewarmed_rows += chosen.size();
      copy_rows(group, rows, 0, config_.group_layers[group]);
    }
  }

  void copy_rows(int group, std::vector<miss> const& rows, int layer_begin, int layer_end)
  {
    auto& gs                = groups_[group];
    std::size_t const begin = std::size_t(layer_begin) * RowFormat::bytes;
    std::size_t const bytes = std::size_t(layer_end - layer_begin) * RowFormat::bytes;
    for (auto const& m : rows) {
      std::memcpy(gs.slab.data() + std::size_t(m.slot) * gs.row_bytes + begin,
                  store_row(m.request, group, m.position) + begin, bytes);
    }
  }

  std::size_t pages_for(std::int64_t capacity) const
  {
    return std::size_t((capacity + config_.host.tokens_per_page - 1) / config_.host.tokens_per_page);
  }
  /// Positions whole pages back for `capacity`, up to max_context.
  std::int64_t backed(std::int64_t capacity) const
  {
    return std::min<std::int64_t>(std::int64_t(pages_for(capacity)) * config_.host.tokens_per_page,
                                  config_.max_context);
  }
  std::size_t dirty_capacity() const
  {
    return std::size_t(config_.max_batch) * config_.max_queries * config_.backup_interval_steps;
  }

  void check_pages(int index, std::int64_t capacity) const
  {
    std::size_t const have = pages_for(requests_[index].capacity);
    std::size_t const want = pages_for(capacity);
    DHISPARSE_EXPECTS(want <= have || want - have <= free_host_pages_,
                      "host store exhausted: " + std::to_string(want - have) + " pages needed, " +
                        std::to_string(free_host_pages_) + " free");
  }

  /// Runs `allocate`; a failed allocation becomes a `dhisparse::error` that names it (what
  /// was allocated before stays as it was: vector growth has the strong guarantee).
  template <class F>
  static void allocating(std::string const& what, std::size_t bytes, F&& allocate)
  {
    try {
      allocate();
    } catch (std::bad_alloc const&) {
      throw error("host::kv_hierarchy: allocation failed: " + what + ", " + std::to_string(bytes) + " bytes");
    } catch (std::length_error const&) {
      throw error("host::kv_hierarchy: allocation failed: " + what + ", " + std::to_string(bytes) + " bytes");
    }
  }

  /// Rows and map entries first, then the counts: a failed allocation changes nothing.
  void grow(int index, std::int64_t capacity)
  {
    auto& rq = requests_[index];
    if (capacity > rq.capacity) {
      std::size_t const have   = pages_for(rq.capacity);
      std::size_t const want   = pages_for(capacity);
      std::int64_t const whole = backed(capacity);  // like the real store: whole pages
      allocating("host-store rows of request index " + std::to_string(index),
                 std::size_t(whole) * total_row_bytes_, [&] {
                   rq.rows.resize(std::size_t(whole) * total_row_bytes_);
                   for (auto& gs : groups_) { gs.map[index].resize(std::size_t(whole), -1); }
                 });
      free_host_pages_ -= want - have;
      rq.capacity = whole;
    }
    ledger_.set(index, rq.capacity);
  }

  std::byte* store_row(int index, int group, std::int32_t position)
  {
    return requests_[index].rows.data() + std::size_t(position) * total_row_bytes_ + group_offset_[group];
  }

  hierarchy_config config_;
  detail::budget_ledger<Budget> ledger_;
  std::vector<std::size_t> group_offset_;
  std::size_t total_row_bytes_ = 0;
  std::vector<group_state> groups_;
  std::vector<request_state> requests_;
  detail::request_table table_{config_};
  std::size_t free_host_pages_ = 0;
  std::vector<std::int32_t> batch_requests_, batch_queries_;
  std::vector<std::int32_t> parents_, depths_, positions_;  // [max_batch][max_queries]
  std::vector<std::uint32_t> commit_status_;                // [max_batch]
  std::vector<std::int32_t> committed_;                     // [max_batch]
  std::uint32_t status_ = 0;
};

}  // namespace dhisparse::host
