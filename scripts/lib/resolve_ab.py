#!/usr/bin/env python3
"""Side-by-side table of bench_resolve JSON runs: one row per configuration (batch, Q, hit
rate, budget), one column per run, µs per `resolve` (or another field with --field), and
the reclaim line. The runs are named by their file names.

Usage: resolve_ab.py [--field resolve_us] RUN.json...
"""
import json, os, sys


def main(argv):
    field = 'resolve_us'
    if len(argv) > 2 and argv[1] == '--field':
        field, argv = argv[2], argv[:1] + argv[3:]
    files = argv[1:]
    if not files:
        sys.exit(__doc__)
    runs, order = [], []
    for f in files:
        rows = {}
        for r in json.load(open(f))['records']:
            if 'batch' in r:
                key = (r['batch'], r['queries'], r['hit_rate'], r['budget'])
                rows[key] = r.get(field, float('nan'))
                if key not in order:
                    order.append(key)
            elif r.get('operation') == 'reclaim':
                rows['reclaim'] = r['reclaim_us']
        runs.append(rows)
    names = [os.path.splitext(os.path.basename(f))[0].replace('resolve_', '')[-10:] for f in files]
    print(f'{field}, µs')
    print('%5s %2s %4s %-14s' % ('B', 'Q', 'hits', 'budget') + ''.join('%11s' % n for n in names))
    for key in order + ['reclaim']:
        label = '%-28s' % 'reclaim' if key == 'reclaim' else '%5d %2d %3.0f%% %-14s' % (key[0], key[1], 100 * key[2], key[3])
        print(label + ''.join('%11.1f' % r[key] if key in r else '%11s' % '-' for r in runs))


if __name__ == '__main__':
    main(sys.argv)
