"""Byte-sweep points beyond the forward: backward, decode, varlen and window, with their ledgers and
estimates.

A grid row of `attnscope bytes --sweep` names its kernel family in the ``pass`` column (``family`` is
accepted too): ``forward`` (the default; measure/physical.py, against the L2-aware estimate of
model/l2.py), or one of

- ``backward``: the gradient call alone (the forward runs before the profiled range): ``naive`` (autograd
  through the 3-kernel baseline), SDPA ``flash`` / ``cudnn`` (autograd), ``attnscope``
  (`flash_attention_backward` given O and LSE; ``deterministic`` false: the portable kernels with atomic
  dQ, true: the default kernels with dQ in its own pass; ``kernels`` names the build instead, `KERNELS`:
  ``auto`` with ``deterministic`` false runs the dQ mode autograd's default picks, the user's call: the
  Hopper one-pass build at d = 64 on an sm_90 GPU). Ledger: model/backward.py's row of the dQ mode that
  ran; SDPA's against FA-2's atomic-dQ row. attnscope's with a sliding ``window`` too (``left:right``).
- ``decode``: one query row per sequence against a KV cache of ``cache_lens``: SDPA ``flash`` / ``cudnn``
  on a dense cache of equal lengths, ``attnscope`` `flash_decode` on a dense cache, a paged one
  (``page_size``) and an e4m3 one (``kv_dtype`` fp8), with ``splits`` KV splits and ``nq`` query rows
  per sequence (a chunk; default 1), optionally a sliding ``window`` (``left:right``: decode is causal, the
  left side bounds). Ledger: model/serving.py's `paged` (SDPA's with one split).
- ``varlen``: one packed call over sequences of ``lens``: ``attnscope`` `flash_attention_varlen`, ``flex``
  (Flex attention with a document mask, compiled), attnscope's optionally with a sliding ``window`` per
  sequence. Ledger: model/serving.py's `packed`.
- ``window``: a forward with a sliding window (``window``: ``left:right``, -1 unbounded, one side bounded at
  least; causal bounds the right) over n x n: ``attnscope`` `flash_attention` (what its dispatch picks),
  ``flex`` (Flex attention with a sliding-window mask, compiled). Ledger: model/traffic.py's flash row with
  the tiles of the kernel that runs (`model.window_estimate.window_ledger`).

A sweep reports each point's ncu bytes against its logical ledger, its compulsory bytes and the DRAM
estimate of model/backward_estimate.py (backward), model/family_estimate.py (decode, varlen) or
model/window_estimate.py (window) (`estimate`); where the estimate needs a constant no probe has measured
yet (model/family_params.py) or a shape it does not model, the row says why instead of a number. Pure
Python: the calls themselves are measure/family_calls.py's, run in ncu's child.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass

from attnscope import inputs
from attnscope.errors import InputError, is_int, short

FAMILIES = ("forward", "backward", "decode", "varlen", "window")
#: The implementations measured per family (the forward's: model/l2.py's IMPLS).
IMPLS = {"backward": ("naive", "flash", "cudnn", "attnscope"), "decode": ("flash", "cudnn", "attnscope"),
         "varlen": ("attnscope", "flex"), "window": ("attnscope", "flex")}
#: The shape columns each family takes beside impl, batch, heads, kv_heads, d, dtype; any other is refused.
COLUMNS = {"forward": ("n", "causal"), "backward": ("n", "causal", "deterministic", "kernels", "window"),
           "decode": ("cache_lens", "page_size", "kv_dtype", "splits", "nq", "window"),
           "varlen": ("lens", "causal", "window"),
           "window": ("n", "causal", "window")}
FAMILY_COLUMNS = ("deterministic", "kernels", "cache_lens", "page_size", "kv_dtype", "splits", "lens", "nq",
                  "window")
#: attnscope backward's ``kernels`` column: `flash_attention_backward`'s ``impl`` (and
#: `model.backward_estimate.backward_estimate`'s ``kernels``); empty: `backward_kernels`'s default.
KERNELS = ("auto", "portable")
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
    if not (is_int(value) and 0 < value <= 10**9):
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


def _window(where: str, value, causal: bool) -> list[int]:
    """A window cell: ``left:right`` (a JSON list too), each an integer >= -1 (-1 unbounded), hiding a key
    ``causal`` alone would show; the effective ``[left, right]`` (causal: right 0), or one line naming
    ``window``."""
    from attnscope.model.tiles import bounded_window

    cells = value if isinstance(value, list) else str(value).split(":")
    digits = re.compile(r"-?[0-9]{1,12}")
    if len(cells) != 2 or not all(is_int(c) or (isinstance(c, str) and digits.fullmatch(c.strip()))
                                  for c in cells):
        long = len(cells) == 2 and all(isinstance(c, str) and re.fullmatch(r"-?[0-9]+", c.strip())
                                       for c in cells)
        raise InputError(f"{where}: window: expected left:right, two integers from -1 (unbounded)"
                         f"{' of at most 12 digits' if long else ''}, got {short(value)}")
    try:
        return list(bounded_window(causal, [int(c) for c in cells]))
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _optional_window(where: str, got: dict, spec: dict, causal: bool) -> None:
    """``spec["window"]`` from the row's window cell, where it has one: attnscope's kernels take a window,
    another implementation's is refused in one line."""
    if got.get("window") not in ("", None):
        if spec["impl"] != "attnscope":
            raise _unsupported(where, "window", f"a window with impl {spec['impl']}",
                               "windows with attnscope")
        spec["window"] = _window(where, got["window"], causal)


def spec_window(spec: dict) -> tuple[int, int] | None:
    """A point's effective window as the models take it, or None."""
    return tuple(spec["window"]) if "window" in spec else None


def _window_text(spec: dict) -> str:
    return f" window {spec['window'][0]}:{spec['window'][1]}" if spec.get("window") else ""


def required(where: str, got: dict, name: str):
    """The raw cell ``got[name]``; one line naming it when it is empty or missing."""
    if got.get(name) in ("", None):
        raise InputError(f"{where}: {name}: expected a value, got none")
    return got[name]


def refuse_other_columns(where: str, got: dict, family: str) -> None:
    """One line naming the first shape column with a value that ``family`` does not take (`COLUMNS`)."""
    for col in FAMILY_COLUMNS + ("n", "causal"):
        if col not in COLUMNS[family] and got.get(col) not in ("", None):
            raise InputError(f"{where}: {col}: expected no value with pass {family} (it takes "
                             f"{', '.join(COLUMNS[family])}), got {short(got[col])}")


def _unsupported(where: str, column: str, what: str, supported: str):
    return NotImplementedError(f"{where}: {column}: {what} is not measured; supported: {supported}")


def point(got: dict, spec: dict, where: str) -> dict:
    """Complete ``spec`` (impl, one of the family's `IMPLS`, batch, heads, kv_heads where it differs, d,
    dtype: validated by physical.point) for the family ``spec["pass"]`` from the raw cells ``got``;
    refuses a column the family does not take, in one line naming it."""
    family, impl = spec["pass"], spec["impl"]
    refuse_other_columns(where, got, family)
    gqa = spec.get("kv_heads") is not None
    if family == "backward":
        spec["n"] = grid_int(where, "n", required(where, got, "n"))
        spec["causal"] = grid_bool(where, "causal", got.get("causal") or "false")
        det = grid_bool(where, "deterministic", got.get("deterministic") or "false")
        if det and impl != "attnscope":
            raise _unsupported(where, "deterministic", f"true with impl {impl}", "true with attnscope")
        if gqa and impl == "naive":
            raise _unsupported(where, "kv_heads", "kv_heads != heads with naive", "GQA with flash, cudnn, "
                               "attnscope")
        kernels = got.get("kernels")
        if kernels not in ("", None) and impl != "attnscope":
            raise InputError(f"{where}: kernels: expected no value with impl {impl} (it names attnscope's "
                             f"kernels), got {short(kernels)}")
        if impl == "attnscope":
            spec["deterministic"] = det
            if kernels not in ("", None) and kernels not in KERNELS:
                raise InputError(f"{where}: kernels: expected one of {', '.join(KERNELS)} or none, got "
                                 f"{short(kernels)}")
            if kernels not in ("", None, backward_kernels(spec)):  # the default stays out: one spec per call
                spec["kernels"] = kernels
        _optional_window(where, got, spec, spec["causal"])
        return spec
    if family == "window":
        spec["n"] = grid_int(where, "n", required(where, got, "n"))
        spec["causal"] = grid_bool(where, "causal", got.get("causal") or "false")
        spec["window"] = _window(where, required(where, got, "window"), spec["causal"])
        return spec
    if family == "varlen":
        spec["lens"] = _lengths(where, "lens", required(where, got, "lens"))
        spec["causal"] = grid_bool(where, "causal", got.get("causal") or "false")
        _batch(where, spec, "lens")
        _optional_window(where, got, spec, spec["causal"])
        return spec
    lens = _lengths(where, "cache_lens", required(where, got, "cache_lens"))
    spec["cache_lens"] = lens * spec["batch"] if len(lens) == 1 else lens
    _batch(where, spec, "cache_lens")
    page, kv, splits = (got.get(c) for c in ("page_size", "kv_dtype", "splits"))
    if got.get("nq") not in ("", None):
        nq = grid_int(where, "nq", got["nq"])
        if nq > 1 and impl != "attnscope":
            raise _unsupported(where, "nq", f"{nq} with impl {impl}", "nq 1 (one decode row) with SDPA")
        if nq > min(spec["cache_lens"]):
            raise InputError(f"{where}: nq: expected at most the shortest cache length "
                             f"({min(spec['cache_lens'])}: the queries are the last nq positions), got {nq}")
        if nq > 1:
            spec["nq"] = nq
    _optional_window(where, got, spec, True)  # decode is causal
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
    if spec["pass"] == "window":
        return (2 * h + 2 * hkv) * spec["batch"] * spec["n"] * d * b
    kv = DTYPE_BYTES[spec.get("kv_dtype", spec["dtype"])]
    cap = max(spec["cache_lens"])
    q_o = 2 * spec["batch"] * h * spec.get("nq", 1) * d * b
    return q_o + 2 * spec["batch"] * hkv * cap * d * (kv + b)  # + a staging copy


# --- the ledgers --------------------------------------------------------------------------------------
def ledger(spec: dict) -> tuple[int, int, str]:
    """(logical bytes, compulsory bytes, the ledger's name) of one family point, whole call.

    Compulsory: what the call must move at least, each input read once and each output written once --
    backward: Q, K, V, dO read and dQ, dK, dV written, plus O and the fp32 LSE read by the fused
    backwards (naive's autograd keeps P instead: not counted); decode: Q, the valid K/V rows at the
    cache's width (and the fp32 scales) read, O written; varlen and window: Q, K, V read and O written.
    """
    from attnscope.model import backward, backward_estimate, family_estimate, serving, window_estimate

    h, d = spec["heads"], spec["d"]
    hkv = spec.get("kv_heads") or h
    impl = spec["impl"]
    if spec["pass"] == "backward":
        bsz, n, causal = spec["batch"], spec["n"], spec["causal"]
        if impl == "naive":
            row = "naive-causal-eager-backward" if causal else "naive-backward"
        else:
            own_pass = impl == "attnscope" and not backward_estimate.dq_by_atomics(
                backward_kernels(spec), d, causal, spec["deterministic"])
            row = ("flash-causal-backward" if causal else "flash-backward") + ("-det" if own_pass else "")
        t = backward.backward_traffic(n, d, spec["dtype"], batch=bsz, heads=h, kv_heads=hkv, rows=(row,),
                                      window=spec_window(spec))
        comp = backward_estimate.backward_compulsory(impl, n, d=d, dtype=spec["dtype"], batch=bsz, heads=h,
                                                     kv_heads=hkv)
        return t[row].total * t.config.batch_heads, comp, f"model/backward.py {row}"
    if spec["pass"] == "window":
        args = window_args(spec)
        logical, name = window_estimate.window_ledger(**args)
        comp = window_estimate.window_compulsory(args["n"], d=d, dtype=args["dtype"], batch=args["batch"],
                                                 heads=h, kv_heads=hkv)
        return logical, comp, name
    if spec["pass"] == "varlen":
        row = "flash-causal" if spec["causal"] else "flash"
        p = serving.packed(spec["lens"], d=d, dtype=spec["dtype"], heads=h, kv_heads=hkv, rows=(row,),
                           window=spec_window(spec))
        comp = family_estimate.varlen_compulsory(spec["lens"], d=d, dtype=spec["dtype"], heads=h,
                                                 kv_heads=hkv)
        return p[row].total * h, comp, f"model/serving.py packed {row}"
    lens, kv_dtype, nq = spec["cache_lens"], spec.get("kv_dtype", spec["dtype"]), spec.get("nq", 1)
    window = spec_window(spec)
    g = serving.paged(lens, spec.get("page_size"), nq=nq, d=d, dtype=spec["dtype"], heads=h, kv_heads=hkv,
                      num_splits=spec.get("splits", 1), kv_dtype=kv_dtype, window=window)
    comp = family_estimate.decode_compulsory(lens, nq=nq, d=d, dtype=spec["dtype"], heads=h, kv_heads=hkv,
                                             kv_dtype=kv_dtype, window=window)
    return g.row.total, comp, f"model/serving.py paged ({g.row.name}, {g.num_splits} split(s))"


def label(spec: dict) -> str:
    s = spec
    kv = f"/{s['kv_heads']}" if s.get("kv_heads") else ""
    head = f"{s['pass']} {s['impl']} H={s['heads']}{kv} d={s['d']} {s['dtype']}"
    if s["pass"] == "backward":
        det = {True: " deterministic", False: " atomic-dQ"}.get(s.get("deterministic"), "")
        if "kernels" in s:  # not the mode's default build: atomic-dQ would not say what ran
            det = f" deterministic={str(s['deterministic']).lower()} kernels={s['kernels']}"
        return (f"{head} B={s['batch']} N={s['n']} {'causal' if s['causal'] else 'unmasked'}{det}"
                + _window_text(s))
    if s["pass"] == "varlen":
        return (f"{head} lens={_lens_text(s['lens'])} {'causal' if s['causal'] else 'unmasked'}"
                + _window_text(s))
    if s["pass"] == "window":
        return (f"{head} B={s['batch']} N={s['n']} {'causal ' if s['causal'] else ''}window "
                f"{s['window'][0]}:{s['window'][1]}")
    cache = f"paged {s['page_size']}" if s.get("page_size") else "dense"
    return (f"{head} cache_lens={_lens_text(s['cache_lens'])} {cache} {s.get('kv_dtype', s['dtype'])}"
            + (f" splits={s['splits']}" if s.get("splits") else "")
            + (f" nq={s['nq']}" if s.get("nq") else "")
            + _window_text(s))


def _lens_text(lens: list[int]) -> str:
    return ";".join(map(str, lens)) if len(lens) <= 4 else f"{len(lens)} seqs, sum {sum(lens):,}"


@dataclass(frozen=True)
class FamilyRow:
    """One measured family point against its logical ledger and, where it runs, its DRAM estimate
    (``estimate`` None: ``note`` says why)."""

    spec: dict
    measured: int  # DRAM bytes, ncu (read + write)
    logical: int
    compulsory: int
    ledger: str
    runs: tuple = ()
    estimate: float | None = None
    note: str = NO_ESTIMATE
    terms: tuple = ()  # the estimate's ((name, bytes, what), ...) beyond the compulsory bytes

    @property
    def error(self) -> float:
        """The logical ledger against the counters (not an estimate's error)."""
        return self.logical / self.measured - 1.0

    def label(self) -> str:
        return label(self.spec)

    @property
    def estimate_error(self) -> float | None:
        return None if self.estimate is None else self.estimate / self.measured - 1.0

    def to_json(self) -> dict:
        out = {"spec": self.spec, "measured": self.measured, "estimate": self.estimate, "note": self.note,
               "estimate_error": self.estimate_error,
               "estimate_terms": [{"name": n, "bytes": b, "what": w} for n, b, w in self.terms],
               "logical": self.logical, "ledger": self.ledger, "compulsory": self.compulsory,
               "logical_error": self.error, "measured_over_compulsory": self.measured / self.compulsory}
        if self.runs:
            out["runs"] = list(self.runs)
        return out


def backward_kernels(spec: dict) -> str:
    """The kernels (`KERNELS`) of an attnscope backward point: its ``kernels``, else the mode's default (the
    portable ones for atomic dQ, ``"auto"`` for deterministic: what a grid without the column measures)."""
    return spec.get("kernels") or ("auto" if spec.get("deterministic") else "portable")


def backward_args(spec: dict) -> dict:
    """`model.backward_estimate.backward_estimate`'s arguments for a backward point, with the kernels
    measure/family_calls.py runs (`backward_kernels`)."""
    return {"impl": spec["impl"], "n": spec["n"], "causal": spec["causal"], "d": spec["d"],
            "dtype": spec["dtype"], "batch": spec["batch"], "heads": spec["heads"],
            "kv_heads": spec.get("kv_heads") or spec["heads"],
            "deterministic": bool(spec.get("deterministic")), "kernels": backward_kernels(spec),
            "window": spec_window(spec)}


def window_args(spec: dict) -> dict:
    """`model.window_estimate.window_ledger`'s arguments for a window point."""
    return {"impl": spec["impl"], "n": spec["n"], "window": tuple(spec["window"]), "causal": spec["causal"],
            "d": spec["d"], "dtype": spec["dtype"], "batch": spec["batch"], "heads": spec["heads"],
            "kv_heads": spec.get("kv_heads") or spec["heads"]}


def estimate(spec: dict, l2_bytes: int | None = None, sms: int | None = None):
    """``(FamilyEstimate, "")`` of a backward, decode, varlen or window point (model/backward_estimate.py,
    model/family_estimate.py, model/window_estimate.py; ``l2_bytes``, ``sms``: the GPU's, default the
    H200's), or ``(None, why not)``:
    the estimate needs a constant no probe has measured yet or a shape it does not model (one line)."""
    from attnscope.model import backward_estimate as be
    from attnscope.model import family_estimate as fe
    from attnscope.model import window_estimate as we

    h, d, dtype = spec["heads"], spec["d"], spec["dtype"]
    hkv = spec.get("kv_heads") or h
    try:
        if spec["pass"] == "backward":
            return be.backward_estimate(**backward_args(spec), sms=sms, l2_bytes=l2_bytes), ""
        if spec["pass"] == "decode":
            return fe.decode_estimate(spec["impl"], spec["cache_lens"], nq=spec.get("nq", 1), d=d,
                                      dtype=dtype, heads=h, kv_heads=hkv, page_size=spec.get("page_size"),
                                      kv_dtype=spec.get("kv_dtype"), splits=spec.get("splits"), sms=sms,
                                      l2_bytes=l2_bytes,
                                      window=spec_window(spec)), ""
        if spec["pass"] == "window":
            return we.window_estimate(**window_args(spec), sms=sms, l2_bytes=l2_bytes), ""
        if spec["pass"] == "varlen":
            return fe.varlen_estimate(spec["impl"], spec["lens"], causal=spec["causal"], d=d, dtype=dtype,
                                      heads=h, kv_heads=hkv, sms=sms, l2_bytes=l2_bytes,
                                      window=spec_window(spec)), ""
    except NotImplementedError as e:  # NotMeasured is one
        return None, fe.error_text(e)
    return None, NO_ESTIMATE


def row(spec: dict, totals: list[int], l2_bytes: int | None = None, sms: int | None = None) -> FamilyRow:
    """The FamilyRow of one family point measured ``totals`` (its median run), with its estimate."""
    logical, comp, name = ledger(spec)
    est, note = estimate(spec, l2_bytes, sms)
    return FamilyRow(spec, statistics.median_low(totals), logical, comp, name,
                     tuple(totals) if len(totals) > 1 else (), None if est is None else est.total, note,
                     () if est is None else est.terms)


def compare(measured: list[tuple], repeated: bool = False, l2_bytes: int | None = None,
            sms: int | None = None) -> list[FamilyRow]:
    """FamilyRows for the (spec, measured bytes[, kernel names]) tuples of family points (forward ones
    and points measured as 0 bytes are skipped); ``repeated``: one row per spec, its median run (as
    physical.compare); ``l2_bytes``, ``sms``: the measuring GPU's, for the estimates."""
    groups: dict = {}
    for spec, total, *_ in measured:
        if not total or spec.get("pass", "forward") == "forward":
            continue
        key = json.dumps(spec, sort_keys=True) if repeated else len(groups)
        groups.setdefault(key, (spec, []))[1].append(int(total))
    return [row(spec, totals, l2_bytes, sms) for spec, totals in groups.values()]


BANDS = (0.05, 0.10, 0.15)  # as measure/physical.py's
#: The module of each family's estimate.
ESTIMATES = {"backward": "model/backward_estimate.py", "decode": "model/family_estimate.py",
             "varlen": "model/family_estimate.py", "window": "model/window_estimate.py"}


def summarize(rows: list[FamilyRow]) -> dict:
    """Per family: points, the logical ledger's mean |error| and its worst point, the points measured
    below the compulsory bytes (a counter or a ledger to look at), and the estimates: how many ran, within
    each of `BANDS` of ncu, mean |error|, worst, below the compulsory bytes, and why the others did not
    (``estimate``: NO_ESTIMATE where none ran)."""
    out = {}
    for fam in FAMILIES[1:]:
        rs = [r for r in rows if r.spec["pass"] == fam]
        if not rs:
            continue
        worst = max(rs, key=lambda r: abs(r.error))
        v = {"count": len(rs), "estimate": NO_ESTIMATE,
             "logical_mean_abs_error": sum(abs(r.error) for r in rs) / len(rs),
             "logical_worst": {"point": worst.label(), "error": worst.error},
             "measured_below_compulsory": [r.label() for r in rs if r.measured < r.compulsory]}
        est = [r for r in rs if r.estimate is not None]
        why: dict = {}
        for r in rs:
            if r.estimate is None:
                why[r.note] = why.get(r.note, 0) + 1
        v["not_estimated"] = why
        if est:
            w = max(est, key=lambda r: abs(r.estimate_error))
            v |= {"estimate": ESTIMATES[fam], "estimated": len(est),
                  "estimate_within": {f"{b:.0%}": sum(abs(r.estimate_error) <= b for r in est)
                                      for b in BANDS},
                  "estimate_mean_abs_error": sum(abs(r.estimate_error) for r in est) / len(est),
                  "estimate_worst": {"point": w.label(), "error": w.estimate_error},
                  "estimate_below_compulsory": [r.label() for r in est if r.estimate < r.compulsory],
                  # below it by more than its named credits (the dirty O the L2 keeps): a model to fix
                  "estimate_below_unexplained": [r.label() for r in est if r.estimate < r.compulsory
                                                 - sum(-b for n, b, _ in r.terms if n == "dirty_o") - 1]}
        out[fam] = v
    return out


def summary_lines(s: dict) -> list[str]:
    lines = []
    for fam, v in s.items():
        below = v["measured_below_compulsory"]
        if v.get("estimated"):
            within = ", ".join(f"{k}: {n}" for k, n in v["estimate_within"].items())
            head = (f"{v['estimated']} estimated (within {within}; mean |error| "
                    f"{v['estimate_mean_abs_error']:.1%}, worst {v['estimate_worst']['point']} "
                    f"{v['estimate_worst']['error']:+.1%}; below compulsory: "
                    f"{len(v['estimate_below_compulsory'])}, by more than the dirty O it names: "
                    f"{len(v['estimate_below_unexplained'])})")
        else:
            head = NO_ESTIMATE
        for note, n in v.get("not_estimated", {}).items():
            if note != NO_ESTIMATE:
                lines.append(f"{fam}: {n} point(s) without an estimate: {note}")
        lines.append(f"{fam}: {v['count']} points, {head}; logical ledger vs ncu: mean |error| "
                     f"{v['logical_mean_abs_error']:.1%}, worst {v['logical_worst']['point']} "
                     f"({v['logical_worst']['error']:+.1%}); measured below the compulsory bytes: "
                     f"{len(below)}"
                     + (": " + "; ".join(below) if below else ""))
    return lines
