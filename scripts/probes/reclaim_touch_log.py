#!/usr/bin/env python3
"""Design probe (not built or run by CI; needs numpy: Debian python3-numpy): would a
*touch log* let reclaim skip its pass over every slot's state?

Idea under test (issue 12, reclaim <= 50 us): every touch that sets a slot's LRU epoch
appends the slot to a log; a reclaim reads the log from its oldest epoch, keeps the entries
whose slot still carries that epoch (the rest are stale: the row was touched again since),
and stops once it has the rows to release. This simulates one pool under the resolve
benchmark's drift workload (each step every request keeps a fraction h of its K = 2048
previous selections and replaces the rest with positions it never selected; every
selected row is touched) and prints how many log entries the reclaims read per released
row, and how many entries the log holds per owned slot.

  /usr/bin/python3 scripts/probes/reclaim_touch_log.py REQUESTS STEPS HIT_FRACTION POOL_SLOTS WANT

Measured 2026-12-04 (docs/benchmarks.md, "resolve"): live fraction of the entries read
0.13 at h = 0.86 (100 000 rows released read 786 432 entries), 0.05 at h = 0.95, 0.32 at
h = 0.6; at h = 0.99 no reclaim was needed in 400 steps and the log held 79 entries per
owned slot. Not pursued: the reads are random and grow with the hit rate.
"""
import numpy as np, sys
R, K, steps = int(sys.argv[1]), 2048, int(sys.argv[2])
h = float(sys.argv[3]); pool = int(sys.argv[4]); want = int(sys.argv[5])
rng = np.random.default_rng(1)
maxpos = 4 * K + steps * (K - int(h * K)) + 10
slot_of = np.full((R, maxpos), -1, np.int64)        # (request, position) -> slot
slot_epoch = np.full(pool, -1, np.int64)            # epoch of the slot's last touch, -1 free
slot_owner = np.full((pool, 2), -1, np.int64)
free = list(range(pool - 1, -1, -1))
log = []           # per epoch: array of slots touched in it
head = 0           # first epoch still in the log
sel = [rng.choice(K * 4, K, replace=False) for _ in range(R)]
next_new = [K * 4] * R
stats = []
for step in range(steps):
    new_sel = []
    for r in range(R):
        keep = rng.choice(sel[r], int(h * K), replace=False)
        n_new = K - len(keep)
        fresh = np.arange(next_new[r], next_new[r] + n_new); next_new[r] += n_new
        new_sel.append(np.concatenate([keep, fresh]))
    sel = new_sel
    misses = sum(int((slot_of[r, sel[r]] < 0).sum()) for r in range(R))
    if len(free) < misses:  # reclaim: oldest epochs first, via the log
        need = misses - len(free) + want
        got, scanned, e = 0, 0, head
        while got < need and e < len(log):
            arr = log[e]; scanned += len(arr)
            live = arr[slot_epoch[arr] == e]
            take = live[: need - got]
            for s in take:
                r, p = slot_owner[s]; slot_of[r, p] = -1; slot_epoch[s] = -1; free.append(int(s))
            got += len(take)
            if len(take) == len(live): e += 1
            else: break
        stats.append((step, need, got, scanned))
        head = e
    touched = []
    for r in range(R):
        s = slot_of[r, sel[r]]
        miss = np.where(s < 0)[0]
        for i in miss:
            t = free.pop(); slot_of[r, sel[r][i]] = t; slot_owner[t] = (r, sel[r][i]); s[i] = t
        touched.append(s)
    t = np.unique(np.concatenate(touched))
    slot_epoch[t] = step
    log.append(t)
tot_need = sum(x[1] for x in stats); tot_scan = sum(x[3] for x in stats)
print(f"R={R} h={h} pool={pool} want={want}: {len(stats)} reclaims, released {tot_need}, scanned {tot_scan} entries, live fraction {tot_need/max(tot_scan,1):.3f}")
for x in stats[-3:]: print("  step %d need %d got %d scanned %d" % x)
live_log = sum(len(a) for a in log[head:])
print(f"  log entries still held: {live_log} for {int((slot_epoch>=0).sum())} owned slots")
