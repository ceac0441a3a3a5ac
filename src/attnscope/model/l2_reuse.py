"""K/V re-read counts of the fused kernels' launch orders, for the L2-aware estimate (`attnscope.model.l2`,
whose docstring describes each pattern): waves in lockstep, causal walkers, GQA heads split by the batch,
attnscope's persistent causal schedule. Closed forms over `model.l2_params`' miss curves. Pure Python. The
probe named below (bench/l2_reuse.py) is in git at commit 5eeec86."""

from __future__ import annotations

import itertools
import math

from attnscope.errors import choice
from attnscope.model.l2_params import H200_L2_PARAMS, L2Params, mean_miss, miss
from attnscope.model.tiles import persistent_item


def wave_rereads(sets: int, per_set: int, concurrent: int, kv_bytes: float, other_bytes: float = 0.0,
                 causal: bool = False, backward: bool = False, order: str = "head", *,
                 l2_bytes: int, spread: float | None = None, share: float = 1.0, heads_per_set: int = 1,
                 distinct_sets: int | None = None, schedule: str = "dynamic",
                 group_batch: tuple[int, int] | None = None, frame_bytes: float = 0.0,
                 params: L2Params = H200_L2_PARAMS) -> float:
    """K/V read amplification of a kernel: DRAM K/V bytes / (sets x kv_bytes) (>= 1).

    ``sets`` K/V sets of ``kv_bytes`` each, every set read by ``per_set`` CTAs; ``concurrent`` CTAs run
    at once; each CTA also moves ``other_bytes`` once (its Q and O tiles). ``order`` "head": a set's CTAs
    are consecutive in launch order (attention grids); "tile": consecutive CTAs read different sets.
    ``distinct_sets``: how many different sets there are (default ``sets``; fewer where a set is counted
    once per non-adjacent group of its readers): what a window can hold is bounded by them.
    ``causal`` + ``backward``: readers of unequal length that walk the set from its end, spread over the
    longest CTA's lifetime, ``spread`` x a wave (default 2: the longest causal CTA is twice the mean);
    with the "dynamic" schedule the set stays live ``per_set / concurrent`` waves longer (its readers
    start as slots free up, C per mean lifetime), and re-reads it once per wave of that span, after the
    K/V a window of ``spread`` x C consecutive CTAs touches: W / T to W / T + 1 sets (T = ``per_set``;
    the window's newest set only as far as the diagonals of its CTAs launched so far). Where
    ``heads_per_set`` > 1 query heads read the set one after the other (FA-2's GQA grid at B = 1), the top
    tiles are re-read across each head boundary after a gap: `head_gap_rereads` (``frame_bytes``: a CTA's
    spill frame, in K/V bytes of L2 room, resident over the gap).
    ``causal`` forwards: readers that walk the set from its start, each loading ``share`` of it on
    average, ``heads_per_set`` query heads of ``per_set / heads_per_set`` readers each (GQA).
    ``group_batch`` (g, B): the sets are (query head, batch) pairs, heads outer and the batch inner, g
    consecutive heads sharing one K/V set per batch (FLASH's GQA grid): w consecutive pairs hold only
    about w / g + B different sets.
    ``schedule``: "dynamic" (the next CTA goes to the first free slot: the hardware block scheduler, or
    a persistent kernel's tile counter) or "static" (persistent program p takes items p, p + C, ...:
    bench/l2_reuse.py's kernel); it matters for causal readers only.
    """
    choice("order", order, ("head", "tile"))
    choice("schedule", schedule, ("dynamic", "static"))
    cap = params.capacity * l2_bytes
    c = max(1, concurrent)
    distinct = sets if distinct_sets is None else max(1, min(sets, distinct_sets))

    def held(w: float) -> float:  # different sets among w consecutive ones
        g_b = min(w, distinct)
        return g_b if group_batch is None else min(g_b, w / group_batch[0] + group_batch[1])
    s = (spread if spread is not None else 2.0) if (causal and backward) else 1.0
    if order == "head":
        window = held(s * c / per_set + 1.0)  # sets a window of s C consecutive CTAs spans
        # extra waves a set's readers fall into (none when every CTA runs in the first wave, in step)
        live = s
        if causal and backward and schedule == "dynamic":
            # the block scheduler starts a set's readers as slots free up: C per mean CTA lifetime, so
            # they start over per_set / C lifetimes, and the set stays live that much longer than its
            # longest CTA (FA-2 at N = 32k: 256 readers, 264 slots, 2 + 0.97 lifetimes)
            live = s + per_set / c
        passes = min(live * (per_set - 1) / c, max(0.0, live * sets * per_set / c - 1.0))
    else:
        window = min(distinct, s * c)
        # sets > C: each reader is in another wave; else a wave reads every set once
        passes = per_set - 1 if sets > s * c else max(0.0, per_set * sets / c - 1)
    work = window * kv_bytes + min(c, sets * per_set) * other_bytes  # Q, O: the resident CTAs'
    gap = 0.0
    if causal and backward and schedule == "dynamic" and order == "head" and heads_per_set > 1:
        gap = head_gap_rereads(per_set / heads_per_set, c, kv_bytes, other_bytes, frame_bytes, s,
                               cap, params.ramp) * (heads_per_set - 1)
    if causal and schedule == "static" and order == "head":
        # bench/l2_reuse.py C: readers of one set are one diagonal step (kv / per_set bytes of their walk)
        # apart, so C such steps of the whole machine come between two readers' visits of a tile: backward
        # walkers always, forward ones from the second round on (the first round starts in step, and its
        # readers, still running, insert one tile per set, not per reader).
        rereads = max(0.0, per_set * share - 1.0)
        late = 1.0 if backward else max(0.0, 1.0 - c / (sets * per_set))
        return 1.0 + late * rereads * miss(min(late * c * kv_bytes / per_set, work) / cap, params.ramp)
    if causal and not backward and order == "head":
        # Forward walkers (bench/l2_reuse.py C): readers that start together read each tile in step (one
        # DRAM read); CTAs launched as slots free start one launch interval (mean CTA / C) apart, in which
        # the machine inserts about one CTA's K/V (share x kv) and Q/O: the reuse distance of a re-read by
        # the next reader, never more than the window holds. Where a kv set's next query head starts, its
        # first reader of tile t comes ~t/r launches after the last one: half a head's CTAs on average.
        heads = max(1, heads_per_set)
        per_head = per_set / heads
        near = min(share * kv_bytes + other_bytes, work)
        far = min(per_head / 2 * (share * kv_bytes + other_bytes), work)
        rereads_near = max(0.0, per_set * share - 1.0 - (heads - 1) * share)
        return 1.0 + rereads_near * miss(near / cap, params.ramp) + \
            (heads - 1) * share * miss(far / cap, params.ramp)
    if order == "head" and not causal:
        other = min(c, sets * per_set) * other_bytes
        return 1.0 + lockstep_rereads(sets, per_set, c, kv_bytes, other, cap, params.ramp, held)
    if order == "head" and window > 1.0:
        # (only causal backward walkers under the dynamic schedule get here: FA-2) the K/V bytes a window
        # of W = s C consecutive CTAs touches: it starts at offset o (uniform in [0, T)) of a set whose CTAs
        # o .. T - 1 in it are the heavy ones, which read all of it, and ends in a set whose CTAs 0 .. k - 1
        # launched so far read only its tiles 0 .. k - 1 (a causal CTA reads the tiles up to its diagonal,
        # and the grid launches a set's query tiles in order): (o + W) / T sets, uniform over
        # [W / T, W / T + 1], half a set fewer than the W / T + 1 sets it spans
        w = s * c / per_set
        lo, hi = max(kv_bytes, held(w) * kv_bytes), max(kv_bytes, held(w + 1.0) * kv_bytes)
        other = work - window * kv_bytes
        return 1.0 + passes * mean_miss((lo + other) / cap, (hi + other) / cap, params.ramp) + gap
    return 1.0 + passes * miss(work / cap, params.ramp) + gap


def head_gap_rereads(per_head: float, c: int, kv_bytes: float, qo_bytes: float, frame_bytes: float,
                     spread: float, cap: float, ramp: float, batch: int = 1) -> float:
    """K/V re-reads, in sets, where the next query head of a K/V set starts (FA-2's backward walkers, the
    set's query heads consecutive in launch order): the heads' CTAs launch lightest first, one launch
    interval (a mean lifetime / ``c``) apart, each walking from its diagonal down. Tile x (a fraction of the
    set) is read last in a head by its heaviest CTA, (1 - x) of the longest walk (``spread`` x the mean)
    after it starts, and first in the next head by that head's CTA x T, x T launches later: after
    G(x) = x T - spread c (1 - x) launches, a gap for the top x > spread c / (T + spread c) only (T =
    ``per_head``). Meanwhile the machine touches the tiles below x, G Q and O tiles (``qo_bytes`` per CTA)
    and the spill frames of the CTAs live then (``frame_bytes`` each; the c running ones and the G started,
    at most the (1 + s) c warp slots the frames cycle through, s = `L2Params.slot_reuse_lifetimes`):
    D(x) = x kv + G qo + min(c + G, (1 + s) c) frame. Each such tile misses with `miss` (D / ``cap``,
    ``ramp``); D is piecewise linear, so the mean is exact (`mean_miss` per piece). Checked against the exact
    LRU stack distances of the ideal schedule (bench/l2_sim.py --frames).

    ``batch`` B > 1 (FA-2's (m, b, h) grid: the batch between a group's heads): the next head of the set
    starts (B - 1) T launches later, G(x) = (B - 1) T + x T - spread c (1 - x), and the B - 1 pairs (head,
    batch) of the other batches' sets come between. Pair q (q T launches after the set's, q = 1 .. B - 1)
    reads its tile y from q T + y T (its CTA y T's diagonal) to (q + 1) T + spread c (1 - y) (its heaviest
    CTA): inside the gap for y < x + q u, u = T / (spread c); the pair of the same batch one head earlier
    (q - B) only for y < x - (B - q) u, within that. So the gap also touches min(1, x + q u) of each other
    batch's set: D(x) gains the sum of those over q, piecewise linear with knots at x = 1 - q u (checked
    against the exact LRU of the ideal schedule, bench/l2_sim.py --frames)."""
    t, sc = per_head, spread * c
    lead = (batch - 1) * t  # launches from the set's pair to its next head's, less one pair
    slots = H200_L2_PARAMS.slot_reuse_lifetimes * c  # G past which the frames cycle through every warp slot
    u = t / sc

    def gap(x):
        return max(0.0, lead + x * t - sc * (1.0 - x))

    def dist(x):
        others = sum(min(1.0, x + q * u) for q in range(1, batch))
        return (x + others) * kv_bytes + gap(x) * qo_bytes + min(c + gap(x), c + slots) * frame_bytes
    x0 = max(0.0, (sc - lead) / (t + sc))  # where G = 0
    xk = (slots + sc - lead) / (t + sc)  # where G = slots
    inner = [xk] + [1.0 - q * u for q in range(1, batch)]
    knots = [x0] + sorted(k for k in inner if x0 < k < 1.0) + [1.0]
    return sum((b - a) * mean_miss(dist(a) / cap, dist(b) / cap, ramp) for a, b in itertools.pairwise(knots))


def launch_fill_share(waves: float, w0: float = H200_L2_PARAMS.launch_fill_waves) -> float:
    """Share of the steady-state K/V re-reads a launch of ``waves`` waves of causal backward walkers (FA-2)
    makes: a re-read's reuse distance cannot exceed what the kernel touched since it started, and ncu starts
    each measured kernel from an empty L2, so the first wave's re-reads see less than the steady window
    (`wave_rereads`) and mostly hit. The miss share ramps as 1 - exp(-w / ``w0``) over the launch's waves w;
    its mean over W waves is 1 - (w0 / W) (1 - exp(-W / w0)).

    bench/grids/heads_probe.csv (FA-2 causal MHA, d 128, B = 1, the head count alone scaling the waves)
    measured the re-reads per K/V set growing with the waves and levelling off by about ten; ``w0``:
    `L2Params.launch_fill_waves`."""
    if waves <= 0:
        return 0.0
    return 1.0 - w0 / waves * (1.0 - math.exp(-waves / w0))


#: Samples of `paired_rereads`'s round pairs past which it stops summing every one (its cost bound)
PAIRED_ROUNDS = 128


def paired_rereads(sets: int, group: int, num_m: int, n_kv: int, c: int, tile_bytes: float, qo_bytes: float,
                   cap: float, walk, ramp: float = 1.0) -> float:
    """K/V reads beyond one pass, in sets, of attnscope's persistent causal schedule (kernels/fwd_hopper.py
    ``_work``, `tiles.persistent_item`): ``c`` programs take the items (pairs of query tiles) of
    ``sets`` K/V sets, ``group`` query heads of ``(num_m + 1) // 2`` items each per set, head-major, in
    rounds of ``c``; each runs its heavy tile then its light one, and every item loads the same number of
    KV tiles (``walk(t)``: KV tiles query tile t loads), so round pairs run in lockstep. Per round pair and
    set, with items k in [a, b]: the heavy walkers read tile j together at step j (one read; tiles
    0 .. walk(heavy(a)) - 1); the light readers re-read tiles 0 .. walk(light(b)) - 1, the first of them
    after walk(heavy(b)) steps; a set continued from the last round pair re-reads tile j after
    max(a', j) + 1 steps where the last pair's light readers read it last, else after a whole round pair.
    Steps become bytes at the round pair's insertion rate: every K/V tile its walks touch (heavy walks and
    light re-reads) and its programs' Q and O (``qo_bytes`` per item); bytes over ``cap`` become misses
    through `miss` with ``ramp`` (the shared K/V lines' measured ramp, `L2Params`). Counting the light
    re-reads as insertions overstates the distinct lines of an ideal LRU (which re-reads less than the
    H200); it matches the development points at an even ``num_m``. With ``ramp`` 1 (a sharp LRU cliff) and
    MHA it tracks an exact-LRU simulation of the schedule (tests/test_model_l2.py). Past `PAIRED_ROUNDS` the
    inner ones are sampled evenly, so the cost is bounded and independent of N."""
    half = (num_m + 1) // 2
    per_set = group * half
    n_work = sets * per_set
    rounds = -(-n_work // c)
    length = walk(num_m - 1) + (walk(0) if num_m % 2 == 0 else 0)  # KV tiles of every item

    def cover(r, s):  # set s in round pair r: (a, heavy tiles, first light start, light tiles, items)
        q0, q1 = max(s * per_set, r * c), min((s + 1) * per_set, (r + 1) * c, n_work)
        if q0 >= q1:
            return None
        lo, hi = q0 - s * per_set, q1 - 1 - s * per_set
        a, b = (0, half - 1) if hi // half > lo // half else (lo % half, hi % half)
        w = walk(max(persistent_item(a, num_m)[0], persistent_item(b, num_m)[0]))
        kl = next((k for k in (b, b - 1) if k >= a and persistent_item(k, num_m)[1] is not None), None)
        if kl is None:
            return a, w, 0, 0, q1 - q0
        heavy, light = persistent_item(kl, num_m)
        return a, w, walk(heavy), walk(light), q1 - q0

    def round_pair(r):  # {set: cover}, insertion rate (bytes per step)
        if not 0 <= r < rounds:
            return {}, 0.0
        found = (cover(r, s) for s in range((r * c) // per_set, min(sets, -(-(r + 1) * c // per_set))))
        info = {(r * c) // per_set + i: v for i, v in enumerate(found)}
        info = {s: v for s, v in info.items() if v is not None}
        walked = sum(v[1] + v[3] for v in info.values())  # the heavy walks and the light re-reads
        return info, (walked * tile_bytes + 2 * sum(v[4] for v in info.values()) * qo_bytes) / length

    def over(steps, rate):
        return miss(steps * rate / cap, ramp)

    def extra(r):  # K/V tiles re-read in round pair r
        info, rate = round_pair(r)
        prev, prate = round_pair(r - 1)
        x = 0.0
        for s, (_, w, delay, n_light, _) in info.items():
            x += n_light * over(delay, rate)
            if s in prev:
                pa, _, _, p_light, _ = prev[s]
                rr = (rate + prate) / 2
                near = min(w, p_light)  # last read by the light readers: after max(pa, j) + 1 steps
                j1 = min(pa, near)
                x += j1 * over(pa + 1, rr)
                if near > j1:  # j in [j1, near): (j + 1) steps
                    x += (near - j1) * mean_miss((j1 + 1) * rr / cap, near * rr / cap, ramp)
                x += max(0, w - p_light) * over(length, rr)  # last read by the heavy walkers
        return x

    if rounds <= PAIRED_ROUNDS + 2:
        total = sum(extra(r) for r in range(rounds))
    else:
        inner = (1 + (i * (rounds - 2)) // PAIRED_ROUNDS for i in range(PAIRED_ROUNDS))
        total = extra(0) + extra(rounds - 1) + sum(extra(r) for r in inner) * (rounds - 2) / PAIRED_ROUNDS
    return total / (sets * n_kv)


def wave_pairs(c: int, per_set: int) -> tuple:
    """(a, b, probability): the K/V sets in the two waves of C = ``c`` CTAs either side of a wave boundary
    that cuts a set of ``per_set`` (T) CTAs, consecutive in launch order. Boundaries fall at CTAs w C, so
    their offsets in a set are the multiples of g = gcd(C, T) below T, each as often over T / g waves;
    offset 0 (a boundary between two sets: no set is cut) has the remaining probability. With C = q T + r,
    a boundary at offset o follows a wave over q + 2 sets when o < r (else q + 1) and precedes one over
    q + 1 sets when o <= T - r (else q + 2). Closed form: four counts of lattice points."""
    t = max(1, int(per_set))
    c = max(1, int(c))
    g = math.gcd(c, t)
    n = t // g  # offsets 0, g, ..., T - g, one per T / g consecutive boundaries
    q, r = divmod(c, t)
    rg = r // g
    a_hi = max(0, rg - 1)  # offsets k g, k = 1 .. n - 1, with k g < r
    b_lo = min(n - 1, n - rg)  # ... with k g <= T - r
    both = max(0, min(a_hi, b_lo))
    counts = {(q + 2, q + 1): both, (q + 2, q + 2): a_hi - both, (q + 1, q + 1): b_lo - both,
              (q + 1, q + 2): (n - 1) - a_hi - b_lo + both}
    return tuple((a, b, k / n) for (a, b), k in counts.items() if k > 0)


def batch_gap_rereads(batch: int, group: int, kv_heads: int, per_set: int, c: int, kv_bytes: float,
                      wave_other: float, cap: float, ramp: float) -> float:
    """Share of a K/V set fetched again, per later query head of a GQA group, where the batch comes between
    a group's heads in launch order (FA-2's (m, b, h) grid at B > 1) and the CTAs run in lockstep waves of
    ``c``: the last CTA of pair (head h, batch b) and the first of (h + 1, b) are D = (B - 1) T + 1 launches
    apart (T = ``per_set``), so k = floor(D / c) or that + 1 wave boundaries fall between them (the latter
    with probability frac(D / c), the pair ends spread evenly over a wave). k = 0: both read the set in the
    same wave, in step: no re-read. k >= 1: tile x is re-read after the rest (1 - x) of the sets of the
    earlier wave, the k - 1 waves between and the first x of the later wave's sets, about k c / T + 1 pairs
    (their different sets: at most B kv sets, fewer where a window ends within a group, as `wave_rereads`'s
    ``group_batch``), spread one set wide, plus the Q and O of k waves (``wave_other`` each, as
    `lockstep_rereads`; checked against the exact LRU of the ideal schedule, bench/l2_sim.py)."""
    t = max(1, int(per_set))
    gap = (batch - 1) * t + 1
    k0, f = divmod(gap / max(1, c), 1.0)

    def held(w):  # different kv sets among w consecutive (head, batch) pairs
        return min(w, batch * kv_heads, w / group + batch)

    def reread(k):
        if k < 1:
            return 0.0
        w = k * c / t + 1.0
        lo, hi = max(1.0, held(w - 0.5)) * kv_bytes, held(w + 0.5) * kv_bytes
        return mean_miss((lo + k * wave_other) / cap, (hi + k * wave_other) / cap, ramp)
    return (1.0 - f) * reread(int(k0)) + f * reread(int(k0) + 1)


def lockstep_rereads(sets: int, per_set: int, c: int, kv_bytes: float, other: float, cap: float, ramp: float,
                     held) -> float:
    """Extra K/V reads per set (in sets) of equal-length CTAs that run in waves of ``c``: the one set that
    straddles a wave boundary is read again by the next wave; its tile at fraction x of the walk is
    re-read after the rest (1 - x) of the a sets of the earlier wave and the first x of the b sets of the
    later one: a reuse distance uniform between a and b sets (plus the resident CTAs' Q/O, ``other``).
    `wave_pairs` gives (a, b) and how often a boundary cuts no set."""
    waves = math.ceil(sets * per_set / c)
    if waves <= 1:
        return 0.0
    pairs = wave_pairs(c, per_set)
    cut = sum(pr for *_, pr in pairs)  # share of the offsets that cut a set: all but 1 in T / gcd(C, T)
    if cut <= 0:
        return 0.0
    # boundaries w C (w = 1 .. waves - 1) between two sets: every (T / gcd(C, T))-th one
    period = int(per_set) // math.gcd(int(c), int(per_set))
    events = (waves - 1) - (waves - 1) // period
    m = 0.0
    for a, b, pr in pairs:
        a, b = held(a), held(b)
        m += pr / cut * mean_miss((a * kv_bytes + other) / cap, (b * kv_bytes + other) / cap, ramp)
    return events / sets * m


# --- the estimate --------------------------------------------------------------------------------------


#: Samples per axis (reader, row; heads past it) of `diagonal_walk_share`'s mean (its cost bound).
WALK_SAMPLES = 8


def _band(t: float, window: float, heads: int, m: int, r: float, per_set: int) -> float:
    """Query tiles of one set the live walkers of `diagonal_walk_share` touch in ``window`` steps from step
    ``t`` (all the set's CTAs started at 0): in head h the CTAs whose per-head walk L is in (t / (h + 1),
    t / h] sit (h + 1) r tiles apart at the head's last t / h tiles, so for (h + 1) r <= ``window`` their
    sweeps join into one band (its span and one sweep), else each sweeps ``window`` tiles of its own; at
    most the head's ``m`` tiles."""
    l_min, tiles = max(m - r * (per_set - 1), 1e-9), 0.0
    for h in range(heads):
        lo, hi = max(l_min, t / (h + 1)), (min(m, t / h) if h else m)
        if hi <= lo:
            continue
        n = (hi - lo) / r  # CTAs in head h
        tiles += min(m, (h + 1) * r * n + window if (h + 1) * r <= window else n * window)
    return tiles


def diagonal_walk_share(sets: int, per_set: int, q_tiles: int, step: float, heads: int, concurrent: int,
                        tile_bytes: float, cap: float, ramp: float, samples: int = WALK_SAMPLES) -> float:
    """Share of the re-reads of a causal dK/dV kernel whose CTAs walk from their diagonal forward (attnscope's
    kernels/bwd.py and kernels/bwd_hopper.py, not FA-2's walk from the end, `wave_rereads`) that miss an L2
    of ``cap`` bytes (`l2_params.miss` with ``ramp``). A set's ``per_set`` (J) CTAs, one per key tile,
    each walk the ``q_tiles`` (M) query tiles from their diagonal (CTA j from tile r j, r = ``step`` = BN /
    BM) for each of ``heads`` (G) query heads in turn, one tile per step, each step touching
    ``tile_bytes`` of room (its Q, dO, LSE2, Delta rows and, atomic dQ, their fp32 dQ rows). Row m of head
    g is read by CTA j + 1, then (g + 1) r steps later by CTA j: successive readers drift apart by a
    head's walk each head, so the reuse distance is the band the live walkers sweep meanwhile, not a wave of
    sets. Sets starting together (sets x J <= C): the set's band (`_band`) x min(sets, C / J) at the
    reader's step. Staggered (the block scheduler starts the next set's CTAs as slots free, one per mean
    lifetime / C): CTA j + 1 starts kappa = G J f / C heads' walk after j (f the mean walk over M), so the
    readers are |g + 1 - kappa| r steps apart, and each of the C live CTAs (uniform over heads) adds r min(
    |h + 1 - kappa|, |g + 1 - kappa|) tiles; the larger of the two. Mean over the re-reads (readers and rows
    sampled ``samples`` each, at most ``samples`` heads): bounded cost, independent of N. The ideal
    schedule's exact LRU stack distances (bench/l2_sim.py --backward) are its check."""
    j_n, m, r, g_n = per_set, q_tiles, step, heads
    if j_n < 2 or m < 2:
        return 0.0
    k = min(sets, concurrent / j_n)
    walking = min(j_n, math.ceil(m / r))  # CTAs whose diagonal is inside the query tiles
    f = (walking * m - r * walking * (walking - 1) / 2) / (j_n * m)  # mean walk per head, over M
    kappa = g_n * j_n * f / concurrent if sets * j_n > concurrent else 0.0
    hs = range(g_n) if g_n <= samples else [int((i + 0.5) * g_n / samples) for i in range(samples)]
    total = missed = 0.0
    for g in hs:
        window = (g + 1) * r
        spread = abs(g + 1 - kappa)
        staggered = (concurrent * r / g_n * sum(max(min(abs(h + 1 - kappa), spread), 1.0 / r)
                                               for h in range(g_n)) if kappa else 0.0)
        for a in range(samples):
            j = (a + 0.5) * (j_n - 1) / samples  # reader j, after reader j + 1
            first = r * (j + 1)  # rows from here are read by both
            if first >= m:
                continue
            w = m - first  # re-reads of reader j in head g
            for i in range(samples):
                row = first + (i + 0.5) * w / samples
                t0 = g * m + row - (g + 1) * r * (j + 1)  # reader j + 1's step at the row
                dist = max(_band(t0, window, g_n, m, r, j_n) * k, staggered) * tile_bytes
                total += w
                missed += w * miss(dist / cap, ramp)
    return missed / total if total else 0.0
