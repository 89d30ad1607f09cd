/**
 * @file detail/budget_ledger.hpp
 * @brief Host-side accounting of budget floors and pool limits, shared by `kv_hierarchy`
 *        and its host reference (plain C++): a request is admitted, grown or a pool shrunk
 *        only while the floors of all admitted requests fit every group's pool limit.
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/policy/concepts.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dhisparse::detail {

template <class Budget>
class budget_ledger {
 public:
  /// Checks the budget against the configuration (throws naming what does not fit).
  explicit budget_ledger(hierarchy_config const& c)
    : config_{c},
      floors_(std::size_t(c.max_requests), 0),
      caps_(std::size_t(c.max_requests), 0),
      limits_(c.group_layers.size(), c.device_slots_per_group)
  {
    std::int64_t const essential = essential_floor(inputs(c.max_context));
    if constexpr (Budget::kind == budget_kind::per_request) {
      std::int64_t const cap = Budget::cap(inputs(c.max_context));
      DHISPARSE_EXPECTS(cap >= essential,
                        "budget policy: a request's cap (" + std::to_string(cap) +
                          " slots) is smaller than its essential set (" + std::to_string(essential) +
                          " = selections min(max_context, max_queries × max_top_k) + max_queries × "
                          "(backup_interval_steps + 2))");
    }
    std::int64_t const smallest = Budget::floor(inputs(std::min<std::int64_t>(c.max_context, c.max_queries)));
    DHISPARSE_EXPECTS(c.device_slots_per_group >= smallest,
                      "hierarchy_config.device_slots_per_group (" + std::to_string(c.device_slots_per_group) +
                        ") is too small for the essential floor of one request (" + std::to_string(smallest) + ")");
  }

  [[nodiscard]] budget_inputs inputs(std::int64_t capacity) const noexcept
  {
    return {capacity, config_.max_queries, config_.max_top_k, config_.backup_interval_steps};
  }
  [[nodiscard]] std::int64_t floor_at(std::int64_t capacity) const { return Budget::floor(inputs(capacity)); }
  [[nodiscard]] std::int32_t cap_at(std::int64_t capacity) const
  {
    return std::int32_t(std::min<std::int64_t>(Budget::cap(inputs(capacity)), unlimited_slots));
  }

  /// Throws naming `what`, changing nothing, if `request` at `capacity` would not fit.
  void check(int request, std::int64_t capacity, char const* what) const
  {
    std::int64_t const sum = sum_ - floors_[request] + floor_at(capacity);
    for (std::size_t g = 0; g < limits_.size(); ++g) {
      DHISPARSE_EXPECTS(sum <= limits_[g],
                        std::string(what) + ": the budget floors of the admitted requests (" + std::to_string(sum) +
                          " slots per group with this one) would exceed the pool limit of group " +
                          std::to_string(g) + " (" + std::to_string(limits_[g]) + " slots)");
    }
  }
  void set(int request, std::int64_t capacity)
  {
    std::int64_t const f = floor_at(capacity);
    sum_ += f - floors_[request];
    floors_[request] = f;
    caps_[request]   = cap_at(capacity);
  }
  void clear(int request)
  {
    sum_ -= floors_[request];
    floors_[request] = 0;
    caps_[request]   = 0;
  }

  /// Throws, changing nothing, unless `limit` is in [floors admitted, device_slots_per_group].
  void check_limit(int group, std::int64_t limit) const
  {
    DHISPARSE_EXPECTS(group >= 0 && group < int(limits_.size()),
                      "set_pool_limit: group " + std::to_string(group) + " out of range");
    DHISPARSE_EXPECTS(limit > 0 && limit <= config_.device_slots_per_group,
                      "set_pool_limit: limit (" + std::to_string(limit) + ") must be in [1, device_slots_per_group = " +
                        std::to_string(config_.device_slots_per_group) + "]");
    DHISPARSE_EXPECTS(limit >= sum_, "set_pool_limit: limit (" + std::to_string(limit) +
                                       ") is below the budget floors of the admitted requests (" +
                                       std::to_string(sum_) + " slots)");
  }
  void set_limit(int group, std::int64_t limit) { limits_[group] = limit; }

  [[nodiscard]] std::int64_t floor(int request) const { return floors_[request]; }
  [[nodiscard]] std::int32_t cap(int request) const { return caps_[request]; }
  [[nodiscard]] std::int64_t limit(int group) const { return limits_[group]; }
  [[nodiscard]] std::int64_t floor_sum() const noexcept { return sum_; }

 private:
  hierarchy_config config_;
  std::vector<std::int64_t> floors_;
  std::vector<std::int32_t> caps_;
  std::vector<std::int64_t> limits_;
  std::int64_t sum_ = 0;
};

}  // namespace dhisparse::detail
