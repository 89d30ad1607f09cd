/**
 * @file detail/host_layout.hpp
 * @brief Where each layer group's rows lie in a host-store page: the packed layout, or an
 *        engine's layout described in `host_store_config` (checked). Plain C++: the GPU
 *        store and the host reference place rows the same way.
 */
#pragma once

#include <dhisparse/error.hpp>
#include <dhisparse/hierarchy_config.hpp>
#include <dhisparse/row_format.cuh>  // row_alignment (plain C++)

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse::detail {

/// Each group's place in a page (packed, or as `config` describes it, checked: aligned,
/// inside the page, no two rows overlapping); `page_bytes` receives the bytes of a page.
inline std::vector<group_layout> make_group_layouts(host_store_config const& config, std::vector<int> const& group_layers,
                                              std::size_t row_bytes, std::size_t& page_bytes)
{
  DHISPARSE_EXPECTS(!group_layers.empty(), "host_store: group_layers must not be empty");
  std::size_t const tokens = std::size_t(std::max(config.tokens_per_page, 1));
  std::vector<group_layout> layouts;
  std::size_t offset = 0;
  for (int layers : group_layers) {
    DHISPARSE_EXPECTS(layers > 0, "host_store: group_layers entries must be positive");
    layouts.push_back({offset, std::size_t(layers) * row_bytes});
    offset += tokens * layers * row_bytes;
  }
  page_bytes = offset;
  if (config.groups.empty() && config.page_bytes == 0) { return layouts; }

  std::string const what = "host_store_config: ";
  DHISPARSE_EXPECTS(tokens <= (std::size_t{1} << 20), what + "a page layout needs tokens_per_page ≤ 2^20");
  DHISPARSE_EXPECTS(config.groups.empty() || config.groups.size() == group_layers.size(),
                    what + "groups must be empty or hold one placement per layer group (" +
                      std::to_string(group_layers.size()) + ")");
  // Every group row of the page as [begin, end), to check that none overlap.
  std::vector<std::pair<std::size_t, std::size_t>> rows;
  std::size_t end = 0;
  for (std::size_t g = 0; g < config.groups.size(); ++g) {
    host_group_placement const& at = config.groups[g];
    std::size_t const group_row    = layouts[g].row_bytes;
    std::string const which        = what + "groups[" + std::to_string(g) + "]";
    DHISPARSE_EXPECTS(at.offset % row_alignment == 0 && at.token_stride % row_alignment == 0,
                      which + ": offset and token_stride must be multiples of 16");
    DHISPARSE_EXPECTS(at.token_stride >= group_row, which + ": token_stride (" + std::to_string(at.token_stride) +
                                                      ") is smaller than the group row (" +
                                                      std::to_string(group_row) + " bytes)");
    DHISPARSE_EXPECTS(at.offset <= (std::size_t{1} << 40) && at.token_stride <= (std::size_t{1} << 40),
                      which + ": offset or token_stride is implausibly large");
    for (std::size_t t = 0; t < tokens; ++t) { rows.emplace_back(at.offset + t * at.token_stride, group_row); }
    end = std::max(end, at.offset + (tokens - 1) * at.token_stride + group_row);
    layouts[g] = {at.offset, at.token_stride};
  }
  std::sort(rows.begin(), rows.end());
  for (std::size_t i = 1; i < rows.size(); ++i) {
    DHISPARSE_EXPECTS(rows[i - 1].first + rows[i - 1].second <= rows[i].first,
                      what + "groups place two rows at overlapping bytes of a page (at byte " +
                        std::to_string(rows[i].first) + ")");
  }
  if (config.groups.empty()) { end = page_bytes; }
  DHISPARSE_EXPECTS(config.page_bytes % row_alignment == 0, what + "page_bytes must be a multiple of 16");
  DHISPARSE_EXPECTS(config.page_bytes == 0 || config.page_bytes >= end,
                    what + "page_bytes (" + std::to_string(config.page_bytes) + ") is smaller than the rows of a page (" +
                      std::to_string(end) + " bytes)");
  page_bytes = config.page_bytes != 0 ? config.page_bytes : (end + row_alignment - 1) / row_alignment * row_alignment;
  return layouts;
}

}  // namespace dhisparse::detail
