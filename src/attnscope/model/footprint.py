"""Memory scopes of attention (spec §1.2, §3.3, §2): which lifetime a byte count means.

The same per-head arithmetic turns into numbers 32x apart depending on the scope, so each scope here
carries the assumption it rests on, and is printed with it:

- the naive baseline's S + P per head, one layer's inference peak, and training retention (§1.2);
- the FA-2 running statistics per head, the live state of one CTA, and the exported logsumexp (§3.3);
- the tile buffers of one CTA and whether they fit a device's shared-memory carve-out (§2).

All byte counts are exact integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.errors import choice, expect, positive_int
from attnscope.model.roofline import DEVICES, device
from attnscope.model.traffic import DTYPE_BYTES, STAT_BYTES


@dataclass(frozen=True)
class Scope:
    """One memory scope: its name, its size, what it counts, and the assumption it rests on."""

    name: str
    nbytes: int
    counts: str
    assumption: str

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.nbytes, "counts": self.counts, "assumption": self.assumption}


@dataclass(frozen=True)
class Fit:
    """Does a set of per-CTA buffers fit one device's shared memory?"""

    device: str
    what: str
    nbytes: int
    limit: int  # the per-block opt-in maximum
    carveout: int

    @property
    def fits(self) -> bool:
        return self.nbytes <= self.limit

    def to_json(self) -> dict:
        return {"device": self.device, "what": self.what, "bytes": self.nbytes, "limit_bytes": self.limit,
                "carveout_bytes": self.carveout, "fits": self.fits}


@dataclass(frozen=True)
class Footprint:
    params: dict
    scopes: list[Scope]
    tiles: list[Scope]
    fits: list[Fit]

    def __getitem__(self, name: str) -> Scope:
        return {s.name: s for s in self.scopes + self.tiles}[name]

    def to_json(self) -> dict:
        return {"params": self.params, "scopes": [s.to_json() for s in self.scopes],
                "tiles": [s.to_json() for s in self.tiles], "fits": [f.to_json() for f in self.fits]}


def footprint(n: int | None = 4096, d: int = 128, dtype: str = "fp16", block_q: int = 128, block_kv: int = 64,
              *, nq: int | None = None, nk: int | None = None, heads: int = 32, layers: int = 32,
              batch: int = 1, devices=None) -> Footprint:
    """The memory scopes at one shape; defaults are the spec's (N = 4,096, d = 128, FP16, 32 heads,
    32 layers, B_r = 128, B_c = 64, batch 1).

    Parameters
    ----------
    n, nq, nk: sequence lengths (nq/nk override n). d: head dimension. dtype: fp16, bf16, fp32, fp8.
    block_q, block_kv: FA-2 tiles B_r, B_c. heads: query heads of one layer. layers: transformer layers.
    batch: sequences. devices: names to check the tile buffers against (default: every known device).

    Returns
    -------
    Footprint: ``f["per-head S+P"].nbytes`` is 67,108,864 (64 MiB) at the defaults.
    """
    nq = n if nq is None else nq
    nk = n if nk is None else nk
    for name, v in (("nq", nq), ("nk", nk), ("d", d), ("block_q", block_q), ("block_kv", block_kv),
                    ("heads", heads), ("layers", layers), ("batch", batch)):
        positive_int(name, v)
    b = DTYPE_BYTES[choice("dtype", dtype, DTYPE_BYTES)]
    names = devices is None or (isinstance(devices, (list, tuple)) and all(isinstance(x, str)
                                                                           for x in devices))
    expect(names, "devices", "None or a list of device names", devices)
    devs = [device(x) for x in (DEVICES if devices is None else devices)]
    br = min(block_q, nq)    # a tile never holds more rows than the sequence has
    bc = min(block_kv, nk)

    s = nq * nk * b           # S (or P) of one head: [Nq, Nk]
    sp = 2 * s                # both live: the naive baseline materialises S, then P
    scopes = [
        Scope("per-head S", s, "S [Nq, Nk] of one head in the input dtype",
              "the naive baseline materialises S in HBM"),
        Scope("per-head S+P", sp, "S and P [Nq, Nk] of one head",
              "S and P are both live at once (softmax reads S while writing P)"),
        Scope("inference peak, one layer", batch * heads * sp,
              f"S+P x {heads} heads x batch {batch}",
              f"the {heads} heads of the active layer run attention in parallel, S and P both live; layers "
              "run one after another and free or reuse their buffers (an upper bound on transient scratch, "
              "not a memory plan)"),
        Scope("training retention, all layers", batch * layers * heads * sp,
              f"S+P x {heads} heads x {layers} layers x batch {batch}",
              "no activation checkpointing: every layer's S and P are kept for the backward pass; "
              "weights, gradients and optimizer state are not included"),
        Scope("running statistics, one head", 2 * nq * STAT_BYTES, "m and l: one FP32 each per query row",
              "the aggregate over every query row of one head, not any kernel's live state"),
        Scope("live state, one CTA: m, l", 2 * br * STAT_BYTES, f"m and l for B_r = {br} rows, FP32",
              "one query tile's running max and normalizer"),
        Scope("live state, one CTA: accumulator", br * d * STAT_BYTES, f"a [B_r, d] = [{br}, {d}], FP32",
              "the unnormalised accumulator in FP32; real kernels keep it in registers"),
        Scope("exported logsumexp, one head", nq * STAT_BYTES, "L = m + log l: one FP32 per query row",
              "written to HBM only if the kernel exports it (FA-2 Algorithm 1 does; a forward-only serving "
              "kernel may not); the only one of the three §3.3 scopes that is HBM footprint"),
    ]
    tiles = [
        Scope("Q tile", br * d * b, f"Q_i [B_r, d] = [{br}, {d}]", "loaded once per query tile"),
        Scope("K tile", bc * d * b, f"K_j [B_c, d] = [{bc}, {d}]", "single-buffered (one pipeline stage)"),
        Scope("V tile", bc * d * b, f"V_j [B_c, d] = [{bc}, {d}]", "single-buffered (one pipeline stage)"),
        Scope("S tile", br * bc * b, f"S_ij [B_r, B_c] = [{br}, {bc}] in the input dtype",
              "the score tile, never written to HBM"),
    ]
    tile_bytes = sum(t.nbytes for t in tiles)
    with_state = tile_bytes + scopes[5].nbytes + scopes[6].nbytes
    buffers = (("Q, K, V, S tiles", tile_bytes), ("tiles + m, l + FP32 accumulator", with_state))
    fits = [Fit(dev.name, what, nbytes, dev.smem_per_block, dev.smem_carveout)
            for dev in devs for what, nbytes in buffers]
    params = {"nq": nq, "nk": nk, "d": d, "dtype": dtype, "bytes_per_element": b, "block_q": block_q,
              "block_kv": block_kv, "heads": heads, "layers": layers, "batch": batch,
              "devices": [x.name for x in devs]}
    return Footprint(params, scopes, tiles, fits)
