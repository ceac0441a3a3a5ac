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

Serving layouts (at the end of the file): `packed`, a packed variable-length prefill, is the line-by-line
sum of its sequences' dense ledgers plus the varlen kernel's work-list reads; `paged`, one split-KV
decode / chunked-prefill step against a paged (or dense) KV cache, whole call: block-table reads, K/V
valid rows once per kv head, split partials, and the allocated-but-unread tail of each last page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnscope.errors import InputError, choice, expect, positive_int
from attnscope.model.flops import visible_pairs
from attnscope.model.tiles import Grid, floor_sum

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


@dataclass(frozen=True)
class Kernel:
    """One kernel launch (per batch-head) with its transfers and its FLOPs.

    ``unit`` says which pipe does the FLOPs: "tensor" (GEMMs on Tensor Cores) or "elementwise"
    (CUDA cores / SFUs); the roofline picks the matching peak.
    """

    name: str
    flops: int
    unit: str
    transfers: tuple[Transfer, ...]

    @property
    def reads(self) -> int:
        return sum(t.nbytes for t in self.transfers if t.direction == "read")

    @property
    def writes(self) -> int:
        return sum(t.nbytes for t in self.transfers if t.direction == "write")

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def to_json(self) -> dict:
        return {"kernel": self.name, "flops": self.flops, "unit": self.unit, "reads": self.reads,
                "writes": self.writes, "total": self.total,
                "transfers": [t.to_json() for t in self.transfers]}


@dataclass(frozen=True)
class Row:
    """One configuration: its kernels, its masking condition, and the assumptions it rests on."""

    name: str
    label: str
    condition: str
    baseline: str  # the matched baseline of the same condition (itself for a baseline)
    kernels: tuple[Kernel, ...]
    assumptions: tuple[str, ...] = ()

    @property
    def reads(self) -> int:
        return sum(k.reads for k in self.kernels)

    @property
    def writes(self) -> int:
        return sum(k.writes for k in self.kernels)

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)


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
def _r(tensor: str, nbytes: int, what: str) -> Transfer:
    return Transfer(tensor, "read", nbytes, what)


def _w(tensor: str, nbytes: int, what: str) -> Transfer:
    return Transfer(tensor, "write", nbytes, what)


def naive(c: Config) -> Row:
    """The explicit 3-kernel materialising baseline (spec §1.1): S and P written and read in full."""
    q = c.nq * c.d * c.b           # Q, O: [Nq, d]
    kv = c.nk * c.d * c.b          # K, V: [Nk, d]
    s = c.nq * c.nk * c.b          # S, P: [Nq, Nk], input dtype
    gemm = 2 * c.nq * c.nk * c.d   # one [Nq, d] x [d, Nk] (or [Nq, Nk] x [Nk, d]) product
    return Row("naive", "Naive, unmasked (3 kernels)", UNMASKED, "naive", (
        Kernel("1. GEMM (QK^T)", gemm, "tensor", (
            _r("Q", q, "Q [Nq, d]"),
            _r("K", kv, "K [Nk, d]"),
            _w("S", s, "S = QK^T/sqrt(d) [Nq, Nk], materialised"),
        )),
        Kernel("2. Softmax", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            _r("S", s, "S [Nq, Nk] read back"),
            _w("P", s, "P = softmax(S) [Nq, Nk], materialised"),
        )),
        Kernel("3. GEMM (PV)", gemm, "tensor", (
            _r("P", s, "P [Nq, Nk] read back"),
            _r("V", kv, "V [Nk, d]"),
            _w("O", q, "O [Nq, d]"),
        )),
    ), ("S and P are written to HBM in the input dtype and read back once each (no L2 reuse)",))


def _causal_pairs(c: Config) -> int:
    """Scores a causal kernel computes, by the FLOP convention: Nq*Nk/2 when Nq == Nk (the flash-attn
    and Triton benchmark convention, DESIGN.md), else the exact count of permitted (row, key) pairs."""
    if c.nq == c.nk:
        return c.nq * c.nk // 2
    # Row r (1-based) sees keys 1..r + off with off = Nk - Nq; the last row sees all Nk keys, and rows with
    # r + off <= 0 see none. The counts r + off run over max(1, 1 + off) .. Nk: an arithmetic series.
    first = max(1, 1 + c.nk - c.nq)
    return (first + c.nk) * (c.nk - first + 1) // 2


def _flash(c: Config, causal: bool) -> Row:
    """FA-2 forward (spec §2.2, §4.1-4.2): Q read once, O written once, K and V read once per query
    tile that loads them -- exactly the rows of the KV tiles model/tiles.py says it loads."""
    g = c.grid(causal)
    q = c.nq * c.d * c.b
    kv_rows = g.kv_rows_total()  # K rows (= V rows) streamed
    pairs = _causal_pairs(c) if causal else c.nq * c.nk
    passes = f"{kv_rows / c.nk:g} passes over K" if kv_rows else "no KV tile loaded"
    transfers = [
        _r("Q", q, f"Q [Nq, d], each of the {g.n_q_tiles} query tiles loads its rows once"),
        _r("K", kv_rows * c.d * c.b, f"K rows of every loaded KV tile, summed over query tiles ({passes})"),
        _r("V", kv_rows * c.d * c.b, "V, the same rows as K"),
        _w("O", q, "O [Nq, d], written once per query tile"),
    ]
    if c.lse:
        transfers.append(_w("LSE", c.nq * STAT_BYTES, "logsumexp, one FP32 per query row (spec §3.3)"))
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


def flash(c: Config) -> Row:
    """FlashAttention-2 forward, unmasked: KV reads are ceil(Nq/B_r) x (K + V bytes)."""
    return _flash(c, causal=False)


def flash_causal(c: Config) -> Row:
    """FlashAttention-2 forward, causal, with the skip bound, exact per query tile."""
    return _flash(c, causal=True)


def naive_causal_ideal(c: Config) -> Row:
    """The spec's idealised lower-triangular baseline (§4.2): only the lower triangle of S and P is
    stored, each triangle exactly Nq*Nk/2 elements (diagonal and ragged fill ignored)."""
    q = c.nq * c.d * c.b
    kv = c.nk * c.d * c.b
    tri = -(-c.nq * c.nk * c.b // 2)  # half of Nq*Nk elements; a half byte (fp8, odd Nq*Nk) rounds up
    gemm = 2 * _causal_pairs(c) * c.d
    name = "naive-causal-ideal"
    return Row(name, "Idealized lower-triangular naive, causal", CAUSAL, name, (
        Kernel("1. GEMM (QK^T), lower triangle", gemm, "tensor", (
            _r("Q", q, "Q [Nq, d]"),
            _r("K", kv, "K [Nk, d]"),
            _w("S", tri, "lower triangle of S, Nq*Nk/2 elements"),
        )),
        Kernel("2. Softmax, lower triangle", SOFTMAX_FLOPS_PER_ELEMENT * _causal_pairs(c), "elementwise", (
            _r("S", tri, "lower triangle of S read back"),
            _w("P", tri, "lower triangle of P, Nq*Nk/2 elements"),
        )),
        Kernel("3. GEMM (PV), lower triangle", gemm, "tensor", (
            _r("P", tri, "lower triangle of P read back"),
            _r("V", kv, "V [Nk, d]"),
            _w("O", q, "O [Nq, d]"),
        )),
    ), ("each triangle of S and P is exactly Nq*Nk/2 elements (diagonal and ragged tile fill ignored)",
        "an idealisation: no eager kernel stores a packed triangle (spec §4.2)"))


def naive_causal_eager(c: Config) -> Row:
    """An eager PyTorch-style causal baseline: full S, an explicit bool mask applied by a separate
    masked_fill kernel, then softmax and PV. A *different* baseline from the idealised one (spec §4.2)."""
    q = c.nq * c.d * c.b
    kv = c.nk * c.d * c.b
    s = c.nq * c.nk * c.b
    mask = c.nq * c.nk  # torch.bool: one byte per element
    gemm = 2 * c.nq * c.nk * c.d
    return Row("naive-causal-eager", "Eager naive, causal (bool mask + masked_fill)", CAUSAL,
               "naive-causal-eager", (
        Kernel("1. GEMM (QK^T)", gemm, "tensor", (
            _r("Q", q, "Q [Nq, d]"),
            _r("K", kv, "K [Nk, d]"),
            _w("S", s, "full S [Nq, Nk], the future included"),
        )),
        Kernel("2. masked_fill", c.nq * c.nk, "elementwise", (
            _r("S", s, "S [Nq, Nk]"),
            _r("mask", mask, "bool mask [Nq, Nk], 1 B per element"),
            _w("S'", s, "S' = S.masked_fill(~mask, -inf) [Nq, Nk], out of place"),
        )),
        Kernel("3. Softmax", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            _r("S'", s, "S' [Nq, Nk]"),
            _w("P", s, "P [Nq, Nk]"),
        )),
        Kernel("4. GEMM (PV)", gemm, "tensor", (
            _r("P", s, "P [Nq, Nk], zeros above the diagonal still read"),
            _r("V", kv, "V [Nk, d]"),
            _w("O", q, "O [Nq, d]"),
        )),
    ), ("the mask is a torch.bool [Nq, Nk] tensor (1 B per element), built once and cached, so building "
        "it is not counted",
        "masked_fill is a separate, out-of-place kernel: it reads S and the mask and writes S'",
        "the mask is broadcast over batch and heads and read once per (batch, head) (no L2 reuse)",
        "the GEMMs and softmax run on the full [Nq, Nk] matrices; nothing is skipped",
        "a different baseline from the idealised triangle: the spec quotes no ratio against it (§4.2)"))


_BUILDERS = {"naive": naive, "flash": flash, "naive-causal-ideal": naive_causal_ideal,
             "flash-causal": flash_causal, "naive-causal-eager": naive_causal_eager}


# --- the result -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Traffic:
    """Traffic of several configurations of one shape. Bytes per (batch, query head)."""

    config: Config
    rows: dict[str, Row] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Row:
        return self.rows[choice("row", name, self.rows)]

    def ratio(self, baseline: str, other: str) -> float:
        """``baseline.total / other.total``: how many times fewer bytes ``other`` moves.

        Refused across masking conditions: such a ratio mixes the masking change with the fusion change
        and cannot be attributed to either (spec §4.2).
        """
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
        g = self.config.grid(causal)
        return g.kv_rows_total() / self.config.nk

    def to_json(self) -> dict:
        bh = self.config.batch_heads
        rows = []
        for r in self.rows.values():
            d = {"name": r.name, "label": r.label, "condition": r.condition, "baseline": r.baseline,
                 "reads": r.reads, "writes": r.writes, "total": r.total, "flops": r.flops}
            ratio = self.matched_ratio(r.name)
            d["ratio"] = ratio
            if bh != 1:
                d.update(reads_all=r.reads * bh, writes_all=r.writes * bh, total_all=r.total * bh)
            d["assumptions"] = list(r.assumptions)
            d["items"] = [k.to_json() for k in r.kernels]
            rows.append(d)
        params = self.config.to_json()
        params["batch_heads"] = bh
        params["per"] = "one (batch, query head); *_all fields are the whole call"
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
    return _ledgers(_BUILDERS, rows, n, nq, nk, d=d, dtype=dtype, block_q=block_q, block_kv=block_kv,
                    batch=batch, heads=heads, kv_heads=kv_heads, lse=lse)


def _ledgers(builders: dict, rows, n, nq, nk, **config) -> Traffic:
    """The rows (keys of ``builders``) for one shape: ``nq``/``nk`` default to ``n``."""
    nq = n if nq is None else nq
    nk = n if nk is None else nk
    expect(nq is not None and nk is not None, "n", "a sequence length (or both nq and nk)", n)
    cfg = Config(nq=nq, nk=nk, **config)
    return Traffic(cfg, {name: builders[name](cfg) for name in _row_names(rows, builders)})


def _row_names(rows, valid) -> list[str]:
    names = list(rows)
    expect(len(names) > 0, "rows", "at least one of " + ", ".join(valid), rows)
    return [choice("row", name, valid) for name in names]


# --- serving layouts: a packed batch of prompts, and a step against a paged KV cache ----------------
# A packed ledger is, line by line, the sum of the dense ledgers (above) of its sequences.
def _lengths(name: str, values) -> tuple[int, ...]:
    """Validate a list of non-negative integer lengths (bools refused)."""
    try:
        vals = tuple(values)
    except TypeError:
        raise InputError(f"{name}: expected a list of non-negative integers, got {values!r}") from None
    expect(len(vals) > 0, name, "at least one length", list(vals))
    for v in vals:
        expect(isinstance(v, int) and not isinstance(v, bool) and v >= 0, name,
               "a list of non-negative integers", list(vals))
    return vals


def _head(what: str) -> str:
    """A ledger line's text up to its first comma outside brackets ("Q [Nq, d], each ..." -> "Q [Nq, d]")."""
    depth = 0
    for i, ch in enumerate(what):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            return what[:i]
    return what


def _sum_rows(rows: list[Row], n: int) -> Row:
    """Line-by-line sum of rows with the same structure (one row per sequence of a packed batch)."""
    first = rows[0]
    kernels = []
    for ki, k in enumerate(first.kernels):
        transfers = tuple(
            Transfer(t.tensor, t.direction, sum(r.kernels[ki].transfers[ti].nbytes for r in rows),
                     f"{_head(t.what)}, summed over {n} sequences")
            for ti, t in enumerate(k.transfers))
        kernels.append(Kernel(k.name, sum(r.kernels[ki].flops for r in rows), k.unit, transfers))
    return Row(first.name, first.label + ", packed", first.condition, first.baseline, tuple(kernels),
               first.assumptions)


def _add_bytes(row: Row, extra: dict[tuple[str, str], int]) -> Row:
    """Add bytes to the first transfer of each (tensor, direction) in ``extra``."""
    extra = dict(extra)
    kernels = []
    for k in row.kernels:
        ts = []
        for t in k.transfers:
            add = extra.pop((t.tensor, t.direction), 0)
            ts.append(Transfer(t.tensor, t.direction, t.nbytes + add, t.what) if add else t)
        kernels.append(Kernel(k.name, k.flops, k.unit, tuple(ts)))
    assert not extra, f"no transfer for {extra}"  # internal: every row reads Q and writes O
    return Row(row.name, row.label, row.condition, row.baseline, tuple(kernels), row.assumptions)


#: Per work item of the varlen kernel, each query head's program reads its (sequence, query tile) pair
#: and the four cu_seqlens values bounding its sequence: 6 int32.
VARLEN_ITEM_BYTES = 6 * 4


@dataclass(frozen=True)
class Packed:
    """Traffic of one packed variable-length prefill call. Bytes per query head, summed over sequences
    (``*_all`` in JSON: times the query heads)."""

    lengths_q: tuple[int, ...]
    lengths_k: tuple[int, ...]
    config: Config  # d, dtype, tiles, heads, lse; nq / nk are the longest lengths
    rows: dict[str, Row]
    work_items: int  # (sequence, query tile) pairs: sum of ceil(Nq_s / B_r)

    def __getitem__(self, name: str) -> Row:
        return self.rows[choice("row", name, self.rows)]

    def to_json(self) -> dict:
        c, h = self.config, self.config.heads
        rows = []
        for r in self.rows.values():
            base = self.rows.get(r.baseline)
            rows.append({"name": r.name, "label": r.label, "condition": r.condition, "baseline": r.baseline,
                         "reads": r.reads, "writes": r.writes, "total": r.total, "flops": r.flops,
                         "ratio": base.total / r.total if base is not None else None,
                         "reads_all": r.reads * h, "writes_all": r.writes * h, "total_all": r.total * h,
                         "assumptions": list(r.assumptions), "items": [k.to_json() for k in r.kernels]})
        return {"params": {"layout": "packed", "lengths_q": list(self.lengths_q),
                           "lengths_k": list(self.lengths_k), "sequences": len(self.lengths_q),
                           "total_q": sum(self.lengths_q), "total_k": sum(self.lengths_k),
                           "work_items": self.work_items, "d": c.d, "dtype": c.dtype,
                           "bytes_per_element": c.b, "block_q": c.block_q, "block_kv": c.block_kv,
                           "heads": c.heads, "kv_heads": c.kv_heads, "lse": c.lse,
                           "per": "one query head, summed over the sequences; *_all fields are the "
                                  "whole call"},
                "rows": rows}


def packed(lengths_q, lengths_k=None, d: int = 128, dtype: str = "fp16", block_q: int = 128,
           block_kv: int = 64, *, heads: int = 1, kv_heads: int | None = None, lse: bool = False,
           rows=SPEC_ROWS, tma: bool = True) -> Packed:
    """Logical HBM bytes of a packed variable-length prefill (`flash_attention_varlen`), per query head.

    Each sequence with queries and keys contributes its dense ledger (``traffic`` with Nq_s, Nk_s; tiles
    from model/tiles.py, causal bottom-right per sequence); the packed rows are those ledgers summed line
    by line. A sequence with queries but no keys reads Q and writes O (zeros; and the LSE) and nothing
    else; one with no queries moves nothing. The flash rows add the varlen kernel's own metadata: per
    work item (sequence, query tile) 6 int32 (the item and the sequence's cu_seqlens bounds); and with
    ``tma`` (the kernel's default for aligned K/V) the rows its ragged K/V tiles read past a sequence's end
    (a TMA tile is whole up to the end of the packed tensor; the kernel discards those rows): for each
    query tile that loads the sequence's ragged last KV tile, ``min(k0 + T_c B_c, total_k) - (k0 + Nk)``
    rows of K and of V. Cost: one dense ledger per sequence (a loop over the B sequences, never over
    tokens) and a closed form per sequence for the ragged-tile count.

    Parameters
    ----------
    lengths_q: query lengths of the B sequences (>= 0), in packing order. lengths_k: key lengths
        (default: lengths_q).
    d, dtype, block_q, block_kv, heads, kv_heads, lse, rows: as `traffic`.
    tma: K/V by TMA (True, the kernel's default for 16-byte aligned K/V) or by predicated loads (False:
        no rows past a sequence are read).
    """
    lq = _lengths("lengths_q", lengths_q)
    lk = lq if lengths_k is None else _lengths("lengths_k", lengths_k)
    expect(len(lk) == len(lq), "lengths_k", f"{len(lq)} lengths (one per sequence, as lengths_q)", list(lk))
    full = [(a, b) for a, b in zip(lq, lk, strict=True) if a > 0 and b > 0]
    expect(len(full) > 0, "lengths_q", "at least one sequence with Nq >= 1 and Nk >= 1",
           f"lengths_q {list(lq)}, lengths_k {list(lk)}")
    names = _row_names(rows, ROW_NAMES)
    cfg = Config(nq=max(lq), nk=max(lk), d=d, dtype=dtype, block_q=block_q, block_kv=block_kv, heads=heads,
                 kv_heads=kv_heads, lse=lse)
    no_keys = sum(a for a, b in zip(lq, lk, strict=True) if b == 0)  # query rows with no key at all
    items = sum(-(-a // block_q) for a in lq)
    out = {}
    for name in names:
        per_seq = [_BUILDERS[name](Config(nq=a, nk=b, d=d, dtype=dtype, block_q=block_q, block_kv=block_kv,
                                          heads=cfg.heads, kv_heads=cfg.kv_heads, lse=lse)) for a, b in full]
        row = _sum_rows(per_seq, len(lq))
        if no_keys:
            extra = {("Q", "read"): no_keys * d * cfg.b, ("O", "write"): no_keys * d * cfg.b}
            if name.startswith("flash") and lse:
                extra[("LSE", "write")] = no_keys * STAT_BYTES
            row = _add_bytes(row, extra)
        if name.startswith("flash"):
            k = row.kernels[0]
            extra = [_r("meta", items * VARLEN_ITEM_BYTES,
                        f"work list + cu_seqlens: {items} (sequence, query tile) items x 6 int32")]
            if tma:
                over = _ragged_overread_rows(lq, lk, block_q, block_kv, name == "flash-causal")
                extra += [_r("K", over * d * cfg.b, f"K rows past the sequence ends read by ragged TMA tiles "
                                                    f"and discarded ({over} rows)"),
                          _r("V", over * d * cfg.b, "V, the same rows")]
            row = Row(row.name, row.label, row.condition, row.baseline,
                      (Kernel(k.name, k.flops, k.unit, k.transfers + tuple(extra)),),
                      row.assumptions + ("building the work list on the device (O(B) int32, once per call, "
                                         "shared by all heads) and the grid's idle items are not counted",))
        out[name] = row
    return Packed(lq, lk, cfg, out, items)


def _ragged_overread_rows(lq, lk, block_q: int, block_kv: int, causal: bool) -> int:
    """K rows (= V rows) that TMA tiles read past their sequence's end, per query head, summed over the
    sequences (closed form per sequence). Sequence s's last KV tile is ragged when Nk % B_c != 0; every
    query tile that loads it (all T_r unmasked; causal, those whose last row r1 satisfies
    ``r1 + Nk - Nq > (T_c - 1) B_c``: a suffix of the tiles, always including the last) reads
    ``min(k0 + T_c B_c, total_k) - (k0 + Nk)`` extra rows (zeros past the tensor's end are not read)."""
    total_k = sum(lk)
    k0 = 0
    rows = 0
    for nq, nk in zip(lq, lk, strict=True):
        if nq and nk and nk % block_kv:
            t_r, t_c = -(-nq // block_q), -(-nk // block_kv)
            if causal:
                # tiles i < T_r (r1 = i B_r) load tile T_c iff i B_r > (T_c - 1) B_c - (Nk - Nq) = x
                x = (t_c - 1) * block_kv - (nk - nq)
                n_tiles = max(0, t_r - 1 - max(x // block_q, 0)) + 1 if x >= 0 else t_r
            else:
                n_tiles = t_r
            rows += n_tiles * (min(k0 + t_c * block_kv, total_k) - (k0 + nk))
        k0 += nk
    return rows


@dataclass(frozen=True)
class Paged:
    """Traffic of one decode / chunked-prefill step against a KV cache, the whole call (all heads).

    ``row`` is the ledger (its total is what moves); ``tail`` are bytes of K/V allocated to the
    sequences but never read (the unused end of each last page, or of a dense cache's rows)."""

    cache_lens: tuple[int, ...]
    nq: int
    page_size: int | None
    capacity: int | None
    num_splits: int
    config: Config
    row: Row
    tail: int
    pages: int  # pages holding keys (paged) or 0

    def to_json(self) -> dict:
        c, r = self.config, self.row
        return {"params": {"layout": "paged" if self.page_size else "dense-cache",
                           "cache_lens": list(self.cache_lens), "nq": self.nq, "page_size": self.page_size,
                           "capacity": self.capacity, "num_splits": self.num_splits, "pages": self.pages,
                           "d": c.d, "dtype": c.dtype, "bytes_per_element": c.b, "block_kv": c.block_kv,
                           "heads": c.heads, "kv_heads": c.kv_heads, "lse": c.lse, "per": "the whole call"},
                "rows": [{"name": r.name, "label": r.label, "reads": r.reads, "writes": r.writes,
                          "total": r.total, "flops": r.flops, "allocated_not_read": self.tail,
                          "assumptions": list(r.assumptions), "items": [k.to_json() for k in r.kernels]}]}


def paged(cache_lens, page_size: int | None = None, *, nq: int = 1, d: int = 128, dtype: str = "bf16",
          heads: int = 32, kv_heads: int | None = None, num_splits: int = 1, block_kv: int = 128,
          capacity: int | None = None, lse: bool = False) -> Paged:
    """Logical HBM bytes of one split-KV decode / chunked-prefill step (`flash_decode`), whole call.

    The kernel (Flash-Decoding, kernels/decode.py) runs one program per (sequence, kv head, split); each
    streams its split's keys once for all ``heads / kv_heads`` query heads of its group and all ``nq``
    query rows (the last ``nq`` positions of the sequence, which ``cache_lens`` counts). Lines:

    - Q: read by every split's program: ``B * Hq * nq * d * S`` elements;
    - cache_seqlens: one int32 per program;
    - block table (paged only): per kv head, one int32 per (KV block of ``block_kv`` keys, page) pair the
      keys touch: ``ceil(len / min(page_size, block_kv))`` per sequence (both powers of two, so they nest);
    - K and V: only the valid rows, once per kv head: ``Hkv * sum(len) * d`` each (masked loads);
    - S = 1: O (and LSE) written once; S > 1: fp32 partials O_s [nq, d] and lse_s per (sequence, query
      head, split) written by phase 1 and read by the merge, which writes O (and LSE).

    ``tail`` (not in the total): K/V bytes allocated but not read -- the end of each sequence's last page
    (``ceil(len / P) * P - len`` rows), or for a dense cache (``page_size`` None) ``capacity - len`` rows.
    ``flops``: 4 * Hq * d * (visible pairs), bottom-right causal among the nq queries.
    """
    lens = _lengths("cache_lens", cache_lens)
    positive_int("nq", nq)
    positive_int("num_splits", num_splits)
    positive_int("block_kv", block_kv)
    if page_size is not None:
        positive_int("page_size", page_size)
        expect(page_size & (page_size - 1) == 0, "page_size", "a power of two", page_size)
        expect(block_kv & (block_kv - 1) == 0, "block_kv", "a power of two (pages and blocks nest)", block_kv)
        expect(capacity is None, "capacity", "None with a paged cache (pages size it)", capacity)
    else:
        capacity = max(lens) if capacity is None else positive_int("capacity", capacity)
        expect(capacity >= max(lens), "capacity", f">= the longest cache length ({max(lens)})", capacity)
    expect(all(n >= nq for n in lens), "cache_lens", f"lengths >= nq ({nq}): the queries are the last nq "
           "positions of each sequence and are counted in it", list(lens))
    cfg = Config(nq=nq, nk=max(max(lens), 1), d=d, dtype=dtype, block_kv=block_kv, heads=heads,
                 kv_heads=kv_heads, lse=lse)
    B, hq, hkv, b, S = len(lens), cfg.heads, cfg.kv_heads, cfg.b, num_splits
    keys = sum(lens)
    rows_q = B * hq * nq
    q_bytes = rows_q * d * b
    transfers = [
        _r("Q", q_bytes * S, f"Q [B, Hq, {nq}, d], read by each of the {S} split program(s) of its group"),
        _r("cache_seqlens", B * hkv * S * 4, "one int32 per (sequence, kv head, split) program"),
    ]
    pages = 0
    if page_size is not None:
        pages = sum(-(-n // page_size) for n in lens)
        unit = min(page_size, block_kv)
        entries = sum(-(-n // unit) for n in lens)
        transfers.append(_r("block_table", hkv * entries * 4,
                            f"int32 page ids: {entries} (block, page) pairs per kv head, x {hkv} kv heads"))
        tail_rows = pages * page_size - keys
    else:
        tail_rows = B * capacity - keys
    kv = hkv * keys * d * b
    transfers += [_r("K", kv, "valid K rows, once per kv head (the GQA group shares them)"),
                  _r("V", kv, "valid V rows, the same")]
    part = rows_q * S * (d + 1) * STAT_BYTES  # O_s [d] and lse_s, fp32, per (row, split)
    out = [_w("O", q_bytes, f"O [B, Hq, {nq}, d]")]
    if lse:
        out.append(_w("LSE", rows_q * STAT_BYTES, "logsumexp, one FP32 per query row"))
    pairs = sum(visible_pairs(nq, n, True) for n in lens)  # n >= nq >= 1
    flops = 4 * hq * d * pairs
    if S == 1:
        kernels = (Kernel("split-KV attention", flops, "tensor", tuple(transfers + out)),)
    else:
        kernels = (Kernel("phase 1: split-KV attention", flops, "tensor",
                          tuple(transfers + [_w("partials", part, f"O_s and lse_s (fp32) of {S} splits")])),
                   Kernel("phase 2: logsumexp merge", 0, "elementwise",
                          tuple([_r("partials", part, "O_s and lse_s read back")] + out)))
    assumptions = ("K/V loads are masked to the valid rows: the unused end of the last page is allocated "
                   "but never read (reported as allocated_not_read, outside the total)",
                   "every split program reads its group's Q rows; empty splits still write their partials",
                   "the nq queries of a sequence share one program per (kv head, split): K/V read once")
    label = f"{'paged' if page_size else 'dense'} KV cache, nq = {nq}, {S} split(s)"
    row = Row("paged" if page_size else "dense-cache", label, CAUSAL, "paged" if page_size else "dense-cache",
              kernels, assumptions)
    return Paged(lens, nq, page_size, capacity if page_size is None else None, S, cfg, row,
                 2 * hkv * tail_rows * d * b, pages)

# --- the backward pass -----------------------------------------------------------------------------
# Rows of `backward_traffic`. Naive: what autograd of the eager forward keeps (softmax saves its output P;
# the eager causal path also keeps its bool mask) and the kernels its backward launches. FA-2 (Dao 2023,
# Algorithm 2; kernels/bwd.py): nothing N x N is kept; the backward reads Q, K, V, O, dO, LSE and D.
BACKWARD_ROWS = ("naive-backward", "flash-backward", "flash-backward-det", "naive-causal-eager-backward",
                 "flash-causal-backward", "flash-causal-backward-det")



def _loaded_pairs(g: Grid) -> tuple[int, int]:
    """``(pairs, full_rows)``: (query tile, KV tile) pairs the FA-2 grid loads -- sum over query tiles of
    ``n_loaded`` of `Grid.kv_bounds` -- and how many query tiles load every KV tile, in closed form.

    Causal, query tiles i = 1 .. T_r - 1 end at row B_r i: n_loaded(i) = clamp(ceil((B_r i + off) / B_c),
    0, T_c). The run of i where it is neither 0 nor T_c is a floor sum; the last tile is added directly."""
    tr, tc, bq, bc, off = g.n_q_tiles, g.n_kv_tiles, g.block_q, g.block_kv, g.offset
    if not g.causal:
        return tr * tc, tr
    last = g.kv_bounds(tr)[1]
    pairs, full = last, int(last == tc)
    m = tr - 1
    if m <= 0:
        return pairs, full
    i0 = max(1, -off // bq + 1)                          # first i with B_r i + off > 0
    i1 = max(i0, (bc * (tc - 1) - off) // bq + 1)        # first i loading every KV tile
    lo, hi = i0, min(i1 - 1, m)
    if hi >= lo:                                         # ceil(x / B_c) = floor((x + B_c - 1) / B_c)
        pairs += floor_sum(hi - lo + 1, bc, bq, bq * lo + off + bc - 1)
    if m >= i1:
        pairs += (m - i1 + 1) * tc
        full += m - i1 + 1
    return pairs, full


def _naive_backward(c: Config, causal: bool) -> Row:
    """Autograd of the eager forward: dP = dO V^T, dV = P^T dO, softmax backward, dQ = dS K, dK = dS^T Q
    (the scale folded into the GEMMs); causal eager adds the masked_fill backward, which reads the mask."""
    q = c.nq * c.d * c.b
    kv = c.nk * c.d * c.b
    s = c.nq * c.nk * c.b
    gemm = 2 * c.nq * c.nk * c.d
    kernels = [
        Kernel("1. GEMM dP = dO V^T", gemm, "tensor", (
            _r("dO", q, "dO [Nq, d]"), _r("V", kv, "V [Nk, d], saved by the forward"),
            _w("dP", s, "dP [Nq, Nk], materialised"))),
        Kernel("2. GEMM dV = P^T dO", gemm, "tensor", (
            _r("P", s, "P [Nq, Nk], saved by the forward (softmax keeps its output)"),
            _r("dO", q, "dO [Nq, d]"), _w("dV", kv, "dV [Nk, d]"))),
        Kernel("3. Softmax backward", SOFTMAX_FLOPS_PER_ELEMENT * c.nq * c.nk, "elementwise", (
            _r("P", s, "P [Nq, Nk] read again"), _r("dP", s, "dP [Nq, Nk] read back"),
            _w("dS", s, "dS = P * (dP - rowsum(dP * P)) [Nq, Nk]"))),
    ]
    if causal:
        kernels.append(Kernel("4. masked_fill backward", c.nq * c.nk, "elementwise", (
            _r("dS", s, "dS [Nq, Nk]"), _r("mask", c.nq * c.nk, "bool mask [Nq, Nk], kept by the forward"),
            _w("dS'", s, "dS' = dS.masked_fill(~mask, 0) [Nq, Nk]"))))
    n = len(kernels)
    kernels += [
        Kernel(f"{n + 1}. GEMM dQ = dS K", gemm, "tensor", (
            _r("dS", s, "dS [Nq, Nk]"), _r("K", kv, "K [Nk, d], saved by the forward"),
            _w("dQ", q, "dQ [Nq, d]"))),
        Kernel(f"{n + 2}. GEMM dK = dS^T Q", gemm, "tensor", (
            _r("dS", s, "dS [Nq, Nk] read again"), _r("Q", q, "Q [Nq, d], saved by the forward"),
            _w("dK", kv, "dK [Nk, d]"))),
    ]
    name = "naive-causal-eager-backward" if causal else "naive-backward"
    label = "Naive backward, causal eager (mask kept)" if causal else "Naive backward, unmasked"
    return Row(name, label, CAUSAL if causal else UNMASKED, name, tuple(kernels), (
        "the forward keeps P [Nq, Nk] (softmax saves its output; S is freed) and, causal eager, the mask",
        "every [Nq, Nk] intermediate is written once and read back once per consumer (no L2 reuse)",
        "GQA: the K/V gradients' reduction over the group is not counted"))


def _flash_backward(c: Config, causal: bool, deterministic: bool) -> Row:
    """FA-2 backward (kernels/bwd.py), per (batch, query head). dK/dV programs per KV tile reuse the
    forward's tile pairs (loaded iff the forward loads them), reading Q, dO, LSE, D per pair; dQ either
    by fp32 atomics per pair (read-modify-write) or by a separate pass that re-reads K and V."""
    g = c.grid(causal)
    pairs, full = _loaded_pairs(g)
    last_rows = c.nq - (g.n_q_tiles - 1) * c.block_q
    last_cols = c.nk - (g.n_kv_tiles - 1) * c.block_kv
    q_rows = c.block_q * pairs - (c.block_q - last_rows) * g.kv_bounds(g.n_q_tiles)[1]  # Q rows read
    kv_rows = c.block_kv * pairs - (c.block_kv - last_cols) * full  # K rows the dQ pass reads
    share = c.heads // c.kv_heads  # a kv head's program serves its group of query heads
    kv = -(-c.nk * c.d * c.b // share)  # K (or V, dK, dV) bytes per query head, rounded up
    q = c.nq * c.d * c.b
    pair_flops = 2 * (_causal_pairs(c) if causal else c.nq * c.nk) * c.d  # one GEMM over visible pairs
    kernels = [
        Kernel("1. preprocess D = rowsum(dO * O)", 2 * c.nq * c.d, "elementwise", (
            _r("O", q, "O [Nq, d]"), _r("dO", q, "dO [Nq, d]"),
            _w("D", c.nq * STAT_BYTES, "D, FP32 per row"))),
        Kernel("2. LSE -> log2 domain", c.nq, "elementwise", (
            _r("LSE", c.nq * STAT_BYTES, "LSE, FP32 per row"),
            _w("LSE2", c.nq * STAT_BYTES, "LSE * log2(e), FP32 per row"))),
    ]
    t = [_r("K", kv, "K [Nk, d], read once per kv head (shared by the group)"),
         _r("V", kv, "V [Nk, d], read once per kv head"),
         _r("Q", q_rows * c.d * c.b, f"Q rows of every loaded tile pair ({q_rows / c.nq:g} passes over Q)"),
         _r("dO", q_rows * c.d * c.b, "dO, the same rows as Q"),
         _r("LSE2", q_rows * STAT_BYTES, "LSE2, the same rows"),
         _r("D", q_rows * STAT_BYTES, "D, the same rows"),
         _w("dK", kv, "dK [Nk, d], reduced over the group in registers"),
         _w("dV", kv, "dV [Nk, d]")]
    if deterministic:
        kernels.append(Kernel("3. dK/dV (per KV tile)", 4 * pair_flops, "tensor", tuple(t)))
        kernels.append(Kernel("4. dQ pass (per query tile)", 3 * pair_flops, "tensor", (
            _r("Q", q, "Q [Nq, d]"), _r("dO", q, "dO [Nq, d]"),
            _r("LSE2", c.nq * STAT_BYTES, "LSE2"), _r("D", c.nq * STAT_BYTES, "D"),
            _r("K", kv_rows * c.d * c.b, f"K rows of every loaded KV tile ({kv_rows / c.nk:g} passes)"),
            _r("V", kv_rows * c.d * c.b, "V, the same rows as K"),
            _w("dQ", q, "dQ [Nq, d]"))))
    else:
        acc = c.nq * c.d * STAT_BYTES
        kernels.insert(0, Kernel("0. zero the FP32 dQ accumulator", 0, "elementwise", (
            _w("dQacc", acc, "dQ accumulator [Nq, d], FP32"),)))
        t += [_r("dQacc", q_rows * c.d * STAT_BYTES, "atomic add: FP32 dQ rows read per loaded tile pair"),
              _w("dQacc", q_rows * c.d * STAT_BYTES, "atomic add: the same rows written back")]
        kernels.append(Kernel("3. dK/dV + atomic dQ (per KV tile)", 5 * pair_flops, "tensor", tuple(t)))
        kernels.append(Kernel("4. dQ FP32 -> input dtype", c.nq * c.d, "elementwise", (
            _r("dQacc", acc, "dQ accumulator [Nq, d], FP32"), _w("dQ", q, "dQ [Nq, d]"))))
    name = ("flash-causal-backward" if causal else "flash-backward") + ("-det" if deterministic else "")
    label = (f"FA-2 backward, {'causal' if causal else 'unmasked'}, "
             + ("separate dQ pass" if deterministic else "atomic dQ"))
    return Row(name, label, CAUSAL if causal else UNMASKED,
               "naive-causal-eager-backward" if causal else "naive-backward", tuple(kernels), (
                   "nothing [Nq, Nk] is kept or written: P and dS are recomputed per tile from Q, K, LSE",
                   f"one tiling for both passes, B_r = {c.block_q}, B_c = {c.block_kv} (the kernels' own "
                   "table may differ: pass --block-q/--block-kv)",
                   "atomics counted as one FP32 read and one write per row and tile pair (no L2 merging)",
                   "K/V and dK/dV are per kv head, shown as their share per query head (GQA)"))


_BACKWARD_BUILDERS = {
    "naive-backward": lambda c: _naive_backward(c, False),
    "flash-backward": lambda c: _flash_backward(c, False, False),
    "flash-backward-det": lambda c: _flash_backward(c, False, True),
    "naive-causal-eager-backward": lambda c: _naive_backward(c, True),
    "flash-causal-backward": lambda c: _flash_backward(c, True, False),
    "flash-causal-backward-det": lambda c: _flash_backward(c, True, True),
}


def backward_traffic(n: int | None = 4096, d: int = 128, dtype: str = "fp16", block_q: int = 128,
                     block_kv: int = 64, *, nq: int | None = None, nk: int | None = None, batch: int = 1,
                     heads: int = 1, kv_heads: int | None = None, rows=BACKWARD_ROWS) -> Traffic:
    """Logical HBM bytes of the backward pass, per (batch, query head), for each row of ``rows``
    (`BACKWARD_ROWS`). Parameters as `traffic`; the forward's traffic is not included.

    Returns
    -------
    Traffic: ``t.ratio("naive-backward", "flash-backward")`` is the unmasked reduction; causal rows
    compare against ``naive-causal-eager-backward``. Cost is constant in N (closed forms).
    """
    return _ledgers(_BACKWARD_BUILDERS, rows, n, nq, nk, d=d, dtype=dtype, block_q=block_q,
                    block_kv=block_kv, batch=batch, heads=heads, kv_heads=kv_heads)
