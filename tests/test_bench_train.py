"""bench/train.py --tiny trains the Llama-shaped decoder end to end on a CPU (attnscope, dense), and its
--grad-agreement holds attnscope's whole-model gradients against SDPA's (MATH, FLASH on a CPU)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def run_env(cpu=True):
    """The environment of a run of bench/train.py: this tree's src/ and bench/ first on the path; with
    ``cpu``, no GPU visible and Triton's interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "bench"),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(env, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="") if cpu else env


def test_tiny_dense_training_with_attnscope_runs_on_the_cpu(tmp_path):
    out = tmp_path / "train.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--tiny", "--backends", "attnscope",
                        "--steps", "2", "--json", str(out)],
                       env=run_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "check attnscope: max error / bound" in r.stdout and "(ok)" in r.stdout  # float64 check first
    doc = json.loads(out.read_text())
    assert doc["failed_check"] == {}
    (run,) = doc["runs"]
    assert run["backend"] == "attnscope" and len(run["losses"]) == 2
    assert all(math.isfinite(x) for x in run["losses"])
    # the first step's backward reached every parameter (through attnscope's backward): finite, nonzero
    assert run["grads_seen"] is True
    # a loss near ln(vocab) at the start: the model and the data are what --tiny says
    assert abs(run["losses"][0] - math.log(256)) < 1.5


GRAD_AGREEMENT = ["--tiny", "--backends", "attnscope", "--grad-agreement"]


def test_grad_agreement_passes_attnscope_against_sdpa_on_the_cpu(tmp_path):
    out = tmp_path / "agreement.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), *GRAD_AGREEMENT,
                        "--agreement-steps", "3", "--json", str(out)],
                       env=run_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "grad agreement: PASS" in r.stdout
    doc = json.loads(out.read_text())["grad_agreement"]
    assert doc["pass"] is True and doc["references"] == ["sdpa-math", "sdpa-flash"]
    assert doc["candidates"] == ["attnscope"]
    assert [ph["step"] for ph in doc["phases"]] == [0, 3]  # at init and after the reference's 3 steps
    for ph in doc["phases"]:
        # the two references are different bf16 attentions: they differ, and the bound is built on that
        assert 0 < ph["reference_spread"] < 0.1
        assert ph["bound"] == pytest.approx(2 * ph["reference_spread"] + doc["floor"])
        att = ph["vs_reference"]["attnscope"]
        assert 0 < att["median"] <= att["max"] <= ph["bound"]
        assert all(abs(x - math.log(256)) < 1.5 for x in ph["loss"].values())
    # the reference trained between the two states: the model changed, so the losses did
    assert doc["phases"][0]["loss"]["sdpa-math"] != doc["phases"][1]["loss"]["sdpa-math"]


def test_grad_agreement_fails_an_attention_that_scales_its_output():
    # attnscope's attention times 1.1: a 10 % error in every layer's output, which gradients must show
    code = (
        "import sys, train\n"
        "real = train.attention_fn\n"
        "def wrong(torch, backend, setting, args):\n"
        "    f = real(torch, backend, setting, args)\n"
        "    return (lambda q, k, v, ctx: f(q, k, v, ctx) * 1.1) if backend == 'attnscope' else f\n"
        "train.attention_fn = wrong\n"
        f"sys.exit(train.main({GRAD_AGREEMENT + ['--agreement-steps', '0']!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], env=run_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "grad agreement: FAIL" in r.stdout
    (verdict,) = [line for line in r.stdout.splitlines() if "references' spread" in line]
    assert verdict.split(": ")[-1].startswith("attnscope ") and verdict.endswith(" OUTSIDE")
    assert "[step 0]" in r.stdout and "training with" not in r.stdout  # --agreement-steps 0: init only


def test_grad_agreement_needs_a_backend_besides_the_references():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--tiny", "--backends", "sdpa-math",
                        "--grad-agreement"], env=run_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "--grad-agreement: expected a backend besides the references sdpa-math, sdpa-flash" in r.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (SDPA CUDNN, FLASH, EFFICIENT)")
def test_grad_agreement_on_the_gpu_against_cudnn_flash_and_efficient(tmp_path):
    out = tmp_path / "agreement.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), *GRAD_AGREEMENT,
                        "--agreement-steps", "3", "--json", str(out)],
                       env=run_env(cpu=False), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())["grad_agreement"]
    assert doc["references"] == ["sdpa-cudnn", "sdpa-flash", "sdpa-efficient"] and doc["pass"] is True
    assert all(0 < ph["vs_reference"]["attnscope"]["max"] <= ph["bound"] for ph in doc["phases"])


def test_paired_steps_times_each_backend_per_round_and_takes_the_medians(tmp_path):
    import statistics

    out = tmp_path / "paired.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--tiny", "--backends",
                        "sdpa-math,sdpa-flash", "--paired-steps", "3", "--steps", "2", "--warmup", "1",
                        "--json", str(out)], env=run_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())["paired"]
    times = doc["times_ms"]
    assert list(times) == ["sdpa-math", "sdpa-flash"]
    assert all(len(t) == 3 and min(t) > 0 for t in times.values())
    assert doc["step_ms"] == {b: statistics.median(t) for b, t in times.items()}
    ratios = [f / m for f, m in zip(times["sdpa-flash"], times["sdpa-math"], strict=True)]
    assert doc["ratios"]["sdpa-flash"] == {"median": statistics.median(ratios), "min": min(ratios),
                                           "max": max(ratios)}
    assert "paired: sdpa-flash step / sdpa-math step, median of 3 rounds" in r.stdout


def test_paired_steps_needs_two_backends():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--tiny", "--backends", "attnscope",
                        "--paired-steps", "3", "--steps", "2"], env=run_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2
    assert "--paired-steps: expected a positive K with two or more --backends" in r.stderr
