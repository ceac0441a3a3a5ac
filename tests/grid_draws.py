"""The sweep grids bench/prefill.py draws (not a test module): a grid committed before any of its points was
measured is what the seed in its header draws, row for row."""

import csv
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def prefill():
    """bench/prefill.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_prefill", BENCH / "prefill.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_drawn(name: str, family: str, seed: int) -> list[dict]:
    """Assert that bench/grids/``name`` names ``prefill.py --draw seed --family family`` in its header and
    holds exactly the rows that command draws (empty cells as absent); return the drawn rows (text cells)."""
    text = (BENCH / "grids" / name).read_text()
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert any(f"--draw {seed} --family {family}" in line for line in head)
    rows = [{k: str(v) for k, v in r.items()} for r in prefill().draw_sweep(family, seed)]
    got = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [{k: v for k, v in r.items() if v} for r in got] == rows
    return rows
