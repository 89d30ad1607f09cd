// Probe for finding F14 (docs/reliability.md): does `compute-sanitizer --tool synccheck`
// accept named barriers (`bar.sync id, count`) that two warpgroups reach from different
// code locations while a third warpgroup never joins them? That is the hand-over pattern
// of the MLA attention kernel's consumers (score and value warpgroups, producer apart),
// legal PTX. Build: nvcc -gencode=arch=compute_90,code=sm_90 -o probe named_barrier_synccheck.cu
// Run:   compute-sanitizer --tool synccheck ./probe MODE   (MODE 0, 1 or 2; see below)
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void bar(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }

// 384 threads: warpgroup 0 stays out of barriers 1..3; warpgroups 1 and 2 hand a value over.
// mode 0: both consumers call the barriers from the same code location (a shared loop).
// mode 1: from different code locations (one branch per warpgroup), as the MLA kernel does.
// mode 2: mode 1 plus the first "free" barrier skipped by both (t > 0 / t + 1 < n pairing).
__global__ void probe(int mode, int tiles, int* out)
{
  __shared__ int p[128];
  int const wg  = threadIdx.x / 128;
  int const i   = threadIdx.x % 128;
  int acc       = 0;
  if (wg == 0) {
    for (int t = 0; t < tiles; ++t) { acc += t * i; }
    out[threadIdx.x] = acc;
    return;
  }
  if (mode == 0) {
    for (int t = 0; t < tiles; ++t) {
      if (wg == 1) { p[i] = t + i; }
      bar(1, 256);
      if (wg == 2) { acc += p[i]; }
      bar(2, 256);
    }
  } else if (wg == 1) {
    for (int t = 0; t < tiles; ++t) {
      if (mode == 2 && t > 0) { bar(2, 256); }
      p[i] = t + i;
      bar(1, 256);
      if (mode == 1) { bar(2, 256); }
    }
    bar(3, 256);
  } else {
    for (int t = 0; t < tiles; ++t) {
      bar(1, 256);
      acc += p[i];
      if (mode == 1 || t + 1 < tiles) { bar(2, 256); }  // mode 2: the last is skipped
    }
    bar(3, 256);
  }
  out[threadIdx.x] = acc;
}

int main(int argc, char** argv)
{
  int const mode  = argc > 1 ? std::atoi(argv[1]) : 1;
  int const tiles = 8;
  int* out        = nullptr;
  cudaMalloc(&out, 384 * sizeof(int));
  probe<<<4, 384>>>(mode, tiles, out);
  cudaError_t const e = cudaDeviceSynchronize();
  int host[384];
  cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
  int expect = 0;
  for (int t = 0; t < tiles; ++t) { expect += t + 5; }
  bool const ok = e == cudaSuccess && host[256 + 5] == expect;
  std::printf("mode %d: %s (%s)\n", mode, ok ? "exact" : "WRONG", cudaGetErrorString(e));
  cudaFree(out);
  return ok ? 0 : 1;
}
