"""DRAM bytes from Nsight Compute: build the ``ncu`` command, run one call under it, parse the CSV.

The measured call runs in a child process (``python -m attnscope.measure.ncu --child SPEC``) that

1. builds the inputs and warms the call up (compilation, autotuning, cuBLAS heuristics),
2. evicts the L2 by reading a scratch buffer twice its size (clean lines: evicting them later costs no
   DRAM write), so every measurement starts from the same cold-cache state the L2-aware estimate
   (model/l2.py) assumes,
3. starts the profiler (``cudaProfilerStart``), launches a marker kernel (``torch.cuda._sleep``, kernel
   ``spin_kernel``) and the call once, synchronises, and stops the profiler (``cudaProfilerStop``).

Before the first configuration the child opens and closes one profiled range around a tiny read kernel
(no marker, so `split_at_markers` drops it): the first range of a process leaves about 3.5 MiB of dirty
lines in the L2, which the first measured call wrote back as its own (0.05 MiB per head more writes for a
cuDNN MQA call of 43 MiB, 0.14 for an FA-2 GQA one of 32 MiB; bench/first_spec_probe.py at commit 5eeec86).

``ncu --profile-from-start off`` therefore profiles exactly the marker and the call's kernels; the
marker separates the calls when one child measures several configurations (`measure_many`, which puts
the specs that compile the same kernels in one child: `measuring_order`). The compiles (Triton's JIT,
Flex's torch.compile) are CPU work, and with a cold cache most of a Flex point's time; `warm_up` runs
them first, in several processes at once without ncu, so the measuring child loads them from Triton's
and inductor's on-disk caches (their default directories, shared by the user's processes). A spec is
an attention call (``impl``, ``batch``, ``heads``, ``kv_heads`` (GQA: SDPA with ``enable_gqa``), ``n``,
``d``, ``dtype``, ``causal``; a backward, decode or varlen call with ``pass``: measure/families.py)
or a calibration stream of known size (``kind`` in `STREAMS`, ``bytes``):
`exact_bytes` gives its exact DRAM bytes, so the counters themselves are checked through this same path
(`attnscope bytes --calibrate`).

``--cache-control none`` (the default here) leaves the L2 alone between kernels, as inference does:
naive attention's softmax may read S from L2 where S fits. ``all`` (ncu's own default) flushes it
before every kernel, which forbids inter-kernel reuse. ``--clock-control none`` keeps the clocks as
the driver sets them.

Parsing is pure Python and tested on a CPU with recorded CSV files.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from attnscope.errors import InputError, choice, is_int, short
from attnscope.model.l2 import IMPLS, KernelTotals

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
CACHE_CONTROL = ("none", "all")
#: Calibration streams of known size (see the module docstring and `exact_bytes`).
STREAMS = ("copy", "sum", "fill")
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel (aten/src/ATen/cuda/Sleep.cu)

#: Unit multipliers ncu may print (decimal prefixes; binary ones accepted too).
_UNITS = {"byte": 1, "kbyte": 10**3, "mbyte": 10**6, "gbyte": 10**9, "tbyte": 10**12,
          "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}


class NcuError(RuntimeError):
    """ncu is missing, not permitted, or produced nothing to parse. The message is one line."""


@dataclass(frozen=True)
class KernelBytes:
    """DRAM bytes of one profiled kernel launch."""

    id: int
    name: str
    read: int
    write: int
    threads: int = 0  # threads per CTA (ncu's "Block Size" x; 0: not in the CSV)
    grid: int = 0  # CTAs along grid x (ncu's "Grid Size" x; 0: not in the CSV)

    @property
    def total(self) -> int:
        return self.read + self.write

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "read": self.read, "write": self.write, "total": self.total}


# --- the command -----------------------------------------------------------------------------------
def find_ncu() -> str:
    """Path of the ncu executable (PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin); NcuError if none."""
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "ncu"), os.X_OK):
            return os.path.join(root, "bin", "ncu")
    raise NcuError("ncu (Nsight Compute CLI) not found on PATH or in $CUDA_HOME/bin; install Nsight Compute "
                   "or add it to PATH")


def ncu_command(child: list[str], log_file: str, ncu: str = "ncu", cache_control: str = "none",
                metrics=METRICS) -> list[str]:
    """The ncu command line that measures DRAM bytes of the profiled range of ``child``.

    ``--print-units base`` asks for plain bytes; ``--log-file`` keeps the CSV apart from the child's
    own output.
    """
    choice("cache_control", cache_control, CACHE_CONTROL)
    # application-only: the child launches every measured kernel itself; the processes it starts
    # (inductor's compile workers, ptxas) need no injection
    return [ncu, "--metrics", ",".join(metrics), "--clock-control", "none", "--cache-control", cache_control,
            "--profile-from-start", "off", "--target-processes", "application-only", "--csv",
            "--print-units", "base", "--log-file", log_file, *child]


def child_command(specs: list[dict], mode: str = "--child") -> list[str]:
    """The child process: this module with ``--child`` (or ``--warm``: `warm_up`) and the configurations
    as JSON."""
    return [sys.executable, "-m", "attnscope.measure.ncu", mode, json.dumps(specs)]


def _child_env() -> dict:
    """The environment of a child: it imports attnscope from wherever this process found it (installed or
    a source tree)."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {**os.environ, "PYTHONPATH": pkg_root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _kill(p: subprocess.Popen) -> None:
    """Stop ``p`` and everything it started (it runs in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(p.pid, signal.SIGKILL)
    p.communicate()


# --- parsing ---------------------------------------------------------------------------------------
def check_output(text: str) -> None:
    """Raise NcuError with one clear line for ncu's known failure messages."""
    if "ERR_NVGPUCTRPERM" in text:
        raise NcuError("ncu: access to GPU performance counters is not permitted (ERR_NVGPUCTRPERM); run as "
                       "root, or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    if "No kernels were profiled" in text:
        raise NcuError("ncu: no kernels were profiled (did the child reach cudaProfilerStart?)")


def _number(value: str, unit: str) -> float:
    v = value.strip().replace(",", "")
    if v in ("", "n/a", "N/A"):
        raise ValueError(f"no value ({value!r})")
    scale = _UNITS.get(unit.strip().lower())
    if scale is None:
        raise ValueError(f"unknown unit {unit!r}")
    return float(v) * scale


def parse_csv(text: str) -> list[KernelBytes]:
    """Parse ``ncu --csv`` output (one row per kernel and metric) into one record per kernel launch.

    Lines before the CSV header (``==PROF==`` messages, the child's output) are skipped; the header is
    the first line that names "Kernel Name" and "Metric Value". Raises NcuError when there is none.
    """
    check_output(text)
    lines = text.splitlines()
    start = next((i for i, s in enumerate(lines) if '"Kernel Name"' in s and '"Metric Value"' in s), None)
    if start is None:
        raise NcuError("ncu: no CSV metric table in the output (was --csv given, and did a kernel run?)")
    rows = csv.DictReader(io.StringIO("\n".join(s for s in lines[start:] if s.startswith('"'))))
    by_id: dict[int, dict] = {}
    for r in rows:
        metric = r.get("Metric Name", "")
        if metric not in METRICS:
            continue
        kid = int(r["ID"])
        rec = by_id.setdefault(kid, {"name": r["Kernel Name"], "read": 0, "write": 0,
                                     "threads": _dim_x(r.get("Block Size")),
                                     "grid": _dim_x(r.get("Grid Size"))})
        nbytes = int(round(_number(r["Metric Value"], r.get("Metric Unit", "byte") or "byte")))
        rec["read" if metric == METRICS[0] else "write"] += nbytes
    return [KernelBytes(k, v["name"], v["read"], v["write"], v["threads"], v["grid"])
            for k, v in sorted(by_id.items())]


def _dim_x(value: str | None) -> int:
    """The x of an ncu launch dimension such as "(256, 1, 1)"; 0 when absent or unreadable."""
    try:
        return int((value or "").strip("() ").split(",")[0])
    except ValueError:
        return 0


def split_at_markers(ks: list[KernelBytes], marker: str = MARKER) -> list[list[KernelBytes]]:
    """Split a kernel list into calls at each marker kernel (the markers themselves are dropped).

    Kernels before the first marker are dropped too; with no marker at all the whole list is one call.
    """
    if not any(marker in k.name for k in ks):
        return [list(ks)]
    out: list[list[KernelBytes]] = []
    for k in ks:
        if marker in k.name:
            out.append([])
        elif out:
            out[-1].append(k)
    return out


@dataclass(frozen=True)
class Measured(KernelTotals):
    """One call's DRAM bytes, per kernel and in total, with the ncu version and cache control."""

    kernels: list[KernelBytes]
    cache_control: str
    ncu_version: str = ""

    def to_json(self) -> dict:
        return {"read": self.read, "write": self.write, "total": self.total,
                "cache_control": self.cache_control, "ncu_version": self.ncu_version,
                "kernels": [k.to_json() for k in self.kernels]}


def ncu_version(ncu: str) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[-1] if out.strip() else ""


def run_child(child: list[str], cache_control: str = "none", timeout_s: float = 600.0) -> tuple[str, str]:
    """Run the process ``child`` (an argv) under ncu; return (CSV text, the child's combined output).

    The child must start and stop the profiler around what it measures (see the module docstring; the
    bench scripts' own children do). Raises NcuError (one line) when ncu is missing, counters are not
    permitted, the child fails, or ``timeout_s`` passes (ncu and the child are then killed).
    """
    ncu = find_ncu()
    fd, log = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    try:
        cmd = ncu_command(child, log, ncu=ncu, cache_control=cache_control)
        # a session of its own, so a timeout can stop ncu *and* the child it launched
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(),
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            _kill(p)
            raise NcuError(f"ncu: timed out after {timeout_s:.0f} s") from e
        except BaseException:  # Ctrl-C, SIGTERM (`attnscope bytes` raises on it): no orphan left on the GPU
            _kill(p)
            raise
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
    finally:
        os.unlink(log)
    output = (out or "") + (err or "")
    check_output(text + output)
    if p.returncode != 0 and '"Metric Value"' not in text:
        last = (output.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        raise NcuError(f"ncu: the measured process failed: {last}")
    return text, output


def run(specs: list[dict], cache_control: str = "none", timeout_s: float | None = None) -> tuple[str, str]:
    """Run this module's child for ``specs`` under ncu (`run_child`); (CSV text, child output).
    ``timeout_s`` defaults to $ATTNSCOPE_NCU_TIMEOUT_S, else 600 s."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("ATTNSCOPE_NCU_TIMEOUT_S", "600"))
    return run_child(child_command(specs), cache_control=cache_control, timeout_s=timeout_s)


def pair(specs_status: list[dict], calls: list[list[KernelBytes]]) -> list[tuple[dict, list[KernelBytes]]]:
    """Pair each configuration whose marker ran with its segment of kernels, in order."""
    marked = [s for s in specs_status if s.get("marked")]
    return list(zip(marked, calls, strict=False))


def measure(impl: str, n: int = 4096, d: int = 128, heads: int = 32, batch: int = 1, dtype: str = "fp16",
            causal: bool = False, cache_control: str = "none", timeout_s: float | None = None,
            kv_heads: int | None = None) -> Measured:
    """DRAM bytes of one call of ``impl`` at this shape, measured by ncu (see the module docstring;
    ``timeout_s``: `run`)."""
    choice("impl", impl, IMPLS)
    spec = {"impl": impl, "n": n, "d": d, "heads": heads, "batch": batch, "dtype": dtype, "causal": causal}
    if kv_heads is not None and kv_heads != heads:
        spec["kv_heads"] = kv_heads
    return measure_spec(spec, cache_control, timeout_s)


def measure_spec(spec: dict, cache_control: str = "none", timeout_s: float | None = None) -> Measured:
    """DRAM bytes of one call of a validated spec (a forward one, or a family's: measure/physical.point),
    measured by ncu (``timeout_s``: `run`)."""
    text, output = run([spec], cache_control=cache_control, timeout_s=timeout_s)
    status = child_status(output)
    if status and not status[0].get("ok"):
        raise NcuError(f"ncu: the measured call failed: {status[0].get('error', 'unknown error')}")
    calls = split_at_markers(parse_csv(text))
    return Measured(calls[0] if calls else [], cache_control, ncu_version(find_ncu()))


def exact_bytes(spec: dict) -> tuple[int, int]:
    """Exact (read, write) DRAM bytes of a calibration stream spec (``kind`` in STREAMS, ``bytes``).

    copy: reads and writes ``bytes``; sum: reads ``bytes`` (its few-byte result is not counted); fill:
    writes ``bytes``. The write side counts only what leaves the L2 during the kernel: up to about the
    L2's size can stay dirty (write-back), which is why calibration measures two sizes and also reports
    the slope between them.
    """
    kind = choice("kind", spec.get("kind"), STREAMS)
    n = spec.get("bytes")
    if not (is_int(n) and n > 0 and n % 4 == 0):
        raise InputError(f"bytes: expected a positive multiple of 4, got {short(n)}")
    return {"copy": (n, n), "sum": (n, 0), "fill": (0, n)}[kind]


@dataclass(frozen=True)
class Point:
    """One spec of `measure_many`: its DRAM bytes, or the one-line reason it has none."""

    spec: dict
    measured: Measured | None
    error: str | None = None

    def to_json(self) -> dict:
        return {"spec": self.spec, "measured": self.measured.to_json() if self.measured else None,
                "error": self.error}


#: Implementations whose kernels compile at their first call (Triton's JIT, Flex's torch.compile): the
#: ones `warm_up` runs.
COMPILED = ("attnscope", "flex")
#: The fields that pick a spec's compiled kernels (with `compile_key`'s GQA flag): points that agree on
#: them share compiled kernels, in one process and through the on-disk caches.
_COMPILE_FIELDS = ("pass", "kind", "impl", "d", "dtype", "causal", "deterministic", "kernels", "kv_dtype",
                   "page_size")


def compile_key(spec: dict) -> tuple:
    """A sort key that puts specs compiling the same kernels side by side: family, implementation, head
    dim, dtype, masking, mode, GQA or not, then the head counts."""
    gqa = spec.get("kv_heads", spec.get("heads")) != spec.get("heads")
    return (*(str(spec.get(f, "")) for f in _COMPILE_FIELDS), gqa, str(spec.get("heads", "")),
            str(spec.get("kv_heads", "")))


def measuring_order(specs: list[dict], rounds: int = 1) -> list[int]:
    """Indices of ``specs`` in the order `measure_many` measures them: within each of ``rounds`` equal
    rounds (``--repeat``: the grid K times), by `compile_key`, then grid order."""
    size = len(specs) // rounds if rounds > 0 and len(specs) % rounds == 0 else len(specs)
    return sorted(range(len(specs)), key=lambda i: (i // max(size, 1), compile_key(specs[i]), i))


def warm_up(specs: list[dict], workers: int, timeout_s: float | None = None) -> int:
    """Compile the kernels of the `COMPILED` specs before ncu measures them, in up to ``workers``
    processes at once (specs dealt out in turn, so each process gets a share of every kind).

    Each process (``python -m attnscope.measure.ncu --warm``, no ncu, no profiler) makes the first call of
    its specs, so Triton's and inductor's on-disk caches hold what the measuring child then loads instead
    of compiling: the compiles, CPU work, run side by side. A spec's kernels depend on the spec alone
    (Flex compiles afresh for each point: measure/family_calls.py), so any split of the specs warms the
    children's. A process that fails or passes ``timeout_s`` (`run`'s default) is stopped and ignored:
    the measuring child compiles for itself. Nothing runs on the GPU while ncu measures. Returns how many
    processes exited cleanly.
    """
    todo = [s for s in specs if s.get("impl") in COMPILED]
    shares = [todo[w::workers] for w in range(min(workers, len(todo)))]
    if timeout_s is None:
        timeout_s = float(os.environ.get("ATTNSCOPE_NCU_TIMEOUT_S", "600"))
    # one compile at a time in each process (the processes are the parallelism); not in inductor's key
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", **_child_env()}
    running: list[tuple[subprocess.Popen, float]] = []
    ok = 0
    try:
        for share in shares:
            p = subprocess.Popen(child_command(share, "--warm"), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env, start_new_session=True)
            running.append((p, time.monotonic()))
        while running:
            time.sleep(0.05)
            for p, t0 in list(running):
                if p.poll() is not None:
                    ok += p.returncode == 0
                    running.remove((p, t0))
                elif time.monotonic() - t0 > timeout_s:
                    _kill(p)
                    running.remove((p, t0))
    except BaseException:
        for p, _ in running:
            _kill(p)
        raise
    return ok


def measure_many(specs: list[dict], cache_control: str = "none", per_child: int = 8,
                 timeout_s: float | None = None, progress=None, rounds: int = 1,
                 done: dict[int, Point] | None = None, warm_workers: int = 0) -> list[Point]:
    """Measure several specs (attention calls and calibration streams) under ncu; one Point per spec, in
    the order of ``specs``.

    ``per_child`` specs go to one child process (one start-up of ncu, torch and the kernels' compilation
    per group; a group that times out or crashes loses only its own points), taken in `measuring_order`
    (``rounds``: ``specs`` is a grid repeated that many times), so specs that compile the same kernels
    share a child. ``warm_workers`` > 0 first compiles the specs' kernels in that many processes at once
    (`warm_up`). ``done`` maps indices of ``specs`` to Points already measured (a resumed sweep):
    they are kept, not measured again. ``timeout_s`` is per group (`run`). ``progress(points so far,
    total)`` is called after each group with the points done so far (``done`` included) in the order of
    ``specs`` (`attnscope bytes --sweep` writes its JSON there, so a run cut short keeps what it
    measured).
    """
    got: dict[int, Point] = dict(done or {})
    order = [i for i in measuring_order(specs, rounds) if i not in got]
    groups = [order[g:g + per_child] for g in range(0, len(order), per_child)]
    if not groups:
        return [got[i] for i in range(len(specs))]
    version = ncu_version(find_ncu())
    if warm_workers > 0:
        warm_up([specs[i] for i in order], warm_workers, timeout_s)
    for grp in groups:
        group = [specs[i] for i in grp]
        out: list[Point] = []
        try:
            text, output = run(group, cache_control=cache_control, timeout_s=timeout_s)
            status = child_status(output)
            calls = split_at_markers(parse_csv(text)) if '"Metric Value"' in text else []
        except NcuError as e:
            if "not permitted" in str(e) or "not found" in str(e):
                raise
            out += [Point(s, None, str(e)) for s in group]
        else:
            if not status:
                last = (output.strip().splitlines() or ["no status line"])[-1]
                out += [Point(s, None, f"the child printed no status: {short(last, 120)}") for s in group]
            else:
                paired = {id(st): ks for st, ks in pair(status, calls)}
                for s, st in zip(group, status, strict=False):
                    if not st.get("ok"):
                        out.append(Point(s, None, st.get("error", "unknown error")))
                    elif id(st) not in paired:
                        out.append(Point(s, None, "no profiled kernels for this call"))
                    else:
                        out.append(Point(s, Measured(paired[id(st)], cache_control, version)))
                out += [Point(s, None, "the child stopped before this call") for s in group[len(status):]]
        got.update(zip(grp, out, strict=True))
        if progress is not None:
            progress([got[i] for i in sorted(got)], len(specs))
    return [got[i] for i in range(len(specs))]


# --- the child -------------------------------------------------------------------------------------
def _call(torch, spec: dict):
    """(fn, args) for one spec: an attention call on fresh inputs, or a calibration stream."""
    from attnscope.measure.backends import attention_fn, sdpa, torch_dtype

    if spec.get("kind"):
        exact_bytes(spec)  # validates kind and size
        n = spec["bytes"] // 4
        src = torch.ones(n, dtype=torch.float32, device="cuda")
        if spec["kind"] == "copy":  # an SM kernel (elementwise), not copy_'s copy-engine cudaMemcpy
            dst = torch.empty_like(src)
            return (lambda: torch.neg(src, out=dst)), (src, dst)
        if spec["kind"] == "sum":
            return (lambda: src.sum()), (src,)
        return (lambda: src.fill_(1.0)), (src,)
    if spec.get("pass", "forward") != "forward":  # backward, decode, varlen, window (measure/families.py)
        from attnscope.measure.family_calls import call

        return call(torch, spec)
    dt = torch_dtype(torch, spec.get("dtype", "fp16"))
    b, h, n, d = spec.get("batch", 1), spec["heads"], spec["n"], spec["d"]
    hkv = spec.get("kv_heads") or h
    q = torch.randn((b, h, n, d), device="cuda", dtype=dt)
    k, v = (torch.randn((b, hkv, n, d), device="cuda", dtype=dt) for _ in range(2))
    causal = bool(spec.get("causal", False))
    if hkv != h and spec["impl"] in ("flash", "cudnn", "efficient"):
        call = sdpa(spec["impl"])
        return (lambda: call(q, k, v, causal, True)), (q, k, v)
    fn = attention_fn(spec["impl"], causal)
    return (lambda: fn(q, k, v)), (q, k, v)


def _child(specs: list[dict]) -> int:
    """Warm up, evict L2, and run each configuration once inside a profiler range (see module doc)."""
    import torch

    cudart = torch.cuda.cudart()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or 64 * 2**20
    scratch = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    torch.cuda.synchronize()
    cudart.cudaProfilerStart()  # the primer range (module docstring): its kernel precedes every marker
    try:
        scratch[:1024].sum()
        torch.cuda.synchronize()
    finally:
        cudart.cudaProfilerStop()
    status = []
    for spec in specs:
        marked = False
        try:
            fn, keep = _call(torch, spec)
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            scratch.sum()  # read 2x L2 of clean lines: the call starts from a cold L2
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            try:
                torch.cuda._sleep(1000)  # the marker kernel
                marked = True
                fn()
                torch.cuda.synchronize()
            finally:
                cudart.cudaProfilerStop()
            status.append({**spec, "ok": True, "marked": True})
            del fn, keep
        except Exception as e:  # one failing configuration (OOM, refused shape) must not lose the rest
            first = (str(e).strip().splitlines() or [""])[0]
            status.append({**spec, "ok": False, "marked": marked, "error": f"{type(e).__name__}: {first}"})
        torch.cuda.empty_cache()
    print("ATTNSCOPE_STATUS " + json.dumps(status))
    return 0


def child_status(output: str) -> list[dict]:
    """The per-configuration status line the child prints, or [] if absent. Each entry is the spec with
    ``ok``, ``marked`` (its marker kernel ran, so it owns one segment of `split_at_markers`) and
    ``error``."""
    for line in output.splitlines():
        if line.startswith("ATTNSCOPE_STATUS "):
            return json.loads(line[len("ATTNSCOPE_STATUS "):])
    return []


def _warm(specs: list[dict]) -> int:
    """`warm_up`'s process: the first call of each spec, in order, no profiler; a failing one is passed
    over (the measuring child reports it)."""
    import torch

    for spec in specs:
        try:
            fn, keep = _call(torch, spec)
            fn()
            torch.cuda.synchronize()
            del fn, keep
        except Exception:  # an OOM or a refused shape here only loses the warm cache
            pass
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":  # pragma: no cover - runs on the GPU machine (--child: under ncu)
    if len(sys.argv) == 3 and sys.argv[1] in ("--child", "--warm"):
        sys.exit((_child if sys.argv[1] == "--child" else _warm)(json.loads(sys.argv[2])))
    sys.exit("usage: python -m attnscope.measure.ncu --child|--warm SPECS_JSON")
