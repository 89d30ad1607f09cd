#!/usr/bin/env bash
# One device call for branch verify-speed2 (issue 14 item 6): the verification kernels'
# exactness tests, compute-sanitizer memcheck and racecheck of their small subset, and the
# benchmark. Run from the repository root on the GPU machine, with these binaries built
# elsewhere (cmake -S . -B build-verify -G Ninja -DCMAKE_BUILD_TYPE=Release; ninja -C
# build-verify tests/verify/test_verify_gpu bench/verify/bench_verify) and carried along:
#
#   build-verify/tests/verify/test_verify_gpu
#   build-verify/bench/verify/bench_verify
#   build-verify/bench/verify/bench_verify_no_prefetch   (optional: the same without the
#                                                         L2 prefetch, for comparison)
#
# Writes to $OUT (default ./devrun-out): devrun_verify.log (every command's output and exit
# status), verify_speed.json (bench_verify --json) and one log per run. Each command has a
# time limit; the sum stays under 6 minutes. The benchmark runs right after the exactness
# tests so that its numbers come back even if a sanitizer run is cut off.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-devrun-out}
mkdir -p "$out"
log=$out/devrun_verify.log
test_bin=build-verify/tests/verify/test_verify_gpu
bench_bin=build-verify/bench/verify/bench_verify
: >"$log"

sanitizer=$(command -v compute-sanitizer || true)
for dir in "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda; do
  [ -n "$sanitizer" ] || [ ! -x "$dir/bin/compute-sanitizer" ] || sanitizer=$dir/bin/compute-sanitizer
done

# run NAME SECONDS CMD…: runs CMD under a time limit, its output into $out/NAME.log and the
# tail of it and its exit status into the summary log.
run() {
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  echo "=== $name: $* (limit ${limit}s)" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  tail -n 40 "$out/$name.log" >>"$log"
  echo "=== $name: exit $rc after $((SECONDS - t0))s" | tee -a "$log"
}

nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv >>"$log" 2>&1 || true
for bin in "$test_bin" "$bench_bin"; do
  [ -x "$bin" ] || echo "missing binary: $bin" | tee -a "$log"
done

# 1. Exactness against the host reference, every test case (full vocabulary, statistics).
run test_verify_gpu 100 "$test_bin"
# 2. The benchmark: B = 512, d = 8, V = 151552; [1 CTA] and [cluster 8] per configuration;
#    then the same without the L2 prefetch (what the prefetch gives, in the same run).
run bench_verify 70 "$bench_bin" --json "$out/verify_speed.json"
if [ -x "$bench_bin"_no_prefetch ]; then
  run bench_verify_no_prefetch 50 "$bench_bin"_no_prefetch --json "$out/verify_speed_no_prefetch.json"
fi
# 3. compute-sanitizer over the [small] subset with small traces.
if [ -n "$sanitizer" ]; then
  export DHISPARSE_TEST_SMALL=1
  run memcheck 70 "$sanitizer" --tool memcheck --error-exitcode 86 "$test_bin" "[small]"
  run racecheck 70 "$sanitizer" --tool racecheck --error-exitcode 86 "$test_bin" "[small]"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/memcheck.log" "$out/racecheck.log" | tee -a "$log"
else
  echo "compute-sanitizer not found: sanitizer runs skipped" | tee -a "$log"
fi
echo "done in ${SECONDS}s" | tee -a "$log"
