#!/usr/bin/env python3
"""dhisparse from PyTorch: builds examples/torch as a torch extension and drives a decode
loop from Python, eagerly and then replayed through one torch.cuda.CUDAGraph.

Every step resolves random top-K selections (any order, -1 padding, a repeated entry,
sometimes the step's own new row), writes the new rows into the tail slots from Python, runs
sparse attention over the slot tables, commits and backs up. Checked after every step: every
row the slot tables name is, bit for bit, the row the test wrote for that position; attention
matches a float64 reference computed from those rows; the status word is clear. Checked at
phase ends: the host store holds every committed row exactly, and the counters agree with
what the test counted. At construction: the hierarchy's device memory came from torch's
caching allocator, exactly `bytes_required` bytes of it.

Exit status: 0 passed, 1 failed, 77 skipped (no torch with CUDA, no GPU, no nvcc or ninja,
not an sm_90 GPU). DHISPARSE_SEED=<n> repeats a run; DHISPARSE_TORCH_VERBOSE=1 shows the build.
"""

import gc
import math
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

SKIP = 77
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# The hierarchy of this test: two layer groups (2 layers and 1), 4 requests per step out of
# at most 5 admitted, top-64 selections, a 512-slot pool per group (the requests' rows do not
# all fit: the adaptive budget reclaims), 16 MLA heads.
GROUP_LAYERS = [2, 1]
MAX_REQUESTS = 5
MAX_BATCH = 4
MAX_QUERIES = 1
TOP_K = 64
MAX_CONTEXT = 4096
SLOTS = 512
HOST_PAGES = MAX_REQUESTS * MAX_CONTEXT // 64
HEADS = 16
ROW = 656          # mla_fp8_656: 512 e4m3 latents, 4 fp32 tile scales, 64 bf16 rope values
QUERY_DIM = 576
VALUE_DIM = 512
SCALE = 1.0 / math.sqrt(QUERY_DIM)
EAGER_STEPS = 12
REPLAYS = 8        # per batch; the batch changes once between replays

PROMPTS = {101: 300, 102: 777, 103: 1500, 104: 2100}  # request id: prompt length
LATE = (105, 950)  # admitted after 101 is released, while the captured graph keeps replaying


def skip(why):
    print(f"skipped: {why}")
    sys.exit(SKIP)


def import_torch():
    try:
        import torch
    except ImportError as e:
        skip(f"python3 cannot import torch ({e})")
    if torch.version.cuda is None:
        skip(f"torch {torch.__version__} is built without CUDA")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        skip(f"torch {torch.__version__} sees no CUDA device")
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        skip(f"the library is built for sm_90 (H100/H200); this GPU is sm_{major}{minor}")
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME
    if home is None or not (Path(home) / "bin" / "nvcc").exists():
        skip("no CUDA toolkit with nvcc found (set CUDA_HOME)")
    if not cpp_extension.is_ninja_available():
        skip("ninja is missing (torch.utils.cpp_extension.load needs it)")
    return torch


def build_extension(torch):
    """Compiles mla_hierarchy.cu (nvcc: the library's kernels, no torch headers) and
    dhisparse_torch.cpp (the host compiler: the torch glue) and loads the library, which
    registers torch.classes.dhisparse.Hierarchy."""
    from torch.utils.cpp_extension import load
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    started = time.time()
    load(
        name="dhisparse_torch",
        sources=[str(HERE / "dhisparse_torch.cpp"), str(HERE / "mla_hierarchy.cu")],
        extra_include_paths=[str(REPO / "include")],
        extra_cflags=["-O2"],
        # What the library's CMake gives its own CUDA targets: C++17, sm_90, relaxed constexpr.
        extra_cuda_cflags=["-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90",
                           "--expt-relaxed-constexpr", "-lineinfo"],
        is_python_module=False,
        verbose=os.environ.get("DHISPARSE_TORCH_VERBOSE") == "1",
    )
    return time.time() - started


# ---- rows and their meaning -----------------------------------------------------------------

def e4m3_value(byte):
    """The value of one FP8 E4M3 (fn) byte; NaN for the two NaN codes."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * 2.0 ** -6 * mantissa / 8
    return sign * 2.0 ** (exponent - 7) * (1 + mantissa / 8)


def make_rows(torch, n, gen):
    """n valid mla_fp8_656 rows (uint8 [n, 656]): e4m3 latents of magnitude below 4, tile
    scales in [0.25, 0.75), bf16 rope values, so that attention stays finite and moderate."""
    sign = torch.randint(0, 2, (n, 512), generator=gen) << 7
    exponent = torch.randint(1, 9, (n, 512), generator=gen) << 3
    mantissa = torch.randint(0, 8, (n, 512), generator=gen)
    nope = (sign | exponent | mantissa).to(torch.uint8)
    nope[torch.rand(n, 512, generator=gen) < 0.05] = 0  # some exact zeros
    scales = (torch.rand(n, 4, generator=gen) * 0.5 + 0.25).view(torch.uint8)  # float32 [n, 4] -> [n, 16]
    rope = torch.randn(n, 64, generator=gen).to(torch.bfloat16).view(torch.uint8)  # [n, 128]
    return torch.cat([nope, scales, rope], dim=1).contiguous()


class Dequantizer:
    """uint8 mla_fp8_656 rows -> float64 [n, 576] (latent × tile scale, then rope), as the
    library's host reference reads them."""

    def __init__(self, torch):
        self.torch = torch
        self.e4m3 = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float32)

    def __call__(self, rows):
        torch = self.torch
        latent = self.e4m3[rows[:, :512].long()]
        scales = rows[:, 512:528].contiguous().view(torch.float32)
        rope = rows[:, 528:].contiguous().view(torch.bfloat16).to(torch.float32)
        latent = (latent.view(-1, 4, 128) * scales.view(-1, 4, 1)).view(-1, 512)
        return torch.cat([latent, rope], dim=1).to(torch.float64)


def reference_attention(torch, queries, keys):
    """queries float64 [heads, 576], keys float64 [n, 576] (one per selection entry, repeats
    included) -> out [heads, 512], lse [heads]."""
    scores = SCALE * (queries @ keys.T)
    lse = torch.logsumexp(scores, dim=1)
    return torch.exp(scores - lse[:, None]) @ keys[:, :VALUE_DIM], lse


def make_selection(rng, length, topic):
    """One query's top-K over a request of committed length `length`: most positions near a
    drifting topic, some anywhere, sometimes the step's own new row (position `length`), one
    repeated entry; shuffled, -1 in the free places."""
    wanted = rng.randint(TOP_K // 2, TOP_K - 3)
    chosen = set()
    while len(chosen) < wanted:
        if rng.random() < 0.75:
            chosen.add(min(max(topic + rng.randint(-200, 200), 0), length - 1))
        else:
            chosen.add(rng.randrange(length))
    entries = list(chosen)
    if rng.random() < 0.5:
        entries.append(length)
    entries.append(rng.choice(entries))
    entries += [-1] * (TOP_K - len(entries))
    rng.shuffle(entries)
    return entries


# ---- the test ---------------------------------------------------------------------------------

class Decode:
    """The decode loop and everything the test knows: the rows it wrote (truth), lengths,
    the batch, and what the counters must say."""

    def __init__(self, torch, h, seed):
        self.torch = torch
        self.h = h
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.dequantize = Dequantizer(torch)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.groups = len(GROUP_LAYERS)
        self.truth = {}    # request id -> [group][layer] uint8 CPU [capacity, 656]
        self.length = {}   # request id -> committed length
        self.prompt = {}
        self.topic = {}
        self.batch = []
        # Expected counters per group.
        self.selected = [0] * self.groups
        self.tails = [0] * self.groups
        self.first_touch = [set() for _ in range(self.groups)]  # (request, prefill position) ever selected
        self.tally = SimpleNamespace(steps=0, replays=0, rows=0, attention=0, worst=0.0, worst_lse=0.0,
                                     host_rows=0)
        # Views over the hierarchy's buffers (no copies): what Python reads and writes.
        self.views = SimpleNamespace(
            tails=[h.tail_slots(g) for g in range(self.groups)],
            rows=[[h.layer_rows(g, l) for l in range(GROUP_LAYERS[g])] for g in range(self.groups)],
            tables=None,  # slot tables exist once every group was resolved
            committed_rows=h.committed_rows(),
            commit_status=h.commit_status(),
            counters=[h.counters(g) for g in range(self.groups)],
        )
        # Inputs of a step, written before each step (the captured graph reads these tensors).
        dev = self.device
        self.inputs = SimpleNamespace(
            selections=[torch.full((MAX_BATCH, MAX_QUERIES, TOP_K), -1, dtype=torch.int32, device=dev)
                        for _ in range(self.groups)],
            new_rows=[[torch.zeros(MAX_BATCH * MAX_QUERIES, ROW, dtype=torch.uint8, device=dev)
                       for _ in range(GROUP_LAYERS[g])] for g in range(self.groups)],
            queries=[[torch.zeros(MAX_BATCH, MAX_QUERIES, HEADS, QUERY_DIM, dtype=torch.bfloat16, device=dev)
                      for _ in range(GROUP_LAYERS[g])] for g in range(self.groups)],
        )

    # -- between steps --

    def admit(self, rid, prompt_len, from_device):
        """Admits a request and writes its prefill rows into the host store, from a CUDA
        tensor or a CPU tensor."""
        torch = self.torch
        capacity = min(prompt_len + 128, MAX_CONTEXT)
        self.h.admit(rid, prompt_len, capacity)
        self.truth[rid] = []
        for g in range(self.groups):
            layers = []
            for _ in range(GROUP_LAYERS[g]):
                rows = torch.zeros(capacity, ROW, dtype=torch.uint8)
                rows[:prompt_len] = make_rows(torch, prompt_len, self.gen)
                layers.append(rows)
            self.truth[rid].append(layers)
        for g in range(self.groups):
            for l in range(GROUP_LAYERS[g]):
                prefill = self.truth[rid][g][l][:prompt_len]
                self.h.write_host_rows(rid, g, l, 0, prefill.to(self.device) if from_device else prefill)
        self.length[rid] = prompt_len
        self.prompt[rid] = prompt_len
        self.topic[rid] = self.rng.randrange(prompt_len)

    def set_batch(self, ids):
        torch = self.torch
        self.batch = list(ids)
        self.h.set_batch(torch.tensor(self.batch, dtype=torch.int64),
                         torch.ones(len(self.batch), dtype=torch.int32))

    def release(self, rid):
        self.h.release(rid)
        assert not self.h.contains(rid), f"request {rid} still admitted after release"
        for table in (self.truth, self.length, self.prompt, self.topic):
            del table[rid]

    def prepare(self):
        """Writes the next step's selections, new rows and queries into the input tensors;
        the new rows become the truth at each request's next position."""
        torch = self.torch
        step = SimpleNamespace(selections=[], queries=[])
        for g in range(self.groups):
            selections = torch.full((MAX_BATCH, MAX_QUERIES, TOP_K), -1, dtype=torch.int32)
            for b, rid in enumerate(self.batch):
                self.topic[rid] = min(max(self.topic[rid] + self.rng.randint(-40, 40), 0), self.length[rid] - 1)
                selections[b, 0] = torch.tensor(make_selection(self.rng, self.length[rid], self.topic[rid]),
                                                dtype=torch.int32)
            self.inputs.selections[g].copy_(selections)
            step.selections.append(selections)
            queries = []
            for l in range(GROUP_LAYERS[g]):
                new_rows = make_rows(torch, MAX_BATCH * MAX_QUERIES, self.gen)
                for b, rid in enumerate(self.batch):
                    self.truth[rid][g][l][self.length[rid]] = new_rows[b]
                self.inputs.new_rows[g][l].copy_(new_rows)
                # Logits that span a few units, so that one wrong row would show in the output.
                q = (3 * torch.randn(MAX_BATCH, MAX_QUERIES, HEADS, QUERY_DIM, generator=self.gen)).to(torch.bfloat16)
                self.inputs.queries[g][l].copy_(q)
                queries.append(q)
            step.queries.append(queries)
        return step

    # -- the step: the same code runs eagerly and inside torch.cuda.graph --

    def step(self):
        """One decode step on torch's current stream; returns {(group, layer): (out, lse)}."""
        h, views, inputs = self.h, self.views, self.inputs
        outputs = {}
        for g in range(self.groups):
            h.resolve(g, inputs.selections[g])
            h.retrieve(g)
            tails = views.tails[g].reshape(-1).long()  # the new row of entry b goes to slot tails[b]
            for l in range(GROUP_LAYERS[g]):
                views.rows[g][l].index_copy_(0, tails, inputs.new_rows[g][l])  # "the model" writes its new rows
                outputs[(g, l)] = h.attention(g, l, inputs.queries[g][l], SCALE)
        h.commit(None)
        h.backup()
        return outputs

    # -- checks --

    def check_step(self, step, outputs):
        """After a step ran (and synchronized): the rows every slot-table entry names, the
        attention outputs, the per-entry commit results, the lengths; then the bookkeeping."""
        torch, h, views = self.torch, self.h, self.views
        torch.cuda.synchronize()
        status = h.status()
        assert status == 0, f"status word: {h.describe_status(status)}"
        if views.tables is None:
            views.tables = [h.slot_table(g) for g in range(self.groups)]
        n = len(self.batch)
        assert views.committed_rows.cpu()[:n].tolist() == [1] * n, "commit kept other than one row per request"
        assert views.commit_status.cpu()[:n].tolist() == [0] * n, "commit reported a problem"
        for g in range(self.groups):
            table = views.tables[g].cpu()
            slab = [views.rows[g][l].cpu() for l in range(GROUP_LAYERS[g])]
            results = [(out.cpu().to(torch.float64), lse.cpu().to(torch.float64))
                       for out, lse in (outputs[(g, l)] for l in range(GROUP_LAYERS[g]))]
            for b, rid in enumerate(self.batch):
                entries = step.selections[g][b, 0]
                slots = table[b, 0]
                used = entries >= 0
                assert bool((slots[~used] == -1).all()), f"group {g} request {rid}: a -1 entry got a slot"
                assert bool((slots[used] >= 0).all()), f"group {g} request {rid}: a selection has no slot"
                positions = entries[used].long()
                for l in range(GROUP_LAYERS[g]):
                    truth = self.truth[rid][g][l][positions]
                    seen = slab[l][slots[used].long()]
                    if not torch.equal(seen, truth):
                        bad = int((seen != truth).any(dim=1).nonzero()[0])
                        raise AssertionError(f"group {g} layer {l} request {rid}: position {int(positions[bad])} "
                                             f"read through slot {int(slots[used][bad])} differs from its row")
                    self.tally.rows += int(positions.numel())
                    reference, reference_lse = reference_attention(
                        torch, step.queries[g][l][b, 0].to(torch.float64), self.dequantize(truth))
                    # The bounds of tests/sparse_attention for FP8 rows: the kernel rounds the
                    # dequantized keys and values to bf16, the reference keeps them in float.
                    out, lse = results[l][0][b, 0], results[l][1][b, 0]
                    error = float(((out - reference).norm(dim=1) / reference.norm(dim=1)).max())
                    error_lse = float(((lse - reference_lse).abs() / reference_lse.abs().clamp(min=1.0)).max())
                    assert error < 2.5e-2 and error_lse < 2.5e-2, (
                        f"group {g} layer {l} request {rid}: attention differs from the reference "
                        f"(relative L2 {error:.3g}, lse {error_lse:.3g})")
                    self.tally.worst = max(self.tally.worst, error)
                    self.tally.worst_lse = max(self.tally.worst_lse, error_lse)
                    self.tally.attention += HEADS
                committed = {int(p) for p in positions if int(p) < self.length[rid]}
                self.selected[g] += len(committed)
                self.tails[g] += 1
                self.first_touch[g] |= {(rid, p) for p in committed if p < self.prompt[rid]}
        for rid in self.batch:
            self.length[rid] += 1
            assert h.length(rid) == self.length[rid], f"request {rid}: committed length {h.length(rid)}"

    def check_counters(self):
        """The counters agree with what the test counted: selections (distinct committed rows
        per request and step), tails, backups exactly; fetches between the first touches of
        prefill rows (nothing is resident at admission) and that plus every row reclaimed
        since (a row is fetched again only after it left the device)."""
        h = self.h
        names = h.counter_names()
        summary = []
        for g in range(self.groups):
            c = h.read_counters(g)
            where = f"group {g}"
            assert c["selected_rows"] == self.selected[g], f"{where}: selected_rows {c['selected_rows']} != {self.selected[g]}"
            assert c["tail_rows"] == self.tails[g], f"{where}: tail_rows {c['tail_rows']} != {self.tails[g]}"
            assert c["backed_up_rows"] == self.tails[g], f"{where}: backed_up_rows {c['backed_up_rows']} != {self.tails[g]}"
            assert c["prewarmed_rows"] == 0, f"{where}: prewarmed_rows {c['prewarmed_rows']}"
            assert c["evicted_rows"] == 0, f"{where}: evicted_rows {c['evicted_rows']} (adaptive budget: no cap)"
            first = len(self.first_touch[g])
            assert first <= c["fetched_rows"] <= first + c["reclaimed_rows"], (
                f"{where}: fetched_rows {c['fetched_rows']} outside [{first}, {first} + {c['reclaimed_rows']} reclaimed]")
            assert c["group_row_bytes"] == GROUP_LAYERS[g] * ROW
            assert c["h2d_bytes"] == c["fetched_rows"] * c["group_row_bytes"]
            assert c["d2h_bytes"] == c["backed_up_rows"] * c["group_row_bytes"]
            on_device = self.views.counters[g].cpu().tolist()
            assert on_device == [c[name] for name in names], f"{where}: counters view {on_device} != {c}"
            summary.append((first, c))
        return summary

    def check_host_store(self):
        """Every committed row of every admitted request is in the host store, exactly."""
        torch = self.torch
        for rid, length in self.length.items():
            for g in range(self.groups):
                for l in range(GROUP_LAYERS[g]):
                    stored = self.h.host_rows(rid, g, l, 0, length)  # synchronizes the stream
                    assert torch.equal(stored, self.truth[rid][g][l][:length]), (
                        f"host store: request {rid} group {g} layer {l} differs")
                    self.tally.host_rows += length


def run(torch, seed):
    torch.cuda.init()
    device_name = torch.cuda.get_device_name()
    built = build_extension(torch)

    # Construction: device memory from torch's caching allocator, exactly bytes_required.
    torch.cuda.synchronize()
    allocated_before = torch.cuda.memory_allocated()
    requested_before = torch.cuda.memory_stats().get("requested_bytes.all.current")
    h = torch.classes.dhisparse.Hierarchy(GROUP_LAYERS, MAX_REQUESTS, MAX_BATCH, MAX_QUERIES, TOP_K, MAX_CONTEXT,
                                          SLOTS, HOST_PAGES, HEADS)
    torch.cuda.synchronize()
    grew = torch.cuda.memory_allocated() - allocated_before
    requested_after = torch.cuda.memory_stats().get("requested_bytes.all.current")
    need, seen = h.bytes_required(), h.memory()
    assert seen["device_bytes"] == need["device_bytes"], f"device resource saw {seen['device_bytes']} B, bytes_required {need['device_bytes']} B"
    assert seen["pinned_bytes"] == need["pinned_bytes"], f"pinned resource saw {seen['pinned_bytes']} B, bytes_required {need['pinned_bytes']} B"
    slack = seen["device_allocations"] * (2**20 + 512)  # the allocator rounds blocks up (512 B; large blocks: unsplit tails < 1 MiB)
    assert need["device_bytes"] <= grew <= need["device_bytes"] + slack, (
        f"torch.cuda.memory_allocated() grew by {grew} B for {need['device_bytes']} B asked "
        f"in {seen['device_allocations']} allocations")
    if requested_before is not None and requested_after is not None:
        assert requested_after - requested_before == need["device_bytes"], (
            f"torch's requested_bytes grew by {requested_after - requested_before} B, bytes_required {need['device_bytes']} B")

    decode = Decode(torch, h, seed)
    for i, (rid, prompt_len) in enumerate(PROMPTS.items()):
        decode.admit(rid, prompt_len, from_device=(i % 2 == 1))
    decode.set_batch(PROMPTS.keys())

    # Eager steps.
    for _ in range(EAGER_STEPS):
        step = decode.prepare()
        outputs = decode.step()
        decode.check_step(step, outputs)
        decode.tally.steps += 1
    decode.check_counters()
    decode.check_host_store()

    # One step captured, replayed with new selections, rows and queries in the same tensors.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        captured = decode.step()  # recorded, not run: nothing to check or count
    for phase in range(2):
        if phase == 1:
            # A new batch between replays: the batch lives in device memory, no re-capture.
            first = next(iter(PROMPTS))
            decode.release(first)
            decode.admit(LATE[0], LATE[1], from_device=True)
            decode.set_batch([LATE[0]] + [rid for rid in PROMPTS if rid != first])
        for _ in range(REPLAYS):
            step = decode.prepare()
            graph.replay()
            decode.check_step(step, captured)
            decode.tally.replays += 1
        decode.check_host_store()
    counters = decode.check_counters()

    t = decode.tally
    print(f"dhisparse torch extension on {device_name} (torch {torch.__version__}, seed {seed}; built in {built:.0f} s)")
    print(f"  {t.steps} eager steps + {t.replays} replays of one captured step (batch changed once between replays)")
    print(f"  {t.rows} rows read through slot tables, all exact; {t.attention} attention heads against a float64 "
          f"reference (worst relative L2 {t.worst:.2e}, lse {t.worst_lse:.2e})")
    print(f"  host store: {t.host_rows} committed rows checked after backup, all exact")
    print(f"  memory: bytes_required device {need['device_bytes']} B (slabs {need['slab_bytes']} B, attention workspace "
          f"{need['attention_workspace_bytes']} B), all of it from torch's caching allocator in "
          f"{seen['device_allocations']} allocations (memory_allocated +{grew} B); pinned {need['pinned_bytes']} B")
    for g, (first, c) in enumerate(counters):
        fraction = c["fetched_rows"] / max(c["selected_rows"], 1)
        print(f"  group {g} ({GROUP_LAYERS[g]} layers): selected {c['selected_rows']}, fetched {c['fetched_rows']} "
              f"({100 * fraction:.1f}%; first touches {first}), reclaimed {c['reclaimed_rows']} in {c['reclaims']} "
              f"passes, evicted {c['evicted_rows']}, tails {c['tail_rows']}, backed up {c['backed_up_rows']}; "
              f"h2d {c['h2d_bytes']} B, d2h {c['d2h_bytes']} B")

    # The memory goes back to torch's pool with the last reference (each view holds one).
    torch.cuda.synchronize()
    live = torch.cuda.memory_allocated()
    del decode, h
    gc.collect()
    freed = live - torch.cuda.memory_allocated()
    assert freed >= need["device_bytes"], (
        f"{freed} B went back to torch's caching allocator, less than the hierarchy's {need['device_bytes']} B")
    print(f"  released: {freed} B back to torch's caching allocator")


def main():
    torch = import_torch()
    seed = int(os.environ.get("DHISPARSE_SEED", time.time_ns() % 2**31))
    try:
        run(torch, seed)
    except AssertionError as e:
        print(f"FAILED (seed {seed}): {e}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
