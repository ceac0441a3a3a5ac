"""The Gluon Hopper forward's barrier-light variants (kernels/fwd_hopper.py: ``release`` "one" and "thread").

CPU: each variant compiled for sm_90 (Triton's bundled ptxas, no GPU) has the partition-wide barriers per
KV iteration it is built for, the arrival counts its arrivals need, and no spills. GPU (sm_90): every
schedule path of every such variant against float64 (bound: 2 x PyTorch's own error at the same dtype
+ 1e-3; LSE within 1e-3; rows without a visible key give 0 and LSE -inf), outputs poisoned with NaN.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnscope import reference  # noqa: E402
from attnscope.kernels import _common  # noqa: E402
from test_fwd import _torch_attention  # noqa: E402 - the same bound as the portable kernel's tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One compile in a child process without TRITON_INTERPRET (conftest sets it; Gluon's code generator rejects
# the interpreter's versions of Triton's reductions), through bench/sm90_resources.py's compile.
_COMPILE = """
import json, re, sys
sys.path.insert(0, sys.argv[1])
import sm90_resources as R
from attnscope.kernels import fwd_hopper as hop
INIT = r"mbarrier\\.init\\.shared::cta\\.b64 \\[[^]]+\\], (\\d+);"
out = {}
for spec in sys.argv[2:]:
    name, d, dtype, causal = spec.split(":")
    _, k = R.hopper(int(d), dtype, causal == "1", name)
    ptx = k.asm["ptx"]
    out[spec] = dict(loops=hop.ptx_loop_barriers(ptx), ptxas=R.ptxas_report(ptx),
                     inits=[int(x) for x in re.findall(INIT, ptx)],
                     thread_arrives=ptx.count("cp.async.mbarrier.arrive.noinc"),
                     elected_arrives=ptx.count("mbarrier.arrive.shared::cta.b64"))
print(json.dumps(out))
"""


def _compile(*specs):
    """{spec: report} for specs "variant:d:dtype:causal(0/1)", compiled for sm_90 in one child process."""
    src = os.path.join(ROOT, "src")
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, "-c", _COMPILE, os.path.join(ROOT, "bench"), *specs], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_barriers_per_kv_iteration_on_sm90():
    """Triton 3.6 puts a warpgroup bar.sync before every elected `mbarrier.arrive` and one per loop before
    the first mbarrier wait: the default variant has 4 per KV iteration (1 + turn, K and V arrivals); one
    release per tile removes one; per-thread arrivals leave only the loop's one. The barrier counts match
    the arrivals (per-thread: 128 per warpgroup), and nothing spills."""
    pytest.importorskip("triton.experimental.gluon")
    r = _compile("hopper:64:bf16:0", "hopper_deep:64:bf16:0", "hopper_rel1:64:bf16:0", "hopper_pt:64:bf16:0",
                 "hopper_pt_wg3_pp:64:bf16:1", "hopper_pt_persist:128:fp16:0",
                 "hopper_pt_persist:64:bf16:1")
    for spec, rep in r.items():
        assert "0 bytes spill stores, 0 bytes spill loads" in rep["ptxas"], (spec, rep["ptxas"])
        assert "serializ" not in rep["ptxas"], spec  # wgmma not serialised
    base, deep, rel1, pt = (r[f"{v}:64:bf16:0"]["loops"] for v in ("hopper", "hopper_deep", "hopper_rel1",
                                                                     "hopper_pt"))
    # 2 consumer warpgroups x (unmasked, masked) loops, each iteration with its barriers
    assert len(base) == len(deep) == len(rel1) == len(pt) == 4
    assert set(base) == set(deep) == {4}
    assert set(rel1) == {3}  # same ring and ping-pong as hopper_deep, one arrival less
    assert set(pt) == {1}
    assert r["hopper_pt_wg3_pp:64:bf16:1"]["loops"] == [1] * 6  # 3 consumer warpgroups
    assert r["hopper_pt_persist:128:fp16:0"]["loops"] == r["hopper_pt_persist:64:bf16:1"]["loops"] == [1] * 4
    # per-thread arrivals: no elected consumer arrival left on k_empty/v_empty/turn, and every barrier they
    # arrive on counts 128 arrivals per consumer warpgroup (k_empty/v_empty: NWG x 128, turn: 128)
    pt_rep = r["hopper_pt:64:bf16:0"]
    assert pt_rep["thread_arrives"] > 0 and pt_rep["elected_arrives"] == 0
    assert sorted(set(pt_rep["inits"])) == [1, 128, 256]
    assert sorted(set(r["hopper_pt_wg3_pp:64:bf16:1"]["inits"])) == [1, 128, 384]
    assert sorted(set(r["hopper_rel1:64:bf16:0"]["inits"])) == [1, 2]
    assert r["hopper_rel1:64:bf16:0"]["thread_arrives"] == 0


def test_release_modes_are_declared():
    """Every variant names a release mode the kernel knows; the barrier-light ones exist for both head dims
    (wg3: d = 64 only, as its split-release twin)."""
    pytest.importorskip("triton.experimental.gluon")
    from attnscope.kernels import fwd_hopper as hop

    for name, var in hop.VARIANTS.items():
        assert var.release in hop.RELEASE_MODES, name
        d = min(var.configs)
        cx = hop.constexprs(d, not hop.supports(name, d, False), False, name)
        assert cx["RELEASE"] == hop.RELEASE_MODES[var.release]
    for name in ("hopper_rel1", "hopper_rel1_nopp", "hopper_pt", "hopper_pt_nopp", "hopper_pt_deep",
                 "hopper_pt_persist"):
        assert sorted(hop.VARIANTS[name].configs) == [64, 128], name
    assert sorted(hop.VARIANTS["hopper_pt_wg3_pp"].configs) == [64]
    # not built where ptxas spills; asking for it names what is built
    assert hop.supports("hopper_pt_wg3_pp", 64, True) and not hop.supports("hopper_pt_wg3_pp", 64, False)
    assert hop.supports("hopper_pt_persist", 128, False) and not hop.supports("hopper_pt_persist", 128, True)
    msg = "'hopper_pt_wg3_pp': unmasked at head_dim 64 is not supported; supported: causal, or unmasked at"
    with pytest.raises(NotImplementedError, match=msg + " head_dim \\[\\]"):
        hop.config(64, "hopper_pt_wg3_pp", causal=False)
    assert hop.config(64, "hopper_pt_wg3_pp") == hop.config(64, "hopper_pt_wg3_pp", causal=True)


# ---------------------------------------------------------------------------------------------- GPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _is_sm90():
    return DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)


def _new_variants():
    try:
        from attnscope.kernels import fwd_hopper as hop
    except ImportError:  # no Gluon: the GPU tests skip
        return []
    return [(n, d) for n, v in hop.VARIANTS.items() if v.release != "split" or v.persistent
            for d in sorted(v.configs)]



# Schedule paths: (nq, nk, causal, batch, q heads, kv heads, strided)
#  - one KV tile: prologue and epilogue only, no loop iteration
#  - Nq > Nk causal: whole CTA tiles without a key (no KV tile: Q hand-back only, O = 0, LSE -inf)
#  - ragged Nq != Nk unmasked: the unmasked loop, then the ragged tile in the masked loop
#  - Nq < Nk causal (bottom-right), GQA, strided views
#  - N = 2048 causal and 3000 unmasked: the K/V ring wraps many times (barrier phases flip), the causal
#    warpgroups split their loops at different tiles; 2 x 16 heads: > 132 CTA tiles (persistent CTAs walk
#    several tiles, their counters carrying over)
#  - N = 1100 causal: an odd number of 128-row tiles (9), so the persistent schedule's last item is a tile
#    alone (`tiles.persistent_item`), over 160 items on 132 CTAs
SCHEDULE = [
    (1, 1, False, 1, 2, 1, False),
    (100, 64, False, 1, 4, 2, False),
    (200, 17, True, 2, 4, 2, False),
    (1000, 1300, False, 2, 16, 4, True),
    (640, 1000, True, 1, 8, 2, False),
    (1300, 1000, True, 2, 16, 4, False),
    (2048, 2048, True, 2, 16, 4, True),
    (3000, 3000, False, 1, 4, 1, False),
    (1100, 1100, True, 2, 16, 4, False),
]




def _schedule_cases():
    """(variant, d, case) for every barrier-light or persistent variant, head dim and schedule case of a
    mask it is built for (a build ptxas would spill is not offered: `fwd_hopper.supports`)."""
    try:
        from attnscope.kernels import fwd_hopper as hop
    except ImportError:
        return []
    return [(n, d, i) for n, d in _new_variants() for i, case in enumerate(SCHEDULE)
            if hop.supports(n, d, case[2])]


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="the Gluon Hopper kernel needs an sm_90 GPU")
@pytest.mark.parametrize("variant,d,case", _schedule_cases())
def test_barrier_light_variant_matches_float64(variant, d, case):
    from attnscope.kernels import fwd_hopper as hop

    nq, nk, causal, b, hq, hkv, strided = SCHEDULE[case]
    dt = (torch.bfloat16, torch.float16)[case % 2]
    g = torch.Generator().manual_seed(1000 * case + d)

    def make(h, n):
        if strided:  # a [B, N, H, d] buffer seen as [B, H, N, d]
            return torch.randn(b, n, h, d, generator=g).to(dt).cuda().transpose(1, 2)
        return torch.randn(b, h, n, d, generator=g).to(dt).cuda()

    q, k, v = make(hq, nq), make(hkv, nk), make(hkv, nk)
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda", dtype=torch.float32)
    hop.launch(q, k, v, o, lse, _common.LOG2E / math.sqrt(d), causal, True, variant)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "an element was not written"
    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         return_lse=True)
    has_key = np.isfinite(rlse)
    on, ln = o.double().cpu().numpy(), lse.cpu().numpy()
    err = np.abs(on - ro)[has_key].max(initial=0.0)
    t_out = _torch_attention(q, k, v, causal).double().cpu().numpy()
    torch_err = np.abs(t_out - ro)[has_key].max(initial=0.0)
    assert err <= 2 * torch_err + 1e-3, f"{variant}: error {err:.3g} > 2 x torch's {torch_err:.3g} + 1e-3"
    assert np.abs(ln - rlse)[has_key].max(initial=0.0) < 1e-3
    assert (on[~has_key] == 0).all() and (ln[~has_key] == -np.inf).all()


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="the Gluon Hopper kernel needs an sm_90 GPU")
@pytest.mark.parametrize("variant,d", _new_variants())
def test_barrier_light_variant_is_deterministic_and_repeatable(variant, d):
    """Ten launches on one input give bit-identical outputs: no arrival counted twice or missed (a race
    on a ring slot or a turn shows as a changed or NaN output, a miscounted barrier as a hang)."""
    from attnscope.kernels import fwd_hopper as hop

    g = torch.Generator().manual_seed(d)
    q, k, v = (torch.randn(4, 16, 2048, d, generator=g).to(torch.bfloat16).cuda() for _ in range(3))
    causal = hop.supports(variant, d, True)  # causal where built (hopper_pt_persist d = 128: unmasked)
    outs = []
    for _ in range(10):
        o = torch.full_like(q, float("nan"))
        lse = torch.empty(1, device="cuda", dtype=torch.float32)
        hop.launch(q, k, v, o, lse, _common.LOG2E / math.sqrt(d), causal, False, variant)
        outs.append(o)
    torch.cuda.synchronize()
    assert not torch.isnan(outs[0]).any()
    assert all(torch.equal(outs[0], x) for x in outs[1:])

