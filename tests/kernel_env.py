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
