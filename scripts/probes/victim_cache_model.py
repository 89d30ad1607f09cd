#!/usr/bin/env python3
"""Model: how often the per-request victim cache is rescanned under bench/resolve's workload.

A host model (not the library's code) of `smallest_key_victims` in
include/dhisparse/detail/resolve/victims.cuh for one request of static_budget<4096> with LRU:
the cache holds the C = 1024 smallest (key, position) of the request's rows; a step walks it
for its victims, skipping rows whose key changed and keeping pinned ones; when it runs out
the rows past its last entry are scanned ("deep"); an invalid cache is scanned in full.
The workload is bench/resolve's drift (workload.hpp): each step keeps 86% of the previous
selection and replaces the rest with rows no buffer holds, so a step needs 287 + 1 victims.

Two rules for a deep cache, the step after it was built:
  before: always invalid (main: "a deep cache lacks the rows below it") -> a full rescan;
  after:  valid when no walk before the deep scan kept a row and its entry's key is below
          the step's epoch (docs/patches/victims_deep_cache.patch).
Every step checks that the victims are the exact smallest (key, position) of the unpinned
rows, then the model prints how many steps rescanned.

Usage: scripts/probes/victim_cache_model.py [before|after] (default: both)
"""
import random
import sys


def run(deep_stays_valid, steps=400, H=4096, K=2048, C=1024, keep=0.86, seed=1):
    rng = random.Random(seed)
    length = 100000
    positions = rng.sample(range(length), H)
    key = {p: 0 for p in positions}  # resident row (position) -> key (epoch of last use)
    prev = positions[:K]
    for p in positions[K:]:
        key[p] = -1 - rng.randrange(8)
    cache, valid, complete, last = [], False, False, None
    full = deep_scans = steps_with = 0

    def scan(after=None):
        rows = sorted((k, p) for p, k in key.items() if after is None or (k, p) > after)
        return rows[:C], len(rows) <= C

    for epoch in range(1, steps + 1):
        sel = set(rng.sample(prev, round(keep * K)))
        while len(sel) < K:
            q = rng.randrange(length)
            if q not in key and q not in sel:
                sel.add(q)
        hits = [p for p in sel if p in key]
        misses = [p for p in sel if p not in key]
        for p in hits:  # lookup: LRU hits take the step's epoch
            key[p] = epoch
        need, pinned = len(misses) + 1, set(hits)  # the misses and one tail row
        victims, taken, rescanned = [], set(), False
        if not valid:
            (cache, complete), valid = scan(), True
            last, full, rescanned = (cache[-1] if cache else None), full + 1, True
        deep, after, lost = False, None, False
        while len(victims) < need:
            kept, i = [], 0
            while i < len(cache) and len(victims) < need:
                k, p = cache[i]
                i += 1
                if key.get(p) != k or p in taken:  # changed (or taken): dropped
                    continue
                if p in pinned:  # blocked: stays
                    kept.append((k, p))
                    continue
                victims.append(p)
                taken.add(p)
            if len(victims) >= need or complete or last is None:
                cache = kept + cache[i:]
                break
            lost = lost or bool(kept)
            after, deep = last, True
            cache, complete = scan(after)
            last, deep_scans, rescanned = (cache[-1] if cache else None), deep_scans + 1, True
        exact = sorted((k, p) for p, k in key.items() if p not in pinned)[:need]
        assert sorted(victims) == sorted(p for _, p in exact), f"step {epoch}: not the smallest keys"
        if deep and not (deep_stays_valid and not lost and after[0] < epoch):
            valid = False
        for p in victims:
            del key[p]
        for p in misses:
            key[p] = epoch
        length += 1  # the step's tail row
        key[length - 1] = epoch
        if complete:  # an insert breaks a complete cache
            valid = False
        prev = list(sel)
        steps_with += rescanned
    return full, deep_scans, steps_with / steps


if __name__ == "__main__":
    modes = sys.argv[1:] or ["before", "after"]
    for mode in modes:
        f, d, frac = run(mode == "after")
        print(f"{mode:6}: {f} full and {d} deep rescans in 400 steps; {frac:.0%} of the steps rescan")
