"""Which Gluon Hopper forward variant ``impl="auto"`` runs: one rule of the launch geometry (no torch).

Two variants (kernels/fwd_hopper.py ``VARIANTS``), each an FA-3-style warp-specialised kernel:

- ``hopper_persist`` (the default, ``impl="hopper"``): two consumer warpgroups x 64 rows, one CTA per SM
  walking the query tiles (causal tiles in balanced pairs); the fill and drain of the K/V pipeline are paid
  once per CTA, not once per tile, which is what wins when each tile's KV loop is short.
- ``hopper_wg3_pp`` (d = 64 only): three consumer warpgroups, 192 query rows per CTA, ping-pong: a K/V
  tile feeds 1.5 x the rows (d = 64 is bound by K/V reads and the softmax, not the MMAs), paid for with a
  fill and drain per tile and 192-row wave quantisation; it wins once the KV loop is long and the grid
  holds enough CTAs to keep every SM busy to the end.

The backward (`hopper_backward_ok`): whether ``impl="auto"`` runs kernels/bwd_hopper.py's Gluon dK/dV and
dQ kernels instead of the portable ones: wherever they are built (head dim), with every score mod (window,
softcap, sinks). The packed backward (kernels/varlen_bwd.py `pick_impl`) follows the same rule for
kernels/varlen_bwd_hopper.py's Gluon kernels (no window or softcap there: not built).

Which Hopper backward build runs (`hopper_backward_lean`): the lean one (kernels/bwd_hopper.py
``LEAN_CONFIGS``: its P^T and dS^T carry the softmax scale, its one-pass dQ rows are padded to
`HOPPER_BWD_ROW_PAD`) at the head dims it is built for, in both modes, except under softcap (not built) and
in fp16 with a scale under `HOPPER_LEAN_MIN_FP16_SCALE`; the plain build elsewhere. The packed backward
(kernels/varlen_bwd_hopper.py) runs the plain build: its dK/dV kernel's rows and loop are the plain step's.

A head dim between the built ones (a multiple of 8: 40, 80, 96, ...) runs the kernels of the next power of
two (`model.tiles.head_block`: 40-56 the d = 64 builds, 72-120 the d = 128 ones; TMA reads zeros past d and
clips the stores), so every rule here reads that width; smaller ones (8-32) run the portable kernels.

The rule (`hopper_variant`) reads only the launch geometry: head dim, mask, the mean KV loop length of a
query row (keys each row visits), the waves of 192-row tiles on the SMs and the rows those tiles pad
beyond 128-row tiles, and a sliding window's width (`WINDOW_PORTABLE_KEYS`). It is the same for fp16 and
bf16, and for any GQA group (no measurement showed the group moving the choice). Where no variant beats the
portable Triton kernel (d = 64 with a short KV loop) it returns None. The thresholds come from the H200
sweeps at B*N = 16k, H = 32 and held-out shapes (bench/grids/dispatch_heldout*.csv); how each was measured
and checked: BENCHMARKS.md.
"""

from __future__ import annotations

import math

from attnscope.errors import MAX_DIM, choice, expect, is_int, positive_int
from attnscope.model.tiles import Grid, head_block, hides_keys

#: The Gluon variants kernels/fwd_hopper.py builds (its ``VARIANTS`` keys); the first is the default.
VARIANTS = ("hopper_persist", "hopper_wg3_pp")
DEFAULT_VARIANT = VARIANTS[0]
#: Query rows per CTA of ``hopper_wg3_pp`` (3 warpgroups x 64 rows).
WG3_ROWS = 192
#: Query rows per CTA of ``hopper_persist`` (2 warpgroups x 64 rows).
PERSIST_ROWS = 128
#: d = 64: mean keys per query row from which three warpgroups win, (unmasked, causal). Causal needs the
#: longer loop: its non-persistent grid pays the imbalance of short diagonal tiles. Fitted on the B*N = 16k
#: sweep and the first two held-out sets (bench/grids/dispatch_heldout.csv, dispatch_heldout2.csv, 5 rounds
#: each; 44 d = 64 points in all): unmasked, three warpgroups ran 1.02-1.10 x hopper_persist from 1,150 keys
#: wherever their 192-row tiles padded no more rows than 128-row tiles (`WG3_MIN_FILL`); causal, 0.91-1.01 x
#: up to 2,120 keys and 1.04-1.11 x from 2,478.
WG3_MIN_KEYS = {False: 1024, True: 2304}
#: Least ratio of the query rows 128-row tiles cover to those 192-row tiles cover
#: (``ceil(nq / 128) * 128 / (ceil(nq / 192) * 192)``) for ``hopper_wg3_pp``: at N = 1,024 its 6 x 192 rows
#: pad 11 % more than 8 x 128 and it ran 0.90 x hopper_persist (N = 1,380: 8 % more, 0.95 x).
WG3_MIN_FILL = 0.95
#: d = 64: mean keys per row below which the portable kernel is as fast as any Gluon variant, (unmasked,
#: causal) (B*N = 16k: unmasked N = 1k runs hopper_persist 1.04-1.05 x portable in three runs; causal N = 1k
#: 0.80-0.85 x, N = 2k 0.99-1.00 x).
D64_MIN_KEYS = {False: 1024, True: 1536}
#: Fewest waves of 192-row CTAs (per SM) for ``hopper_wg3_pp``: below, the last partial wave idles up to a
#: third of the machine that the 128-row persistent kernel keeps busy. Assumed: every B*N = 16k point has
#: 20+ waves; the held-out shapes are the first to test it.
WG3_MIN_WAVES = 2.0
#: Sliding windows: head dim -> mean keys per query row under the window (`window_mean_keys`) up to which
#: the portable kernel runs (in kernels/fwd.py ``WINDOW_CONFIGS``' 64 x 64 tiles). A window's KV loop is
#: short, so each query tile's fixed cost (pipeline fill and drain, O store) weighs on few key tiles, and
#: 64-row tiles halve the masked work at the window's two edges. Measured on the H200 (d = 64 and 128, held
#: out on three window grids): BENCHMARKS.md's "Window rule".
WINDOW_PORTABLE_KEYS = {64: 4097, 128: 640}


def mean_keys(nq: int, nk: int, causal: bool) -> float:
    """Mean number of keys a query row visits (bottom-right causal: row r sees keys ``c <= r + nk - nq``);
    ``nq``, ``nk`` integers >= 0 (0 when either is 0), ``causal`` a bool, else `InputError` naming the
    argument."""
    for name, value in (("nq", nq), ("nk", nk)):
        expect(is_int(value) and 0 <= value <= MAX_DIM, name, "an integer from 0 to 10^24", value)
    expect(isinstance(causal, bool), "causal", "True or False", causal)
    if nq == 0 or nk == 0:
        return 0.0
    if not causal:
        return float(nk)
    off = nk - nq
    first, last = max(off + 1, 0), min(nq + off, nk)  # keys seen by row 0, by row nq - 1 (clipped)
    if nq <= nk:
        return (first + last) / 2
    empty = min(nq, max(0, -off))  # rows with no visible key
    seen = nq - empty
    return (seen * (1 + min(seen, nk)) / 2) / nq


def hopper_variant(d: int, causal: bool, batch: int, q_heads: int, kv_heads: int, nq: int, nk: int,
                   sms: int = 132, window: tuple[int, int] | None = None) -> str | None:
    """The Gluon Hopper variant ``impl="auto"`` runs for this launch, or None (run the portable kernel).

    Parameters
    ----------
    d: head dim (the variants are built for 64 and 128, which also run the head dims whose `head_block`
    that is; any other: None); causal: the mask; batch,
    q_heads, kv_heads, nq, nk: the call's ``[batch, q_heads, nq, d]`` queries and
    ``[batch, kv_heads, nk, d]`` keys; sms: SMs of the GPU; window: the effective ``(left, right)`` of a
    sliding window (`model.tiles.normalize_window`; -1 unbounded), which bounds the keys a row visits by
    ``left + right + 1`` (a window leaving at most `WINDOW_PORTABLE_KEYS` keys a row on average runs the
    portable kernel, `portable_window`).
    """
    for name, v in (("d", d), ("batch", batch), ("q_heads", q_heads), ("kv_heads", kv_heads), ("nq", nq),
                    ("nk", nk), ("sms", sms)):
        positive_int(name, v)
    expect(q_heads % kv_heads == 0, "kv_heads", f"a divisor of q_heads = {q_heads}", kv_heads)
    d = head_block(d)
    if portable_window(d, window, nq, nk, causal):
        return None
    if d == 128:
        return "hopper_persist"
    if d != 64:
        return None
    keys = mean_keys(nq, nk, causal) if window is None else window_mean_keys(nq, nk, causal, window)
    tiles = -(-nq // WG3_ROWS)
    waves = tiles * batch * q_heads / sms
    fill = -(-nq // PERSIST_ROWS) * PERSIST_ROWS / (tiles * WG3_ROWS)
    if keys >= WG3_MIN_KEYS[causal] and waves >= WG3_MIN_WAVES and fill >= WG3_MIN_FILL:
        return "hopper_wg3_pp"
    if keys < D64_MIN_KEYS[causal]:
        return None
    return "hopper_persist"


def window_mean_keys(nq: int, nk: int, causal: bool, window: tuple[int, int] | None) -> float:
    """Mean keys a query row visits under ``causal`` and a sliding ``window`` ``(left, right)`` (-1 unbounded;
    None: none): `model.tiles.Grid.visible_pairs` / ``nq`` (closed form), `mean_keys` without a window."""
    return Grid(nq, nk, causal=causal, window=window).visible_pairs() / nq


def portable_window(d: int, window: tuple[int, int] | None, nq: int, nk: int, causal: bool) -> bool:
    """Whether a sliding ``window`` leaves a row few enough keys at head dim ``d`` for the portable kernel in
    64 x 64 tiles: it hides some key the mask alone would show, and leaves at most `WINDOW_PORTABLE_KEYS`
    keys a row on average (`window_mean_keys`; sm_90's ``impl="auto"`` then runs it, and the portable kernel
    takes kernels/fwd.py ``WINDOW_CONFIGS``' tiles on any GPU)."""
    d = head_block(d)
    if window is None or (window[0] < 0 and window[1] < 0) or d not in WINDOW_PORTABLE_KEYS:
        return False
    return hides_keys(nq, nk, causal, window) and window_mean_keys(nq, nk, causal, window) <= \
        WINDOW_PORTABLE_KEYS[d]


#: Head dims the Hopper backward is built for (kernels/bwd_hopper.py ``CONFIGS``).
HOPPER_BACKWARD_DIMS = (64, 128)


def hopper_backward_ok(d: int, causal: bool) -> bool:
    """Whether ``impl="auto"`` runs the Gluon Hopper dK/dV and dQ kernels on an sm_90 GPU for this call: head
    dim ``d`` built (64, 128) or run in their tiles (`head_block`), either mask, any score mod (module
    docstring). ``d`` a positive integer, ``causal`` a bool, else `InputError` naming the argument."""
    positive_int("d", d)
    expect(isinstance(causal, bool), "causal", "True or False", causal)
    return head_block(d) in HOPPER_BACKWARD_DIMS


#: Rows the Hopper backward pads its per-row fp32 copies to (kernels/bwd_hopper.py ``ROW_PAD``): the dK/dV
#: kernel's -LSE2 and Delta rows, and the lean one-pass build's fp32 dQ accumulator.
HOPPER_BWD_ROW_PAD = 128
#: Head dims with a lean Hopper backward build (kernels/bwd_hopper.py ``LEAN_CONFIGS``).
HOPPER_LEAN_DIMS = (64,)
#: The lean build's P^T and dS^T carry the softmax scale in the input dtype: in fp16 a scale under this (d >
#: 256's 1 / sqrt(d)) would push P^T below fp16's normal range (bf16 has fp32's).
HOPPER_LEAN_MIN_FP16_SCALE = 2.0**-4


def hopper_backward_lean(d: int, dtype: str, scale: float | None = None, softcap: float = 0.0) -> bool:
    """Whether the Hopper backward runs its lean build (module docstring) for head dim ``d``, ``dtype``
    ("fp16" or "bf16"), softmax ``scale`` (None: ``1 / sqrt(d)``) and ``softcap`` (0: none): ``d`` (its
    `head_block`) in `HOPPER_LEAN_DIMS`, no softcap, and in fp16 a scale of at least
    `HOPPER_LEAN_MIN_FP16_SCALE`. Both modes (the one-pass and the two-kernel build) take the same answer. Bad
    arguments raise `InputError` naming them."""
    positive_int("d", d)
    choice("dtype", dtype, ("fp16", "bf16"))
    sm_scale = 1.0 / math.sqrt(d) if scale is None else scale
    expect(isinstance(sm_scale, (int, float)) and not isinstance(sm_scale, bool) and math.isfinite(sm_scale)
           and sm_scale > 0, "scale", "None or a positive finite number", scale)
    expect(isinstance(softcap, (int, float)) and not isinstance(softcap, bool) and softcap >= 0, "softcap",
           "a number >= 0", softcap)
    if head_block(d) not in HOPPER_LEAN_DIMS or softcap > 0:
        return False
    return dtype == "bf16" or sm_scale >= HOPPER_LEAN_MIN_FP16_SCALE
