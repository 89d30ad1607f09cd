/**
 * @file workload.hpp
 * @brief Test workload for the hierarchy: the committed bytes of every row as a pure
 *        function (so any row can be checked without storing it), and random selections
 *        with the locality of real sparse attention (sinks, local window, drifting
 *        clusters, noise).
 */
#pragma once

#include <dhisparse/hierarchy_config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

namespace dhisparse::test {

inline std::uint64_t splitmix64(std::uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The bytes a row of (request, group, layer, position) holds once committed, in `salt`'s
/// world. Never all zero; different for every row.
inline void truth_row(std::uint64_t salt, std::uint64_t request, int group, int layer,
                      std::int64_t position, std::byte* out, std::size_t bytes)
{
  std::uint64_t h = splitmix64(salt ^ splitmix64(request * 1315423911ull + std::uint64_t(group) * 977 +
                                                 std::uint64_t(layer) * 131 +
                                                 std::uint64_t(position) * 2654435761ull));
  for (std::size_t i = 0; i < bytes; i += 8) {
    h = splitmix64(h);
    std::uint64_t v = h | 1;  // never an all-zero word
    std::memcpy(out + i, &v, std::min<std::size_t>(8, bytes - i));
  }
}

/// A whole group row (all layers of the group, contiguous).
inline std::vector<std::byte> truth_group_row(std::uint64_t salt, std::uint64_t request, int group,
                                              int layers, std::size_t row_bytes, std::int64_t position)
{
  std::vector<std::byte> out(std::size_t(layers) * row_bytes);
  for (int l = 0; l < layers; ++l) {
    truth_row(salt, request, group, l, position, out.data() + std::size_t(l) * row_bytes, row_bytes);
  }
  return out;
}

/**
 * @brief Selections of one query of a request with committed length `length` and query
 *        index q: sorted, distinct positions in [0, length + q], at most `top_k`, then -1.
 *        Mixes sinks, a local window, a cluster around `focus` and random positions.
 */
inline void make_selection(std::mt19937_64& rng, std::int32_t length, int q, int top_k,
                           std::int32_t focus, std::int32_t* out)
{
  std::int32_t const limit = length + q;  // inclusive
  std::set<std::int32_t> picked;
  std::uniform_int_distribution<int> fewer(0, 7);
  int const want = std::min<std::int64_t>(fewer(rng) == 0 ? top_k / 2 + 1 : top_k, std::int64_t(limit) + 1);
  for (std::int32_t s = 0; s < 4 && int(picked.size()) < want && s <= limit; ++s) { picked.insert(s); }
  for (std::int32_t p = limit; p >= 0 && p > limit - top_k / 8 && int(picked.size()) < want; --p) {
    picked.insert(p);
  }
  std::normal_distribution<double> near(double(focus), double(std::max(8, top_k)));
  std::uniform_int_distribution<std::int32_t> any(0, limit);
  while (int(picked.size()) < want) {
    std::int32_t p = (picked.size() % 4 == 0) ? any(rng) : std::int32_t(near(rng));
    if (p >= 0 && p <= limit) { picked.insert(p); }
  }
  int k = 0;
  for (std::int32_t p : picked) { out[k++] = p; }
  for (; k < top_k; ++k) { out[k] = -1; }
}

}  // namespace dhisparse::test
