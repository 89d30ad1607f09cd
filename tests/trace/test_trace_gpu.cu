// The asynchronous trace recorder: random traces recorded from device buffers that the
// "engine" rewrites every step on the same stream come back from the file exactly; a
// full ring makes record() wait and says so in its counter; errors of the host thread
// surface at the next call; a capturing stream is refused; the destructor never throws.
#include <catch2/catch.hpp>

#include <dhisparse/trace_recorder.cuh>

#include "gpu_test.cuh"
#include "random.hpp"
#include "random_trace.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

using dhisparse::test::device_vector;
using dhisparse::test::scratch_file;
namespace trace = dhisparse::trace;

namespace {

/// Spins for about `cycles` clock cycles, to hold a stream back.
__global__ void spin_kernel(long long cycles)
{
  long long const start = clock64();
  while (clock64() - start < cycles) {}
}

/// The engine's side: per-group selection and score buffers [max_requests][max_queries][top_k]
/// and accepted counts, rewritten every step on `stream` before `record`.
struct engine_buffers {
  trace::shape s;
  std::vector<device_vector<std::int32_t>> selections;
  std::vector<device_vector<float>> scores;
  device_vector<std::int32_t> accepted;
  std::vector<std::int32_t const*> selection_ptrs;
  std::vector<float const*> score_ptrs;

  explicit engine_buffers(trace::shape const& shape) : s{shape}, accepted(std::size_t(shape.max_requests))
  {
    for (int g = 0; g < s.groups; ++g) {
      selections.emplace_back(s.group_entries(s.max_requests));
      selection_ptrs.push_back(selections.back().data());
      if (s.scores) {
        scores.emplace_back(s.group_entries(s.max_requests));
        score_ptrs.push_back(scores.back().data());
      }
    }
  }

  /// Uploads step `rec` (synchronously with respect to the host buffers) and records it.
  void record(trace::recorder& rec_, trace::step_record const& rec, cudaStream_t stream)
  {
    int const count        = int(rec.requests.size());
    std::size_t const part = s.group_entries(count);
    for (int g = 0; g < s.groups; ++g) {
      // Garbage beyond the step's rows: the recorder must not store it.
      DHISPARSE_CUDA_TRY(cudaMemsetAsync(selections[g].data(), 0x7F, selections[g].size() * 4, stream));
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(selections[g].data(), rec.positions.data() + g * part, part * 4,
                                         cudaMemcpyHostToDevice, stream));
      if (s.scores) {
        DHISPARSE_CUDA_TRY(cudaMemcpyAsync(scores[g].data(), rec.scores.data() + g * part, part * 4,
                                           cudaMemcpyHostToDevice, stream));
      }
    }
    std::vector<dhisparse::request_id> ids;
    std::vector<std::int32_t> queries, lengths, acc;
    for (auto const& q : rec.requests) {
      ids.push_back(q.id);
      queries.push_back(q.queries);
      lengths.push_back(q.length);
      acc.push_back(q.accepted);
    }
    if (s.accepted && count > 0) {
      DHISPARSE_CUDA_TRY(cudaMemcpyAsync(accepted.data(), acc.data(), acc.size() * 4, cudaMemcpyHostToDevice, stream));
    }
    trace::device_step step;
    step.ids        = ids.data();
    step.queries    = queries.data();
    step.lengths    = lengths.data();
    step.count      = count;
    step.selections = selection_ptrs.data();
    step.scores     = s.scores ? score_ptrs.data() : nullptr;
    step.accepted   = s.accepted ? accepted.data() : nullptr;
    rec_.record(step, stream);
    // Pageable sources of cudaMemcpyAsync are consumed before it returns; the next
    // step's uploads are ordered after this step's recorder copies on `stream`.
  }
};

/// A non-blocking stream for one test case.
struct test_stream {
  cudaStream_t stream = nullptr;
  test_stream() { DHISPARSE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  test_stream(test_stream const&)            = delete;
  test_stream& operator=(test_stream const&) = delete;
  ~test_stream()
  {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
};

/// One group, no scores or accepted counts, `requests` requests of one query, `top_k`.
trace::shape plain_shape(int requests, int top_k)
{
  trace::shape s;
  s.max_requests = requests;
  s.top_k        = top_k;
  return s;
}

}  // namespace

TEST_CASE("recorded device selections come back from the file exactly", "[trace][gpu]")
{
  auto rng = dhisparse::test::seeded_engine("recorder round trip");
  test_stream const ts;
  cudaStream_t const stream = ts.stream;
  for (bool scores : {false, true}) {
    for (bool accepted : {false, true}) {
      trace::shape const s = dhisparse::test::random_shape(rng, scores, accepted, 300);
      int const steps    = std::uniform_int_distribution<int>(5, 40)(rng);
      auto const source  = dhisparse::test::random_trace(rng, s, steps);
      int const ring     = std::uniform_int_distribution<int>(1, 4)(rng);
      scratch_file file("recorder");
      engine_buffers engine(s);
      {
        trace::recorder rec(file.path(), s, ring);
        for (auto const& step : source) { engine.record(rec, step, stream); }
        rec.flush();
        auto const st = rec.stats();
        CHECK(st.recorded == std::uint64_t(steps));
        CHECK(st.written == std::uint64_t(steps));
        rec.close();
      }
      auto const back = dhisparse::test::read_trace(file.path(), s);
      REQUIRE(back.size() == source.size());
      for (std::size_t i = 0; i < back.size(); ++i) {
        INFO("step " << i << " scores " << scores << " accepted " << accepted << " ring " << ring);
        CHECK(dhisparse::test::same_record(back[i], source[i]));
      }
    }
  }
}

TEST_CASE("record waits only when the ring is full, and counts it", "[trace][gpu]")
{
  auto rng = dhisparse::test::seeded_engine("recorder ring");
  test_stream const ts;
  cudaStream_t const stream = ts.stream;
  trace::shape const s      = plain_shape(2, 64);
  auto const source         = dhisparse::test::random_trace(rng, s, 6);
  engine_buffers engine(s);
  int clock_khz = 0;
  DHISPARSE_CUDA_TRY(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  long long const spin = 200LL * clock_khz;  // ~200 ms

  SECTION("a ring larger than the steps never waits")
  {
    scratch_file file("ring_large");
    trace::recorder rec(file.path(), s, 8);
    spin_kernel<<<1, 1, 0, stream>>>(spin);
    for (auto const& step : source) { engine.record(rec, step, stream); }
    CHECK(rec.stats().ring_full_waits == 0);
    CHECK(rec.stats().written < rec.stats().recorded);  // the GPU is still spinning: nothing blocked
    rec.close();
    CHECK(dhisparse::test::read_trace(file.path(), s).size() == source.size());
  }
  SECTION("a one-slot ring waits behind a slow stream")
  {
    scratch_file file("ring_small");
    trace::recorder rec(file.path(), s, 1);
    for (auto const& step : source) {
      spin_kernel<<<1, 1, 0, stream>>>(spin / 8);
      engine.record(rec, step, stream);
    }
    rec.close();
    CHECK(rec.stats().ring_full_waits >= 1);
    CHECK(rec.stats().ring_full_waits <= source.size() - 1);
    auto const back = dhisparse::test::read_trace(file.path(), s);
    REQUIRE(back.size() == source.size());
    for (std::size_t i = 0; i < back.size(); ++i) { CHECK(dhisparse::test::same_record(back[i], source[i])); }
  }
}

TEST_CASE("errors of the host thread surface at the next call", "[trace][gpu]")
{
  auto rng = dhisparse::test::seeded_engine("recorder errors");
  test_stream const ts;
  cudaStream_t const stream = ts.stream;
  trace::shape const s      = plain_shape(3, 32);
  std::vector<trace::step_record> source;
  do {
    source = dhisparse::test::random_trace(rng, s, 3);
  } while (source[1].requests.empty() || source[1].positions[0] < 0);
  std::int32_t const bad = source[1].requests[0].length + 1 + std::int32_t(rng() % 7);
  source[1].positions[0] = std::max(bad, source[1].positions[0]);
  // Keep the row ascending so the range check is what fails.
  for (int e = 1; e < s.top_k && source[1].positions[e] >= 0; ++e) { source[1].positions[e] = source[1].positions[0] + e; }
  scratch_file file("errors");
  engine_buffers engine(s);
  {
    trace::recorder rec(file.path(), s, 2);
    engine.record(rec, source[0], stream);
    engine.record(rec, source[1], stream);
    CHECK_THROWS_WITH(rec.flush(), Catch::Contains("step 1, group 0, request 0") &&
                                     Catch::Contains("is beyond the request's limit"));
    CHECK_THROWS_WITH(engine.record(rec, source[2], stream), Catch::Contains("is beyond the request's limit"));
    CHECK_THROWS(rec.close());
  }  // the destructor does not throw
  // The steps before the failure are a valid trace.
  auto const back = dhisparse::test::read_trace(file.path(), s);
  REQUIRE(back.size() == 1);
  CHECK(dhisparse::test::same_record(back[0], source[0]));
}

TEST_CASE("record refuses a capturing stream and bad arguments", "[trace][gpu]")
{
  test_stream const ts;
  cudaStream_t const stream = ts.stream;
  trace::shape s            = plain_shape(2, 16);
  s.accepted                = true;
  scratch_file file("capture");
  engine_buffers engine(s);
  trace::recorder rec(file.path(), s, 2);

  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  std::vector<dhisparse::request_id> ids{dhisparse::request_id{1}};
  std::vector<std::int32_t> one{1}, length{100};
  trace::device_step step;
  step.ids        = ids.data();
  step.queries    = one.data();
  step.lengths    = length.data();
  step.count      = 1;
  step.selections = engine.selection_ptrs.data();
  step.accepted   = engine.accepted.data();
  CHECK_THROWS_WITH(rec.record(step, stream), Catch::Contains("capturing a CUDA graph"));
  cudaGraph_t graph;
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(graph));

  step.accepted = nullptr;
  CHECK_THROWS_WITH(rec.record(step, stream), Catch::Contains("accepted is required"));
  step.accepted = engine.accepted.data();
  step.count    = 3;
  CHECK_THROWS_WITH(rec.record(step, stream), Catch::Contains("count (3) is not in [0, max_requests = 2]"));
  step.count = 1;
  one[0]     = 2;
  CHECK_THROWS_WITH(rec.record(step, stream), Catch::Contains("2 queries, not in [1, max_queries = 1]"));
  CHECK(rec.stats().recorded == 0);
  rec.close();
  CHECK(dhisparse::test::read_trace(file.path(), s).empty());
}
