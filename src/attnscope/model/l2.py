"""An L2-aware estimate of the DRAM bytes an attention call moves (what ``ncu`` measures; spec §6).

The logical model (model/traffic.py) assumes a cold cache. The GPU's L2 (50-60 MB on H100/H200) serves
a read when the bytes touched since the data was last touched (its reuse distance) fit. Two reuses
decide attention: producer -> consumer (naive: GEMM 1 writes S, the softmax reads it back, GEMM 2
reads P) and K/V re-reads (fused kernels: every query tile of a head re-reads that head's K and V).

Method: replay the call's accesses in launch order against a cache, in chunks (a fraction of the cache,
never finer than one tile); a read miss is a DRAM read. The cache (each fact read off the H200
recordings in tests/data/measure/recorded/, BENCHMARKS.md "attnscope bytes"):

- write-back, write-allocate: a write reaches DRAM only when its dirty line is evicted; lines still
  dirty at the end are not counted by ncu (``writes="through"`` kept for comparison);
- half the L2 per copy of the data (``l2_fraction=0.5``): the L2 is two partitions that duplicate
  lines used by SMs on both sides;
- random replacement of a resident chunk (``policy="random"``, seeded: deterministic), not LRU
  (``policy="lru"`` kept for comparison);
- fused kernels run in waves of resident CTAs (SMs x CTAs per SM; grid ``(T_r, B*H)``, query tile
  fastest), so a wave's CTAs of one head read each K/V chunk once between them.

Pure Python, no GPU: `attnscope bytes --estimate-only`. The call starts with clean lines (as
measure/ncu.py arranges). Simplifications and the grid points it misses: BENCHMARKS.md.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from attnscope.errors import choice, expect, positive_int
from attnscope.model import traffic as _traffic
from attnscope.model.tiles import Grid, cdiv

IMPLS = ("naive", "flash", "cudnn", "efficient", "attnscope")

#: Tiles (B_r, B_c) and resident CTAs per SM assumed per implementation (fp16/bf16, d <= 128, SM90).
#: They set only the wave structure (how many heads' K/V are live at once) and the ragged tiles; the
#: estimate is insensitive to them while a wave's K/V fits in L2.
#: flash: PyTorch's FlashAttention-2 fwd kernel traits for d = 128 (Flash_fwd_kernel_traits<128, 128, 64,
#: 4>, recorded); efficient: CUTLASS mem-eff 64 queries x 128 keys (fmha_cutlassF_f16_aligned_64x128,
#: recorded);
#: cudnn: its SM90 fprop kernels use 128-row tiles; attnscope: kernels/fwd.py's d = 128 config
#: (BLOCK_M 128, BLOCK_N 64, 4 warps, ~96 KiB of shared memory: two CTAs share an SM).
_TILES = {"flash": (128, 64, 2), "efficient": (64, 128, 2), "cudnn": (128, 128, 1), "attnscope": (128, 64, 2)}
#: Implementations that write the FP32 logsumexp in an inference forward (PyTorch's flash always does).
_WRITES_LSE = {"flash": True, "efficient": False, "cudnn": False, "attnscope": False}
STAT_BYTES = _traffic.STAT_BYTES
#: Column bands P is cut into for GEMM 2's read order (see `_naive`).
BANDS = 16


@dataclass
class KernelEstimate:
    """One kernel of the call: logical bytes (cold cache) and the L2-aware DRAM estimate, whole call."""

    name: str
    logical_read: int = 0
    logical_write: int = 0
    read: int = 0
    write: int = 0

    @property
    def total(self) -> int:
        return self.read + self.write

    @property
    def logical_total(self) -> int:
        return self.logical_read + self.logical_write

    def to_json(self) -> dict:
        return {"kernel": self.name, "logical_read": self.logical_read, "logical_write": self.logical_write,
                "read": self.read, "write": self.write, "total": self.total}


@dataclass
class Estimate:
    """The estimate for one call (bytes for the whole call; ``per_head`` divides by batch x heads)."""

    impl: str
    params: dict
    kernels: list[KernelEstimate] = field(default_factory=list)

    @property
    def read(self) -> int:
        return sum(k.read for k in self.kernels)

    @property
    def write(self) -> int:
        return sum(k.write for k in self.kernels)

    @property
    def total(self) -> int:
        return self.read + self.write

    @property
    def logical_total(self) -> int:
        return sum(k.logical_total for k in self.kernels)

    @property
    def batch_heads(self) -> int:
        return self.params["batch"] * self.params["heads"]

    def per_head(self, nbytes: int) -> float:
        return nbytes / self.batch_heads

    def to_json(self) -> dict:
        return {"impl": self.impl, "params": self.params, "read": self.read, "write": self.write,
                "total": self.total, "logical_total": self.logical_total,
                "kernels": [k.to_json() for k in self.kernels]}


class _Cache:
    """A cache of ``capacity`` bytes holding variable-size chunks; counts DRAM bytes per kernel.

    ``policy``: "random" evicts a uniformly chosen resident chunk (seeded: the estimate is
    deterministic), "lru" the least recently used one.
    """

    def __init__(self, capacity: int, writes: str, policy: str = "random", seed: int = 0):
        import random

        self.capacity = capacity
        self.writes = writes
        self.policy = policy
        self.rng = random.Random(seed)
        self.used = 0
        self.lines: OrderedDict = OrderedDict()  # key -> [size, dirty, slot]
        self.keys: list = []  # resident keys, for a uniform random choice (swap-remove)
        self.k: KernelEstimate | None = None  # the kernel DRAM bytes are charged to

    def _evict(self) -> None:
        if self.policy == "lru":
            key, line = next(iter(self.lines.items()))
        else:
            key = self.keys[self.rng.randrange(len(self.keys))]
            line = self.lines[key]
        del self.lines[key]
        last = self.keys.pop()
        if last != key:  # move the last key into the evicted one's slot
            self.keys[line[2]] = last
            self.lines[last][2] = line[2]
        self.used -= line[0]
        if line[1] and self.writes == "back":
            self.k.write += line[0]

    def touch(self, key, size: int, write: bool) -> None:
        k = self.k
        if write:
            k.logical_write += size
        else:
            k.logical_read += size
        line = self.lines.get(key)
        if line is not None:
            self.lines.move_to_end(key)
            line[1] = line[1] or write
        else:
            if not write:
                k.read += size  # a read miss comes from DRAM; a write allocates without reading
            while self.used + size > self.capacity and self.lines:
                self._evict()
            self.lines[key] = [size, write, len(self.keys)]
            self.keys.append(key)
            self.used += size
        if write and self.writes == "through":
            k.write += size


def _chunks(total_rows: int, rows_per_chunk: int, row_bytes: int):
    """(index, bytes) of each chunk of a [total_rows, *] tensor cut every ``rows_per_chunk`` rows."""
    for c in range(cdiv(total_rows, rows_per_chunk)):
        rows = min(rows_per_chunk, total_rows - c * rows_per_chunk)
        yield c, rows * row_bytes


def _naive(cache: _Cache, est: Estimate, nq: int, nk: int, d: int, b: int, bh: int, causal: bool, chunk: int):
    """GEMM 1 (S = QK^T), [masked_fill], softmax, GEMM 2 (O = PV); each batched over (batch, head) in
    order. Mirrors `measure.backends.naive_attention`. S is written and read row block by row block; GEMM 2
    reads P one column band at a time across all rows, because its output O is [nq, d]: its few tiles'
    CTAs (128 of them at one head, N = 4,096..16,384, in the H200 recordings) are all resident at once
    and march along the K dimension together."""
    s_rows = max(1, chunk // (nk * b))  # rows of S per chunk
    qd_rows = max(1, chunk // (d * b))  # rows of Q/K/V/O per chunk
    band = cdiv(nk, min(BANDS, nk))  # columns of P per band
    n_bands = cdiv(nk, band)
    p_rows = s_rows * n_bands  # rows of a block of P: its pieces (one per band) are about a chunk each
    s_in = "S"

    def kernel(name):
        k = KernelEstimate(name)
        est.kernels.append(k)
        cache.k = k

    kernel("GEMM (QK^T)")
    for h in range(bh):
        for c, sz in _chunks(nq, qd_rows, d * b):
            cache.touch(("Q", h, c), sz, False)
        for c, sz in _chunks(nk, qd_rows, d * b):
            cache.touch(("K", h, c), sz, False)
        for c, sz in _chunks(nq, s_rows, nk * b):
            cache.touch(("S", h, c), sz, True)
    if causal:
        kernel("masked_fill")
        for h in range(bh):
            for c, sz in _chunks(nq, s_rows, nk * b):
                cache.touch(("S", h, c), sz, False)
                cache.touch(("mask", c), sz // b, False)  # the same rows of the bool mask, 1 B each
                cache.touch(("S'", h, c), sz, True)
        s_in = "S'"
    kernel("softmax")
    s_chunks = list(_chunks(nq, s_rows, nk * b))
    for h in range(bh):
        for c, sz in _chunks(nq, p_rows, nk * b):  # a block of n_bands chunks of S's rows
            for cs, s_sz in s_chunks[c * n_bands:(c + 1) * n_bands]:
                cache.touch((s_in, h, cs), s_sz, False)
            for j in range(n_bands):  # P in column bands, as GEMM 2 reads it
                c0, c1 = j * band, min(nk, (j + 1) * band)
                cache.touch(("P", h, c, j), sz * (c1 - c0) // nk, True)
    kernel("GEMM (PV)")
    # O = P V is [nq, d]: its few output tiles' CTAs run at once and march along the K dimension
    # together, so P is read one column band at a time across all its rows (with V's rows of that band)
    for h in range(bh):
        for j in range(n_bands):
            c0, c1 = j * band, min(nk, (j + 1) * band)
            cache.touch(("V", h, j), (c1 - c0) * d * b, False)
            for c, sz in _chunks(nq, p_rows, nk * b):
                cache.touch(("P", h, c, j), sz * (c1 - c0) // nk, False)
        for c, sz in _chunks(nq, qd_rows, d * b):
            cache.touch(("O", h, c), sz, True)


def _fused(cache: _Cache, est: Estimate, impl: str, nq: int, nk: int, d: int, b: int, bh: int, causal: bool,
           chunk: int, concurrent: int, block_q: int, block_kv: int):
    """One fused kernel, CTAs (query tile fastest, then batch-head) run in waves of ``concurrent``."""
    k = KernelEstimate(f"{impl} forward (fused)")
    est.kernels.append(k)
    cache.k = k
    g = Grid(nq, nk, block_q, block_kv, causal=causal)
    kv_rows = block_kv * max(1, chunk // (block_kv * d * b))  # K/V rows per chunk, whole tiles
    ctas = [(h, i) for h in range(bh) for i in range(1, g.n_q_tiles + 1)]
    lse = _WRITES_LSE[impl]
    for w in range(0, len(ctas), concurrent):
        wave = ctas[w:w + concurrent]
        need: dict[int, int] = {}  # head -> K/V rows the wave's CTAs of that head load (the most of any)
        for h, i in wave:
            r0, r1 = g.rows(i)
            cache.touch(("Q", h, i), (r1 - r0 + 1) * d * b, False)
            need[h] = max(need.get(h, 0), g.kv_rows_loaded(i))
        for j in range(cdiv(max(need.values()), kv_rows)):
            for h, rows in need.items():
                if j * kv_rows < rows:
                    sz = (min((j + 1) * kv_rows, nk) - j * kv_rows) * d * b
                    cache.touch(("K", h, j), sz, False)
                    cache.touch(("V", h, j), sz, False)
        for h, i in wave:
            r0, r1 = g.rows(i)
            cache.touch(("O", h, i), (r1 - r0 + 1) * d * b, True)
            if lse:
                cache.touch(("LSE", h, i), (r1 - r0 + 1) * STAT_BYTES, True)


def device_facts(device: str = "h200") -> tuple[int, int]:
    """(L2 bytes, SMs) of a device from model/roofline.py, the one table of device facts."""
    from attnscope.model.roofline import device as _device

    dev = _device(device)
    return dev.l2, dev.sms


def estimate(impl: str, n: int = 4096, d: int = 128, heads: int = 32, batch: int = 1, dtype: str = "fp16",
             causal: bool = False, *, l2_bytes: int | None = None, sms: int | None = None,
             device: str = "h200", ctas_per_sm: int | None = None, writes: str = "back",
             policy: str = "random", l2_fraction: float = 0.5, chunks_per_l2: int = 256) -> Estimate:
    """L2-aware estimate of the DRAM bytes of one attention call (whole call; see the module docstring).

    Parameters
    ----------
    impl: naive (the explicit 3-kernel baseline; causal adds a masked_fill kernel), flash, cudnn,
        efficient or attnscope (fused).
    n, d, heads, batch, dtype, causal: the call, inputs ``[batch, heads, n, d]`` (4096, 128, 32, 1, fp16).
    l2_bytes, sms: the device's L2 capacity and SM count; default to ``device``'s entry in
        model/roofline.py (pass the values read from the running GPU where there is one).
    ctas_per_sm: resident CTAs per SM of a fused kernel (defaults per implementation).
    writes: "back" (only dirty lines evicted during the call reach DRAM; the hardware's behaviour) or
        "through" (every write reaches DRAM once).
    policy: "random" (default: a uniformly chosen resident chunk, seeded, so deterministic) or "lru".
    l2_fraction: the share of the L2 one copy of the data can use (0.5: two partitions, see above).
    chunks_per_l2: granularity of the replay: the cache holds this many chunks.

    Returns
    -------
    Estimate: ``.total`` bytes for the call, ``.per_head(.total)``, per-kernel ``.kernels``.
    """
    choice("impl", impl, IMPLS)
    choice("writes", writes, ("through", "back"))
    choice("policy", policy, ("random", "lru"))
    expect(0 < l2_fraction <= 1, "l2_fraction", "a fraction in (0, 1]", l2_fraction)
    for name, v in (("n", n), ("d", d), ("heads", heads), ("batch", batch), ("chunks_per_l2", chunks_per_l2)):
        positive_int(name, v)
    b = _traffic.DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16", "fp32"))]
    dev_l2, dev_sms = device_facts(device)
    l2 = dev_l2 if l2_bytes is None else positive_int("l2_bytes", l2_bytes)
    sms = dev_sms if sms is None else positive_int("sms", sms)
    cache = _Cache(int(l2 * l2_fraction), writes, policy)
    chunk = max(4096, int(l2 * l2_fraction) // chunks_per_l2)
    params = {"n": n, "d": d, "heads": heads, "batch": batch, "dtype": dtype, "causal": causal,
              "l2_bytes": l2, "sms": sms, "writes": writes, "policy": policy, "l2_fraction": l2_fraction,
              "chunk_bytes": chunk}
    est = Estimate(impl, params)
    if impl == "naive":
        _naive(cache, est, n, n, d, b, batch * heads, causal, chunk)
    else:
        bq, bk, per_sm = _TILES[impl]
        per_sm = per_sm if ctas_per_sm is None else positive_int("ctas_per_sm", ctas_per_sm)
        params.update(block_q=bq, block_kv=bk, ctas_per_sm=per_sm)
        _fused(cache, est, impl, n, n, d, b, batch * heads, causal, chunk, sms * per_sm, bq, bk)
    return est


def logical(impl: str, n: int = 4096, d: int = 128, heads: int = 32, batch: int = 1, dtype: str = "fp16",
            causal: bool = False) -> int:
    """Logical bytes of the call from model/traffic.py (whole call): the row that describes what runs.

    naive -> ``naive`` or ``naive-causal-eager`` (what `naive_attention` does: full S, a bool mask and
    an out-of-place masked_fill); fused -> ``flash`` or ``flash-causal`` with that implementation's
    tiles and its logsumexp write.
    """
    choice("impl", impl, IMPLS)
    if impl == "naive":
        row = "naive-causal-eager" if causal else "naive"
        t = _traffic.traffic(n, d, dtype, batch=batch, heads=heads, rows=(row,))
    else:
        bq, bk, _ = _TILES[impl]
        row = "flash-causal" if causal else "flash"
        t = _traffic.traffic(n, d, dtype, bq, bk, batch=batch, heads=heads, lse=_WRITES_LSE[impl],
                             rows=(row,))
    return t[row].total * t.config.batch_heads


def error(estimated: float, measured: float) -> float:
    """Relative error of an estimate against a measurement: estimated / measured - 1."""
    expect(measured > 0, "measured", "a positive byte count", measured)
    return estimated / measured - 1.0
