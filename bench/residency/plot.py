#!/usr/bin/env python3
"""Plots the JSON that bench_residency writes: the host fetch fraction of every run per
scenario (one bar per eviction x budget policy), and the load ramp step by step (slots
owned by requests and live requests, one line per budget policy, LRU).

    plot.py RESULTS.json OUT.png

Needs matplotlib (Debian: apt-get install python3-matplotlib); without it the script
says so and exits with status 3 without writing anything.
"""
import os
import sys

# The command line, matplotlib and the JSON are handled as dhisparse-sim's plot does.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "sim"))
from plot import load  # noqa: E402


def main(argv):
    plt, doc = load(argv)
    if plt is None:
        return doc
    runs = [r for r in doc["records"] if r["scenario"] != "ramp_step" and r["status"] == "ok"]
    steps = [r for r in doc["records"] if r["scenario"] == "ramp_step"]
    if not runs:
        sys.stderr.write("plot.py: %s has no completed runs to plot\n" % argv[1])
        return 1

    # Left: fetch % per (scenario, pool), bars per (policy, budget).
    groups = []
    for r in runs:
        g = (r["scenario"], r["pool_fraction"])
        if g not in groups:
            groups.append(g)
    series = sorted({(r["budget"], r["policy"]) for r in runs})
    policies = sorted({r["policy"] for r in runs})
    width = 0.8 / max(1, len(series))
    fig, (bars, ramp) = plt.subplots(1, 2, figsize=(15, 5.5))
    for i, (budget, policy) in enumerate(series):
        xs, ys = [], []
        for j, g in enumerate(groups):
            hit = [r for r in runs if (r["scenario"], r["pool_fraction"]) == g and (r["budget"], r["policy"]) == (budget, policy)]
            if hit:
                xs.append(j + (i - len(series) / 2.0 + 0.5) * width)
                ys.append(100.0 * hit[0]["fetch_fraction"])
        hatch = {"static": "", "global": "//", "fair_share": ".."}.get(budget, "")
        bars.bar(xs, ys, width, label="%s / %s" % (policy, budget), color="C%d" % (policies.index(policy) % 10), hatch=hatch,
                 edgecolor="black", linewidth=0.3)
    bars.set_xticks(range(len(groups)))
    bars.set_xticklabels(["%s\npool %.3f x live KV" % g for g in groups])
    bars.set_ylabel("rows fetched from host, % of selected rows")
    bars.set_title("fetch fraction (%d requests, %d-token contexts)" % (doc["requests"], doc["context"]))
    bars.legend(fontsize=7, ncol=3)
    bars.grid(axis="y", alpha=0.3)

    # Right: the ramp, LRU (or the first policy present).
    if steps:
        policy = "lru" if any(s["policy"] == "lru" for s in steps) else steps[0]["policy"]
        live_drawn = False
        other = ramp.twinx()
        for k, budget in enumerate(sorted({s["budget"] for s in steps if s["policy"] == policy})):
            pts = sorted((s["step"], s["owned_slots"], s["live"]) for s in steps if s["policy"] == policy and s["budget"] == budget)
            ramp.plot([p[0] for p in pts], [p[1] for p in pts], color="C%d" % k, label="owned slots, %s" % budget)
            if not live_drawn:
                other.plot([p[0] for p in pts], [p[2] for p in pts], color="grey", linestyle=":", label="live requests")
                live_drawn = True
        pool = [r["pool_slots"] for r in runs if r["scenario"] == "ramp"]
        if pool:
            ramp.axhline(pool[0], color="black", linewidth=0.8, linestyle="--", label="pool")
        ramp.set_xlabel("step")
        ramp.set_ylabel("device slots owned by requests")
        other.set_ylabel("live requests")
        ramp.set_title("load ramp (%s): optional residency grows and is reclaimed" % policy)
        h1, l1 = ramp.get_legend_handles_labels()
        h2, l2 = other.get_legend_handles_labels()
        ramp.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower center")
        ramp.grid(alpha=0.3)
    fig.suptitle("bench_residency, %s, %s" % (doc.get("device", "?"), doc.get("date", "")))
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print("wrote %s" % argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
