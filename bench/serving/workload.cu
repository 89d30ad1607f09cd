/**
 * @file bench/serving/workload.cu
 * @brief Selection templates from the drift workload or a trace (see workload.hpp).
 */
#include "workload.hpp"

#include <common/drift_gpu.cuh>

#include <dhisparse/error.cuh>
#include <dhisparse/trace.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace dhisparse::bench::serving {

selection_templates make_drift_templates(int count, int groups, std::int32_t context, int top_k, std::int64_t tokens,
                                         std::uint64_t seed)
{
  auto const t0 = std::chrono::steady_clock::now();
  selection_templates out;
  out.count  = count;
  out.groups = groups;
  out.top_k  = top_k;
  out.tokens = tokens;
  out.start.assign(std::size_t(count), context);
  out.rows      = dhisparse::detail::device_array<std::int32_t>(std::size_t(count) * groups * tokens * top_k);
  out.start_dev = dhisparse::detail::device_array<std::int32_t>(std::size_t(count));
  DHISPARSE_CUDA_TRY(cudaMemcpy(out.start_dev.data(), out.start.data(), sizeof(std::int32_t) * count,
                                cudaMemcpyHostToDevice));

  int const jobs    = count * groups;
  int const threads = std::max(1, std::min<int>(jobs, int(std::thread::hardware_concurrency())));
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      try {
        cudaStream_t stream = nullptr;
        DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        for (int j = w; j < jobs; j += threads) {
          drift_config c;
          c.context  = context;
          c.top_k    = top_k;
          c.requests = 1;
          c.queries  = 1;
          c.seed     = seed * 1000003ull + std::uint64_t(j) + 1;
          drift_generator_gpu gen(c, int(tokens), stream);
          std::int32_t* rows = out.rows.data() + std::size_t(j) * tokens * top_k;  // j = template · groups + group
          for (std::int64_t t = 0; t < tokens; ++t) {
            gen.next(rows + t * top_k, nullptr, stream);
            gen.commit();
          }
          DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
        }
        cudaStreamDestroy(stream);
      } catch (...) {
        failures[static_cast<std::size_t>(w)] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) { t.join(); }
  for (auto const& e : failures) {
    if (e) { std::rethrow_exception(e); }
  }
  out.source  = "drift workload (BENCH.md defaults: eps = 0.03, j = 0.03), " + std::to_string(count) +
               " templates x " + std::to_string(groups) + " groups, seed " + std::to_string(seed);
  out.build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

selection_templates load_trace_templates(std::string const& path, int max_templates, std::int64_t tokens_needed)
{
  auto const t0 = std::chrono::steady_clock::now();
  trace::reader reader(path);
  trace::shape const shape = reader.shape();
  int const k              = shape.top_k;
  int const groups         = shape.groups;
  struct tmpl {
    std::int32_t start = 0;
    std::vector<std::vector<std::int32_t>> rows;  // [groups] flat [t][k]
    std::vector<char> filled;                     // [t]
  };
  std::map<std::uint64_t, int> index;
  std::vector<tmpl> templates;
  trace::step_record rec;
  while (reader.next(rec)) {
    std::int32_t const count = std::int32_t(rec.requests.size());
    for (std::int32_t r = 0; r < count; ++r) {
      auto const& rq         = rec.requests[std::size_t(r)];
      std::uint64_t const id = static_cast<std::uint64_t>(rq.id);
      auto it                = index.find(id);
      if (it == index.end()) {
        if (int(templates.size()) >= max_templates) { continue; }
        it = index.emplace(id, int(templates.size())).first;
        templates.emplace_back();
        templates.back().start = rq.length;
        templates.back().rows.resize(std::size_t(groups));
      }
      tmpl& tp = templates[std::size_t(it->second)];
      for (int q = 0; q < rq.queries; ++q) {
        std::int64_t const t = std::int64_t(rq.length) + q - tp.start;
        if (t < 0) { continue; }
        if (std::size_t(t) >= tp.filled.size()) {
          tp.filled.resize(std::size_t(t) + 1, 0);
          for (auto& g : tp.rows) { g.resize((std::size_t(t) + 1) * k, -1); }
        }
        tp.filled[std::size_t(t)] = 1;
        for (int g = 0; g < groups; ++g) {
          std::int32_t const* src =
            rec.positions.data() + ((std::size_t(g) * count + r) * shape.max_queries + q) * std::size_t(k);
          std::copy(src, src + k, tp.rows[std::size_t(g)].begin() + std::size_t(t) * k);
        }
      }
    }
  }
  DHISPARSE_EXPECTS(!templates.empty(), "trace '" + path + "' holds no requests");
  std::int64_t covered = tokens_needed;
  for (auto const& tp : templates) {
    std::int64_t c = 0;
    while (c < std::int64_t(tp.filled.size()) && tp.filled[std::size_t(c)]) { ++c; }
    covered = std::min(covered, c);
  }
  DHISPARSE_EXPECTS(covered >= tokens_needed,
                    "trace '" + path + "': a request covers only " + std::to_string(covered) +
                      " consecutive positions, the run needs " + std::to_string(tokens_needed) +
                      " (fewer --steps, fewer --drafts, or a longer trace)");
  selection_templates out;
  out.count  = int(templates.size());
  out.groups = groups;
  out.top_k  = k;
  out.tokens = tokens_needed;
  std::vector<std::int32_t> flat;
  flat.reserve(std::size_t(out.count) * groups * tokens_needed * k);
  for (auto const& tp : templates) {
    out.start.push_back(tp.start);
    for (auto const& g : tp.rows) { flat.insert(flat.end(), g.begin(), g.begin() + tokens_needed * k); }
  }
  out.rows      = dhisparse::detail::device_array<std::int32_t>(flat.size());
  out.start_dev = dhisparse::detail::device_array<std::int32_t>(out.start.size());
  DHISPARSE_CUDA_TRY(cudaMemcpy(out.rows.data(), flat.data(), flat.size() * sizeof(std::int32_t),
                                cudaMemcpyHostToDevice));
  DHISPARSE_CUDA_TRY(cudaMemcpy(out.start_dev.data(), out.start.data(), out.start.size() * sizeof(std::int32_t),
                                cudaMemcpyHostToDevice));
  out.source  = "trace " + path + " (" + std::to_string(out.count) + " requests, " + std::to_string(groups) +
               " groups, K = " + std::to_string(k) + ")";
  out.build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace dhisparse::bench::serving
