#!/usr/bin/env bash
# compute-sanitizer over every GPU test of a build dir (CTest label "gpu"): memcheck (with
# leak checking), racecheck, synccheck and initcheck, one run per (tool, test), with the
# tests' small traces (DHISPARSE_TEST_SMALL=1) and a time limit per run. Writes one log per
# run to <logs>/<tool>.<test>.log, prints each run's summary line and each tool's totals,
# and exits non-zero when any run reports an error, fails, times out or is not started
# before the overall deadline. Made for one device call before a GPU issue is resolved
# (docs/reliability.md). Where compute-sanitizer is absent it says so and exits 0; tests
# that find no CUDA device count as skipped.
#
#   scripts/sanitize_gpu.sh [build-dir]     (default: build; configured and built if needed;
#                                           logs in <build-dir>/sanitize-gpu)
#   scripts/sanitize_gpu.sh --binaries DIR  every executable test_*gpu* under DIR (test
#                                           binaries built elsewhere and copied to the GPU
#                                           machine; nothing is built; logs in DIR/sanitize-gpu)
#   SANITIZE_TOOLS="memcheck racecheck"     tools to run (default: all four)
#   SANITIZE_TESTS=regex                    only the GPU tests whose name matches
#   SANITIZE_JOBS=N                         runs at a time on the one GPU (default: 1);
#                                           compute-sanitizer is bound by the host CPU
#   SANITIZE_ALL_CASES=1                    every test case, also in test files that tag a
#                                           subset [small] for the sanitizers (the default
#                                           runs only that subset there)
#   SANITIZE_SPLIT=regex                    tests whose name matches run one Catch2 test case
#                                           per run (shorter runs that spread over the jobs)
#   SANITIZE_EXPECTED_OOM=regex             tests that provoke allocation failures on purpose
#                                           (default: test_peers_gpu, its fault scenarios):
#                                           their "cudaErrorMemoryAllocation" API errors are
#                                           counted apart, not as errors
#   SANITIZE_INITCHECK_API=yes              initcheck also checks the sources of cudaMemcpy /
#                                           cudaMemset (default: no — the tests download whole
#                                           device buffers, rows never written included, to
#                                           compare them; device-side reads are always checked)
#   SANITIZE_SKIP=regex                     runs whose "tool test" matches are skipped (default:
#                                           synccheck of the sparse attention tests — synccheck
#                                           does not model named barriers that warpgroups reach
#                                           from different code locations, finding F14)
#   SANITIZE_FIRST=regex                    runs whose "tool test" matches start first (the
#                                           long ones, so that they end before the others)
#   SANITIZE_RUN_S=N                        time limit of one run (default: 300)
#   SANITIZE_DEADLINE_S=N                   start no run after N seconds (default: 540,
#                                           so that one 600 s device call ends with the summary)
#   SANITIZE_LOGS=DIR                       where the logs go
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh
binaries=""
if [ "${1:-}" = --binaries ]; then
  binaries=${2:?"--binaries needs a directory"}
  build=$binaries
else
  build=${1:-build}
fi
tools=${SANITIZE_TOOLS:-"memcheck racecheck synccheck initcheck"}
filter=${SANITIZE_TESTS:-}
jobs=${SANITIZE_JOBS:-1}
split=${SANITIZE_SPLIT:-}
expected_oom=${SANITIZE_EXPECTED_OOM:-test_peers_gpu}
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

if [ -n "$binaries" ]; then
  # name, working directory and command line of each GPU test, tab-separated.
  mapfile -t tests < <(find "$binaries" -type f -perm -u+x -name 'test_*gpu*' | sort |
                       while read -r exe; do printf '%s\t%s\t%s\n' "$(basename "$exe")" "$(dirname "$exe")" "$(realpath "$exe")"; done)
else
  if [ ! -f "$build/CMakeCache.txt" ]; then
    install_build_tools
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  cmake --build "$build" --target dhisparse_gpu_tests --parallel "$(nproc)"
  mapfile -t tests < <(ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    wd = next((p["value"] for p in t.get("properties", []) if p["name"] == "WORKING_DIRECTORY"), ".")
    print("\t".join([t["name"], wd] + t.get("command", [])))')
fi
logs=$(realpath -m "${SANITIZE_LOGS:-$build/sanitize-gpu}")
mkdir -p "$logs"
start=$SECONDS
initcheck_api=""
if "$sanitizer" --help 2>/dev/null | grep -q -- --check-api-memory-access; then initcheck_api=${SANITIZE_INITCHECK_API:-no}; fi
echo "compute-sanitizer: $("$sanitizer" --version | tail -1); $jobs run(s) at a time; logs in $logs"

# run_one TOOL RUN TEST DIR CMD…: one run; writes its log and "<result>\t<summary>" to <log>.result.
run_one() {
  local tool=$1 run=$2 test=$3 dir=$4
  shift 4
  local log="$logs/$tool.$run.log" args=(--tool "$tool" --error-exitcode 86) t0=$SECONDS rc=0
  local result summary errors oom=0
  [ "$tool" != memcheck ] || args+=(--leak-check full)
  [ "$tool" != initcheck ] || [ -z "$initcheck_api" ] || args+=(--check-api-memory-access "$initcheck_api")
  (cd "$dir" && DHISPARSE_TEST_SMALL=1 timeout --kill-after=30 "$run_limit" "$sanitizer" "${args[@]}" "$@") \
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
  if [[ -n "$expected_oom" && "$test" =~ $expected_oom ]]; then
    oom=$(grep -c 'Program hit cudaErrorMemoryAllocation' "$log") || true
    errors=$(( ${errors:-0} - oom ))
    summary="$summary, $oom of them the allocation failures provoked on purpose"
    if [ "$result" = errors ] && [ "$errors" -le 0 ]; then result=ok; fi
  fi
  if [ "$result" = ok ] && [ "${errors:-0}" -gt 0 ]; then result=errors; fi
  printf '%s\t%s\n' "$result" "${summary:-no summary line} ($((SECONDS - t0))s)" >"$log.result"
}

# Every run: "tool<TAB>run name<TAB>test<TAB>dir<TAB>command…". A split test gives one run per
# Catch2 test case (run name <test>.<k>), the case's name escaped as a Catch2 test spec.
runs=()
for line in "${tests[@]}"; do
  IFS=$'\t' read -r -a field <<<"$line"
  name=${field[0]} dir=${field[1]} cmd=("${field[@]:2}")
  [[ -z "$filter" || "$name" =~ $filter ]] || continue
  # A test file that tags cases [small] names its sanitizer subset (see its header).
  subset=()
  if [ "${SANITIZE_ALL_CASES:-0}" != 1 ] &&
     (cd "$dir" && "${cmd[@]}" --list-test-names-only '[small]' 2>/dev/null) | grep -q .; then
    subset=('[small]')
  fi
  cases=()
  if [[ -n "$split" && "$name" =~ $split ]]; then
    mapfile -t cases < <(cd "$dir" && "${cmd[@]}" --list-test-names-only "${subset[@]}" 2>/dev/null | sed '/^$/d')
  fi
  for tool in $tools; do
    if [ ${#cases[@]} -eq 0 ]; then
      runs+=("$tool"$'\t'"$name"$'\t'"$line${subset:+$'\t'${subset[0]}}")
    else
      for k in "${!cases[@]}"; do
        spec=$(sed 's/[][\\,"*~]/\\&/g' <<<"${cases[$k]}")
        runs+=("$tool"$'\t'"$name.$k"$'\t'"$line"$'\t'"$spec")
      done
    fi
  done
done

# The runs SANITIZE_SKIP names are left out (listed), those SANITIZE_FIRST names go first.
skip=${SANITIZE_SKIP-synccheck test_sparse_attention}
first=() rest=()
for run in "${runs[@]}"; do
  IFS=$'\t' read -r -a field <<<"$run"
  what="${field[0]} ${field[2]}"
  if [[ -n "$skip" && "$what" =~ $skip ]]; then
    echo "skipped (SANITIZE_SKIP): ${field[0]} ${field[1]}"
  elif [[ -n "${SANITIZE_FIRST:-}" && "$what" =~ $SANITIZE_FIRST ]]; then
    first+=("$run")
  else
    rest+=("$run")
  fi
done
runs=("${first[@]}" "${rest[@]}")

# At most $jobs runs at a time; none starts after the deadline.
for run in "${runs[@]}"; do
  IFS=$'\t' read -r -a field <<<"$run"
  log="$logs/${field[0]}.${field[1]}.log"
  rm -f "$log" "$log.result"
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done
  if (( SECONDS - start >= deadline )); then
    echo "not run: deadline" >"$log"
    printf 'not-run\tdeadline of %ss reached\n' "$deadline" >"$log.result"
    continue
  fi
  run_one "${field[@]}" &
done
wait

bad=0
for tool in $tools; do
  declare -A count=([ok]=0 [errors]=0 [failed]=0 [timeout]=0 [skipped]=0 [not-run]=0)
  for run in "${runs[@]}"; do
    IFS=$'\t' read -r -a field <<<"$run"
    [ "${field[0]}" = "$tool" ] || continue
    IFS=$'\t' read -r result summary <"$logs/$tool.${field[1]}.log.result" || result=failed summary="no result"
    count[$result]=$((count[$result] + 1))
    case $result in ok | skipped) ;; *) bad=1 ;; esac
    what=${field[1]}
    [ "${field[1]}" = "${field[2]}" ] || what="${field[1]} (${field[-1]})"
    printf '%-10s %-38s %-8s %s\n' "$tool" "$what" "$result" "$summary"
  done
  echo "== $tool: ${count[ok]} clean, ${count[errors]} with errors, ${count[failed]} failed," \
       "${count[timeout]} timed out, ${count[skipped]} skipped (no device), ${count[not-run]} not run"
  unset count
done
exit $bad
