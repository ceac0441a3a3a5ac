"""`attnscope trace` and `attnscope verify`: the spec's §3.2 table, --input/--json, bad input, exit codes."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from attnscope import checks
from attnscope import reference as R
from attnscope.cli import main

SPEC_DOC = {"tiles": [{"scores": [8, 6], "values": [[1, 2], [3, 4]]},
                      {"scores": [10, 7], "values": [[5, 6], [7, 8]]}]}


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def write(tmp_path, text: str) -> str:
    p = tmp_path / "in.json"
    p.write_text(text)
    return str(p)


# --- trace ----------------------------------------------------------------------------------------
def test_trace_default_is_the_spec_table(capsys):
    rc, out, _ = run(capsys, "trace")
    assert rc == 0
    rows = [line for line in out.splitlines() if re.match(r"^│ [12] ", line)]
    assert len(rows) == 2
    # spec §3.2: tile 1 m = 8.0, l = 1.1353, a = [1.4060, 2.5413]; tile 2 m = 10.0, alpha = 0.1353,
    # l = 1.2034, a = [5.5388, 6.7422]
    assert re.search(r"8\.0000 .* - .* 1\.1353 .* \[1\.4060, 2\.5413\]", rows[0])
    assert re.search(r"10\.0000 .* 0\.1353 .* 1\.2034 .* \[5\.5388, 6\.7422\]", rows[1])
    assert "O = acc / l = [4.6025, 5.6025]" in out
    assert "weights [0.1125, 0.0152, 0.8310, 0.0414], weighted sum [4.6025, 5.6025]" in out
    assert ": match" in out


def test_trace_json_matches_the_spec_to_4_decimals(capsys):
    rc, out, _ = run(capsys, "trace", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert set(doc) >= {"steps", "output", "reference", "max_abs_diff"}
    s1, s2 = doc["steps"]
    assert s1["tile"] == 1 and s1["alpha"] is None and s2["tile"] == 2
    r4 = lambda x: np.round(x, 4).tolist()  # noqa: E731
    assert (r4(s1["m"]), r4(s1["l"]), r4(s1["acc"])) == (8.0, 1.1353, [1.4060, 2.5413])
    assert (r4(s2["m"]), r4(s2["alpha"]), r4(s2["l"]), r4(s2["acc"])) == (10.0, 0.1353, 1.2034,
                                                                         [5.5388, 6.7422])
    assert r4(doc["output"]) == r4(doc["reference"]) == [4.6025, 5.6025]
    assert doc["max_abs_diff"] < 1e-12


def test_trace_input_file_spec_example(tmp_path, capsys):
    _, default, _ = run(capsys, "trace", "--json")
    rc, out, _ = run(capsys, "trace", "--json", "--input", write(tmp_path, json.dumps(SPEC_DOC)))
    assert rc == 0 and json.loads(out) == json.loads(default)


def test_trace_input_any_tiles_and_width(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(3)
    s = (rng.standard_normal(7) * 4).round(3)
    v = rng.standard_normal((7, 3)).round(3)
    doc = {"tiles": [{"scores": s[a:b].tolist(), "values": v[a:b].tolist()}
                     for a, b in ((0, 1), (1, 5), (5, 7))]}
    rc, out, _ = run(capsys, "trace", "--json", "--input", write(tmp_path, json.dumps(doc)))
    assert rc == 0
    got = json.loads(out)
    w = np.exp(s - s.max())
    assert np.allclose(got["output"], (w / w.sum()) @ v, rtol=0, atol=1e-12)
    assert [st["tile"] for st in got["steps"]] == [1, 2, 3]
    assert np.isclose(got["steps"][2]["m"], s.max())
    assert np.isclose(got["steps"][2]["l"], w.sum())
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(doc)))  # "-" reads stdin
    rc, out2, _ = run(capsys, "trace", "--json", "--input", "-")
    assert rc == 0 and json.loads(out2) == got


def test_trace_human_output_for_input(tmp_path, capsys):
    rc, out, _ = run(capsys, "trace", "--input", write(tmp_path, json.dumps(SPEC_DOC)))
    assert rc == 0 and "[4.6025, 5.6025]" in out and "in.json" in out


BAD = [
    ('{"tiles": [{"scores": [8, 6], "values": [[1, 2]]}]}',
     "tile 1 values: expected 2 rows (one per score), got 1"),
    ('{"tiles": [{"scores": [8], "values": [[1, 2]]}, {"scores": [9], "values": [[1]]}]}',
     "tile 2 values: expected rows of width 2 (as tile 1), got 1"),
    ('{"tiles": [{"scores": [8, NaN], "values": [[1], [2]]}]}',
     "--input: expected finite numbers (NaN and Infinity are not JSON), got NaN"),
    ('{"tiles": [{"scores": [8, 1e999], "values": [[1], [2]]}]}',
     "--input: expected a finite number, got '1e999' (overflows a float)"),
    ('{"tiles": [{"scores": [8], "values": [[-Infinity]]}]}',
     "--input: expected finite numbers (NaN and Infinity are not JSON), got -Infinity"),
    ('{"tiles": []}', "tiles: expected a non-empty list"),
    ('{"tiles": [{"scores": [], "values": []}]}', "tile 1 scores: expected at least one score"),
    ('{"tiles": [{"scores": [8, 6], "values": [[1, 2], [3, 4]]}',
     "--input: expected valid JSON, got Expecting"),
    ("", "--input: expected valid JSON"),
    ('[1, 2]', '--input: expected an object {"tiles": [...]}, got [1, 2]'),
    ('{"tile": []}', '--input: expected an object {"tiles": [...]}'),
    ('{"tiles": [{"scores": [1]}]}', 'tile 1: expected an object with exactly "scores" and "values"'),
    ('{"tiles": [[1, 2]]}', 'tile 1: expected an object with exactly "scores" and "values", got [1, 2]'),
    ('{"tiles": [{"scores": ["8"], "values": [[1]]}]}', "tile 1 scores: expected a list of numbers"),
    ('{"tiles": [{"scores": [8, 6], "values": [[1, 2], [3]]}]}',
     "tile 1 values: expected a list of rows of numbers"),
    ('{"tiles": [{"scores": [true], "values": [[1]]}]}', "tile 1 scores: expected a list of numbers"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_trace_bad_input_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    rc, out, err = run(capsys, "trace", "--input", write(tmp_path, text))
    assert rc == 2 and out == ""
    assert err.startswith("attnscope trace: error: ") and err.count("\n") == 1
    assert message in err


def test_trace_missing_file(tmp_path, capsys):
    rc, _, err = run(capsys, "trace", "--input", str(tmp_path / "nope.json"))
    assert rc == 2 and "--input: expected a readable file" in err and "No such file" in err
    assert err.count("\n") == 1


def test_trace_reports_a_mismatch_with_exit_1(capsys, monkeypatch):
    # an online softmax that forgets to rescale the old l and acc by alpha (l_j = l_{j-1} + rowsum(p_j))
    # no longer matches the global softmax
    monkeypatch.setattr(R, "_linear_scan", lambda alpha, b: np.cumsum(b, axis=0))
    rc, out, _ = run(capsys, "trace")
    assert rc == 1 and "MISMATCH" in out
    rc, out, _ = run(capsys, "trace", "--json")
    assert rc == 1 and json.loads(out)["max_abs_diff"] > 0.01


def test_trace_sink_joins_the_denominator_only(capsys):
    rc, out, _ = run(capsys, "trace", "--sink", "9", "--json")
    j = json.loads(out)
    s, v = np.array([8.0, 6.0, 10.0, 7.0]), np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    want = np.exp(s) @ v / (np.exp(s).sum() + np.exp(9.0))  # Z = sum exp(s) + exp(sink); no value
    assert rc == 0 and np.allclose(j["output"], want, rtol=1e-12)
    assert j["steps"][-1]["acc"] == j["steps"][-2]["acc"]  # the sink moves l, not acc
    rc, out, _ = run(capsys, "trace", "--sink", "9")
    assert rc == 0 and "Tile 3 is the sink (logit 9, value 0)" in " ".join(out.split())  # caption wraps
    rc, _, err = run(capsys, "trace", "--sink", "inf")
    assert rc == 2 and err.strip() == "attnscope trace: error: --sink: expected a finite number, got inf"


# --- verify ---------------------------------------------------------------------------------------
def test_verify_reference_checks_pass(capsys):
    rc, out, _ = run(capsys, "verify", "--kernels", "off")
    assert rc == 0
    lines = out.splitlines()
    for n in range(1, 11):
        assert any(re.match(rf"PASS  {n} ", line) for line in lines), n
    assert any(line.startswith("SKIP  kernels") and "--kernels off" in line for line in lines)
    assert re.search(r"\d\.\d\de[-+]\d\d < 1e-12", out)  # the measured error is printed
    assert lines[-1] == "10 passed, 0 failed, 1 not run (seed 0)"


def test_verify_json(capsys):
    rc, out, _ = run(capsys, "verify", "--kernels", "off", "--seed", "5", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["passed"] is True and doc["seed"] == 5
    assert [c["status"] for c in doc["checks"]] == ["PASS"] * 10 + ["SKIP"]
    assert all(c["error"] is not None for c in doc["checks"][:6])


def test_verify_fails_with_exit_1_when_the_mask_is_omitted(capsys, monkeypatch):
    monkeypatch.setattr(R, "_mask_tile", lambda s, row0, col0, offset, bounds=None: s)
    rc, out, _ = run(capsys, "verify", "--kernels", "off")
    assert rc == 1
    assert re.search(r"^FAIL  1 tiled = naive", out, re.M)
    assert re.search(r"^PASS  3 mask omitted .* detected", out, re.M)


def test_verify_kernels_on_that_cannot_run_is_a_failure(capsys, monkeypatch):
    monkeypatch.setattr(checks, "kernel_status", lambda mode: (False, "not run: no GPU (test)", []))
    rc, out, _ = run(capsys, "verify", "--kernels", "on")
    assert rc == 1 and re.search(r"^FAIL  kernels .*not run: no GPU \(test\)", out, re.M)
    rc, out, _ = run(capsys, "verify", "--kernels", "auto")
    assert rc == 0 and re.search(r"^SKIP  kernels .*not run: no GPU \(test\)", out, re.M)


def test_verify_bad_flags(capsys):
    rc, _, err = run(capsys, "verify", "--seed", "-1")
    assert rc == 2 and err == "attnscope verify: error: --seed: expected a non-negative integer, got -1\n"
    with pytest.raises(SystemExit) as e:
        main(["verify", "--kernels", "maybe"])
    assert e.value.code == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
