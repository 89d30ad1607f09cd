#!/usr/bin/env python3
"""The serving benchmark with one process per GPU of the host (issue 19 item 4).

Starts `bench_serving` once per GPU, all at once (CUDA_VISIBLE_DEVICES=g each; scenario A
unless other arguments follow `--`), every process with its own host store (placed by the
library on its GPU's NUMA node; each log names the binding) and an equal share of the
host memory budget. Then sums what the GPUs served: per (scenario, mode, concurrency), the
tokens/s of every GPU, their total, the slowest GPU against the fastest, the worst p99
per-token latency and the host->GPU traffic of all GPUs together. With --solo, GPU 0 first
runs alone with the same arguments: the total over (N x solo) is the scaling efficiency,
i.e. what sharing the host's memory and links costs.

  bench/serving/per_gpu.py --bench build/bench/serving/bench_serving --gpus 8 --out out/ \\
      [--solo] [--host-gib G] [-- bench_serving arguments]
  bench/serving/per_gpu.py --aggregate out/        (the summary of an earlier run)
  bench/serving/per_gpu.py --self-test             (the aggregation on made-up reports)

Writes DIR/gpu<g>.json and .log per process, DIR/solo.json with --solo, and
DIR/per_gpu.json (the summary). Python 3 standard library only.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile


def host_memory_gib():
    """Total host memory in GiB (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def runs_of(path):
    """The `kind: run` records of one bench_serving JSON report, keyed by (scenario, mode, C)."""
    with open(path) as f:
        report = json.load(f)
    out = {}
    for r in report.get("records", []):
        if r.get("kind") == "run":
            out[(r["scenario"], r["mode"], int(r["concurrency"]))] = r
    return report, out


def aggregate(directory):
    """Summary of DIR/gpu*.json (and DIR/solo.json when present): a dict, also written to
    DIR/per_gpu.json."""
    paths = sorted(glob.glob(os.path.join(directory, "gpu*.json")),
                   key=lambda p: int(os.path.basename(p)[3:-5]))
    if not paths:
        raise SystemExit("per_gpu: no gpu*.json in %s" % directory)
    per_gpu = [runs_of(p) for p in paths]
    solo = None
    solo_path = os.path.join(directory, "solo.json")
    if os.path.exists(solo_path):
        solo = runs_of(solo_path)[1]
    keys = sorted(set().union(*(set(runs) for _, runs in per_gpu)))
    rows = []
    for key in keys:
        recs = [runs.get(key) for _, runs in per_gpu]
        if any(r is None for r in recs):  # a GPU that did not run this point (e.g. failed)
            rows.append({"scenario": key[0], "mode": key[1], "concurrency": key[2],
                         "complete": False, "gpus_reporting": sum(r is not None for r in recs)})
            continue
        tok = [r["tokens_per_s"] for r in recs]
        row = {
            "scenario": key[0], "mode": key[1], "concurrency": key[2], "complete": True,
            "gpus": len(recs),
            "tokens_per_s_total": sum(tok),
            "tokens_per_s_per_gpu": tok,
            "slowest_over_fastest": min(tok) / max(tok) if max(tok) > 0 else 0.0,
            "p99_token_ms_worst": max(r["p99_token_ms"] for r in recs),
            "pcie_h2d_gbps_total": sum(r.get("pcie_h2d_gbps", 0.0) for r in recs),
        }
        if solo is not None and key in solo and solo[key]["tokens_per_s"] > 0:
            row["tokens_per_s_solo"] = solo[key]["tokens_per_s"]
            row["scaling_efficiency"] = sum(tok) / (len(recs) * solo[key]["tokens_per_s"])
        rows.append(row)
    summary = {
        "benchmark": "serving_per_gpu",
        "gpus": len(paths),
        "devices": [report.get("device", "?") for report, _ in per_gpu],
        "date": per_gpu[0][0].get("date", "?"),
        "records": rows,
    }
    with open(os.path.join(directory, "per_gpu.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def print_summary(summary):
    print("%d processes, one per GPU (%s)" % (summary["gpus"], ", ".join(sorted(set(summary["devices"])))))
    print("%-4s %-14s %5s %12s %10s %9s %10s %9s" % ("scn", "mode", "C", "tok/s total", "slow/fast",
                                                     "p99 ms", "H2D GB/s", "vs solo"))
    for r in summary["records"]:
        if not r["complete"]:
            print("%-4s %-14s %5d  incomplete: %d GPUs reported" % (r["scenario"], r["mode"], r["concurrency"],
                                                                  r["gpus_reporting"]))
            continue
        eff = "%9.2f" % r["scaling_efficiency"] if "scaling_efficiency" in r else "%9s" % "-"
        print("%-4s %-14s %5d %12.0f %10.2f %9.2f %10.1f %s" % (
            r["scenario"], r["mode"], r["concurrency"], r["tokens_per_s_total"], r["slowest_over_fastest"],
            r["p99_token_ms_worst"], r["pcie_h2d_gbps_total"], eff))


def run(args, extra):
    os.makedirs(args.out, exist_ok=True)
    bench_args = extra if extra else ["--scenario", "A"]
    host_gib = args.host_gib
    if host_gib is None:  # an equal share of 80% of the host, at most bench_serving's default
        total = host_memory_gib()
        host_gib = min(100.0, 0.8 * total / args.gpus) if total else 100.0 / args.gpus
    common = bench_args + ["--host-gib", "%.1f" % host_gib]
    env = dict(os.environ)
    if args.solo:
        env["CUDA_VISIBLE_DEVICES"] = "0"
        with open(os.path.join(args.out, "solo.log"), "w") as log:
            subprocess.run([args.bench] + common + ["--json", os.path.join(args.out, "solo.json")],
                           env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    procs = []
    for g in range(args.gpus):
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = str(g)
        log = open(os.path.join(args.out, "gpu%d.log" % g), "w")
        procs.append((subprocess.Popen([args.bench] + common + ["--json", os.path.join(args.out, "gpu%d.json" % g)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = 0
    for g, (p, log) in enumerate(procs):
        if p.wait() != 0:
            print("per_gpu: GPU %d's bench_serving exited with %d (see gpu%d.log)" % (g, p.returncode, g))
            failed += 1
        log.close()
    print_summary(aggregate(args.out))
    return 1 if failed else 0


def self_test():
    """The aggregation on made-up reports: totals, ratios, a point one GPU lacks, solo."""
    def report(device, points):
        return {"benchmark": "serving", "device": device, "date": "2026-12-04",
                "records": [{"kind": "run", "scenario": "A", "mode": m, "concurrency": c, "tokens_per_s": t,
                             "p99_token_ms": p99, "pcie_h2d_gbps": h2d} for m, c, t, p99, h2d in points]
                + [{"kind": "target", "scenario": "A", "name": "ignored"}]}
    with tempfile.TemporaryDirectory() as d:
        for g, scale in enumerate([1.0, 0.8, 0.9]):
            pts = [("adaptive", 64, 1000.0 * scale, 20.0 + g, 10.0), ("hisparse", 64, 500.0 * scale, 30.0, 20.0)]
            if g != 2:
                pts.append(("adaptive", 128, 1500.0, 40.0, 30.0))
            with open(os.path.join(d, "gpu%d.json" % g), "w") as f:
                json.dump(report("H200", pts), f)
        with open(os.path.join(d, "solo.json"), "w") as f:
            json.dump(report("H200", [("adaptive", 64, 1100.0, 19.0, 11.0)]), f)
        s = aggregate(d)
        by = {(r["mode"], r["concurrency"]): r for r in s["records"]}
        a = by[("adaptive", 64)]
        checks = [
            (s["gpus"] == 3, "three processes"),
            (abs(a["tokens_per_s_total"] - 2700.0) < 1e-9, "total tokens/s"),
            (abs(a["slowest_over_fastest"] - 0.8) < 1e-9, "slowest over fastest"),
            (a["p99_token_ms_worst"] == 22.0, "worst p99"),
            (abs(a["pcie_h2d_gbps_total"] - 30.0) < 1e-9, "H2D total"),
            (abs(a["scaling_efficiency"] - 2700.0 / 3300.0) < 1e-9, "scaling efficiency against solo"),
            ("scaling_efficiency" not in by[("hisparse", 64)], "no solo point, no efficiency"),
            (not by[("adaptive", 128)]["complete"] and by[("adaptive", 128)]["gpus_reporting"] == 2,
             "a point one GPU lacks is marked incomplete"),
            (os.path.exists(os.path.join(d, "per_gpu.json")), "summary written"),
        ]
        print_summary(s)
    bad = [what for ok, what in checks if not ok]
    for what in bad:
        print("per_gpu self-test FAILED: %s" % what)
    if not bad:
        print("per_gpu self-test: %d checks passed" % len(checks))
    return 1 if bad else 0


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", help="bench_serving executable")
    ap.add_argument("--gpus", type=int, default=0, help="processes, one per GPU 0 .. N-1")
    ap.add_argument("--out", default="out/serving_per_gpu", help="directory for the reports")
    ap.add_argument("--host-gib", type=float, default=None, help="host store budget per process")
    ap.add_argument("--solo", action="store_true", help="run GPU 0 alone first (scaling efficiency)")
    ap.add_argument("--aggregate", metavar="DIR", help="only summarize an earlier run")
    ap.add_argument("--self-test", action="store_true", help="check the aggregation on made-up reports")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.aggregate:
        print_summary(aggregate(args.aggregate))
        return 0
    if not args.bench or args.gpus < 1:
        ap.error("--bench and --gpus N are needed to run (or --aggregate DIR, --self-test)")
    return run(args, extra)


if __name__ == "__main__":
    sys.exit(main())
