"""`DirectLaunch`: a planned Triton kernel launched through its compiled binary's launcher.

``kernel[grid](*args, **constexprs)`` re-binds the arguments, recomputes the specialisation key, looks the
binary up and builds launch metadata on every call (Triton 3.6, `JITFunction.run`). A launch plan (the
decode `DecodePlan`, the forward's per-layout `fwd._Plan`) fixes everything of a launch but the tensors'
addresses, so after Triton's first launch the plan can call the kept binary's launcher itself. Host tensor
descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`, Gluon's) go to that launcher as the JIT
path passes them: the launcher encodes each one's TMA map from its base on every call.
"""

from __future__ import annotations

from attnscope.kernels._common import import_torch_triton, interpreting

torch, triton = import_torch_triton()

#: Binaries a `DirectLaunch` keeps for integer classes (`int_classes`) other than its plan's own.
MAX_SPECS = 16


class DirectLaunch:
    """One Triton kernel of a plan, launched through its compiled binary's launcher.

    A plan fixes the grid, the constexprs and how Triton classes every scalar argument (or, for a cache
    served at any length, ``spec``: `int_classes` of the integers that change), so the binary of the first
    launch through Triton on the plan's device with every pointer argument 16-byte aligned is kept (per
    ``spec``), and later launches with every pointer aligned (the one other fact that changes Triton's choice
    of binary; a host tensor descriptor's key is its dtype, block shape and layout, not its address) call its
    launcher directly with the constexprs pre-packed. Other alignments or a launch hook (profilers) go through
    ``kernel[grid]``. A launch while another device is current makes the plan's device current first
    (Triton launches on the current device; flash-attn's CUDAGuard), so a launcher needs no guard of its
    own. Launches go to the current stream, as Triton's do (CUDA-graph capture included). `launch` returns
    the binary that ran (Triton's ``CompiledKernel``)."""

    __slots__ = ("kernel", "constexprs", "device", "compiled", "tail", "by_spec")

    def __init__(self, kernel, constexprs, device_index):
        self.kernel, self.constexprs, self.device = kernel, constexprs, device_index
        self.compiled = self.tail = None
        self.by_spec = {}  # spec -> binary, for launches whose integers' classes vary

    def launch(self, grid, args, aligned: bool, spec=None):
        if torch._C._cuda_getDevice() != self.device:  # tensors on another device than the current one
            with torch.cuda.device(self.device):
                return self.launch(grid, args, aligned, spec)
        c = self.compiled if spec is None else self.by_spec.get(spec)
        if aligned and c is not None and no_launch_hooks():
            stream = torch._C._cuda_getCurrentRawStream(self.device)
            c.run(grid[0], grid[1] if len(grid) > 1 else 1, 1, stream, c.function, c.packed_metadata,
                  None, None, None, *args, *self.tail)
            return c
        compiled = self.kernel[grid](*args, **self.constexprs)
        if aligned and c is None and getattr(compiled, "function", None) is not None:
            # the launcher takes every parameter in order, the constexprs included (and ignores them)
            self.tail = tuple(self.constexprs.get(p.name, p.default) for p in self.kernel.params[len(args):])
            if spec is None:
                self.compiled = compiled
            elif len(self.by_spec) < MAX_SPECS:
                self.by_spec[spec] = compiled
        return compiled


def direct_launch(kernel, constexprs, device):
    """A `DirectLaunch` of ``kernel`` for a plan on ``device`` (a ``torch.device``), or None where a launch
    must go through ``kernel[grid]`` each time: the interpreter, a CPU tensor."""
    return None if device.type != "cuda" or interpreting() else DirectLaunch(kernel, constexprs, device.index)


def int_classes(values) -> tuple:
    """How Triton specialises each integer argument (Triton 3.6, `get_int_specialization`): 1 is a
    constant, a multiple of 16 is marked divisible, a value past int32 is 64-bit; each class its own
    binary."""
    return tuple(-1 if v == 1 else (v % 16 == 0) + 2 * (v >= 2**31) for v in values)


def no_launch_hooks() -> bool:
    """Whether Triton has no launch hook to call (Triton 3.6: empty `HookChain`s; None elsewhere). Runs
    before every kept-binary launch: no generator, no ``all``."""
    runtime = triton.knobs.runtime
    return _no_hook(runtime.launch_enter_hook) and _no_hook(runtime.launch_exit_hook)


def _no_hook(h) -> bool:
    return h is None or (type(getattr(h, "calls", None)) is list and not h.calls)


def planned_launch(kernel, grid, constexprs, device):
    """``launch(args, aligned) -> compiled`` of a plan's kernel on ``device`` with ``grid`` and ``constexprs``
    fixed: through a `DirectLaunch` where `direct_launch` gives one (``aligned``: every pointer argument
    16-byte aligned), else ``kernel[grid](*args, **constexprs)``."""
    direct = direct_launch(kernel, constexprs, device)
    if direct is None:
        bound = kernel[grid]
        return lambda args, aligned: bound(*args, **constexprs)
    return lambda args, aligned: direct.launch(grid, args, aligned)
