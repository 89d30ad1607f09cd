/**
 * @file host_backend.hpp
 * @brief The soak driver's view of `host::kv_hierarchy` (the reference backend).
 *
 * `host::kv_hierarchy` has no public per-slot owner or position, so this backend cannot
 * show them (`shows_slots` false): slot ownership is checked through the slot tables
 * (one (request, position) per slot) and the bytes each slot holds.
 */
#pragma once

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/policy/concepts.hpp>

#include "soak.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dhisparse::test::soak {

template <class Row, class Eviction, class Budget>
class host_backend {
 public:
  using hierarchy_type = host::kv_hierarchy<Row, Eviction, Budget>;
  static constexpr std::size_t row_bytes = Row::bytes;
  static constexpr bool shared_budget    = Budget::kind == budget_kind::shared;
  static constexpr bool shows_slots      = false;

  explicit host_backend(hierarchy_config const& c) : h_{c} {}

  hierarchy_type& hierarchy() { return h_; }
  [[nodiscard]] hierarchy_config const& config() const { return h_.config(); }

  void admit(request_id id, std::int32_t length, std::int64_t capacity) { h_.admit(id, length, capacity); }
  void reserve(request_id id, std::int64_t capacity) { h_.reserve(id, capacity); }
  void release(request_id id) { h_.release(id); }
  [[nodiscard]] bool contains(request_id id) const { return h_.contains(id); }
  [[nodiscard]] std::size_t num_requests() const { return h_.num_requests(); }
  [[nodiscard]] int request_index(request_id id) const { return h_.request_index(id); }
  [[nodiscard]] std::byte* host_row(request_id id, int g, int l, std::int64_t p) { return h_.host_row(id, g, l, p); }
  [[nodiscard]] std::size_t free_host_pages() const { return h_.free_host_pages(); }
  [[nodiscard]] std::int64_t floor_sum() const { return h_.floor_sum(); }
  [[nodiscard]] std::int64_t pool_limit(int g) const { return h_.pool_limit(g); }
  void set_pool_limit(int g, std::int64_t limit) { h_.set_pool_limit(g, limit); }
  void reclaim(int g, std::int32_t free_slots) { h_.reclaim(g, free_slots); }
  void prewarm(request_id id, std::int32_t count) { h_.prewarm(id, count); }

  void set_batch(std::vector<request_id> const& ids, std::vector<std::int32_t> const& queries)
  {
    h_.set_batch(ids.data(), queries.data(), int(ids.size()));
  }
  /// A resolve alone (bad-argument checks only: it must throw before doing anything).
  void resolve_only(int g, std::vector<std::int32_t> const& sel, int top_k) { h_.resolve(g, sel.data(), top_k); }
  void retrieve_only(int g, int layer_begin, int layer_end) { h_.retrieve(g, layer_begin, layer_end); }

  /// Every group: resolve, retrieve, then the model writes its tail rows.
  std::vector<group_view> layers(layer_inputs const& in)
  {
    hierarchy_config const& c = h_.config();
    std::vector<group_view> views;
    for (int g = 0; g < c.num_groups(); ++g) {
      bool const scored = Eviction::needs_scores || flip_++ % 2 == 0;
      h_.resolve(g, in.selections[g].data(), in.top_k, scored ? in.scores[g].data() : nullptr);
      h_.retrieve(g);
      layer_view const rows = h_.layer_rows(g, 0);  // layer 0 starts each slot's group row
      std::size_t const grb = rows.stride;
      int const tails       = c.max_batch * c.max_queries;
      for (int e = 0; e < tails; ++e) {
        std::int32_t const s = h_.tail_slots(g)[e];
        if (s >= 0) { std::memcpy(rows.rows + std::size_t(s) * grb, in.tail_rows[g].data() + std::size_t(e) * grb, grb); }
      }
      group_view v;
      std::size_t const entries = std::size_t(c.max_batch) * c.max_queries * in.top_k;
      // Constructed, not assign()ed: GCC 12 warns of a null memmove in vector::assign (-Wnonnull).
      v.slot_table = std::vector<std::int32_t>(h_.slot_table(g), h_.slot_table(g) + entries);
      v.tail_slots = std::vector<std::int32_t>(h_.tail_slots(g), h_.tail_slots(g) + tails);
      v.slab      = rows.rows;
      v.row_bytes = grb;
      v.num_slots = std::int32_t(c.device_slots_per_group);
      views.push_back(std::move(v));
    }
    return views;
  }

  void commit(std::vector<std::int32_t> const* accepted) { h_.commit(accepted != nullptr ? accepted->data() : nullptr); }
  void backup() { h_.backup(); }
  void sync() {}
  void stall() {}  ///< nothing is ever in flight
  [[nodiscard]] std::uint32_t status() const { return h_.status(); }
  void clear_status() { h_.clear_status(); }

  [[nodiscard]] soak::accounting slots(int g) const
  {
    soak::accounting a;
    a.owned = h_.owned_slots(g);
    a.free  = h_.free_slots(g);
    a.limit = h_.pool_limit(g);
    return a;
  }

 private:
  hierarchy_type h_;
  unsigned flip_ = 0;
};

}  // namespace dhisparse::test::soak
