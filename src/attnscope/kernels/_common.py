"""What the kernel launchers share: optional-dependency import, input checks (`InputError` naming the
argument, or `NotImplementedError` listing what is supported), device facts."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import NamedTuple

from attnscope.errors import InputError, expect, finite_real, short
from attnscope.model.tiles import head_block, normalize_window  # noqa: F401 - head_block: the kernels' name

#: Head dims the portable Triton kernels are built for (forward, backward, varlen, decode); the Gluon Hopper
#: kernels' own dims are `model.dispatch.HOPPER_BACKWARD_DIMS` and kernels/fwd_hopper.py ``VARIANTS``
#: (d = 256, Gemma's, runs the portable kernels everywhere).
SUPPORTED_HEAD_DIMS = (64, 128, 256)
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e)), folded into the softmax scale
FP32_MAX = 3.4028234663852886e38
FP32_TINY = 2.0**-126  # the smallest normal fp32
#: Largest softmax scale: the kernels take ``scale * log2(e)`` as an fp32 argument, which must stay finite.
MAX_SCALE = FP32_MAX / LOG2E  # about 2.36e38


def device_guard(torch, t):
    """A context that makes ``t``'s CUDA device current, or a no-op where it already is (or ``t`` is not on a
    CUDA device): Triton launches on the current device, not the tensors' (flash-attn's CUDAGuard)."""
    if not t.is_cuda or t.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


def dynamo_watching(torch):
    """A function that is non-None while torch.compile's frame hook is set (`get_eval_frame_callback`): the
    kernels' eager path then runs in a compiled region's graph break (e.g. after the compiler gave up on an
    entry point's frame, as on a call whose checks raised), where the compiler would trace each launch
    frame (Triton's among them) on its own and could die or run them wrong. A launcher seeing it runs
    through `outside_dynamo`."""
    return torch._C._dynamo.eval_frame.get_eval_frame_callback


def outside_dynamo(torch, fn):
    """``fn`` run with torch.compile's frame hook unset (`torch.compiler.disable`): the eager launch of a
    compiled region's graph break, never traced."""
    return torch.compiler.disable(fn, reason="attnscope's eager launch in a compiled region's graph break "
                                             "runs untraced")


def on_tensor_device(torch, watch: bool = True):
    """Decorator: run a launcher under `device_guard` of its first tensor argument; with ``watch``, outside
    torch.compile's frame hook where it is set (`dynamo_watching`). ``watch=False``: a launcher whose body
    routes a traced call itself (torch.compile cannot trace the hook's read: under ``fullgraph=True`` it
    would raise before the body's own message)."""
    watching = dynamo_watching(torch) if watch else None

    def wrap(fn):
        @functools.wraps(fn)
        def launcher(*args, **kwargs):
            if watching is not None and watching() is not None:  # eager in a compiled region's graph break
                return untraced(*args, **kwargs)
            t = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if t is None:
                return fn(*args, **kwargs)
            with device_guard(torch, t):
                return fn(*args, **kwargs)
        untraced = outside_dynamo(torch, launcher)  # the hook unset there: the launcher's own path
        return launcher
    return wrap


def import_torch_triton():
    """Import torch and triton, or raise ImportError with the install command."""
    try:
        import torch
        import triton
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"attnscope kernels need torch and triton: pip install 'attnscope[kernels]' "
                          f"({e})") from e
    return torch, triton


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU (TRITON_INTERPRET=1, set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _smem_optin(torch, index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def smem_per_block(torch, t) -> int | None:
    """The shared memory a block may opt into on tensor ``t``'s CUDA device, bytes (an A100: 163 KiB, an
    H100/H200: 227 KiB); None in the interpreter or off CUDA."""
    if interpreting() or t.device.type != "cuda":
        return None
    return _smem_optin(torch, t.device.index if t.device.index is not None else torch.cuda.current_device())


def fitting(config, needs: dict, smem: int | None):
    """``config`` (a table's tile config at one head dim), or the smaller one ``needs`` names where the
    device's per-block shared memory ``smem`` (`smem_per_block`) is under what ``config`` needs: ``needs``
    maps a config to (its bytes of shared memory, compiled for sm_90; the config used below that)."""
    if smem is None or config not in needs or smem >= needs[config][0]:
        return config
    return needs[config][1]


def built_dim(d: int, dims) -> int:
    """The config table row (of head dims ``dims``) a tile ``d`` wide runs: a tile narrower than the
    narrowest build (d = 8-32, `model.tiles.head_block`) that build's tile config (fewer columns: less shared
    memory and fewer registers than the config was measured with), any other ``d`` its own row."""
    return max(d, min(dims))


def hopper_unavailable(torch, t) -> str | None:
    """None when a Gluon Hopper kernel can run on tensor ``t``'s device, else the reason it cannot."""
    if interpreting() or t.device.type != "cuda":
        return "it needs a CUDA sm_90 GPU (Gluon kernels do not run in the interpreter)"
    cap = torch.cuda.get_device_capability(t.device)
    if cap != (9, 0):
        return f"it needs sm_90 (Hopper), got sm_{cap[0]}{cap[1]}"
    return None


def check_rank(torch, name: str, t, rank: int, layout: str) -> None:
    """A torch.Tensor of ``rank`` dimensions (``layout`` names them in the message)."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != rank:
        raise InputError(f"{name}: expected a {rank}-d tensor {layout}, got shape {tuple(t.shape)}")


def check_tensor(torch, name: str, t, rank: int, layout: str):
    """`check_rank`, dtype, and unit stride in the last dimension."""
    check_rank(torch, name, t, rank, layout)
    if t.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError(
            f"{name}: dtype {t.dtype} is not supported; supported: torch.float16, torch.bfloat16")
    if t.stride(-1) != 1:
        raise InputError(f"{name}: expected unit stride in the last (head_dim) dimension, "
                         f"got strides {tuple(t.stride())}")


def check_flags(**flags) -> None:
    """Each keyword is a real bool: ``causal="no"`` or ``return_lse=1`` would otherwise act as truthy."""
    for name, value in flags.items():
        expect(isinstance(value, bool), name, "True or False", value)


#: `check_scale`'s message, formatted once: under torch.compile(dynamic=True) Dynamo reads a float global as
#: a symbolic float, which a format spec cannot take (a graph break where fullgraph is asked)
_SCALE_RANGE = f"a finite positive number up to {MAX_SCALE:.3g}, or None"


def check_scale(scale) -> None:
    """None, or a finite positive real (not a bool) whose ``scale * log2(e)`` fits in fp32."""
    ok = scale is None or finite_real(scale) and 0 < scale <= MAX_SCALE
    expect(ok, "scale", _SCALE_RANGE, scale)


#: Largest ``softcap / scale`` the Hopper kernels (forward, backward) take: their tanh (``tanh.approx.f32``)
#: may flush a subnormal argument ``s * scale / softcap`` to 0; below this ratio only scores ``|s| < 2^-66``
#: have one (their capped value is 0 either way). A larger cap (tanh is then the identity for any score) runs
#: the portable kernels.
HOPPER_MAX_SOFTCAP = 2.0 ** 60


def check_softcap(softcap: float, sm_scale: float) -> None:
    """NotImplementedError unless a softcap (> 0) at softmax scale ``sm_scale`` gives the kernels finite,
    normal fp32 arguments: ``softcap * log2(e)`` (the capped scores' scale; decode divides by it) in
    [`FP32_TINY`, `FP32_MAX`] and ``scale / softcap`` (the tanh argument's scale) at most `FP32_MAX`.
    Outside, they overflow to inf or underflow to 0, and a score's ``0 * inf`` or ``inf * tanh(0)`` is NaN."""
    low = max(FP32_TINY / LOG2E, sm_scale / FP32_MAX)
    if not low <= softcap <= MAX_SCALE:
        raise NotImplementedError(
            f"softcap: {softcap:.3g} is not supported at scale {sm_scale:.3g}; supported: {low:.3g} <= "
            f"softcap <= {MAX_SCALE:.3g} (softcap * log2(e) and scale / softcap must be normal finite fp32)")


#: Largest window side a kernel call takes (the kernels' window arithmetic is int32).
MAX_WINDOW_SIDE = 2**31 - 1
#: A window side from here up reaches past every sequence the kernels take (the varlen kernels' unbounded
#: side, `bwd.WINDOW_UNBOUNDED`): `check_mods` folds it to -1 (unbounded), the same visibility.
UNBOUNDED_SIDE = 1 << 30


class Mods(NamedTuple):
    """The score mods of one call, validated by `check_mods`. When ``windowed``, ``(left, right)`` describe
    visibility in full (causal folded in as ``right = 0``); otherwise both are -1 and ``causal`` decides."""

    left: int  # -1: unbounded
    right: int
    softcap: float  # 0.0: off
    sinks: object  # float32 tensor [Hq] or None

    @property
    def windowed(self) -> bool:
        """A bounded side other than plain causal's (the kernels' WINDOW constexpr)."""
        return self.left >= 0 or self.right >= 0


def check_mods(torch, causal: bool, window, softcap, sinks, q_heads: int, device) -> Mods:
    """Validate the score mods (the one contract of every kernel, with
    `model.tiles.normalize_window`): ``window`` None or (left, right) ints from -1 to `MAX_WINDOW_SIDE`
    (causal forces right = 0, and a causal call with left = -1 is plain causal: ``windowed`` False; a side
    >= `UNBOUNDED_SIDE` is folded to -1, the same visibility); ``softcap`` a finite real >= 0 (0 = off);
    ``sinks`` None or a contiguous float32 tensor [Hq] on ``device`` (its values are not read on the host; the
    kernels keep them finite, `_tl.sink_log2`: a +inf sink takes all the weight, O = 0 and LSE = the
    largest finite fp32 (base 2) in natural log, about 2.36e38; a -inf or NaN sink takes none, O as without
    sinks, and a row with no visible key then gets LSE about -2.36e38, not -inf).
    Returns `Mods`; raises `InputError` naming the argument."""
    left, right = normalize_window(causal, window)
    if max(left, right) > MAX_WINDOW_SIDE:
        raise InputError(f"window: expected None or a pair (left, right) of integers from -1 to "
                         f"{MAX_WINDOW_SIDE} (-1 = unbounded), got {short(window)}")
    left, right = (-1 if x >= UNBOUNDED_SIDE else x for x in (left, right))
    if causal and left < 0:
        right = -1  # plain causal: the kernels' CAUSAL path, no window arithmetic
    ok = finite_real(softcap) and softcap >= 0
    expect(ok, "softcap", "a finite real number >= 0 (0 disables)", softcap)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise InputError(f"sinks: expected None or a torch.Tensor [Hq] of float32, got {short(sinks)}")
        if sinks.dtype != torch.float32 or tuple(sinks.shape) != (q_heads,):
            raise InputError(f"sinks: expected a float32 tensor of shape [Hq] = [{q_heads}], got "
                             f"{sinks.dtype} of shape {tuple(sinks.shape)}")
        if sinks.device != device:
            raise InputError(f"sinks: expected device {device} (as q), got {sinks.device}")
        if q_heads > 1 and sinks.stride(0) != 1:  # the kernels read sinks[h] at offset h
            raise InputError(f"sinks: expected a contiguous [Hq] tensor, got stride {sinks.stride(0)}")
    return Mods(left, right, float(softcap), sinks)


def sink_weight(torch, sinks, lse):
    """``exp(sink - LSE)``, each row's softmax weight on its head's sink (``sinks`` shaped to broadcast
    against the natural-log ``lse`` by the caller), as the kernels weigh a sink (`_tl.sink_log2`): a NaN sink
    none, a +inf one all; at most 1 (a weight), never inf or NaN from a sink. The sinks' gradient is made of
    it."""
    return torch.exp(torch.where(torch.isnan(sinks), float("-inf"), sinks) - lse).clamp_(max=1.0)


def finite_sinks(torch, sinks):
    """The sinks as the kernels take them (`_tl.sink_log2`): NaN as -`MAX_SCALE` (no weight), the rest clamped
    to +-`MAX_SCALE` (a +inf sink takes all the weight), so a merge of the sink as one more partial (the ring)
    meets no inf - inf."""
    return torch.where(torch.isnan(sinks), -MAX_SCALE, sinks).clamp(-MAX_SCALE, MAX_SCALE)


def check_disjoint(torch, name: str, t, others: dict) -> None:
    """``t`` (an output buffer) shares no memory with any tensor of ``others`` (name -> tensor or None):
    the kernels read their inputs while they write, so an overlap would give wrong results silently."""
    def span(x):  # [first, last) byte addresses an (any-stride, non-negative) tensor can touch
        if x.numel() == 0:
            return (0, 0)
        last = sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True))
        return x.data_ptr(), x.data_ptr() + (last + 1) * x.element_size()
    lo, hi = span(t)
    for other, x in others.items():
        if isinstance(x, torch.Tensor) and x.device == t.device:
            xlo, xhi = span(x)
            if lo < xhi and xlo < hi:
                raise InputError(f"{name}: expected a buffer that shares no memory with {other}, "
                                 f"got one overlapping it")


#: One int32 error word per (device, owner), written by device-side validation with ``bitwise_or_`` and read
#: only by `raise_device_errors`: bounded by devices x owners (a handful), never on a host-sync path.
_DEVICE_ERROR_FLAGS: dict = {}
_FLAGS_LOCK = threading.Lock()


def kept_allocation(torch, device, make):
    """``make()`` for tensors a cache keeps past the call (a plan's buffers, an error word), allocated outside
    any CUDA-graph memory pool: torch.compile's CUDA graphs (``mode="reduce-overhead"``, transformers' static
    cache) run a warm-up of the compiled code with the calling thread's allocations routed to the graph's
    private pool, and refuse a pool holding tensors that are not the graph's outputs ("tensor(s) in the
    cudagraph pool not tracked as outputs"). The routing is per thread, so on a CUDA device ``make`` runs in a
    short-lived thread on the caller's current stream (its allocations and fills ordered before the caller's
    later work, no sync). Inside stream capture and on a CPU it runs here, as before."""
    if torch.device(device).type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    stream = torch.cuda.current_stream(device)
    box: list = []

    def run():
        try:
            with torch.cuda.device(device), torch.cuda.stream(stream):
                box.append(make())
        except BaseException as exc:  # re-raised in the caller's thread
            box.append(exc)
    worker = threading.Thread(target=run, name="attnscope-kept-allocation")
    worker.start()
    worker.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def device_error_flag(torch, device, owner: str):
    """The int32 [1] error word of ``owner`` (e.g. ``"varlen"``) on ``device``, zero until a launcher's
    device-side check ORs a bit into it (no host sync); `raise_device_errors` reads and clears it."""
    key = (str(torch.device(device)), owner)
    flag = _DEVICE_ERROR_FLAGS.get(key)
    if flag is None:
        with _FLAGS_LOCK:  # two threads' first calls must share one word
            flag = _DEVICE_ERROR_FLAGS.get(key)
            if flag is None:
                flag = _DEVICE_ERROR_FLAGS[key] = kept_allocation(
                    torch, device, lambda: torch.zeros(1, dtype=torch.int32, device=device))
    return flag


def raise_device_errors(torch, owner: str, messages: dict, device=None) -> None:
    """Read (one host sync), clear, and raise the error words of ``owner`` (on ``device``, or every device
    it ran on): `InputError` joining ``messages[bit]`` (each "name: expected ..., got ...") of every set
    bit; nothing when the word is 0."""
    keys = [k for k in _DEVICE_ERROR_FLAGS if k[1] == owner
            and (device is None or k[0] == str(torch.device(device)))]
    word = 0
    for key in keys:
        flag = _DEVICE_ERROR_FLAGS[key]
        word |= int(flag.item())
        flag.zero_()
    if word:
        raise InputError("; ".join(msg for bit, msg in sorted(messages.items()) if word & bit))


def check_same(name: str, what: str, expected, got) -> None:
    if expected != got:
        raise InputError(f"{name}: expected {what} {expected}, got {got}")


def check_device(tensors: dict) -> None:
    """All on one device; CUDA, or CPU under TRITON_INTERPRET=1."""
    first_name, first = next((n, t.device) for n, t in tensors.items())
    for n, t in tensors.items():
        if t.device != first:
            raise InputError(f"{n}: expected device {first} (as {first_name}), got {t.device}")
    if first.type == "cpu" and not interpreting():
        raise InputError(f"{first_name}: expected CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 "
                         f"set before triton is imported), got device {first}")
    if first.type not in ("cpu", "cuda"):
        raise InputError(f"{first_name}: expected a CUDA device, got {first}")


#: Head dims the portable kernels take besides `SUPPORTED_HEAD_DIMS` (`flash_attention`,
#: `flash_attention_varlen`, their backward, `flash_decode`): any multiple of 8 up to the largest, run in the
#: next power of two's tiles (`head_block`: TMA reads zeros past d and clips the stores, pointer loads and
#: stores are masked; 8: a TMA row of 16-byte multiples). The Gluon forward and backward (dense and packed)
#: take 40-120 the same way in their d = 64 and 128 builds (`model.dispatch`).
PADDED_HEAD_DIM_STEP = 8
#: Every head dim the entry points take (the built ones among them).
HEAD_DIMS = range(PADDED_HEAD_DIM_STEP, SUPPORTED_HEAD_DIMS[-1] + 1, PADDED_HEAD_DIM_STEP)


def check_head_dim(d: int, padded: bool = False) -> None:
    """NotImplementedError unless ``d`` is a built head dim (``padded``: or a multiple of
    `PADDED_HEAD_DIM_STEP` up to the largest, which the kernels run in `head_block`'s
    tiles); below the largest, the message names the exact workaround: zero columns add nothing to Q K^T,
    and zero V columns give zero output columns."""
    if padded and 0 < d <= SUPPORTED_HEAD_DIMS[-1] and d % PADDED_HEAD_DIM_STEP == 0:
        return
    if d not in SUPPORTED_HEAD_DIMS:
        up = [x for x in SUPPORTED_HEAD_DIMS if x > d]
        hint = (f" (zero-padding q, k and v to {up[0]} with torch.nn.functional.pad and passing "
                f"scale={d}**-0.5 gives the same attention in the output's first {d} columns)"
                if up and d > 0 else "")
        also = (f", or a multiple of {PADDED_HEAD_DIM_STEP} up to {SUPPORTED_HEAD_DIMS[-1]}" if padded
                else "")
        raise NotImplementedError(f"head_dim {d} is not supported; supported: "
                                  f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}{also}{hint}")


#: CUDA's limit on a launch grid's y (and z) size: kernels with (batch, head) on y refuse past it.
MAX_GRID_Y = 65535


def descriptor_template(cls, t, block, *layout):
    """A host TMA descriptor of class ``cls`` (Triton's or Gluon's ``TensorDescriptor``, whose constructor
    validates it) for ``t``'s shape, strides and dtype with block shape ``block``, holding no tensor:
    `descriptor_over` puts one in."""
    return descriptor_over(cls(t, list(t.shape), list(t.stride()), block, *layout), None)


def descriptor_over(template, t):
    """``template`` (`descriptor_template` of a tensor of ``t``'s shape, strides and dtype) over ``t``: the
    same fields with ``base = t``, skipping the constructor's validation, which the layout alone decides (a
    fifth of its host time); ``t``'s 16-byte base alignment is the caller's check."""
    d = object.__new__(type(template))
    d.__dict__ = {**template.__dict__, "base": t}
    return d


def num_sms(torch, device) -> int:
    """Streaming multiprocessors of ``device`` (132 on an H200); 132 under the interpreter."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
