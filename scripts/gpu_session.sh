#!/usr/bin/env bash
# One session's GPU checks in few device calls (the device machine has no Catch2: tests are
# built on the development machine and carried). Two halves:
#
#   scripts/gpu_session.sh pack [build-dir] [bundle-dir]
#       here: every GPU test (executables test_*gpu* of the build), the benchmarks the open
#       issues measure and compute-sanitizer's helper script, stripped, into one
#       bundle-dir/gpu.tar.xz (default bundle-dir: devbin, git-ignored; name it in `carry`).
#   scripts/gpu_session.sh run PART… [--bundle bundle-dir]
#       on the device machine: unpacks the bundle once and runs the parts, writing logs,
#       JSON and a summary under $OUT (default: ./gpu-out). Parts:
#         tests        every GPU test (or those whose name matches $TESTS and not
#                      $TESTS_SKIP), $TEST_TIMEOUT_S each (default 240), $TEST_JOBS at
#                      a time (default 1; the longest tests first), one log per test;
#                      summary lines
#         checks       tests and memcheck at once (the sanitizers in the background):
#                      with TEST_JOBS=3 every GPU test and the sanitizers of the
#                      hierarchy/residency tests took ≈ 400 s on an H100, where
#                      test_hierarchy_gpu ran past 280 s beside the others: give it
#                      TEST_TIMEOUT_S=400
#         memcheck     compute-sanitizer memcheck and racecheck over the GPU tests matching
#                      $SANITIZE_TESTS (default: all; scripts/sanitize_gpu.sh --binaries, its
#                      SANITIZE_* settings apply; small traces)
#         retrieval    bench_retrieval_overlap and bench_retrieval_realistic (issue 15)
#         resolve      bench_resolve --batches 1,128 (issue 12)
#         verify       bench_verify --reps 20 (issue 14 item 6)
#         serving      bench_serving --quick (the serving benchmark's harness)
#         phases       the resolve, reclaim and victim-search probes (scripts/probes; packed
#                      unless PACK_PROBES=0, only those named in $PROBES when set) at
#                      --batches 1,128: where resolve's time goes
#         ab           resolve A/B: bench_resolve of the revision packed with AB_BASE=REV
#                      ("base"), of this tree ("new") and of HEAD + patches packed with
#                      AB_PATCHES="name=a.patch[+b.patch] …", alternating $AB_REPS times
#                      (default 2), then the phase probe of base and new when packed and
#                      the reclaim phase probes (packed with AB_RECLAIM=1); prints one
#                      side-by-side table (scripts/lib/resolve_ab.py, also ab_table.txt)
#                      after the probes' phase lines, so that it ends the output; the
#                      runs' JSON and logs travel as ab-logs.tar.gz (8 files come back)
#         multi        bench_retrieval --gpus N (issue 19; N = the GPUs present, ≥ 2)
#         repeat       $REPEAT_TEST (default test_verify_graph_gpu) $REPEAT_N times (default
#                      40) with fresh seeds, then with each seed of $REPEAT_SEEDS (default:
#                      the seeds that failed before F19's fix): how many runs fail
#         verify-tail  bench_verify's sweep of the later passes' sharing (sampling rules)
#       Each part stops starting work after $PART_DEADLINE_S seconds (default 540) so that
#       one 600 s call returns with its summary; pass one or two parts per call. The logs
#       come back as tests-logs.tar.gz, sanitize-logs.tar.gz, repeat-logs.tar.gz and
#       ab-logs.tar.gz.
#
# Example (a call costs ≈ 120 s of device time beyond its run — start and transfers — so
# three calls fit the 30 device minutes of a session):
#   scripts/gpu_session.sh pack build devbin                     # here, after a full build
#   run: TEST_JOBS=3 SANITIZE_TESTS='test_hierarchy_gpu|test_residency_gpu' \
#        bash scripts/gpu_session.sh run checks                  carry: ["devbin"]
#   run: bash scripts/gpu_session.sh run retrieval resolve verify carry: ["devbin"]
#   run: bash scripts/gpu_session.sh run phases serving           carry: ["devbin"]
# A/B of resolve against another revision (one call):
#   AB_BASE=main~1 scripts/gpu_session.sh pack build devbin
#   run: bash scripts/gpu_session.sh run ab                      carry: ["devbin"]
# A/B of candidate patches, reclaim phases included (one call):
#   AB_PATCHES="one=docs/patches/a.patch two=docs/patches/a.patch+docs/patches/b.patch" \
#     AB_RECLAIM=1 scripts/gpu_session.sh pack build devbin
# (patch paths relative to the repository root; they apply to HEAD)
#   run: bash scripts/gpu_session.sh run ab                      carry: ["devbin"]
set -euo pipefail
cd "$(dirname "$0")/.."

benches=(bench_retrieval bench_retrieval_overlap bench_retrieval_realistic bench_resolve bench_verify bench_serving)

pack() {
  local build=${1:-build} bundle=${2:-devbin}
  [ -d "$build" ] || { echo "no build directory $build (configure and build first)" >&2; exit 2; }
  local stage
  stage=$(mktemp -d)
  local n=0
  while IFS= read -r -d '' f; do
    cp "$f" "$stage/"
    n=$((n + 1))
  done < <(find "$build" -type f -name 'test_*gpu*' -perm -u+x -print0)
  for b in "${benches[@]}"; do
    local f
    f=$(find "$build" -type f -name "$b" -perm -u+x | head -1)
    if [ -n "$f" ]; then cp "$f" "$stage/"; else echo "pack: $b not built (skipped)" >&2; fi
  done
  # The phase probes of issue 12 (instrumented copies of bench_resolve, built from this tree).
  if [ "${PACK_PROBES:-1}" = 1 ]; then
    local probe
    for probe in ${PROBES:-resolve reclaim victims}; do
      local exe
      if exe=$(/usr/bin/python3 "scripts/probes/${probe}_phases.py" . "/tmp/gpu_session_${probe}_phases" | tail -1) &&
        [ -x "$exe" ]; then
        cp "$exe" "$stage/bench_${probe}_phases"
      else
        echo "pack: the $probe phase probe did not build (skipped)" >&2
      fi
    done
  fi
  # `ab`: bench_resolve and its phase probe of another revision, built from a worktree.
  if [ -n "${AB_BASE:-}" ]; then
    local wt=/tmp/gpu_session_base exe
    git worktree remove --force "$wt" 2>/dev/null || true
    git worktree add -f --detach "$wt" "$AB_BASE" > /dev/null
    cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDHISPARSE_BUILD_TESTS=OFF \
      -DDHISPARSE_BUILD_EXAMPLES=OFF -DDHISPARSE_BUILD_TOOLS=OFF > /dev/null
    ninja -C "$wt/build" bench_resolve > /dev/null
    cp "$(find "$wt/build" -type f -name bench_resolve -perm -u+x | head -1)" "$stage/bench_resolve_base"
    if exe=$(/usr/bin/python3 "$wt/scripts/probes/resolve_phases.py" "$wt" /tmp/gpu_session_resolve_phases_base |
      tail -1) && [ -x "$exe" ]; then
      cp "$exe" "$stage/bench_resolve_phases_base"
    else
      echo "pack: the base's resolve phase probe did not build (skipped)" >&2
    fi
    git worktree remove --force "$wt"
    echo "pack: bench_resolve of $AB_BASE as bench_resolve_base"
  fi
  # `ab`: bench_resolve of HEAD with patches applied, one variant per AB_PATCHES word
  # "name=a.patch[+b.patch…]" (applied in order), as bench_resolve_v_<name>; with AB_RECLAIM=1
  # also the reclaim phase probe of this tree and of each variant.
  local spec
  for spec in ${AB_PATCHES:-}; do
    local name=${spec%%=*} patches=${spec#*=} wt patch
    wt=/tmp/gpu_session_v_$name
    git worktree remove --force "$wt" 2>/dev/null || true
    git worktree add -f --detach "$wt" HEAD > /dev/null
    for patch in ${patches//+/ }; do git -C "$wt" apply "$PWD/$patch"; done
    cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDHISPARSE_BUILD_TESTS=OFF \
      -DDHISPARSE_BUILD_EXAMPLES=OFF -DDHISPARSE_BUILD_TOOLS=OFF > /dev/null
    ninja -C "$wt/build" bench_resolve > /dev/null
    cp "$(find "$wt/build" -type f -name bench_resolve -perm -u+x | head -1)" "$stage/bench_resolve_v_$name"
    if [ "${AB_RECLAIM:-0}" = 1 ]; then
      cp "$(/usr/bin/python3 "$wt/scripts/probes/reclaim_phases.py" "$wt" "/tmp/gpu_session_reclaim_v_$name" | tail -1)" \
        "$stage/bench_reclaim_phases_v_$name"
    fi
    git worktree remove --force "$wt"
    echo "pack: bench_resolve of HEAD + $patches as bench_resolve_v_$name"
  done
  if [ "${AB_RECLAIM:-0}" = 1 ]; then
    cp "$(/usr/bin/python3 scripts/probes/reclaim_phases.py . /tmp/gpu_session_reclaim_new | tail -1)" \
      "$stage/bench_reclaim_phases_new"
  fi
  cp scripts/lib/resolve_ab.py "$stage/"
  strip "$stage"/* 2>/dev/null || true
  mkdir -p "$bundle"
  tar -C "$stage" -cJf "$bundle/gpu.tar.xz" .
  cp scripts/sanitize_gpu.sh "$bundle/"
  echo "pack: $n GPU tests + benchmarks -> $bundle/gpu.tar.xz ($(du -h "$bundle/gpu.tar.xz" | cut -f1))"
  rm -rf "$stage"
}

# Every GPU test of the bundle (or those matching $TESTS and not $TESTS_SKIP), $TEST_JOBS at a
# time (default 1), the longest first, $TEST_TIMEOUT_S each; one summary line per test.
run_tests() {
  local bin=$1 out=$2 start=$3 deadline=$4 t
  mkdir -p "$out/tests"
  local order=() first=(test_hierarchy_gpu test_soak_gpu test_residency_gpu test_verify_gpu test_speculative_decode_gpu)
  for t in "${first[@]}"; do [ -x "$bin/$t" ] && order+=("$bin/$t"); done
  for t in "$bin"/test_*gpu*; do [[ " ${first[*]} " == *" $(basename "$t") "* ]] || order+=("$t"); done
  for t in "${order[@]}"; do  # a pipeline's subshell: its jobs are the tests
    local name
    name=$(basename "$t")
    [[ -z "${TESTS:-}" || "$name" =~ ${TESTS:-} ]] || continue
    [[ -z "${TESTS_SKIP:-}" || ! "$name" =~ ${TESTS_SKIP:-} ]] || continue
    while [ "$(jobs -rp | wc -l)" -ge "${TEST_JOBS:-1}" ]; do wait -n || true; done
    if [ $((SECONDS - start)) -ge "$deadline" ]; then echo "deadline: $name not started"; continue; fi
    (
      rc=0
      cd "$out/tests" && timeout "${TEST_TIMEOUT_S:-240}" "$t" > "$name.log" 2>&1 || rc=$?
      echo "$name rc=$rc $(grep -E 'All tests passed|test cases:|assertions:' "$out/tests/$name.log" | tail -1)"
    ) &
  done 2>&1 | tee "$out/tests_summary.txt"
}

# compute-sanitizer over the bundle's GPU tests (scripts/sanitize_gpu.sh --binaries; its
# SANITIZE_* settings apply), ending before the part's deadline.
run_sanitizers() {
  local bundle=$1 bin=$2 out=$3 start=$4 deadline=$5
  SANITIZE_TOOLS=${SANITIZE_TOOLS:-"memcheck racecheck"} SANITIZE_SPLIT=${SANITIZE_SPLIT:-'test_hierarchy_gpu|test_verify_gpu|test_residency_gpu'} \
  SANITIZE_JOBS=${SANITIZE_JOBS:-8} \
  SANITIZE_DEADLINE_S=$((deadline - (SECONDS - start))) SANITIZE_LOGS="$out/sanitize" \
    bash "$bundle/sanitize_gpu.sh" --binaries "$bin"
}

run_parts() {
  local bundle=devbin parts=()
  while [ $# -gt 0 ]; do
    case $1 in
      --bundle) bundle=$2; shift 2 ;;
      *) parts+=("$1"); shift ;;
    esac
  done
  local out=${OUT:-$PWD/gpu-out}
  local bin=$PWD/.gpu-bin
  mkdir -p "$out" "$bin"
  [ -n "$(ls -A "$bin")" ] || tar -C "$bin" -xJf "$bundle/gpu.tar.xz"
  local deadline=${PART_DEADLINE_S:-540}
  local start=$SECONDS
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1 || true
  for part in "${parts[@]}"; do
    echo "== $part"
    case $part in
      tests)
        run_tests "$bin" "$out" "$start" "$deadline"
        ;;
      checks)
        # The sanitizers beside the tests: one call holds both (the device has CPU cores
        # to spare; compute-sanitizer is bound by them).
        run_sanitizers "$bundle" "$bin" "$out" "$start" "$deadline" > "$out/sanitize_summary.txt" 2>&1 &
        local sanitizers=$!
        run_tests "$bin" "$out" "$start" "$deadline"
        wait "$sanitizers" || true
        grep -vE '^\s*$' "$out/sanitize_summary.txt" | tail -60
        ;;
      memcheck)
        run_sanitizers "$bundle" "$bin" "$out" "$start" "$deadline" 2>&1 | tee "$out/sanitize_summary.txt" || true
        ;;
      retrieval)
        "$bin/bench_retrieval_overlap" --json "$out/retrieval_overlap.json" > "$out/retrieval_overlap.txt" 2>&1 || true
        tail -40 "$out/retrieval_overlap.txt"
        "$bin/bench_retrieval_realistic" --quick --json "$out/retrieval_realistic.json" \
          > "$out/retrieval_realistic.txt" 2>&1 || true
        tail -20 "$out/retrieval_realistic.txt"
        ;;
      resolve)
        "$bin/bench_resolve" --batches 1,128 --json "$out/resolve.json" > "$out/resolve.txt" 2>&1 || true
        tail -30 "$out/resolve.txt"
        ;;
      verify)
        "$bin/bench_verify" --reps 20 --json "$out/verify.json" > "$out/verify.txt" 2>&1 || true
        tail -30 "$out/verify.txt"
        ;;
      serving)
        "$bin/bench_serving" --quick --json "$out/serving_quick.json" > "$out/serving_quick.txt" 2>&1 || true
        tail -30 "$out/serving_quick.txt"
        ;;
      phases)
        for probe in resolve reclaim victims; do
          [ -x "$bin/bench_${probe}_phases" ] || { echo "phases: bench_${probe}_phases not packed"; continue; }
          "$bin/bench_${probe}_phases" --batches 1,128 > "$out/${probe}_phases.txt" 2>&1 || true
          tail -40 "$out/${probe}_phases.txt"
        done
        ;;
      repeat)
        local test=${REPEAT_TEST:-test_verify_graph_gpu} n=${REPEAT_N:-40} failed=0 i seed
        local seeds=${REPEAT_SEEDS:-"3334060291631480170 17067481413527834950 877543496355533122"}
        mkdir -p "$out/repeat"
        for seed in $seeds; do
          DHISPARSE_TEST_SEED=$seed "$bin/$test" > "$out/repeat/seed_$seed.log" 2>&1 && rc=0 || rc=$?
          echo "$test seed $seed rc=$rc"
        done | tee "$out/repeat_summary.txt"
        for i in $(seq 1 "$n"); do
          [ $((SECONDS - start)) -lt "$deadline" ] || { echo "deadline after $((i - 1)) runs"; n=$((i - 1)); break; }
          "$bin/$test" > "$out/repeat/run.log" 2>&1 || { failed=$((failed + 1)); cp "$out/repeat/run.log" "$out/repeat/failed_$i.log"; }
        done
        echo "$test: $failed of $n runs with fresh seeds failed" | tee -a "$out/repeat_summary.txt"
        ;;
      verify-tail)
        DHISPARSE_VERIFY_TAIL=1 "$bin/bench_verify" --reps 20 --json "$out/verify_tail.json" > "$out/verify_tail.txt" 2>&1 || true
        grep -E "dense|candidate|one-hot|copy" "$out/verify_tail.txt" | head -120
        ;;
      ab)
        # Variants: base (AB_BASE), new (this tree), and one per AB_PATCHES word.
        local rep v runs=() ab=$out/ab variants=() f
        [ -x "$bin/bench_resolve_base" ] && variants+=(base)
        variants+=(new)
        for f in "$bin"/bench_resolve_v_*; do [ -x "$f" ] && variants+=("${f##*/bench_resolve_v_}"); done
        [ ${#variants[@]} -ge 2 ] || { echo "ab: pack with AB_BASE=REV or AB_PATCHES first"; continue; }
        # The runs' files go to ab/ (archived below: the device tool returns 8 files).
        mkdir -p "$ab"
        for rep in $(seq 1 "${AB_REPS:-2}"); do
          for v in "${variants[@]}"; do
            local exe=$bin/bench_resolve_v_$v
            [ "$v" != new ] || exe=$bin/bench_resolve
            [ "$v" != base ] || exe=$bin/bench_resolve_base
            [ $((SECONDS - start)) -lt "$deadline" ] || { echo "deadline: $v $rep not run"; continue; }
            timeout 200 "$exe" --batches "${AB_BATCHES:-1,128}" --json "$ab/resolve_${v}$rep.json" \
              > "$ab/resolve_${v}$rep.txt" 2>&1 && runs+=("$ab/resolve_${v}$rep.json") || echo "ab: $v $rep failed"
          done
        done
        [ ${#runs[@]} -eq 0 ] || python3 "$bin/resolve_ab.py" "${runs[@]}" > "$out/ab_table.txt"
        for v in base new; do
          local probe=$bin/bench_resolve_phases
          [ "$v" = new ] || probe=$bin/bench_resolve_phases_base
          [ -x "$probe" ] && [ $((SECONDS - start)) -lt "$deadline" ] || continue
          "$probe" --batches "${AB_BATCHES:-1,128}" > "$ab/resolve_phases_$v.txt" 2>&1 || true
          echo "-- phases, $v"
          awk '/^(static|adaptive)/{print "  ->",$1,$2,$3,$4,$6} /phases R/{on=1; print; next} /phases F/{on=0}
               on && /lookup end|reclaim|past wait|misses listed|slots taken|victims found|rows mapped|table filled|allocate end/{print}' \
            "$ab/resolve_phases_$v.txt"
        done
        for f in "$bin"/bench_reclaim_phases_*; do
          [ -x "$f" ] && [ $((SECONDS - start)) -lt "$deadline" ] || continue
          v=${f##*/bench_reclaim_phases_}
          "$f" --batches 128 > "$ab/reclaim_phases_$v.txt" 2>&1 || true
          echo "-- reclaim phases, ${v#v_}"
          grep -E "trace us|^reclaim of" "$ab/reclaim_phases_$v.txt" | tail -6
        done
        # The table last, so that the end of the output (what the device tool shows) has it.
        [ ! -f "$out/ab_table.txt" ] || cat "$out/ab_table.txt"
        ;;
      multi)
        local gpus
        gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
        if [ "$gpus" -ge 2 ]; then
          "$bin/bench_retrieval" --gpus "$gpus" --json "$out/retrieval_gpus.json" > "$out/retrieval_gpus.txt" 2>&1 || true
          tail -20 "$out/retrieval_gpus.txt"
        else
          echo "multi: $gpus GPU(s) here; needs 2 or more" | tee "$out/retrieval_gpus.txt"
        fi
        ;;
      *) echo "unknown part: $part" >&2; exit 2 ;;
    esac
  done
  # The device tool brings back a limited number of files: the per-test and per-run logs
  # travel as one archive beside the summaries.
  local dir
  for dir in tests sanitize repeat ab; do
    [ -d "$out/$dir" ] || continue
    tar -C "$out" -czf "$out/$dir-logs.tar.gz" "$dir" && rm -rf "${out:?}/$dir"
  done
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run_parts "$@" ;;
  *) sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d'; exit 2 ;;
esac
