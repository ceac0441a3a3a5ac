"""Byte-sweep points beyond the forward: backward, decode and varlen, with their ledgers (no estimate).

A grid row of `attnscope bytes --sweep` names its kernel family in the ``pass`` column (``family`` is
accepted too): ``forward`` (the default; measure/physical.py, against the L2-aware estimate of
model/l2.py), or one of

- ``backward``: the gradient call alone (the forward runs before the profiled range): ``naive`` (autograd
  through the 3-kernel baseline), SDPA ``flash`` / ``cudnn`` (autograd), ``attnscope``
  (`flash_attention_backward` given O and LSE; ``deterministic`` false: the portable kernels with atomic
  dQ, true: the default kernels with dQ in its own pass). Ledger: model/backward.py's row of that mode;
  SDPA's against FA-2's atomic-dQ row.
- ``decode``: one query row per sequence against a KV cache of ``cache_lens``: SDPA ``flash`` / ``cudnn``
  on a dense cache of equal lengths, ``attnscope`` `flash_decode` on a dense cache, a paged one
  (``page_size``) and an e4m3 one (``kv_dtype`` fp8), with ``splits`` KV splits. Ledger:
  model/serving.py's `paged` (SDPA's with one split).
- ``varlen``: one packed call over sequences of ``lens``: ``attnscope`` `flash_attention_varlen`, ``flex``
  (Flex attention with a document mask, compiled). Ledger: model/serving.py's `packed`.

These families have no L2-aware estimate yet: a sweep reports each point's ncu bytes against its logical
ledger and its compulsory bytes (`compulsory`), and says so, never an estimate. Pure Python: the calls
themselves are measure/family_calls.py's, run in ncu's child.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from attnscope import inputs
from attnscope.errors import InputError, short

FAMILIES = ("forward", "backward", "decode", "varlen")
#: The implementations measured per family (the forward's: model/l2.py's IMPLS).
IMPLS = {"backward": ("naive", "flash", "cudnn", "attnscope"), "decode": ("flash", "cudnn", "attnscope"),
         "varlen": ("attnscope", "flex")}
#: The shape columns each family takes beside impl, batch, heads, kv_heads, d, dtype; any other is refused.
COLUMNS = {"forward": ("n", "causal"), "backward": ("n", "causal", "deterministic"),
           "decode": ("cache_lens", "page_size", "kv_dtype", "splits"), "varlen": ("lens", "causal")}
FAMILY_COLUMNS = ("deterministic", "cache_lens", "page_size", "kv_dtype", "splits", "lens")
PAGE_SIZES = (16, 32, 64, 128, 256)  # flash_decode's
MAX_SPLITS = 64
MAX_SEQUENCES = 256  # lengths in one cache_lens / lens cell
NO_ESTIMATE = "no estimate yet"
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1}
STAT_BYTES = 4  # one fp32 (LSE, a scale)
TRUE, FALSE = ("true", "1", "yes", "y", "t"), ("false", "0", "no", "n", "f", "")


def grid_int(where: str, name: str, value) -> int:
    """A positive integer up to 10^9 of a grid cell (text or a JSON number); one line naming it if not."""
    if isinstance(value, str) and inputs.number_text(value) and value.strip().lstrip("+").isdigit():
        value = int(value.strip().lstrip("+"))
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 10**9):
        raise InputError(f"{where}: {name}: expected a positive integer up to 10^9, got {short(value)}")
    return value


def grid_bool(where: str, name: str, value) -> bool:
    if isinstance(value, int) and value in (0, 1):  # bool included
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise InputError(f"{where}: {name}: expected true or false, got {short(value)}")


def _lengths(where: str, name: str, value) -> list[int]:
    """A cell of sequence lengths: one integer, or integers separated by ``;`` (a JSON list too)."""
    cells = value if isinstance(value, list) else str(value).replace(" ", ";").split(";")
    cells = [c for c in cells if not (isinstance(c, str) and not c.strip())]
    if not 1 <= len(cells) <= MAX_SEQUENCES:
        raise InputError(f"{where}: {name}: expected 1 to {MAX_SEQUENCES} lengths separated by ';', got "
                         f"{short(value)}")
    return [grid_int(where, name, c) for c in cells]


def _unsupported(where: str, column: str, what: str, supported: str):
    return NotImplementedError(f"{where}: {column}: {what} is not measured; supported: {supported}")


def point(got: dict, spec: dict, where: str) -> dict:
    """Complete ``spec`` (impl, batch, heads, kv_heads where it differs, d, dtype: validated by
    physical.point) for the family ``spec["pass"]`` from the raw cells ``got``; refuses a column the
    family does not take, in one line naming it."""
    family, impl = spec["pass"], spec["impl"]
    for col in FAMILY_COLUMNS + ("n", "causal"):
        if col not in COLUMNS[family] and got.get(col) not in ("", None):
            raise InputError(f"{where}: {col}: expected no value with pass {family} (it takes "
                             f"{', '.join(COLUMNS[family])}), got {short(got[col])}")
    if impl not in IMPLS[family]:
        raise InputError(f"{where}: impl: expected one of {', '.join(IMPLS[family])} with pass {family}, got "
                         f"{short(impl)}")
    gqa = spec.get("kv_heads") is not None
    if family == "backward":
        if got.get("n") in ("", None):
            raise InputError(f"{where}: n: expected a value, got none")
        spec["n"] = grid_int(where, "n", got["n"])
        spec["causal"] = grid_bool(where, "causal", got.get("causal") or "false")
        det = grid_bool(where, "deterministic", got.get("deterministic") or "false")
        if det and impl != "attnscope":
            raise _unsupported(where, "deterministic", f"true with impl {impl}", "true with attnscope")
        if gqa and impl == "naive":
            raise _unsupported(where, "kv_heads", "kv_heads != heads with naive", "GQA with flash, cudnn, "
                               "attnscope")
        if impl == "attnscope":
            spec["deterministic"] = det
        return spec
    if family == "varlen":
        if got.get("lens") in ("", None):
            raise InputError(f"{where}: lens: expected a value, got none")
        spec["lens"] = _lengths(where, "lens", got["lens"])
        spec["causal"] = grid_bool(where, "causal", got.get("causal") or "false")
        _batch(where, spec, "lens")
        return spec
    if got.get("cache_lens") in ("", None):
        raise InputError(f"{where}: cache_lens: expected a value, got none")
    lens = _lengths(where, "cache_lens", got["cache_lens"])
    spec["cache_lens"] = lens * spec["batch"] if len(lens) == 1 else lens
    _batch(where, spec, "cache_lens")
    page, kv, splits = (got.get(c) for c in ("page_size", "kv_dtype", "splits"))
    if impl != "attnscope":  # SDPA: one dense [B, Hkv, L, d] cache, no per-sequence length
        for col, v in (("page_size", page), ("kv_dtype", kv), ("splits", splits)):
            if v not in ("", None) and not (col == "kv_dtype" and v == spec["dtype"]):
                raise _unsupported(where, col, f"{v} with impl {impl}", "a dense cache of the "
                                   "queries' dtype, SDPA's own splits")
        if len(set(spec["cache_lens"])) > 1:
            raise _unsupported(where, "cache_lens", f"unequal lengths with impl {impl}", "one length "
                               "(SDPA takes no per-sequence length)")
        return spec
    if page not in ("", None):
        spec["page_size"] = grid_int(where, "page_size", page)
        if spec["page_size"] not in PAGE_SIZES:
            raise _unsupported(where, "page_size", str(spec["page_size"]), ", ".join(map(str, PAGE_SIZES)))
    if kv not in ("", None, spec["dtype"]):
        if kv != "fp8":
            raise InputError(f"{where}: kv_dtype: expected {spec['dtype']} (as dtype) or fp8, got "
                             f"{short(kv)}")
        spec["kv_dtype"] = "fp8"
    if splits in ("", None):
        raise InputError(f"{where}: splits: expected a value with impl attnscope (the ledger counts each "
                         "split's partials), got none")
    spec["splits"] = grid_int(where, "splits", splits)
    if spec["splits"] > MAX_SPLITS:
        raise InputError(f"{where}: splits: expected at most {MAX_SPLITS}, got {spec['splits']}")
    return spec


def _batch(where: str, spec: dict, col: str) -> None:
    if spec["batch"] not in (1, len(spec[col])):
        raise InputError(f"{where}: batch: expected the number of {col} ({len(spec[col])}), got "
                         f"{spec['batch']}")
    spec["batch"] = len(spec[col])


def tensor_bytes(spec: dict) -> int:
    """Bytes of the point's tensors on the GPU (inputs, outputs, gradients; naive's S and P): the
    fit check of physical.point."""
    b, h, d = DTYPE_BYTES[spec["dtype"]], spec["heads"], spec["d"]
    hkv = spec.get("kv_heads") or h
    if spec["pass"] == "backward":
        bsz, n = spec["batch"], spec["n"]
        size = 2 * (2 * h + 2 * hkv) * bsz * n * d * b  # Q, K, V, O and their gradients (dO, dQ, dK, dV)
        if spec["impl"] == "naive":  # S, P and their gradients
            size += 4 * bsz * h * n * n * b
        return size
    if spec["pass"] == "varlen":
        return (2 * h + 2 * hkv) * sum(spec["lens"]) * d * b
    kv = DTYPE_BYTES[spec.get("kv_dtype", spec["dtype"])]
    cap = max(spec["cache_lens"])
    return 2 * spec["batch"] * h * d * b + 2 * spec["batch"] * hkv * cap * d * (kv + b)  # + a staging copy


# --- the ledgers --------------------------------------------------------------------------------------
def ledger(spec: dict) -> tuple[int, int, str]:
    """(logical bytes, compulsory bytes, the ledger's name) of one family point, whole call.

    Compulsory: what the call must move at least, each input read once and each output written once --
    backward: Q, K, V, dO read and dQ, dK, dV written, plus O and the fp32 LSE read by the fused
    backwards (naive's autograd keeps P instead: not counted); decode: Q, the valid K/V rows at the
    cache's width (and the fp32 scales) read, O written; varlen: Q, K, V read and O written.
    """
    from attnscope.model import backward, serving

    b, h, d = DTYPE_BYTES[spec["dtype"]], spec["heads"], spec["d"]
    hkv = spec.get("kv_heads") or h
    impl = spec["impl"]
    if spec["pass"] == "backward":
        bsz, n, causal = spec["batch"], spec["n"], spec["causal"]
        if impl == "naive":
            row = "naive-causal-eager-backward" if causal else "naive-backward"
        else:
            row = ("flash-causal-backward" if causal else "flash-backward") + \
                ("-det" if spec.get("deterministic") else "")
        t = backward.backward_traffic(n, d, spec["dtype"], batch=bsz, heads=h, kv_heads=hkv, rows=(row,))
        comp = bsz * n * d * b * ((2 * h + 2 * hkv)  # Q, dO, K, V read
                                  + (h + 2 * hkv))  # dQ, dK, dV written
        if impl != "naive":
            comp += bsz * h * n * (d * b + STAT_BYTES)  # O and LSE
        return t[row].total * t.config.batch_heads, comp, f"model/backward.py {row}"
    if spec["pass"] == "varlen":
        row = "flash-causal" if spec["causal"] else "flash"
        p = serving.packed(spec["lens"], d=d, dtype=spec["dtype"], heads=h, kv_heads=hkv, rows=(row,))
        total = sum(spec["lens"])
        return p[row].total * h, total * d * b * (2 * h + 2 * hkv), f"model/serving.py packed {row}"
    lens, kv_dtype = spec["cache_lens"], spec.get("kv_dtype", spec["dtype"])
    g = serving.paged(lens, spec.get("page_size"), d=d, dtype=spec["dtype"], heads=h, kv_heads=hkv,
                      num_splits=spec.get("splits", 1), kv_dtype=kv_dtype)
    comp = 2 * len(lens) * h * d * b + 2 * hkv * sum(lens) * d * DTYPE_BYTES[kv_dtype]
    if kv_dtype == "fp8":
        comp += 2 * hkv * STAT_BYTES
    return g.row.total, comp, f"model/serving.py paged ({g.row.name}, {g.num_splits} split(s))"


def label(spec: dict) -> str:
    s = spec
    kv = f"/{s['kv_heads']}" if s.get("kv_heads") else ""
    head = f"{s['pass']} {s['impl']} H={s['heads']}{kv} d={s['d']} {s['dtype']}"
    if s["pass"] == "backward":
        det = {True: " deterministic", False: " atomic-dQ"}.get(s.get("deterministic"), "")
        return f"{head} B={s['batch']} N={s['n']} {'causal' if s['causal'] else 'unmasked'}{det}"
    if s["pass"] == "varlen":
        return f"{head} lens={_lens_text(s['lens'])} {'causal' if s['causal'] else 'unmasked'}"
    cache = f"paged {s['page_size']}" if s.get("page_size") else "dense"
    return (f"{head} cache_lens={_lens_text(s['cache_lens'])} {cache} {s.get('kv_dtype', s['dtype'])}"
            + (f" splits={s['splits']}" if s.get("splits") else ""))


def _lens_text(lens: list[int]) -> str:
    return ";".join(map(str, lens)) if len(lens) <= 4 else f"{len(lens)} seqs, sum {sum(lens):,}"


@dataclass(frozen=True)
class FamilyRow:
    """One measured family point against its logical ledger (no estimate exists for it yet)."""

    spec: dict
    measured: int  # DRAM bytes, ncu (read + write)
    logical: int
    compulsory: int
    ledger: str
    runs: tuple = ()

    @property
    def error(self) -> float:
        """The logical ledger against the counters (not an estimate's error)."""
        return self.logical / self.measured - 1.0

    def label(self) -> str:
        return label(self.spec)

    def to_json(self) -> dict:
        out = {"spec": self.spec, "measured": self.measured, "estimate": None, "note": NO_ESTIMATE,
               "logical": self.logical, "ledger": self.ledger, "compulsory": self.compulsory,
               "logical_error": self.error, "measured_over_compulsory": self.measured / self.compulsory}
        if self.runs:
            out["runs"] = list(self.runs)
        return out


def compare(measured: list[tuple], repeated: bool = False) -> list[FamilyRow]:
    """FamilyRows for the (spec, measured bytes[, kernel names]) tuples of family points (forward ones
    and points measured as 0 bytes are skipped); ``repeated``: one row per spec, its median run (as
    physical.compare)."""
    groups: dict = {}
    for spec, total, *_ in measured:
        if not total or spec.get("pass", "forward") == "forward":
            continue
        key = json.dumps(spec, sort_keys=True) if repeated else len(groups)
        groups.setdefault(key, (spec, []))[1].append(int(total))
    rows = []
    for spec, totals in groups.values():
        logical, comp, name = ledger(spec)
        rows.append(FamilyRow(spec, statistics.median_low(totals), logical, comp, name,
                              tuple(totals) if len(totals) > 1 else ()))
    return rows


def summarize(rows: list[FamilyRow]) -> dict:
    """Per family: points, the logical ledger's mean |error| and its worst point, and the points measured
    below the compulsory bytes (a counter or a ledger to look at); ``estimate``: NO_ESTIMATE."""
    out = {}
    for fam in FAMILIES[1:]:
        rs = [r for r in rows if r.spec["pass"] == fam]
        if not rs:
            continue
        worst = max(rs, key=lambda r: abs(r.error))
        out[fam] = {"count": len(rs), "estimate": NO_ESTIMATE,
                    "logical_mean_abs_error": sum(abs(r.error) for r in rs) / len(rs),
                    "logical_worst": {"point": worst.label(), "error": worst.error},
                    "measured_below_compulsory": [r.label() for r in rs if r.measured < r.compulsory]}
    return out


def summary_lines(s: dict) -> list[str]:
    lines = []
    for fam, v in s.items():
        below = v["measured_below_compulsory"]
        lines.append(f"{fam}: {v['count']} points, {NO_ESTIMATE}; logical ledger vs ncu: mean |error| "
                     f"{v['logical_mean_abs_error']:.1%}, worst {v['logical_worst']['point']} "
                     f"({v['logical_worst']['error']:+.1%}); measured below the compulsory bytes: "
                     f"{len(below)}"
                     + (": " + "; ".join(below) if below else ""))
    return lines
