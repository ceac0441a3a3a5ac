"""Issue 18: FA-2 causal (flash) K/V re-reads of the ideal schedule, within / across (head, batch) pairs.

    PYTHONPATH=src python bench/l2_pair_split.py B H HKV N D [SMS L2_DIV]

An instrumented copy of bench/l2_sim.py's `simulate` (--frames --ramp 1.38, FA-2's (m, b, h) grid): each K/V
re-read is classed "pair" when the tile's previous reader is a CTA of the same (query head, batch) pair, else
"cross"; per class it prints the re-reads in K/V tiles over one set's tiles (divide by B x HKV for K/V sets),
the mean LRU stack distance over the shared capacity split into K/V, Q/O and spill-frame bytes, and for the
"pair" class the re-reads by the steps between the two reads and by distance. A development tool (a B = 2
N = 26k point: about 40 s), never on the estimate's path.
"""
import sys
from collections import defaultdict, deque

from attnscope.model import l2
from attnscope.model.tiles import Grid


class Fen:
    def __init__(s, n): s.t = [0.0] * (n + 1)
    def add(s, i, v):
        i += 1
        while i < len(s.t):
            s.t[i] += v
            i += i & -i
    def pre(s, i):
        r = 0.0
        while i > 0:
            r += s.t[i]
            i -= i & -i
        return r


def run(batch, heads, hkv, n, d=128, sms=132, l2b=62_914_560, frames=True, ramp=1.38, cap_frac=None):
    p = l2.H200_L2_PARAMS
    cap = (cap_frac or p.shared) * l2b
    group = heads // hkv
    _, ker = l2.kernel_of("flash", d, True, "fp16", n, "portable")
    g = Grid(n, n, ker.block_q, ker.block_kv, causal=True)
    T = g.n_q_tiles
    walk = [list(range(g.kv_bounds(i)[1]))[::-1] for i in range(1, T + 1)]
    order = [(bb * hkv + h // group, i) for h in range(heads) for bb in range(batch) for i in range(T)]
    even = n % ker.block_q == 0 and n % ker.block_kv == 0
    frame = ker.threads * ker.frame[0 if even else 1] * p.private_weight() if frames else 0.0
    tile = 2 * ker.block_kv * d * 2
    qo = ker.block_q * d * 2 * p.qo_weight()
    C = sms * ker.ctas_per_sm
    ntouch = sum(len(walk[i]) for _, i in order) * 2 + 2 * len(order) + 10
    fen = {k: Fen(ntouch) for k in ("kv", "qo", "f")}
    last, now = {}, [0]
    step = [0]
    hist = defaultdict(lambda: [0, 0.0, 0.0])
    lastt = {}
    tot = {"kv": 0.0, "qo": 0.0, "f": 0.0}
    stats = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0.0])  # count, misses, kv, qo, f dist sums

    def touch(key, kind, size, reader=None, cls=None):
        m = 1.0
        if key in last:
            pp, sz, kk, prev_reader = last[key]
            dist = {k: tot[k] - fen[k].pre(pp + 1) for k in fen}
            dtot = sum(dist.values())
            m = l2.miss(dtot / cap, ramp)
            fen[kk].add(pp, -sz)
            tot[kk] -= sz
            if kind == "kv":
                gapt = step[0] - lastt[key]
                same = prev_reader // T == reader // T
                st = stats["pair" if same else "cross"]
                st[0] += 1
                st[1] += m
                st[2] += dist["kv"]
                st[3] += dist["qo"]
                st[4] += dist["f"]
                st[5] += dtot
                if same:
                    hb = hist[(min(gapt, 40), round(dtot / cap, 1))]
                    hb[0] += 1
                    hb[1] += m
        fen[kind].add(now[0], size)
        tot[kind] += size
        last[key] = (now[0], size, kind, reader)
        lastt[key] = step[0]
        now[0] += 1
        return m

    slots = deque(range(int((1 + l2.H200_L2_PARAMS.slot_reuse_lifetimes) * C)))
    nxt, running = 0, []

    def start():
        nonlocal nxt
        s, i = order[nxt]
        running.append([s, i, 0, nxt, slots.popleft()])
        touch(("q", nxt), "qo", qo)
        nxt += 1
    while nxt < len(order) and len(running) < C:
        start()
    while running:
        step[0] += 1
        for r in list(running):
            s, i, pos, k, slot = r
            touch((s, walk[i][pos]), "kv", tile, k)
            if frame:
                touch(("f", slot), "f", frame)
            r[2] += 1
            if r[2] == len(walk[i]):
                running.remove(r)
                slots.append(slot)
                touch(("o", k), "qo", qo)
                if nxt < len(order):
                    start()
    nkv = g.n_kv_tiles
    sets = batch * hkv
    out = {}
    for cls, (cnt, ms, kv, q, f, dt) in stats.items():
        out[cls] = dict(n=cnt, rereads=ms / nkv, kv=kv / cnt / cap, qo=q / cnt / cap, f=f / cnt / cap,
                        d=dt / cnt / cap)
    out['hist'] = dict(hist)
    return out, dict(T=T, C=C, tile=tile, qo=qo, frame=frame, cap=cap, kvset=2 * n * d * 2, sets=sets)


if __name__ == "__main__":
    a = [int(x) for x in sys.argv[1:6]]
    kw = {}
    if len(sys.argv) > 6:
        kw = dict(sms=int(sys.argv[6]), l2b=62_914_560 // int(sys.argv[7]))
    out, geo = run(*a[:4], d=a[4], **kw)
    print(geo)
    hist = out.pop('hist')
    for k, v in out.items():
        print(k, {kk: round(vv, 4) for kk, vv in v.items()})
    bygap = defaultdict(lambda: [0, 0.0, 0.0])
    for (gp, dd), (cn, ms, _) in hist.items():
        bygap[gp][0] += cn
        bygap[gp][1] += ms
        bygap[gp][2] += dd * cn
    print('gap steps: count, misses(tiles), mean D/cap')
    for gp in sorted(bygap):
        cn, ms, dd = bygap[gp]
        print(f'  {gp:3d} {cn:9d} {ms:9.1f} {dd / cn:6.3f}')
    byd = defaultdict(lambda: [0, 0.0])
    for (_, dd), (cn, ms, _) in hist.items():
        byd[dd][0] += cn
        byd[dd][1] += ms
    print('D/cap: count, misses')
    for dd in sorted(byd):
        print(f'  {dd:4.1f} {byd[dd][0]:9d} {byd[dd][1]:9.1f}')
