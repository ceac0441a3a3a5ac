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
                                         ("fwd_openclass", "forward")])
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
    got = {(s["pass"], s["impl"], s.get("deterministic"), "page_size" in s, s.get("kv_dtype")) for s in specs}
    want = {(f, i, None, False, None) for f in ("backward", "decode", "varlen") for i in families.IMPLS[f]}
    want -= {("backward", "attnscope", None, False, None), ("decode", "attnscope", None, False, None)}
    want |= {("backward", "attnscope", det, False, None) for det in (False, True)}
    want |= {("decode", "attnscope", None, paged, kv) for paged in (False, True) for kv in (None, "fp8")}
    assert got == want


def _grid(tmp_path, text):
    p = tmp_path / "g.csv"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,err,match", [
    ("pass,impl,heads,n,d\nsideways,flash,8,1024,64\n", ValueError,
     r"row 2: pass: expected one of forward, backward, decode, varlen, got 'sideways'"),
    ("pass,impl,heads,n,d,cache_lens\ndecode,flash,8,1024,64,4096\n", ValueError,
     r"row 2: n: expected no value with pass decode \(it takes cache_lens, page_size, kv_dtype, splits, "
     r"nq\)"),
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


def _point(spec, read, write):
    return ncu.Point(spec, ncu.Measured([KernelBytes(1, "k", read, write)], "none", "ncu x"))


def test_sweep_of_families_reports_ledger_error_and_estimate(tmp_path, capsys, monkeypatch):
    from attnscope.cli import gpu

    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)
    grid = _grid(tmp_path, "pass,impl,batch,heads,n,d,causal,cache_lens,splits\n"
                           "forward,flash,1,8,4096,128,false,,\n"
                           "backward,cudnn,2,8,2048,64,true,,\n"
                           "decode,attnscope,1,8,,64,,4096,2\n")
    specs = physical.parse_grid(grid)
    bwd_logical = families.ledger(specs[1])[0]

    def fake_many(specs, cache_control="none", per_child=8, timeout_s=None, progress=None,
                  **kw):
        half = bwd_logical // 2
        pts = [_point(specs[0], 3 * 8 * 2**20, 8 * 2**20), _point(specs[1], half, bwd_logical - half),
               ncu.Point(specs[2], None, "RuntimeError: refused")]
        progress(pts, 3)
        return pts

    monkeypatch.setattr(ncu, "measure_many", fake_many)
    out = tmp_path / "s.json"
    argv = ["bytes", "--sweep", str(grid), "--l2-bytes", "62914560", "--sms", "132", "--json", str(out)]
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


def _grads_err(torch, spec, causal):
    """Max abs error of the gradients of one backward callable against the float64 reference."""
    from attnscope import reference
    from attnscope.measure.family_calls import call

    torch.manual_seed(0)  # every callable draws q, k, v, dO in the same order: the same inputs
    fn, keep = call(torch, spec, device="cpu")
    grads = fn()
    q, k, v = (x.detach().double().numpy() for x in keep[:3])
    o, lse = reference.naive_attention(q, k, v, causal, return_lse=True)
    want = reference.attention_backward(keep[-1].double().numpy(), q, k, v, o, lse, causal)
    return max(float(abs(g.double() - torch.from_numpy(w)).max())
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


@pytest.mark.parametrize("cols,vals", [("", ""), (",page_size", ",16"), (",kv_dtype", ",fp8"),
                                       (",page_size,kv_dtype", ",16,fp8")])
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
