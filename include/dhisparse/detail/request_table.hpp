/**
 * @file detail/request_table.hpp
 * @brief Engine request ids ↔ internal request indices, and the host-side argument checks
 *        that `kv_hierarchy` and its host reference share (plain C++).
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace dhisparse::detail {

class request_table {
 public:
  explicit request_table(hierarchy_config const& config) : config_{config}
  {
    for (int i = config.max_requests; i-- > 0;) { free_.push_back(i); }  // index 0 first
  }

  /**
   * @brief Validates an admission; resolves a negative `capacity` to its default
   *        (length + max_queries). Returns the index the request will get; nothing changes
   *        until `insert`.
   */
  int check_admit(request_id id, std::int32_t length, std::int64_t& capacity) const
  {
    DHISPARSE_EXPECTS(index_.count(key(id)) == 0,
                      "admit: request " + std::to_string(key(id)) + " is already admitted");
    DHISPARSE_EXPECTS(!free_.empty(), "admit: max_requests (" + std::to_string(config_.max_requests) +
                                        ") requests are already admitted");
    if (capacity < 0) { capacity = std::int64_t(length) + config_.max_queries; }
    DHISPARSE_EXPECTS(length >= 0 && length <= config_.max_context,
                      "admit: length (" + std::to_string(length) + ") must be in [0, max_context]");
    DHISPARSE_EXPECTS(capacity >= length && capacity <= config_.max_context,
                      "admit: capacity (" + std::to_string(capacity) + ") must be in [length, max_context]");
    return free_.back();
  }

  /// Takes the index `check_admit` returned.
  void insert(request_id id)
  {
    index_[key(id)] = free_.back();
    free_.pop_back();
  }

  void erase(request_id id)
  {
    free_.push_back(index_of(id, "release"));
    index_.erase(key(id));
  }

  [[nodiscard]] bool contains(request_id id) const { return index_.count(key(id)) != 0; }
  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }

  /// Index of an admitted request; throws naming `what` for an unknown id.
  [[nodiscard]] int index_of(request_id id, char const* what) const
  {
    auto const it = index_.find(key(id));
    DHISPARSE_EXPECTS(it != index_.end(), std::string(what) + ": unknown request id " + std::to_string(key(id)));
    return it->second;
  }

  /// Whether `index` is the index of an admitted request (any int; a linear scan).
  [[nodiscard]] bool admitted_index(std::int64_t index) const
  {
    for (auto const& entry : index_) {
      if (entry.second == index) { return true; }
    }
    return false;
  }

  /// Validates `reserve`'s capacity.
  void check_reserve(std::int64_t capacity) const
  {
    DHISPARSE_EXPECTS(capacity >= 0 && capacity <= config_.max_context,
                      "reserve: capacity (" + std::to_string(capacity) + ") exceeds max_context");
  }

  /// Validates a batch; returns the request index of each entry.
  [[nodiscard]] std::vector<std::int32_t> batch_indices(request_id const* ids, std::int32_t const* queries,
                                                        int count) const
  {
    DHISPARSE_EXPECTS(count >= 0 && count <= config_.max_batch,
                      "set_batch: count (" + std::to_string(count) + ") exceeds max_batch (" +
                        std::to_string(config_.max_batch) + ")");
    DHISPARSE_EXPECTS(count == 0 || (ids != nullptr && queries != nullptr),
                      "set_batch: ids and queries must not be null");
    std::unordered_set<std::uint64_t> seen;
    std::vector<std::int32_t> indices;
    for (int b = 0; b < count; ++b) {
      DHISPARSE_EXPECTS(seen.insert(key(ids[b])).second,
                        "set_batch: request " + std::to_string(key(ids[b])) + " appears twice");
      DHISPARSE_EXPECTS(queries[b] >= 1 && queries[b] <= config_.max_queries,
                        "set_batch: queries[" + std::to_string(b) + "] (" + std::to_string(queries[b]) +
                          ") must be in [1, max_queries]");
      indices.push_back(index_of(ids[b], "set_batch"));
    }
    return indices;
  }

  void check_group(int group, char const* what) const
  {
    DHISPARSE_EXPECTS(group >= 0 && group < config_.num_groups(),
                      std::string(what) + ": group " + std::to_string(group) + " out of range [0, " +
                        std::to_string(config_.num_groups()) + ")");
  }

  void check_layer(int group, int layer, char const* what) const
  {
    check_group(group, what);
    DHISPARSE_EXPECTS(layer >= 0 && layer < config_.group_layers[group],
                      std::string(what) + ": layer " + std::to_string(layer) + " out of range");
  }

  /// Validates resolve's arguments.
  void check_resolve(int group, void const* selections, int top_k) const
  {
    check_group(group, "resolve");
    DHISPARSE_EXPECTS(selections != nullptr, "resolve: selections must not be null");
    DHISPARSE_EXPECTS(top_k >= 1 && top_k <= config_.max_top_k,
                      "resolve: top_k (" + std::to_string(top_k) + ") must be in [1, max_top_k = " +
                        std::to_string(config_.max_top_k) + "]");
  }

  /// Validates retrieve's layer range; resolves a negative end to the group's layer count.
  void check_retrieve(int group, int layer_begin, int& layer_end) const
  {
    check_group(group, "retrieve");
    if (layer_end < 0) { layer_end = config_.group_layers[group]; }
    DHISPARSE_EXPECTS(0 <= layer_begin && layer_begin <= layer_end && layer_end <= config_.group_layers[group],
                      "retrieve: layer range [" + std::to_string(layer_begin) + ", " + std::to_string(layer_end) +
                        ") out of range");
  }

 private:
  static std::uint64_t key(request_id id) noexcept { return static_cast<std::uint64_t>(id); }

  hierarchy_config config_;
  std::unordered_map<std::uint64_t, int> index_;
  std::vector<int> free_;
};

}  // namespace dhisparse::detail
