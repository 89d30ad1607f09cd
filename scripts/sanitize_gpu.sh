#!/usr/bin/env bash
# compute-sanitizer over every GPU test of a build dir (CTest label "gpu"): memcheck (with
# leak checking), racecheck, synccheck and initcheck, one run per (tool, test), with the
# tests' small traces (DHISPARSE_TEST_SMALL=1) and a time limit per run. Writes one log per
# run to <build-dir>/sanitize-gpu/<tool>.<test>.log, prints each run's summary line and
# each tool's totals, and exits non-zero when any run reports an error, fails, times out
# or is not started before the overall deadline. Made for one device call before a GPU
# issue is resolved (docs/reliability.md). Where compute-sanitizer is absent it says so
# and exits 0; tests that find no CUDA device count as skipped.
#
#   scripts/sanitize_gpu.sh [build-dir]     (default: build; configured and built if needed)
#   SANITIZE_TOOLS="memcheck racecheck"     tools to run (default: all four)
#   SANITIZE_TESTS=regex                    only the GPU tests whose name matches
#   SANITIZE_RUN_S=N                        time limit of one run (default: 300)
#   SANITIZE_DEADLINE_S=N                   start no run after N seconds (default: 540,
#                                           so that one 600 s device call ends with the summary)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh
build=${1:-build}
tools=${SANITIZE_TOOLS:-"memcheck racecheck synccheck initcheck"}
filter=${SANITIZE_TESTS:-}
run_limit=${SANITIZE_RUN_S:-300}
deadline=${SANITIZE_DEADLINE_S:-540}

cuda_on_path
sanitizer=$(command -v compute-sanitizer || true)
for dir in "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda; do
  [ -n "$sanitizer" ] || [ ! -x "$dir/bin/compute-sanitizer" ] || sanitizer=$dir/bin/compute-sanitizer
done
if [ -z "$sanitizer" ]; then
  echo "sanitize_gpu: compute-sanitizer not found (not on PATH, not in \$CUDA_HOME/bin or /usr/local/cuda/bin): skipped"
  exit 0
fi
command -v python3 >/dev/null || install_missing python3

if [ ! -f "$build/CMakeCache.txt" ]; then
  install_build_tools
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --target dhisparse_gpu_tests --parallel "$(nproc)"

# name, working directory and command line of each GPU test, tab-separated.
mapfile -t tests < <(ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    wd = next((p["value"] for p in t.get("properties", []) if p["name"] == "WORKING_DIRECTORY"), ".")
    print("\t".join([t["name"], wd] + t.get("command", [])))')
[ ${#tests[@]} -gt 0 ] || { echo "sanitize_gpu: no GPU tests in $build"; exit 1; }

logs="$build/sanitize-gpu"
mkdir -p "$logs"
bad=0
start=$SECONDS
echo "compute-sanitizer: $("$sanitizer" --version | tail -1); logs in $logs"
for tool in $tools; do
  args=(--tool "$tool" --error-exitcode 86)
  [ "$tool" != memcheck ] || args+=(--leak-check full)
  declare -A count=([ok]=0 [errors]=0 [failed]=0 [timeout]=0 [skipped]=0 [not-run]=0)
  for line in "${tests[@]}"; do
    IFS=$'\t' read -r -a field <<<"$line"
    name=${field[0]} dir=${field[1]} cmd=("${field[@]:2}")
    [[ -z "$filter" || "$name" =~ $filter ]] || continue
    log="$logs/$tool.$name.log"
    if (( SECONDS - start >= deadline )); then
      result=not-run summary="deadline of ${deadline}s reached"
      echo "not run: deadline" >"$log"
    else
      t0=$SECONDS rc=0
      (cd "$dir" && DHISPARSE_TEST_SMALL=1 timeout --kill-after=30 "$run_limit" "$sanitizer" "${args[@]}" "${cmd[@]}") \
        >"$log" 2>&1 || rc=$?
      case $rc in
        0) result=ok ;;
        77) result=skipped ;;
        86) result=errors ;;
        124 | 137) result=timeout ;;
        *) result=failed ;;
      esac
      # A summary that counts errors is an error whatever the exit code says (racecheck's
      # warnings are shown, not counted).
      summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=* *//') || true
      errors=$(grep -oE '(SUMMARY: |\()[0-9]+ error' <<<"$summary" | grep -oE '[0-9]+' | head -1) || true
      if [ "$result" = ok ] && [ "${errors:-0}" -gt 0 ]; then result=errors; fi
      summary="${summary:-no summary line} ($((SECONDS - t0))s)"
    fi
    count[$result]=$((count[$result] + 1))
    case $result in ok | skipped) ;; *) bad=1 ;; esac
    printf '%-10s %-38s %-8s %s\n' "$tool" "$name" "$result" "$summary"
  done
  echo "== $tool: ${count[ok]} clean, ${count[errors]} with errors, ${count[failed]} failed," \
       "${count[timeout]} timed out, ${count[skipped]} skipped (no device), ${count[not-run]} not run"
  unset count
done
exit $bad
