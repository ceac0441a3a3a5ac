"""measure/families.py: the backward, decode and varlen points of `bytes --sweep`, their ledgers, the
issue-39 grids, and a sweep with ncu stood in for (CPU)."""

import json
from pathlib import Path

import pytest

from attnscope.cli import main
from attnscope.measure import families, ncu, physical
from attnscope.measure.ncu import KernelBytes
from attnscope.model import backward, serving

GRIDS = Path(__file__).resolve().parents[1] / "bench" / "grids"


@pytest.mark.parametrize("name,family", [("backward", "backward"), ("decode", "decode"), ("varlen", "varlen"),
                                         ("fwd_openclass", "forward"), ("window", "window")])
def test_issue39_grids_parse_with_48_valid_rows(name, family):
    specs = physical.parse_grid(GRIDS / f"heldout_{name}.csv")
    assert len(specs) >= 48
    assert {s.get("pass", "forward") for s in specs} == {family}
    if family == "forward":  # the open class: FA-2 causal, few K/V heads, N > 20k, B > 1
        assert all(s["impl"] == "flash" and s["causal"] and s["n"] > 20_000 and s["batch"] > 1
                   and s["heads"] // s.get("kv_heads", s["heads"]) >= 4 for s in specs)
    else:
        assert set(s["impl"] for s in specs) == set(families.IMPLS[family])
        assert all(0 < families.ledger(s)[1] <= families.ledger(s)[0] for s in specs)
    assert {(s["d"], s["dtype"]) for s in specs} == {(64, "fp16"), (64, "bf16"), (128, "fp16"), (128, "bf16")}
    assert any(s.get("kv_heads") for s in specs)  # GQA


def test_the_smoke_grid_holds_every_measured_callable():
    specs = physical.parse_grid(GRIDS / "families_smoke.csv")
    got = {(s["pass"], s["impl"], s.get("deterministic"), s.get("kernels"), "page_size" in s,
            s.get("kv_dtype")) for s in specs if "window" not in s or s["pass"] == "window"}
    # attnscope's windowed backward (the user's default call), decode (paged) and varlen
    windowed = {(s["pass"], s.get("kernels"), "page_size" in s) for s in specs
                if "window" in s and s["pass"] != "window"}
    assert windowed == {("backward", "auto", False), ("decode", None, True), ("varlen", None, False)}
    want = {(f, i, None, None, False, None) for f in ("backward", "decode", "varlen")
            for i in families.IMPLS[f]}
    want -= {(f, "attnscope", None, None, False, None) for f in ("backward", "decode")}
    want |= {("backward", "attnscope", det, None, False, None) for det in (False, True)}
    want |= {("backward", "attnscope", False, "auto", False, None)}  # the user's default call
    want |= {("decode", "attnscope", None, None, paged, kv) for paged in (False, True)
             for kv in (None, "fp8")}
    want |= {("window", i, None, None, False, None) for i in families.IMPLS["window"]}
    assert got == want


def _grid(tmp_path, text):
    p = tmp_path / "g.csv"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,err,match", [
    ("pass,impl,heads,n,d\nsideways,flash,8,1024,64\n", ValueError,
     r"row 2: pass: expected one of forward, backward, decode, varlen, window, got 'sideways'"),
    ("pass,impl,heads,n,d\nwindow,flex,8,1024,64\n", ValueError,
     r"row 2: window: expected a value, got none"),
    ("pass,impl,heads,n,d,window\nwindow,flex,8,1024,64,12\n", ValueError,
     r"row 2: window: expected left:right, two integers from -1 \(unbounded\), got '12'"),
    ("pass,impl,heads,n,d,window\nwindow,flex,8,1024,64,--5:3\n", ValueError,
     r"row 2: window: expected left:right, two integers from -1 \(unbounded\), got '--5:3'"),
    ("pass,impl,heads,n,d,window\nwindow,flex,8,1024,64,-1:-1\n", ValueError,
     r"row 2: window: expected a window bounding at least one side, got \[-1, -1\]"),
    ("pass,impl,heads,n,d,causal,window\nwindow,attnscope,8,1024,64,1,-1:9\n", ValueError,
     r"row 2: window: expected a window bounding the left side \(causal bounds the right one\)"),
    ("pass,impl,heads,n,d,window\nwindow,cudnn,8,1024,64,4:4\n", ValueError,
     r"row 2: impl: expected one of attnscope, flex with pass window, got 'cudnn'"),
    ("pass,impl,heads,d,lens,window\nvarlen,flex,8,64,100;200,5:5\n", NotImplementedError,
     r"row 2: window: a window with impl flex is not measured; supported: windows with attnscope"),
    ("pass,impl,batch,heads,d,cache_lens,window\ndecode,cudnn,2,8,64,512,100:0\n", NotImplementedError,
     r"row 2: window: a window with impl cudnn is not measured; supported: windows with attnscope"),
    ("pass,impl,heads,d,cache_lens,splits,window\ndecode,attnscope,8,64,512,1,-1:0\n", ValueError,
     r"row 2: window: expected a window bounding the left side"),
    ("pass,impl,heads,n,d,window\nbackward,flash,8,1024,64,4:4\n", NotImplementedError,
     r"row 2: window: a window with impl flash is not measured; supported: windows with attnscope"),
    ("impl,heads,n,d,window\nflash,8,1024,64,4:4\n", ValueError,
     r"row 2: window: expected no value with pass forward \(it takes n, causal\)"),
    ("pass,impl,heads,n,d,cache_lens\ndecode,flash,8,1024,64,4096\n", ValueError,
     r"row 2: n: expected no value with pass decode \(it takes cache_lens, page_size, kv_dtype, splits, "
     r"nq, window\)"),
    ("impl,heads,n,d,lens\nflash,8,1024,64,100;200\n", ValueError,
     r"row 2: lens: expected no value with pass forward \(it takes n, causal\), got '100;200'"),
    ("impl,heads,d\nflash,8,64\n", ValueError, r"row 2: n: expected a value, got none"),
    ("pass,impl,heads,d\nbackward,flash,8,64\n", ValueError, r"row 2: n: expected a value, got none"),
    ("pass,impl,heads,d,splits\ndecode,attnscope,8,64,2\n", ValueError,
     r"row 2: cache_lens: expected a value, got none"),
    ("pass,impl,heads,d,cache_lens,page_size\ndecode,flash,8,64,4096,64\n", NotImplementedError,
     r"row 2: page_size: 64 with impl flash is not measured; supported: a dense cache"),
    ("pass,impl,heads,d,cache_lens\ndecode,cudnn,8,64,100;200\n", NotImplementedError,
     r"row 2: cache_lens: unequal lengths with impl cudnn is not measured"),
    ("pass,impl,heads,d,cache_lens\ndecode,attnscope,8,64,100\n", ValueError,
     r"row 2: splits: expected a value"),
    ("pass,impl,heads,d,cache_lens,splits,page_size\ndecode,attnscope,8,64,100,2,48\n", NotImplementedError,
     r"row 2: page_size: 48 is not measured; supported: 16, 32, 64, 128, 256"),
    ("pass,impl,heads,d,cache_lens,splits,kv_dtype\ndecode,attnscope,8,64,100,2,int4\n", ValueError,
     r"row 2: kv_dtype: expected fp16 \(as dtype\) or fp8, got 'int4'"),
    ("pass,impl,heads,n,d,deterministic\nbackward,flash,8,1024,64,true\n", NotImplementedError,
     r"row 2: deterministic: true with impl flash is not measured; supported: true with attnscope"),
    ("pass,impl,heads,n,d,kernels\nbackward,attnscope,8,1024,64,hopper\n", ValueError,
     r"row 2: kernels: expected one of auto, portable or none, got 'hopper'"),
    ("pass,impl,heads,n,d,kernels\nbackward,flash,8,1024,64,auto\n", ValueError,
     r"row 2: kernels: expected no value with impl flash \(it names attnscope's kernels\), got 'auto'"),
    ("pass,impl,heads,d,cache_lens,splits,kernels\ndecode,attnscope,8,64,100,2,auto\n", ValueError,
     r"row 2: kernels: expected no value with pass decode"),
    ("impl,heads,n,d,kernels\nattnscope,8,1024,64,portable\n", ValueError,
     r"row 2: kernels: expected no value with pass forward \(it takes n, causal\), got 'portable'"),
    ("pass,impl,heads,n,d\nbackward,efficient,8,1024,64\n", ValueError,
     r"row 2: impl: expected one of naive, flash, cudnn, attnscope with pass backward, got 'efficient'"),
    ("pass,impl,heads,kv_heads,n,d\nbackward,naive,8,2,1024,64\n", NotImplementedError,
     r"row 2: kv_heads: kv_heads != heads with naive is not measured"),
    ("pass,impl,batch,heads,d,lens\nvarlen,flex,3,8,64,100;200\n", ValueError,
     r"row 2: batch: expected the number of lens \(2\), got 3"),
    ("pass,impl,heads,d\nvarlen,flex,8,64\n", ValueError, r"row 2: lens: expected a value, got none"),
    ("pass,impl,heads,n,d\nbackward,naive,64,300000,64\n", ValueError,
     r"row 2: n: expected the point's tensors to fit one GPU"),
])
def test_family_rows_refused_in_one_line_naming_the_column(tmp_path, text, err, match):
    with pytest.raises(err, match=match):
        physical.parse_grid(_grid(tmp_path, text))


def test_family_specs_and_ledgers():
    dec, bwd, var = physical.parse_grid("g.csv", text=(
        "pass,impl,heads,kv_heads,n,d,dtype,causal,deterministic,cache_lens,page_size,kv_dtype,splits,lens\n"
        "decode,attnscope,16,4,,128,bf16,,,1000;3000,64,fp8,4,\n"
        "backward,attnscope,8,2,1500,64,fp16,true,true,,,,,\n"
        "varlen,flex,8,8,,64,fp16,true,,,,,,300;700;64\n"))
    assert dec == {"pass": "decode", "impl": "attnscope", "batch": 2, "heads": 16, "d": 128, "dtype": "bf16",
                   "kv_heads": 4, "cache_lens": [1000, 3000], "page_size": 64, "kv_dtype": "fp8", "splits": 4}
    g = serving.paged([1000, 3000], 64, d=128, dtype="bf16", heads=16, kv_heads=4, num_splits=4,
                      kv_dtype="fp8")
    logical, comp, name = families.ledger(dec)
    assert logical == g.row.total and "paged" in name
    assert comp == 2 * 2 * 16 * 128 * 2 + 2 * 4 * 4000 * 128 + 2 * 4 * 4  # Q + O, K + V in e4m3, scales
    assert bwd["deterministic"] is True and bwd["causal"] is True
    t = backward.backward_traffic(1500, 64, "fp16", heads=8, kv_heads=2, rows=("flash-causal-backward-det",))
    assert families.ledger(bwd)[0] == t["flash-causal-backward-det"].total * 8
    # Q, dO, K, V read; dQ, dK, dV written; O and LSE read
    assert families.ledger(bwd)[1] == 1500 * 64 * 2 * (2 * 8 + 2 * 2 + 8 + 2 * 2) + 8 * 1500 * (64 * 2 + 4)
    assert var["batch"] == 3 and var["lens"] == [300, 700, 64]
    p = serving.packed([300, 700, 64], d=64, heads=8, rows=("flash-causal",))
    assert families.ledger(var)[:2] == (p["flash-causal"].total * 8, 1064 * 64 * 2 * 32)
    # SDPA decode: one length repeated over the batch, against the one-split dense ledger
    (sd,) = physical.parse_grid("g.csv", text="pass,impl,batch,heads,d,cache_lens\ndecode,flash,3,8,64,512\n")
    assert sd["cache_lens"] == [512] * 3 and "splits" not in sd
    assert families.ledger(sd)[0] == serving.paged([512] * 3, d=64, dtype="fp16", heads=8).row.total


def test_backward_kernels_column_names_the_build_the_ledger_and_the_estimate(monkeypatch):
    from attnscope.model import backward_estimate as be

    head = "pass,impl,heads,kv_heads,n,d,causal,dtype,deterministic,kernels\n"
    rows = [f"backward,attnscope,32,2,4096,{d},1,fp16,{det},{k}"
            for d in (64, 128) for det in (0, 1) for k in ("", "portable", "auto")]
    specs = physical.parse_grid("g.csv", text=head + "\n".join(rows) + "\n")
    plain = physical.parse_grid("g.csv", text=head.replace(",kernels", "") + "\n".join(
        r.rsplit(",", 1)[0] for r in rows) + "\n")
    for s, r in zip(specs, rows, strict=True):
        d, det, k = int(r.split(",")[5]), r.split(",")[-2] == "1", r.split(",")[-1]
        default = "auto" if det else "portable"
        assert s.get("kernels") == (k if k not in ("", default) else None), r  # the default stays out
        assert families.backward_kernels(s) == (k or default)
        if s.get("kernels") is None:  # a grid without the column means what it meant: the same spec
            assert s in plain and "kernels=" not in families.label(s)
        else:
            assert families.label(s).endswith(f" deterministic={str(det).lower()} kernels={k}")
        # the ledger's row: dQ by atomics (the portable kernels, or the Hopper one-pass build at d 64), or
        # dQ in its own pass (deterministic, or the Hopper two-kernel build at d 128)
        own_pass = det or (k or default) == "auto" and d == 128
        assert families.ledger(s)[2].endswith("-det") == own_pass, r
    # the estimate is called with the point's kernels: kernels=auto, deterministic 0 at d 64 models the
    # one-pass lean build the user's call runs, not the portable kernels of the column's default
    onepass = next(s for s in specs if s.get("kernels") == "auto" and s["d"] == 64)
    calls = []
    real = be.backward_estimate
    monkeypatch.setattr(be, "backward_estimate", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    est, why = families.estimate(onepass, 62914560, 132)
    assert why == "" and (calls[-1]["kernels"], calls[-1]["deterministic"]) == ("auto", False)
    assert (est.facts["build"], est.facts["mode"]) == ("lean", "onepass")
    portable = families.estimate({k: v for k, v in onepass.items() if k != "kernels"}, 62914560, 132)[0]
    assert calls[-1]["kernels"] == "portable" and "build" not in portable.facts
    assert portable.total != est.total


def _point(spec, read, write):
    return ncu.Point(spec, ncu.Measured([KernelBytes(1, "k", read, write)], "none", "ncu x"))


def test_sweep_of_families_reports_ledger_error_and_estimate(tmp_path, capsys, monkeypatch):
    from sweep_stub import MACHINE, stub_sweep

    grid = _grid(tmp_path, "pass,impl,batch,heads,n,d,causal,cache_lens,splits\n"
                           "forward,flash,1,8,4096,128,false,,\n"
                           "backward,cudnn,2,8,2048,64,true,,\n"
                           "decode,attnscope,1,8,,64,,4096,2\n")
    specs = physical.parse_grid(grid)
    bwd_logical = families.ledger(specs[1])[0]

    half = bwd_logical // 2
    stub_sweep(monkeypatch, lambda specs: [_point(specs[0], 3 * 8 * 2**20, 8 * 2**20),
                                           _point(specs[1], half, bwd_logical - half),
                                           ncu.Point(specs[2], None, "RuntimeError: refused")])
    out = tmp_path / "s.json"
    argv = ["bytes", "--sweep", str(grid), *MACHINE, "--json", str(out)]
    assert main(argv) == 1  # the decode point was not measured
    text = capsys.readouterr().out
    assert "estimate vs ncu over 1 points" in text  # the forward point alone, against the L2 estimate
    assert "backward: 1 points, 1 estimated" in text and "logical ledger vs ncu: mean |error| 0.0%" in text
    assert "not measured: decode attnscope H=8 d=64 fp16 cache_lens=4096 dense fp16 splits=2" in text
    saved = json.loads(out.read_text())
    (row,) = saved["family_rows"]
    assert row["logical"] == bwd_logical  # the shipped constants estimate it
    assert row["estimate"] == pytest.approx(families.estimate(specs[1], 62914560, 132)[0].total)
    assert saved["family_summary"]["backward"]["count"] == 1 and saved["summary"]["count"] == 1
    assert main(["bytes", "--from-json", str(out)]) == 0  # and it reads back, family rows included
    text = capsys.readouterr().out
    assert "backward: 1 points, 1 estimated" in text and "estimate vs ncu over 1 points" in text


# --- the measured callables, on tiny shapes under the Triton interpreter --------------------------------
def _spec(text):
    (s,) = physical.parse_grid("g.csv", text=text)
    return s


def _grads_err(torch, spec, causal, device="cpu"):
    """Max abs error of the gradients of one backward callable against the float64 reference."""
    from attnscope import reference
    from attnscope.measure.family_calls import call

    torch.manual_seed(0)  # every callable draws q, k, v, dO in the same order: the same inputs
    fn, keep = call(torch, spec, device=device)
    grads = fn()
    q, k, v = (x.detach().double().cpu().numpy() for x in keep[:3])
    win = tuple(spec["window"]) if "window" in spec else None
    o, lse = reference.naive_attention(q, k, v, causal, return_lse=True, window=win)
    want = reference.attention_backward(keep[-1].double().cpu().numpy(), q, k, v, o, lse, causal, window=win)
    return max(float(abs(g.double().cpu() - torch.from_numpy(w)).max())
               for g, w in zip(grads[:3], want, strict=True))


def test_backward_callables_compute_the_gradients():
    torch = pytest.importorskip("torch")
    from attnscope.checks import GRAD_FACTOR, kernel_tolerance

    row = "pass,impl,batch,heads,kv_heads,n,d,causal,deterministic\nbackward,{},1,2,{},40,64,true,{}\n"
    naive = _grads_err(torch, _spec(row.format("naive", 2, "")), True)  # PyTorch's own error (autograd)
    assert naive > 0
    for det in ("false", "true"):
        err = _grads_err(torch, _spec(row.format("attnscope", 1, det)), True)
        assert err <= kernel_tolerance(naive, GRAD_FACTOR), (det, err, naive)
    auto = _spec(row.replace("deterministic", "deterministic,kernels").strip().format("attnscope", 1, "false")
                 + ",auto\n")
    err = _grads_err(torch, auto, True)
    assert err <= kernel_tolerance(naive, GRAD_FACTOR), (err, naive)


def test_backward_callable_with_kernels_auto_runs_what_autograd_runs(monkeypatch):
    # kernels=auto, deterministic 0: flash_attention_backward with impl="auto" and the dQ mode autograd's
    # default picks (`atomic_dq_by_default`: on a CPU the portable kernels, dQ in its own pass; on an H200
    # at d 64 the Hopper one-pass build); without the column, deterministic 0 stays the portable atomic dQ
    torch = pytest.importorskip("torch")
    from attnscope.kernels import bwd
    from attnscope.measure.family_calls import call

    seen, real = [], bwd.flash_attention_backward
    monkeypatch.setattr(bwd, "flash_attention_backward",
                        lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    row = "pass,impl,heads,kv_heads,n,d,causal,deterministic,kernels\nbackward,attnscope,2,1,16,64,true,{}\n"
    cases = [("false,auto", None, ("auto", True)), ("false,auto", True, ("auto", False)),
             ("false,", None, ("portable", False)), ("true,", None, ("auto", True)),
             ("true,portable", None, ("portable", True))]
    rule = bwd.atomic_dq_by_default
    for cells, autograd_atomic, want in cases:  # autograd_atomic True: as on an sm_90 GPU at d 64
        monkeypatch.setattr(bwd, "atomic_dq_by_default",
                            rule if autograd_atomic is None else lambda *a, v=autograd_atomic, **kw: v)
        fn, keep = call(torch, _spec(row.format(cells)), device="cpu")
        q = keep[0]
        if autograd_atomic is None:
            assert bwd.atomic_dq_by_default(q, True, None) is False  # a CPU: the portable kernels' own pass
        dq, dk, dv = fn()
        assert (seen[-1]["impl"], seen[-1]["deterministic"]) == want, cells
        assert dq.shape == q.shape and dk.shape == dv.shape == (1, 1, 16, 64) and torch.isfinite(dq).all()


def test_backward_callable_with_kernels_auto_launches_what_autograd_launches(monkeypatch):
    # as on an sm_90 GPU (`hopper_unavailable` None, the Gluon kernels replaced by recorders): the harness's
    # kernels=auto, deterministic 0 launches what `flash_attention(...).backward()` launches -- at d 64 the
    # one-pass lean dK/dV kernel alone, at d 128 the two kernels -- and without the column no Gluon kernel
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import attnscope
    from attnscope.kernels import bwd, bwd_hopper
    from attnscope.measure.family_calls import call

    seen = []

    class _Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append((self.name, kw.get("ONEPASS"), kw["LEAN"]))

    for name in bwd_hopper.KERNELS:
        monkeypatch.setattr(bwd_hopper, f"_attnscope_bwd_hopper_{name}_kernel", _Recorder(name))
    monkeypatch.setattr(bwd, "hopper_unavailable", lambda torch, q: None)
    row = ("pass,impl,heads,kv_heads,n,d,causal,dtype,deterministic,kernels\n"
           "backward,attnscope,2,1,24,{},true,bf16,0,{}\n")
    for d, want in ((64, [("dkdv", 2, 1)]), (128, [("dkdv", 0, 0), ("dq", None, 0)])):
        fn, keep = call(torch, _spec(row.format(d, "auto")), device="cpu")
        seen.clear()
        fn()
        harness = list(seen)
        leaves = [x.detach().clone().requires_grad_() for x in keep[:3]]
        seen.clear()
        attnscope.flash_attention(*leaves, causal=True).backward(keep[-1])
        assert harness == seen == want, d
    fn, _ = call(torch, _spec(row.format(64, "")), device="cpu")
    seen.clear()
    fn()
    assert seen == []  # the column's default: the portable kernels, atomic dQ, as the recorded sweeps ran


def _sm90() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU (the Hopper kernels)")
def test_gpu_kernels_auto_point_runs_the_users_kernels_on_sm90():
    # the h-onepass probe rows' callable on the hardware: the Hopper one-pass build at d 64 (its dK/dV kernel
    # alone), the two kernels at d 128, with gradients within the kernel tolerance of the reference
    import torch

    from attnscope.checks import GRAD_FACTOR, kernel_tolerance
    from attnscope.measure.family_calls import call

    row = ("pass,impl,batch,heads,kv_heads,n,d,causal,dtype,deterministic,kernels\n"
           "backward,{},1,4,{},300,{},true,bf16,{}\n")
    for d, want in ((64, {"dkdv"}), (128, {"dkdv", "dq"})):
        naive = _grads_err(torch, _spec(row.format("naive", 4, d, ",")), True, "cuda")
        auto = _spec(row.format("attnscope", 2, d, "0,auto"))
        err = _grads_err(torch, auto, True, "cuda")
        assert err <= kernel_tolerance(naive, GRAD_FACTOR), (d, err, naive)
        fn, _ = call(torch, auto, device="cuda")
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages())
        assert {k for k in ("dkdv", "dq") if f"_attnscope_bwd_hopper_{k}_kernel" in names} == want, names


@pytest.mark.parametrize("cols,vals", [("", ""), (",page_size", ",16"), (",kv_dtype", ",fp8"),
                                       (",page_size,kv_dtype", ",16,fp8"), (",window", ",10:0"),
                                       (",page_size,kv_dtype,window", ",16,fp8,7:0")])
def test_decode_callables_attend_over_each_sequence_cache(cols, vals):
    # wiring, not accuracy (test_decode.py holds the kernels to `kernel_tolerance`): the callable must hand
    # each sequence its own cache rows, pages and scales; 2e-2 is far below the O(0.1) a wrong row gives
    torch = pytest.importorskip("torch")
    from attnscope import reference
    from attnscope.measure.family_calls import call

    spec = _spec(f"pass,impl,heads,kv_heads,d,cache_lens,splits{cols}\n"
                 f"decode,attnscope,4,2,64,40;17,2{vals}\n")
    fn, keep = call(torch, spec, device="cpu")
    o = fn()
    q, k, v, _, table, scales = keep
    assert o.shape == (2, 4, 1, 64) and torch.isfinite(o).all()
    if scales:  # dequantise: what the kernel attends to
        shape = (-1, 1, 1) if table is None else (-1, 1)  # the kv-head axis: dense [B, Hkv, L, d], paged -2
        k, v = (x.float() * s.view(shape) for x, s in ((k, scales["k_scale"]), (v, scales["v_scale"])))
    for i, n in enumerate(spec["cache_lens"]):
        if table is None:
            ki, vi = k[i, :, :n], v[i, :, :n]
        else:  # pages [P, page, Hkv, d] -> the sequence's rows [Hkv, n, d]
            ki, vi = (x[table[i, : -(-n // 16)].long()].flatten(0, 1)[:n].transpose(0, 1) for x in (k, v))
        lo = max(0, n - 1 - spec["window"][0]) if "window" in spec else 0  # keys n - 1 - left .. n - 1
        ki, vi = ki[:, lo:], vi[:, lo:]
        want = reference.naive_attention(q[i].double().numpy(), ki.double().numpy(), vi.double().numpy())
        assert float(abs(o[i].double() - torch.from_numpy(want)).max()) < 2e-2


def test_varlen_callable_attends_within_each_sequence():
    # wiring, as the decode test above (test_varlen.py holds the kernel to `kernel_tolerance`)
    torch = pytest.importorskip("torch")
    from attnscope import reference
    from attnscope.measure.family_calls import call

    spec = _spec("pass,impl,heads,kv_heads,d,causal,lens\nvarlen,attnscope,2,1,64,true,30;9\n")
    fn, (q, k, v, cu) = call(torch, spec, device="cpu")
    o = fn()
    assert o.shape == (39, 2, 64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        want = reference.naive_attention(*(x[a:b].transpose(0, 1).double().numpy() for x in (q, k, v)), True)
        assert float(abs(o[a:b].transpose(0, 1).double() - torch.from_numpy(want)).max()) < 2e-2


def test_window_specs_ledgers_and_estimates():
    from attnscope.model import window_estimate as we

    causal, wide = physical.parse_grid("g.csv", text=(
        "pass,impl,batch,heads,kv_heads,n,d,dtype,causal,window\n"
        "window,attnscope,2,16,4,3000,64,bf16,1,700:9\n"
        "window,flex,1,8,1,40000,128,fp16,0,-1:300\n"))
    # the effective window: causal bounds the right side
    assert causal == {"pass": "window", "impl": "attnscope", "batch": 2, "heads": 16, "d": 64,
                      "dtype": "bf16", "kv_heads": 4, "n": 3000, "causal": True, "window": [700, 0]}
    logical, comp, name = families.ledger(causal)
    assert (logical, name) == we.window_ledger("attnscope", 3000, window=(700, 0), causal=True, d=64,
                                               dtype="bf16", batch=2, heads=16, kv_heads=4)
    assert comp == 2 * 3000 * 64 * 2 * (2 * 16 + 2 * 4)
    assert families.label(causal) == "window attnscope H=16/4 d=64 bf16 B=2 N=3000 causal window 700:0"
    est, note = families.estimate(wide)
    assert note == "" and est.family == "window" and est.facts["kernel"] == "flex"
    assert est.total == we.window_estimate("flex", 40000, window=(-1, 300), d=128, heads=8, kv_heads=1).total
    assert families.tensor_bytes(wide) == 40000 * 128 * 2 * (2 * 8 + 2)
    # a sweep's summary names the window family's estimate
    rows = families.compare([(causal, 30_000_000), (wide, 90_000_000)])
    s = families.summarize(rows)["window"]
    assert s["count"] == 2 and s["estimate"] == "model/window_estimate.py" and s["estimated"] == 2


def test_heldout_window_grid_is_what_its_seed_draws():
    from grid_draws import assert_drawn

    rows = assert_drawn("heldout_window.csv", "window", 3950)
    assert sum(r["impl"] == "flex" for r in rows) == 16 and sum(r["causal"] == "1" for r in rows) >= 16
    # a probe grid shares no point with it
    probes = physical.parse_grid(GRIDS / "probe_window.csv")
    assert not {families.label(p) for p in probes} & {families.label(p) for p in
                                                       physical.parse_grid(GRIDS / "heldout_window.csv")}


@pytest.mark.parametrize("left,right", [(5, 0), (3, 3), (-1, 4), (6, -1), (0, 0)])
def test_flex_window_mask_is_the_tile_models_window(left, right):
    torch = pytest.importorskip("torch")
    from attnscope.measure.family_calls import window_mask
    from attnscope.model.tiles import Grid

    n = 20
    qi, ki = torch.arange(n).view(n, 1), torch.arange(n).view(1, n)
    got = window_mask(left, right)(0, 0, qi.expand(n, n), ki.expand(n, n))
    g = Grid(n, n, window=(left, right))
    want = torch.tensor([[g.permitted(r + 1, c + 1) for c in range(n)] for r in range(n)])
    assert torch.equal(got, want)


def test_window_callable_attends_within_the_window():
    # wiring, as the varlen test below (test_mods.py holds the kernel to `kernel_tolerance`)
    torch = pytest.importorskip("torch")
    from attnscope.measure.family_calls import call

    spec = _spec("pass,impl,batch,heads,kv_heads,n,d,causal,window\nwindow,attnscope,1,2,1,40,64,0,5:3\n")
    fn, (q, k, v) = call(torch, spec, device="cpu")
    o = fn()
    assert o.shape == (1, 2, 40, 64)
    r = torch.arange(40)
    keep = ((r.view(-1, 1) - r.view(1, -1)) <= 5) & ((r.view(1, -1) - r.view(-1, 1)) <= 3)
    qd, kd, vd = (x[0].double() for x in (q, k, v))
    s = (qd @ kd.expand(2, -1, -1).transpose(-1, -2)) / 8.0
    want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vd.expand(2, -1, -1)
    assert float(abs(o[0].double() - want).max()) < 2e-2


def test_windowed_decode_rows_ledgers_and_the_heldout_grid():
    from attnscope.model import family_estimate as fe
    from grid_draws import assert_drawn

    (s,) = physical.parse_grid("g.csv", text="pass,impl,heads,kv_heads,d,cache_lens,page_size,splits,window\n"
                                             "decode,attnscope,8,2,64,3000;500,64,2,1000:5\n")
    assert s["window"] == [1000, 0]  # decode is causal: the right side is 0
    logical, comp, _ = families.ledger(s)
    g = serving.paged([3000, 500], 64, d=64, dtype="fp16", heads=8, kv_heads=2, num_splits=2,
                      window=(1000, 0))
    assert logical == g.row.total and "window 1000:0" in families.label(s)
    assert comp == fe.decode_compulsory([3000, 500], d=64, heads=8, kv_heads=2, window=(1000, 0)) == \
        2 * 2 * 8 * 64 * 2 + 2 * 2 * (1001 + 500) * 64 * 2
    est, note = families.estimate(s)
    assert note == "" and "window_edge" in {n for n, _, _ in est.terms}
    rows = assert_drawn("heldout_decode_window.csv", "decode_window", 3960)
    specs = physical.parse_grid(GRIDS / "heldout_decode_window.csv")
    assert len(specs) == len(rows) == 48 and all(x["impl"] == "attnscope" and "window" in x for x in specs)
    assert {(x["d"], x["dtype"]) for x in specs} == {(64, "fp16"), (64, "bf16"), (128, "fp16"), (128, "bf16")}
    assert {"page_size" in x for x in specs} == {True, False} and any(x.get("kv_dtype") for x in specs)
    assert any(x.get("nq") for x in specs)
    assert all(families.estimate(x)[0] is not None for x in specs)


def test_windowed_varlen_rows_ledgers_callable_and_the_heldout_grid():
    torch = pytest.importorskip("torch")
    from attnscope.measure.family_calls import call
    from grid_draws import assert_drawn

    spec = _spec("pass,impl,heads,kv_heads,d,causal,lens,window\nvarlen,attnscope,2,1,64,true,30;9,5:3\n")
    assert spec["window"] == [5, 0]
    p = serving.packed([30, 9], d=64, heads=2, kv_heads=1, rows=("flash-causal",), window=(5, 0))
    assert families.ledger(spec)[0] == p["flash-causal"].total * 2
    assert "window 5:0" in families.label(spec) and families.estimate(spec)[1] == ""
    fn, (q, k, v, cu) = call(torch, spec, device="cpu")
    o = fn()
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        r = torch.arange(b - a)
        keep = (r.view(-1, 1) >= r.view(1, -1)) & (r.view(-1, 1) - r.view(1, -1) <= 5)
        qd, kd, vd = (x[a:b].transpose(0, 1).double() for x in (q, k, v))
        s = qd @ kd.expand(2, -1, -1).transpose(-1, -2) / 8.0
        want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vd.expand(2, -1, -1)
        assert float(abs(o[a:b].transpose(0, 1).double() - want).max()) < 2e-2
    rows = assert_drawn("heldout_varlen_window.csv", "varlen_window", 3970)
    specs = physical.parse_grid(GRIDS / "heldout_varlen_window.csv")
    assert len(specs) == len(rows) == 48 and all(x["impl"] == "attnscope" and "window" in x for x in specs)
    assert {(x["d"], x["dtype"]) for x in specs} == {(64, "fp16"), (64, "bf16"), (128, "fp16"), (128, "bf16")}
    assert {x["causal"] for x in specs} == {True, False}
    assert all(families.estimate(x)[0] is not None for x in specs)


def test_windowed_backward_rows_ledgers_callable_and_the_heldout_grid():
    torch = pytest.importorskip("torch")
    from attnscope.checks import GRAD_FACTOR, kernel_tolerance
    from grid_draws import assert_drawn

    row = ("pass,impl,batch,heads,kv_heads,n,d,causal,deterministic,window\n"
           "backward,{},1,2,{},40,64,{},{},{}\n")
    spec = _spec(row.format("attnscope", 1, "true", "false", "7:3"))
    assert spec["window"] == [7, 0] and "window 7:0" in families.label(spec)
    t = backward.backward_traffic(40, 64, "fp16", heads=2, kv_heads=1, rows=("flash-causal-backward",),
                                  window=(7, 0))
    assert families.ledger(spec)[0] == t["flash-causal-backward"].total * 2
    assert families.estimate(spec)[1] == ""
    # the callable's gradients are the windowed attention's (PyTorch's error, naive autograd, the bound)
    naive = _grads_err(torch, _spec("pass,impl,batch,heads,n,d,causal\nbackward,naive,1,2,40,64,true\n"),
                       True)
    for det, win, causal in (("false", "7:0", True), ("true", "5:5", False)):
        s = _spec(row.format("attnscope", 1, str(causal).lower(), det, win))
        err = _grads_err(torch, s, causal)
        assert err <= kernel_tolerance(max(naive, 1e-3), GRAD_FACTOR), (det, win, err)
    rows = assert_drawn("heldout_backward_window.csv", "backward_window", 3980)
    specs = physical.parse_grid(GRIDS / "heldout_backward_window.csv")
    assert len(specs) == len(rows) == 48 and all(x["impl"] == "attnscope" and "window" in x for x in specs)
    assert {x["deterministic"] for x in specs} == {True, False}
    assert {(x["d"], x["dtype"]) for x in specs} == {(64, "fp16"), (64, "bf16"), (128, "fp16"), (128, "bf16")}
    assert all(families.estimate(x)[0] is not None for x in specs)


def test_sweep_of_windowed_rows_reports_each_family_and_reads_back(tmp_path, capsys, monkeypatch):
    from sweep_stub import MACHINE, stub_sweep

    grid = _grid(tmp_path, "pass,impl,batch,heads,kv_heads,n,d,causal,deterministic,cache_lens,splits,lens,"
                           "window\n"
                           "window,attnscope,2,16,4,8192,128,1,,,,,1024:0\n"
                           "window,flex,1,8,8,4096,64,0,,,,,256:256\n"
                           "decode,attnscope,,8,2,,64,,,4096;1000,2,,512:0\n"
                           "varlen,attnscope,,8,2,,64,1,,,,3000;700,300:0\n"
                           "backward,attnscope,1,8,2,4096,128,0,1,,,,200:200\n")

    def points(specs):  # measured at the estimate + 2 % (the sweep's arithmetic, not the model, is tested)
        totals = [int(families.estimate(s, 62914560, 132)[0].total * 1.02) for s in specs]
        return [_point(s, t // 2, t - t // 2) for s, t in zip(specs, totals, strict=True)]

    stub_sweep(monkeypatch, points)
    out = tmp_path / "s.json"
    assert main(["bytes", "--sweep", str(grid), *MACHINE, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for fam, count in (("window", 2), ("decode", 1), ("varlen", 1), ("backward", 1)):
        assert f"{fam}: {count} points, {count} estimated (within 5%: {count}" in text, fam
    saved = json.loads(out.read_text())
    assert saved["family_summary"]["window"]["estimate"] == "model/window_estimate.py"
    assert {tuple(r["spec"]["window"]) for r in saved["family_rows"]} == {(1024, 0), (256, 256), (512, 0),
                                                                           (300, 0), (200, 200)}
    assert [round(r["estimate_error"], 4) for r in saved["family_rows"]] == [round(1 / 1.02 - 1, 4)] * 5
    assert main(["bytes", "--from-json", str(out)]) == 0  # the windows read back from the JSON specs
    assert "window: 2 points, 2 estimated" in capsys.readouterr().out


@pytest.mark.parametrize("cell", ["5 : 5", "1e3:0", "5.0:0", "5:", ":5", "5:5:5", "abc", "-2:3", "--5:3",
                                  "9999999999999:0", "\u0663:1", "+5:3", "0x10:0", "5;5", "nan:0", "-1:-1"])
def test_odd_window_cells_get_one_line_in_every_family(cell):
    """A window cell no family takes is one InputError or NotImplementedError line, in every family that has
    the column (never another exception)."""
    rows = ("pass,impl,heads,n,d,causal,window\nwindow,attnscope,8,1024,64,{c},\"{w}\"\n",
            "pass,impl,heads,d,cache_lens,splits,window\ndecode,attnscope,8,64,100;200,2,\"{w}\"\n",
            "pass,impl,heads,d,lens,causal,window\nvarlen,attnscope,8,64,100;200,{c},\"{w}\"\n",
            "pass,impl,heads,n,d,causal,window\nbackward,attnscope,8,512,64,{c},\"{w}\"\n")
    for row in rows:
        for causal in ("0", "1"):
            try:
                (s,) = physical.parse_grid("g.csv", text=row.format(w=cell, c=causal))
            except (ValueError, NotImplementedError) as e:
                assert "\n" not in str(e) and "window" in str(e), str(e)
                continue
            families.ledger(s)  # a cell that parses is a window every model takes
            assert families.estimate(s)[0] is not None


def test_a_window_cell_past_its_digits_names_the_limit():
    """A 13-digit side (valid on the command line, up to 10^24) was refused as if it were no integer."""
    row = "pass,impl,heads,n,d,window\nwindow,attnscope,8,1024,64,{}\n"
    with pytest.raises(ValueError, match=r"window: expected left:right, two integers from -1 "
                                         r"\(unbounded\) of at most 12 digits, got '1000000000000:0'"):
        physical.parse_grid("g.csv", text=row.format("1000000000000:0"))
    (spec,) = physical.parse_grid("g.csv", text=row.format("999999999999:0"))  # a side past every sequence
    assert spec["window"] == [999999999999, 0]
