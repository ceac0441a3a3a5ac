"""Issue 18: an exact-LRU simulation of a fused attention kernel's K/V reads under an ideal schedule (CPU).

    PYTHONPATH=src python bench/l2_sim.py B H N d [--causal] [--impl flash] [--kv-heads HKV] [--cap 0.434]
        [--cliff] [--persistent [--middle-alone]] [--jitter SIGMA [--seed S]] [--dtype bf16]
        [--attnscope-impl auto] [--backward portable|hopper [--atomic]]

The check on model/l2.py's re-read closed forms (`wave_rereads`) that no GPU gives: the same kernel geometry
(`l2.kernel_of`: block sizes, CTAs per SM, walk direction, grid order) run through an ideal machine and an LRU
L2. C = SMs x CTAs/SM slots; CTAs start in grid order as slots free; every running CTA reads one K/V tile per
step (one rate for all: no DRAM stalls, no clock spread); a causal CTA walks the tiles `tiles.Grid.kv_bounds`
loads, FA-2 from its diagonal down; attnscope's portable kernel launches causal query tiles heaviest first
(kernels/fwd.py); ``--attnscope-impl auto``: the Gluon variant `attnscope bytes` estimates for the call
instead (model.dispatch.hopper_variant). GQA (``--kv-heads``): the
query heads of a group read one K/V set. The L2 holds ``--cap`` x L2 bytes of K/V lines (default the shared
capacity, `L2Params.shared`), LRU over K/V tiles and each CTA's Q (read at its start) and O (written at its
end), weighted by `L2Params.qo_weight` as the closed form does. Prints the K/V reads beyond one pass, in K/V
sets. ``--cliff``: the capacity (x L2) below which the simulated re-reads exceed half a set (bisection). Cost
grows with sets x T x tiles (a 32k FA-2 point: seconds): a development tool, never on the estimate's path.

``--frames``: each CTA's spill frame (`l2.Kernel.frame`) stays in the L2 while it runs, at warp-slot
addresses re-used `L2Params.slot_reuse_lifetimes` lifetimes after a CTA ends. ``--ramp R``: a re-use misses
`l2.miss` of its LRU stack distance over the capacity with ramp R (the H200's measured curve, not LRU's
cliff): the check on `l2.head_gap_rereads`.

``--jitter SIGMA``: CTAs out of step: each reads its tiles at its own rate (lifetimes spread SIGMA, relative,
normal per CTA), so each slot's chain of CTAs drifts (about SIGMA x sqrt(waves) lifetimes) and the lockstep
waves `l2.lockstep_rereads` assumes blur. The check on whether drift explains FA-2's many-wave unmasked
points measuring fewer re-reads than the ideal schedule (issue 18; no measurement gives SIGMA).

``--backward BUILD`` (attnscope's dK/dV kernel, `backward_walk`): its CTAs walk the query tiles from their
diagonal forward, the GQA group's heads in turn; prints the share of the counted re-reads (of Q, dO, LSE2,
Delta and, ``--atomic``, the fp32 dQ rows) that miss: the check on `model.l2_reuse.diagonal_walk_share`.

``--window L,R`` (``--impl attnscope`` or ``flex``): a sliding-window forward with the geometry
`model.window_estimate.window_kernel` names (what ``impl="auto"`` dispatches to, or Flex's), each query tile
walking the KV tiles its window loads, the persistent Gluon kernel as its static schedule (a causal
window's first tiles in pairs, `tiles.persistent_ramp`); prints the re-reads beside the window estimate's
``kv_rereads``: the check on model/window_estimate.py's wave and group terms.

``--persistent`` (attnscope, causal): the persistent kernel's schedule instead of a grid
(kernels/fwd_hopper.py ``_work``, `tiles.persistent_item`): 132 programs, item q on program q % 132 in
rounds, heavy tile then light, every program one K/V tile per step with no barrier between rounds (``--ramp``
as above).
``--middle-alone``: the schedule before 2026-12-01 (pairs (k, T - 1 - k); an odd T's middle tile alone at
half a pair's cost, so programs drift apart).
"""
import argparse
from collections import OrderedDict, deque

from attnscope.model import l2
from attnscope.model.tiles import Grid


class LRU:
    """An exact LRU of ``capacity`` bytes over keyed blocks: `touch` says whether the block was held."""

    def __init__(self, capacity):
        self.capacity, self.used, self.blocks = capacity, 0.0, OrderedDict()

    def touch(self, key, size):
        if key in self.blocks:
            self.blocks.move_to_end(key)
            return True
        self.blocks[key] = size
        self.used += size
        while self.used > self.capacity:
            self.used -= self.blocks.popitem(last=False)[1]
        return False


class StackDistance:
    """LRU stack distances (distinct bytes touched since a block's last use) over keyed blocks: `touch`
    returns the fraction of a re-use that misses, `l2.miss` of distance / ``capacity`` with ``ramp`` (the
    measured replacement curve instead of LRU's cliff); a first touch misses. Fenwick tree over the touch
    sequence (``touches`` at most)."""

    def __init__(self, capacity, ramp, touches):
        self.capacity, self.ramp, self.tree, self.last, self.now, self.total = \
            capacity, ramp, [0.0] * (touches + 1), {}, 0, 0.0

    def _add(self, i, v):
        i += 1
        while i < len(self.tree):
            self.tree[i] += v
            i += i & -i

    def _prefix(self, i):  # bytes at touch positions [0, i)
        r = 0.0
        while i > 0:
            r += self.tree[i]
            i -= i & -i
        return r

    def touch(self, key, size):
        m = 1.0
        if key in self.last:
            p, sz = self.last[key]
            m = l2.miss((self.total - self._prefix(p + 1)) / self.capacity, self.ramp)
            self._add(p, -sz)
            self.total -= sz
        self._add(self.now, size)
        self.total += size
        self.last[key] = (self.now, size)
        self.now += 1
        return m


def simulate(walks, order, concurrent, tile_bytes, qo_bytes, capacity, frame_bytes=0.0, ramp=None, jitter=0.0,
             seed=0):
    """Extra K/V reads, in sets, of CTAs under an ideal schedule and an LRU of ``capacity`` bytes.

    ``walks``: per set, the K/V tile indices each of its CTAs reads, in order (a list of lists);
    ``order``: the launch order as (set, CTA index) pairs; ``concurrent``: slots. Each step every running
    CTA reads its next tile; a finished CTA's slot takes the next CTA in launch order at once. Q is inserted
    when a CTA starts, O when it ends (``qo_bytes`` each). ``frame_bytes``: each CTA's spill frame, touched
    every step, at one of (1 + `L2Params.slot_reuse_lifetimes`) x ``concurrent`` warp-slot addresses, the one
    freed longest ago. ``ramp``: instead of LRU hits, each re-use misses `l2.miss` of its stack distance
    (`StackDistance`). ``jitter`` > 0: CTAs no longer step together; each reads its tiles at its own rate,
    one tile per 1 + ``jitter`` x z time units (z standard normal per CTA, ``seed``; clipped to [0.5, 1.5]),
    and the next CTA in launch order takes a slot when it frees (event order): CTA lifetimes spread by
    ``jitter``, so the waves drift out of step as they go."""
    if jitter > 0:
        if frame_bytes:
            raise ValueError("jitter: spill frames are not simulated with drifting CTAs")
        return _simulate_jittered(walks, order, concurrent, tile_bytes, qo_bytes, capacity, ramp, jitter,
                                  seed)
    slots = deque(range(int((1 + l2.H200_L2_PARAMS.slot_reuse_lifetimes) * concurrent)))
    if ramp is None:
        lru = LRU(capacity).touch

        def touch(key, size):
            return 0.0 if lru(key, size) else 1.0
    else:
        touches = sum(len(walks[s][i]) for s, i in order) * (2 if frame_bytes else 1) + 2 * len(order)
        touch = StackDistance(capacity, ramp, touches).touch
    misses = 0.0

    nxt, running = 0, []

    def start():
        nonlocal nxt
        s, i = order[nxt]
        running.append([s, i, 0, nxt, slots.popleft()])  # Q/O keyed by launch index: GQA heads share tiles
        if qo_bytes:
            touch(("q", nxt), qo_bytes)
        nxt += 1

    while nxt < len(order) and len(running) < concurrent:
        start()
    while running:
        for r in list(running):
            s, i, pos, k, slot = r
            misses += touch((s, walks[s][i][pos]), tile_bytes)
            if frame_bytes:
                touch(("f", slot), frame_bytes)
            r[2] += 1
            if r[2] == len(walks[s][i]):
                running.remove(r)
                slots.append(slot)
                if qo_bytes:
                    touch(("o", k), qo_bytes)
                if nxt < len(order):
                    start()
    tiles = sum(len({t for w in ws for t in w}) for ws in walks)
    return misses / tiles - 1.0


def _simulate_jittered(walks, order, concurrent, tile_bytes, qo_bytes, capacity, ramp, jitter, seed):
    """`simulate` with per-CTA tile rates (``jitter``): an event queue of (next tile read's time, CTA)."""
    import heapq
    import random
    rng = random.Random(seed)
    if ramp is None:
        lru = LRU(capacity).touch

        def touch(key, size):
            return 0.0 if lru(key, size) else 1.0
    else:
        touches = sum(len(walks[s][i]) for s, i in order) + 2 * len(order)
        touch = StackDistance(capacity, ramp, touches).touch
    misses, nxt, heap = 0.0, 0, []

    def start(t):
        nonlocal nxt
        s, i = order[nxt]
        step = min(1.5, max(0.5, 1.0 + jitter * rng.gauss(0.0, 1.0)))
        if qo_bytes:
            touch(("q", nxt), qo_bytes)
        heapq.heappush(heap, (t + step, nxt, s, i, 0, step))
        nxt += 1

    while nxt < len(order) and nxt < concurrent:
        start(0.0)
    while heap:
        t, k, s, i, pos, step = heapq.heappop(heap)
        misses += touch((s, walks[s][i][pos]), tile_bytes)
        if pos + 1 < len(walks[s][i]):
            heapq.heappush(heap, (t + step, k, s, i, pos + 1, step))
            continue
        if qo_bytes:
            touch(("o", k), qo_bytes)
        if nxt < len(order):
            start(t)
    tiles = sum(len({t for w in ws for t in w}) for ws in walks)
    return misses / tiles - 1.0


def attention(impl, batch, heads, n, d, causal, cap_fraction, l2_bytes=62_914_560, sms=132, dtype="fp16",
              kv_heads=None, frames=False, ramp=None, jitter=0.0, seed=0, attnscope_impl="portable"):
    """`simulate` for one attention call with ``impl``'s geometry (`l2.kernel_of`); ``kv_heads`` (GQA): query
    head h reads the K/V set of kv head h // (heads / kv_heads), in its batch. ``frames``: with the kernel's
    spill frames (`l2.Kernel.frame`, the room of lines read by one SM: `L2Params.private_weight`).
    ``attnscope_impl``: as `l2.kernel_of` ("auto": the Gluon variant model.dispatch.hopper_variant names,
    one CTA per SM over the same grid order; a persistent one is `persistent`'s, refused here)."""
    hkv = heads if kv_heads is None else kv_heads
    group = heads // hkv
    name, ker = l2.kernel_of(impl, d, causal, dtype, n, attnscope_impl)
    if ker.persistent:
        raise ValueError(f"{name}: a persistent kernel; simulate its schedule with --persistent")
    g = Grid(n, n, ker.block_q, ker.block_kv, causal=causal)
    walk = []
    for i in range(1, g.n_q_tiles + 1):
        tiles = list(range(g.kv_bounds(i)[1]))
        walk.append(tiles[::-1] if ker.backward else tiles)
    walks = [walk] * (batch * hkv)
    # program ids (query tile fastest) -> query tile: attnscope's portable kernel launches causal tiles
    # heaviest first (kernels/fwd.py: start_m = T - 1 - pid_m); FA-2 and the others lightest first
    tiles = list(range(len(walk)))[::-1] if (impl == "attnscope" and causal) else list(range(len(walk)))

    def kv_set(bb, h):
        return bb * hkv + h // group
    # (set, CTA): query tiles fastest; "bh": batch, then heads (FA-2's (m, b, h)); "hb": heads, then batch
    if ker.order == "bh":
        order = [(kv_set(bb, h), i) for h in range(heads) for bb in range(batch) for i in tiles]
    else:
        order = [(kv_set(bb, h), i) for bb in range(batch) for h in range(heads) for i in tiles]
    p = l2.H200_L2_PARAMS
    b = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    even = n % ker.block_q == 0 and n % ker.block_kv == 0
    frame = ker.threads * ker.frame[0 if even else 1] * p.private_weight() if frames else 0.0
    return simulate(walks, order, sms * ker.ctas_per_sm, 2 * ker.block_kv * d * b,
                    ker.block_q * d * b * p.qo_weight(), cap_fraction * l2_bytes, frame, ramp, jitter, seed)


def window_attention(impl, batch, heads, n, d, causal, window, cap_fraction, l2_bytes=62_914_560, sms=132,
                     dtype="fp16", kv_heads=None, ramp=None):
    """`simulate` for one sliding-window forward (``impl`` attnscope or flex) with the geometry
    `model.window_estimate.window_kernel` names; returns (K/V reads beyond one pass in sets, kernel name)."""
    from attnscope.model.tiles import bounded_window
    from attnscope.model.window_estimate import window_kernel

    hkv = heads if kv_heads is None else kv_heads
    group = heads // hkv
    win = bounded_window(causal, window)
    name, ker = window_kernel(impl, d, causal, win, batch, heads, hkv, n, sms)
    g = Grid(n, n, ker.block_q, ker.block_kv, causal=causal, window=win)
    walk = [list(range(t.first - 1, t.last)) for t in (g.kv_tiles(i) for i in range(1, g.n_q_tiles + 1))]
    walks = [walk] * (batch * hkv)
    tiles = range(len(walk))
    if ker.order == "bh":
        order = [(bb * hkv + h // group, i) for h in range(heads) for bb in range(batch) for i in tiles]
    else:
        order = [(bb * hkv + h // group, i) for bb in range(batch) for h in range(heads) for i in tiles]
    p = l2.H200_L2_PARAMS
    b = {"fp16": 2, "bf16": 2}[dtype]
    args = (sms * ker.ctas_per_sm, 2 * ker.block_kv * d * b, ker.block_q * d * b * p.qo_weight(),
            cap_fraction * l2_bytes)
    if ker.persistent and ramp is not None:  # its static schedule, not a grid's slots
        from attnscope.model.tiles import persistent_items, persistent_ramp

        pair = persistent_ramp(len(walk), ker.block_q, n, n, causal, win)
        if pair:  # a causal window's ramp in pairs (`tiles.persistent_item`): each item its tiles in turn
            items = [(s, t) for s, _ in order[::len(walk)] for it in persistent_items(len(walk), pair)
                     for t in it if t is not None]
            return window_static(walk, items, *args, ramp, per_item=[
                sum(t is not None for t in it) for _ in order[::len(walk)]
                for it in persistent_items(len(walk), pair)]), name + " (static, paired)"
        return window_static(walk, order, *args, ramp), name + " (static)"
    return simulate(walks, order, *args, ramp=ramp), name


def window_static(walk, order, programs, tile_bytes, qo_bytes, capacity, ramp, per_item=None):
    """K/V reads beyond one pass, in sets, of a persistent kernel's static schedule (kernels/fwd_hopper.py
    ``_work``: tile q of the launch ``order`` on program q % ``programs``, or with ``per_item`` (the tiles of
    each item, 1 or a pair) item q's tiles on program q % ``programs``): every program reads one K/V tile per
    step, its tiles one after another with no barrier; Q at a tile's start, O at its end (``qo_bytes``
    each); ``walk[i]``: the KV tiles query tile i loads; misses by `StackDistance` (``ramp``) of the LRU stack
    distances."""
    if per_item is None:
        queues = [deque(order[p::programs]) for p in range(programs)]
    else:
        starts = [0]
        for c in per_item:
            starts.append(starts[-1] + c)
        queues = [deque(t for q in range(p, len(per_item), programs) for t in order[starts[q]:starts[q + 1]])
                  for p in range(programs)]
    touches = sum(len(walk[i]) for _, i in order) + 2 * len(order)
    sd = StackDistance(capacity, ramp, touches)
    misses, live = 0.0, []
    for p, q in enumerate(queues):
        if q:
            s, i = q.popleft()
            sd.touch(("q", p, s, i), qo_bytes)
            live.append([p, s, i, 0])
    while live:
        for r in list(live):
            p, s, i, pos = r
            misses += sd.touch((s, walk[i][pos]), tile_bytes)
            r[3] += 1
            if r[3] == len(walk[i]):
                sd.touch(("o", p, s, i), qo_bytes)
                if queues[p]:
                    s, i = queues[p].popleft()
                    sd.touch(("q", p, s, i), qo_bytes)
                    r[1:] = [s, i, 0]
                else:
                    live.remove(r)
    tiles = len({(s, t) for s, i in order for t in walk[i]})
    return misses / tiles - 1.0


def lockstep_persistent(sets, group, num_m, programs, tile_bytes, qo_bytes, capacity, walk=None,
                        middle_alone=False, n_kv=None, ramp=None):
    """Extra K/V reads, in sets, of attnscope's persistent causal schedule (kernels/fwd_hopper.py ``_work``,
    `tiles.persistent_item`) in an LRU of ``capacity`` bytes: ``sets`` K/V sets of ``group`` query heads,
    ``num_m`` query tiles per head; item q on program q % ``programs``, heavy tile then light; every
    program reads one K/V tile per step, no barrier between rounds; Q at an item's start and O at its end
    (``qo_bytes`` each). ``walk(t)``: KV tiles query tile t loads (default t + 1: square tiles); ``n_kv``:
    KV tiles per set (default ``num_m``).
    ``middle_alone``: the schedule before 2026-12-01 (an odd num_m's middle tile alone). ``ramp``: misses by
    `StackDistance` (the measured ramp on the LRU stack distances) instead of LRU hits."""
    from attnscope.model.tiles import persistent_item
    walk = walk or (lambda t: t + 1)
    half = (num_m + 1) // 2

    def item(k):
        if middle_alone:
            return num_m - 1 - k, (k if k != num_m - 1 - k else None)
        return persistent_item(k, num_m)
    walks = [[] for _ in range(programs)]
    for q in range(sets * group * half):
        walks[q % programs] += [(q // (group * half), q, walk(t)) for t in item(q % half) if t is not None]
    if ramp is None:
        lru = LRU(capacity).touch

        def touch(key, size):
            return 0.0 if lru(key, size) else 1.0
    else:
        touch = StackDistance(capacity, ramp, sum(n + 2 for w in walks for *_, n in w)).touch
    misses = 0.0
    pos = [[0, 0] for _ in range(programs)]
    while any(i < len(walks[p]) for p, (i, _) in enumerate(pos)):
        for p in range(programs):
            i, j = pos[p]
            if i < len(walks[p]):
                s, q, n = walks[p][i]
                if j == 0:
                    touch(("q", q, i), qo_bytes)
                misses += touch((s, j), tile_bytes)
                if j + 1 == n:
                    touch(("o", q, i), qo_bytes)
                pos[p] = [i + 1, 0] if j + 1 == n else [i, j + 1]
    return misses / (sets * (n_kv or num_m)) - 1.0


def persistent(batch, heads, n, d, cap_fraction, kv_heads=None, middle_alone=False, l2_bytes=62_914_560,
               sms=132, dtype="fp16", ramp=None):
    """`lockstep_persistent` for one attention call with hopper_persist's geometry (`l2.kernel_of`)."""
    hkv = heads if kv_heads is None else kv_heads
    _, ker = l2.kernel_of("attnscope", d, True, dtype, n)
    g = Grid(n, n, ker.block_q, ker.block_kv, causal=True)
    b = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    return lockstep_persistent(batch * hkv, heads // hkv, g.n_q_tiles, sms, 2 * ker.block_kv * d * b,
                               ker.block_q * d * b * l2.H200_L2_PARAMS.qo_weight(), cap_fraction * l2_bytes,
                               lambda t: g.kv_bounds(t + 1)[1], middle_alone, g.n_kv_tiles, ramp)


def backward_walk(sets, per_set, q_tiles, step, heads, concurrent, tile_bytes, capacity, ramp, causal=True,
                  bands=None):
    """Share of the counted re-reads of attnscope's dK/dV kernel (kernels/bwd.py, kernels/bwd_hopper.py) that
    miss, under the ideal schedule: ``sets`` x ``per_set`` CTAs in grid order (key tiles fastest), C =
    ``concurrent`` slots, a finished CTA's slot taken by the next at once; CTA j walks query tiles from its
    diagonal (causal: tile int(j ``step``)) to the last of ``q_tiles``, for each of ``heads`` query heads in
    turn, one tile (``tile_bytes``: its rows and their fp32 dQ) per step. Each re-use misses `l2.miss` of its
    LRU stack distance over ``capacity`` with ``ramp`` (`StackDistance`). The check on
    `model.l2_reuse.diagonal_walk_share`. ``bands``: per key tile the query tiles [lo, hi) it walks instead (a
    sliding window's, `window_bands`): the check on `model.window_estimate.band_rereads` in the backward."""
    ctas = [(s, j) for s in range(sets) for j in range(per_set)]
    if bands is None:
        bands = [(min(q_tiles, int(j * step)) if causal else 0, q_tiles) for j in range(per_set)]
    first = [lo for lo, _ in bands]
    touches = sum(heads * (bands[j][1] - first[j]) for _, j in ctas)
    sd = StackDistance(capacity, ramp, touches + 1)
    seen, missed, counted = set(), 0.0, 0

    def walk(s, j):
        for g in range(heads):
            for m in range(first[j], bands[j][1]):
                yield (s, g, m)

    queue, live = iter(ctas), []
    while True:
        while len(live) < concurrent:
            nxt = next(queue, None)
            if nxt is None:
                break
            live.append(walk(*nxt))
        if not live:
            break
        still = []
        for it in live:
            key = next(it, None)
            if key is None:
                continue
            still.append(it)
            m = sd.touch(key, tile_bytes)
            if key in seen:
                missed += m
                counted += 1
            seen.add(key)
        live = still
    return missed / counted if counted else 0.0


def window_bands(n, q, kv, causal, window):
    """Per key tile of ``kv`` keys, the query tiles [lo, hi) (of ``q`` rows) holding a row whose window sees
    one of its keys: the forward's grid transposed, the window mirrored
    (`backward_estimate.q_rows_per_key_pass`)."""
    from attnscope.model.tiles import normalize_window

    left, right = normalize_window(causal, window)
    g = Grid(n, n, kv, q, window=(right, left))
    return [(t.first - 1, t.last) for t in (g.kv_tiles(j) for j in range(1, g.n_q_tiles + 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("batch", "heads", "n", "d"):
        ap.add_argument(name, type=int)
    ap.add_argument("--impl", default="flash", choices=(*l2.IMPLS[1:], "flex"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--kv-heads", type=int, help="K/V heads (GQA; default: heads)")
    ap.add_argument("--cap", type=float, default=l2.H200_L2_PARAMS.shared, help="L2 capacity, x the L2")
    ap.add_argument("--cliff", action="store_true", help="bisect the capacity where re-reads pass 0.5 sets")
    ap.add_argument("--frames", action="store_true", help="with the kernel's spill frames resident")
    ap.add_argument("--ramp", type=float, help="misses by the measured ramp (e.g. 1.38, the shared lines') "
                    "of the LRU stack distances instead of LRU hits")
    ap.add_argument("--persistent", action="store_true", help="attnscope's persistent causal schedule")
    ap.add_argument("--middle-alone", action="store_true",
                    help="with --persistent: the schedule before the odd-tile fix")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="relative spread (sigma) of CTA lifetimes: CTAs drift out of step (no --frames)")
    ap.add_argument("--seed", type=int, default=0, help="with --jitter: the random seed")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--backward", choices=("portable", "hopper"),
                    help="attnscope's dK/dV kernel of this build instead (`backward_walk`): the share of its "
                    "counted re-reads that miss (--ramp default: the shared lines' 1.38)")
    ap.add_argument("--atomic", action="store_true",
                    help="with --backward: dQ by fp32 atomics (its rows re-read too)")
    ap.add_argument("--window", default=None, metavar="L,R",
                    help="a sliding-window forward (--impl attnscope or flex; write --window=-1,8)")
    ap.add_argument("--attnscope-impl", default="portable", choices=("portable", "auto"),
                    help="attnscope's kernel: the portable one, or the Gluon variant `attnscope bytes` "
                    "estimates for the call (model.dispatch.hopper_variant; non-persistent ones only)")
    a = ap.parse_args()
    if a.impl == "flex" and a.window is None:
        ap.error("--impl flex: expected --window L,R too (Flex is simulated with a sliding window only), "
                 "got none")
    try:
        run(a)
    except ValueError as e:  # attnscope's InputError too: one line, exit 2
        ap.error(str(e))


def run(a) -> None:
    """The simulation ``main`` parsed (module docstring)."""
    if a.backward:
        from attnscope.model.backward_estimate import BWD_KERNELS
        from attnscope.model.traffic import DTYPE_BYTES

        ker, b, g = BWD_KERNELS[a.backward][a.d], DTYPE_BYTES[a.dtype], a.heads // (a.kv_heads or a.heads)
        tile = ker.q * (2 * a.d * b + 8 + (4 * a.d if a.atomic else 0))
        bands = None if a.window is None else \
            window_bands(a.n, ker.q, ker.kv, a.causal, tuple(int(x) for x in a.window.split(",")))
        share = backward_walk(a.batch * (a.kv_heads or a.heads), -(-a.n // ker.kv), -(-a.n // ker.q),
                              ker.kv / ker.q, g, 132, tile, a.cap * 62_914_560,
                              a.ramp or l2.H200_L2_PARAMS.shared_ramp, a.causal, bands)
        heads = f"{a.heads}/{a.kv_heads or a.heads}"
        print(f"attnscope backward {a.backward} B={a.batch} H={heads} N={a.n} d={a.d} "
              f"{'causal' if a.causal else 'unmasked'}{' atomic dQ' if a.atomic else ''}: share of the "
              f"counted re-reads that miss at {a.cap:.3f} x L2: {share:.3f}")
        return
    if a.window is not None:
        from attnscope.model.window_estimate import window_estimate

        win = tuple(int(x) for x in a.window.split(","))
        extra, name = window_attention(a.impl, a.batch, a.heads, a.n, a.d, a.causal, win, a.cap,
                                       dtype=a.dtype, kv_heads=a.kv_heads, ramp=a.ramp)
        est = window_estimate(a.impl, a.n, window=win, causal=a.causal, d=a.d, dtype=a.dtype, batch=a.batch,
                              heads=a.heads, kv_heads=a.kv_heads)
        kv_set = 2 * a.n * a.d * 2
        model = {n: b for n, b, _ in est.terms}["kv_rereads"] / (a.batch * (a.kv_heads or a.heads) * kv_set)
        print(f"{a.impl} ({name}) B={a.batch} H={a.heads}/{a.kv_heads or a.heads} N={a.n} d={a.d} "
              f"window {win}{' causal' if a.causal else ''}: K/V reads beyond one pass at {a.cap:.3f} x L2 "
              f"({'LRU' if a.ramp is None else f'ramp {a.ramp}'}): simulated {extra:.3f} sets, the window "
              f"estimate {model:.3f} sets")
        return
    if a.persistent:
        extra = persistent(a.batch, a.heads, a.n, a.d, a.cap, a.kv_heads, a.middle_alone, dtype=a.dtype,
                           ramp=a.ramp)
        print(f"attnscope persistent causal B={a.batch} H={a.heads}/{a.kv_heads or a.heads} N={a.n} d={a.d} "
              f"({'middle tile alone' if a.middle_alone else 'lockstep'}): K/V reads beyond one pass at "
              f"{a.cap:.3f} x L2 ({'LRU' if a.ramp is None else f'ramp {a.ramp}'}): {extra:.3f} sets")
        return
    args = (a.impl, a.batch, a.heads, a.n, a.d, a.causal)
    kw = {"kv_heads": a.kv_heads, "frames": a.frames, "ramp": a.ramp, "jitter": a.jitter, "seed": a.seed,
          "dtype": a.dtype, "attnscope_impl": a.attnscope_impl}
    extra = attention(*args, a.cap, **kw)
    heads = f"{a.heads}/{a.kv_heads}" if a.kv_heads else str(a.heads)
    print(f"{a.impl} B={a.batch} H={heads} N={a.n} d={a.d} {'causal' if a.causal else 'unmasked'}: "
          f"K/V reads beyond one pass at {a.cap:.3f} x L2 ({'LRU' if a.ramp is None else f'ramp {a.ramp}'}"
          f"{', frames' if a.frames else ''}, "
          f"{f'CTA lifetimes spread {a.jitter}' if a.jitter else 'ideal schedule'}): {extra:.3f} sets")
    if a.cliff:
        lo, hi = 0.0, 1.0
        for _ in range(8):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if attention(*args, mid, **kw) > 0.5 else (lo, mid)
        shared = hi / l2.H200_L2_PARAMS.shared
        print(f"  re-reads pass 0.5 sets below {hi:.3f} x L2 ({shared:.2f} x the shared capacity)")


if __name__ == "__main__":
    main()
