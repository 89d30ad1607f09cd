#!/usr/bin/env python3
"""Probe: where a reclaim spends its time, phase by phase.

Copies include/ and bench/ of a source tree to OUT_DIR, adds `%globaltimer` marks at the
phase boundaries of the reclaim kernel's global-order path (detail/reclaim/kernels.cuh:
1 sample, 2 candidates up to the bound, 3 the bounds' barrier (and the rest), 4 the packed
select, 5 release, 6 the scratch reset by the last block) and a print of them after each timed reclaim of
bench/resolve, and builds `OUT_DIR/bench_resolve_phases` (sm_90). Run it on the GPU like
bench_resolve (e.g. `--batches 128`): each timed reclaim prints
`trace us: 1:<sample end> … 6:<release barrier> | want … in_bound … n … key_bits … tie_bits …`,
microseconds from the kernel's start as block 0 sees them. The marks are not in the
library: this script fails loudly when the code it patches has moved.

Usage: scripts/probes/reclaim_phases.py [SOURCE_TREE] [OUT_DIR]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_tree

src, out, patch = probe_tree.start(sys.argv, 'reclaim_phases')

patch('include/dhisparse/detail/reclaim/kernels.cuh', [
    ('inline constexpr int block_size = 512;', '''inline constexpr int block_size = 512;
__device__ unsigned long long reclaim_trace[32];
#define RC_MARK(i) do { if (blockIdx.x == 0 && threadIdx.x == 0) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); reclaim_trace[i] = t; } } while (0)
#define RC_INFO(i, v) do { if (blockIdx.x == 0 && threadIdx.x == 0) { reclaim_trace[16 + (i)] = (unsigned long long)(v); } } while (0)'''),
    ('  std::uint64_t const bound = samples(p, want, limit) ? sample_bound<Eviction, Block>(p, want, limit, blocks) : ~0ull;',
     '  RC_MARK(0);\n  std::uint64_t const bound = samples(p, want, limit) ? sample_bound<Eviction, Block>(p, want, limit, blocks) : ~0ull;\n  RC_MARK(1);'),
    ('  publish_bounds();\n  blocks.sync();\n  if (bound != ~0ull) {', '  RC_MARK(2);\n  publish_bounds();\n  blocks.sync();\n  if (bound != ~0ull) {'),
    ('  int const n = *count + *reinterpret_cast<int const*>(s.scalars + s_rest);',
     '  int const n = *count + *reinterpret_cast<int const*>(s.scalars + s_rest);\n'
     '  RC_MARK(3); RC_INFO(0, want); RC_INFO(1, *count); RC_INFO(2, n); RC_INFO(3, bound); RC_INFO(8, blocks.size);'),
    ('      std::uint64_t threshold = ~0ull;  // every candidate when t = n',
     '      RC_INFO(4, packed_key_bits); RC_INFO(5, packed_tie_bits);\n      std::uint64_t threshold = ~0ull;  // every candidate when t = n'),
    ('      release_candidates<Block>(p, n, blocks, [&](std::int32_t slot, std::int32_t) {',
     '      RC_MARK(4);\n      release_candidates<Block>(p, n, blocks, [&](std::int32_t slot, std::int32_t) {'),
    ('      reset_scratch<Block>(p, blocks);\n      return;', '      RC_MARK(5);\n      reset_scratch<Block>(p, blocks);\n      RC_MARK(6);\n      return;'),
])
patch('bench/resolve/resolve.cu', [
    ('      if (c1.reclaimed_rows - c0.reclaimed_rows == std::uint64_t(release)) { ms.push_back(t); }',
     '''      if (c1.reclaimed_rows - c0.reclaimed_rows == std::uint64_t(release)) { ms.push_back(t); }
      unsigned long long tr[32];
      DHISPARSE_CUDA_TRY(cudaMemcpyFromSymbol(tr, dhisparse::detail::reclaim::reclaim_trace, sizeof tr));
      std::printf("trace us:");
      for (int k = 1; k <= 6; ++k) { std::printf(" %d:%.1f", k, tr[k] >= tr[0] && tr[k] < tr[0] + 10000000 ? (tr[k] - tr[0]) / 1e3 : -1.0); }
      std::printf(" | want %llu in_bound %llu n %llu bound %llu key_bits %llu tie_bits %llu grid %llu\\n",
                  tr[16], tr[17], tr[18], tr[19], tr[20], tr[21], tr[24]);
      std::memset(tr, 0, sizeof tr);
      DHISPARSE_CUDA_TRY(cudaMemcpyToSymbol(dhisparse::detail::reclaim::reclaim_trace, tr, sizeof tr));'''),
])
print(probe_tree.build(out, 'resolve/resolve.cu', 'bench_resolve_phases'))
