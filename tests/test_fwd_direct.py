"""The forward's planned launches through `kernels._direct.DirectLaunch` (Triton's kept binary, its launcher
called directly on a plan-cache hit) and where they must fall back to ``kernel[grid]``.

CPU: stand-ins for the JIT function and its compiled binary record what Triton would be given; the portable
kernel's stand-in runs the interpreted kernel from exactly the launcher's arguments, so a hit through the
direct path is checked against float64 (`checks.kernel_tolerance`) and against Triton's own launch bit for
bit. The Gluon Hopper launcher (no interpreter) is checked argument by argument. GPU: Triton's dispatch
(`JITFunction.run`) is not entered on a hit, and is on a launch hook; CUDA-graph capture of planned launches
is tests/test_fwd_hopper.py's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import attnscope  # noqa: E402
from attnscope import reference  # noqa: E402
from attnscope.checks import kernel_tolerance  # noqa: E402
from attnscope.kernels import _common, _direct  # noqa: E402
from kernel_env import fake_current_device  # noqa: E402

fwd = pytest.importorskip("attnscope.kernels.fwd")
from test_fwd import _inputs, _torch_attention  # noqa: E402 - the forward tests' inputs and torch's bound

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not _common.interpreting():
    pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)
STREAM = 1234


class _Compiled:
    """A compiled binary's stand-in: ``run`` is the launcher, called with the grid, the stream, the function,
    the packed metadata, no launch metadata, no hooks, then every kernel parameter in signature order."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, kernel):
        self.kernel = kernel

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *params):
        assert (gz, stream, function, metadata, launch_metadata, enter, exit_) == (
            1, STREAM, "function", "metadata", None, None, None)
        names = [p.name for p in self.kernel.params]
        assert len(params) == len(names)
        self.kernel.calls.append(("direct", (gx, gy), dict(zip(names, params, strict=True))))
        if self.kernel.execute:  # the interpreted kernel, from the launcher's arguments alone
            self.kernel.real[(gx, gy)](**dict(zip(names, params, strict=True)))


class _Kernel:
    """The JIT function's stand-in: ``kernel[grid](*args, **constexprs)`` records the call (and runs the
    interpreted kernel when ``execute``) and returns a `_Compiled`."""

    def __init__(self, real, calls, execute):
        self.real, self.calls, self.execute = real, calls, execute
        self.params = triton.runtime.jit.JITFunction(getattr(real, "fn", real)).params

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.calls.append(("triton", grid, args, constexprs))
            if self.execute:
                self.real[grid](*args, **constexprs)
            return _Compiled(self)
        return launch


@pytest.fixture
def recorded(monkeypatch):
    """Plans made while it is active launch through a `DirectLaunch` of a `_Kernel` on "device 0" (the
    current one); yields the list of launches."""
    calls = []

    def direct_launch(kernel, constexprs, device):
        execute = kernel is fwd._attnscope_fwd_kernel  # the Gluon kernels do not run in the interpreter
        return _direct.DirectLaunch(_Kernel(kernel, calls, execute), constexprs, 0)

    fwd.clear_plan_cache()
    monkeypatch.setattr(_direct, "direct_launch", direct_launch)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: STREAM, raising=False)
    yield calls
    fwd.clear_plan_cache()  # its plans hold the stand-ins


def _check_float64(q, k, v, causal, sinks, o, lse):
    ro, rlse = reference.naive_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                         return_lse=True)
    s = sinks.double().cpu().numpy()[None, :, None]  # a sink joins each row's denominator
    total = np.logaddexp(rlse, s)
    ro = ro * np.exp(rlse - total)[..., None]
    err = np.abs(o.double().cpu().numpy() - ro).max()
    # torch's own error at q's dtype against the same reference (with the sink's weight applied alike)
    t_out = _torch_attention(q, k, v, causal).double().cpu().numpy() * np.exp(rlse - total)[..., None]
    assert err <= kernel_tolerance(np.abs(t_out - ro).max())
    assert np.abs(lse.cpu().numpy() - total).max() < 1e-3


def test_portable_hits_call_the_kept_binary_and_match_float64(recorded):
    """The first call of a layout goes through kernel[grid]; later calls of it (new values, a transposed
    [B, N, H, d] view as transformers passes) call the kept binary's launcher with every parameter in order,
    whatever the tensors' addresses: the output matches float64, and Triton's launch on the same inputs bit
    for bit."""
    gen = torch.Generator().manual_seed(5)
    sets = [_inputs(1, 4, 2, 40, 40, 64, torch.bfloat16, True, seed=s) for s in (1, 2)]
    sinks = [torch.randn(4, generator=gen).to(DEVICE) for _ in sets]
    outs = [attnscope.flash_attention(*x, causal=True, return_lse=True, sinks=s)
            for x, s in zip(sets, sinks, strict=True)]
    assert [c[0] for c in recorded] == ["triton", "direct"]
    _, grid, args, consts = recorded[0]
    direct = recorded[1][2]
    assert recorded[1][1] == grid == (math.ceil(40 / fwd.INTERPRETER_CONFIG.BLOCK_M), 4)
    assert [direct[p.name] for p in _Kernel(fwd._attnscope_fwd_kernel, [], False).params[6:len(args)]] == \
        list(args[6:])  # the scalars, as Triton was given them
    for name in ("desc_q", "desc_k", "desc_v"):  # the descriptors over this call's tensors
        assert direct[name].base is sets[1]["qkv".index(name[-1])]
    assert direct["desc_o"].base is outs[1][0] and direct["LSE"] is outs[1][1] and direct["SINKS"] is sinks[1]
    for p in _Kernel(fwd._attnscope_fwd_kernel, [], False).params[len(args):]:
        assert direct[p.name] == consts.get(p.name, p.default), p.name  # each constexpr as planned
    for (q, k, v), s, (o, lse) in zip(sets, sinks, outs, strict=True):
        _check_float64(q, k, v, True, s, o, lse)
    again = attnscope.flash_attention(*sets[0], causal=True, return_lse=True, sinks=sinks[0])
    assert recorded[-1][0] == "direct"
    assert torch.equal(again[0], outs[0][0]) and torch.equal(again[1], outs[0][1])


def test_hits_fall_back_to_triton_where_the_binary_may_differ(recorded, monkeypatch):
    """A SINKS pointer that is not 16-byte aligned (Triton specialises pointers on it), a launch hook (a
    profiler's): Triton's launch each time, and the kept binary after. Another current device: the plan's
    device made current around the launch (Triton launches on the current one), then the kept binary."""
    q, k, v = _inputs(1, 4, 2, 24, 24, 64, torch.float16, False, seed=3)
    buf = torch.randn(8, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    aligned, odd = buf[:4], buf[1:5]  # the same layout ([4], stride 1, fp32); odd's address is 4 bytes in
    assert odd.data_ptr() % 16 == 4

    def call(s):
        return attnscope.flash_attention(q, k, v, return_lse=True, sinks=s)

    call(aligned)
    call(aligned)
    o_odd, lse_odd = call(odd)
    _check_float64(q, k, v, False, odd, o_odd, lse_odd)
    hooks = triton.knobs.runtime.launch_enter_hook
    hooks.add(print)
    try:
        call(aligned)
    finally:
        hooks.remove(print)
    current, entered = fake_current_device(monkeypatch, 1)  # the plan is device 0's
    call(aligned)
    assert entered == [0] and current == [1]
    current[0] = 0
    o, lse = call(aligned)
    assert entered == [0]
    assert [c[0] for c in recorded] == ["triton", "direct", "triton", "triton", "direct", "direct"]
    _check_float64(q, k, v, False, aligned, o, lse)


def test_launch_returns_the_binary_that_ran(recorded):
    """`fwd.launch` returns Triton's compiled kernel (bench/sm90_resources.py reads its registers): the kept
    one on a direct launch."""
    q, k, v = _inputs(1, 2, 1, 16, 16, 64, torch.float16, False, seed=8)
    first = fwd.launch(q, k, v)[2]
    assert fwd.launch(q, k, v)[2] is first and [c[0] for c in recorded] == ["triton", "direct"]


@pytest.mark.parametrize("variant", ["hopper_persist", "hopper_wg3_pp"])
def test_hopper_hits_pass_every_parameter_in_order(recorded, monkeypatch, variant):
    """The Gluon launcher (reached on the CPU with sm_90 pretended; its kernels are not run): a hit calls the
    kept binary's launcher with its grid, Gluon TensorDescriptors over this call's q, k, v and output with the
    fields a validated descriptor has, the LSE, the scalars, the sinks, then every constexpr as planned."""
    pytest.importorskip("triton.experimental.gluon")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attnscope.kernels import fwd_hopper as hop

    monkeypatch.setattr(fwd, "_hopper_possible", lambda q: None)
    d = 64
    sets = [_inputs(2, 4, 2, 300, 300, d, torch.bfloat16, True, seed=s) for s in (1, 2)]
    sinks = torch.zeros(4, device=DEVICE)
    outs = [fwd.launch(*x, causal=True, return_lse=True, impl=variant, sinks=sinks) for x in sets]
    assert [c[0] for c in recorded] == ["triton", "direct"]
    _, grid, args, consts = recorded[0]
    _, direct_grid, direct = recorded[1]
    cfg = hop.config(d, variant)
    tiles = math.ceil(300 / (cfg.NWG * cfg.BM))
    want = (min((tiles + 1) // 2 * 2 * 4, 132), 1) if hop.VARIANTS[variant].persistent else (tiles, 2 * 4)
    assert direct_grid == want and tuple(grid) + (1,) * (2 - len(grid)) == want
    params = _Kernel(hop.kernel(variant), [], False).params
    for i, (name, t) in enumerate(zip(("desc_q", "desc_k", "desc_v", "desc_o"),
                                      (*sets[1], outs[1][0]), strict=True)):
        got = direct[name]
        assert isinstance(got, TensorDescriptor) and got.base is t
        fresh = TensorDescriptor(t, list(t.shape), list(t.stride()), got.block_shape, got.layout)
        assert {f: getattr(got, f) for f in vars(fresh) if f != "base"} == \
            {f: getattr(fresh, f) for f in vars(fresh) if f != "base"}
        assert got.block_shape == args[i].block_shape
    assert direct["LSE"] is outs[1][1] and direct["SINKS"] is sinks
    for p, value in zip(params[4:len(args)], args[4:], strict=True):
        if p.name not in ("LSE", "SINKS"):
            assert direct[p.name] == value, p.name
    assert consts == hop.constexprs(d, True, True, variant, hop.mods_flags(False, 0.0, True))
    for p in params[len(args):]:
        assert direct[p.name] == consts.get(p.name, p.default), p.name


# --- on the GPU: Triton's dispatch is skipped on a hit -----------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (compiled kernels)")
@pytest.mark.parametrize("impl", ["portable", "hopper"])
def test_gpu_hits_skip_tritons_dispatch_and_equal_its_launch(monkeypatch, impl):
    """After a layout's first call, its calls do not enter Triton's `JITFunction.run` (the binary's launcher
    is called directly) and give the same bits; with a launch hook (a profiler's) they do."""
    if impl == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon Hopper kernels need an sm_90 GPU")
    entered = []
    real_run = triton.runtime.jit.JITFunction.run

    def counting_run(self, *args, **kwargs):
        entered.append(self)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(triton.runtime.jit.JITFunction, "run", counting_run)
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(1, 2048, h, 64, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
               for h in (32, 8, 8))
    fwd.clear_plan_cache()
    first = attnscope.flash_attention(q, k, v, True, return_lse=True, impl=impl)
    assert len(entered) == 1
    for _ in range(3):
        again = attnscope.flash_attention(q, k, v, True, return_lse=True, impl=impl)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    assert len(entered) == 1
    hooks, hook = triton.knobs.runtime.launch_enter_hook, (lambda metadata: None)
    hooks.add(hook)
    try:
        hooked = attnscope.flash_attention(q, k, v, True, return_lse=True, impl=impl)
    finally:
        hooks.remove(hook)
    assert len(entered) == 2 and torch.equal(hooked[0], first[0])
