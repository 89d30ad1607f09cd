#!/usr/bin/env bash
# Runs bench_indexer on the GPU machine, from the repository root (about 4 minutes at most):
# the new kernels on every configuration, then with --old (the previous kernels timed in
# the same run), then compute-sanitizer memcheck and racecheck on --small. Uses
# build/bench/serving/bench_indexer when it runs on this machine; otherwise builds it in
# build-dev (cmake + ninja, sm_90a).
set -u
cd "$(dirname "$0")"
bin=build/bench/serving/bench_indexer
"$bin" --no-such-flag >/dev/null 2>&1
if [ $? -ne 2 ]; then
  echo "== $bin does not run here: building build-dev/bench/serving/bench_indexer"
  timeout 300 cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    timeout 300 ninja -C build-dev bench_indexer || { echo "build failed"; exit 1; }
  bin=build-dev/bench/serving/bench_indexer
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader || true
status=0
run() {
  echo "== $*"
  "$@"
  local rc=$?
  echo "== rc=$rc"
  [ $rc -eq 0 ] || status=1
}
out=${OUT:-.}
run timeout 50 "$bin" --json "$out/indexer_new.json"
run timeout 70 "$bin" --old --json "$out/indexer_old.json"
run timeout 20 "$bin" --small
run timeout 40 "$sanitizer" --tool memcheck --error-exitcode 3 "$bin" --small --reps 1
# racecheck one kernel at a time (the top-K kernel runs in clusters, with distributed shared memory)
run timeout 35 "$sanitizer" --tool racecheck --error-exitcode 3 "$bin" --small --reps 1 --only scores
run timeout 35 "$sanitizer" --tool racecheck --error-exitcode 3 "$bin" --small --reps 1 --only topk
echo "== overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
