/**
 * @file host/hierarchy.hpp
 * @brief Plain-C++ reference of `kv_hierarchy`: the oracle of the GPU tests and the
 *        backend of the examples on machines without a GPU.
 *
 * Same configuration, same step API (minus streams: every call completes before it
 * returns) and the same decisions: which rows hit, which are fetched, which are evicted
 * (the eviction policy's order), what every slot holds. Slot *numbers* may differ from
 * the GPU's (the GPU's free stack is popped concurrently), so comparisons are made on
 * positions and bytes, not on slot ids.
 *
 * It is written as directly as possible — maps, sorted lists, sequential loops — so that
 * it can be checked by reading. Its host store is one byte vector per request, laid out
 * `[position][group][layer][row bytes]`, and is sized like the real one (same page
 * accounting, so "host store exhausted" happens at the same point).
 */
#pragma once

#include <dhisparse/detail/policy_traits.hpp>
#include <dhisparse/detail/request_table.hpp>
#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/policy/lru.cuh>
#include <dhisparse/policy/static_budget.cuh>
#include <dhisparse/row_format.cuh>
#include <dhisparse/status.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dhisparse::host {

template <class RowFormat, class Eviction = policy::lru,
          class Budget = policy::static_budget<4096>>
class kv_hierarchy {
  static_assert(is_row_format_v<RowFormat>, "RowFormat: see row_format.cuh");
  static_assert(is_eviction_policy_v<Eviction>, "Eviction: see policy/lru.cuh");
  static_assert(is_budget_policy_v<Budget>, "Budget: see policy/static_budget.cuh");

 public:
  using row_format = RowFormat;

  /// One fetched row of the last resolve of a group.
  struct miss {
    std::int32_t request;  ///< request index
    std::int32_t position;
    std::int32_t slot;
  };

  explicit kv_hierarchy(hierarchy_config config) : config_{std::move(config)}
  {
    detail::validate(config_, Budget::slots_per_request);
    int const groups = config_.num_groups();
    for (int g = 0; g < groups; ++g) {
      group_offset_.push_back(total_row_bytes_);
      total_row_bytes_ += std::size_t(config_.group_layers[g]) * RowFormat::bytes;
    }
    std::size_t const slots = std::size_t(config_.device_slots_per_group);
    groups_.resize(groups);
    for (int g = 0; g < groups; ++g) {
      auto& gs = groups_[g];
      gs.row_bytes = std::size_t(config_.group_layers[g]) * RowFormat::bytes;
      gs.slab.assign(slots * gs.row_bytes, std::byte{0});
      gs.owner.assign(slots, -1);
      gs.position.assign(slots, -1);
      gs.state.assign(slots, 0);
      gs.touched.assign(slots, 0);
      gs.dirty.assign(slots, 0);
      for (std::size_t s = slots; s-- > 0;) { gs.free_stack.push_back(std::int32_t(s)); }
      gs.owned.resize(config_.max_requests);
      gs.map.resize(config_.max_requests);
      gs.tail_slots.assign(std::size_t(config_.max_batch) * config_.max_queries, -1);
      gs.slot_table.assign(config_.step_entries(), -1);
    }
    requests_.resize(config_.max_requests);
    free_host_pages_ = config_.host.capacity_pages;
  }

  // ---- requests -------------------------------------------------------------------------

  void admit(request_id id, std::int32_t length, std::int64_t capacity = -1)
  {
    int const index = table_.check_admit(id, length, capacity);
    grow(index, capacity);
    table_.insert(id);
    requests_[index].length = length;
  }

  void reserve(request_id id, std::int64_t capacity)
  {
    int const index = table_.index_of(id, "reserve");
    table_.check_reserve(capacity);
    grow(index, capacity);
  }

  void release(request_id id)
  {
    int const index = table_.index_of(id, "release");
    for (auto& gs : groups_) {
      gs.dirty_list.erase(std::remove_if(gs.dirty_list.begin(), gs.dirty_list.end(),
                                         [&](std::int32_t s) { return gs.owner[s] == index; }),
                          gs.dirty_list.end());
      for (std::int32_t s : gs.owned[index]) {
        gs.owner[s] = gs.position[s] = -1;
        gs.state[s] = gs.touched[s] = gs.dirty[s] = 0;
        gs.free_stack.push_back(s);
      }
      gs.owned[index].clear();
      gs.map[index].clear();
    }
    auto& rq = requests_[index];
    free_host_pages_ += pages_for(rq.capacity);
    rq = request_state{};
    table_.erase(id);
  }

  [[nodiscard]] bool contains(request_id id) const { return table_.contains(id); }
  [[nodiscard]] std::size_t num_requests() const noexcept { return table_.size(); }

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

  // ---- batch ----------------------------------------------------------------------------

  void set_batch(request_id const* ids, std::int32_t const* queries, int count)
  {
    batch_requests_ = table_.batch_indices(ids, queries, count);
    batch_queries_.assign(queries, queries + count);
  }

  [[nodiscard]] int batch_count() const noexcept { return int(batch_requests_.size()); }

  // ---- step -----------------------------------------------------------------------------

  /// Reference of resolve.cuh; `selections` is host memory [max_batch][max_queries][top_k].
  void resolve(int group, std::int32_t const* selections, int top_k)
  {
    table_.check_resolve(group, selections, top_k);
    auto& gs = groups_[group];
    ++gs.epoch;
    gs.misses.clear();
    std::fill(gs.tail_slots.begin(), gs.tail_slots.end(), -1);
    gs.slot_table.assign(std::size_t(config_.max_batch) * config_.max_queries * top_k, -1);
    for (int b = 0; b < batch_count(); ++b) {
      std::int32_t const r   = batch_requests_[b];
      std::int32_t const nq  = batch_queries_[b];
      std::int32_t const len = requests_[r].length;
      auto& map              = gs.map[r];
      // 1. lookup: hits are pinned (policy updated once), misses collected once each.
      std::vector<std::int32_t> misses;
      std::unordered_set<std::int32_t> claimed;
      for (int q = 0; q < nq; ++q) {
        std::int32_t const* query = selections + (std::size_t(b) * config_.max_queries + q) * top_k;
        for (int k = 0; k < top_k; ++k) {
          std::int32_t const pos = query[k];
          if (pos == -1) { continue; }
          if (!valid_selection(query, k, pos, len + q)) {
            status_ |= status_invalid_selection;
            continue;
          }
          if (pos >= len) { continue; }
          if (pos >= std::int32_t(map.size())) {
            status_ |= status_capacity_exceeded;
            continue;
          }
          std::int32_t const slot = map[pos];
          if (slot >= 0) {
            if (gs.touched[slot] != gs.epoch) {
              gs.touched[slot] = gs.epoch;
              gs.state[slot]   = Eviction::on_hit(gs.state[slot], gs.epoch);
            }
          } else if (claimed.insert(pos).second) {
            misses.push_back(pos);
          }
        }
      }
      // 2. allocate: tails first, then misses; free pool while under budget, then the
      //    request's own evictable rows, smallest key first.
      int tails = 0;
      while (tails < nq) {
        std::int32_t const pos = len + tails;
        if (pos >= std::int32_t(map.size()) || pos >= requests_[r].capacity) {
          status_ |= status_capacity_exceeded;
          break;
        }
        if (map[pos] != -1) {
          status_ |= status_uncommitted_tail;
          break;
        }
        ++tails;
      }
      int const need  = int(misses.size()) + tails;
      auto& owned     = gs.owned[r];
      int const owned_n = int(owned.size());
      int const want  = std::min(need, std::max(0, Budget::slots_per_request - owned_n));
      int const take  = std::min(want, int(gs.free_stack.size()));
      if (take < want) { status_ |= status_pool_exhausted; }
      std::vector<std::int32_t> slots;
      for (int i = 0; i < take; ++i) {
        std::int32_t const s = gs.free_stack.back();
        gs.free_stack.pop_back();
        gs.owner[s] = r;
        slots.push_back(s);
      }
      int const evict = need - take;
      if (evict > 0) {
        std::vector<std::pair<std::uint64_t, std::int32_t>> candidates;  // (key, slot)
        for (int i = 0; i < owned_n; ++i) {
          std::int32_t const s = owned[i];
          if (gs.touched[s] == gs.epoch || gs.dirty[s] != 0) { continue; }
          std::uint64_t const k =
            gs.position[s] < 0 ? std::uint64_t(i)
                               : (std::uint64_t{1} << 63) | Eviction::eviction_key(gs.state[s], gs.position[s]);
          candidates.emplace_back(k, s);
        }
        std::sort(candidates.begin(), candidates.end());
        if (int(candidates.size()) < evict) { status_ |= status_budget_exceeded; }
        for (int i = 0; i < evict && i < int(candidates.size()); ++i) {
          std::int32_t const s = candidates[i].second;
          if (gs.position[s] >= 0) { map[gs.position[s]] = -1; }
          slots.push_back(s);
        }
      }
      owned.insert(owned.end(), slots.begin(), slots.begin() + take);
      int const total = int(slots.size());
      if (total < tails) { status_ |= status_budget_exceeded; }
      for (int i = 0; i < total; ++i) {
        std::int32_t const s   = slots[i];
        bool const tail        = i < tails;
        std::int32_t const pos = tail ? len + i : misses[i - tails];
        gs.position[s] = pos;
        gs.state[s]    = Eviction::on_insert(gs.epoch);
        gs.touched[s]  = gs.epoch;
        gs.dirty[s]    = tail ? 1 : 0;
        map[pos]       = s;
        if (tail) {
          gs.tail_slots[std::size_t(b) * config_.max_queries + i] = s;
        } else {
          gs.misses.push_back({r, pos, s});
        }
      }
      // 3. slot table.
      for (int q = 0; q < nq; ++q) {
        std::size_t const row     = (std::size_t(b) * config_.max_queries + q) * top_k;
        std::int32_t const* query = selections + row;
        for (int k = 0; k < top_k; ++k) {
          std::int32_t const pos = query[k];
          if (pos != -1 && valid_selection(query, k, pos, len + q) && pos < std::int32_t(map.size())) {
            gs.slot_table[row + k] = map[pos];
          }
        }
      }
    }
  }

  /// Copies the rows of the last resolve's misses of `group` from the host store.
  void retrieve(int group, int layer_begin = 0, int layer_end = -1)
  {
    table_.check_retrieve(group, layer_begin, layer_end);
    auto& gs                = groups_[group];
    std::size_t const begin = std::size_t(layer_begin) * RowFormat::bytes;
    std::size_t const bytes = std::size_t(layer_end - layer_begin) * RowFormat::bytes;
    for (auto const& m : gs.misses) {
      std::memcpy(gs.slab.data() + std::size_t(m.slot) * gs.row_bytes + begin,
                  store_row(m.request, group, m.position) + begin, bytes);
    }
  }

  /// Reference of commit.cuh; `accepted` is host memory [batch] or nullptr.
  void commit(std::int32_t const* accepted)
  {
    for (int b = 0; b < batch_count(); ++b) {
      std::int32_t const r  = batch_requests_[b];
      std::int32_t const nq = batch_queries_[b];
      std::int32_t keep     = accepted != nullptr ? accepted[b] : nq;
      if (keep < 0 || keep > nq) {
        status_ |= status_invalid_accept_count;
        keep = 0;
      }
      for (auto& gs : groups_) {
        for (int j = 0; j < nq; ++j) {
          std::int32_t& s = gs.tail_slots[std::size_t(b) * config_.max_queries + j];
          if (s < 0) { continue; }
          if (j < keep) {
            if (gs.dirty_list.size() < dirty_capacity()) {
              gs.dirty_list.push_back(s);
            } else {
              status_ |= status_dirty_list_overflow;
            }
          } else {
            gs.map[r][gs.position[s]] = -1;
            gs.position[s]            = -1;
            gs.dirty[s]               = 0;
          }
          s = -1;
        }
      }
      requests_[r].length += keep;
    }
  }

  /// Copies every committed, not yet backed-up row to the host store; they become clean.
  void backup()
  {
    for (int g = 0; g < config_.num_groups(); ++g) {
      auto& gs = groups_[g];
      for (std::int32_t s : gs.dirty_list) {
        std::memcpy(store_row(gs.owner[s], g, gs.position[s]),
                    gs.slab.data() + std::size_t(s) * gs.row_bytes, gs.row_bytes);
        gs.dirty[s] = 0;
      }
      gs.dirty_list.clear();
    }
  }

  // ---- views ----------------------------------------------------------------------------

  /// Slot table of the last resolve of `group`: [max_batch][max_queries][top_k].
  [[nodiscard]] std::int32_t const* slot_table(int group) const { return groups_.at(group).slot_table.data(); }
  /// Tail slots of the last resolve of `group`: [max_batch][max_queries], -1 = none.
  [[nodiscard]] std::int32_t const* tail_slots(int group) const { return groups_.at(group).tail_slots.data(); }
  /// Rows of one layer of `group`'s slab.
  [[nodiscard]] layer_view layer_rows(int group, int layer)
  {
    table_.check_layer(group, layer, "layer_rows");
    auto& gs = groups_[group];
    return {gs.slab.data() + std::size_t(layer) * RowFormat::bytes, gs.row_bytes};
  }
  /// Rows fetched by the last resolve of `group`.
  [[nodiscard]] std::vector<miss> const& misses(int group) const { return groups_.at(group).misses; }
  /// Positions of request `id` resident in `group`, ascending.
  [[nodiscard]] std::vector<std::int32_t> resident_positions(request_id id, int group) const
  {
    int const index = table_.index_of(id, "resident_positions");
    std::vector<std::int32_t> out;
    auto const& map = groups_.at(group).map[index];
    for (std::size_t p = 0; p < map.size(); ++p) {
      if (map[p] >= 0) { out.push_back(std::int32_t(p)); }
    }
    return out;
  }
  /// Committed length of request `id`.
  [[nodiscard]] std::int32_t length(request_id id) const { return requests_[table_.index_of(id, "length")].length; }
  [[nodiscard]] int request_index(request_id id) const { return table_.index_of(id, "request_index"); }
  [[nodiscard]] std::size_t free_host_pages() const noexcept { return free_host_pages_; }
  [[nodiscard]] hierarchy_config const& config() const noexcept { return config_; }

  [[nodiscard]] std::uint32_t status() const noexcept { return status_; }
  void clear_status() noexcept { status_ = 0; }

 private:
  struct request_state {
    std::int32_t length   = 0;
    std::int64_t capacity = 0;
    std::vector<std::byte> rows;  // [capacity][group][layer][row]
  };
  struct group_state {
    std::size_t row_bytes = 0;
    std::vector<std::byte> slab;
    std::vector<std::int32_t> owner, position;
    std::vector<std::uint32_t> state, touched, dirty;
    std::vector<std::int32_t> free_stack;
    std::vector<std::vector<std::int32_t>> owned;  // per request
    std::vector<std::vector<std::int32_t>> map;    // per request: position → slot
    std::vector<std::int32_t> dirty_list;
    std::vector<std::int32_t> tail_slots, slot_table;
    std::vector<miss> misses;
    std::uint32_t epoch = 0;
  };

  static bool valid_selection(std::int32_t const* query, int k, std::int32_t p, std::int32_t limit)
  {
    if (p < 0 || p > limit) { return false; }
    return k == 0 || (query[k - 1] >= 0 && query[k - 1] < p);
  }

  std::size_t pages_for(std::int64_t capacity) const
  {
    return std::size_t((capacity + config_.host.tokens_per_page - 1) / config_.host.tokens_per_page);
  }
  std::size_t dirty_capacity() const
  {
    return std::size_t(config_.max_batch) * config_.max_queries * config_.backup_interval_steps;
  }

  void grow(int index, std::int64_t capacity)
  {
    auto& rq = requests_[index];
    if (capacity <= rq.capacity) { return; }
    std::size_t const have = pages_for(rq.capacity);
    std::size_t const want = pages_for(capacity);
    DHISPARSE_EXPECTS(want - have <= free_host_pages_,
                      "host store exhausted: " + std::to_string(want - have) + " pages needed, " +
                        std::to_string(free_host_pages_) + " free");
    free_host_pages_ -= want - have;
    // Like the real store, capacity is whole pages.
    std::int64_t const backed = std::int64_t(want) * config_.host.tokens_per_page;
    rq.capacity               = std::min<std::int64_t>(backed, config_.max_context);
    rq.rows.resize(std::size_t(rq.capacity) * total_row_bytes_);
    for (auto& gs : groups_) { gs.map[index].resize(std::size_t(rq.capacity), -1); }
  }

  std::byte* store_row(int index, int group, std::int32_t position)
  {
    return requests_[index].rows.data() + std::size_t(position) * total_row_bytes_ + group_offset_[group];
  }

  hierarchy_config config_;
  std::vector<std::size_t> group_offset_;
  std::size_t total_row_bytes_ = 0;
  std::vector<group_state> groups_;
  std::vector<request_state> requests_;
  detail::request_table table_{config_};
  std::size_t free_host_pages_ = 0;
  std::vector<std::int32_t> batch_requests_, batch_queries_;
  std::uint32_t status_ = 0;
};

}  // namespace dhisparse::host
