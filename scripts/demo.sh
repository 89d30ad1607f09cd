#!/usr/bin/env bash
# Builds and runs the main demo (examples/quickstart.cu): on the GPU when one is
# present, on the host reference backend otherwise; it prints which.
#
#   scripts/demo.sh [build-dir]      (default: build-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-demo}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDHISPARSE_BUILD_TESTS=OFF \
      -DDHISPARSE_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target quickstart --parallel "$(nproc)"
"$build/examples/quickstart"
echo
echo "The end-to-end comparison (resident / hisparse / adaptive / adaptive+spec; GPU, about a minute on"
echo "an H200) is the serving benchmark: docs/serving.md, e.g."
echo "  cmake -S . -B build-serve -DCMAKE_BUILD_TYPE=Release && cmake --build build-serve --target bench_serving"
echo "  build-serve/bench/serving/bench_serving --quick"
