// Draft ring `keep` on the GPU against the host reference: random in-place drafts and kept
// paths (chains, tree paths, ring indices, invalid counts / paths / indices, batch sizes
// below the entries); rows, metadata and status compared after every step; a captured keep
// replayed with new paths.
//
// Tests tagged [small] run under compute-sanitizer (DHISPARSE_TEST_SMALL shrinks them).
#include <dhisparse/draft_ring.cuh>
#include <dhisparse/host/draft_ring.hpp>

#include "gpu_test.cuh"
#include "random.hpp"
#include "ring_keep_ops.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <vector>

using namespace dhisparse;
using test::device_vector;

namespace {

bool small_run() { return std::getenv("DHISPARSE_TEST_SMALL") != nullptr; }

template <class T>
device_vector<T> to_device(std::vector<T> const& v)
{
  return v.empty() ? device_vector<T>() : device_vector<T>(v);
}

template <class T>
std::vector<T> download(T const* p, std::size_t n)
{
  std::vector<T> v(n);
  DHISPARSE_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// The host ring's rows, end and length uploaded into the device ring (the drafter's
/// in-place writes are made on the host copy first).
void upload_ring(draft_ring const& dev, host::draft_ring const& ref)
{
  draft_ring_ref const r = dev.ref();
  DHISPARSE_CUDA_TRY(cudaMemcpy(r.data, ref.rows().data(), ref.rows().size(), cudaMemcpyHostToDevice));
  DHISPARSE_CUDA_TRY(cudaMemcpy(r.end, ref.end().data(), ref.end().size() * 8, cudaMemcpyHostToDevice));
  DHISPARSE_CUDA_TRY(cudaMemcpy(r.length, ref.length().data(), ref.length().size() * 4, cudaMemcpyHostToDevice));
}

void require_same(draft_ring const& dev, host::draft_ring const& ref)
{
  draft_ring_ref const r = dev.ref();
  REQUIRE(download(r.end, std::size_t(r.capacity)) == ref.end());
  REQUIRE(download(r.length, std::size_t(r.capacity)) == ref.length());
  REQUIRE(download(dev.status(), 1)[0] == ref.status());
  REQUIRE(download(r.data, std::size_t(r.data_bytes())) == ref.rows());
}

}  // namespace

TEST_CASE("GPU draft ring keep equals the host reference", "[draft_ring][small]")
{
  auto g = test::seeded_engine("draft ring keep gpu");
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  for (int round = 0; round < (small_run() ? 3 : 10); ++round) {
    int const B = std::uniform_int_distribution<int>(1, 6)(g);
    int const W = std::uniform_int_distribution<int>(1, 20)(g);
    int const L = std::uniform_int_distribution<int>(1, 3)(g);
    std::size_t const row = 16 * std::uniform_int_distribution<int>(1, 4)(g);
    draft_ring dev(B, W, L, row);
    host::draft_ring ref(B, W, L, row, std::byte{0x3C});
    test::keep_model model(B, W);
    for (std::uint32_t step = 1; step <= (small_run() ? 20u : 50u); ++step) {
      test::keep_op const op = test::random_keep_op(ref.ref(), model, g, step);
      test::draft_in_place(ref.ref(), op);
      ref.advance(op.advance.data(), op.max_drafted, nullptr);
      model.advance(op);
      upload_ring(dev, ref);
      DHISPARSE_CUDA_TRY(cudaMemset(dev.status(), 0, 4));
      ref.clear_status();
      auto const drafted = to_device(op.drafted), kept = to_device(op.kept), nodes = to_device(op.nodes),
                 index = to_device(op.ring_index);
      device_vector<std::int32_t> batch(std::vector<std::int32_t>{op.batch});
      dev.keep_async(drafted.data(), kept.data(), nodes.data(), op.stride, index.data(), op.entries, batch.data(),
                     stream);
      ref.keep(op.drafted.data(), op.kept.data(), op.nodes.empty() ? nullptr : op.nodes.data(), op.stride,
               op.ring_index.data(), op.entries, &op.batch);
      DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
      INFO("round " << round << " step " << step);
      REQUIRE(ref.status() == model.keep(op));
      require_same(dev, ref);
      test::check_ring(ref.ref(), model, L);
    }
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("GPU draft ring keep: captured once, replayed with new paths", "[draft_ring][small]")
{
  int const B = 3, W = 12, L = 2, D = 5;
  std::size_t const row = 32;
  auto g                = test::seeded_engine("draft ring keep graph");
  draft_ring dev(B, W, L, row);
  host::draft_ring ref(B, W, L, row, std::byte{0x11});
  DHISPARSE_CUDA_TRY(cudaMemset(dev.ref().data, 0x11, std::size_t(dev.ref().data_bytes())));
  device_vector<std::int32_t> drafted(B), kept(B), nodes(std::size_t(B) * D);
  cudaStream_t stream;
  DHISPARSE_CUDA_TRY(cudaStreamCreate(&stream));
  cudaGraph_t graph{};
  DHISPARSE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  dev.keep_async(drafted.data(), kept.data(), nodes.data(), D, nullptr, B, nullptr, stream);
  DHISPARSE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec{};
  DHISPARSE_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  test::keep_model model(B, W);
  for (std::uint32_t step = 1; step <= 30; ++step) {
    test::keep_op op;
    op.entries = op.batch = B;
    op.generation         = step;
    op.max_drafted        = D;
    op.stride             = D;
    op.advance.resize(B);
    op.ring_index = {0, 1, 2};
    op.drafted.resize(B);
    op.kept.resize(B);
    op.nodes.assign(std::size_t(B) * D, 0);
    for (int b = 0; b < B; ++b) {
      op.advance[b] = op.drafted[b] = std::uniform_int_distribution<int>(0, D)(g);
      op.kept[b]                    = std::uniform_int_distribution<int>(0, op.drafted[b])(g);
      std::int32_t node             = 0;
      for (int k = 0; k < op.kept[b]; ++k) {  // an increasing path ending at most at drafted
        node = std::uniform_int_distribution<int>(node + 1, op.drafted[b] - (op.kept[b] - 1 - k))(g);
        op.nodes[std::size_t(b) * D + k] = node;
      }
    }
    test::draft_in_place(ref.ref(), op);
    ref.advance(op.advance.data(), D, nullptr);
    model.advance(op);
    upload_ring(dev, ref);
    drafted.upload(op.drafted);
    kept.upload(op.kept);
    nodes.upload(op.nodes);
    DHISPARSE_CUDA_TRY(cudaGraphLaunch(exec, stream));
    ref.keep(op.drafted.data(), op.kept.data(), op.nodes.data(), D, nullptr, B, nullptr);
    DHISPARSE_CUDA_TRY(cudaStreamSynchronize(stream));
    REQUIRE(model.keep(op) == 0u);
    require_same(dev, ref);
    test::check_ring(ref.ref(), model, L);
  }
  DHISPARSE_CUDA_TRY(cudaGraphExecDestroy(exec));
  DHISPARSE_CUDA_TRY(cudaGraphDestroy(graph));
  cudaStreamDestroy(stream);
  // Argument checks: a null drafted array or status word is refused before any launch.
  REQUIRE(draft_ring_keep_async(dev.ref(), nullptr, nullptr, nullptr, 0, nullptr, B, nullptr, dev.status(),
                                nullptr) == cudaErrorInvalidValue);
  REQUIRE(draft_ring_keep_async(dev.ref(), drafted.data(), nullptr, nullptr, 0, nullptr, B, nullptr, nullptr,
                                nullptr) == cudaErrorInvalidValue);
  CHECK_THAT(draft_ring_keep_problem(dev.ref(), nullptr, nullptr, 0, B, dev.status()), Catch::Contains("drafted"));
  CHECK_THAT(draft_ring_keep_problem(dev.ref(), drafted.data(), nullptr, 0, B, nullptr), Catch::Contains("status"));
}
