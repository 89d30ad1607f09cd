#!/usr/bin/env python3
"""Plots the JSON that dhisparse-sim writes: host fetch fraction and PCIe bytes per
generated token against the device pool size, one line per eviction policy x budget
(and per concurrency where the run swept several).

    plot.py RESULTS.json OUT.png

Needs matplotlib (Debian: apt-get install python3-matplotlib); without it the script
says so and exits with status 3 without writing anything.
"""
import json
import sys


def load(argv):
    """(pyplot, the JSON document of argv[1]), or (None, exit status) after saying why:
    2 for a wrong command line, 3 without matplotlib. Shared with bench/residency/plot.py."""
    if len(argv) != 3:
        sys.stderr.write("usage: plot.py RESULTS.json OUT.png\n")
        return None, 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write(
            "plot.py: matplotlib is not installed for %s "
            "(Debian: apt-get install python3-matplotlib); no plot written\n" % sys.executable
        )
        return None, 3
    with open(argv[1]) as f:
        return plt, json.load(f)


def main(argv):
    plt, doc = load(argv)
    if plt is None:
        return doc
    records = [r for r in doc.get("records", []) if r.get("admitted", 0) > 0 and r.get("measured_steps", 0) > 0]
    if not records:
        sys.stderr.write("plot.py: %s has no completed runs to plot\n" % argv[1])
        return 1

    several = len({r["requests"] for r in records}) > 1
    lines = {}
    for r in records:
        budget = r["budget"] if r["budget"] != "static" else "static %d" % r["static_slots"]
        key = (r["policy"], budget, r["requests"])
        lines.setdefault(key, []).append((r["pool_slots"], 100.0 * r["fetch_fraction"], r["h2d_bytes_per_token"] / 1024.0))

    # Colour = eviction policy, line style = budget, marker = concurrency.
    policies = sorted({k[0] for k in lines})
    budgets = sorted({k[1] for k in lines})
    concurrencies = sorted({k[2] for k in lines})
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    fig, (frac, pcie) = plt.subplots(1, 2, figsize=(13, 5))
    for key in sorted(lines):
        policy, budget, requests = key
        points = sorted(lines[key])
        label = "%s / %s" % (policy, budget) + (" / %d req" % requests if several else "")
        look = dict(
            color="C%d" % (policies.index(policy) % 10),
            linestyle=styles[budgets.index(budget) % len(styles)],
            marker=markers[concurrencies.index(requests) % len(markers)],
            markersize=3,
            label=label,
        )
        xs = [p[0] for p in points]
        frac.plot(xs, [p[1] for p in points], **look)
        pcie.plot(xs, [p[2] for p in points], **look)
    for ax, title in ((frac, "host fetch fraction (% of selected rows)"), (pcie, "PCIe KiB per generated token")):
        ax.set_xscale("log")
        ax.set_xlabel("device pool (slots per group)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
    pcie.legend(fontsize="small", loc="upper right")
    what = doc.get("scenario", "")
    if what == "drift":
        what = "drift workload: context %d, top-k %d, queries %d, seed %d" % (
            doc.get("context", 0), doc.get("top_k", 0), doc.get("queries", 0), doc.get("seed", 0))
    elif "trace" in doc:
        what = "trace %s" % doc["trace"]
    fig.suptitle("dhisparse-sim (%s), %s B rows, %s" % (doc.get("date", ""), int(doc.get("row_bytes", 0)), what))
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print("wrote %s" % argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
