#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over the host tests: every CTest test
# labelled "host" (reference backends, host store logic, argument checks, trace reader,
# verify reference, drift, fuzz regressions…) except the two consumer builds, which
# compile a separate project. Configures a second build dir with
# DHISPARSE_SANITIZE=address,undefined,float-cast-overflow and libstdc++'s assertions,
# builds only the host test executables and runs them; any sanitizer report fails its
# test. `.ci/run` runs it after scripts/test.sh (docs/reliability.md).
#
#   scripts/sanitize_host.sh [build-dir]      (default: build-asan)
#   JOBS=N scripts/sanitize_host.sh           (parallel jobs; default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh
build=${1:-build-asan}
jobs=${JOBS:-$(nproc)}

install_build_tools
cuda_on_path

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDHISPARSE_SANITIZE=address,undefined,float-cast-overflow \
  -DCMAKE_CXX_FLAGS="-D_GLIBCXX_ASSERTIONS" \
  -DDHISPARSE_BUILD_EXAMPLES=OFF -DDHISPARSE_BUILD_BENCHMARKS=OFF -DDHISPARSE_BUILD_TOOLS=OFF
cmake --build "$build" --target dhisparse_host_tests --parallel "$jobs"

# Every report is fatal (the build also says -fno-sanitize-recover=all) and fails the test.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
ctest --test-dir "$build" -L host -LE consumer --output-on-failure --parallel "$jobs"
