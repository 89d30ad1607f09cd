/**
 * @file host_layout.hpp
 * @brief Fuzz target `host_layout`: an engine's description of its host KV pages
 *        (`host_store_config::page_bytes` / `groups`, with the layer groups and the page
 *        size) through the check both host stores run at construction
 *        (`detail::make_group_layouts`). A rejected layout must be rejected with
 *        `dhisparse::error`; an accepted one is checked by brute force: every row of every
 *        position lies inside its page, 16-byte aligned, and no two rows share a byte.
 *
 * Decoding: number of groups, layers per group, log2 of tokens per page, then whether
 * groups are described (each: offset and position stride, in 16-byte units, sometimes
 * off by 1–15 bytes) and whether a page size is given (the same way).
 */
#pragma once

#include "fuzz_input.hpp"

#include <dhisparse/detail/host_layout.hpp>
#include <dhisparse/hierarchy_config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace dhisparse::fuzz {

/// Bytes of one row in the fuzzed layouts (the smallest a row format can be).
inline constexpr std::size_t layout_row_bytes = 16;

/// A multiple of 16 up to `max_units` × 16, sometimes off by 1–15 bytes.
inline std::size_t layout_bytes(input& in, std::int64_t max_units)
{
  std::size_t const v = std::size_t(in.integer<std::int64_t>(0, max_units)) * 16;
  return in.integer<unsigned>(0, 7) == 0 ? v + in.integer<unsigned>(1, 15) : v;
}

inline void host_layout_target(std::uint8_t const* data, std::size_t size)
{
  input in(data, size);
  // Through the raw form any value can come: counts are clamped to keep the brute force small.
  std::vector<int> layers(std::size_t(std::clamp<std::int64_t>(in.integer<std::int64_t>(1, 4), 0, 8)));
  for (int& l : layers) { l = int(std::clamp<std::int64_t>(in.integer<std::int64_t>(1, 4), -1, 64)); }
  host_store_config c;
  c.tokens_per_page = 1 << (in.integer<unsigned>(0, 6) % 7);
  if (in.boolean()) {  // sometimes one placement per group, sometimes not
    c.groups.resize(std::size_t(std::clamp<std::int64_t>(in.integer<std::int64_t>(0, 5), 0, 8)));
    for (auto& g : c.groups) {
      g.offset       = layout_bytes(in, 256);
      g.token_stride = layout_bytes(in, 32);
    }
  }
  c.page_bytes = in.boolean() ? layout_bytes(in, 4096) : 0;

  std::size_t page_bytes = 0;
  auto const layouts     = detail::make_group_layouts(c, layers, layout_row_bytes, page_bytes);  // may throw: rejected
  expect(layouts.size() == layers.size(), "an accepted layout does not place every group");
  expect(page_bytes % 16 == 0 && page_bytes > 0, "an accepted layout has an empty or unaligned page");
  expect(c.page_bytes == 0 || page_bytes == c.page_bytes, "an accepted layout changed the page size it was given");
  std::vector<std::pair<std::size_t, std::size_t>> rows;  // [begin, end) of every group row of a page
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    std::size_t const group_row = std::size_t(layers[g]) * layout_row_bytes;
    expect(layouts[g].row_bytes >= group_row, "an accepted layout's position stride is below its group row");
    if (!c.groups.empty()) {
      expect(layouts[g].page_offset == c.groups[g].offset && layouts[g].row_bytes == c.groups[g].token_stride,
             "an accepted layout is not the one described");
    }
    for (int t = 0; t < c.tokens_per_page; ++t) {
      std::size_t const begin = layouts[g].page_offset + std::size_t(t) * layouts[g].row_bytes;
      expect(begin % 16 == 0, "an accepted layout places a row at an unaligned offset");
      expect(begin + group_row <= page_bytes, "an accepted layout places a row beyond its page");
      rows.emplace_back(begin, begin + group_row);
    }
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t j = i + 1; j < rows.size(); ++j) {
      expect(rows[i].second <= rows[j].first || rows[j].second <= rows[i].first,
             "an accepted layout places two rows at overlapping bytes");
    }
  }
}

}  // namespace dhisparse::fuzz
