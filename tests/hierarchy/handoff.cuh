// The hand-off between a shared host store's writer and a reader (issue 19 item 2), shared
// by the in-process test (test_multi_hierarchy_gpu) and the two-process one
// (test_shared_store_ipc_gpu): one request decodes; every step the writer is delayed on
// its stream, resolves, logs the rows attention would read, writes its tail, commits and
// backs up; the reader does the same, waits for the writer's backup and backs up (marking
// its rows clean, copying nothing), then releases every optional row so that it fetches
// them again from the host. The host pages of positions not yet committed are poisoned:
// a reader that fetched a row before the writer's copy of it logs wrong bytes.
#pragma once

#include "twin.cuh"

#include <dhisparse/hierarchy.cuh>
#include <dhisparse/policy/adaptive_budget.cuh>
#include <dhisparse/shared_host_store.cuh>

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

namespace dhisparse::test::handoff {

using Row       = row_format::mla_fp8_656;
using hierarchy = kv_hierarchy<Row, policy::lru, policy::adaptive_budget<reclaim_order::global>>;
inline constexpr int K                 = 32;
inline constexpr std::uint64_t id      = 7;
inline constexpr std::int32_t length0  = 200;
inline constexpr long long delay_ns    = 2'000'000;  ///< 2 ms: the writer's backups lag far behind

/// A stream on `device` (the caller's device restored).
struct device_stream {
  explicit device_stream(int device) : device_{device}
  {
    auto const on = detail::device_guard{device};
    DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  device_stream(device_stream const&)            = delete;
  device_stream& operator=(device_stream const&) = delete;
  ~device_stream()
  {
    auto const on = detail::device_guard{device_};
    cudaStreamDestroy(s);
  }
  cudaStream_t s{};
  int device_;
};

/// Keeps the stream busy for `ns` nanoseconds (the writer falls behind the reader).
template <int Dummy = 0>
__global__ void spin_kernel(long long ns)
{
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

/// Copies the slab row of every slot of one query's slot table into `out` (0xEE: no slot).
template <int Dummy = 0>
__global__ void gather_rows_kernel(std::byte const* slab, std::size_t row_bytes, std::int32_t const* table,
                                   std::byte* out)
{
  std::int32_t const slot = table[blockIdx.x];
  std::byte* dst          = out + std::size_t(blockIdx.x) * row_bytes;
  for (std::size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) {
    dst[i] = slot >= 0 ? slab[std::size_t(slot) * row_bytes + i] : std::byte{0xEE};
  }
}

inline hierarchy_config config(int device)
{
  hierarchy_config c;
  c.group_layers           = {1};
  c.max_requests           = 2;
  c.max_batch              = 1;
  c.max_queries            = 1;
  c.max_top_k              = K;
  c.max_context            = 1024;
  c.device_slots_per_group = 512;
  c.map_page_positions     = 256;
  c.host.tokens_per_page   = 16;
  c.host.capacity_pages    = 2 * 1024 / 16;
  c.device                 = device;
  return c;
}

/// Every step's selections (the three rows committed last among them) and tail rows, drawn
/// from `salt`: both processes of the two-process test rebuild the same workload.
struct workload {
  workload(std::uint64_t salt_, int steps_) : salt{salt_}, steps{steps_}
  {
    std::mt19937_64 rng(salt);
    for (int t = 0; t < steps; ++t) {
      std::int32_t const len = length0 + t;
      std::set<std::int32_t> s{len - 1, len - 2, len - 3};
      while (int(s.size()) < K) { s.insert(std::int32_t(rng() % std::uint64_t(len))); }
      selections.insert(selections.end(), s.begin(), s.end());
      auto const row = truth_group_row(salt, id, 0, 1, Row::bytes, len);
      tails.insert(tails.end(), row.begin(), row.end());
    }
  }
  [[nodiscard]] std::int64_t capacity() const { return length0 + steps + 1; }

  std::uint64_t salt;
  int steps;
  std::vector<std::int32_t> selections;  ///< [steps][K]
  std::vector<std::byte> tails;          ///< [steps][row]
};

/// One rank of the hand-off: its hierarchy, stream and log of the rows it read.
struct rank {
  rank(hierarchy_config const& c, workload const& w) : stream{c.device}
  {
    auto const on = detail::device_guard{c.device};
    h             = std::make_unique<hierarchy>(c, stream.s);
    sel           = device_vector<std::int32_t>(w.selections);
    tail_rows     = device_vector<std::byte>(w.tails);
    log           = device_vector<std::byte>(std::size_t(w.steps) * K * Row::bytes);
    log.fill_bytes(0x11);
  }

  /// Admits the request (the writer first: it also writes the prefill rows once and poisons
  /// the pages of the positions decoding will commit) and makes it the batch.
  void admit(workload const& w, bool write_pages)
  {
    h->admit(request_id{id}, length0, stream.s, w.capacity());
    if (write_pages) {
      for (std::int32_t p = 0; p < w.capacity(); ++p) {
        std::byte* at = h->host_row(request_id{id}, 0, 0, p);
        if (p < length0) {
          truth_row(w.salt, id, 0, 0, p, at, Row::bytes);
        } else {
          std::memset(at, 0x5A, Row::bytes);
        }
      }
    }
    std::int32_t const one = 1;
    request_id const ids[] = {request_id{id}};
    h->set_batch(ids, &one, 1, stream.s);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
  }

  /// resolve + retrieve of step t, its rows logged, the tail written, committed.
  void step(int t)
  {
    auto const on                      = detail::device_guard{h->device()};
    std::int32_t const* const step_sel = sel.data() + std::size_t(t) * K;
    h->resolve(0, step_sel, K, stream.s);
    h->retrieve(0, stream.s);
    layer_view const rows = h->layer_rows(0, 0);
    gather_rows_kernel<<<K, 128, 0, stream.s>>>(rows.rows, rows.stride, h->slot_table(0),
                                                log.data() + std::size_t(t) * K * Row::bytes);
    write_tails_kernel<<<1, 128, 0, stream.s>>>(rows.rows, rows.stride, h->tail_slots(0),
                                                tail_rows.data() + std::size_t(t) * Row::bytes, 1);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
    h->commit(nullptr, stream.s);
  }

  void spin(long long ns)
  {
    auto const on = detail::device_guard{h->device()};
    spin_kernel<<<1, 1, 0, stream.s>>>(ns);
    DHISPARSE_CUDA_TRY(cudaGetLastError());
  }

  /// The writer's part of step t: delayed before and after, then its backup.
  void writer_step(int t)
  {
    spin(delay_ns);
    step(t);
    spin(delay_ns);
    REQUIRE(h->backup(stream.s) != nullptr);
  }

  /// The reader's part after its `wait_host`: the backup (marks, copies nothing), then every
  /// optional row released so that the next step fetches them again.
  void reader_finish_step(hierarchy_config const& c)
  {
    REQUIRE(h->backup(stream.s) == nullptr);
    h->reclaim(0, std::int32_t(c.device_slots_per_group), stream.s);
  }

  /// After the last step: the statuses are clean; for a reader, it copied nothing and
  /// fetched rows again every step.
  void check_counters(bool reader, int steps)
  {
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    REQUIRE(h->status_sync(stream.s) == 0);
    if (!reader) { return; }
    group_counters counters{};
    h->read_counters(0, &counters, stream.s);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream.s));
    REQUIRE(counters.backed_up_rows == 0);                          // the reader copies nothing
    REQUIRE(counters.fetched_rows >= std::uint64_t(K + steps - 1));  // it fetched recent rows again
    REQUIRE(counters.reclaimed_rows > 0);
  }

  /// Logged rows that differ from the truth.
  int wrong_rows(workload const& w) const
  {
    auto const rows = log.download();
    int wrong       = 0;
    for (int t = 0; t < w.steps; ++t) {
      for (int k = 0; k < K; ++k) {
        std::int32_t const pos = w.selections[std::size_t(t) * K + k];
        auto const want        = truth_group_row(w.salt, id, 0, 1, Row::bytes, pos);
        wrong += std::memcmp(rows.data() + (std::size_t(t) * K + k) * Row::bytes, want.data(), Row::bytes) == 0 ? 0 : 1;
      }
    }
    return wrong;
  }

  device_stream stream;
  std::unique_ptr<hierarchy> h;
  device_vector<std::int32_t> sel;     // [steps][K]
  device_vector<std::byte> tail_rows;  // [steps][row]
  device_vector<std::byte> log;        // [steps][K][row]: the rows attention would read
};

}  // namespace dhisparse::test::handoff
