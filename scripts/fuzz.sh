#!/usr/bin/env bash
# Bounded fuzzing (CI): builds the libFuzzer targets of fuzz/ with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer, then runs each for FUZZ_SECONDS from its seed corpus
# (fuzz/corpus/<target>/) plus what earlier runs in the same build dir found. A crash, a
# sanitizer report, a harness finding, an input slower than 10 s or an allocation over
# 1 GiB fails the run; the input is kept in <build-dir>/artifacts/<target>/ and becomes a
# regression test (tests/fuzz_regressions/inputs/<target>/; docs/reliability.md).
#
#   scripts/fuzz.sh [build-dir]                      (default: build-fuzz)
#   FUZZ_SECONDS=N      seconds per target (default: 60)
#   FUZZ_TARGETS="…"    targets to run (default: all five)
#   JOBS=N              parallel build jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh
build=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"trace_reader hierarchy_config selections verify_inputs host_layout"}
jobs=${JOBS:-$(nproc)}

install_build_tools
command -v clang++ >/dev/null || install_missing clang
probe='extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'
if ! echo "$probe" | clang++ -x c++ -fsanitize=fuzzer,address,undefined - -o /dev/null 2>/dev/null; then
  install_missing libclang-rt-dev  # libFuzzer and the sanitizer runtimes of Debian's clang
fi
cuda_on_path  # find_package(CUDAToolkit): the library's headers include cuda_runtime_api.h

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DDHISPARSE_BUILD_FUZZERS=ON -DDHISPARSE_SANITIZE=address,undefined,float-cast-overflow \
  -DDHISPARSE_BUILD_TESTS=OFF -DDHISPARSE_BUILD_EXAMPLES=OFF -DDHISPARSE_BUILD_BENCHMARKS=OFF \
  -DDHISPARSE_BUILD_TOOLS=OFF
cmake --build "$build" --parallel "$jobs" --target $(printf 'fuzz_%s ' $targets)

export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
failed=0
printf '%-18s %12s %9s %8s  %s\n' target executions "exec/s" corpus result
for t in $targets; do
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t"
  log="$build/fuzz_$t.log"
  touch "$build/fuzz_$t.start"  # what this run leaves in artifacts/ is newer
  rc=0
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" "$build/corpus/$t" "fuzz/corpus/$t" \
    >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  size=$(find "$build/corpus/$t" -type f | wc -l)
  result="ok"
  if [ "$rc" -ne 0 ]; then
    failed=1
    result="FAILED (exit $rc): $(find "$build/artifacts/$t" -type f -newer "$build/fuzz_$t.start" | tr '\n' ' ')— log $log"
  fi
  printf '%-18s %12s %9s %8s  %s\n' "$t" "${runs:-?}" "${rate:-?}" "$size" "$result"
  if [ "$rc" -ne 0 ]; then grep -E -m 20 'ERROR|FINDING|runtime error|SUMMARY|Test unit written' "$log" || tail -20 "$log"; fi
done
exit $failed
