"""The benchmark sweep driver: attnscope's kernels against PyTorch SDPA backends, same inputs, same run.

Used by `attnscope bench` (its arguments: cli/gpu.py) and `bench/prefill.py`. GPU only. Method:
- correctness first: at every shape, a kernel's output is checked at the full shape against a float64
  reference (a sample of heads, on the GPU) with `attnscope.checks.kernel_tolerance` (2 x SDPA FLASH's
  error + 1e-3); a kernel that fails is not timed;
- timings are medians of CUDA-event timings after warm-up (`triton.testing.do_bench`); decode is timed
  as CUDA-graph replays (the kernels' own time) and eagerly (host launch overhead included);
- TFLOP/s = `attnscope.model.flops.attention_flops` / time; decode TB/s = K and V bytes read / time;
- every peer runs in the same process on the same tensors; SDPA backends are forced with
  `torch.nn.attention.sdpa_kernel`, so a backend that cannot take the input reports "n/a".
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import time

from rich import progress as rp
from rich.console import Console

import attnscope
from attnscope.checks import kernel_tolerance, within_tolerance
from attnscope.errors import InputError, expect, finite_real, visible
from attnscope.inputs import load_json, write_all
from attnscope.measure.backends import attention_fn, require_cuda
from attnscope.measure.plots import draw_plots, write_plots
from attnscope.model.flops import attention_flops

PREFILL_NS = (512, 1024, 2048, 4096, 8192, 16384)
DECODE_GRID = ((1, 32, 32), (1, 32, 8), (16, 32, 8), (64, 32, 8))
DECODE_LS = (4096, 32768, 131072)


class Progress(rp.Progress):
    """The sweep's progress: a `rich.progress` bar on stderr; result lines print above it (stdout)."""

    def __init__(self, total: int):
        super().__init__(*rp.Progress.get_default_columns(), rp.MofNCompleteColumn(),
                         console=Console(stderr=True))
        self.total, self.done = max(1, total), 0
        self._task = self.add_task("bench", total=self.total)

    def step(self, label: str = "bench") -> None:
        self.done = min(self.total, self.done + 1)
        self.update(self._task, completed=self.done, description=label)


def _median_ms(fn, graph: bool = False) -> float:
    """Median ms over repetitions with CUDA events; ``graph``: replays of a captured CUDA graph, which
    leaves host launch overhead out (how serving engines run decode)."""
    import triton

    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def host_us_per_call(torch, calls: dict, n: int, rounds: int = 5) -> dict:
    """Host microseconds per call of each of ``calls`` (name -> no-argument callable): 20 warm-up calls
    each, then ``rounds`` rounds that each time ``n`` back-to-back calls of every callable in turn (the
    issuing loop: where a call's GPU work is shorter than its launch, what the GPU waits on), synchronised
    before and after each loop; the median round per callable. Interleaved rounds put every callable
    through the same drift of the host (one loop of identical code has read 27 and 47 µs five minutes
    apart on a shared GPU host), so their ratios hold where a single loop each would not."""
    import statistics
    import time

    for fn in calls.values():
        for _ in range(20):
            fn()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(ts) for name, ts in times.items()}


def _ref_error(torch, out, q, k, v, causal, heads=2, rows=2048, window=None):
    """Max abs error of ``out`` against float64 attention on heads [0, heads) of batch 0 (all keys,
    the last ``rows`` queries: the causal rows that see the most keys); ``window``: a sliding window
    (`reference.permitted`'s mask of those rows: bottom-right aligned, as in the whole call; a row with no
    visible key is 0)."""
    g = q.shape[1] // k.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    r0 = max(0, nq - rows)
    qs = q[0, :heads, r0:].double()
    ks, vs = (t[0, [h // g for h in range(heads)]].double() for t in (k, v))  # the kv head of each
    s = qs @ ks.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if window is not None:
        from attnscope import reference

        keep = torch.as_tensor(reference.permitted(nq - r0, nk, bool(causal), window), device=s.device)
        ref = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0) @ vs
        return (out[0, :heads, r0:].double() - ref).abs().max().item()
    if causal:  # query r sees key c iff c <= r + (nk - nq); row i of s is query r0 + i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu_(r0 + nk - nq + 1), float("-inf"))
    ref = torch.softmax(s, dim=-1) @ vs
    return (out[0, :heads, r0:].double() - ref).abs().max().item()


def _fmt(x, nd=1):
    return "n/a" if x is None else f"{x:.{nd}f}"


def _measure_point(torch, row, impls, err_of, work, where, log):
    """Every implementation at one shape: its error (``err_of(out)``), checked for attnscope's kernels
    against SDPA FLASH's own error, then unless the check failed its median ms and ``work`` (FLOPs, or a
    decode row's K and V bytes) / time; decode times CUDA-graph replays, then eagerly. ``impls`` are
    ``name: fn()``; an implementation that raises is reported "n/a", not fatal. Logs the point's line."""
    decode = "tbs" in row
    rates = row["tbs"] if decode else row["tflops"]
    try:
        ref_err = err_of(impls["flash"]())
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        ref_err = None
        log(f"  flash failed at this shape: {e!r}"[:200])
    for name, fn in impls.items():
        try:
            row["err"][name] = err = err_of(fn())  # its output is freed before it is timed
            if name.startswith("attnscope") and ref_err is not None and not within_tolerance(err, ref_err):
                log(f"  FAIL {name} {where}: err {err:.3g} > {kernel_tolerance(ref_err):.3g} "
                    f"(2 x {ref_err:.3g} + 1e-3); not timed")
                row["ms"][name] = None
                continue
            row["ms"][name] = ms = _median_ms(fn, graph=decode)
            rates[name] = work / ms / 1e9
            if decode:  # eagerly too: host launch overhead included
                row["tbs_eager"][name] = work / _median_ms(fn) / 1e9
        except Exception as e:  # noqa: BLE001
            row["ms"][name] = row["err"][name] = None
            log(f"  {name} n/a at {where}: {type(e).__name__}: {str(e)[:120]}")
        torch.cuda.empty_cache()
    for peer in ("cudnn", "flash"):  # attnscope's rate over each peer's, where both were measured
        a, p = rates.get("attnscope"), rates.get(peer)
        row[f"vs_{peer}"] = a / p if a and p else None
    log((decode_line if decode else prefill_line)(row))


def prefill_sweep(torch, ns, ds, tokens, heads, naive=True, dtypes=None, log=print, *, progress):
    names = ("attnscope", "flash", "cudnn", "efficient") + (("naive",) if naive else ())  # naive: spec §1
    results = []
    for dtype, d, causal, n in itertools.product(dtypes or [torch.bfloat16], ds, (False, True), ns):
        b = max(1, tokens // n)
        torch.manual_seed(n + d)
        q, k, v = (torch.randn(b, heads, n, d, device="cuda", dtype=dtype) for _ in range(3))
        flops = attention_flops(b, heads, n, n, d, causal)
        row = {"dtype": str(dtype).replace("torch.", ""), "d": d, "causal": causal, "n": n,
               "batch": b, "heads": heads, "tflops": {}, "ms": {}, "err": {}}
        calls = {name: functools.partial(attention_fn(name, causal), q, k, v) for name in names}
        _measure_point(torch, row, calls, functools.partial(_ref_error, torch, q=q, k=k, v=v, causal=causal),
                       flops, f"d={d} causal={causal} n={n}", log)
        results.append(row)
        progress.step(f"prefill {row['dtype']} d={d} causal={int(causal)} N={n}")
    return results


def read_ceiling(torch, gib=4, nbytes=None):
    """A read-only streaming ceiling: sum of a large bf16 tensor (bytes read / time), TB/s. ``nbytes``: of a
    tensor of that many bytes instead of ``gib`` GiB (a read of a given size, its fixed costs included)."""
    size = gib * 2**30 if nbytes is None else int(nbytes)
    x = torch.randn(size // 2, device="cuda", dtype=torch.bfloat16)
    return x.numel() * 2 / _median_ms(lambda: x.sum(dtype=torch.float32)) / 1e9


def decode_sweep(torch, grid=DECODE_GRID, ls=DECODE_LS, d=128, dtype=None, log=print, *, progress):
    dtype = dtype or torch.bfloat16
    results = []
    for (b, hq, hkv), L in itertools.product(grid, ls):
        torch.manual_seed(L + b)
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, L, d, device="cuda", dtype=dtype) for _ in range(2))
        kv_bytes = 2 * b * hkv * L * d * q.element_size()
        row = {"batch": b, "hq": hq, "hkv": hkv, "L": L, "kv_mib": kv_bytes / 2**20, "tbs": {}, "ms": {},
               "tbs_eager": {}, "err": {}}
        impls = {"attnscope": functools.partial(attnscope.flash_decode, q, k, v),
                 "attnscope_1split": functools.partial(attnscope.flash_decode, q, k, v, num_splits=1)}
        impls |= {name: functools.partial(attention_fn(name, False), q, k, v) for name in ("flash", "cudnn")}
        err_of = functools.partial(_ref_error, torch, q=q, k=k, v=v, causal=False, heads=min(hq, 8))
        _measure_point(torch, row, impls, err_of, kv_bytes, f"B={b} Hq={hq} Hkv={hkv} L={L}", log)
        results.append(row)
        progress.step(f"decode B={b} Hkv={hkv} L={L}")
    return results


def environment(torch) -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": p.name,
            "sms": p.multi_processor_count, "l2_bytes": p.L2_cache_size,
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version()}


def prefill_line(row: dict) -> str:
    """One prefill point as the sweep prints it and `--from-json` replays it."""
    err = row.get("err", {})
    errs = (f" | err attnscope={_fmt(err.get('attnscope'), 5)} flash={_fmt(err.get('flash'), 5)}"
            if err else "")
    return (f"{row['dtype']} d={row['d']:3d} causal={int(row['causal'])} N={row['n']:5d} "
            f"B={row['batch']:2d} | " + " ".join(f"{k}={_fmt(v)}" for k, v in row["tflops"].items())
            + f" TFLOP/s | /cudnn={_fmt(row.get('vs_cudnn'), 3)} /flash={_fmt(row.get('vs_flash'), 3)}"
            + errs)


def decode_line(row: dict) -> str:
    """One decode point (CUDA-graph TB/s, then eager) as the sweep prints it and `--from-json` replays it."""
    def rates(d):
        return " ".join(f"{k}={_fmt(v, 2)}" for k, v in d.items()) + " TB/s"

    eager = f" | eager: {rates(row['tbs_eager'])}" if row.get("tbs_eager") else ""
    return (f"decode B={row['batch']:2d} Hq={row['hq']} Hkv={row['hkv']:2d} L={row['L']:6d} "
            f"KV={row['kv_mib']:8.1f} MiB | graph: {rates(row['tbs'])} | "
            f"/cudnn={_fmt(row.get('vs_cudnn'), 3)} /flash={_fmt(row.get('vs_flash'), 3)}" + eager)


#: The fields `--from-json` reads from each recorded row, and their types (what the sweep writes).
_INT, _NUM, _RATES = "a positive integer", "a finite number", "an object of name: number or null"
_ERRS = "an object of name: error or null"
_ROW_FIELDS = {
    "prefill": {"dtype": "a dtype name", "d": _INT, "causal": "true or false", "n": _INT, "batch": _INT,
                "heads": _INT, "tflops": _RATES},
    "decode": {"batch": _INT, "hq": _INT, "hkv": _INT, "L": _INT, "kv_mib": _NUM, "tbs": _RATES},
}
_OPTIONAL = {"vs_cudnn": _NUM, "vs_flash": _NUM, "err": _ERRS, "tbs_eager": _RATES, "ms": _RATES}
#: Every recorded number is at most `MAX_RECORDED`: far above any GPU's TFLOP/s, TB/s, ms or sequence
#: length, low enough that a typo (10**29, 1e308) is refused instead of printed as a 309-digit number;
#: every one but an error (`_ERRS`, from 0) is positive.
MAX_RECORDED = 10**9
_IN_RANGE = {_INT: "a positive integer up to 10^9", _NUM: "a positive number up to 10^9",
             _RATES: "an object of name: positive number up to 10^9 or null",
             _ERRS: "an object of name: number from 0 to 10^9 or null"}


def _field_ok(kind: str, value) -> bool:
    if kind in (_INT, _NUM):
        return finite_real(value) and (kind == _NUM or isinstance(value, int) and value > 0)
    if kind in (_RATES, _ERRS):
        return isinstance(value, dict) and all(v is None or _field_ok(_NUM, v) for v in value.values())
    return isinstance(value, bool) if kind == "true or false" else isinstance(value, str)


def _in_range(kind: str, value) -> bool:
    """A value `_field_ok` accepts is also within `_IN_RANGE[kind]` (other kinds: always)."""
    if kind in (_INT, _NUM):
        return 0 < value <= MAX_RECORDED
    if kind in (_RATES, _ERRS):
        low = 0 if kind == _ERRS else 1e-300
        return all(v is None or low <= v <= MAX_RECORDED for v in value.values())
    return True


#: Bounds on what `--from-json` prints and plots (a few seconds of drawing at the worst case).
MAX_TEXT, MAX_PANELS, MAX_D, MAX_ENV = 200, 16, 512, 32
MAX_ROWS = {"prefill": 512, "decode": 64}  # decode: one bar group per row
#: The implementations a recorded row may name (what the sweeps measure).
BACKENDS = {"prefill": ("attnscope", "flash", "cudnn", "efficient", "naive", "math", "auto", "portable"),
            "decode": ("attnscope", "attnscope_1split", "flash", "cudnn")}
#: Recorded values derived from others agree with them to this relative tolerance.
RTOL = 0.01


def _agree(at: str, recorded: float, derived: float, how: str) -> None:
    expect(abs(recorded - derived) <= RTOL * abs(derived), at, f"{how} = {derived:.6g} (within 1 %)",
           recorded)


def _text(at: str, value: str, expected: str = f"at most {MAX_TEXT} characters") -> None:
    if len(value) > MAX_TEXT:
        raise InputError(f"{at}: expected {expected}, got {len(value)} characters")


def _bounded(result: dict) -> None:
    """Refuse (one line naming the field) what would make `--from-json` print or plot without bound or print
    numbers that contradict each other: long text, too many rows, panels or env fields, unknown backends,
    duplicate rows, rates that disagree with their ms and FLOPs (or K and V bytes), ratios that disagree
    with the rates."""
    env = result.get("env", {})
    expect(len(env) <= MAX_ENV, "--from-json env", f"at most {MAX_ENV} fields", f"{len(env)} fields")
    for key, value in env.items():
        _text("--from-json env", key, f"field names of at most {MAX_TEXT} characters")
        at, expected = f"--from-json env.{key}", f"a number or a string of at most {MAX_TEXT} characters"
        expect(value is None or isinstance(value, (bool, int, float, str)), at, expected,
               type(value).__name__)
        if isinstance(value, str):
            _text(at, value, expected)
    panels = set()
    for key in ("prefill", "prefill_fp16", "decode"):
        rows = result.get(key, [])
        kind = "decode" if key == "decode" else "prefill"
        expect(len(rows) <= MAX_ROWS[kind], f"--from-json {key}", f"at most {MAX_ROWS[kind]} rows", len(rows))
        seen = {}
        for i, row in enumerate(rows):
            at = f"--from-json {key}[{i}]"
            for name in ("tflops", "tbs", "tbs_eager", "ms", "err"):
                unknown = sorted(set(row.get(name) or {}) - set(BACKENDS[kind]))
                expect(not unknown, f"{at}.{name}", f"backends among {', '.join(BACKENDS[kind])}",
                       unknown[0] if unknown else None)
            if kind == "prefill":
                _text(f"{at}.dtype", row["dtype"])
                expect(row["d"] <= MAX_D, f"{at}.d", f"a head dim from 1 to {MAX_D}", row["d"])
                ident = (row["dtype"], row["d"], row["causal"], row["n"])
                panels.add((row["d"], row["causal"]))
                expect(len(panels) <= MAX_PANELS, f"{at}.d",
                       f"at most {MAX_PANELS} distinct (d, causal) panels", len(panels))
                work, rates, unit = (attention_flops(row["batch"], row["heads"], row["n"], row["n"], row["d"],
                                                     row["causal"]), row["tflops"], "FLOPs")
            else:
                ident = (row["batch"], row["hq"], row["hkv"], row["L"])
                kv = 2 * row["batch"] * row["hkv"] * row["L"] * 128 * 2  # decode_sweep: d = 128, bf16
                _agree(f"{at}.kv_mib", row["kv_mib"], kv / 2**20, "2 x batch x hkv x L x 128 x 2 bytes / MiB")
                work, rates, unit = kv, row["tbs"], "K and V bytes"
            if ident in seen:
                raise InputError(f"{at}: expected rows that differ in their shape, got a duplicate of "
                                 f"{key}[{seen[ident]}]")
            seen[ident] = i
            for name, rate in rates.items():
                ms = (row.get("ms") or {}).get(name)
                if rate is not None and ms is not None:
                    _agree(f"{at}.{'tbs' if kind == 'decode' else 'tflops'}.{name}", rate, work / ms / 1e9,
                           f"{unit} / ms.{name}")
            for peer in ("cudnn", "flash"):
                ratio, a, p = row.get(f"vs_{peer}"), rates.get("attnscope"), rates.get(peer)
                if ratio is not None:
                    expect(bool(a and p), f"{at}.vs_{peer}", f"none without the attnscope and {peer} rates",
                           ratio)
                    _agree(f"{at}.vs_{peer}", ratio, a / p, f"attnscope / {peer} rate")


def _from_json(args) -> int:
    result = load_json(args.from_json, "--from-json")
    if not isinstance(result, dict) or not ({"prefill", "decode"} & set(result)):
        raise InputError(f"--from-json: expected a result with 'prefill' or 'decode' rows, got "
                         f"{sorted(result) if isinstance(result, dict) else type(result).__name__}")
    # every recorded row has the fields the lines and plots read, of the right type (one line if not)
    for key in ("prefill", "prefill_fp16", "decode"):
        rows = result.get(key, [])
        expect(isinstance(rows, list), f"--from-json {key}", "a list of rows", rows)
        fields = _ROW_FIELDS["decode" if key == "decode" else "prefill"]
        for i, row in enumerate(rows):
            expect(isinstance(row, dict), f"--from-json {key}[{i}]", "an object", row)
            for name, kind in (*fields.items(), *_OPTIONAL.items()):
                value = row.get(name)
                if value is None and name in _OPTIONAL:
                    continue
                at = f"--from-json {key}[{i}].{name}"
                expect(_field_ok(kind, value), at, kind, value)
                expect(_in_range(kind, value), at, _IN_RANGE.get(kind, kind), value)
    _bounded(result)
    ceiling = result.get("read_ceiling_tbs")
    if ceiling is not None:
        expect(_field_ok(_NUM, ceiling), "--from-json read_ceiling_tbs", _NUM, ceiling)
        expect(_in_range(_NUM, ceiling), "--from-json read_ceiling_tbs", _IN_RANGE[_NUM], ceiling)
    expect(isinstance(result.get("env", {}), dict), "--from-json env", "an object", result.get("env"))
    # drawn and written before anything is printed: a bad --plots is the only output
    plots = write_plots(result, args.plots) if args.plots else []
    lines = [prefill_line(row) for row in result.get("prefill", []) + result.get("prefill_fp16", [])]
    lines += [decode_line(row) for row in result.get("decode", [])] + [f"plot: {path}" for path in plots]
    print("\n".join(["# " + json.dumps(result.get("env", {})), *map(visible, lines)]))
    return 0


def run(args) -> int:
    if getattr(args, "from_json", None):
        return _from_json(args)
    torch = require_cuda()
    out = {"env": environment(torch)}
    print("# " + json.dumps(out["env"]), flush=True)
    ds = args.d or [64, 128]
    ns = args.n or (list(PREFILL_NS) if not args.quick else [1024, 4096])
    grid = DECODE_GRID if not args.quick else DECODE_GRID[1:3]
    ls = DECODE_LS if not args.quick else (4096, 32768)
    prefill = args.kind in ("prefill", "all")
    fp16_extra = prefill and not args.quick
    decode = args.kind in ("decode", "all")
    total = (prefill * len(ds) * 2 * len(ns) + fp16_extra * 2 + decode * len(grid) * len(ls))
    log = functools.partial(print, flush=True)  # while the bar is live, rich prints this above it
    with Progress(total) as progress:
        sweep = functools.partial(prefill_sweep, torch, tokens=args.tokens, heads=args.heads,
                                  naive=not args.no_naive, log=log, progress=progress)
        if prefill:
            out["prefill"] = sweep(ns=ns, ds=ds)
            if fp16_extra:
                out["prefill_fp16"] = sweep(ns=[4096], ds=[128], dtypes=[torch.float16])
        if decode:
            out["read_ceiling_tbs"] = read_ceiling(torch)
            log(f"read ceiling (sum of 4 GiB bf16): {out['read_ceiling_tbs']:.2f} TB/s")
            out["decode"] = decode_sweep(torch, grid, ls, log=log, progress=progress)
    files = {path: json.dumps(out, indent=1) for path in (args.out, args.json if args.json != "-" else None)
             if path}
    plots = draw_plots(out, args.plots) if args.plots else {}
    write_all(files | plots, "--out")  # all or nothing: the results and every plot
    if args.json == "-":
        print(json.dumps(out, indent=1))
    for path in plots:
        print(f"plot: {visible(str(path))}")
    return 0

