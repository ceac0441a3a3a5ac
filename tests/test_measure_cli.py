"""cli/gpu.py: `which`, `bytes`, `share`, `bench` without a GPU, and `bytes --estimate-only` (CPU)."""

import json
import subprocess
import sys

import pytest

from attnscope.cli import main


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


no_gpu = pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU message")


@no_gpu
@pytest.mark.parametrize("argv", [["which"], ["which", "--backend", "math", "--causal"], ["bytes"],
                                  ["bytes", "--impl", "naive"], ["share"],
                                  ["share", "--attention", "naive", "--project-to", "attnscope"], ["bench"]])
def test_without_a_gpu_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"attnscope {argv[0]}: error: ")
    assert "CUDA" in lines[0] or "torch" in lines[0]


def test_bytes_estimate_only_json(capsys):
    from attnscope.measure.physical import estimate

    assert main(["bytes", "--estimate-only", "--impl", "naive", "--heads", "1", "--l2-bytes", "60000000",
                 "--sms", "132", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["logical"] == 138_412_032  # spec §1.1, one head
    assert out["measured"] is None
    assert out["estimate"]["total"] == estimate("naive", 4096, 128, 1, l2_bytes=60_000_000, sms=132).total
    assert out["params"]["l2_bytes"] == 60_000_000


def test_bytes_estimate_only_table(capsys):
    assert main(["bytes", "--estimate-only", "--impl", "flash", "--causal", "--n", "2048"]) == 0
    out = capsys.readouterr().out
    assert "logical model" in out and "physical estimate" in out and "measured" in out  # column "vs measured"
    assert "flash, [1, 32, 2048, 128] fp16, causal" in out


def test_bytes_refuses_bad_input(capsys):
    assert main(["bytes", "--estimate-only", "--heads", "0"]) == 2
    assert "attnscope bytes: error: heads: expected a positive integer, got 0" in capsys.readouterr().err


def test_share_project_to_itself_is_refused(capsys):
    assert main(["share", "--attention", "flash", "--project-to", "flash"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attnscope share: error: project_to: expected an attention other than --attention "
                   "(flash), got 'flash'")


def test_unknown_backend_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["which", "--backend", "fast"])
    assert e.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_parser_builds_without_torch():
    code = ("import sys; from attnscope.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bench_guard_when_the_driver_is_missing(monkeypatch, capsys):
    import argparse

    import attnscope.measure
    from attnscope.cli import gpu

    monkeypatch.setitem(sys.modules, "attnscope.measure.bench", None)  # import raises ImportError
    monkeypatch.delattr(attnscope.measure, "bench", raising=False)
    parser = argparse.ArgumentParser()
    gpu._add_bench(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench"])
    assert args.func(args) == 2
    assert capsys.readouterr().err.startswith("attnscope bench: error: the sweep driver "
                                              "attnscope.measure.bench is not available: ")
