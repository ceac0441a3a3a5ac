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

The backward pass's ledgers are in model/backward.py; a packed batch and a paged KV cache in
model/serving.py. Both build on the `Row` / `Kernel` / `Transfer` ledger here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnscope.errors import InputError, choice, expect, positive_int
from attnscope.model.flops import visible_pairs
from attnscope.model.tiles import Grid

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

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("nq", "nk", "d", "block_q", "block_kv", "batch", "heads", "kv_heads"):
            positive_int(name, getattr(self, name))
        choice("dtype", self.dtype, DTYPE_BYTES)
        expect(self.heads % self.kv_heads == 0, "kv_heads", f"a divisor of heads ({self.heads})",
               self.kv_heads)
        expect(isinstance(self.lse, bool), "lse", "a bool", self.lse)

    @property
    def b(self) -> int:
        """Bytes per element of Q, K, V, O, S and P."""
        return DTYPE_BYTES[self.dtype]

    @property
    def batch_heads(self) -> int:
        """(batch, query head) pairs: the per-head bytes times this is the whole call."""
        return self.batch * self.heads

    def grid(self, causal: bool) -> Grid:
        return Grid(self.nq, self.nk, self.block_q, self.block_kv, causal=causal)

    def to_json(self) -> dict:
        return {"nq": self.nq, "nk": self.nk, "d": self.d, "dtype": self.dtype, "bytes_per_element": self.b,
                "block_q": self.block_q, "block_kv": self.block_kv, "batch": self.batch,
                "heads": self.heads, "kv_heads": self.kv_heads, "lse": self.lse}


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
    """The explicit 3-kernel materialising baseline (spec §1.1): S and P written and read in full."""
    s = c.nq * c.nk * c.b          # S, P: [Nq, Nk], input dtype
    gemm = 2 * c.nq * c.nk * c.d   # one [Nq, d] x [d, Nk] (or [Nq, Nk] x [Nk, d]) product
    return Row("naive", "Naive, unmasked (3 kernels)", UNMASKED, "naive", (
        _qk(c, "1. GEMM (QK^T)", gemm, s, "S = QK^T/sqrt(d) [Nq, Nk], materialised"),
        Kernel("2. Softmax", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            read("S", s, "S [Nq, Nk] read back"),
            write("P", s, "P = softmax(S) [Nq, Nk], materialised"),
        )),
        _pv(c, "3. GEMM (PV)", gemm, s, "P [Nq, Nk] read back"),
    ), ("S and P are written to HBM in the input dtype and read back once each (no L2 reuse)",))


def causal_pairs(c: Config) -> int:
    """Scores a causal kernel computes, by the FLOP convention of model/flops.py: Nq*Nk/2 when Nq == Nk,
    else the exact count of permitted (row, key) pairs."""
    return c.nq * c.nk // 2 if c.nq == c.nk else visible_pairs(c.nq, c.nk, True)


def flash(c: Config, causal: bool = False) -> Row:
    """FA-2 forward (spec §2.2, §4.1-4.2): Q read once, O written once, K and V read once per query
    tile that loads them -- exactly the rows of the KV tiles model/tiles.py says it loads."""
    g = c.grid(causal)
    q = c.nq * c.d * c.b
    kv_rows = g.kv_rows_total()  # K rows (= V rows) streamed
    pairs = causal_pairs(c) if causal else c.nq * c.nk
    passes = f"{kv_rows / c.nk:g} passes over K" if kv_rows else "no KV tile loaded"
    transfers = [
        read("Q", q, f"Q [Nq, d], each of the {g.n_q_tiles} query tiles loads its rows once"),
        read("K", kv_rows * c.d * c.b, f"K rows of every loaded KV tile, summed over query tiles ({passes})"),
        read("V", kv_rows * c.d * c.b, "V, the same rows as K"),
        write("O", q, "O [Nq, d], written once per query tile"),
    ]
    if c.lse:
        transfers.append(write("LSE", c.nq * STAT_BYTES, "logsumexp, one FP32 per query row (spec §3.3)"))
    name = "flash-causal" if causal else "flash"
    label = "FlashAttention-2, causal" if causal else "FlashAttention-2, unmasked"
    assumptions = ["S_ij and P_ij live in SRAM/registers only: 0 bytes of S or P reach HBM",
                   f"tiles B_r = {c.block_q}, B_c = {c.block_kv}; ragged last tiles read only their rows"]
    if causal:
        assumptions.append("KV tiles entirely in the future are skipped (skip bound, FA-2 §3.1.1); "
                           "causal alignment is bottom-right when Nq != Nk")
    if not c.lse:
        assumptions.append("no logsumexp write (add 4 B per query row with lse)")
    return Row(name, label, CAUSAL if causal else UNMASKED, "naive-causal-ideal" if causal else "naive",
               (Kernel("FA-2 forward (fused)", 4 * pairs * c.d, "tensor", tuple(transfers)),),
               tuple(assumptions))


def naive_causal_ideal(c: Config) -> Row:
    """The spec's idealised lower-triangular baseline (§4.2): only the lower triangle of S and P is
    stored, each triangle exactly Nq*Nk/2 elements (diagonal and ragged fill ignored)."""
    tri = -(-c.nq * c.nk * c.b // 2)  # half of Nq*Nk elements; a half byte (fp8, odd Nq*Nk) rounds up
    gemm = 2 * causal_pairs(c) * c.d
    name = "naive-causal-ideal"
    return Row(name, "Idealized lower-triangular naive, causal", CAUSAL, name, (
        _qk(c, "1. GEMM (QK^T), lower triangle", gemm, tri, "lower triangle of S, Nq*Nk/2 elements"),
        Kernel("2. Softmax, lower triangle", SOFTMAX_FLOPS_PER_ELEMENT * causal_pairs(c), "elementwise", (
            read("S", tri, "lower triangle of S read back"),
            write("P", tri, "lower triangle of P, Nq*Nk/2 elements"),
        )),
        _pv(c, "3. GEMM (PV), lower triangle", gemm, tri, "lower triangle of P read back"),
    ), ("each triangle of S and P is exactly Nq*Nk/2 elements (diagonal and ragged tile fill ignored)",
        "an idealisation: no eager kernel stores a packed triangle (spec §4.2)"))


def naive_causal_eager(c: Config) -> Row:
    """An eager PyTorch-style causal baseline: full S, an explicit bool mask applied by a separate
    masked_fill kernel, then softmax and PV. A *different* baseline from the idealised one (spec §4.2)."""
    s = c.nq * c.nk * c.b
    mask = c.nq * c.nk  # torch.bool: one byte per element
    gemm = 2 * c.nq * c.nk * c.d
    return Row("naive-causal-eager", "Eager naive, causal (bool mask + masked_fill)", CAUSAL,
               "naive-causal-eager", (
        _qk(c, "1. GEMM (QK^T)", gemm, s, "full S [Nq, Nk], the future included"),
        Kernel("2. masked_fill", c.nq * c.nk, "elementwise", (
            read("S", s, "S [Nq, Nk]"),
            read("mask", mask, "bool mask [Nq, Nk], 1 B per element"),
            write("S'", s, "S' = S.masked_fill(~mask, -inf) [Nq, Nk], out of place"),
        )),
        Kernel("3. Softmax", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            read("S'", s, "S' [Nq, Nk]"),
            write("P", s, "P [Nq, Nk]"),
        )),
        _pv(c, "4. GEMM (PV)", gemm, s, "P [Nq, Nk], zeros above the diagonal still read"),
    ), ("the mask is a torch.bool [Nq, Nk] tensor (1 B per element), built once and cached, so building "
        "it is not counted",
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
            kv_heads: int | None = None, lse: bool = False, rows=SPEC_ROWS) -> Traffic:
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

    Returns
    -------
    Traffic: ``t["naive"].total`` is 138,412,032 at the defaults; ``t.ratio("naive", "flash")`` is 2.0.
    """
    return ledgers(BUILDERS, rows, n, nq, nk, d=d, dtype=dtype, block_q=block_q, block_kv=block_kv,
                   batch=batch, heads=heads, kv_heads=kv_heads, lse=lse)


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
