// Draft ring on the GPU against the host reference: random append / in-place advance /
// rollback / reset sequences (rows, metadata and status compared after every operation),
// the view read by a kernel, CUDA-graph replay, caller memory and the owner's checks.
//
// Tests tagged [small] are the subset run under compute-sanitizer; with the environment
// variable DHISPARSE_TEST_SMALL set they also shrink their loops (sanitizers are slow).
#include <dhisparse/draft_ring.cuh>
#include <dhisparse/host/draft_ring.hpp>

#include "gpu_test.cuh"
#include "random.hpp"
#include "ring_ops.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

using namespace dhisparse;
using test::device_vector;

namespace {

bool small_run() { return std::getenv("DHISPARSE_TEST_SMALL") != nullptr; }

/// A drafter writing its rows in place: the j-th new row of request b, for j < counts[b],
/// goes to append_slot(b, j); rows are copied from a packed staging buffer.
__global__ void write_in_place(draft_ring_ref ring, std::byte const* rows, std::int32_t const* counts,
                               int max_count, int batch)
{
  int const b = blockIdx.x;
  if (b >= batch || counts[b] < 0 || counts[b] > max_count) { return; }
  for (int j = 0; j < counts[b]; ++j) {
    for (int layer = 0; layer < ring.layers; ++layer) {
      std::byte const* from = rows + ((std::int64_t(b) * max_count + j) * ring.layers + layer) * ring.row_bytes;
      std::byte* to         = ring.row(layer, b, ring.append_slot(b, j));
      for (std::int64_t i = threadIdx.x; i < ring.row_bytes; i += blockDim.x) { to[i] = from[i]; }
    }
  }
}

/// What a draft attention kernel does: read the window, oldest first, into out[b][j][layer].
__global__ void gather_window(draft_ring_ref ring, std::byte* out)
{
  int const b = blockIdx.x;
  for (int j = 0; j < ring.length[b]; ++j) {
    for (int layer = 0; layer < ring.layers; ++layer) {
      std::byte const* from = ring.row(layer, b, ring.slot_of_index(b, j));
      std::byte* to         = out + ((std::int64_t(b) * ring.window + j) * ring.layers + layer) * ring.row_bytes;
      for (std::int64_t i = threadIdx.x; i < ring.row_bytes; i += blockDim.x) { to[i] = from[i]; }
    }
  }
}

/// Device copy of a host vector; an empty vector stays empty (no zero-size copy).
template <class T>
device_vector<T> to_device(std::vector<T> const& v)
{
  return v.empty() ? device_vector<T>() : device_vector<T>(v);
}

/// Runs `op` on the device ring (inputs uploaded) and on the host reference.
void apply_both(draft_ring& dev, host::draft_ring& ref, test::ring_op const& op, cudaStream_t stream)
{
  std::vector<std::int32_t> const batch{op.batch};
  device_vector<std::int32_t> d_batch(batch);
  switch (op.kind) {
    case test::ring_op_kind::append: {
      device_vector<std::byte> rows      = to_device(op.rows);
      device_vector<std::int32_t> counts = to_device(op.counts);
      dev.append_async(draft_ring_rows{rows.data()}, counts.data(), op.max_count, d_batch.data(), stream);
      ref.append(draft_ring_rows{op.rows.data()}, op.counts.data(), op.max_count, batch.data());
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      break;
    }
    case test::ring_op_kind::advance: {
      // The same tagged rows go in place on both sides, through each side's view.
      std::vector<std::byte> staged(std::size_t(ref.ref().capacity) * op.max_count * ref.ref().layers *
                                    ref.ref().row_bytes);
      draft_ring_ref const& r = ref.ref();
      for (int b = 0; b < r.capacity; ++b) {
        for (int j = 0; j < op.max_count; ++j) {
          for (int layer = 0; layer < r.layers; ++layer) {
            test::tag_row(staged.data() + ((std::int64_t(b) * op.max_count + j) * r.layers + layer) * r.row_bytes,
                          r.row_bytes, b, r.end[b] + j, layer, op.generation);
          }
        }
      }
      int const live = std::clamp<int>(op.batch, 0, r.capacity);
      for (int b = 0; b < live; ++b) {
        if (op.counts[b] < 0 || op.counts[b] > op.max_count) { continue; }
        for (int j = 0; j < op.counts[b]; ++j) {
          for (int layer = 0; layer < r.layers; ++layer) {
            std::memcpy(r.row(layer, b, r.append_slot(b, j)),
                        staged.data() + ((std::int64_t(b) * op.max_count + j) * r.layers + layer) * r.row_bytes,
                        std::size_t(r.row_bytes));
          }
        }
      }
      device_vector<std::byte> d_staged  = to_device(staged);
      device_vector<std::int32_t> counts = to_device(op.counts);
      if (r.capacity > 0) {
        write_in_place<<<r.capacity, 64, 0, stream>>>(dev.ref(), d_staged.data(), counts.data(), op.max_count, live);
        DHISPARSE_CUDA_TRY(cudaGetLastError());
      }
      dev.advance_async(counts.data(), op.max_count, d_batch.data(), stream);
      ref.advance(op.counts.data(), op.max_count, batch.data());
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      break;
    }
    case test::ring_op_kind::rollback: {
      device_vector<std::int32_t> drafted = to_device(op.counts), accepted = to_device(op.accepted);
      dev.rollback_async(drafted.data(), op.accepted.empty() ? nullptr : accepted.data(), d_batch.data(), stream);
      ref.rollback(op.counts.data(), op.accepted.empty() ? nullptr : op.accepted.data(), batch.data());
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      break;
    }
    case test::ring_op_kind::reset: {
      device_vector<std::int32_t> requests = to_device(op.requests);
      device_vector<std::int64_t> start     = to_device(op.start);
      dev.reset_async(requests.data(), op.start.empty() ? nullptr : start.data(), int(op.requests.size()), stream);
      ref.reset(op.requests.data(), op.start.empty() ? nullptr : op.start.data(), int(op.requests.size()));
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      break;
    }
  }
}

template <class T>
std::vector<T> download(T const* ptr, std::size_t n)
{
  std::vector<T> out(n);
  if (n) { DHISPARSE_CUDA_TRY(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost)); }
  return out;
}

void require_same(draft_ring const& dev, host::draft_ring const& ref)
{
  draft_ring_ref const r = dev.ref();
  REQUIRE(download(r.end, r.capacity) == ref.end());
  REQUIRE(download(r.length, r.capacity) == ref.length());
  REQUIRE(download(dev.status(), 1)[0] == ref.status());
  REQUIRE(download(r.data, std::size_t(r.data_bytes())) == ref.rows());
}

}  // namespace

TEST_CASE("GPU draft ring equals the host reference over random operation sequences", "[draft_ring][small]")
{
  auto g = test::seeded_engine("draft ring gpu");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  for (int round = 0; round < (small_run() ? 2 : 6); ++round) {
    int const B = std::uniform_int_distribution<int>(1, 6)(g);
    int const W = std::uniform_int_distribution<int>(1, 24)(g);
    int const L = std::uniform_int_distribution<int>(1, 3)(g);
    std::size_t const row = 16 * std::uniform_int_distribution<int>(1, 5)(g);
    draft_ring dev(B, W, L, row);
    host::draft_ring ref(B, W, L, row, std::byte{0xAB});
    DHISPARSE_CUDA_TRY(cudaMemset(dev.ref().data, 0xAB, std::size_t(dev.ref().data_bytes())));
    for (std::uint32_t step = 1; step <= (small_run() ? 25u : 60u); ++step) {
      test::ring_op const op = test::random_op(ref.ref(), ref.end(), g, step);
      INFO("round " << round << " step " << step << " op " << int(op.kind));
      apply_both(dev, ref, op, stream);
      require_same(dev, ref);
      // The window as a draft attention kernel reads it.
      device_vector<std::byte> out(std::size_t(B) * W * L * row);
      out.fill_bytes(0x11);
      gather_window<<<B, 64, 0, stream>>>(dev.ref(), out.data());
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      std::vector<std::byte> const got = out.download();
      draft_ring_ref const& r          = ref.ref();
      for (int b = 0; b < B; ++b) {
        for (int j = 0; j < r.length[b]; ++j) {
          for (int layer = 0; layer < L; ++layer) {
            REQUIRE(std::memcmp(got.data() + ((std::int64_t(b) * W + j) * L + layer) * row,
                                r.row(layer, b, r.slot_of_index(b, j)), row) == 0);
          }
        }
      }
    }
    if (ref.status() != 0) {
      CHECK_THROWS_WITH(dev.check_status_sync(stream), Catch::Contains("draft_ring: invalid input"));
      CHECK(download(dev.status(), 1)[0] == 0u);  // read and cleared
    }
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("GPU draft ring: a captured append + rollback replays with new counts", "[draft_ring][small]")
{
  int const B = 4, W = 16, L = 2, max_count = 9;
  std::size_t const row = 64;
  auto g                = test::seeded_engine("draft ring graph");
  draft_ring dev(B, W, L, row);
  host::draft_ring ref(B, W, L, row, std::byte{0x5C});
  DHISPARSE_CUDA_TRY(cudaMemset(dev.ref().data, 0x5C, std::size_t(dev.ref().data_bytes())));
  device_vector<std::byte> rows(std::size_t(B) * max_count * L * row);
  device_vector<std::int32_t> drafted(B), accepted(B);
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  dev.append_async(draft_ring_rows{rows.data()}, drafted.data(), max_count, nullptr, stream);
  dev.rollback_async(drafted.data(), accepted.data(), nullptr, stream);
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  for (std::uint32_t step = 1; step <= 12; ++step) {
    std::vector<std::int32_t> d(B), a(B);
    std::vector<std::byte> staged(rows.size());
    for (int b = 0; b < B; ++b) {
      d[b] = std::uniform_int_distribution<int>(0, max_count)(g);
      a[b] = std::uniform_int_distribution<int>(0, d[b])(g);
      for (int j = 0; j < max_count; ++j) {
        for (int layer = 0; layer < L; ++layer) {
          test::tag_row(staged.data() + ((std::size_t(b) * max_count + j) * L + layer) * row, row, b,
                        ref.end()[b] + j, layer, step);
        }
      }
    }
    drafted.upload(d);
    accepted.upload(a);
    rows.upload(staged);
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    ref.append(draft_ring_rows{staged.data()}, d.data(), max_count, nullptr);
    ref.rollback(d.data(), a.data(), nullptr);
    INFO("replay " << step);
    require_same(dev, ref);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("GPU draft ring: caller memory, bounded memory and argument checks", "[draft_ring][small]")
{
  std::size_t const bytes = draft_ring::rows_bytes(3, 2048, 2, 656 + 16 - 656 % 16);
  device_vector<std::byte> memory(bytes);
  {
    draft_ring ring(3, 2048, 2, 672, memory.data(), bytes);
    CHECK(ring.ref().data == memory.data());
    CHECK(ring.memory_bytes() == bytes + 3 * 12 + 16);
    draft_ring moved = std::move(ring);
    CHECK(moved.ref().data == memory.data());
    CHECK(ring.ref().data == nullptr);
  }  // caller memory is not freed: the device_vector frees it
  CHECK_THROWS_WITH(draft_ring(3, 2048, 2, 672, memory.data(), bytes - 16), Catch::Contains("rows_size"));
  CHECK_THROWS_WITH(draft_ring(3, 2048, 2, 650), Catch::Contains("row_bytes"));
  CHECK_THROWS_WITH(draft_ring(3, 0, 2, 64), Catch::Contains("window"));
  draft_ring ring(2, 4, 1, 32);
  device_vector<std::int32_t> counts(std::vector<std::int32_t>{1, 1});
  CHECK(draft_ring_advance_async(ring.ref(), counts.data(), -1, nullptr, ring.status(), nullptr) ==
        cudaErrorInvalidValue);
  CHECK_THAT(draft_ring_advance_problem(ring.ref(), counts.data(), -1, ring.status()), Catch::Contains("max_count"));
  CHECK(draft_ring_append_async(ring.ref(), draft_ring_rows{nullptr}, counts.data(), 2, nullptr, ring.status(),
                                nullptr) == cudaErrorInvalidValue);
  CHECK_THAT(draft_ring_append_problem(ring.ref(), draft_ring_rows{nullptr}, counts.data(), 2, ring.status()),
             Catch::Contains("staging buffer"));
  draft_ring_ref misaligned = ring.ref();
  misaligned.row_bytes      = 40;
  CHECK(draft_ring_rollback_async(misaligned, counts.data(), nullptr, nullptr, ring.status(), nullptr) ==
        cudaErrorInvalidValue);
  CHECK_THAT(draft_ring_rollback_problem(misaligned, counts.data(), ring.status()), Catch::Contains("row_bytes"));
  CHECK_THAT(draft_ring_reset_problem(ring.ref(), nullptr, 1, ring.status()), Catch::Contains("requests"));
  CHECK_THROWS_WITH(ring.advance_async(counts.data(), -1, nullptr, nullptr), Catch::Contains("max_count"));
}
