/**
 * @file examples/common/synthetic.hpp
 * @brief Stand-ins for what an engine already owns: the bytes a model writes for a row,
 *        and an indexer's top-K selection (sorted positions with the locality of real
 *        sparse attention: attention sinks, a local window, a drifting topic).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>

namespace examples {

/// Deterministic row contents of (request, group, layer, position): what the model wrote.
inline void synthetic_row(std::uint64_t request, int group, int layer, std::int64_t position,
                          std::byte* out, std::size_t bytes)
{
  std::uint64_t h = request * 0x9E3779B97F4A7C15ull ^ std::uint64_t(group) << 48 ^
                    std::uint64_t(layer) << 40 ^ std::uint64_t(position);
  for (std::size_t i = 0; i < bytes; i += 8) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
    std::memcpy(out + i, &h, std::min<std::size_t>(8, bytes - i));
  }
}

/// Top-K of one decode query over positions [0, length]: 4 sinks, a window of K/8, and
/// the rest around `topic` (which drifts between steps). Sorted, distinct, -1 padded.
inline void synthetic_topk(std::mt19937_64& rng, std::int32_t length, int top_k,
                           std::int32_t topic, std::int32_t* out)
{
  std::set<std::int32_t> picked;
  int const want = std::min<std::int64_t>(top_k, std::int64_t(length) + 1);
  for (std::int32_t p = 0; p < 4 && p <= length; ++p) { picked.insert(p); }
  for (std::int32_t p = length; p >= 0 && p > length - top_k / 8; --p) { picked.insert(p); }
  std::normal_distribution<double> near(topic, 2.0 * top_k);
  while (int(picked.size()) < want) {
    auto const p = std::int32_t(near(rng));
    if (p >= 0 && p <= length) { picked.insert(p); }
  }
  int k = 0;
  for (auto it = picked.begin(); it != picked.end() && k < top_k; ++it) { out[k++] = *it; }
  std::fill(out + k, out + top_k, -1);
}

}  // namespace examples
