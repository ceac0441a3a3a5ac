"""bench/train.py --tiny trains the Llama-shaped decoder end to end on a CPU (attnscope, dense)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_dense_training_with_attnscope_runs_on_the_cpu(tmp_path):
    out = tmp_path / "train.json"
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--tiny", "--backends", "attnscope",
                        "--steps", "2", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
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
