"""Where the kernel tests run: on a CUDA GPU, else on the CPU under TRITON_INTERPRET=1 (conftest.py sets it
when no GPU is visible); with neither, the calling test module is skipped. Not a test module itself."""

import pytest


def kernel_device() -> str:
    """"cuda" or "cpu" for a kernel test module (call at module level); skips the module without torch,
    triton, or a way to run Triton kernels."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from attnscope.kernels import _common

    if torch.cuda.is_available():
        return "cuda"
    if not _common.interpreting():
        pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)
    return "cpu"


def fake_current_device(monkeypatch, index: int):
    """Stand-ins for CUDA's current device on any machine: ``torch._C._cuda_getDevice`` reads ``current[0]``
    (starting at ``index``) and ``torch.cuda.device(i)`` makes ``i`` current for its block, recording each
    ``i`` it enters. Returns ``(current, entered)``, both lists the test can read and set."""
    import contextlib

    import torch

    current, entered = [index], []

    @contextlib.contextmanager
    def on(i):
        entered.append(i)
        before, current[0] = current[0], i
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: current[0], raising=False)
    monkeypatch.setattr(torch.cuda, "device", on)
    return current, entered
