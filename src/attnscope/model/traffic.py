"""Logical HBM traffic of attention's forward pass: exact integer bytes, itemised (spec §1.1, §4).

The model is a ledger: every kernel lists the tensors it reads and writes, one line per transfer, and
the totals are sums of those lines. It counts *logical* bytes: a cold cache, no L2 reuse, no sector
padding, no register spills, no allocator effects. Nsight Compute's ``dram__bytes_read.sum`` counts
physical transactions and will differ (spec §4.3).

Rows (each belongs to one masking condition; ratios are taken only within a condition, spec §4.2):

- ``naive``               explicit 3-kernel materialising baseline, S and P in the input dtype;
- ``flash``               FlashAttention-2 forward, unmasked;
- ``naive-causal-ideal``  the spec's idealised lower-triangular baseline (each triangle Nq*Nk/2 elements);
- ``flash-causal``        FlashAttention-2 forward with the skip bound, exact per tile (model/tiles.py);
- ``naive-causal-eager``  an eager causal baseline with an explicit bool mask and a separate masked_fill.

Bytes are per (batch, query head). With GQA (kv_heads < heads) they are the bytes *as the kernel issues
them*: every query head's program reads its K/V head itself, so K and V are counted once per query head
even though heads/kv_heads query heads share them (L2 may serve the repeats; this model does not).

Score mods (`Config.window`, ``softcap``, ``sinks``): a sliding window shrinks the flash rows' K/V reads to
the KV tiles the window visits (model/tiles.py, O(N W) tile pairs) and their FLOPs to the visible pairs;
the naive rows materialise the full S as before and apply the window as a bool mask (as the eager causal
row does), the ideal row stores only the visible elements. Softcap moves no HBM byte in the flash rows (it
is applied to the score tile in registers); sinks add one FP32 read of ``sinks[h]`` per query-tile program.

The backward pass's ledgers are in model/backward.py; a packed batch and a paged KV cache in
model/serving.py. Both build on the `Row` / `Kernel` / `Transfer` ledger here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from attnscope.errors import InputError, choice, expect, finite_real, positive_int, short
from attnscope.model.flops import visible_pairs
from attnscope.model.tiles import Grid, normalize_window

#: Bytes per element of each supported input dtype.
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}

#: The softmax statistics and the exported logsumexp are FP32 in the shipped kernels (spec §3.3).
STAT_BYTES = 4

#: Elementwise FLOPs per score of a row softmax: max, subtract, exp, sum -- the spec's "about 4N^2"
#: (§1.1); the final division is folded into the sum's reciprocal.
SOFTMAX_FLOPS_PER_ELEMENT = 4

ROW_NAMES = ("naive", "flash", "naive-causal-ideal", "flash-causal", "naive-causal-eager")
#: The four rows of the spec's §4 table, printed by default.
SPEC_ROWS = ROW_NAMES[:4]

UNMASKED, CAUSAL = "unmasked", "causal"


@dataclass(frozen=True)
class Transfer:
    """One line of the ledger: a kernel reads or writes ``nbytes`` of ``tensor``."""

    tensor: str
    direction: str  # "read" | "write"
    nbytes: int
    what: str

    def to_json(self) -> dict:
        return {"tensor": self.tensor, "dir": self.direction, "bytes": self.nbytes, "what": self.what}


class _Totals:
    """Bytes read, written and both, summed over ``transfers`` (a Kernel's own, or all of a Row's)."""

    @property
    def reads(self) -> int:
        return sum(t.nbytes for t in self.transfers if t.direction == "read")

    @property
    def writes(self) -> int:
        return sum(t.nbytes for t in self.transfers if t.direction == "write")

    @property
    def total(self) -> int:
        return self.reads + self.writes


@dataclass(frozen=True)
class Kernel(_Totals):
    """One kernel launch (per batch-head) with its transfers and its FLOPs."""

    name: str
    flops: int
    unit: str  # the pipe doing the FLOPs, for the roofline's peak: "tensor" or "elementwise" (CUDA cores)
    transfers: tuple[Transfer, ...]

    def to_json(self) -> dict:
        return {"kernel": self.name, "flops": self.flops, "unit": self.unit, "reads": self.reads,
                "writes": self.writes, "total": self.total,
                "transfers": [t.to_json() for t in self.transfers]}


@dataclass(frozen=True)
class Row(_Totals):
    """One configuration: its kernels, its masking condition, and the assumptions it rests on."""

    name: str
    label: str
    condition: str
    baseline: str  # the matched baseline of the same condition (itself for a baseline)
    kernels: tuple[Kernel, ...]
    assumptions: tuple[str, ...] = ()

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(t for k in self.kernels for t in k.transfers)

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    def to_json(self, ratio: float | None, whole: int | None = None) -> dict:
        """The row's numbers; ``whole``: (batch, head) pairs the call has, adds the ``*_all`` totals."""
        d = {"name": self.name, "label": self.label, "condition": self.condition, "baseline": self.baseline,
             "reads": self.reads, "writes": self.writes, "total": self.total, "flops": self.flops,
             "ratio": ratio}
        if whole is not None:
            d.update(reads_all=self.reads * whole, writes_all=self.writes * whole,
                     total_all=self.total * whole)
        return d | {"assumptions": list(self.assumptions), "items": [k.to_json() for k in self.kernels]}


@dataclass(frozen=True)
class Config:
    """The shape and tiling the traffic is counted for (validated on construction)."""

    nq: int
    nk: int
    d: int
    dtype: str = "fp16"
    block_q: int = 128
    block_kv: int = 64
    batch: int = 1
    heads: int = 1
    kv_heads: int | None = None  # None: as heads (no GQA)
    lse: bool = False
    window: tuple[int, int] | None = None  # (left, right), -1 unbounded (model.tiles.normalize_window)
    softcap: float = 0.0  # 0: off
    sinks: bool = False  # a per-head sink logit (fp32 [Hq])

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("nq", "nk", "d", "block_q", "block_kv", "batch", "heads", "kv_heads"):
            positive_int(name, getattr(self, name))
        choice("dtype", self.dtype, DTYPE_BYTES)
        expect(self.heads % self.kv_heads == 0, "kv_heads", f"a divisor of heads ({self.heads})",
               self.kv_heads)
        expect(isinstance(self.lse, bool), "lse", "a bool", self.lse)
        if self.window is not None:
            object.__setattr__(self, "window", normalize_window(False, self.window))
        if not (finite_real(self.softcap) and self.softcap >= 0):
            raise InputError("softcap: expected a finite real number >= 0 (0 disables), "
                             f"got {short(self.softcap)}")
        expect(isinstance(self.sinks, bool), "sinks", "a bool", self.sinks)

    @property
    def b(self) -> int:
        """Bytes per element of Q, K, V, O, S and P."""
        return DTYPE_BYTES[self.dtype]

    @property
    def batch_heads(self) -> int:
        """(batch, query head) pairs: the per-head bytes times this is the whole call."""
        return self.batch * self.heads

    def grid(self, causal: bool) -> Grid:
        return Grid(self.nq, self.nk, self.block_q, self.block_kv, causal=causal, window=self.window)

    def masked(self, causal: bool) -> bool:
        """Does the attention of a ``causal`` row hide any key (causal or a bounded window side)?"""
        return normalize_window(causal, self.window) != (-1, -1)

    def condition(self, causal: bool) -> str:
        """The masking condition of a row: unmasked or causal; with a window "window (L, R)" or "causal,
        window (L, R)"."""
        if self.window is None:
            return CAUSAL if causal else UNMASKED
        return f"{CAUSAL}, window {self.window}" if causal else f"window {self.window}"

    def to_json(self) -> dict:
        return {"nq": self.nq, "nk": self.nk, "d": self.d, "dtype": self.dtype, "bytes_per_element": self.b,
                "block_q": self.block_q, "block_kv": self.block_kv, "batch": self.batch,
                "heads": self.heads, "kv_heads": self.kv_heads, "lse": self.lse,
                "window": None if self.window is None else list(self.window), "softcap": self.softcap,
                "sinks": self.sinks}


def pairs(c: Config, causal: bool) -> int:
    """Scores the kernel computes, by the FLOP convention of model/flops.py: Nq*Nk unmasked, `causal_pairs`
    causal; with a window the exact count of visible (row, key) pairs (`Grid.visible_pairs`)."""
    if c.window is not None:
        return c.grid(causal).visible_pairs()
    return causal_pairs(c) if causal else c.nq * c.nk


def sink_reads(c: Config, programs: int, what: str = "") -> list[Transfer]:
    """The score mods' whole HBM traffic in a flash kernel: ``sinks[h]``, one FP32 per program (none
    without sinks). Softcap is applied to the score tile in registers and moves no byte."""
    if not c.sinks:
        return []
    return [read("sinks", programs * STAT_BYTES, what or f"sinks[h], one FP32 per query-tile program "
                 f"({programs}); softcap and sinks move no other byte")]


def mods_note(c: Config) -> list[str]:
    """The flash rows' one line on the mods (empty without softcap and sinks)."""
    if not (c.softcap or c.sinks):
        return []
    what = " and ".join(x for x in (f"softcap {c.softcap:g}" if c.softcap else "",
                                    "sinks" if c.sinks else "") if x)
    return [f"{what}: no HBM traffic beyond the sink vector (the cap is applied in registers to each score "
            "tile, the sink joins l at the end); their elementwise FLOPs are not counted"]


# --- the ledgers ------------------------------------------------------------------------------------
def read(tensor: str, nbytes: int, what: str) -> Transfer:
    return Transfer(tensor, "read", nbytes, what)


def write(tensor: str, nbytes: int, what: str) -> Transfer:
    return Transfer(tensor, "write", nbytes, what)


def _qk(c: Config, name: str, flops: int, s: int, what: str) -> Kernel:
    """An eager baseline's first kernel: reads Q [Nq, d] and K [Nk, d], writes ``s`` bytes of S."""
    return Kernel(name, flops, "tensor", (read("Q", c.nq * c.d * c.b, "Q [Nq, d]"),
                                          read("K", c.nk * c.d * c.b, "K [Nk, d]"), write("S", s, what)))


def _pv(c: Config, name: str, flops: int, p: int, what: str) -> Kernel:
    """An eager baseline's last kernel: reads ``p`` bytes of P and V [Nk, d], writes O [Nq, d]."""
    return Kernel(name, flops, "tensor", (read("P", p, what), read("V", c.nk * c.d * c.b, "V [Nk, d]"),
                                          write("O", c.nq * c.d * c.b, "O [Nq, d]")))


def naive(c: Config) -> Row:
    """The explicit 3-kernel materialising baseline (spec §1.1): S and P written and read in full. With a
    window: the eager baseline's way, a bool mask and a masked_fill kernel (`_eager_mods`)."""
    s = c.nq * c.nk * c.b          # S, P: [Nq, Nk], input dtype
    gemm = 2 * c.nq * c.nk * c.d   # one [Nq, d] x [d, Nk] (or [Nq, Nk] x [Nk, d]) product
    mods, notes = _eager_mods(c, False, "S")
    kernels = [_qk(c, "1. GEMM (QK^T)", gemm, s, "S = QK^T/sqrt(d) [Nq, Nk], materialised"), *mods,
               Kernel(f"{len(mods) + 2}. Softmax", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
                   read(_last_s(mods, "S"), s, f"{_last_s(mods, 'S')} [Nq, Nk] read back"), *_eager_sinks(c),
                   write("P", s, "P = softmax(S) [Nq, Nk], materialised"))),
               _pv(c, f"{len(mods) + 3}. GEMM (PV)", gemm, s, "P [Nq, Nk] read back")]
    label = "Naive, unmasked (3 kernels)" if not mods else f"Naive ({len(kernels)} kernels, {_mods_label(c)})"
    return Row("naive", label, c.condition(False), "naive", tuple(kernels), (
        "S and P are written to HBM in the input dtype and read back once each (no L2 reuse)", *notes))


def _mods_label(c: Config, window: bool = True) -> str:
    return ", ".join(x for x in (f"window {c.window}" if window and c.window is not None else "",
                                 f"softcap {c.softcap:g}" if c.softcap else "",
                                 "sinks" if c.sinks else "") if x)


def _last_s(mods: list[Kernel], first: str) -> str:
    """The name of the score tensor the eager softmax reads: the last mod kernel's output."""
    return mods[-1].transfers[-1].tensor if mods else first


def _eager_mods(c: Config, causal: bool, first: str) -> tuple[list[Kernel], list[str]]:
    """The eager baseline's kernels between QK^T and the softmax, numbered from 2: the softcap (one fused
    elementwise kernel, out of place) and, when any key is hidden beyond plain causal's eager row, the
    bool mask and its masked_fill; with the assumptions they rest on."""
    s, n = c.nq * c.nk * c.b, c.nq * c.nk
    kernels, notes, src = [], [], first
    if c.softcap:
        kernels.append(Kernel(f"{2 + len(kernels)}. softcap", 3 * n, "elementwise", (
            read(src, s, f"{src} [Nq, Nk]"),
            write("S_cap", s, f"S_cap = {c.softcap:g} * tanh(S / {c.softcap:g}) [Nq, Nk], out of place"))))
        notes.append("softcap is one fused elementwise kernel (eager PyTorch launches three: div, tanh, mul)")
        src = "S_cap"
    if c.window is not None and c.masked(causal):
        kernels.append(Kernel(f"{2 + len(kernels)}. masked_fill", n, "elementwise", (
            read(src, s, f"{src} [Nq, Nk]"),
            read("mask", n, f"bool mask [Nq, Nk] of the window {c.window}, 1 B per element"),
            write("S'", s, f"S' = {src}.masked_fill(~mask, -inf) [Nq, Nk], out of place"))))
        notes.append("the window is a bool [Nq, Nk] mask built once and cached (not counted), applied by a "
                     "separate masked_fill; nothing outside the window is skipped")
    return kernels, notes


def _eager_sinks(c: Config) -> list[Transfer]:
    """The eager softmax with the sink in its denominator reads ``sinks[h]`` once per (batch, head)."""
    return [read("sinks", STAT_BYTES, "sinks[h] in the softmax denominator (a fused softmax; concatenating "
                                      "a sink column to S would copy S once more)")] if c.sinks else []


def causal_pairs(c: Config) -> int:
    """Scores a causal kernel computes, by the FLOP convention of model/flops.py: Nq*Nk/2 when Nq == Nk,
    else the exact count of permitted (row, key) pairs."""
    return c.nq * c.nk // 2 if c.nq == c.nk else visible_pairs(c.nq, c.nk, True)


def flash(c: Config, causal: bool = False) -> Row:
    """FA-2 forward (spec §2.2, §4.1-4.2): Q read once, O written once, K and V read once per query
    tile that loads them -- exactly the rows of the KV tiles model/tiles.py says it loads (with a window:
    only the tiles the window visits)."""
    g = c.grid(causal)
    q = c.nq * c.d * c.b
    kv_rows = g.kv_rows_total()  # K rows (= V rows) streamed
    passes = f"{kv_rows / c.nk:g} passes over K" if kv_rows else "no KV tile loaded"
    transfers = [
        read("Q", q, f"Q [Nq, d], each of the {g.n_q_tiles} query tiles loads its rows once"),
        read("K", kv_rows * c.d * c.b, f"K rows of every loaded KV tile, summed over query tiles ({passes})"),
        read("V", kv_rows * c.d * c.b, "V, the same rows as K"),
        write("O", q, "O [Nq, d], written once per query tile"),
        *sink_reads(c, g.n_q_tiles),
    ]
    if c.lse:
        transfers.append(write("LSE", c.nq * STAT_BYTES, "logsumexp, one FP32 per query row (spec §3.3)"))
    name = "flash-causal" if causal else "flash"
    label = f"FlashAttention-2, {c.condition(causal)}"
    if c.softcap or c.sinks:
        label += ", " + _mods_label(c, window=False)
    assumptions = ["S_ij and P_ij live in SRAM/registers only: 0 bytes of S or P reach HBM",
                   f"tiles B_r = {c.block_q}, B_c = {c.block_kv}; ragged last tiles read only their rows"]
    if causal:
        assumptions.append("KV tiles entirely in the future are skipped (skip bound, FA-2 §3.1.1); "
                           "causal alignment is bottom-right when Nq != Nk")
    if c.window is not None:
        visited, _ = g.loaded_pairs()
        assumptions.append(f"window {c.window} (effective {g.bounds}): KV tiles wholly outside it are "
                           f"skipped; {visited:,} of {g.n_q_tiles * g.n_kv_tiles:,} tile pairs visited")
    assumptions += mods_note(c)
    if not c.lse:
        assumptions.append("no logsumexp write (add 4 B per query row with lse)")
    return Row(name, label, c.condition(causal), "naive-causal-ideal" if causal else "naive",
               (Kernel("FA-2 forward (fused)", 4 * pairs(c, causal) * c.d, "tensor", tuple(transfers)),),
               tuple(assumptions))


def naive_causal_ideal(c: Config) -> Row:
    """The spec's idealised lower-triangular baseline (§4.2): only the lower triangle of S and P is
    stored, each triangle exactly Nq*Nk/2 elements (diagonal and ragged fill ignored). With a window:
    only the visible band, exactly `Grid.visible_pairs` elements."""
    name = "naive-causal-ideal"
    if c.window is not None:
        band = pairs(c, True)
        tri, what, label = band * c.b, f"the {band:,} visible elements", "Idealized band naive, causal"
        first = f"S and P store exactly the {band:,} elements the window {c.window} shows, nothing else"
    else:
        tri = -(-c.nq * c.nk * c.b // 2)  # half of Nq*Nk elements; a half byte (fp8, odd Nq*Nk) rounds up
        what, label = "lower triangle", "Idealized lower-triangular naive, causal"
        first = "each triangle of S and P is exactly Nq*Nk/2 elements (diagonal and ragged tile fill ignored)"
    gemm = 2 * pairs(c, True) * c.d
    label += ", " + _mods_label(c) if c.softcap or c.sinks else ""
    return Row(name, label, c.condition(True), name, (
        _qk(c, f"1. GEMM (QK^T), {what}", gemm, tri,
            f"{what} of S" + ("" if c.window else ", Nq*Nk/2 elements")),
        Kernel(f"2. Softmax, {what}", SOFTMAX_FLOPS_PER_ELEMENT * pairs(c, True), "elementwise", (
            read("S", tri, f"{what} of S read back"), *_eager_sinks(c),
            write("P", tri, f"{what} of P"),
        )),
        _pv(c, f"3. GEMM (PV), {what}", gemm, tri, f"{what} of P read back"),
    ), (first, "an idealisation: no eager kernel stores a packed triangle or band (spec §4.2)",
        *(["softcap: assumed fused into the QK^T epilogue (no extra bytes)"] if c.softcap else [])))


def naive_causal_eager(c: Config) -> Row:
    """An eager PyTorch-style causal baseline: full S, an explicit bool mask applied by a separate
    masked_fill kernel, then softmax and PV. A *different* baseline from the idealised one (spec §4.2).
    With a window the mask is the window's (causal folded in); a softcap adds its kernel before it."""
    s = c.nq * c.nk * c.b
    mask = c.nq * c.nk  # torch.bool: one byte per element
    gemm = 2 * c.nq * c.nk * c.d
    mods, notes = _eager_mods(replace(c, window=None), True, "S")  # the softcap; the mask follows
    src = _last_s(mods, "S")
    n = len(mods)
    label = "Eager naive, causal (bool mask + masked_fill)"
    if c.window is not None or c.softcap or c.sinks:
        label += ", " + _mods_label(c)
    return Row("naive-causal-eager", label, c.condition(True), "naive-causal-eager", (
        _qk(c, "1. GEMM (QK^T)", gemm, s, "full S [Nq, Nk], the future included"),
        *mods,
        Kernel(f"{n + 2}. masked_fill", c.nq * c.nk, "elementwise", (
            read(src, s, f"{src} [Nq, Nk]"),
            read("mask", mask, "bool mask [Nq, Nk], 1 B per element"
                 + (f" (causal and the window {c.window})" if c.window is not None else "")),
            write("S'", s, f"S' = {src}.masked_fill(~mask, -inf) [Nq, Nk], out of place"),
        )),
        Kernel(f"{n + 3}. Softmax", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            read("S'", s, "S' [Nq, Nk]"), *_eager_sinks(c),
            write("P", s, "P [Nq, Nk]"),
        )),
        _pv(c, f"{n + 4}. GEMM (PV)", gemm, s, "P [Nq, Nk], zeros above the diagonal still read"),
    ), (*notes, "the mask is a torch.bool [Nq, Nk] tensor (1 B per element), built once and cached, so "
        "building it is not counted",
        "masked_fill is a separate, out-of-place kernel: it reads S and the mask and writes S'",
        "the mask is broadcast over batch and heads and read once per (batch, head) (no L2 reuse)",
        "the GEMMs and softmax run on the full [Nq, Nk] matrices; nothing is skipped",
        "a different baseline from the idealised triangle: the spec quotes no ratio against it (§4.2)"))


BUILDERS = {"naive": naive, "flash": flash, "naive-causal-ideal": naive_causal_ideal,
            "flash-causal": lambda c: flash(c, causal=True), "naive-causal-eager": naive_causal_eager}


# --- the result -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Traffic:
    """Traffic of several configurations of one shape. Bytes per (batch, query head)."""

    config: Config
    rows: dict[str, Row] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Row:
        return self.rows[choice("row", name, self.rows)]

    def ratio(self, baseline: str, other: str) -> float:
        """``baseline.total / other.total``: how many times fewer bytes ``other`` moves; refused across
        masking conditions (spec §4.2)."""
        a, b = self[baseline], self[other]
        if a.condition != b.condition:
            raise InputError(
                f"ratio: expected two configurations of one masking condition, got {a.name} ({a.condition})"
                f" and {b.name} ({b.condition}); a cross-condition ratio mixes the masking change with "
                "the fusion change and is not a result (spec §4.2)")
        return a.total / b.total

    def matched_ratio(self, name: str) -> float | None:
        """Ratio of ``name`` against its matched baseline, when that baseline is among the rows."""
        row = self[name]
        return self.ratio(row.baseline, name) if row.baseline in self.rows else None

    def kv_passes(self, causal: bool) -> float:
        """Complete passes over K (= over V) the FA-2 forward makes (spec §4.2: 16.5 causal at N = 4,096)."""
        return self.config.grid(causal).kv_rows_total() / self.config.nk

    def to_json(self) -> dict:
        bh = self.config.batch_heads
        rows = [r.to_json(self.matched_ratio(r.name), bh if bh != 1 else None) for r in self.rows.values()]
        params = self.config.to_json() | {"batch_heads": bh,
                                          "per": "one (batch, query head); *_all fields are the whole call"}
        return {"params": params, "rows": rows}


def traffic(n: int | None = 4096, d: int = 128, dtype: str = "fp16", block_q: int = 128, block_kv: int = 64,
            *, nq: int | None = None, nk: int | None = None, batch: int = 1, heads: int = 1,
            kv_heads: int | None = None, lse: bool = False, rows=SPEC_ROWS, window=None, softcap: float = 0.0,
            sinks: bool = False) -> Traffic:
    """Logical HBM bytes of each configuration in ``rows``, per (batch, query head).

    Parameters
    ----------
    n: sequence length for both Q and K/V; ``nq``/``nk`` override it (defaults: 4,096, the spec's).
    d: head dimension (128). dtype: fp16, bf16, fp32 or fp8 (fp16).
    block_q, block_kv: FA-2 tiles B_r, B_c (128, 64). batch, heads: query heads (1, 1).
    kv_heads: K/V heads for GQA/MQA; must divide heads (defaults to heads). K/V bytes are still counted
        per query head, as the kernel issues them.
    lse: add the FP32 logsumexp write (4 B per query row) to the flash rows.
    rows: which of ``ROW_NAMES`` to count (the spec's four §4 rows by default).
    window: ``(left, right)`` sliding window or None (flash-attn's ``window_size``, -1 unbounded;
        causal rows force right = 0). softcap: the logit cap (0: off). sinks: a per-head sink logit.

    Returns
    -------
    Traffic: ``t["naive"].total`` is 138,412,032 at the defaults; ``t.ratio("naive", "flash")`` is 2.0.
    """
    return ledgers(BUILDERS, rows, n, nq, nk, d=d, dtype=dtype, block_q=block_q, block_kv=block_kv,
                   batch=batch, heads=heads, kv_heads=kv_heads, lse=lse, window=window, softcap=softcap,
                   sinks=sinks)


def ledgers(builders: dict, rows, n, nq, nk, **config) -> Traffic:
    """The rows (keys of ``builders``) for one shape: ``nq``/``nk`` default to ``n``."""
    nq = n if nq is None else nq
    nk = n if nk is None else nk
    expect(nq is not None and nk is not None, "n", "a sequence length (or both nq and nk)", n)
    cfg = Config(nq=nq, nk=nk, **config)
    return Traffic(cfg, {name: builders[name](cfg) for name in row_names(rows, builders)})


def row_names(rows, valid) -> list[str]:
    names = list(rows)
    expect(len(names) > 0, "rows", "at least one of " + ", ".join(valid), rows)
    return [choice("row", name, valid) for name in names]
