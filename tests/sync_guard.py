"""Count the operations that would force a device -> host sync on a GPU, on the CPU (not a test module).

On CPU tensors nothing syncs, so a host read hidden in a wrapper costs nothing here and ~10-100 us per call
on a GPU. `count_syncs` runs a block with the Python entry points of torch's ``set_sync_debug_mode`` list
patched, recording each call with the call site that made it:

- host reads of device values: ``Tensor.item``, ``tolist``, ``cpu``, ``numpy``, ``__bool__`` (an ``if`` on
  ``t.any()``), ``__int__``, ``__float__``, ``__index__`` (``range(t)``, a tensor as a slice bound),
  ``torch.equal``;
- outputs whose size depends on device data: ``nonzero`` (also ``torch.where(cond)``), ``masked_select``,
  ``unique``, ``repeat_interleave`` without ``output_size``, indexing (get or set) with a bool mask;
- ``torch.tensor`` / ``torch.as_tensor`` of non-empty data with an explicit ``device`` (a pageable
  host-to-device copy, which PyTorch synchronises);
- a host tensor copied to a device: a tensor made in the block by a factory without a ``device``
  (``torch.tensor``, ``as_tensor``, ``from_numpy``, ``arange``, ``zeros``, ``full``, ...: on a GPU run
  it lives on the CPU) then moved by ``.to(device)`` / ``.to(tensor)`` / ``.cuda()``, ``copy_`` into
  another tensor, assigned into one (``t[i] = host``, more than one element), or used as an index of
  another (``t[host_idx]``: PyTorch copies index tensors to the indexed tensor's device). On the CPU the
  block's inputs stand for device tensors, so a move counts unless its destination is spelled ``"cpu"``.

Python methods are patched rather than a ``TorchDispatchMode`` used, because a dispatch mode does not see
the aten ops inside a custom op (``attnscope::flash_attention``) that it intercepts. Each hit is attributed
to the innermost frame outside torch and this module: ``"attnscope"`` (its package), ``"transformers"``,
``"triton"`` (anything under Triton's interpreter, the CPU's stand-in for the GPU: not a sync on a GPU;
left out of `Syncs.count`) or ``"other"`` (the test itself, torch).

>>> with count_syncs() as s:
...     attnscope.flash_attention(q, k, v)
>>> assert s.count("attnscope") == 0, s.report("attnscope")
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import weakref

import torch

_HERE = os.path.abspath(__file__)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

def _packages() -> dict:
    out = {}
    for name in ("attnscope", "transformers", "triton"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        out[name] = os.path.dirname(os.path.abspath(mod.__file__)) + os.sep
    return out


@dataclasses.dataclass
class Hit:
    op: str
    owner: str  # "attnscope", "transformers", "triton" or "other"
    stack: list  # (file, line, function), innermost first, torch's and this module's frames left out

    def site(self) -> str:
        f, line, fn = self.stack[0] if self.stack else ("?", 0, "?")
        return f"{self.op} at {os.path.relpath(f)}:{line} in {fn}"


@dataclasses.dataclass
class Syncs:
    hits: list = dataclasses.field(default_factory=list)

    def of(self, owner: str) -> list:
        return [h for h in self.hits if h.owner == owner]

    def count(self, owner: str | None = None) -> int:
        """Hits of one owner; all but the interpreter's (``owner=None``)."""
        return len(self.of(owner)) if owner else sum(h.owner != "triton" for h in self.hits)

    def report(self, owner: str | None = None, depth: int = 6) -> str:
        hits = self.of(owner) if owner else [h for h in self.hits if h.owner != "triton"]
        lines = []
        for h in hits:
            lines.append(f"[{h.owner}] {h.site()}")
            lines += [f"      from {os.path.relpath(f)}:{n} in {fn}" for f, n, fn in h.stack[1:depth]]
        return "\n".join(lines) or "no syncs"


class _Recorder:
    def __init__(self):
        self.syncs = Syncs()
        self.pkgs = _packages()
        self.busy = False

    def hit(self, op: str) -> None:
        stack = []
        frame = sys._getframe(2)
        while frame is not None:
            f = os.path.abspath(frame.f_code.co_filename)
            if f != _HERE and not f.startswith(_TORCH):
                stack.append((f, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        owner = "other"
        if any(f.startswith(self.pkgs.get("triton", "\0")) for f, _, _ in stack):
            owner = "triton"
        elif stack:
            for name in ("attnscope", "transformers"):
                if stack[0][0].startswith(self.pkgs.get(name, "\0")):
                    owner = name
        self.syncs.hits.append(Hit(op, owner, stack))


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


#: Factories whose result, without a ``device`` argument, is a host tensor on a GPU run.
_HOST_FACTORIES = ("tensor", "as_tensor", "asarray", "from_numpy", "arange", "zeros", "ones", "empty", "full",
                   "empty_strided", "linspace", "randperm", "randint", "randn", "rand")


def _destination(args, kwargs):
    """The device a ``Tensor.to`` call names (a device, a string, an index or a tensor's), else None."""
    dest = kwargs.get("device")
    if dest is None and args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            dest = first.device
        elif isinstance(first, (torch.device, str, int)) and not isinstance(first, bool):
            dest = first
    return dest


@contextlib.contextmanager
def count_syncs():
    """Record, in the yielded `Syncs`, every operation in the block that would sync with a GPU."""
    rec = _Recorder()
    patched = []

    def wrap(owner, attr, op, when=None):
        orig = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            if when is None or when(args, kwargs):
                rec.hit(op)
            return orig(*args, **kwargs)

        wrapper.__wrapped__ = orig
        setattr(owner, attr, wrapper)
        patched.append((owner, attr, orig))

    def explicit_device(args, kwargs) -> bool:  # an empty tensor copies no bytes: nothing to wait for
        data = args[0] if args else kwargs.get("data")
        return kwargs.get("device") is not None and not (isinstance(data, (list, tuple)) and not data)

    host = {}  # id -> weak reference of each tensor made in the block on the host (`_HOST_FACTORIES`)

    def is_host(t) -> bool:
        ref = host.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def mark(owner, attr):
        orig = getattr(owner, attr)

        def factory(*args, **kwargs):
            out = orig(*args, **kwargs)
            if kwargs.get("device") is None and isinstance(out, torch.Tensor) and out.device.type == "cpu" \
                    and not (args and isinstance(args[0], torch.Tensor)):  # torch.tensor(t): t's device
                key = id(out)
                host[key] = weakref.ref(out, lambda _: host.pop(key, None))
            return out

        factory.__wrapped__ = orig
        setattr(owner, attr, factory)
        patched.append((owner, attr, orig))

    def moved(args, kwargs) -> bool:  # host.to(device): a copy unless to the CPU (spelled "cpu" on a CPU run)
        dest = _destination(args[1:], kwargs)
        if not is_host(args[0]) or dest is None or dest == "cpu":
            return False
        return not torch.cuda.is_available() or torch.device(dest).type != "cpu"

    def indexed_by_host(args, kwargs) -> bool:
        items = args[1] if isinstance(args[1], tuple) else (args[1],)
        return not is_host(args[0]) and any(is_host(i) for i in items)

    def assigned_from_host(args, kwargs) -> bool:
        value = args[2] if len(args) > 2 else None
        return not is_host(args[0]) and is_host(value) and value.dim() > 0

    def copied_from_host(args, kwargs) -> bool:
        src = args[1] if len(args) > 1 else kwargs.get("src")
        return not is_host(args[0]) and is_host(src)

    try:
        for attr in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
                     "nonzero", "masked_select", "unique"):
            wrap(torch.Tensor, attr, f"Tensor.{attr}")
        for attr in ("equal", "nonzero", "masked_select", "unique"):
            wrap(torch, attr, f"torch.{attr}")
        for owner in (torch, torch.Tensor):
            wrap(owner, "repeat_interleave", "repeat_interleave (no output_size)",
                 lambda args, kwargs: kwargs.get("output_size") is None)
        wrap(torch, "where", "torch.where(cond) (nonzero)", lambda args, kwargs: len(args) + len(kwargs) == 1)
        wrap(torch.Tensor, "__getitem__", "indexing with a bool mask",
             lambda args, kwargs: _bool_index(args[1]))
        wrap(torch.Tensor, "__setitem__", "index_put with a bool mask",
             lambda args, kwargs: _bool_index(args[1]))
        wrap(torch, "tensor", "torch.tensor(device=...)", explicit_device)
        wrap(torch, "as_tensor", "torch.as_tensor(device=...)", explicit_device)
        for attr in _HOST_FACTORIES:
            mark(torch, attr)
        wrap(torch.Tensor, "to", "host tensor .to(device) (a host-to-device copy)", moved)
        wrap(torch.Tensor, "cuda", "host tensor .cuda() (a host-to-device copy)", lambda a, k: is_host(a[0]))
        wrap(torch.Tensor, "copy_", "copy_ from a host tensor (a host-to-device copy)", copied_from_host)
        wrap(torch.Tensor, "__getitem__", "indexing with a host index tensor (a host-to-device copy)",
             indexed_by_host)
        wrap(torch.Tensor, "__setitem__", "assignment from a host tensor (a host-to-device copy)",
             lambda a, k: assigned_from_host(a, k) or indexed_by_host(a, k))
        yield rec.syncs
    finally:
        for owner, attr, orig in reversed(patched):
            setattr(owner, attr, orig)


@contextlib.contextmanager
def cuda_syncs():
    """On a CUDA GPU: CUDA's own detector (``torch.cuda.set_sync_debug_mode("warn")``) over the block; the
    yielded `Syncs` gets one `Hit` per synchronising CUDA call, attributed by the Python frame that made it
    (its stack holds that frame only)."""
    import warnings

    rec = _Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield rec.syncs
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchronizing CUDA operation" not in str(w.message):
            continue
        f = os.path.abspath(w.filename)
        owner = next((name for name in ("attnscope", "transformers", "triton")
                      if f.startswith(rec.pkgs.get(name, "\0"))), "other")
        rec.syncs.hits.append(Hit("cuda sync", owner, [(f, w.lineno, "?")]))
