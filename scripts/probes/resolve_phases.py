#!/usr/bin/env python3
"""Probe: where one resolve (and resolve_and_retrieve) spends its time, kernel by kernel
and phase by phase, at any batch size of bench/resolve.

Copies include/ and bench/ of a source tree to OUT_DIR, adds `%globaltimer` marks to the
resolve kernels (detail/resolve/lookup.cuh, allocate.cuh, the reclaim check of
detail/reclaim/kernels.cuh) and builds `OUT_DIR/bench_resolve_phases` (sm_90). Each mark
is the earliest (min) or the latest (max) time any block reached that point, in ns of the
global timer; the bench resets them before every timed call and, per configuration,
prints the median of each mark in µs from the first lookup block's start, for `resolve`
alone (R) and for `resolve_and_retrieve` (F):

  phases R: lookup start…end | reclaim check | allocate launched, past its wait (first,
  last) | misses listed | slots taken | victims | rows mapped | rows copied | table
  filled | allocate end | fetch past its wait, end

The marks are not in the library. Two of them add a block barrier to the allocate block
(after the in-block copy and after the slot-table fill: thread 0 would otherwise mark
only its own share), so phase times include one extra `__syncthreads` each. This
script fails loudly when the code it patches has moved.

`--adaptive-q1` builds a variant that separates two causes of the adaptive lookup's
longer time at B = 128, Q = 1 (21.1 µs against static<4096>'s 15.3 on 2026-12-06): the
adaptive hierarchy gets max_queries = 1 (no dead query tiles, lookup's one-entry tiles, as
static<4096> has) and keeps its 8.4 M-slot pool (its resident rows spread over it), and
the bench runs Q = 1 only. If its lookup ends near static<4096>'s, max_queries and the
tiling were the cause; if near 21, the footprint of the slot metadata its hits touch.

Usage: scripts/probes/resolve_phases.py [--adaptive-q1] [SOURCE_TREE] [OUT_DIR]
then e.g. `OUT_DIR/bench_resolve_phases --batches 1,128` on the GPU.
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_tree

adaptive_q1 = '--adaptive-q1' in sys.argv
argv = [a for a in sys.argv if a != '--adaptive-q1']
src, out, patch = probe_tree.start(argv, 'resolve_phases')
if adaptive_q1:
    patch('bench/resolve/resolve.cu', [
        ('  auto ha = make_hierarchy<adaptive>(store, 8, std::int64_t(max_batch) * 16448, stream, false);\n',
         '  auto ha = make_hierarchy<adaptive>(store, 1, std::int64_t(max_batch) * 16448, stream, false);\n'),
        ('      for (int queries : {1, 4, 8}) {\n', '      for (int queries : {1}) {\n'),
    ])


# Mark indices (the bench prints them in this order).
MARKS = [
    ('lookup start', 0, 'min'), ('lookup end', 1, 'max'),
    ('reclaim check start', 2, 'min'), ('reclaim check end', 3, 'max'),
    ('allocate launched', 4, 'min'), ('allocate past wait (first)', 5, 'min'), ('allocate past wait (last)', 6, 'max'),
    ('misses listed', 7, 'max'), ('slots taken', 8, 'max'), ('victims found', 9, 'max'),
    ('rows mapped', 10, 'max'), ('rows copied', 11, 'max'), ('table filled', 12, 'max'),
    ('allocate end', 13, 'max'), ('fetch past wait', 14, 'min'), ('fetch end', 15, 'max'),
]

MACROS = r'''
#define RS_MIN(i) do { if (threadIdx.x == 0) { atomicMin(&::dhisparse::detail::resolve_trace[i], ::dhisparse::detail::probe_now()); } } while (0)
#define RS_MAX(i) do { if (threadIdx.x == 0) { atomicMax(&::dhisparse::detail::resolve_trace[i], ::dhisparse::detail::probe_now()); } } while (0)
'''

# common.cuh's device part sits in namespace dhisparse::detail already.
probe_tree.add_timer_trace(out, 'resolve_phases', 'resolve_trace', 16, MACROS)
patch('include/dhisparse/detail/resolve/lookup.cuh', [
    ('  launch_dependents();  // allocate may be scheduled now; it waits for this grid\'s results\n',
     '  launch_dependents();  // allocate may be scheduled now; it waits for this grid\'s results\n  RS_MIN(0);\n'),
    ('  __syncthreads();  // the totals are reset before the next tile of this block counts\n',
     '  __syncthreads();  // the totals are reset before the next tile of this block counts\n  RS_MAX(1);\n'),
])
patch('include/dhisparse/detail/reclaim/kernels.cuh', [
    ('  wait_for_prerequisites();  // lookup\'s needs and epoch\n',
     '  wait_for_prerequisites();  // lookup\'s needs and epoch\n  RS_MIN(2);\n'),
    ('  if (short_by <= 0) { return; }\n', '  if (short_by <= 0) { RS_MAX(3); return; }\n'),
    ('  run<Eviction, Block>(p, want, members);\n', '  run<Eviction, Block>(p, want, members);\n  RS_MAX(3);\n'),
])
patch('include/dhisparse/detail/resolve/allocate.cuh', [
    ('  __shared__ storage vs;\n  wait_for_prerequisites();  // launched early (programmatic dependent launch)\n',
     '  __shared__ storage vs;\n  RS_MIN(4);\n  wait_for_prerequisites();  // launched early (programmatic dependent launch)\n  RS_MIN(5);\n  RS_MAX(6);\n'),
    ('  __syncthreads();\n\n  if (threadIdx.x == 0) {\n    std::uint32_t f       = 0;',
     '  __syncthreads();\n  RS_MAX(7);\n\n  if (threadIdx.x == 0) {\n    std::uint32_t f       = 0;'),
    ('  slot_sources const from = src;\n', '  slot_sources const from = src;\n  RS_MAX(8);\n'),
    ('  int const found    = found_victims;\n', '  int const found    = found_victims;\n  RS_MAX(9);\n'),
    ('  __syncthreads();  // every new row is mapped, every tail slot and plan entry written\n',
     '  __syncthreads();  // every new row is mapped, every tail slot and plan entry written\n  RS_MAX(10);\n'),
    ('  // Entries left pending by lookup: their rows have slots now (or none: -1). A selected\n',
     '  __syncthreads();\n  RS_MAX(11);\n  // Entries left pending by lookup: their rows have slots now (or none: -1). A selected\n'),
    ('  if constexpr (counts) {\n    __syncthreads();\n    for (int i = threadIdx.x; i < total; i += Block) {',
     '  __syncthreads();\n  RS_MAX(12);\n  if constexpr (counts) {\n    __syncthreads();\n    for (int i = threadIdx.x; i < total; i += Block) {'),
    ('  __syncthreads();  // shared state is reused by the next request of this block\n',
     '  __syncthreads();  // shared state is reused by the next request of this block\n  RS_MAX(13);\n'),
    ('  wait_for_prerequisites();\n  if (*batch_size >= in_block_copy_batch) { return; }\n  retrieve::gather(p);\n',
     '  wait_for_prerequisites();\n  RS_MIN(14);\n  if (*batch_size >= in_block_copy_batch) { RS_MAX(15); return; }\n  retrieve::gather(p);\n  RS_MAX(15);\n'),
])

names = ', '.join(f'"{n}"' for n, _, _ in MARKS)
init = ', '.join('~0ull' if kind == 'min' else '0ull' for _, _, kind in MARKS)
patch('bench/resolve/resolve.cu', [
    ('  std::vector<double> resolve_ms, both_ms, fused_ms;\n',
     '''  std::vector<double> resolve_ms, both_ms, fused_ms;
  static char const* const mark_names[16] = {''' + names + '''};
  unsigned long long const trace_init[16] = {''' + init + '''};
  std::vector<double> marks[2][16];  // [resolve alone, resolve_and_retrieve][mark] µs from lookup start
'''),
    ('    int const mode = s % 3;\n    spin(stream);\n',
     '''    int const mode = s % 3;
    DHISPARSE_CUDA_TRY(cudaMemcpyToSymbolAsync(dhisparse::detail::resolve_trace, trace_init, sizeof trace_init, 0,
                                               cudaMemcpyHostToDevice, stream));
    spin(stream);
'''),
    ('      if (mode == 2) { fused_ms.push_back(a); }\n',
     '''      if (mode == 2) { fused_ms.push_back(a); }
      if (mode != 1) {
        unsigned long long tr[16];
        DHISPARSE_CUDA_TRY(cudaMemcpyFromSymbol(tr, dhisparse::detail::resolve_trace, sizeof tr));
        for (int k = 0; k < 16; ++k) {
          if (tr[k] != trace_init[k] && tr[0] != trace_init[0]) {
            marks[mode / 2][k].push_back(double(static_cast<long long>(tr[k] - tr[0])) / 1e3);
          }
        }
      }
'''),
    ('  t.resolve_us          = 1e3 * bench::median(resolve_ms);\n',
     '''  for (int m = 0; m < 2; ++m) {
    std::printf("  phases %s (B = %d, Q = %d; median µs from the first lookup block's start; %.1f µs by events):\\n",
                m == 0 ? "R (resolve)" : "F (resolve_and_retrieve)", batch, queries,
                1e3 * bench::median(m == 0 ? resolve_ms : fused_ms));
    for (int k = 1; k < 16; ++k) {
      if (!marks[m][k].empty()) { std::printf("    %-28s %7.2f\\n", mark_names[k], bench::median(marks[m][k])); }
    }
  }
  t.resolve_us          = 1e3 * bench::median(resolve_ms);
'''),
])

print(probe_tree.build(out, 'resolve/resolve.cu', 'bench_resolve_phases'))
