"""Test setup: without a CUDA GPU, Triton kernels run on the CPU under its interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection time,
when no GPU is visible (nvidia-smi absent) and the user did not choose otherwise.
"""

import os
import shutil
import sys

import pytest

HAS_GPU_HINT = shutil.which("nvidia-smi") is not None
if not HAS_GPU_HINT:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fast_interpreter  # noqa: E402

fast_interpreter.install()  # the interpreter less a redundant re-patch per helper call (see its docstring)


@pytest.fixture(autouse=True)
def _fresh_backward_plans():
    """Each test plans its backward calls afresh: a kept plan (`kernels.bwd_plan`) would hide a
    dispatch table or kernel a test replaces."""
    plans = sys.modules.get("attnscope.kernels.bwd_plan")
    if plans is not None:
        plans.clear_plan_cache()
    yield
