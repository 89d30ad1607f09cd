/**
 * @file examples/common/tiny_model.hpp
 * @brief A tiny deterministic target model for speculative decoding over the hierarchy:
 *        what an engine's model and indexer do, small enough to run on the host.
 *
 * Per layer, a token at a position writes one KV row (GQA: one KV head of 128, bf16 K and
 * V: `row_format::mha<1, 128, bf16>`), and a query of two heads attends to the rows its
 * indexer selected. The next-token logits are a fixed random projection of the attention
 * outputs of every layer, so a single wrong row (a wrong byte, a stale slot, a row of
 * another token or position) changes the outputs and, almost always, the tokens.
 *
 * The indexer (`select`) depends only on the query's position and the group: attention
 * sinks, a local window, a drifting topic and random far positions, i.e. selections
 * spread over the whole context, which keeps a small device pool evicting.
 */
#pragma once

#include <dhisparse/host/row_format.hpp>
#include <dhisparse/row_format.cuh>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace examples {

class tiny_model {
 public:
  using row                 = dhisparse::row_format::mha<1, 128, dhisparse::bf16>;
  static constexpr int dim   = 128;  ///< head dim (K, V and queries)
  static constexpr int heads = 2;    ///< query heads (one KV head)

  /// A model over `vocab` tokens with the layers of `group_layers`, weights from `seed`.
  tiny_model(std::vector<int> group_layers, int vocab, std::uint64_t seed)
    : group_layers_{std::move(group_layers)}, vocab_{vocab}, seed_{seed}
  {
    for (int l : group_layers_) {
      first_layer_.push_back(layers_);
      layers_ += l;
    }
    key_.resize(std::size_t(layers_) * vocab * dim);
    value_.resize(key_.size());
    query_.resize(key_.size() * heads);
    projection_.resize(std::size_t(layers_) * heads * dim * vocab);
    std::uint64_t i = 0;
    for (auto* table : {&key_, &value_, &query_, &projection_}) {
      for (float& x : *table) { x = uniform(seed, i++); }
    }
    for (int d = 0; d < dim; ++d) { frequency_[d] = std::pow(10000.0, -double(d % (dim / 2)) / (dim / 2)); }
  }

  [[nodiscard]] int vocab() const noexcept { return vocab_; }
  [[nodiscard]] int layers() const noexcept { return layers_; }
  /// Global index of layer l of group g.
  [[nodiscard]] int layer(int g, int l) const { return first_layer_[std::size_t(g)] + l; }
  [[nodiscard]] static float softmax_scale() noexcept { return 1.f / std::sqrt(float(dim)); }

  /// The KV row `token` writes at `position` in global layer `layer` (`row::bytes` bytes).
  void write_row(int layer, std::int32_t token, std::int32_t position, std::byte* out) const
  {
    float const* k = key_.data() + (std::size_t(layer) * vocab_ + std::size_t(token)) * dim;
    float const* v = value_.data() + (std::size_t(layer) * vocab_ + std::size_t(token)) * dim;
    for (int d = 0; d < dim; ++d) {
      double const angle     = double(position) * frequency_[d];
      dhisparse::bf16 const kv[2] = {dhisparse::host::float_to_bf16(k[d] + 0.5f * float(std::sin(angle))),
                                     dhisparse::host::float_to_bf16(v[d] + 0.25f * float(std::cos(angle)))};
      std::memcpy(out + row::k_offset + std::size_t(d) * 2, &kv[0], 2);
      std::memcpy(out + row::v_offset + std::size_t(d) * 2, &kv[1], 2);
    }
  }

  /// The query of `token` at `position` in global layer `layer`: `heads × dim` bf16.
  void write_query(int layer, std::int32_t token, std::int32_t position, dhisparse::bf16* out) const
  {
    float const* q = query_.data() + (std::size_t(layer) * vocab_ + std::size_t(token)) * heads * dim;
    for (int h = 0; h < heads; ++h) {
      for (int d = 0; d < dim; ++d) {
        double const angle = double(position) * frequency_[d] + h;
        out[h * dim + d]   = dhisparse::host::float_to_bf16(2.f * q[h * dim + d] + 0.5f * float(std::sin(angle)));
      }
    }
  }

  /// Adds the logits of one layer's attention output (`heads × dim` bf16) to `logits`.
  void add_logits(int layer, dhisparse::bf16 const* out, double* logits) const
  {
    float const* w = projection_.data() + std::size_t(layer) * heads * dim * vocab_;
    for (int i = 0; i < heads * dim; ++i) {
      double const x = dhisparse::host::bf16_to_float(out[i]);
      for (int v = 0; v < vocab_; ++v) { logits[v] += x * w[std::size_t(i) * vocab_ + v]; }
    }
  }

  /// Greedy decoding's choice: the largest logit, the smallest token among ties.
  [[nodiscard]] std::int32_t argmax(double const* logits) const
  {
    return std::int32_t(std::max_element(logits, logits + vocab_) - logits);
  }

  /**
   * @brief The indexer: the positions a query at `position` attends to in group `g`,
   *        sorted and distinct, at most `top_k`: itself, 4 sinks, a window of 4, then
   *        positions around a drifting topic and anywhere before it.
   */
  void select(int g, std::int32_t position, int top_k, std::vector<std::int32_t>& out) const
  {
    out.clear();
    auto add = [&](std::int32_t x) {
      if (x >= 0 && x <= position && int(out.size()) < top_k &&
          std::find(out.begin(), out.end(), x) == out.end()) {
        out.push_back(x);
      }
    };
    add(position);
    for (std::int32_t x = 0; x < 4; ++x) { add(x); }
    for (std::int32_t x = 1; x <= 4; ++x) { add(position - x); }
    std::int32_t const topic =
      std::int32_t(double(position) * 0.6 + 80.0 * std::sin(double(position) / 53.0 + g));
    std::uint64_t const key = mix(seed_ ^ (std::uint64_t(g) << 40) ^ std::uint64_t(position));
    for (std::uint64_t i = 0; int(out.size()) < std::min<std::int64_t>(top_k, std::int64_t(position) + 1) && i < 64;
         ++i) {
      std::uint64_t const h = mix(key + i);
      add(i % 2 == 0 ? topic + std::int32_t(h % 97) - 48 : std::int32_t(h % std::uint64_t(position + 1)));
    }
    std::sort(out.begin(), out.end());
  }

  static std::uint64_t mix(std::uint64_t x)
  {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

 private:
  static float uniform(std::uint64_t seed, std::uint64_t i)
  {
    return float(double(mix(seed * 0x2545F4914F6CDD1Dull + i) >> 11) * 0x1p-53 * 2.0 - 1.0);
  }

  std::vector<int> group_layers_;
  std::vector<int> first_layer_;
  int layers_ = 0;
  int vocab_;
  std::uint64_t seed_;
  std::vector<float> key_, value_, query_, projection_;
  double frequency_[dim]{};
};

}  // namespace examples
