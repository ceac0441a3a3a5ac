"""Record, on a GPU machine, everything the CPU tests of measure/ need (one run, a few minutes).

    OUT=/some/dir python bench/record_fixtures.py        # writes at most 8 files into $OUT (or --out DIR)
    python bench/record_fixtures.py --table tests/data/measure/recorded/ncu.json.gz   # CPU: the grid table

Parts (each in try/except: one failure is logged and the rest still runs; a global time budget skips
what no longer fits):

1. env.json        torch/triton/CUDA versions, the GPU (name, L2 bytes, SMs), ncu --version, nvidia-smi.
2. kernels.json    kernel names launched per backend (flash, cudnn, efficient, math, auto, attnscope,
                   and the naive baseline) for fp16/bf16, causal and unmasked, with `which`'s verdict.
3. traces.json.gz  torch.profiler Chrome traces: one `which` call, and a 2-layer Llama-shaped prefill
                   (P = 1,024) with flash and with naive attention, plus the f_time measured from each.
4. ncu.json.gz     ncu CSV output (dram__bytes_read.sum / dram__bytes_write.sum) for a grid of calls,
                   one ncu run per group, most important first: naive and flash at N = 4,096 (heads 32
                   and 1, d 128, causal both ways); the d = 128 grid N 1k-16k; cudnn, efficient and
                   attnscope at N = 4,096, then over N 1k-16k; heads 4, 8, 16; bf16; batch 4; the d = 64
                   grid; the N = 4,096 points with cache-control all.
                   Each run keeps its CSV, the child's per-call status and the ncu version.
5. smoke.txt       `attnscope which / bytes / share` run end to end: command, exit code, output.
6. closed_loop.json `share --attention naive --project-to attnscope` and `--attention flash --project-to
                   attnscope` at P = 2k, 4k, 16k, `--attention naive --project-to cudnn` at 4k (as time
                   allows).
7. log.txt         everything printed, errors with tracebacks.

A summary table is printed last. On a CPU, ``python bench/record_fixtures.py --table ncu.json.gz`` turns
a recorded ncu.json.gz into the Markdown grid table for BENCHMARKS.md (measured, logical, estimate).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
OUT = os.environ.get("OUT") or os.path.join(ROOT, "out")
BUDGET_S = float(os.environ.get("RECORD_BUDGET_S", "540"))  # stay inside a 10-minute call
T0 = time.time()
SUMMARY: list[tuple[str, str, float, str]] = []
_LOG: list[str] = []


def log(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    _LOG.append(line)


def left() -> float:
    return BUDGET_S - (time.time() - T0)


def env_with_src() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def write_json(name: str, obj, gz: bool = False) -> None:
    path = os.path.join(OUT, name)
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(obj, f, indent=None if gz else 1)
    log(f"  wrote {name} ({os.path.getsize(path) / 2**20:.2f} MiB)")


def part(name: str, need_s: float = 0.0):
    """Decorator: run a part, time it, catch and log its failure, skip it when time is short."""
    def wrap(fn):
        t = time.time()
        if left() < need_s:
            SUMMARY.append((name, "skipped", 0.0, f"needs ~{need_s:.0f} s, {left():.0f} s left"))
            log(f"== {name}: skipped (time)")
            return fn
        log(f"== {name}")
        try:
            note = fn() or ""
            SUMMARY.append((name, "ok", time.time() - t, str(note)))
        except BaseException as e:  # one part's failure must not lose the others
            if isinstance(e, KeyboardInterrupt):
                raise
            tb = traceback.format_exc()
            log(tb)
            SUMMARY.append((name, "FAILED", time.time() - t, f"{type(e).__name__}: {str(e)[:80]}"))
        return fn
    return wrap


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    import torch

    from attnscope.measure import backends, decoder, ncu, share

    env: dict = {}

    @part("env")
    def _env():
        p = torch.cuda.get_device_properties(0)
        env.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu=p.name,
                   l2_bytes=p.L2_cache_size, sms=p.multi_processor_count,
                   capability=f"{p.major}.{p.minor}", memory_bytes=p.total_memory,
                   torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
        try:
            exe = ncu.find_ncu()
            env["ncu"] = exe
            env["ncu_version"] = ncu.ncu_version(exe)
        except ncu.NcuError as e:
            env["ncu"] = None
            env["ncu_error"] = str(e)
        try:
            env["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                               timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = repr(e)
        write_json("env.json", env)
        return (f"{env['gpu']}, L2 {env['l2_bytes'] / 2**20:.1f} MiB, {env['sms']} SMs, "
                f"{env.get('ncu_version')}")

    @part("kernel names", need_s=60)
    def _kernels():
        rows = []
        for backend in ("flash", "cudnn", "efficient", "math", "auto", "attnscope"):
            for dtype in ("fp16",) if backend == "attnscope" else ("fp16", "bf16"):  # spare autotuning
                for causal in (False, True):
                    try:
                        r = backends.which(backend, n=1024, d=128, heads=8, batch=1, dtype=dtype,
                                           causal=causal)
                        rows.append(r.to_json())
                    except Exception as e:
                        rows.append({"asked": backend, "shape": {"dtype": dtype, "causal": causal},
                                     "error": f"{type(e).__name__}: {e}", "kernels": []})
        for dtype in ("fp16", "bf16"):  # the naive baseline's kernels (not an SDPA backend)
            for causal in (False, True):
                dt = backends.torch_dtype(torch, dtype)
                q, k, v = (torch.randn(1, 8, 1024, 128, device="cuda", dtype=dt) for _ in range(3))
                fn = backends.attention_fn("naive", causal)
                fn(q, k, v)
                ks = backends.kernels(backends.profile_trace(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v)))
                rows.append({"asked": "naive", "ran": backends.backend_of([x.name for x in ks]),
                             "shape": {"batch": 1, "heads": 8, "n": 1024, "d": 128, "dtype": dtype,
                                       "causal": causal}, "kernels": [x.to_json() for x in ks]})
        write_json("kernels.json", {"env": env, "calls": rows})
        bad = [f"{r['asked']}/{r['shape'].get('dtype')}/{r['shape'].get('causal')}" for r in rows
               if r.get("error") or (r.get("ok") is False)]
        return f"{len(rows)} calls; not ok: {', '.join(bad) or 'none'}"

    @part("traces", need_s=60)
    def _traces():
        out = {}
        qkv = [torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.float16) for _ in range(3)]
        fn = backends.attention_fn("flash", False)
        fn(*qkv)
        out["which_flash_fp16"] = {"annotation": "attnscope::call",
                                   "trace": backends.profile_trace(lambda: fn(*qkv))}
        notes = []
        for attention in ("flash", "naive"):
            shape = decoder.LlamaShape(layers=2)
            model = decoder.build_decoder(shape, attention)
            x = torch.randn(1, 1024, shape.hidden, device="cuda", dtype=torch.float16)
            with torch.inference_mode():
                model(x)
                torch.cuda.synchronize()
                trace = backends.profile_trace(lambda model=model, x=x: model(x), decoder.PREFILL)
            out[f"prefill_{attention}"] = {"p": 1024, "layers": 2, "trace": trace}
            try:  # keep the trace even if it cannot be read: that is what the CPU tests are for
                r = share.share_from_trace(trace, attention, 1024, shape)
                out[f"prefill_{attention}"]["share"] = r.to_json()
                notes.append(f"{attention} f_time {r.f_time:.3f}")
            except RuntimeError as e:
                notes.append(f"{attention}: {e}")
            del model, x
            torch.cuda.empty_cache()
        write_json("traces.json.gz", out, gz=True)
        return "; ".join(notes)

    runs = []

    def ncu_run(name, specs, cache_control, timeout):
        t = time.time()
        rec = {"name": name, "cache_control": cache_control, "specs": specs,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        try:
            text, output = ncu.run(specs, cache_control=cache_control, timeout_s=timeout)
            rec.update(csv=text, status=ncu.child_status(output), output_tail=output[-4000:])
            calls = ncu.split_at_markers(ncu.parse_csv(text))
            rec["note"] = f"{len(calls)} calls parsed"
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            log(traceback.format_exc())
        rec["seconds"] = time.time() - t
        runs.append(rec)
        log(f"  ncu {name} ({cache_control}): {rec.get('note') or rec.get('error')} "
            f"in {rec['seconds']:.0f} s")

    def grid(impls, ns, heads, ds, causals, dtype="fp16", batch=1):
        return [{"impl": i, "n": n, "d": d, "heads": h, "batch": batch, "dtype": dtype, "causal": c}
                for i in impls for n in ns for h in heads for d in ds for c in causals]

    key = grid(("naive", "flash"), (4096,), (32, 1), (128,), (False, True))
    fused = grid(("cudnn", "efficient", "attnscope"), (4096,), (32, 1), (128,), (False, True))
    rest128 = grid(("naive", "flash"), (1024, 2048, 8192, 16384), (1, 32), (128,), (False, True))
    rest64 = grid(("naive", "flash"), (1024, 2048, 4096, 8192, 16384), (1, 32), (64,), (False, True))
    both = (False, True)
    fused_n = grid(("cudnn", "efficient", "attnscope"), (1024, 2048, 8192, 16384), (1, 32), (128,), both)
    heads_mid = grid(("naive", "flash", "cudnn", "attnscope"), (4096,), (4, 8, 16), (128,), both)
    bf16 = grid(("naive", "flash", "cudnn", "attnscope"), (4096,), (1, 32), (128,), both, dtype="bf16")
    batched = grid(("naive", "flash", "attnscope"), (4096,), (8,), (128,), both, batch=4)

    def ncu_part(name, specs, cache_control, need_s, timeout):
        @part(f"ncu {name}", need_s=need_s)
        def _run():
            if not env.get("ncu"):
                return "ncu not found: " + env.get("ncu_error", "")
            ncu_run(name, specs, cache_control, timeout=min(timeout, max(30, left() - 30)))
            write_json("ncu.json.gz", {"env": env, "runs": runs}, gz=True)  # rewritten after every run
            r = runs[-1]
            return r.get("note") or r.get("error", "")[:100]

    ncu_part("key", key, "none", 60, 150)
    ncu_part("grid-d128", rest128, "none", 90, 200)
    smoke = []

    def cli(args, timeout):
        t = time.time()
        cmd = [sys.executable, "-m", "attnscope", *args]
        env = env_with_src()
        # ncu's own timeout fires first and stops ncu and its child; killing the CLI would orphan them
        env["ATTNSCOPE_NCU_TIMEOUT_S"] = str(max(10, timeout - 20))
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
            rc, text = p.returncode, p.stdout + ("\n[stderr]\n" + p.stderr if p.stderr.strip() else "")
        except subprocess.TimeoutExpired:
            rc, text = "timeout", ""
        smoke.append({"cmd": "attnscope " + " ".join(args), "rc": rc, "seconds": time.time() - t,
                      "output": text})
        log(f"  attnscope {' '.join(args)} -> rc {rc} ({time.time() - t:.0f} s)")

    @part("smoke", need_s=60)
    def _smoke():
        for args, timeout in ((["which", "--backend", "flash"], 90),
                              (["which", "--backend", "efficient", "--causal", "--dtype", "bf16"], 60),
                              (["which", "--backend", "auto", "--json"], 60),
                              (["which", "--backend", "flash", "--d", "512"], 60),
                              (["share", "--attention", "flash", "--prefill", "2048", "--layers", "2"], 120),
                              (["bytes", "--impl", "flash"], 120),
                              (["bytes", "--impl", "naive", "--heads", "1", "--json"], 120)):
            if left() < 30:
                smoke.append({"cmd": "attnscope " + " ".join(args), "rc": "skipped (time)"})
                continue
            cli(args, min(timeout, left() - 15))
        with open(os.path.join(OUT, "smoke.txt"), "w", encoding="utf-8") as f:
            for s in smoke:
                f.write(f"$ {s['cmd']}\n[rc {s['rc']}, {s.get('seconds', 0):.1f} s]\n")
                f.write(f"{s.get('output', '')}\n\n")
        return ", ".join(f"{s['cmd'].split()[1]}:{s['rc']}" for s in smoke)

    ncu_part("fused", fused, "none", 60, 150)
    ncu_part("fused-grid", fused_n, "none", 90, 200)
    ncu_part("heads", heads_mid, "none", 60, 150)
    ncu_part("bf16", bf16, "none", 45, 120)
    ncu_part("batch", batched, "none", 45, 120)
    ncu_part("grid-d64", rest64, "none", 90, 150)
    ncu_part("key-flush", key, "all", 45, 90)

    @part("closed loop", need_s=90)
    def _loop():
        # naive -> attnscope (the spec's exit task), then the choice a user faces: SDPA FLASH -> attnscope,
        # and naive -> SDPA CUDNN
        res = []
        for baseline, candidate, ps in (("naive", "attnscope", (2048, 4096, 16384)),
                                        ("flash", "attnscope", (2048, 4096, 16384)),
                                        ("naive", "cudnn", (4096,))):
            for p in ps:
                if left() < 45:
                    res.append({"p": p, "baseline": baseline, "candidate": candidate,
                                "error": "skipped (time)"})
                    continue
                try:
                    res.append(share.closed_loop(baseline, candidate, p=p, layers=2, reps=5).to_json())
                except Exception as e:
                    res.append({"p": p, "baseline": baseline, "candidate": candidate,
                                "error": f"{type(e).__name__}: {e}"})
                    torch.cuda.empty_cache()
                write_json("closed_loop.json", {"env": env, "runs": res})  # rewritten after every run
        # a failed run is {"p", "error": message}; a finished run's "error" is the projection's relative
        # error (a float), so tell them apart by the speedups
        return "; ".join(f"{r['baseline']}->{r['candidate']} P={r['p']}: " +
                         (f"proj {r['projected_speedup']:.2f}x meas {r['measured_speedup']:.2f}x "
                          f"({r['error']:+.1%})" if "projected_speedup" in r else str(r["error"])[:40])
                         for r in res)

    return 0


def grid_table(path: str) -> str:
    """Markdown table of a recorded ncu.json.gz: measured vs logical vs the L2-aware estimate, per call
    (MiB per head), for BENCHMARKS.md. Runs on a CPU:

        python bench/record_fixtures.py --table tests/data/measure/recorded/ncu.json.gz
    """
    from attnscope.measure import ncu
    from attnscope.model import l2 as physical

    with gzip.open(path, "rt", encoding="utf-8") as f:
        rec = json.load(f)
    env = rec["env"]
    lines = [f"GPU {env.get('gpu')}, L2 {env['l2_bytes'] / 2**20:.1f} MiB, {env['sms']} SMs, torch "
             f"{env.get('torch')}, {env.get('ncu_version')}, recorded {env.get('date')}", "",
             "MiB per (batch, head). cache: ncu --cache-control (none: the L2 is left alone between kernels, "
             "what the estimate models; all: ncu flushes it before every kernel, shown for reference only).",
             "", "| impl | N | d | heads | batch | dtype | causal | cache | measured | logical | estimate | "
             "est. error | logical error |", "|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|"]
    errs: list[tuple[float, str]] = []  # (error, point) with cache-control none
    for run in rec["runs"]:
        if not run.get("csv"):
            lines.append(f"| run {run['name']} failed: {run.get('error', '')[:80]} |||||||||||")
            continue
        calls = ncu.split_at_markers(ncu.parse_csv(run["csv"]))
        for spec, ks in ncu.pair(run["status"], calls):
            if not spec.get("ok") or not ks:
                continue
            bh = spec["batch"] * spec["heads"]
            measured = sum(k.total for k in ks)
            lg = physical.logical(spec["impl"], spec["n"], spec["d"], spec["heads"], spec["batch"],
                                  spec["dtype"], spec["causal"])
            est = physical.estimate(spec["impl"], spec["n"], spec["d"], spec["heads"], spec["batch"],
                                    spec["dtype"], spec["causal"], l2_bytes=env["l2_bytes"], sms=env["sms"])
            err = physical.error(est.total, measured)
            if run["cache_control"] == "none":
                errs.append((err, f"{spec['impl']} N={spec['n']} d={spec['d']} heads={spec['heads']} "
                                  + (f"batch={spec['batch']} " if spec["batch"] != 1 else "")
                                  + (f"{spec['dtype']} " if spec["dtype"] != "fp16" else "")
                                  + f"{'causal' if spec['causal'] else 'unmasked'}"))
            lines.append(f"| {spec['impl']} | {spec['n']} | {spec['d']} | {spec['heads']} | "
                         f"{spec['batch']} | {spec['dtype']} | {spec['causal']} | {run['cache_control']} | "
                         f"{measured / bh / 2**20:.2f} | "
                         f"{lg / bh / 2**20:.2f} | {est.total / bh / 2**20:.2f} | {err:+.1%} | "
                         f"{physical.error(lg, measured):+.1%} |")
    if errs:
        out = [f"{p} ({e:+.1%})" for e, p in errs if abs(e) > 0.15]
        within = {b: sum(abs(e) <= b for e, _ in errs) for b in (0.05, 0.10, 0.15)}
        lines += ["", f"Estimate error with cache-control none over {len(errs)} points: from "
                  f"{min(e for e, _ in errs):+.1%} to {max(e for e, _ in errs):+.1%}; within +-5 %: "
                  f"{within[0.05]}, +-10 %: {within[0.10]}, +-15 %: {within[0.15]}; worst |error| "
                  f"{max(abs(e) for e, _ in errs):.1%} (goal: 15 %); outside +-15 %: {len(out)}"
                  + (": " + "; ".join(out) if out else "") + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", metavar="NCU_JSON_GZ",
                    help="CPU only: print the Markdown grid table of a recorded ncu.json.gz and exit")
    ap.add_argument("--out", metavar="DIR",
                    help="where the files go (default: $OUT, else out/ in the repository)")
    cli = ap.parse_args()
    if cli.table:
        print(grid_table(cli.table))
        sys.exit(0)
    OUT = cli.out or OUT
    code = 1
    try:
        code = main()
    except BaseException:
        log(traceback.format_exc())
    finally:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "log.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(_LOG) + "\n")
        print(f"\n{'part':<14} {'status':<8} {'s':>6}  note")
        for name, status, secs, note in SUMMARY:
            print(f"{name:<14} {status:<8} {secs:>6.1f}  {note[:150]}")
        print(f"total {time.time() - T0:.0f} s; files in {OUT}: {sorted(os.listdir(OUT))}")
    sys.exit(code)
