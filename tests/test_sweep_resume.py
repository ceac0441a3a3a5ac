"""`attnscope bytes --sweep`: the measuring order, the warm-up processes, a run cut short and `--resume`.

ncu is stood in for at `ncu.run` (CSV text and the child's status line), so the real `measure_many`
groups, pairs and merges; nothing here needs a GPU.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnscope.cli import main
from attnscope.measure import ncu, physical

ROOT = Path(__file__).resolve().parent.parent
HEADER = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
GRID = ("pass,impl,heads,kv_heads,d,causal,dtype,lens\n"
        "varlen,attnscope,8,2,64,1,fp16,100;300\n"
        "varlen,flex,8,8,128,0,bf16,64;64;90\n"
        "varlen,attnscope,4,4,128,0,fp16,500\n"
        "varlen,flex,8,8,128,0,bf16,200\n"
        "varlen,attnscope,8,2,64,1,fp16,77;33\n")


def _bytes_of(spec) -> int:  # distinct per point, so a mix-up shows
    return 1000 * sum(spec.get("lens", [spec.get("n", 0)])) + spec["heads"] + (spec.get("kernels") == "auto")


def _csv(group) -> str:
    """ncu's CSV for one child: a marker and one kernel per spec."""
    lines, kid = [HEADER], 0
    for s in group:
        for name, read in (("spin_kernel(long)", 0), ("attn_kernel", _bytes_of(s))):
            lines += [f'"{kid}","{name}","dram__bytes_read.sum","byte","{read}"',
                      f'"{kid}","{name}","dram__bytes_write.sum","byte","0"']
            kid += 1
    return "\n".join(lines) + "\n"


@pytest.fixture
def stand_in(monkeypatch):
    """`ncu.run` answered without ncu; records each child's group; `stop_at` raises in that call."""
    from attnscope.cli import gpu

    calls, stop = [], {}

    def fake_run(group, cache_control="none", timeout_s=None):
        calls.append([dict(s) for s in group])
        if len(calls) == stop.get("at"):
            raise stop["exc"]
        status = [{**s, "ok": True, "marked": True} for s in group]
        return _csv(group), "ATTNSCOPE_STATUS " + json.dumps(status)

    monkeypatch.setattr(ncu, "run", fake_run)
    monkeypatch.setattr(ncu, "find_ncu", lambda: "ncu")
    monkeypatch.setattr(ncu, "ncu_version", lambda n: "ncu 2025")
    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)
    env = gpu._env
    monkeypatch.setattr(gpu, "_env", lambda l2, sms: {**env(l2, sms), "gpu": "NVIDIA H200"})
    return calls, stop


def _argv(grid, out, *more):
    return ["bytes", "--sweep", str(grid), "--l2-bytes", "62914560", "--sms", "132", "--json", str(out),
            "--warm-workers", "0", "--per-child", "2", *more]


def test_measuring_order_puts_points_of_one_compile_side_by_side_within_each_round():
    specs = physical.parse_grid("g.csv", text=GRID)
    order = ncu.measuring_order(specs)
    assert sorted(order) == list(range(5))
    # the two attnscope d=64 GQA causal points (grid rows 1 and 5) and the two flex d=128 points are
    # neighbours; the grid order breaks ties
    assert abs(order.index(0) - order.index(4)) == 1 and abs(order.index(1) - order.index(3)) == 1
    assert order.index(0) < order.index(4) and order.index(1) < order.index(3)
    two = ncu.measuring_order(specs * 2, rounds=2)  # --repeat 2: round 1 wholly before round 2
    assert sorted(two[:5]) == list(range(5)) and [i - 5 for i in two[5:]] == order


def test_measure_many_groups_by_compile_keeps_grid_order_and_skips_done(stand_in, monkeypatch):
    calls, _ = stand_in
    specs = physical.parse_grid("g.csv", text=GRID)
    seen = []
    pts = ncu.measure_many(specs, per_child=3, progress=lambda done, total: seen.append(
        ([p.spec for p in done], total)))
    assert [p.spec for p in pts] == specs and [p.measured.total for p in pts] == [_bytes_of(s) for s in specs]
    # attnscope d=128, then the two attnscope d=64 GQA causal points; the two flex points in the next child
    assert calls == [[specs[2], specs[0], specs[4]], [specs[1], specs[3]]]
    assert all(total == 5 for _, total in seen) and seen[-1][0] == specs
    for done, _ in seen:  # each partial list is in grid order
        assert done == [s for s in specs if s in done]
    calls.clear()
    kept = {0: pts[0], 4: pts[4]}
    warmed = []
    monkeypatch.setattr(ncu, "warm_up", lambda todo, workers, timeout_s: warmed.append((todo, workers)))
    again = ncu.measure_many(specs, per_child=2, done=kept, warm_workers=3)
    assert again[0] is pts[0] and again[4] is pts[4]
    assert warmed == [([specs[2], specs[1], specs[3]], 3)]  # before the children, what they will measure
    assert calls == [[specs[2], specs[1]], [specs[3]]]  # only the others, in the same order
    calls.clear()
    assert ncu.measure_many(specs, done=dict(enumerate(pts))) == pts and calls == []  # nothing left


def test_warm_up_deals_the_compiled_specs_to_k_processes_at_once(monkeypatch):
    started, live, most = [], [0], [0]

    class FakeProc:
        def __init__(self, cmd, **kw):
            started.append((cmd, kw["env"]))
            live[0] += 1
            most[0] = max(most[0], live[0])
            self.polls, self.returncode, self.pid = 0, None, 0
            self.code = 1 if len(started) == 2 else 0

        def poll(self):
            self.polls += 1
            if self.polls >= 2 and self.returncode is None:
                self.returncode = self.code
                live[0] -= 1
            return self.returncode

    monkeypatch.setattr(ncu.subprocess, "Popen", FakeProc)
    a, f, s = ({"impl": i, "heads": 8, "d": 64} for i in ("attnscope", "flex", "flash"))
    f2 = {**f, "d": 128}
    assert ncu.warm_up([a, s, a, f, f2, s, f], workers=3) == 2  # the second process exited 1
    assert most[0] == 3
    # SDPA compiles nothing; the rest dealt out in turn, so the Flex compiles spread over the processes
    assert [json.loads(cmd[4]) for cmd, _ in started] == [[a, f2], [a, f], [f]]
    assert all(cmd[1:4] == ["-m", "attnscope.measure.ncu", "--warm"] for cmd, _ in started)
    assert all(env["TORCHINDUCTOR_COMPILE_THREADS"] == "1" for _, env in started)
    started.clear()
    assert ncu.warm_up([s, s], workers=8) == 0 and started == []  # nothing to compile: no process


def test_run_child_stops_ncu_and_its_child_when_interrupted(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    fake = tmp_path / "ncu"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "find_ncu", lambda: str(fake))
    real = subprocess.Popen

    class Interrupted(real):
        def communicate(self, *a, **kw):
            if kw.get("timeout"):  # the wait for ncu: Ctrl-C arrives there
                while not pid_file.exists() or not pid_file.read_text().strip():
                    time.sleep(0.01)
                raise KeyboardInterrupt
            return super().communicate(*a, **kw)

    monkeypatch.setattr(ncu.subprocess, "Popen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        ncu.run_child(["python", "-c", "pass"], timeout_s=60)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # reaped: killed, not left running on the GPU
        os.kill(pid, 0)


def test_a_sweep_cut_short_keeps_a_partial_json_that_resume_completes(tmp_path, capsys, stand_in):
    calls, stop = stand_in
    grid = tmp_path / "g.csv"
    grid.write_text(GRID)
    out = tmp_path / "s.json"
    stop.update(at=2, exc=KeyboardInterrupt())
    assert main(_argv(grid, out)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"attnscope bytes: error: interrupted; 2/5 points are in {out} (--resume it)"
    part = json.loads(out.read_text())
    specs = physical.parse_grid(grid)
    assert part["env"]["partial"] == "2/5" and part["env"]["grid_sha256"] == physical.grid_digest(specs)
    assert isinstance(part["env"]["seconds"], int)  # the run's time so far
    first = [p["spec"] for p in part["points"]]
    assert first == [s for s in specs if s in calls[0]]  # the first child's points, in grid order
    assert all(p["measured"]["total"] == _bytes_of(p["spec"]) for p in part["points"])

    calls.clear()
    stop.clear()
    full = tmp_path / "full.json"
    assert main(_argv(grid, full, "--resume", str(out))) == 0
    assert "resumed: 2/5 measured in" in capsys.readouterr().err
    assert sorted(json.dumps(s, sort_keys=True) for g in calls for s in g) == sorted(
        json.dumps(s, sort_keys=True) for s in specs if s not in first)  # only the 3 others measured
    data = json.loads(full.read_text())
    assert "partial" not in data["env"] and data["env"]["resumed"]["points"] == 2
    assert [p["spec"] for p in data["points"]] == specs  # grid order
    assert [p["measured"]["total"] for p in data["points"]] == [_bytes_of(s) for s in specs]
    assert data["family_summary"]["varlen"]["count"] == 5
    rows, _ = physical.rows_from_json(full)  # and it reads back as a whole sweep
    assert rows == []

    calls.clear()  # a whole sweep resumed: nothing left to measure, the same points written again
    again = tmp_path / "again.json"
    assert main(_argv(grid, again, "--resume", str(full))) == 0
    assert calls == [] and json.loads(again.read_text())["points"] == data["points"]


def test_sigterm_leaves_a_valid_partial_json(tmp_path, capsys, stand_in, monkeypatch):
    calls, _ = stand_in
    grid = tmp_path / "g.csv"
    grid.write_text(GRID)
    out = tmp_path / "s.json"
    answer = ncu.run

    def third_child_gets_sigterm(group, **kw):
        if len(calls) == 2:  # `timeout` stops the run while the third child measures
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
            raise AssertionError("SIGTERM did not stop the sweep")
        return answer(group, **kw)

    monkeypatch.setattr(ncu, "run", third_child_gets_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    assert main(_argv(grid, out)) == 143
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert "interrupted; 4/5 points are in" in capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["env"]["partial"] == "4/5" and len(data["points"]) == 4


def test_resume_refuses_another_grid_with_one_line(tmp_path, capsys, stand_in):
    grid = tmp_path / "g.csv"
    grid.write_text(GRID)
    out = tmp_path / "s.json"
    assert main(_argv(grid, out)) == 0
    capsys.readouterr()
    other = tmp_path / "o.csv"
    cases = [
        (GRID.replace("500", "501"), [], "--resume: env.grid_sha256: expected the digest of the grid's "),
        (GRID + "varlen,flex,8,8,64,0,fp16,99\n", [], "--resume: expected a sweep of the grid's 6 points"),
        (GRID, ["--repeat", "2"], "--resume: env.repeat: expected 2 (--repeat), got 1"),
        (GRID, ["--cache-control", "all"], "cache_control: expected 'all' (--cache-control), got 'none'"),
    ]
    for text, more, msg in cases:
        other.write_text(text)
        assert main(_argv(other, tmp_path / "x.json", "--resume", str(out), *more)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, err
    assert main(["bytes", "--resume", str(out), "--l2-bytes", "62914560", "--sms", "132"]) == 2
    assert "--resume: expected none without a measured --sweep" in capsys.readouterr().err
    assert main(["bytes", "--warm-workers", "2", "--estimate-only"]) == 2
    assert "--warm-workers: expected none without a measured --sweep" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_the_backward_kernels_column_keeps_recorded_sweeps_and_resumes(tmp_path, capsys, stand_in):
    # a grid given the optional kernels column, empty, is the grid it was: the same specs and digest, and the
    # recorded held-out backward sweep resumes against it (every point measured, none again)
    grid = ROOT / "bench" / "grids" / "heldout_backward.csv"
    rec = ROOT / "bench" / "results" / "h200-2026-12-02-heldout-backward.json.gz"
    lines = grid.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("pass,"))
    widened = [line if line.startswith("#") else line + (",kernels" if i == head else ",")
               for i, line in enumerate(lines)]
    specs = physical.parse_grid("g.csv", text="\n".join(widened) + "\n")
    assert specs == physical.parse_grid(grid) and all("kernels" not in s for s in specs)
    done, _ = physical.resume_points(rec, specs, 1, "none")
    assert sorted(done) == list(range(len(specs))) == list(range(48))
    rows = [i for i, line in enumerate(widened) if i > head and not line.startswith("#")]
    at = rows[next(j for j, s in enumerate(specs) if s["impl"] == "attnscope" and not s["deterministic"])]
    auto = widened[:at] + [widened[at] + "auto"] + widened[at + 1:]  # one point now the user's default call
    changed = physical.parse_grid("g.csv", text="\n".join(auto) + "\n")
    assert sum(s.get("kernels") == "auto" for s in changed) == 1
    with pytest.raises(ValueError, match=r"--resume point \d+: spec: expected the grid's points in its"):
        physical.resume_points(rec, changed, 1, "none")

    # a sweep of kernels=auto points cut short resumes, and its JSON reads back with their spec
    calls, stop = stand_in
    text = ("pass,impl,heads,kv_heads,n,d,causal,dtype,deterministic,kernels\n"
            "backward,attnscope,8,2,1024,64,1,fp16,0,auto\n"
            "backward,attnscope,8,2,1024,64,1,fp16,0,\n"
            "backward,attnscope,8,2,2048,128,0,bf16,0,auto\n")
    g = tmp_path / "g.csv"
    g.write_text(text)
    part, full = tmp_path / "s.json", tmp_path / "full.json"
    stop.update(at=2, exc=KeyboardInterrupt())
    assert main(_argv(g, part)) == 130
    stop.clear()
    assert main(_argv(g, full, "--resume", str(part))) == 0
    capsys.readouterr()
    data = json.loads(full.read_text())
    specs = physical.parse_grid(g)
    assert [p["spec"] for p in data["points"]] == specs
    assert [s.get("kernels") for s in specs] == ["auto", None, "auto"]
    assert [p["measured"]["total"] for p in data["points"]] == [_bytes_of(s) for s in specs]
    _, env = physical.rows_from_json(full)
    labels = [r.label() for r in env["family_rows"]]
    assert labels[0].endswith("deterministic=false kernels=auto") and labels[1].endswith("atomic-dQ")


def test_resume_reads_the_recorded_heldout_varlen_partial():
    # the file a timed-out H200 run left (16 of 48, written before sweeps recorded a grid digest): its
    # points are the grid's first 16, in order; a grid missing its first row is refused
    grid = ROOT / "bench" / "grids" / "heldout_varlen.csv"
    part = ROOT / "bench" / "results" / "h200-2026-12-02-heldout-varlen-partial.json"
    specs = physical.parse_grid(grid)
    done, env = physical.resume_points(part, specs, 1, "none")
    assert sorted(done) == list(range(16)) and env["partial"] == "16/48"
    assert all(done[i].spec == specs[i] and done[i].measured.total > 0 for i in done)
    lines = grid.read_text().splitlines()
    shifted = "\n".join(lines[:3] + lines[4:] + [lines[3]]) + "\n"  # row 1 moved to the end
    with pytest.raises(ValueError, match=r"--resume point 1: spec: expected the grid's points in its "
                                         r"order, here its point 1 \(varlen flex"):
        physical.resume_points(part, physical.parse_grid("g.csv", text=shifted), 1, "none")


def test_warm_child_entry_point_is_wired():
    out = subprocess.run([sys.executable, "-m", "attnscope.measure.ncu", "--bogus", "[]"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ,
                                                                       "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 1 and "--child|--warm SPECS_JSON" in out.stderr
