// Speculative verification with a tiny synthetic target and drafter.
//
// 1. Greedy: a drafter proposes 4 tokens per step, the target verifies them in one call;
//    the generated text equals plain greedy decoding of the target, token for token.
// 2. Sampling: 65536 requests verify drafts sampled from the drafter; the first emitted
//    token follows the target's distribution (total variation distance and z-scores).
//
// The "models" are hash-based logit tables over a 64-token vocabulary, conditioned on the
// last two tokens; they run on the host, verification runs on the GPU.
#include <dhisparse/verify.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int vocab = 64;
constexpr int drafts = 4;

std::uint64_t mix(std::uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Next-token distribution given the last two tokens; the drafter is the target plus noise.
std::vector<float> distribution(int a, int b, bool drafter)
{
  std::vector<double> w(vocab);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) {
    double logit = double(mix(std::uint64_t(a) * 4096 + std::uint64_t(b) * 64 + v) >> 40) * 0x1p-24 * 6.0;
    if (drafter) { logit += double(mix(~std::uint64_t(a * 4096 + b * 64 + v)) >> 40) * 0x1p-24 * 1.5; }
    sum += w[v] = std::exp(logit);
  }
  std::vector<float> p(vocab);
  for (int v = 0; v < vocab; ++v) { p[v] = float(w[v] / sum); }
  return p;
}

int argmax(std::vector<float> const& p) { return int(std::max_element(p.begin(), p.end()) - p.begin()); }

template <class T>
T* to_device(std::vector<T> const& v)
{
  T* d = nullptr;
  DHISPARSE_CUDA_TRY(cudaMalloc(&d, v.size() * sizeof(T)));
  DHISPARSE_CUDA_TRY(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::vector<T> to_host(T const* d, std::size_t n)
{
  std::vector<T> v(n);
  DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// One verification call over B requests whose drafts and contexts are given; p (and q
/// for sampling) are computed along each draft path. Returns emitted tokens [B][d+1].
std::vector<std::int32_t> verify_batch(dhisparse::verify_rule rule, std::vector<std::int32_t> const& context,
                                       std::vector<std::int32_t> const& tokens, int B, std::uint64_t offset)
{
  std::vector<float> p, q;
  for (int b = 0; b < B; ++b) {
    int a = context[2 * b], c = context[2 * b + 1];
    for (int i = 0; i <= drafts; ++i) {
      auto const pt = distribution(a, c, false), qt = distribution(a, c, true);
      p.insert(p.end(), pt.begin(), pt.end());
      if (i < drafts) {
        q.insert(q.end(), qt.begin(), qt.end());
        a = c;
        c = tokens[b * drafts + i];
      }
    }
  }
  std::vector<std::uint64_t> const rng{2026, offset};
  dhisparse::verify_params v;
  v.rule         = rule;
  v.distribution = dhisparse::draft_distribution::dense;
  v.capacity     = B;
  v.max_drafts   = drafts;
  v.vocab        = vocab;
  v.draft_tokens = to_device(tokens);
  v.p            = to_device(p);
  v.q            = to_device(q);
  v.rng          = to_device(rng);
  std::int32_t *accepted, *emitted, *next;
  std::uint32_t* status;
  DHISPARSE_CUDA_TRY(cudaMalloc(&accepted, B * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&emitted, std::size_t(B) * (drafts + 1) * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&next, B * sizeof(std::int32_t)));
  DHISPARSE_CUDA_TRY(cudaMalloc(&status, sizeof(std::uint32_t)));
  v.accepted   = accepted;
  v.emitted    = emitted;
  v.next_token = next;
  v.status     = status;
  DHISPARSE_CUDA_TRY(dhisparse::verify_async(v, nullptr));
  dhisparse::check_verify_status_sync(status, nullptr);  // throws, naming the argument, on bad input
  auto out = to_host(emitted, std::size_t(B) * (drafts + 1));
  for (void* ptr : {(void*)v.draft_tokens, (void*)v.p, (void*)v.q, (void*)v.rng, (void*)accepted, (void*)emitted,
                    (void*)next, (void*)status}) {
    cudaFree(ptr);
  }
  return out;
}

}  // namespace

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("speculative_verify: no CUDA device, nothing to run\n");
    return 0;
  }

  // 1. Greedy: speculative generation equals plain greedy generation.
  int const length = 64;
  std::vector<int> plain{3, 7};
  while (int(plain.size()) < length + 2) {
    plain.push_back(argmax(distribution(plain[plain.size() - 2], plain.back(), false)));
  }
  std::vector<int> text{3, 7};
  int steps = 0;
  while (int(text.size()) < length + 2) {
    std::vector<std::int32_t> tokens;
    int a = text[text.size() - 2], c = text.back();
    for (int i = 0; i < drafts; ++i) {  // the drafter's own greedy continuation
      int const t = argmax(distribution(a, c, true));
      tokens.push_back(t);
      a = c;
      c = t;
    }
    std::vector<std::int32_t> const context{text[text.size() - 2], text.back()};
    auto const out = verify_batch(dhisparse::verify_rule::greedy, context, tokens, 1, 0);
    for (int j = 0; j <= drafts && out[j] >= 0; ++j) { text.push_back(out[j]); }
    ++steps;
  }
  text.resize(length + 2);
  bool const same = text == plain;
  std::printf("greedy: %d tokens in %d verify steps (%.2f tokens per step); identical to plain greedy decoding: %s\n",
              length, steps, double(length) / steps, same ? "yes" : "NO");

  // 2. Sampling: the first emitted token is distributed as the target's p(. | context).
  int const B = 65536;
  std::mt19937_64 g(7);
  std::vector<std::int32_t> context, tokens;
  for (int b = 0; b < B; ++b) {
    int a = 3, c = 7;
    context.push_back(a);
    context.push_back(c);
    for (int i = 0; i < drafts; ++i) {  // drafts sampled from the drafter
      auto const qt = distribution(a, c, true);
      int const t   = std::discrete_distribution<int>(qt.begin(), qt.end())(g);
      tokens.push_back(t);
      a = c;
      c = t;
    }
  }
  auto const out = verify_batch(dhisparse::verify_rule::sampling, context, tokens, B, 1);
  std::vector<double> counts(vocab, 0);
  double accepted = 0;
  for (int b = 0; b < B; ++b) {
    counts[out[std::size_t(b) * (drafts + 1)]] += 1;
    for (int j = 1; j <= drafts && out[std::size_t(b) * (drafts + 1) + j] >= 0; ++j) { accepted += 1; }
  }
  auto const p = distribution(3, 7, false), q = distribution(3, 7, true);
  double tv_p = 0, tv_q = 0, worst_z = 0;
  for (int v = 0; v < vocab; ++v) {
    tv_p += 0.5 * std::fabs(counts[v] / B - p[v]);
    tv_q += 0.5 * std::fabs(counts[v] / B - q[v]);
    worst_z = std::max(worst_z, std::fabs(counts[v] - B * p[v]) / std::sqrt(B * p[v] * (1 - p[v])));
  }
  std::printf("sampling: %d requests, %.2f drafts accepted per request; first token vs target p: TV %.4f, "
              "max |z| %.2f; vs drafter q: TV %.4f\n",
              B, accepted / B, tv_p, worst_z, tv_q);
  return same && worst_z < 6 ? 0 : 1;
}
