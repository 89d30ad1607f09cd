#!/usr/bin/env bash
# Installs what is missing (Debian's catch2, ninja, python3-matplotlib for dhisparse-sim's
# plot), builds every target (library header checks, tests, examples, benchmarks, tools;
# device code for sm_90 even without a GPU) and runs the test suite. GPU tests report
# "skipped: no CUDA device" on machines without a GPU.
#
#   scripts/test.sh [build-dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

need=()
[ -f /usr/include/catch2/catch.hpp ] || need+=(catch2)
command -v ninja >/dev/null || need+=(ninja-build)
command -v cmake >/dev/null || need+=(cmake)
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)"
