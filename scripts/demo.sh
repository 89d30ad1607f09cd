#!/usr/bin/env bash
# The main demo. Builds and runs examples/quickstart.cu (one decode loop over the hierarchy:
# on the GPU when one is present, on the host reference backend otherwise; it prints
# which), then a small serving comparison of the four modes — resident, hisparse-style,
# adaptive, adaptive+spec — and prints the table and where its plot is:
#   GPU:    bench_serving --quick (scenarios A and B at concurrency 8 and 32, real kernels,
#           about a minute on an H200; docs/serving.md), plotted by bench/serving/plot.py;
#   no GPU: dhisparse-sim --quick on the host reference backend (the same residency
#           decisions, host fetch fraction and PCIe bytes per token; no timing; docs/sim.md).
#
#   scripts/demo.sh [build-dir]      (default: build-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-demo}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu=1; fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
targets=(quickstart dhisparse-sim)
[ "$gpu" = 1 ] && targets+=(bench_serving)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDHISPARSE_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target "${targets[@]}" --parallel "$(nproc)"
"$build/examples/quickstart"
echo
plot_ok=0
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null && plot_ok=1
if [ "$gpu" = 1 ]; then
  echo "== serving comparison on the GPU: bench_serving --quick (docs/serving.md)"
  "$build/bench/serving/bench_serving" --quick --json "$build/serving_demo.json"
  if [ "$plot_ok" = 1 ]; then
    /usr/bin/python3 bench/serving/plot.py "$build/serving_demo.json" "$build/serving_demo"
    echo "plots: $build/serving_demo_A.png, $build/serving_demo_B.png (tokens/s and p99 latency against concurrency)"
  else
    echo "(no matplotlib: install python3-matplotlib for the plots; the JSON is $build/serving_demo.json)"
  fi
else
  echo "== no GPU: the serving comparison runs on the host reference backend (dhisparse-sim --quick:"
  echo "   the same residency decisions as the GPU, host fetch fraction and PCIe bytes per token; no timing)"
  plot=()
  [ "$plot_ok" = 1 ] && plot=(--plot "$build/sim_demo.png")
  "$build/tools/sim/dhisparse-sim" --quick --json "$build/sim_demo.json" "${plot[@]}"
  [ "$plot_ok" = 1 ] && echo "plot: $build/sim_demo.png"
  echo "On a machine with an NVIDIA GPU the same script runs the timed comparison (bench_serving --quick)."
fi
