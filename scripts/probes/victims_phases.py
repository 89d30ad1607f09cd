#!/usr/bin/env python3
"""Probe: what the victim search of per-request budgets does in each step of bench/resolve
(issue 12: static<16448> at Q = 4 / 8 spends 47-52 us of a B = 128 resolve finding ~28
victims a request, docs/benchmarks.md "resolve", 2026-12-05).

Copies include/ and bench/ of a source tree to OUT_DIR, adds counters to
detail/resolve/victims.cuh and builds `OUT_DIR/bench_victims_phases` (sm_90). Per step
(every step of every configuration, summed over the step's requests):

  searches   calls of `smallest_key_victims` (requests that needed victims)
  rescans    full rescans of an owned list (cache invalid or exhausted)
  deep       deep rescans (the cache's rows were all pinned or dirty: the next C above it)
  ties       rescans that took the tie-break passes (not whole keys)
  rounds     the most cache rounds one request took
  longest    the longest rescan of the step, µs (`%globaltimer`, one block's view)
  rescan µs  all rescans' time summed over blocks
  pass 1 / threshold / compaction / sort µs
             the rescans' phases, each summed over blocks: the first pass over the owned
             list (keys and their range), the key (and tie-break) levels of the select,
             the compaction of the chosen rows, the block sort and the cache write

and per configuration prints the median and the maximum over the timed steps. The counters
are not in the library; this script fails loudly when the code it patches has moved.

Usage: scripts/probes/victims_phases.py [SOURCE_TREE] [OUT_DIR]
then e.g. `OUT_DIR/bench_victims_phases --batches 1,128` on the GPU.
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_tree

src, out, patch = probe_tree.start(sys.argv, 'victims_phases')


COUNTERS = ['searches', 'rescans', 'deep', 'ties', 'rounds', 'longest us', 'rescan us',
            'pass 1 us', 'threshold us', 'compaction us', 'sort us']

probe_tree.add_timer_trace(out, 'victims_phases', 'victims_trace', 12)
patch('include/dhisparse/detail/resolve/victims.cuh', [
    # rescan: count it (deep or not) and time it
    ('  victim_cache_ref const& cache = pool.cache;\n  std::int32_t const n          = pool.owned_count[r];\n'
     '  std::int32_t const* owned     = pool.owned + std::int64_t(r) * pool.max_owned;\n',
     '  victim_cache_ref const& cache = pool.cache;\n  std::int32_t const n          = pool.owned_count[r];\n'
     '  std::int32_t const* owned     = pool.owned + std::int64_t(r) * pool.max_owned;\n'
     '  unsigned long long const probe_t0 = ::dhisparse::detail::probe_now();\n'
     '  if (threadIdx.x == 0) {\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[1], 1ull);\n'
     '    if (deep) { atomicAdd(&::dhisparse::detail::victims_trace[2], 1ull); }\n'
     '  }\n'),
    ('    cache.flags[r] = 1u | (total <= capacity ? 2u : 0u);\n  }\n  __syncthreads();\n}\n',
     '    cache.flags[r] = 1u | (total <= capacity ? 2u : 0u);\n'
     '    unsigned long long const probe_t4 = ::dhisparse::detail::probe_now();\n'
     '    unsigned long long const d = probe_t4 - probe_t0;\n'
     '    atomicMax(&::dhisparse::detail::victims_trace[5], d);\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[6], d);\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[7], probe_t1 - probe_t0);\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[8], probe_t2 - probe_t1);\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[9], probe_t3 - probe_t2);\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[10], probe_t4 - probe_t3);\n'
     '  }\n  __syncthreads();\n}\n'),
    # the rescan's phases: first pass, threshold (key and tie levels), compaction, sort
    ('  __syncthreads();\n  int const total = s.count;\n',
     '  __syncthreads();\n  int const total = s.count;\n'
     '  unsigned long long const probe_t1 = ::dhisparse::detail::probe_now();\n'),
    ('  if (total > capacity) { block_threshold<Block>(n, capacity, max(1, capacity / 2), s.kmin, s.kmax, get, tkey, ttie); }\n',
     '  if (total > capacity) { block_threshold<Block>(n, capacity, max(1, capacity / 2), s.kmin, s.kmax, get, tkey, ttie); }\n'
     '  unsigned long long const probe_t2 = ::dhisparse::detail::probe_now();\n'),
    ('  int const m        = s.taken;\n',
     '  unsigned long long const probe_t3 = ::dhisparse::detail::probe_now();\n  int const m        = s.taken;\n'),
    # the tie-break passes of block_threshold
    ('  // The tie-break among the rows with the threshold key (per thread, then per warp).\n',
     '  // The tie-break among the rows with the threshold key (per thread, then per warp).\n'
     '  if (threadIdx.x == 0) { atomicAdd(&::dhisparse::detail::victims_trace[3], 1ull); }\n'),
    # searches and rounds
    ('  if (deep && threadIdx.x == 0) { cache.flags[r] = 0; }  // a deep cache lacks the rows below it\n',
     '  if (deep && threadIdx.x == 0) { cache.flags[r] = 0; }  // a deep cache lacks the rows below it\n'
     '  if (threadIdx.x == 0) {\n'
     '    atomicAdd(&::dhisparse::detail::victims_trace[0], 1ull);\n'
     '    atomicMax(&::dhisparse::detail::victims_trace[4], (unsigned long long)rounds_run);\n'
     '  }\n'),
    ('  int const rounds = s.rounds;\n  for (int round = 0; round < rounds && found < need; ++round) {\n',
     '  int const rounds = s.rounds;\n  int rounds_run = 0;\n'
     '  for (int round = 0; round < rounds && found < need; ++round) {\n    ++rounds_run;\n'),
])

names = ', '.join(f'"{n}"' for n in COUNTERS)
patch('bench/resolve/resolve.cu', [
    ('  std::vector<double> resolve_ms, both_ms, fused_ms;\n',
     '''  std::vector<double> resolve_ms, both_ms, fused_ms;
  static char const* const counter_names[11] = {''' + names + '''};
  std::vector<double> counters[11];  // per timed step
'''),
    ('    int const mode = s % 3;\n    spin(stream);\n',
     '''    int const mode = s % 3;
    {
      unsigned long long const zero[12] = {};
      DHISPARSE_CUDA_TRY(cudaMemcpyToSymbolAsync(dhisparse::detail::victims_trace, zero, sizeof zero, 0,
                                                 cudaMemcpyHostToDevice, stream));
    }
    spin(stream);
'''),
    ('      if (mode == 2) { fused_ms.push_back(a); }\n',
     '''      if (mode == 2) { fused_ms.push_back(a); }
      unsigned long long tr[12];
      DHISPARSE_CUDA_TRY(cudaMemcpyFromSymbol(tr, dhisparse::detail::victims_trace, sizeof tr));
      for (int k = 0; k < 11; ++k) { counters[k].push_back(k >= 5 ? double(tr[k]) / 1e3 : double(tr[k])); }
'''),
    ('  t.resolve_us          = 1e3 * bench::median(resolve_ms);\n',
     '''  std::printf("  victim search per step (B = %d, Q = %d; median / max over %zu steps):", batch, queries,
              counters[0].size());
  for (int k = 0; k < 11; ++k) {
    double const most = counters[k].empty() ? 0.0 : *std::max_element(counters[k].begin(), counters[k].end());
    std::printf("  %s %.1f / %.1f", counter_names[k], counters[k].empty() ? 0.0 : bench::median(counters[k]), most);
  }
  std::printf("\\n");
  t.resolve_us          = 1e3 * bench::median(resolve_ms);
'''),
])

print(probe_tree.build(out, 'resolve/resolve.cu', 'bench_victims_phases'))
