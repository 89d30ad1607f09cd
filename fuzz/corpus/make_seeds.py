#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/): a few small valid
inputs and a few invalid ones; and the hand-made reproducers of fuzz findings
(tests/fuzz_regressions/inputs/<target>/). The files are committed; run this again only
when a harness changes how it decodes its input (fuzz/fuzz_input.hpp: `input::integer`).

    python3 fuzz/corpus/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- the byte encoding of fuzz/fuzz_input.hpp -------------------------------------------

def integer(value, lo, hi):
    """input::integer<T>(lo, hi) decoding to `value` (lo <= value <= hi)."""
    assert lo <= value <= hi, (value, lo, hi)
    span, offset, out = hi - lo, value - lo, bytearray([(value - lo) & 0xFF])
    assert out[0] != 0xFF, "the selector 0xFF means raw: pick another value"
    shift = 8
    while shift < 64 and (span >> shift) != 0:
        out.append((offset >> shift) & 0xFF)
        shift += 8
    return bytes(out)


def raw(value, fmt):
    """input::integer's raw form (selector 0xFF) of a struct-format value."""
    return b"\xff" + struct.pack("<" + fmt, value)


def boolean(flag):
    return b"\x01" if flag else b"\x00"


def write(target, name, data, root=HERE):
    folder = os.path.join(root, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# ---- trace_reader: trace files (docs/trace.md) ------------------------------------------

def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def trace_file(groups, max_requests, max_queries, top_k, steps, scores=False, accepted=False,
               payload=None, checksum=None, magic=b"DHSTRACE"):
    """steps: list of steps, each a list of (id, length, queries, accepted, rows) where rows
    is [group][query] lists of top_k positions."""
    body = bytearray()
    for index, step in enumerate(steps):
        body += struct.pack("<IIQ", 0x50455453, len(step), index)
        for rid, length, queries, acc, _ in step:
            body += struct.pack("<QiiiI", rid, length, queries, acc, 0)
        for g in range(groups):
            for _, _, queries, _, rows in step:
                for q in range(queries):
                    body += struct.pack("<%di" % top_k, *rows[g][q])
                    if scores:
                        body += struct.pack("<%df" % top_k, *[0.5] * top_k)
    flags = (1 if scores else 0) | (2 if accepted else 0)
    header = magic + struct.pack("<IIIIIIIIQQQ", 1, 64, groups, max_requests, max_queries, top_k, flags, 0,
                                 len(steps), len(body) if payload is None else payload,
                                 fnv1a64(body) if checksum is None else checksum)
    return header + bytes(body)


def trace_seeds():
    one = [(7, 3, 2, -1, [[[0, 1, -1, 3], [4, 2, 2, -1]]])]
    two = [(1, 5, 1, -1, [[[0, 5, -1, -1]]]), (9, 0, 1, -1, [[[0, -1, -1, -1]]])]
    write("trace_reader", "valid_two_steps.trace", trace_file(1, 2, 2, 4, [one, two]))
    write("trace_reader", "valid_empty.trace", trace_file(1, 1, 1, 1, []))
    scored = [(3, 4, 3, 2, [[[0, 1], [4, 5], [6, -1]], [[3, 3], [-1, 2], [1, 0]]])]
    write("trace_reader", "valid_scores_accepted.trace",
          trace_file(2, 2, 3, 2, [scored, [], scored], scores=True, accepted=True))
    good = trace_file(1, 2, 2, 4, [one, two])
    write("trace_reader", "invalid_truncated.trace", good[:-5])
    write("trace_reader", "invalid_checksum.trace", trace_file(1, 2, 2, 4, [one, two], checksum=1))
    write("trace_reader", "invalid_magic.trace", trace_file(1, 2, 2, 4, [one], magic=b"DHSTRACX"))
    write("trace_reader", "invalid_unfinished.trace", trace_file(1, 2, 2, 4, [one], payload=0xFFFFFFFFFFFFFFFF))
    beyond = [(7, 3, 1, -1, [[[0, 1, 9, 3]]])]  # position 9 > length 3 + query 0
    write("trace_reader", "invalid_position.trace", trace_file(1, 2, 2, 4, [beyond]))
    twice = [(7, 3, 1, -1, [[[0, 1, 2, 3]]]), (7, 3, 1, -1, [[[0, 1, 2, 3]]])]
    write("trace_reader", "invalid_duplicate_id.trace", trace_file(1, 2, 2, 4, [twice]))


# ---- hierarchy_config and selections: a configuration, then operations ------------------

OPS = ["admit", "release", "reserve", "set_batch", "resolve", "retrieve", "commit", "backup",
       "set_pool_limit", "reclaim", "prewarm", "prewarm_range", "host_row", "views"]


def config(wide, groups, layers, requests, batch, queries, top_k, context, slots, map_log, page_log, pages,
           interval, watermark, reclaim_batch, slabs=0, choice=0):
    """decode_config (fuzz/hierarchy_ops.hpp) then the policy choice byte. A field given as
    bytes is written as it is (a raw value, say); map_log / page_log are log2 values."""
    s = 2 if wide else 0
    f = lambda v, lo, hi: v if isinstance(v, bytes) else integer(v, lo - s, hi + s)
    p = lambda v, max_log: v if isinstance(v, bytes) else (boolean(False) if wide else b"") + integer(v, 0, max_log)
    out = f(groups, 1, 3) + b"".join(f(l, 1, 2) for l in layers) + f(requests, 1, 6)
    out += f(batch, 1, max(1, requests)) + f(queries, 1, 3) + f(top_k, 1, 8) + f(context, 1, 256)
    out += f(slots, 1, 512) + p(map_log, 10) + p(page_log, 5)
    out += f(pages, 1, 512) + f(interval, 1, 4) + f(watermark, 0, 8) + f(reclaim_batch, -1, 8)
    if wide:
        out += f(slabs, 0, groups)
    return out + bytes([choice])


def op(name, *args):
    return bytes([OPS.index(name)]) + b"".join(args)


def some_id(i, known=False):
    return boolean(known) + integer(i, 0, 9)


def around_small(v):
    return boolean(True) + integer(v, -1, 40)


def admit(i, length):
    return op("admit", some_id(i), around_small(length), boolean(True))  # default capacity


def set_batch(entries, max_batch, max_queries):
    return op("set_batch", integer(len(entries), -1, max_batch + 1),
              *[some_id(i) + integer(q, 0, max_queries + 1) for i, q in entries])


def resolve(group, groups, top_k, max_top_k, rows, scores=False):
    """rows: per batch entry, (length, queries × top_k entries, [(entry, position)])."""
    out = integer(group, -1, groups) + integer(top_k, 0, max_top_k + 1)
    for length, entries, picks in rows:
        out += bytes([len(picks)])
        for e, pos in picks:
            q = e // top_k
            out += integer(e, 0, entries - 1) + integer(pos, -2, length + q + 1) + bytes([100])
    return op("resolve", out, boolean(scores))


def hierarchy_seeds():
    small = dict(groups=2, layers=[2, 1], requests=4, batch=2, queries=2, top_k=4, context=200, slots=250,
                 map_log=4, page_log=3, pages=128, interval=2, watermark=2, reclaim_batch=-1)
    rows = [(10, 8, [(0, 3), (1, 9), (4, 10), (5, 0)]), (5, 8, [(0, 4), (2, 1)])]
    for choice in range(5):
        scores = choice == 3  # score_ema needs scores
        step = (set_batch([(0, 2), (1, 1)], 2, 2) + resolve(0, 2, 4, 4, rows, scores) +
                op("retrieve", integer(0, -1, 2), integer(0, -1, 4), integer(-1, -2, 4)) +
                resolve(1, 2, 4, 4, rows, scores) +
                op("commit", integer(2, -1, 3), integer(1, -1, 3), boolean(False)) + op("backup"))
        ops = admit(0, 10) + admit(1, 5) + step + step
        write("selections", "steps_policy%d" % choice, config(False, choice=choice, **small) + ops)
    churn = (admit(3, 30) + op("release", some_id(3)) + admit(3, 0) + set_batch([(3, 2)], 2, 2) +
             resolve(0, 2, 4, 4, [(0, 8, [(0, 0), (4, 1)])], scores=True) +
             op("commit", integer(1, -1, 3), boolean(True)) +
             op("set_pool_limit", integer(0, -1, 2), boolean(False) + integer(250, 248, 251)) +
             op("set_pool_limit", integer(1, -1, 2), around_small(40)) +
             op("reclaim", integer(0, -1, 2), around_small(8)) + op("prewarm", some_id(3), around_small(4)))
    write("selections", "churn_adaptive", config(False, choice=2, **small) + churn)
    bad = (admit(0, 10) + admit(0, 10) + op("release", some_id(5)) + set_batch([(0, 3)], 2, 2) +
           op("resolve", integer(2, -1, 2), integer(5, 0, 5), boolean(False)) +
           op("views", integer(1, -1, 2), bytes([0])) + op("host_row", some_id(0), integer(0, -1, 2),
                                                           integer(3, -1, 4), around_small(2), b"\x07"))
    write("selections", "rejected_calls", config(False, choice=0, **small) + bad)

    write("hierarchy_config", "valid_static", config(True, choice=0, **small) + ops)
    write("hierarchy_config", "valid_resident", config(True, choice=4, **small) + admit(0, 10))
    invalid = [("batch_above_requests", dict(small, requests=2, batch=3)),
               ("no_groups", dict(small, groups=0, layers=[])),
               ("page_not_power_of_two", dict(small, page_log=boolean(True) + integer(24, -2, 34))),
               ("static_budget_too_small", dict(small, queries=5, top_k=10, interval=4)),
               ("queries_times_top_k", dict(small, top_k=raw(20000, "q")))]
    for name, fields in invalid:
        write("hierarchy_config", "invalid_" + name, config(True, **fields))


# ---- verify_inputs: verify_params and their distributions ------------------------------

def verify_seed(rule, topology, distribution, capacity, drafts, vocab, candidates, rows, tree=None,
                tolerance=0, strides=None, num_drafts=None, tokens=1, candidate_prob=191):
    """decode_verify_shapes + the contents (fuzz/verify_inputs.hpp). rows: the mode of each
    p / q row (0 normalized bytes, 1 one token, 2 anything)."""
    out = (integer(rule, 0, 1) + integer(topology, 0, 1) + integer(distribution, 0, 2) +
           integer(capacity, -1, 4) + integer(drafts, -1, 8) + integer(vocab, -1, 40) +
           integer(candidates, -1, 8))
    out += strides if strides is not None else boolean(True) * 4
    out += boolean(True) + integer(tolerance, 0, 6) + boolean(False) + boolean(False)
    out += integer(capacity, -1, capacity + 1)
    rows_q = drafts + 1 if topology == 1 else drafts
    for b in range(capacity):
        out += integer(drafts if num_drafts is None else num_drafts, -1, drafts + 1)
        if topology == 1 and tree is not None:
            out += boolean(True) + b"".join(integer(p, 0, m - 1) for m, p in enumerate(tree, 1))
        elif topology == 1:  # every link -1: nodes nobody links to
            out += boolean(False) + integer(-1, -1, drafts + 1) * (2 * (drafts + 1))
        for m in range(drafts + 1):
            out += integer(1, -1, vocab) if rule == 0 else b""  # target_tokens: greedy only
            for _ in range(2 if rule == 1 and distribution == 1 and m < rows_q else 1):  # p, q (dense)
                out += bytes([rows]) + (bytes(range(3, 3 + vocab)) if rows != 1 else integer(tokens, 0, vocab - 1))
    row_tokens = drafts + 1 if topology == 1 else drafts
    out += b"".join(integer(tokens, -1, vocab) for _ in range(capacity * row_tokens))
    slots = capacity * rows_q * candidates if rule == 1 and distribution == 2 else 0
    out += b"".join(integer(tokens + k % max(candidates, 1), -1, vocab) for k in range(slots))
    out += bytes([candidate_prob]) * slots + bytes(range(16))
    return out


def verify_seeds():
    write("verify_inputs", "greedy_chain", verify_seed(0, 0, 0, 2, 3, 8, 0, 1))
    write("verify_inputs", "sampling_chain_dense", verify_seed(1, 0, 1, 2, 3, 8, 0, 0))
    write("verify_inputs", "sampling_tree_candidates", verify_seed(1, 1, 2, 1, 4, 6, 1, 0, tree=[0, 0, 1, 1]))
    write("verify_inputs", "sampling_chain_one_hot", verify_seed(1, 0, 0, 3, 2, 5, 0, 1))
    write("verify_inputs", "invalid_p_anything", verify_seed(1, 0, 1, 1, 2, 6, 0, 2))
    write("verify_inputs", "invalid_tree_links", verify_seed(1, 1, 1, 1, 3, 4, 0, 0))
    write("verify_inputs", "invalid_num_drafts", verify_seed(0, 0, 0, 2, 2, 4, 0, 1, num_drafts=3))
    write("verify_inputs", "invalid_stride", verify_seed(1, 0, 1, 1, 2, 4, 0, 0,
                                                         strides=boolean(False) + integer(3, 3, 7) + boolean(True) * 3))


# ---- host_layout: described host pages (fuzz/host_layout.hpp) ----------------------------

def layout_bytes(units, max_units, off=0):
    return integer(units, 0, max_units) + (integer(0, 0, 7) + integer(off, 1, 15) if off else integer(1, 0, 7))


def layout_seed(layers, page_log, groups=None, page_units=None, page_off=0):
    out = integer(len(layers), 1, 4) + b"".join(integer(l, 1, 4) for l in layers) + integer(page_log, 0, 6)
    out += boolean(groups is not None)
    if groups is not None:
        out += integer(len(groups), 0, 5)
        for offset, offset_off, stride, stride_off in groups:
            out += layout_bytes(offset, 256, offset_off) + layout_bytes(stride, 32, stride_off)
    out += boolean(page_units is not None)
    if page_units is not None:
        out += layout_bytes(page_units, 4096, page_off)
    return out


def layout_seeds():
    # Rows of 16 bytes; groups of 2 and 1 layers; 8 positions a page.
    write("host_layout", "valid_packed", layout_seed([2, 1], 3))
    write("host_layout", "valid_padded_page", layout_seed([2, 1], 3, page_units=28))
    # An engine's page: position-major, group 1's row first, one 16-byte pad per position.
    engine = [(1, 0, 4, 0), (0, 0, 4, 0)]
    write("host_layout", "valid_interleaved", layout_seed([2, 1], 3, groups=engine, page_units=32))
    write("host_layout", "invalid_overlapping", layout_seed([2, 1], 3, groups=[(1, 0, 4, 0), (2, 0, 4, 0)]))
    write("host_layout", "invalid_unaligned", layout_seed([2, 1], 3, groups=[(1, 3, 4, 0), (0, 0, 4, 0)]))
    write("host_layout", "invalid_group_count", layout_seed([2, 1], 3, groups=[(0, 0, 4, 0)]))
    write("host_layout", "invalid_page_too_small", layout_seed([2, 1], 3, groups=engine, page_units=20))


# ---- reproducers of findings (docs/reliability.md) --------------------------------------

def finding_inputs():
    root = os.path.join(HERE, "..", "..", "tests", "fuzz_regressions", "inputs")
    small = dict(groups=2, layers=[2, 1], requests=4, batch=2, queries=2, top_k=4, context=200, slots=250,
                 map_log=4, page_log=3, pages=128, interval=2, watermark=2, reclaim_batch=-1)
    rows = [(10, 8, [(0, 3), (1, 9), (4, 10), (5, 0)]), (5, 8, [(0, 4), (2, 1)])]
    # F2: request 1 released between resolve and retrieve / commit of its batch.
    f2 = (admit(0, 10) + admit(1, 5) + set_batch([(0, 2), (1, 1)], 2, 2) + resolve(0, 2, 4, 4, rows) +
          op("release", some_id(1)) + op("retrieve", integer(0, -1, 2), integer(0, -1, 4), integer(-1, -2, 4)) +
          op("commit", integer(0, -1, 3), integer(0, -1, 3), boolean(True)) + op("backup"))
    write("selections", "f2_release_in_batch", config(False, choice=0, **small) + f2, root)
    # F8: backup_interval_steps = 2^31 - 1 (found by reading; the fuzzers had not reached it).
    f8 = config(True, choice=2, **dict(small, interval=raw(2 ** 31 - 1, "q"))) + admit(0, 10)
    write("hierarchy_config", "f8_backup_interval_overflow", f8, root)


if __name__ == "__main__":
    finding_inputs()
    trace_seeds()
    hierarchy_seeds()
    verify_seeds()
    layout_seeds()
