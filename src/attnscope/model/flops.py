"""Attention FLOPs: the one definition every caller uses (benchmarks, plots, the report, the share).

Forward: QK^T and PV are two GEMMs of 2·Nq·Nk·d FLOPs each per (batch, query head), so
``4·B·Hq·Nq·Nk·d``. Causal: the convention of the flash-attn and Triton benchmarks, half of that when
Nq = Nk; when Nq != Nk the exact count of visible (query, key) pairs under bottom-right alignment
(key c visible to query r iff c <= r + Nk - Nq) replaces Nq·Nk. Backward: 2.5 x forward (five GEMMs
of the same size against two: dV, dP, dS->dQ, dS->dK, and the recomputed S). The softmax's elementwise
work is not counted (spec §5.1: it is FLOP-cheap and time-expensive).

GQA/MQA changes nothing here: the work is per query head, K/V sharing only saves bytes.
"""

from __future__ import annotations

from attnscope.errors import InputError, positive_int

BACKWARD_FACTOR = 2.5  # backward FLOPs / forward FLOPs (five GEMMs against two)
PASSES = ("forward", "backward", "forward+backward")


def visible_pairs(nq: int, nk: int, causal: bool) -> int:
    """(query, key) pairs that attend: Nq·Nk unmasked; under bottom-right causal the closed form of
    sum over rows r = 0..Nq-1 of clamp(r + Nk - Nq + 1, 0, Nk): the last min(Nq, Nk) rows see
    max(Nk - Nq, 0) + 1, ..., Nk keys, one more each."""
    positive_int("nq", nq)
    positive_int("nk", nk)
    if not causal:
        return nq * nk
    return (max(nk - nq, 0) + 1 + nk) * min(nq, nk) // 2


def attention_flops(batch: int, q_heads: int, nq: int, nk: int, d: int, causal: bool = False,
                    pass_: str = "forward") -> float:
    """FLOPs of attention for [batch, q_heads, nq, d] queries against nk keys (module docstring).

    Returns a float: the causal convention halves N·N, which need not be an integer count.
    """
    for name, value in (("batch", batch), ("q_heads", q_heads), ("d", d)):
        positive_int(name, value)
    if pass_ not in PASSES:
        raise InputError(f"pass: expected one of {', '.join(PASSES)}, got {pass_!r}")
    pairs = nq * nk / 2 if causal and nq == nk else visible_pairs(nq, nk, causal)
    fwd = 4.0 * batch * q_heads * pairs * d
    return {"forward": fwd, "backward": BACKWARD_FACTOR * fwd,
            "forward+backward": (1 + BACKWARD_FACTOR) * fwd}[pass_]
