#!/usr/bin/env python3
"""Plots of the serving benchmark (bench_serving --json FILE): per scenario, output tokens/s
and p99 per-token latency against concurrency, one line per mode.

    python3 bench/serving/plot.py docs/bench/serving.json [OUT_PREFIX]

writes OUT_PREFIX_<scenario>.png (default: the JSON path without .json). Needs matplotlib
(Debian: python3-matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = ["resident", "hisparse", "adaptive", "adaptive+spec"]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    path = sys.argv[1]
    prefix = sys.argv[2] if len(sys.argv) > 2 else path[:-5] if path.endswith(".json") else path
    with open(path) as f:
        doc = json.load(f)
    runs = [r for r in doc["records"] if r.get("kind") == "run"]
    bound = doc.get("latency_bound_ms")
    for scenario in sorted({r["scenario"] for r in runs}):
        fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
        for mode in MODES:
            rows = sorted((r for r in runs if r["scenario"] == scenario and r["mode"] == mode),
                          key=lambda r: r["served"])
            if not rows:
                continue
            x = [r["served"] for r in rows]
            ax_t.plot(x, [r["tokens_per_s"] for r in rows], marker="o", label=mode)
            ax_l.plot(x, [r["p99_token_ms"] for r in rows], marker="o", label=mode)
        if bound:
            ax_l.axhline(bound, color="grey", linestyle="--", linewidth=1, label="latency bound")
        for ax, title in ((ax_t, "output tokens/s (full-model equivalent)"),
                          (ax_l, "p99 per-token latency, ms (full-model equivalent)")):
            ax.set_xlabel("concurrent requests (served)")
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"dhisparse serving benchmark, scenario {scenario} - {doc.get('device', '')} "
                     f"{doc.get('date', '')}", fontsize=10)
        fig.tight_layout()
        out = f"{prefix}_{scenario}.png"
        fig.savefig(out, dpi=120)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
