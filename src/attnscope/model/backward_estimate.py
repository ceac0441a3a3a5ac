"""DRAM-byte estimate of an attention backward call (the gradient call alone: the forward ran before), whole
call: compulsory bytes plus the terms the hardware adds, the counter ncu's ``dram__bytes_read.sum +
dram__bytes_write.sum`` reads (as model/family_estimate.py's decode and varlen estimates).

Compulsory (`backward_compulsory`): Q, K, V, dO read and dQ, dK, dV written once; the fused backwards also
read O and the fp32 LSE once (naive's autograd reads its saved P instead, counted as a term).

- naive (autograd of the 3-kernel baseline): the kernels PyTorch runs (`NAIVE_BWD`: softmax's backward a
  product then the reduction, baddbmm's scale a product on dQ and dK), the saved P (causal: the bool mask,
  one [N, N] for every head) read cold, every other [N, N] and [N, d] intermediate re-read and written back
  at its reuse distance (`stream_reuse`: the forward's miss rule at `L2Params.capacity`), x
  `FamilyParams.naive_bwd_s_dram`.
- attnscope (kernels/bwd.py `flash_attention_backward`): the preprocess reads O and dO and writes Delta,
  the LSE2 copy is written; a dK/dV kernel per (batch, kv head, 128-key tile) streams Q, dO, LSE2, Delta of
  every query tile of the GQA group; dQ either by fp32 atomics (portable, ``deterministic=False``; the
  Hopper one-pass build, ``deterministic=False`` at `HOPPER_ONEPASS_DIMS`: a zeroed fp32 buffer,
  read-modify-writes per tile pair, a cast) or by a dQ kernel per query tile (the Hopper two-kernel build;
  the portable one with ``deterministic=True``) that reads Q, dO, LSE2, Delta again and K/V per query tile.
  The Hopper kernels read their per-row terms from rows padded to `dispatch.HOPPER_BWD_ROW_PAD`, which the
  same preprocess writes: -LSE2 / scale and Delta (plain build), log2(scale) - LSE2 and -Delta (the lean
  build, the default where `dispatch.hopper_backward_lean` says so at the default scale: d = 64), whose
  one-pass fp32 dQ rows are padded too.
- flash (PyTorch's FA-2 ``mha_bwd``): dO and O first copied into its [B, N, H, d] layout (two copy
  kernels), then the same structure per *query* head (grid (key blocks, B, H)): a zeroed fp32 dQ
  accumulator (rows rounded to 128), atomics, a convert kernel; with GQA, dK and dV written per query head
  and summed over the group after the convert.
- The fp32 dQ accumulator of the atomic builds reaches DRAM only when evicted (`_gap_miss`: the share
  evicted over each gap, at the L2's whole capacity: atomics resolve at a line's one home slice): its
  zeros written back and re-read by the first atomic add of each line, the sums written back and re-read
  by the cast, and the rest written back by the end of the cast's stream; four times the accumulator when
  the L2 cannot hold it.
- cudnn (closed source; its kernels' names and per-kernel bytes show FA-2's structure): FA-2's terms
  without the layout copies: Delta and a zeroed fp32 dQ (compute_dot_do_o), atomics, a convert, and with
  GQA dK, dV per query head summed by its reduce kernels.
- A call whose footprint (compulsory bytes and every buffer it writes) fits the L2 evicts nothing: its
  writes stay dirty (ncu counts none) and its re-reads hit, so it moves its compulsory reads only. The
  share of the bytes beyond those reads kept so is 1 - the forward's rule (`l2_params.miss` at
  `L2Params.capacity`) at the footprint, a credit beside the dirty dQ's (`RESIDENT`).
- attnscope's query set of a GQA group larger than the L2 (the key tiles' walkers evict each other's
  rows) is not modelled: the estimate refuses.

Re-reads of Q, dO, LSE2, Delta and the fp32 dQ rows (touched together by each key tile) and K/V by the
dQ kernel's query tiles: unmasked, the forward's lockstep wave rule as it stands, one definition
(`l2_reuse.wave_rereads`: CTAs of a set consecutive in the grid, C at a time; what the L2 keeps at the
forward's measured capacities); causal, FA-2's key tiles walk from the end (the wave rule) and attnscope's
from their diagonal forward (`l2_reuse.diagonal_walk_share`: successive readers of a row drift apart by a
head's walk per head of the group, so the distance is the band the live walkers sweep), each x the build's
probe constant. A term whose constant is None refuses
(`NotMeasured`, naming it and its probe); a term whose counted bytes are 0 needs none. Pure Python; cost
independent of N.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from attnscope.errors import choice, expect, positive_int
from attnscope.model import dispatch
from attnscope.model.dispatch import HOPPER_BWD_ROW_PAD as ROW_PAD
from attnscope.model.family_estimate import (
    CREDIT,
    FamilyEstimate,
    _dirty_o,
    _heads,
    _l2_bytes,
    _sms,
    attnscope_window,
    capped,
    unwindowed_terms,
)
from attnscope.model.family_params import H200_FAMILY_PARAMS, FamilyParams, need
from attnscope.model.l2_params import H200_L2_PARAMS, mean_miss, miss
from attnscope.model.l2_reuse import diagonal_walk_share, wave_rereads
from attnscope.model.tiles import Grid, hides_keys, normalize_window, window_span
from attnscope.model.traffic import DTYPE_BYTES, STAT_BYTES
from attnscope.model.window_estimate import band_rereads, group_gap_miss

#: `diagonal_walk_share` of the same geometry (it reads no FamilyParams constant): a fit over the probe rows
#: (measure/family_fit.py) asks for each row's share once per constant and onset searched, ~90 % of its time
_walk_share = functools.lru_cache(maxsize=1024)(diagonal_walk_share)

BACKWARD_IMPLS = ("naive", "flash", "cudnn", "attnscope")
KERNEL_CHOICES = ("auto", "portable", "hopper")


class BwdKernel(NamedTuple):
    """The tiles of a backward build: dK/dV, ``kv`` keys per CTA against ``q``-row query tiles; dQ,
    ``dq_rows`` query rows per CTA against ``dq_kv``-key tiles (0: no dQ kernel); ``ctas_per_sm``
    co-resident CTAs (assumed 1: each build holds most of an SM's registers or shared memory)."""

    q: int
    kv: int
    dq_rows: int
    dq_kv: int
    ctas_per_sm: int = 1


#: build -> {head dim: BwdKernel}, read from the sources: kernels/bwd.py DKDV_CONFIGS / DQ_CONFIGS,
#: kernels/bwd_hopper.py CONFIGS (dQ: NWG x BM rows), PyTorch's FA-2 flash_bwd_launch_template.h
#: (`run_mha_bwd_hdim64` / ``128`` with 144 KiB of shared memory, as the H200 has: kBlockM 128 / 64,
#: kBlockN 128); cuDNN's taken as FA-2's. tests/test_backward_estimate.py checks attnscope's against the
#: kernels.
_FA2 = {64: BwdKernel(128, 128, 0, 0), 128: BwdKernel(64, 128, 0, 0)}
BWD_KERNELS = {"portable": dict.fromkeys((64, 128), BwdKernel(32, 128, 128, 64)),
               "hopper": dict.fromkeys((64, 128), BwdKernel(64, 128, 128, 128)), "flash": _FA2, "cudnn": _FA2}
#: Head dims at which the Hopper kernels' ``deterministic=False`` runs the one-pass build (atomic dQ inside
#: the dK/dV kernel; kernels/bwd.py HOPPER_ONEPASS_DIMS). Elsewhere it runs the two kernels.
HOPPER_ONEPASS_DIMS = (64,)
#: FA-2 rounds the fp32 dQ accumulator's rows to 128 (flash_api.cpp mha_bwd ``seqlen_q_rounded``).
FLASH_DQ_ROUND = 128
RESIDENT = ("the call's footprint (compulsory bytes and every buffer it writes) within the L2: no line is "
            "evicted, so its writes stay dirty (ncu counts none) and its re-reads hit; the share kept is 1 - "
            "the forward's miss rule (`l2_params.miss` at `L2Params.capacity`) at that footprint")
DIRTY_DQ = ("dQ still dirty in the write-back L2 when the call ends (ncu counts a write only when its line "
            "is written back): the forward's rule for O (model/l2.py `DIRTY_O`), dQ being written last")


def _dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16"))]


def _hopper(kernels: str, d: int, causal: bool) -> bool:
    """Whether attnscope's backward runs the Hopper kernels on an sm_90 GPU for ``kernels`` (as
    `flash_attention_backward`'s ``impl``): "hopper", or "auto" where `model.dispatch.hopper_backward_ok`
    says so."""
    return kernels == "hopper" or (kernels == "auto" and dispatch.hopper_backward_ok(d, causal))


def dq_by_atomics(kernels: str, d: int, causal: bool, deterministic: bool) -> bool:
    """Whether attnscope's backward on an sm_90 GPU (``impl=kernels``, `KERNEL_CHOICES`) accumulates dQ by
    fp32 atomics inside the dK/dV kernel (``deterministic=False``: the portable kernels, or the Hopper
    one-pass build at `HOPPER_ONEPASS_DIMS`) rather than in a dQ kernel of its own (``deterministic=True``,
    or the Hopper kernels' two-kernel build at the other head dims)."""
    choice("kernels", kernels, KERNEL_CHOICES)
    return not deterministic and (not _hopper(kernels, d, causal) or d in HOPPER_ONEPASS_DIMS)


def backward_compulsory(impl: str, n: int, *, d: int = 128, dtype: str = "fp16", batch: int = 1,
                        heads: int = 32, kv_heads: int | None = None) -> int:
    """Q, K, V, dO read and dQ, dK, dV written once, and for the fused backwards O and the fp32 LSE read
    once: the least the gradient call moves, whole call (naive's autograd reads its saved P instead)."""
    choice("impl", impl, BACKWARD_IMPLS)
    h, hkv = _heads(heads, kv_heads)
    b, bsz = _dtype_bytes(dtype), positive_int("batch", batch)
    comp = bsz * positive_int("n", n) * positive_int("d", d) * b * ((2 * h + 2 * hkv) + (h + 2 * hkv))
    if impl != "naive":
        comp += bsz * h * n * (d * b + STAT_BYTES)  # O and LSE
    return comp


def q_rows_per_key_pass(n: int, q: int, kv: int, causal: bool, window=None) -> int:
    """Query rows the dK/dV kernel's key tiles of ``kv`` keys read over one head (``q``-row tiles): key tile
    j reads every query tile holding a row that sees one of its keys (causal, square: rows >= its first
    key). The forward's grid transposed: keys as the rows, the mask's window mirrored (causal: (0, -1); a
    sliding window (left, right): (right, left))."""
    left, right = normalize_window(causal, window)
    g = Grid(n, n, kv, q) if (left, right) == (-1, -1) else Grid(n, n, kv, q, window=(right, left))
    return g.kv_rows_total()


def _miss_share(footprint: float, l2: int) -> float:
    """Share of re-reads after ``footprint`` bytes of other traffic that reach DRAM: the forward's rule
    (`l2_params.miss` at the measured `L2Params.shared` capacity and ramp)."""
    p = H200_L2_PARAMS
    return miss(footprint / (p.shared * l2), p.shared_ramp)


def _gap_miss(before: float, after: float, l2: int) -> float:
    """Mean share of the fp32 dQ accumulator's lines that reach DRAM between two passes over it in the same
    order: the line at fraction x of the buffer is touched again after the rest of the first pass's stream,
    ``before`` x (1 - x) bytes, and the part of the second's before it, ``after`` x x bytes (its fill, then
    the dK/dV kernel's stream, then the cast). The distance is linear in x, from ``before`` to ``after``:
    `mean_miss` of the forward's rule at the L2's whole capacity (`L2Params.capacity`, ``ramp``), not the
    ``shared`` one of lines read by SMs of both partitions: the accumulator is only written and
    atomically added to, which the L2 does at the line's one home slice, so no copy of it takes room in the
    other partition."""
    p = H200_L2_PARAMS
    return mean_miss(before / (p.capacity * l2), after / (p.capacity * l2), p.ramp)


def _set_rereads(sets: int, per_set: int, c: int, set_bytes: float, other: float, causal: bool,
                 walk_from_end: bool, l2: int, share: float = 1.0, heads: int = 1) -> float:
    """Bytes re-read from DRAM beyond one read of each of ``sets`` sets, each read by ``per_set``
    consecutive CTAs (of ``heads`` query heads in turn), C at a time: `l2_reuse.wave_rereads` (the
    forward's rule) with the forward's parameters for lockstep, wide and other sets (model/l2.py
    `_fused`)."""
    p = H200_L2_PARAMS
    kv_params = p.for_shared() if causal else p.for_lockstep() if per_set <= c else p.for_wide()
    amp = wave_rereads(sets, per_set, c, set_bytes, other * p.qo_weight(), causal, walk_from_end, "head",
                       l2_bytes=l2, share=share, heads_per_set=heads, params=kv_params)
    return (amp - 1.0) * sets * set_bytes


def _scaled(terms: list, name: str, logical: float, params: FamilyParams, field: str, what: str,
            text: str) -> None:
    """Append ``(name, logical x params.field, text)`` when ``logical`` > 0 (the constant only then)."""
    if logical > 0:
        f = 1.0 if field is None else need(params, field, what)
        terms.append((name, logical * f, f"{text} ({logical:,.0f} B counted, x {f})"))


#: The kernels autograd runs for the naive baseline's backward (measure/backends.py `naive_attention`), in
#: launch order, as ncu names them on the H200 (every naive point of bench/results/
#: h200-2026-12-02-heldout-backward.json.gz): (what, tensors read, tensors written). P, dP, T, dS, dS' are
#: [B x H, N, N] in the input dtype (the forward saved P); the rest [B, H, N, d]. Softmax's backward is two
#: kernels (a product T = dP * P, then dS = T - P rowsum(T)); baddbmm's alpha is a product on dQ and on dK
#: after their GEMMs. Causal, the masked_fill backward (`NAIVE_MASK`) runs after softmax's and the GEMMs
#: read its dS'.
NAIVE_BWD = (("dV = P^T dO (GEMM)", ("P", "dO"), ("dV",)),
             ("dP = dO V^T (GEMM)", ("dO", "V"), ("dP",)),
             ("T = dP * P", ("dP", "P"), ("T",)),
             ("dS = T - P rowsum(T) (softmax backward)", ("T", "P"), ("dS",)),
             ("dQ0 = dS K (GEMM)", ("dS", "K"), ("dQ0",)),
             ("dQ = scale dQ0", ("dQ0",), ("dQ",)),
             ("dK0 = dS^T Q (GEMM)", ("dS", "Q"), ("dK0",)),
             ("dK = scale dK0", ("dK0",), ("dK",)))
NAIVE_MASK = ("dS' = masked_fill backward", ("dS", "mask"), ("dS'",))
#: What the naive call reads cold: its inputs (compulsory) and what the forward saved (P; causal, the mask).
NAIVE_COLD = ("Q", "K", "V", "dO", "P", "mask")
NAIVE_OUT = ("dQ", "dK", "dV")
DIRTY_NAIVE = ("dQ, dK, dV still dirty in the write-back L2 when the call ends: each output's share that its "
               "reuse distance to the call's end keeps (the forward's miss rule)")


def naive_kernels(causal: bool) -> tuple:
    """`NAIVE_BWD` with, causal, `NAIVE_MASK` after softmax's backward and the GEMMs reading its dS'."""
    if not causal:
        return NAIVE_BWD
    swap = tuple((w, tuple("dS'" if t == "dS" else t for t in r), o) for w, r, o in NAIVE_BWD[4:])
    return (*NAIVE_BWD[:4], NAIVE_MASK, *swap)


def stream_reuse(kernels: tuple, size: dict, cold: tuple, cap: float, ramp: float) -> dict:
    """DRAM traffic of a chain of kernels that each stream their tensors once, in the same order, through an
    L2 of ``cap`` bytes (the forward's rule: `l2_params.miss` with ``ramp``). A tensor touched in kernel a and
    read again in kernel k misses at its reuse distance, the distinct bytes touched in between: for its line
    at fraction x, the rest of kernel a's stream, every kernel between and the first x of kernel k's, from the
    tensors of kernels a .. k - 1 (x = 0) to those of a + 1 .. k (x = 1), linear in x (`mean_miss`). A written
    line reaches DRAM once, when evicted dirty: its largest miss share over its gaps, the last one to the
    call's end. Returns {"cold": bytes of the ``cold`` tensors' first reads, "rereads": bytes read again from
    DRAM, "writebacks": {tensor: share written back}}."""
    touched = [set(r) | set(w) for _, r, w in kernels]

    def distinct(a: int, k: int) -> float:  # bytes of the tensors kernels a .. k - 1 touch
        return sum(size[t] for t in set().union(*touched[a:k]))

    def share(a: int, k: int) -> float:  # mean miss from kernel a's touch to kernel k's (len: the call's end)
        return mean_miss(distinct(a, k) / cap, distinct(a + 1, k + 1) / cap, ramp)

    last, gaps = {}, {}
    out = {"cold": 0.0, "rereads": 0.0, "writebacks": {}}
    for k, (_, reads, writes) in enumerate(kernels):
        for t in reads:
            if t not in last:
                assert t in cold, (t, cold)
                out["cold"] += size[t]
            else:
                m = share(last[t], k)
                out["rereads"] += m * size[t]
                if t in gaps:
                    gaps[t].append(m)
            last[t] = k
        for t in writes:
            last[t], gaps[t] = k, []
    for t, g in gaps.items():
        out["writebacks"][t] = max([*g, share(last[t], len(kernels))])
    return out


def _naive(comp: int, n: int, d: int, b: int, bsz: int, h: int, causal: bool, l2: int, params: FamilyParams,
           what: str) -> FamilyEstimate:
    """The naive baseline's autograd (`NAIVE_BWD`): its saved P (causal: and the bool mask, one [N, N] for
    every (batch, head), cold once and re-read per head at the forward's naive rule) read cold, every other
    [N, N] re-read and write-back at its reuse distance (`stream_reuse` at `L2Params.capacity`), x
    `FamilyParams.naive_bwd_s_dram`; dQ, dK, dV still dirty at the end as the credit."""
    p = H200_L2_PARAMS
    bh = bsz * h
    s, q = bh * n * n * b, bh * n * d * b
    kernels = naive_kernels(causal)
    size = dict.fromkeys(("P", "dP", "T", "dS", "dS'"), s) | dict.fromkeys(
        ("Q", "K", "V", "dO", "dQ0", "dQ", "dK0", "dK", "dV"), q) | {"mask": n * n}
    r = stream_reuse(kernels, size, NAIVE_COLD, p.capacity * l2, p.ramp)
    terms = [("saved_p", s, "P [B x H, N, N] saved by the forward, read cold by the dV GEMM")]
    facts = {"kernels": len(kernels), "square_footprint_l2": s / l2}
    if causal:  # the same [N, N] mask for every (batch, head): cold once, then re-read one head's dS and dS'
        # later (the forward's naive rule, model/l2.py `_naive`)
        again = miss((2 * b + 1) * n * n / (p.capacity * l2), p.ramp)
        terms.append(("mask", n * n * (1.0 + (bh - 1) * again), f"the bool mask [N, N], cold once, then "
                      f"re-read by each of the {bh - 1} other (batch, head)s x {again:.2f} missing"))
    inter = r["rereads"] + sum(share * size[t] for t, share in r["writebacks"].items() if t not in NAIVE_OUT)
    _scaled(terms, "intermediates", inter, params, "naive_bwd_s_dram", what,
            f"{len(kernels)} kernels' [N, N] and [N, d] intermediates re-read and written back past the L2 "
            "(each at its reuse distance: the forward's miss rule)")
    kept = sum((1.0 - r["writebacks"][t]) * size[t] for t in NAIVE_OUT)
    terms.append((CREDIT, -kept, DIRTY_NAIVE))
    return FamilyEstimate("backward", "naive", comp, tuple(terms), facts)


def backward_estimate(impl: str, n: int, *, causal: bool = False, d: int = 128, dtype: str = "fp16",
                      batch: int = 1, heads: int = 32, kv_heads: int | None = None,
                      deterministic: bool = False, kernels: str = "auto", sms: int | None = None,
                      l2_bytes: int | None = None, device: str = "h200",
                      params: FamilyParams = H200_FAMILY_PARAMS, window=None) -> FamilyEstimate:
    """Estimated DRAM bytes of one backward call (q, dO [B, H, N, d]; k, v [B, Hkv, N, d]), whole call.

    Parameters
    ----------
    impl: "naive", "flash", "cudnn" (autograd through SDPA's backends) or "attnscope"
        (`flash_attention_backward` given O and LSE).
    n, causal, d, dtype, batch, heads, kv_heads: the call's shape (square, N queries and keys; naive MHA).
    deterministic: attnscope's dQ in its own pass (True) or by fp32 atomics (False).
    kernels: attnscope's build ("auto" as `flash_attention_backward` on an sm_90 GPU: the Hopper kernels
        where `model.dispatch.hopper_backward_ok` says so; their one-pass build with ``deterministic=False``
        at `HOPPER_ONEPASS_DIMS`, the lean build where `model.dispatch.hopper_backward_lean` says so at the
        default scale, no softcap).
    sms, l2_bytes, device: the GPU's SM count and L2 (default: the device table's).
    params: the constants (`FamilyParams`); a term whose constant is None raises `NotMeasured`.
    window: attnscope's sliding window ``(left, right)`` (causal bounds the right; None: none): each key
        tile's CTA reads the band of query rows that see its keys (the window mirrored), and the dQ kernel's
        query tiles their K/V bands; both re-read as the window forward's band walk
        (`model.window_estimate.band_rereads`: in-wave, at wave boundaries, and a GQA group's later heads
        in the dQ kernel) at the forward's L2 capacities, with no probe constant, each at most the call's
        without the window (`model.family_estimate.unwindowed_terms`); the rest as without.

    Returns
    -------
    FamilyEstimate (family "backward"): compulsory (`backward_compulsory`) and the terms, each >= 0 but the
    dirty-dQ credit.
    """
    choice("impl", impl, BACKWARD_IMPLS)
    choice("kernels", kernels, KERNEL_CHOICES)
    expect(isinstance(causal, bool), "causal", "True or False", causal)
    expect(isinstance(deterministic, bool), "deterministic", "True or False", deterministic)
    h, hkv = _heads(heads, kv_heads)
    b = _dtype_bytes(dtype)
    n, d, bsz = positive_int("n", n), positive_int("d", d), positive_int("batch", batch)
    comp = backward_compulsory(impl, n, d=d, dtype=dtype, batch=bsz, heads=h, kv_heads=hkv)
    l2, c = _l2_bytes(l2_bytes, device), _sms(sms, device)
    bh, bkv, g = bsz * h, bsz * hkv, h // hkv
    row = 2 * d * b + 2 * STAT_BYTES  # a query row's Q, dO, LSE2 (LSE), Delta
    qd = bh * n * d * b  # Q (= dO = O = dQ) bytes
    what = f"backward {impl}"
    terms: list = []
    facts: dict = {"group": g}
    win = attnscope_window(what, impl, causal, window)
    if win is not None:
        facts["window"] = list(win)
        if not hides_keys(n, n, causal, win):  # the kernels walk what they walk without one
            win = None
    if impl == "naive":
        if hkv != h:
            raise NotImplementedError(f"{what}: kv_heads {hkv} != heads {h}; supported: MHA (the naive "
                                      "baseline repeats no kv head)")
        return _naive(comp, n, d, b, bsz, h, causal, l2, params, what)

    build, lean = impl, False
    pad = -(-n // ROW_PAD) * ROW_PAD  # rows of the Hopper build's padded copies
    if impl == "attnscope":
        hopper = _hopper(kernels, d, causal)
        build = "hopper" if hopper else "portable"
        if hopper and d not in dispatch.HOPPER_BACKWARD_DIMS:
            raise NotImplementedError(f"{what}: the Hopper kernels are built for head dims "
                                      f"{dispatch.HOPPER_BACKWARD_DIMS}, got {d}")
        atomic = dq_by_atomics(kernels, d, causal, deterministic)
        onepass = hopper and atomic
        lean = hopper and dispatch.hopper_backward_lean(d, dtype)  # the default scale, no softcap
        deterministic = not atomic  # the two kernels' dQ kernel, or the portable one's with deterministic
        if hopper:
            facts |= {"build": "lean" if lean else "plain", "mode": "onepass" if onepass else "twokernel"}
    if d not in BWD_KERNELS[build]:
        raise NotImplementedError(f"{what}: head dim {d} is not modelled; supported: "
                                  f"{sorted(BWD_KERNELS[build])}")
    ker = BWD_KERNELS[build][d]
    conc = c * ker.ctas_per_sm
    per_set = -(-n // ker.kv)  # key tiles: the CTAs of one set
    facts |= {"kernels": build, "key_tiles": per_set}
    # the preprocess: O and dO read (compulsory: dO is read again by the dK/dV kernel), Delta written
    stats = bh * n * STAT_BYTES
    terms.append(("delta", stats, "the preprocess writes Delta = rowsum(dO O), fp32 per row"))
    scratch = stats  # bytes of the buffers the call writes besides dQ, dK, dV (its footprint beyond comp)
    if impl == "attnscope":
        terms.append(("lse2", stats, "LSE x log2(e) written, fp32 per row"))
        scratch += stats
        if build == "hopper":
            scratch += 2 * bh * pad * STAT_BYTES  # the two padded rows
            what_rows = "log2(scale) - LSE2 and -Delta" if lean else "LSE2 / -qk_scale and Delta"
            terms.append(("padded_rows", 2 * bh * pad * STAT_BYTES,
                          f"the preprocess also writes {what_rows} into rows padded to {ROW_PAD}, fp32"))
    share = _miss_share(2 * qd + stats, l2)
    if share > 0:
        terms.append(("do_reread", qd * share, "dO read again after the preprocess's O and dO, x "
                                               f"{share:.2f} missing the L2 (the forward's rule)"))
    # Q, dO, LSE2, Delta re-read by the key tiles: sets per (batch, kv head) (attnscope: its dK/dV CTA loops
    # over the group) or per (batch, query head) (FA-2's grid)
    sets, set_rows = (bkv, g * n) if impl == "attnscope" else (bh, n)
    rows = q_rows_per_key_pass(n, ker.q, ker.kv, causal, win)
    frac = rows / (per_set * n)  # mean share of the set a key tile reads
    other = 4 * ker.kv * d * b  # a CTA's K, V tile in, dK, dV out
    fa2 = impl in ("flash", "cudnn")  # FA-2's kernels: per query head, atomic dQ, dK/dV summed over the group
    atomic = fa2 or not deterministic
    acc_row = d * STAT_BYTES if atomic else 0  # a row's fp32 dQ, touched with its Q, dO by each key tile
    facts["q_set_l2"] = set_rows * row / l2
    field = {"attnscope": f"{build}_bwd_reread_dram", "flash": "flash_bwd_reread_dram",
             "cudnn": "cudnn_bwd_reread_dram"}[impl]
    if impl == "attnscope" and atomic and build == "hopper":
        field = "onepass_bwd_reread_dram"
    if win is not None:  # key tiles walking their bands of query rows, each over the group's heads in turn
        p = H200_L2_PARAMS
        width = window_span(win, n)
        band, bf = band_rereads(n, per_set, conc, ker.kv, ker.q, width, rows - n, row + acc_row,
                                other * p.qo_weight(), p.shared * l2, p.shared_ramp, in_turn=g)
        facts |= {"band_" + k: v for k, v in bf.items()}
        caps = unwindowed_terms(lambda: backward_estimate(
            impl, n, causal=causal, d=d, dtype=dtype, batch=bsz, heads=h, kv_heads=hkv,
            deterministic=deterministic, kernels=kernels, sms=sms, l2_bytes=l2_bytes, device=device,
            params=params))
        rereads = capped(sets * g * band * row, caps, "q_rereads", facts)
        rmw = capped(2 * sets * g * band * acc_row, caps, "dq_atomics", facts) / 2
        how = "at the band walk's reuse distances (model/window_estimate.py band_rereads)"
    elif impl == "attnscope" and causal:  # walkers from the diagonal forward: `l2_reuse.diagonal_walk_share`
        p = H200_L2_PARAMS
        walk = _walk_share(sets, per_set, -(-n // ker.q), ker.kv / ker.q, g, conc,
                                   ker.q * (row + acc_row), p.shared * l2, p.shared_ramp)
        counted = sets * g * (rows - n)  # query rows read beyond once, over the group's heads
        facts["walk_miss"] = walk
        rereads, rmw = counted * row * walk, counted * acc_row * walk
        how = "at the diagonal walkers' reuse distances (l2_reuse.diagonal_walk_share)"
    else:  # the wave rule on the rows and their fp32 dQ, touched together
        both = _set_rereads(sets, per_set, conc, set_rows * (row + acc_row), other, causal, True, l2, frac)
        rereads, rmw = both * row / (row + acc_row), both * acc_row / (row + acc_row)
        how = "at the forward's wave rule"
    if impl == "attnscope" and win is None and rereads > 0 and set_rows * row > l2:
        raise NotImplementedError(f"{what}: the dK/dV kernel's query set (Q, dO, LSE2, Delta of the {g} "
                                  f"query heads of a kv head: {facts['q_set_l2']:.2f} x the L2) is larger "
                                  "than the L2, where the key tiles' walkers evict each other's rows (probe "
                                  "h-group: 5 x the re-reads the wave rule counts): not modelled; supported: "
                                  "query sets within the L2")
    if not causal or win is not None:  # lockstep waves or bands: the forward's rules as they stand
        field = None
    _scaled(terms, "q_rereads", rereads, params, field, what, "Q, dO, LSE2, Delta re-read by later key "
            f"tiles, missing the L2 {how}")
    kv_w = 2 * (bh if fa2 else bkv) * n * d * b  # dK, dV as written (FA-2: per query head)
    if impl == "flash":  # _flash_attention_backward: grad_out.contiguous(), out.contiguous() ([B, N, H, d])
        terms.append(("layout_copies", 4 * qd, "dO and O copied into FA-2's [B, N, H, d] layout: two copy "
                                               "kernels, each reading and writing a [B, H, N, d] tensor"))
    acc = 0
    if atomic:  # a zeroed fp32 dQ, read-modify-written per tile pair, cast to dQ
        # FA-2 rounds the rows to 128, the lean Hopper build pads them (unmasked reductions)
        acc_rows = -(-n // FLASH_DQ_ROUND) * FLASH_DQ_ROUND if impl == "flash" else pad if lean else n
        acc = bh * acc_rows * d * STAT_BYTES
        scratch += acc
        # the dK/dV kernel's stream: Q, dO, K, V, LSE, Delta read, dK, dV written, the accumulator touched
        stream = 2 * qd + 2 * bkv * n * d * b + 2 * stats + kv_w + acc
        fill = acc + (2 * qd if fa2 else 0)  # FA-2 zeroes it in the preprocess (O, dO read)
        first, cast = _gap_miss(fill, stream, l2), _gap_miss(stream, acc + qd, l2)
        last = _gap_miss(acc + qd, 0.0, l2)  # a line the cast read, evicted by the rest of the cast's stream
        facts |= {"acc_first_touch_miss": first, "acc_cast_miss": cast, "acc_end_writeback": last}
        terms.append(("dq_acc", acc * (2.0 * first + 2.0 * cast + (1.0 - cast) * last),
                      "fp32 dQ accumulator (a dirty line reaches DRAM only when evicted): the zeros evicted "
                      f"before the atomics' first add, written back and read again (2 x {first:.2f}); the "
                      f"sums evicted before the cast, written back and read by it (2 x {cast:.2f}); the rest "
                      f"written back after the cast read them, evicted by its stream before the call ends "
                      f"({1.0 - cast:.2f} x {last:.2f})"))
        _scaled(terms, "dq_atomics", 2 * rmw, params, field, what, "fp32 dQ lines evicted between the key "
                f"tiles' atomic adds, read and written back {how} (the re-reads' constant: both follow "
                "the key tiles)")
    else:  # the dQ kernel: Q, dO, LSE2, Delta once more, K/V per query tile of every head of the group
        share = _miss_share(comp, l2)  # between the two kernels: the dK/dV kernel's whole stream
        kv_set = 2 * n * d * b
        if share > 0:
            terms.append(("dq_pass", (bh * n * row + bkv * kv_set) * share, "the dQ kernel reads Q, dO, "
                          f"LSE2, Delta and K, V once more after the dK/dV kernel, x {share:.2f} missing"))
        gq = Grid(n, n, ker.dq_rows, ker.dq_kv, causal=causal, window=win)
        per_q = gq.n_q_tiles * g  # the group's query heads adjacent in the (tiles, B x H) grid
        kv_frac = gq.kv_rows_total() / (gq.n_q_tiles * n)
        if win is None:
            kv_re = _set_rereads(bkv, per_q, conc, kv_set, 3 * ker.dq_rows * d * b, causal, False, l2,
                                 kv_frac, g)  # other: a CTA's Q, dO tiles in, dQ out
        else:  # the window forward's band walk and group gap, with the dQ kernel's tiles
            p = H200_L2_PARAMS
            other_q = 3 * ker.dq_rows * d * b * p.qo_weight()
            together = min(g, max(1, conc // gq.n_q_tiles))
            band_q, qf = band_rereads(n, gq.n_q_tiles, conc, ker.dq_rows, ker.dq_kv, width,
                                      gq.kv_rows_total() - n, 2 * d * b, other_q, p.shared * l2,
                                      p.shared_ramp, together)
            m_g, _ = group_gap_miss(n, gq.n_q_tiles, conc, ker.dq_rows, width, 2 * d * b, other_q, 1,
                                    qf["wave_room"], p.shared * l2, p.shared_ramp)
            kv_re = capped(bkv * (g * band_q + (g - 1) * n * m_g) * 2 * d * b, caps, "kv_rereads", facts)
        _scaled(terms, "kv_rereads", kv_re, params, field, what,
                "K, V re-read by the dQ kernel's later query tiles, missing the L2")
    if impl == "flash":
        scratch += 2 * qd  # the layout copies
    if fa2 and g > 1:  # dK, dV per query head, summed over the group (torch; cuDNN's reduce kernels)
        expanded = kv_w
        scratch += expanded
        back = _miss_share(expanded + acc + qd, l2)  # the convert kernel (acc read, dQ written) runs between
        terms.append(("gqa_expand", expanded - 2 * bkv * n * d * b + expanded * back,
                      f"dK, dV written per query head ({g} per kv head) and read back by the group sum "
                      f"after the dQ convert, x {back:.2f} missing the L2"))
        kv_gap = _miss_share(bsz * (n * row + 2 * n * d * b), l2)
        if kv_gap > 0:
            terms.append(("gqa_kv", (g - 1) * bkv * 2 * n * d * b * kv_gap,
                          f"K, V read again by the group's {g - 1} other query heads, {bsz} set(s) apart"))
    credit, kept, _ = _dirty_o(qd, comp - 2 * qd, qd, l2)  # dQ, written last, as the forward's O
    # the call's footprint within the L2: nothing evicted, so no write reaches DRAM and no re-read misses
    reads = comp - qd - 2 * bkv * n * d * b  # the compulsory reads: cold whatever the L2 holds
    fits = 1.0 - miss((comp + scratch) / (H200_L2_PARAMS.capacity * l2))
    facts["footprint_l2"] = (comp + scratch) / l2
    total = comp + sum(t[1] for t in terms) + kept
    why = DIRTY_DQ
    if fits > 0:
        kept -= fits * (total - reads)
        why = (f"{RESIDENT} ({fits:.2f} of the bytes beyond the compulsory reads at "
               f"{facts['footprint_l2']:.2f} x L2); the rest as: {DIRTY_DQ}")
    terms.append((credit, kept, why))
    return FamilyEstimate("backward", impl, comp, tuple(terms), facts)
