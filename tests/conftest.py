"""Test setup: without a CUDA GPU, Triton kernels run on the CPU under its interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection time,
when no GPU is visible (nvidia-smi absent) and the user did not choose otherwise.
"""

import os
import shutil

HAS_GPU_HINT = shutil.which("nvidia-smi") is not None
if not HAS_GPU_HINT:
    os.environ.setdefault("TRITON_INTERPRET", "1")
