"""The GPU subcommands: `which`, `bytes`, `share` (measure/) and `bench` (measure/bench.py).

Each needs torch with a CUDA GPU (`bytes` also needs Nsight Compute's ``ncu``); without one it says so
in one line and exits 2. Nothing here imports torch at module level: the parser builds on any machine.
`bytes --estimate-only` needs no GPU: it prints the logical model and the L2-aware estimate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path

from attnscope.cli import family_bytes, serving
from attnscope.cli._out import MiB, _clean, console, int_list, path_arg, print_json, table
from attnscope.cli.closed_loop import loop_rows
from attnscope.errors import InputError, expect, positive_int, visible
from attnscope.inputs import distinct, out_file, write_atomic
from attnscope.measure import backends, families, ncu, physical, share
from attnscope.measure.backends import gpu_problem
from attnscope.measure.plots import PLOT_NAMES
from attnscope.model import l2 as l2_model

SPEC = "(default: %(default)s)"
#: `_shape`'s defaults: with --cache-lens a value other than these is refused (the cache lengths and
#: their count replace them), never ignored.
_SHAPE_DEFAULTS = {"n": 4096, "batch": 1, "causal": False, "impl": "flash"}
#: Every shape flag's default: with --sweep, --from-json or --calibrate another value is refused (a grid row
#: names its own shape), never ignored.
_GRID_DEFAULTS = {**_SHAPE_DEFAULTS, "d": 128, "heads": 32, "dtype": "fp16", "window": None, "family": None}


def _fail(command: str, message: str, code: int = 2) -> int:
    print(f"attnscope {command}: error: {visible(message)}", file=sys.stderr)
    return code


def _no_gpu(command: str) -> int | None:
    """Exit code 2 after one line when this machine cannot run GPU commands, else None."""
    return _fail(command, why) if (why := gpu_problem()) else None


def _one_line(fn):
    """Wrap a command so a runtime failure on the GPU (out of memory, a backend that cannot run) prints
    one line and exits 1 instead of a traceback."""
    def go(args) -> int:
        try:
            return fn(args)
        except NotImplementedError:  # a RuntimeError, but bad input: main() makes it one line, exit 2
            raise
        except RuntimeError as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return _fail(args.command, f"{type(e).__name__}: {first}", code=1)

    return go


def _shape(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("--n", type=int, default=_SHAPE_DEFAULTS["n"], help=f"sequence length of Q and K/V {SPEC}")
    p.add_argument("--d", type=int, default=_GRID_DEFAULTS["d"], help=f"head dimension {SPEC}")
    p.add_argument("--heads", type=int, default=_GRID_DEFAULTS["heads"], help=f"attention heads {SPEC}")
    p.add_argument("--batch", type=int, default=_SHAPE_DEFAULTS["batch"], help=f"batch size {SPEC}")
    p.add_argument("--dtype", default=_GRID_DEFAULTS["dtype"], choices=["fp16", "bf16"],
                   help=f"element type {SPEC}")
    p.add_argument("--causal", action="store_true", help="causal attention (default: unmasked)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


# --- which -----------------------------------------------------------------------------------------
def _positive(args, *names: str) -> None:
    """The positive-integer flags `names` (attributes of `args`; a list for a repeatable flag), checked
    before the GPU is asked for: bad input is named on any machine, not hidden behind "needs a GPU"."""
    for name in names:
        value = getattr(args, name)
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            positive_int("--" + name.replace("_", "-"), v)


def _which(args) -> int:
    _positive(args, "n", "d", "heads", "batch")
    if (code := _no_gpu("which")) is not None:
        return code
    r = backends.which(args.backend, args.n, args.d, args.heads, args.batch, args.dtype, args.causal)
    if args.json:
        print_json(r.to_json())
    else:
        c = console()
        rows = [[_short(k.name), backends.family(k.name), f"{k.dur_us:,.1f}"] for k in r.kernels]
        shape = f"[{args.batch}, {args.heads}, {args.n}, {args.d}] {args.dtype}, " + \
                ("causal" if args.causal else "unmasked")
        c.print(table(f"Kernels launched by one call, {shape}", ["kernel", "family", "device µs"], rows))
        if r.error:
            c.print(f"{args.backend} refused this input: {r.error}")
        verdict = "ok" if r.ok else "NOT the backend asked for"
        c.print(f"asked: {r.asked}   ran: {r.ran}   ({verdict})")
    return 0 if r.ok else 1


# --- bytes -----------------------------------------------------------------------------------------
#: Largest Q + K + V + O the command accepts: the largest single-GPU memory shipping (288 GB, B300 and
#: MI355X); beyond it there is no call to measure.
MAX_TENSOR_BYTES = 288 * 10**9


def _machine_flags(args) -> None:
    """--sms and --l2-bytes, when given, within `physical.SMS_RANGE` / `L2_RANGE` (0 is refused, not
    "unset")."""
    if args.sms is not None:
        physical.machine_int("--sms", args.sms, physical.SMS_RANGE)
    if args.l2_bytes is not None:
        physical.machine_int("--l2-bytes", args.l2_bytes, physical.L2_RANGE)


def _bytes_decode(args) -> int:
    """`bytes --estimate-only --cache-lens ...`: the decode ledger (`model.serving.paged`, as `traffic
    --cache-lens`) and its time at the device's DRAM bandwidth; with ``--kv-dtype fp8`` beside the same call
    on a cache of the queries' dtype."""
    from attnscope.model import roofline
    from attnscope.model.serving import paged

    for name, default in _SHAPE_DEFAULTS.items():
        expect(getattr(args, name) == default, "--" + name, "none with --cache-lens (its lengths give the "
               "batch and the keys; the ledger is attnscope's split-KV decode, bottom-right causal)",
               getattr(args, name))
    for flag in ("sweep", "from_json", "calibrate", "resume", "warm_workers", "family", "lengths",
                 "deterministic", "kernels"):
        expect(getattr(args, flag) in (None, False), "--" + flag.replace("_", "-"), "none with --cache-lens",
               getattr(args, flag))
    expect(args.repeat == 1, "--repeat", "1 with --cache-lens", args.repeat)
    expect(args.json in (None, "-"), "--json", "no file name with --cache-lens (JSON goes to stdout)",
           args.json)
    if not args.estimate_only:
        raise NotImplementedError("--cache-lens: ncu measurement of a decode call is not supported; "
                                  "supported: --estimate-only (the logical ledger and its DRAM time)")
    for flag in ("l2_bytes", "sms"):  # the ledger is cold-cache logical bytes: no L2 term to set
        expect(getattr(args, flag) is None, "--" + flag.replace("_", "-"), "none with --cache-lens",
               getattr(args, flag))
    dev = roofline.device(args.device)
    nq = 1 if args.nq is None else args.nq
    window = None
    if args.window is not None:
        from attnscope.cli.analytic import window_arg
        from attnscope.model.tiles import normalize_window

        window = normalize_window(True, window_arg(args.window))
        expect(window[0] >= 0, "--window", "L,R with L >= 0 (decode is causal: the left side bounds)",
               args.window)
    kw = dict(nq=nq, d=args.d, dtype=args.dtype, heads=args.heads, kv_heads=args.kv_heads,
              num_splits=args.splits, capacity=args.capacity, window=window)
    lens = int_list("--cache-lens", args.cache_lens)
    g = paged(lens, args.page_size, kv_dtype=args.kv_dtype, **kw)
    base = g if g.kv_dtype == args.dtype else paged(lens, args.page_size, **kw)
    spec = {"pass": "decode", "impl": "attnscope", "heads": args.heads, "kv_heads": args.kv_heads,
            "d": args.d, "dtype": args.dtype, "cache_lens": lens, "page_size": args.page_size,
            "splits": args.splits, "nq": nq,
            **({"kv_dtype": "fp8"} if g.kv_dtype == "fp8" else {}),
            **({"window": list(window)} if window else {})}
    if args.json:
        out = {"impl": "attnscope decode", "device": dev.name, "hbm_bytes_per_s": dev.hbm,
               "ceiling_s": g.row.total / dev.hbm, **g.to_json(),
               "dram_estimate": family_bytes.decode_estimate_json(spec, dev.sms)}
        if base is not g:
            out["vs_kv_dtype"] = {"kv_dtype": base.kv_dtype, "total": base.row.total,
                                  "ceiling_s": base.row.total / dev.hbm}
        print_json(out)
        return 0
    con = console()
    serving.print_paged(con, g)
    con.print(f"DRAM ceiling ({dev.label}, {dev.hbm / 1e12:g} TB/s): {g.row.total / dev.hbm * 1e6:,.2f} µs "
              f"for {g.row.total:,} B")
    con.print(family_bytes.decode_estimate_line(spec, dev.sms))
    if base is not g:
        saved = base.row.total - g.row.total
        con.print(f"vs a cache in {base.kv_dtype}: {base.row.total:,} B, "
                  f"{base.row.total / dev.hbm * 1e6:,.2f} µs; "
                  f"{g.kv_dtype} saves {saved:,} B ({saved / base.row.total:.1%}), "
                  f"{saved / dev.hbm * 1e6:,.2f} µs per call")
    return 0


def _bytes(args) -> int:
    if args.cache_lens is not None:
        return _bytes_decode(args)
    for flag in ("page_size", "capacity", "kv_dtype", "nq"):
        expect(getattr(args, flag) is None, "--" + flag.replace("_", "-"), "to come with --cache-lens",
               getattr(args, flag))
    for flag, default in _GRID_DEFAULTS.items() if args.sweep or args.from_json or args.calibrate else ():
        expect(getattr(args, flag) == default, "--" + flag, "none with --sweep, --from-json or --calibrate "
               "(a grid row names its own)", getattr(args, flag))
    family = args.family or ("window" if args.window is not None or args.impl == "flex" else None)
    for flag, fam in (("lengths", "varlen"), ("deterministic", "backward"), ("kernels", "backward")):
        expect(getattr(args, flag) in (None, False) or family == fam, "--" + flag, f"to come with --family "
               f"{fam}", getattr(args, flag))
    expect(args.splits == 1, "--splits", "to come with --cache-lens", args.splits)
    _machine_flags(args)
    if not 1 <= args.repeat <= physical.MAX_REPEAT:
        raise InputError(f"--repeat: expected an integer in [1, {physical.MAX_REPEAT}], got {args.repeat}")
    if args.repeat > 1 and not args.sweep:  # one call, --from-json (its env says) and --calibrate: 1
        raise InputError(f"--repeat: expected 1 without --sweep, got {args.repeat}")
    expect(args.resume is None or bool(args.sweep) and not args.estimate_only, "--resume",
           "none without a measured --sweep", args.resume)
    expect(args.warm_workers is None or bool(args.sweep or args.calibrate) and not args.estimate_only,
           "--warm-workers", "none without a measured --sweep or --calibrate", args.warm_workers)
    if args.sweep or args.from_json or args.calibrate:
        if args.kv_heads is not None:  # each grid point names its own: never silently ignored
            raise InputError(f"--kv-heads: expected none with --sweep, --from-json or --calibrate (a grid "
                             f"point names its own Hkv), got {args.kv_heads}")
        return _bytes_sweep(args)
    if args.json not in (None, "-"):
        raise InputError(f"--json: expected no file name without --sweep or --calibrate (JSON goes to "
                         f"stdout), got {args.json!r}")
    if family is not None:  # one point of another family: its grid row's spec, ledger and estimate
        _positive(args, "kv_heads")
        spec = family_bytes.family_spec(args, family)
        l2, sms, measured = args.l2_bytes, args.sms, None
        if not args.estimate_only:
            if (code := _no_gpu("bytes")) is not None:
                return code
            l2, sms = _l2_sms(args)
            try:
                measured = ncu.measure_spec(spec, cache_control=args.cache_control)
            except ncu.NcuError as e:
                return _fail("bytes", str(e))
        return family_bytes.family_report(args, spec, measured, l2, sms)

    _positive(args, "n", "d", "heads", "batch", "kv_heads")
    hkv = args.heads if args.kv_heads is None else args.kv_heads
    if args.heads % hkv:
        raise InputError(f"--kv-heads: expected a divisor of --heads ({args.heads}), got {hkv}")
    if args.impl == "naive" and hkv != args.heads:
        raise InputError(f"--kv-heads: expected --heads ({args.heads}) with --impl naive (its GQA path is "
                         f"not modelled), got {hkv}")
    tensors = 2 * args.batch * (args.heads + hkv) * args.n * args.d * \
        (2 if args.dtype in ("fp16", "bf16") else 4)
    if tensors > MAX_TENSOR_BYTES:
        raise InputError(f"--n: expected Q, K, V and O to fit one GPU (at most {MAX_TENSOR_BYTES / 1e9:g} GB "
                         f"with --batch {args.batch}, --heads {args.heads}, --d {args.d}), got "
                         f"{tensors / 1e9:,.4g} GB")
    l2, sms = args.l2_bytes, args.sms
    measured = None
    if not args.estimate_only:
        if (code := _no_gpu("bytes")) is not None:
            return code
        l2, sms = _l2_sms(args)
        try:
            measured = ncu.measure(args.impl, args.n, args.d, args.heads, args.batch, args.dtype, args.causal,
                                   cache_control=args.cache_control, kv_heads=hkv)
        except ncu.NcuError as e:
            return _fail("bytes", str(e))
    est = l2_model.estimate(args.impl, args.n, args.d, args.heads, args.batch, args.dtype, args.causal,
                            l2_bytes=l2, sms=sms, device=args.device, kv_heads=hkv)
    unmodelled = l2_model.not_modelled(args.impl, args.n, args.d, args.heads, args.batch, args.dtype,
                                       args.causal, kv_heads=hkv, l2_bytes=est.params["l2_bytes"])
    logical = l2_model.logical(args.impl, args.n, args.d, args.heads, args.batch, args.dtype, args.causal)
    bh = args.batch * args.heads
    credits = "; ".join(f"{why}: -{b / bh / MiB:,.2f} MiB per head" for why, b in est.credits)
    errors = {"logical_error": l2_model.error(logical, measured.total)} if measured and measured.total else {}
    if errors and not unmodelled:
        errors["estimate_error"] = l2_model.error(est.total, measured.total)
    if args.json:
        print_json({"impl": args.impl, "params": est.params, "logical": logical, "compulsory": est.compulsory,
                    "estimate": None if unmodelled else est.to_json(),
                    **({"note": unmodelled} if unmodelled else {}),
                    "measured": measured.to_json() if measured else None, **errors})
        return 0

    def per_head(b):
        return f"{b / bh / MiB:,.2f}"

    lse = l2_model._WRITES_LSE.get(args.impl, False)  # the logical row counts the implementation's LSE write
    label = "logical model (cold cache, model/traffic.py" + (", incl. the 4 B/row LSE write)" if lse else ")")
    vs = {k: f"{v:+.1%}" for k, v in errors.items()}
    rows = [[label, "", "", per_head(logical), vs.get("logical_error", "")],
            ["physical estimate (L2-aware, model/l2.py)",
             *(["-"] * 3 if unmodelled else [per_head(est.read), per_head(est.write), per_head(est.total)]),
             vs.get("estimate_error", "")]]
    if measured:
        rows.append([f"measured (ncu, cache-control {measured.cache_control})", per_head(measured.read),
                     per_head(measured.write), per_head(measured.total), ""])
    c = console()
    heads = args.heads if hkv == args.heads else f"{args.heads}/{hkv}"
    shape = f"{args.impl}, [{args.batch}, {heads}, {args.n}, {args.d}] {args.dtype}, " + \
            ("causal" if args.causal else "unmasked")
    c.print(table(f"DRAM bytes per (batch, head), MiB: {shape}",
                  ["", "read", "write", "total", "vs measured"], rows,
                  caption=f"L2 {est.params['l2_bytes'] / MiB:,.1f} MiB, {est.params['sms']} SMs"))
    if measured:
        krows = [[_short(k.name), per_head(k.read), per_head(k.write)] for k in measured.kernels]
        c.print(table("Measured per kernel (MiB per head)", ["kernel", "read", "write"], krows,
                      caption=measured.ncu_version or None))
    if unmodelled:
        c.print(f"physical estimate: {unmodelled}")
    else:
        erows = [[k.name, per_head(k.logical_read + k.logical_write), per_head(k.read), per_head(k.write)]
                 for k in est.kernels]
        c.print(table("Estimate per kernel (MiB per head)", ["kernel", "touched", "DRAM read", "DRAM write"],
                      erows))
    c.print(f"compulsory (Q, K, V read once, O{' + LSE' if lse else ''} written once): "
            f"{per_head(est.compulsory)} MiB per head"
            + (f"; {'the estimate is below it by' if est.total < est.compulsory else 'the estimate credits'} "
               f"what it states: {credits}" if credits and not unmodelled else ""))
    return 0


def _l2_sms(args) -> tuple[int, int]:
    """--l2-bytes and --sms, each defaulting to the running GPU's own (there: `_no_gpu` has passed)."""
    if args.l2_bytes and args.sms:
        return args.l2_bytes, args.sms
    import torch

    props = torch.cuda.get_device_properties(0)
    return args.l2_bytes or props.L2_cache_size, args.sms or props.multi_processor_count


def _env(l2: int, sms: int) -> dict:
    import torch  # there: `_no_gpu` has passed

    env = {"l2_bytes": l2, "sms": sms, "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def _write_or_print(args, obj) -> None:
    if args.json == "-":
        print_json(obj)
    elif args.json:
        write_atomic(args.json, json.dumps(_clean(obj), indent=1) + "\n", "--json")


class _Terminated(Exception):
    """SIGTERM arrived while a sweep measured (`timeout` sends it)."""


def _terminated(signum, frame):
    raise _Terminated()


def _warm_workers(args) -> int:
    """--warm-workers: as given (0: off), else half the CPU cores, at most 8."""
    if args.warm_workers is None:
        return min(8, max(1, (os.cpu_count() or 2) // 2))
    expect(isinstance(args.warm_workers, int) and 0 <= args.warm_workers <= 64, "--warm-workers",
           "an integer from 0 to 64", args.warm_workers)
    return args.warm_workers


def _bytes_sweep(args) -> int:
    """--sweep GRID (measure every point), --from-json FILE (re-evaluate a recorded sweep, no GPU),
    --calibrate (streams of known size through the same ncu path)."""
    if sum(map(bool, (args.sweep, args.from_json, args.calibrate))) > 1:
        raise InputError("--sweep: expected one of --sweep, --from-json, --calibrate, got more than one")
    if args.json not in (None, "-"):  # before the tables or minutes of measuring, not after
        out_file(args.json, "--json")
        distinct({"--json": args.json}, {"--sweep": args.sweep, "--from-json": args.from_json})
    if args.estimate_only:  # no GPU: each grid point's ledger, compulsory bytes and estimate
        expect(bool(args.sweep), "--estimate-only", "--sweep GRID (or a single point's flags), not "
               "--from-json or --calibrate", "--from-json" if args.from_json else "--calibrate")
        expect(args.repeat == 1, "--repeat", "1 with --estimate-only", args.repeat)
        return family_bytes.sweep_estimates(args)
    repeat = args.repeat  # checked in `_bytes`; --from-json reads a sweep's own repeat from its env
    # --json alone: JSON on stdout *instead of* the tables, as every other --json
    c = console(quiet=args.json == "-")
    if args.from_json:
        rows, env = physical.rows_from_json(args.from_json, l2_bytes=args.l2_bytes, sms=args.sms)
        fam = env.pop("family_rows")
        caption = f"recorded {env.get('date', '?')} on {env.get('gpu', '?')}"
        if rows or not fam:
            _print_rows(c, rows, caption)
        _print_family_rows(c, fam, caption)
        out = {"kind": "attnscope-bytes-reevaluated", "env": env, "rows": [r.to_json() for r in rows],
               "summary": physical.summarize(rows)}
        if fam:
            out |= {"family_rows": [r.to_json() for r in fam], "family_summary": families.summarize(fam)}
        _write_or_print(args, out)
        return 0
    _positive(args, "per_child")
    workers = _warm_workers(args)
    specs = physical.parse_grid(args.sweep) if args.sweep else list(physical.CALIBRATION)
    specs = specs * repeat  # K rounds over the grid, each point once a round
    env = {"grid_sha256": physical.grid_digest(specs)} if args.sweep else {}
    before: dict = {}  # grid index -> the Point a resumed file measured
    if args.resume:  # before the GPU is asked for: a file of another grid is one line, exit 2
        before, old = physical.resume_points(args.resume, specs, repeat, args.cache_control)
        env["resumed"] = {"file": str(args.resume), "date": old.get("date"), "points": len(before)}
    if (code := _no_gpu("bytes")) is not None:
        return code
    l2, sms = _l2_sms(args)
    env = {**_env(l2, sms), **({"repeat": repeat} if repeat > 1 else {}), **env}
    if args.resume and old.get("gpu") not in (None, env.get("gpu")):
        raise InputError(f"--resume: expected a sweep measured on this GPU ({env.get('gpu')}), got one "
                         f"measured on {old['gpu']}")

    written, start = [], time.monotonic()

    def progress(done, total):
        print(f"measured {len(done)}/{total} ({time.monotonic() - start:,.0f} s)", file=sys.stderr,
              flush=True)
        if args.sweep and args.json not in (None, "-"):  # keep what is measured if the run is cut short
            written.append(len(done))
            got = [(p.spec, p.measured.total, [k.name for k in p.measured.kernels])
                   for p in done if p.measured]
            part = physical.compare(got, l2, sms, repeated=repeat > 1)
            now = {**env, "partial": f"{len(done)}/{total}", "seconds": round(time.monotonic() - start)}
            _write_or_print(args, physical.sweep_json(done, part, now,
                                                      families.compare(got, repeated=repeat > 1,
                                                                       l2_bytes=l2, sms=sms)))

    if before:
        print(f"resumed: {len(before)}/{len(specs)} measured in {args.resume}", file=sys.stderr, flush=True)
    compiled = sum(s.get("impl") in ncu.COMPILED for i, s in enumerate(specs) if i not in before)
    if workers and compiled:
        print(f"compiling the kernels of {compiled} points first, in {min(workers, compiled)} processes "
              "(--warm-workers)", file=sys.stderr, flush=True)
    main_thread = threading.current_thread() is threading.main_thread()  # where a handler can be set
    # `timeout` sends SIGTERM: stop ncu and its child, keep the JSON
    term = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        points = ncu.measure_many(specs, cache_control=args.cache_control, per_child=args.per_child,
                                  progress=progress, rounds=repeat, done=before, warm_workers=workers)
    except ncu.NcuError as e:
        return _fail("bytes", str(e))
    except (KeyboardInterrupt, _Terminated) as e:
        kept = f"; {written[-1]}/{len(specs)} points are in {args.json} (--resume it)" if written else ""
        return _fail("bytes", f"interrupted{kept}", 130 if isinstance(e, KeyboardInterrupt) else 143)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, term)
    env["ncu"] = next((p.measured.ncu_version for p in points if p.measured), "")
    if args.sweep:
        env["seconds"] = round(time.monotonic() - start)  # this run's, warm-up included
    failed = [p for p in points if p.measured is None]
    if args.calibrate:
        crows = physical.calibration_rows(points)
        rows = [[r["kind"], f"{r['bytes'] / 2**30:g} GiB" if isinstance(r["bytes"], int) else r["bytes"],
                 f"{r.get('read', 0) / MiB:,.1f}", f"{r.get('write', 0) / MiB:,.1f}",
                 f"{r['ratio']:.4f}" if "ratio" in r else r.get("error", "")] for r in crows]
        c.print(table("Counter calibration: ncu DRAM bytes vs the exact bytes of known streams",
                      ["stream", "size", "read MiB", "write MiB", "counter / exact"], rows,
                      caption=f"{env.get('gpu', '')}, {env['ncu']}, cache-control {args.cache_control}"))
        _write_or_print(args, {"kind": "attnscope-bytes-calibration", "env": env, "rows": crows,
                               "points": [p.to_json() for p in points]})
        return 1 if failed else 0
    got = [(p.spec, p.measured.total, [k.name for k in p.measured.kernels]) for p in points if p.measured]
    rows = physical.compare(got, l2, sms, repeated=repeat > 1)
    fam = families.compare(got, repeated=repeat > 1, l2_bytes=l2, sms=sms)
    caption = f"{env.get('gpu', '')}, {env['ncu']}"
    if rows or not fam:
        _print_rows(c, rows, caption)
    _print_family_rows(c, fam, caption)
    for p in failed:
        what = families.label(p.spec) if "pass" in p.spec else physical.Row(p.spec, 1, 0, 0, ()).label()
        c.print(f"not measured: {what}: {p.error}")
    _write_or_print(args, physical.sweep_json(points, rows, env, fam))
    return 1 if failed else 0


def _print_family_rows(c, rows, caption: str) -> None:
    """Backward, decode and varlen points (measure/families.py): ncu against the logical ledger, the
    compulsory bytes and the DRAM estimate (model/backward_estimate.py, model/family_estimate.py), whole
    call; where a point has no estimate the column says why (a constant not measured yet, a shape not
    modelled)."""
    if not rows:
        return

    def est(r):
        return families.NO_ESTIMATE if r.estimate is None else \
            f"{r.estimate / MiB:,.2f} ({r.estimate_error:+.1%})"
    trows = [[r.label(), f"{r.measured / MiB:,.2f}", f"{r.logical / MiB:,.2f}", f"{r.compulsory / MiB:,.2f}",
              f"{r.error:+.1%}", est(r)] for r in rows]
    c.print(table("DRAM bytes of the whole call, MiB: ncu vs the logical ledger and the estimate (backward, "
                  "decode, varlen)", ["point", "measured", "logical", "compulsory", "logical vs measured",
                                      "estimate (vs measured)"], trows, caption=caption))
    for line in families.summary_lines(families.summarize(rows)):
        c.print(line)


def _print_rows(c, rows, caption: str) -> None:
    def mib(r, b):
        return f"{b / (r.spec.get('batch', 1) * r.spec['heads']) / MiB:,.2f}"

    def below(r):  # the estimate's own reason for being under the compulsory bytes, or for having none
        if r.estimate is None:
            return r.note.split(":")[0]
        if r.estimate >= r.compulsory:
            return ""
        return "; ".join(f"{why.split(' (')[0]}: -{mib(r, b)}" for why, b in r.credits)

    trows = [[r.label(), mib(r, r.measured), "-" if r.estimate is None else mib(r, r.estimate),
              mib(r, r.compulsory), "-" if r.error is None else f"{r.error:+.1%}", below(r)] for r in rows]
    c.print(table("DRAM bytes per (batch, head), MiB: ncu vs the L2-aware estimate",
                  ["point", "measured", "estimate", "compulsory", "error", "below compulsory because / none"],
                  trows, caption=caption))
    for line in physical.summary_lines(physical.summarize(rows)):
        c.print(line)


# --- share -----------------------------------------------------------------------------------------
def _share(args) -> int:
    if args.project_to is not None and args.project_to == args.attention:
        raise InputError(f"project_to: expected an attention other than --attention ({args.attention}), "
                         f"got {args.project_to!r}")
    _positive(args, "prefill", "layers", "reps")
    if args.trace:  # before minutes of measuring, not after
        out_file(args.trace, "--trace")
    if (code := _no_gpu("share")) is not None:
        return code
    loop = None
    if args.project_to is None:
        r = share.measure_share(args.attention, args.prefill, args.layers, args.dtype, keep_trace=args.trace,
                                train=args.train)
    else:
        loop = share.closed_loop(args.attention, args.project_to, args.prefill, args.layers, args.dtype,
                                 args.reps, train=args.train)
        r = loop.share
    if args.json:
        print_json((loop or r).to_json())
        return 0
    c = console()
    step = "training step (forward + backward)" if args.train else "prefill"
    rows = [[_short(n, 80), f"{ms:,.3f}", "attention" if att else ""] for n, ms, att in r.top]
    c.print(table(f"Longest kernels of one {step} ({r.attention}, P = {r.p:,}, {r.layers} layers)",
                  ["kernel", "ms", ""], rows))
    c.print(f"f_time = {r.attention_ms:,.3f} ms attention / {r.total_ms:,.3f} ms of kernels = {r.f_time:.3f}"
            f"   (FLOP share {r.flop_share:.3f}: not a time share, spec §5.1)")
    if loop is None:
        return 0
    c.print(table(f"Closed loop: {loop.baseline} -> {loop.candidate}, P = {loop.p:,}, {loop.layers} layers",
                  ["", ""], loop_rows(loop, args.train)))
    return 0


# --- bench (measure/bench.py: the sweep driver) ----------------------------------------------------
#: `bench` flags with a default (a value other than it, given with --from-json, is refused).
_BENCH_DEFAULTS = {"kind": "all", "tokens": 16384, "heads": 32}


def _bench(args) -> int:
    from attnscope.measure import bench

    if args.from_json:  # a recorded run is redrawn: the measuring and output flags would do nothing
        given = [flag for flag, v in (("--json", args.json), ("--out", args.out), ("--quick", args.quick),
                                      ("--d", args.d), ("--n", args.n), ("--no-naive", args.no_naive)) if v]
        given += ["--" + k for k, v in _BENCH_DEFAULTS.items() if getattr(args, k) != v]
        expect(not given, given[0] if given else "--from-json", "only --plots with --from-json (it prints a "
               "recorded run; measuring and output flags do nothing)", " ".join(given))
    _positive(args, "d", "n", "tokens", "heads")
    outputs = {"--out": args.out, "--json": args.json if args.json != "-" else None}
    for flag, path in outputs.items():
        if path:  # before minutes of measuring, not after
            out_file(path, flag)
    if args.plots:
        outputs |= {f"--plots {name}": Path(args.plots) / name for name in PLOT_NAMES}
    distinct(outputs, {"--from-json": args.from_json})
    if not args.from_json and (code := _no_gpu("bench")) is not None:  # --from-json needs no GPU
        return code
    return bench.run(args)


def configure(sub) -> None:
    """Add `which`, `bytes`, `share` and `bench` to `sub` (argparse subparsers)."""
    p = sub.add_parser("which", help="which SDPA backend actually ran, from profiler kernel names (GPU)",
                       description="Run one attention call with dispatch restricted to one backend (so an "
                                   "input it cannot take fails instead of falling back), record the "
                                   "launched kernels with torch.profiler and name the backend they show. "
                                   "Exit 1 when the asked backend did not run.")
    p.add_argument("--backend", default="flash", choices=backends.BACKENDS,
                   help=f"backend to restrict dispatch to; auto reports SDPA's own choice {SPEC}")
    _shape(p)
    p.set_defaults(func=_one_line(_which))

    p = sub.add_parser("bytes", help="ncu DRAM bytes beside the logical model and an L2-aware estimate "
                                     "(GPU + ncu)",
                       description="Measure one call's DRAM bytes with Nsight Compute "
                                   "(dram__bytes_read.sum, dram__bytes_write.sum; profiler started and "
                                   "stopped around the call after warm-up) and print them beside the logical "
                                   "model and the physical estimate.")
    p.add_argument("--impl", default=_SHAPE_DEFAULTS["impl"], choices=(*ncu.IMPLS, "flex"),
                   help=f"implementation measured (flex: with --window or --family varlen) {SPEC}")
    _shape(p, json_flag=False)
    family_bytes.add_flags(p)
    p.add_argument("--kv-heads", type=int, default=None,
                   help="K/V heads (GQA/MQA): a divisor of --heads (default: --heads)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE", type=path_arg,
                   help="print JSON instead of tables; with --sweep/--calibrate/--from-json and FILE, write "
                        "every point's counters to FILE (atomically)")
    p.add_argument("--sweep", metavar="GRID", default=None, type=path_arg,
                   help="measure every point of GRID (CSV with a header impl,B,H,Hkv,N,d,causal,dtype; or a "
                        "JSON / YAML list of such objects) and print the estimate's error distribution; a "
                        "pass column (forward, backward, decode, varlen, window) with deterministic, "
                        "cache_lens, page_size, kv_dtype, splits, lens, window measures the other families "
                        "against their logical ledgers and DRAM estimates (model/backward_estimate.py, "
                        "family_estimate.py, window_estimate.py)")
    p.add_argument("--from-json", metavar="FILE", default=None, type=path_arg,
                   help="no GPU: re-evaluate the current estimate against a sweep that --sweep --json wrote")
    p.add_argument("--calibrate", action="store_true",
                   help="measure a 1 and 4 GiB device copy, fp32 sum and fill through the same ncu path and "
                        "print counter / exact byte ratios")
    p.add_argument("--repeat", type=int, default=1, metavar="K",
                   help=f"with --sweep: measure the grid K times (1-{physical.MAX_REPEAT}, in K rounds), "
                        "compare the estimate with each point's median run and print the counters' "
                        "run-to-run spread")
    p.add_argument("--per-child", type=int, default=8,
                   help=f"points measured per ncu process in --sweep (points that compile the same kernels "
                        f"share one) {SPEC}")
    p.add_argument("--warm-workers", type=int, default=None, metavar="K",
                   help="with --sweep/--calibrate: first compile the points' kernels (attnscope's Triton, "
                        "Flex's torch.compile) in K processes at once without ncu, so the measuring "
                        "processes load them from the on-disk caches; 0: off (default: half the CPU "
                        "cores, at most 8)")
    p.add_argument("--resume", metavar="FILE", default=None, type=path_arg,
                   help="with --sweep: keep the points measured in FILE (the JSON a run of the same grid "
                        "wrote, whole or cut short), measure the rest and write the whole sweep to --json")
    p.add_argument("--cache-control", default="none", choices=ncu.CACHE_CONTROL,
                   help="ncu --cache-control: none keeps L2 between kernels as inference does; all flushes "
                        f"it before each kernel {SPEC}")
    p.add_argument("--estimate-only", action="store_true",
                   help="no GPU, no ncu: print the logical model and the physical estimate only")
    p.add_argument("--device", default="h200", help=f"device table entry for --estimate-only {SPEC}")
    p.add_argument("--l2-bytes", type=int, default=None,
                   help="L2 capacity for the estimate (default: read from the GPU, or the --device entry)")
    p.add_argument("--sms", type=int, default=None,
                   help="SM count for the estimate (default: read from the GPU, or the --device entry)")
    g = p.add_argument_group("decode against a KV cache (with --estimate-only: the logical ledger of "
                             "`traffic --cache-lens`, whole call, and its time at the DRAM bandwidth)")
    serving.add_cache_flags(g)
    g.add_argument("--nq", type=int, default=None,
                   help="--cache-lens: new query rows per sequence (default 1: one decode step)")
    p.set_defaults(func=_one_line(_bytes))

    p = sub.add_parser("share", help="attention time share of a Llama-shaped prefill or training step from "
                                     "torch.profiler (GPU); --project-to closes the Amdahl loop",
                       description="Build a Llama-shaped decoder (hidden 4096, 32 heads, d 128, MLP 14336, "
                                   "random weights), profile a prefill (or with --train a training step), "
                                   "print f_time beside the FLOP share. With --project-to, project the "
                                   "step's speedup from f_time and the kernel speedup, then swap the kernel "
                                   "and measure it.")
    p.add_argument("--attention", default="flash", choices=share.ATTENTIONS,
                   help=f"attention used in the prefill or training step (the baseline of --project-to) "
                        f"{SPEC}")
    p.add_argument("--prefill", "-P", type=int, default=4096, help=f"prompt tokens P {SPEC}")
    p.add_argument("--layers", type=int, default=2, help=f"decoder layers {SPEC}")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"], help=f"element type {SPEC}")
    p.add_argument("--project-to", default=None, choices=share.ATTENTIONS,
                   help="candidate attention: project with Amdahl, then swap it in and measure")
    p.add_argument("--train", action="store_true",
                   help="a training step instead of a prefill: weights that require grad (in --dtype, no "
                        "autocast), forward, loss, backward, no optimizer step; f_time and the kernel "
                        "speedup count attention's forward and backward")
    p.add_argument("--reps", type=int, default=10, help=f"timed repetitions per median {SPEC}")
    p.add_argument("--trace", default=None, metavar="FILE.json.gz", type=path_arg,
                   help="keep the profiler Chrome trace")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_one_line(_share))

    p = sub.add_parser("bench", help="kernels vs SDPA backends vs naive on the same shapes (GPU)",
                       description="Sweep attnscope's kernels against PyTorch SDPA backends and the naive "
                                   "baseline; TFLOP/s, TB/s, ratios, plots. --from-json redraws a recorded "
                                   "run without a GPU.")
    p.add_argument("--kind", choices=["prefill", "decode", "all"], default=_BENCH_DEFAULTS["kind"],
                   help="which sweep to run (default: all)")
    p.add_argument("--quick", action="store_true", help="a few points only (smoke test)")
    p.add_argument("--d", type=int, action="append", help="head dims for prefill (default: 64 and 128)")
    p.add_argument("--n", type=int, action="append", help="sequence lengths for prefill (default 512..16k)")
    p.add_argument("--tokens", type=int, default=_BENCH_DEFAULTS["tokens"],
                   help=f"B*N held constant in prefill {SPEC}")
    p.add_argument("--heads", type=int, default=_BENCH_DEFAULTS["heads"],
                   help=f"query heads in prefill {SPEC}")
    p.add_argument("--no-naive", action="store_true", help="skip the naive 3-kernel baseline")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE", type=path_arg,
                   help="print all results as JSON on stdout, as every other --json does (with FILE, the "
                        "form bench/*.py scripts use: write them to FILE, like --out)")
    p.add_argument("--out", metavar="FILE", type=path_arg,
                   help="also write all results as JSON to FILE (atomically; --from-json reads it back)")
    p.add_argument("--plots", metavar="DIR", type=path_arg, help="write PNG plots to DIR (needs matplotlib)")
    p.add_argument("--from-json", metavar="FILE", type=path_arg,
                   help="no GPU: print and plot a recorded run (a file --json wrote) instead of measuring")
    p.set_defaults(func=_bench)
