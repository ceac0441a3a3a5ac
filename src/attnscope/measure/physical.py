"""Physical DRAM bytes over a grid: the estimate (model/l2.py) held against ncu, point by point.

`attnscope bytes --sweep GRID` reads a grid of shapes (`parse_grid`: CSV with a header, a JSON list of
objects, or YAML; the fields of `FIELDS`), measures each point with measure/ncu.py's child (several points
per ncu process, `ncu.measure_many`), and prints the estimate's error distribution (`summarize`). The
JSON it writes keeps the raw counters of every point, so `--from-json` re-evaluates the current estimate
against a recorded sweep without a GPU.

`attnscope bytes --calibrate` measures streams of known size through the same ncu path (`CALIBRATION`)
and prints the counter / exact ratios (`calibration_rows`); the slope between the two sizes cancels what
stays dirty in the L2 at the end of a kernel.

Everything here but the measuring itself is pure Python and tested on a CPU.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass

from attnscope import inputs
from attnscope.errors import InputError, expect, is_int, positive_int, short
from attnscope.measure import families, ncu
from attnscope.measure.families import grid_bool, grid_int
from attnscope.model import l2

#: Grid columns: canonical name -> (accepted spellings, default or None when required).
FIELDS = {
    "impl": (("impl",), None),
    "batch": (("batch", "b"), 1),
    "heads": (("heads", "h"), None),
    "kv_heads": (("kv_heads", "hkv"), 0),  # 0: as many as heads
    "n": (("n",), ""),  # required by forward and backward (measure/families.py: COLUMNS)
    "d": (("d",), None),
    "causal": (("causal",), ""),
    "dtype": (("dtype",), "fp16"),
    "pass": (("pass", "family"), "forward"),  # measure/families.py: FAMILIES
    # the family columns (measure/families.py: COLUMNS); empty where a family does not take them
    "deterministic": (("deterministic",), ""),
    "kernels": (("kernels",), ""),
    "cache_lens": (("cache_lens", "l"), ""),
    "page_size": (("page_size",), ""),
    "kv_dtype": (("kv_dtype",), ""),
    "splits": (("splits",), ""),
    "lens": (("lens",), ""),
    "nq": (("nq",), ""),
    "window": (("window",), ""),
}
#: Most points in one grid (each is a GPU call under ncu: about 2-5 s).
MAX_POINTS = 400
#: `attnscope bytes --sweep --repeat K`: at most this many runs of a grid (the counters of one FA-2 causal
#: point have spread 5-20 % between runs on the H200: BENCHMARKS.md, byte estimate)
MAX_REPEAT = 5
#: Largest Q + K + V + O (and, for naive, S and P) of one point: what one 141 GB H200 can hold with room.
MAX_POINT_BYTES = 80 * 10**9
HEAD_DIMS = l2.VALIDATED_HEAD_DIMS
TRUE, FALSE = ("true", "1", "yes", "y", "t"), ("false", "0", "no", "n", "f", "")
#: ``attnscope bytes --calibrate``: streams of 1 GiB and 4 GiB (two sizes: the slope between them cancels
#: the few MiB a write-back L2 keeps dirty past the end of a kernel).
CALIBRATION = tuple({"kind": k, "bytes": s * 2**30} for k in ncu.STREAMS for s in (1, 4))


#: The SM count and the L2 size an estimate may take (`bytes --sms`, `--l2-bytes`, a sweep's env): far
#: around every GPU made (H200: 132 SMs, 60 MiB L2), so a typo is refused instead of estimated (at
#: 20,000 SMs the estimate exceeds the logical bytes).
SMS_RANGE = (1, 1024)
L2_RANGE = (2**20, 2**30)
#: Largest byte count a recorded measurement may hold (a petabyte: far above one call's DRAM traffic).
MAX_RECORDED_BYTES = 10**15


def machine_int(name: str, value, bounds: tuple[int, int]) -> int:
    """An SM count or an L2 size within `bounds` (`SMS_RANGE`, `L2_RANGE`); one line naming `name` if not."""
    lo, hi = bounds
    positive_int(name, value)
    what = f"an integer from {lo:,} to {hi:,}" + (" bytes (1 MiB to 1 GiB)" if bounds == L2_RANGE else "")
    expect(lo <= value <= hi, name, what, value)
    return value


def _byte_count(name: str, value) -> int:
    expect(is_int(value) and 0 <= value <= MAX_RECORDED_BYTES,
           name, "a byte count (an integer from 0 to 10^15)", value)
    return value


def point(raw: dict, where: str) -> dict:
    """One validated grid point as an ncu spec (``kv_heads`` only where it differs from ``heads``).

    ``raw`` maps column names (any spelling of `FIELDS`, any case) to values (text from a CSV, or JSON /
    YAML scalars); ``where`` names the row in errors ("GRID row 3"). Raises InputError (one line) for an
    unknown or missing column and a bad value; NotImplementedError for a valid combination that cannot
    be measured (naive with GQA, a head dim without kernels).
    """
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping of column -> value, got {short(raw)}")
    names = {alias: canon for canon, (aliases, _) in FIELDS.items() for alias in aliases}
    got: dict = {}
    for key, value in raw.items():
        canon = names.get(str(key).strip().lower())
        if canon is None:
            raise InputError(f"{where}: expected columns {', '.join(FIELDS)}, got an unknown column "
                             f"{short(key)}")
        if canon in got:
            raise InputError(f"{where}: expected each column once, got {canon} twice")
        got[canon] = value.strip() if isinstance(value, str) else value
    for canon, (_, default) in FIELDS.items():
        if canon not in got or got[canon] in ("", None):
            if default is None:
                raise InputError(f"{where}: {canon}: expected a value, got none")
            got[canon] = default
    family = got["pass"]
    if family not in families.FAMILIES:
        raise InputError(f"{where}: pass: expected one of {', '.join(families.FAMILIES)}, got "
                         f"{short(family)}")
    impl = got["impl"]
    impls = ncu.IMPLS if family == "forward" else families.IMPLS[family]
    if impl not in impls:
        raise InputError(f"{where}: impl: expected one of {', '.join(impls)}"
                         + ("" if family == "forward" else f" with pass {family}") + f", got {short(impl)}")
    spec = {"impl": impl, "batch": grid_int(where, "batch", got["batch"]),
            "heads": grid_int(where, "heads", got["heads"])}
    dtype = got["dtype"]
    if dtype not in ("fp16", "bf16"):
        raise InputError(f"{where}: dtype: expected one of fp16, bf16, got {short(dtype)}")
    hkv = got["kv_heads"]
    hkv = spec["heads"] if hkv in (0, "0") else grid_int(where, "kv_heads", hkv)
    if spec["heads"] % hkv:
        raise InputError(f"{where}: kv_heads: expected a divisor of heads ({spec['heads']}), got {hkv}")
    d = grid_int(where, "d", got["d"])
    if d not in HEAD_DIMS:
        raise NotImplementedError(f"{where}: d: {d} is not measured; supported: "
                                  f"{', '.join(map(str, HEAD_DIMS))}")
    if family != "forward":  # the spec names its family; a forward spec stays as recorded sweeps hold it
        spec = {"pass": family, **spec, "d": d, "dtype": dtype}
        if hkv != spec["heads"]:
            spec["kv_heads"] = hkv
        spec = families.point(got, spec, where)
        size = families.tensor_bytes(spec)
        if size > MAX_POINT_BYTES:
            raise InputError(f"{where}: {families.COLUMNS[family][0]}: expected the point's tensors to fit "
                             f"one GPU (at most {MAX_POINT_BYTES / 1e9:g} GB), got {size / 1e9:,.4g} GB")
        return spec
    families.refuse_other_columns(where, got, "forward")
    spec |= {"n": grid_int(where, "n", families.required(where, got, "n")), "d": d,
             "causal": grid_bool(where, "causal", got["causal"] or "false"), "dtype": dtype}
    if hkv != spec["heads"]:
        if impl == "naive":
            raise NotImplementedError(f"{where}: naive with kv_heads != heads is not measured; supported: "
                                      "GQA with flash, cudnn, efficient, attnscope")
        spec["kv_heads"] = hkv
    elt = 2
    bh, n = spec["batch"] * spec["heads"], spec["n"]
    size = (2 * bh + 2 * spec["batch"] * hkv) * n * d * elt
    if impl == "naive":
        size += (3 if spec["causal"] else 2) * bh * n * n * elt + (n * n if spec["causal"] else 0)
    if size > MAX_POINT_BYTES:
        raise InputError(f"{where}: n: expected the point's tensors to fit one GPU (at most "
                         f"{MAX_POINT_BYTES / 1e9:g} GB), got {size / 1e9:,.4g} GB")
    return spec


def parse_grid(path, field: str = "GRID", text: str | None = None) -> list[dict]:
    """The points of a grid file as validated ncu specs (see `point`).

    Format by extension: ``.json`` (a list of objects, or ``{"points": [...]}``), ``.yaml``/``.yml`` (the
    same), anything else CSV with a header row. Lines of a CSV starting with ``#`` are comments. Every
    error is one InputError line naming ``field`` and the row.
    """
    name = str(path).lower()
    if name.endswith(".json") or name.endswith((".yaml", ".yml")):
        data = (inputs.load_json if name.endswith(".json") else inputs.load_yaml)(path, field, text)
        if isinstance(data, dict) and set(data) == {"points"}:
            data = data["points"]
        if not isinstance(data, list):
            raise InputError(f"{field}: expected a list of points (or {{\"points\": [...]}}), got "
                             f"{short(data)}")
        rows = [(i + 1, r) for i, r in enumerate(data)]
    else:
        table = [r for r in inputs.read_csv(path, field, text) if not r[0].lstrip().startswith("#")]
        if not table:
            raise InputError(f"{field}: expected a header row and at least one point, got an empty file")
        header = [h.strip() for h in table[0]]
        if (twice := next((h for i, h in enumerate(header) if h in header[:i]), None)) is not None:
            raise InputError(f"{field} row 1: expected each column once, got {short(twice)} twice")
        rows = []
        for i, r in enumerate(table[1:], start=2):
            if len(r) != len(header):
                raise InputError(f"{field} row {i}: expected {len(header)} fields (the header's), got "
                                 f"{len(r)}")
            rows.append((i, dict(zip(header, r, strict=True))))
    if not rows:
        raise InputError(f"{field}: expected at least one point, got none")
    if len(rows) > MAX_POINTS:
        raise InputError(f"{field}: expected at most {MAX_POINTS} points, got {len(rows):,}")
    return [point(r, f"{field} row {i}") for i, r in rows]


# --- the comparison -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One measured point against the estimate (None where `l2.not_modelled` names why: ``note``)."""

    spec: dict
    measured: int  # DRAM bytes, ncu (read + write)
    estimate: int | None
    compulsory: int  # Q, K, V read once + O (+ LSE) written once
    credits: tuple  # (reason, bytes) the estimate subtracts below the compulsory bytes, each stated
    runs: tuple = ()  # measured more than once (--repeat): every run's bytes; `measured` is their median
    note: str = ""  # why there is no estimate

    @property
    def error(self) -> float | None:
        return None if self.estimate is None else self.estimate / self.measured - 1.0

    @property
    def silently_below(self) -> bool:
        """Below the compulsory bytes by more than the credits it states (never, by construction)."""
        return self.estimate is not None and self.estimate < self.compulsory - sum(b for _, b in self.credits)

    def label(self) -> str:
        s = self.spec
        kv = f"/{s['kv_heads']}" if s.get("kv_heads") else ""
        return (f"{s['impl']} B={s.get('batch', 1)} H={s['heads']}{kv} N={s['n']} d={s['d']} "
                f"{s.get('dtype', 'fp16')} {'causal' if s.get('causal') else 'unmasked'}")

    def to_json(self) -> dict:
        out = {"spec": self.spec, "measured": self.measured, "estimate": self.estimate,
               "compulsory": self.compulsory, "credits": [list(c) for c in self.credits], "error": self.error}
        if self.runs:
            out["runs"] = list(self.runs)
        if self.note:
            out["note"] = self.note
        return out

    @property
    def spread(self) -> float:
        """Largest over smallest run, minus 1 (0 for one run)."""
        return max(self.runs) / min(self.runs) - 1.0 if self.runs else 0.0


PORTABLE_KERNEL = "_attnscope_fwd_kernel"  # kernels/fwd.py's portable kernel (the Gluon ones: _hopper)

#: The recorded grid (tests/data/measure/recorded) ran the portable kernel autotuned per power-of-two N, at
#: d = 128 one of (BLOCK_M, BLOCK_N, warps, stages) (128, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3). ncu's
#: block size (threads) and grid (query tiles: BLOCK_M) name the one that ran -> its `l2.Kernel`: Q + stages x
#: (K + V) tiles take 128 KiB for 8 warps and 3 stages (one CTA per SM), 112 KiB for BLOCK_M 64 (two).
RECORDED_PORTABLE = {(256, 128): l2.Kernel(128, 64, 1, "hb", False, False, threads=256),
                     (128, 64): l2.Kernel(64, 64, 2, "hb", False, False)}


def recorded_kernel(spec: dict, kernels: list) -> l2.Kernel | None:
    """The `l2.Kernel` a call of the recorded grid ran when it was attnscope's autotuned portable kernel
    (`RECORDED_PORTABLE`, from the one launch's ncu block size and grid); None for anything else."""
    if spec["impl"] != "attnscope" or spec["d"] != 128 or len(kernels) != 1 or not kernels[0].grid:
        return None
    k = kernels[0]
    return RECORDED_PORTABLE.get((k.threads, -(-max(spec["n"], 1) // k.grid)))


def estimate_of(spec: dict, l2_bytes: int, sms: int, kernels: list[str] | None = None,
                kernel: l2.Kernel | None = None):
    """model/l2.py's estimate for an ncu spec. ``kernels``: the measured call's kernel names, where known:
    an attnscope call that ran the portable kernel (a recorded sweep where the dispatch rule did not name a
    Gluon variant) is estimated for that kernel, not for what the rule picks now.
    ``kernel``: the geometry a measured call ran where it differs from the table's (`recorded_kernel`)."""
    impl = "portable" if kernel is not None else attnscope_impl_of(spec, kernels)
    return l2.estimate(spec["impl"], spec["n"], spec["d"], spec["heads"], spec.get("batch", 1),
                       spec.get("dtype", "fp16"), bool(spec.get("causal")), kv_heads=spec.get("kv_heads"),
                       l2_bytes=l2_bytes, sms=sms, attnscope_impl=impl, kernel=kernel)


def attnscope_impl_of(spec: dict, kernels: list[str] | None = None) -> str:
    """``attnscope_impl`` of model/l2.py for an ncu spec (`estimate_of`): "portable" where the measured call
    ran the portable kernel and no Gluon one, else "auto"."""
    ran_portable = spec["impl"] == "attnscope" and bool(kernels) and \
        any(PORTABLE_KERNEL in k for k in kernels) and not any("hopper" in k for k in kernels)
    return "portable" if ran_portable else "auto"


def compare(measured: list[tuple], l2_bytes: int, sms: int, repeated: bool = False) -> list[Row]:
    """Rows for (spec, measured DRAM bytes[, measured kernel names]) tuples; points measured as 0 bytes are
    skipped, and so are the points of the other families (measure/families.py). ``repeated`` (a sweep
    measured ``--repeat`` times): the tuples of one spec make one row whose
    measurement is the median of theirs (the lower one of an even count: a measured value), in the order
    of the specs' first appearance."""
    groups: dict = {}
    for spec, total, *names in measured:
        if not total or "pass" in spec:  # a family point: families.compare, against its ledger
            continue
        key = json.dumps(spec, sort_keys=True) if repeated else len(groups)
        groups.setdefault(key, (spec, names[0] if names else None, []))[2].append(int(total))
    rows = []
    for spec, names, totals in groups.values():
        e = estimate_of(spec, l2_bytes, sms, names)
        why = not_modelled_of(spec, l2_bytes) or ""
        rows.append(Row(spec, statistics.median_low(totals), None if why else e.total, e.compulsory,
                        () if why else tuple(e.credits), tuple(totals) if len(totals) > 1 else (), why))
    return rows


def not_modelled_of(spec: dict, l2_bytes: int) -> str | None:
    """`l2.not_modelled` for an ncu spec: why its estimate makes no +-10 % promise, or None."""
    return l2.not_modelled(spec["impl"], spec["n"], spec["d"], spec["heads"], spec.get("batch", 1),
                           spec.get("dtype", "fp16"), bool(spec.get("causal")), kv_heads=spec.get("kv_heads"),
                           l2_bytes=l2_bytes)


BANDS = (0.05, 0.10, 0.15)


def summarize(rows: list[Row], worst: int = 8) -> dict:
    """The error distribution: count, within each of `BANDS` (a point with no estimate is within none),
    mean |error| and the ``worst`` points of those estimated, the points whose estimate is below the
    compulsory bytes without a stated reason, and those not modelled."""
    est = [r for r in rows if r.estimate is not None]
    errs = [abs(r.error) for r in est]
    ranked = sorted(est, key=lambda r: -abs(r.error))
    out = {"count": len(rows),
           "within": {f"{b:.0%}": sum(e <= b + 1e-12 for e in errs) for b in BANDS},
           "mean_abs_error": sum(errs) / len(errs) if errs else None,
           "worst": [{"point": r.label(), "error": r.error} for r in ranked[:worst]],
           "silently_below_compulsory": [r.label() for r in rows if r.silently_below],
           "not_modelled": [r.label() for r in rows if r.estimate is None]}
    repeated = [r for r in rows if r.runs]
    if repeated:  # how far the counters themselves move between runs of one point
        spreads = sorted(r.spread for r in repeated)
        top = max(repeated, key=lambda r: r.spread)
        out["run_spread"] = {"points": len(repeated), "median": statistics.median(spreads),
                             "max": top.spread, "max_point": top.label(),
                             "over": {f"{b:.0%}": sum(x > b + 1e-12 for x in spreads) for b in BANDS}}
    return out


def summary_lines(s: dict) -> list[str]:
    """The distribution as plain lines (the CLI prints them under the table)."""
    n = s["count"]
    if not n:
        return ["no measured points"]
    within = ", ".join(f"±{k}: {v}/{n}" for k, v in s["within"].items())
    mean = "none estimated" if s["mean_abs_error"] is None else f"mean |error| {s['mean_abs_error']:.1%}"
    lines = [f"estimate vs ncu over {n} points: {within}; {mean}",
             "worst: " + "; ".join(f"{w['point']} ({w['error']:+.1%})" for w in s["worst"])]
    if skipped := s.get("not_modelled"):
        lines.append(f"not modelled (no estimate, within no band): {len(skipped)}: " + "; ".join(skipped))
    below = s["silently_below_compulsory"]
    lines.append(f"below the compulsory bytes without a stated reason: {len(below)}"
                 + (": " + "; ".join(below) if below else ""))
    if (rs := s.get("run_spread")) is not None:
        over = ", ".join(f"over {k}: {v}" for k, v in rs["over"].items())
        lines.append(f"run-to-run spread of the counters (largest / smallest run - 1) over {rs['points']} "
                     f"points measured more than once: median {rs['median']:.1%}, max {rs['max']:.1%} "
                     f"({rs['max_point']}); {over}; each point's error is against its median run")
    return lines


def sweep_json(points: list[ncu.Point], rows: list[Row], env: dict,
               family_rows: list[families.FamilyRow] = ()) -> dict:
    """What `--sweep --json` writes: the environment, every point's raw counters (or its error), the
    forward rows and their summary, the other families' rows against their ledgers (``family_rows``,
    ``family_summary``: no estimate). `rows_from_json` reads it back."""
    out = {"kind": "attnscope-bytes-sweep", "env": env, "points": [p.to_json() for p in points],
           "rows": [r.to_json() for r in rows], "summary": summarize(rows)}
    if family_rows:
        out |= {"family_rows": [r.to_json() for r in family_rows],
                "family_summary": families.summarize(list(family_rows))}
    return out


def rows_from_json(path, field: str = "--from-json", l2_bytes: int | None = None,
                   sms: int | None = None) -> tuple[list[Row], dict]:
    """Re-evaluate the current estimate against a recorded sweep (no GPU): (rows, env); env is the
    recorded one plus ``estimated_with``, the L2 size and SM count the estimate used, and
    ``family_rows``, the other families' points against their ledgers (`families.compare`)."""
    data = inputs.load_json(path, field)
    if not (isinstance(data, dict) and data.get("kind") == "attnscope-bytes-sweep"
            and isinstance(data.get("points"), list) and isinstance(data.get("env"), dict)):
        raise InputError(f"{field}: expected a file `attnscope bytes --sweep --json` wrote, got "
                         f"{short(data)}")
    env = data["env"]
    repeat = env.get("repeat", 1)
    expect(is_int(repeat) and 1 <= repeat <= MAX_REPEAT,
           f"{field}: env.repeat", f"an integer in [1, {MAX_REPEAT}]", repeat)
    # the caller's --l2-bytes / --sms (validated by the caller) override the recorded ones
    l2_size = machine_int(f"{field}: env.l2_bytes", env.get("l2_bytes"), L2_RANGE) if l2_bytes is None \
        else l2_bytes
    sm = machine_int(f"{field}: env.sms", env.get("sms"), SMS_RANGE) if sms is None else sms
    pairs, runs = [], {}
    for i, p in enumerate(data["points"]):
        where = f"{field} point {i + 1}"
        expect(isinstance(p, dict), where, "an object with spec and measured", p)
        expect(isinstance(p.get("spec"), dict), f"{where}: spec", "an object of grid fields", p.get("spec"))
        spec = point(p["spec"], where)  # an unknown field ("kv_head") is refused, not dropped
        key = json.dumps(spec, sort_keys=True)  # a family spec holds lists (cache_lens, lens)
        runs[key] = runs.get(key, 0) + 1
        if runs[key] > repeat:
            raise InputError(f"{where}: spec: expected each point {repeat} time{'s' if repeat > 1 else ''} "
                             f"(env.repeat), got it {runs[key]} times")
        m = p.get("measured")
        if m is None:
            continue
        expect(isinstance(m, dict), f"{where}: measured", "an object with total and kernels", m)
        total, read, write = (_byte_count(f"{where}: measured.{k}", m.get(k))
                              for k in ("total", "read", "write"))
        if total != read + write:
            raise InputError(f"{where}: measured.total: expected read + write ({read + write:,}), got "
                             f"{total:,}")
        kernels = m.get("kernels")
        expect(isinstance(kernels, list), f"{where}: measured.kernels", "a list of kernels", kernels)
        names = [k.get("name", "") for k in kernels if isinstance(k, dict)]
        expect(all(isinstance(x, str) for x in names), f"{where}: measured.kernels", "string names",
               next((x for x in names if not isinstance(x, str)), None))
        sums = [0, 0]
        for j, k in enumerate(kernels):
            at = f"{where}: measured.kernels[{j}]"
            expect(isinstance(k, dict) and isinstance(k.get("name"), str), at, "an object with a string name",
                   k)
            kr, kw = (_byte_count(f"{at}.{x}", k.get(x)) for x in ("read", "write"))
            sums = [sums[0] + kr, sums[1] + kw]
        if sums != [read, write]:  # what `ncu.Measured` records: its totals are its kernels' sums
            raise InputError(f"{where}: measured.kernels: expected kernels whose bytes add up to "
                             f"measured.read and .write ({read:,}, {write:,}), got {sums[0]:,}, {sums[1]:,}")
        pairs.append((spec, total, names))
    if "partial" not in env:  # a sweep cut short records fewer runs; a whole one, `repeat` of each point
        short_of = next((json.loads(k) for k, n in runs.items() if n != repeat), None)
        expect(short_of is None, f"{field}: points", f"each point {repeat} times (env.repeat)", short_of)
    if not pairs:
        raise InputError(f"{field}: points: expected at least one measured point, got "
                         f"{'none' if not data['points'] else 'only failed ones'}")
    # the recorded env stays as recorded; what the estimate used (an override or the recorded) beside it
    fam = families.compare(pairs, repeated=repeat > 1, l2_bytes=l2_size, sms=sm)
    return compare(pairs, l2_size, sm, repeated=repeat > 1), {**env, "estimated_with": {"l2_bytes": l2_size,
                                                                                          "sms": sm},
                                                              "family_rows": fam}


def spec_label(spec: dict) -> str:
    """A grid point in one line, as the sweep's tables name it."""
    return families.label(spec) if "pass" in spec else Row(spec, 1, 0, 0, ()).label()


def grid_digest(specs: list[dict]) -> str:
    """sha256 of the specs a sweep measures (``--repeat`` rounds included), in order: the sweep's env
    records it (``grid_sha256``), so `resume_points` tells the same grid from another."""
    return hashlib.sha256(json.dumps(specs, sort_keys=True).encode()).hexdigest()


def resume_points(path, specs: list[dict], rounds: int, cache_control: str,
                  field: str = "--resume") -> tuple[dict[int, ncu.Point], dict]:
    """The measured points of a sweep JSON (`--sweep --json`, whole or cut short) by index into the
    grid ``specs`` (``rounds`` times the grid's points), and the file's env; its failed points are left
    out (measured again).

    The file must be of the same grid: the same ``repeat``, the same number of points (env.partial's
    "k/N", else its point count), the same `grid_digest` where it records one, and its points' specs
    those of ``specs`` in the same order (a prefix where it records no digest: what a sweep wrote
    before the digest). Its points must have been measured with ``cache_control``. Every violation is
    one InputError line.
    """
    rows_from_json(path, field)  # every field of the file checked, as --from-json does
    data = inputs.load_json(path, field)
    env, recorded = data["env"], data["points"]
    expect(env.get("repeat", 1) == rounds, f"{field}: env.repeat", f"{rounds} (--repeat)",
           env.get("repeat", 1))
    total = len(recorded)
    if "partial" in env:
        part = env["partial"]
        done, _, of = part.partition("/") if isinstance(part, str) else ("", "", "")
        expect(done.isdigit() and of.isdigit() and int(done) == len(recorded), f"{field}: env.partial",
               f"'{len(recorded)}/N' (its point count over the grid's)", part)
        total = int(of)
    expect(total == len(specs), field, f"a sweep of the grid's {len(specs)} points (--sweep, --repeat)",
           f"a sweep of {total}")
    if "grid_sha256" in env:
        expect(env["grid_sha256"] == grid_digest(specs), f"{field}: env.grid_sha256",
               "the digest of the grid's points (a sweep of this grid)", env["grid_sha256"])
    keys = [json.dumps(s, sort_keys=True) for s in specs]
    out: dict[int, ncu.Point] = {}
    at = 0
    for j, p in enumerate(recorded):
        where = f"{field} point {j + 1}"
        spec = point(p["spec"], where)
        key = json.dumps(spec, sort_keys=True)
        start = at
        while at < len(keys) and keys[at] != key and "grid_sha256" in env:
            at += 1
        if at >= len(keys) or keys[at] != key:
            want = f"its point {start + 1} ({spec_label(specs[start])})" if start < len(keys) else "none"
            raise InputError(f"{where}: spec: expected the grid's points in its order, here {want}"
                             f"{' or a later one' if 'grid_sha256' in env else ''}, got {spec_label(spec)}")
        m = p.get("measured")
        if m is not None:
            expect(m.get("cache_control") == cache_control, f"{where}: measured.cache_control",
                   f"{cache_control!r} (--cache-control)", m.get("cache_control"))
            kernels = [ncu.KernelBytes(k.get("id", i), k["name"], k["read"], k["write"])
                       for i, k in enumerate(m["kernels"])]
            version = str(m.get("ncu_version", ""))
            out[at] = ncu.Point(specs[at], ncu.Measured(kernels, cache_control, version))
        at += 1
    return out, env


NO_KERNEL = "no SM kernel was profiled (a copy-engine transfer is invisible to ncu)"


def calibration_rows(points: list[ncu.Point]) -> list[dict]:
    """Counter / exact ratios of each calibration stream, and the slope between its two sizes.

    Each row: kind, bytes, exact and measured read/write, ratio (measured / exact, of the side that is
    not zero; for copy, of the total). The slope rows use (measured(large) - measured(small)) /
    (exact(large) - exact(small)).
    """
    out, by_kind = [], {}
    for p in points:
        if p.measured is None:
            out.append({"kind": p.spec["kind"], "bytes": p.spec["bytes"], "error": p.error})
            continue
        er, ew = ncu.exact_bytes(p.spec)
        m = p.measured
        if not m.kernels:  # e.g. a copy-engine transfer: no SM kernel, nothing for the counters to see
            out.append({"kind": p.spec["kind"], "bytes": p.spec["bytes"], "error": NO_KERNEL})
            continue
        exact, got = er + ew, (m.read if not ew else m.write if not er else m.total)
        row = {"kind": p.spec["kind"], "bytes": p.spec["bytes"], "exact_read": er, "exact_write": ew,
               "read": m.read, "write": m.write, "ratio": got / exact}
        out.append(row)
        by_kind.setdefault(p.spec["kind"], []).append((exact, got))
    for kind, pts in by_kind.items():
        if len(pts) >= 2:
            (e0, g0), (e1, g1) = sorted(pts)[0], sorted(pts)[-1]
            if e1 > e0:
                out.append({"kind": kind, "bytes": "slope", "ratio": (g1 - g0) / (e1 - e0)})
    return out
