"""Amdahl's law on a stated time share (spec §5), and carrying a projection to an outer boundary.

    speedup = 1 / ((1 - f) + f / S)

``f`` is the *time* share of the part being sped up, measured inside a stated boundary (a layer, the
GPU prefill span); ``S`` is that part's own speedup measured on the same shapes. A FLOP share is not a
time share (spec §5.1): the formula accepts any number in [0, 1], the caller must say what it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnscope.errors import InputError, finite_real, short

#: The sensitivity rows of spec §5 (the 15 % / 40 % / 65 % table).
DEFAULT_SENSITIVITY = (0.15, 0.40, 0.65)
#: Accepted kernel speedups: a 1000x slowdown to a 10^6x speedup. Outside this range the projection is
#: no longer a number anyone can defend, and 1/S or f/S leave the float range (S = 1e-320 divides by
#: zero, S = 1e308 prints "inf").
S_MIN, S_MAX = 1e-3, 1e6
#: Longest accepted duration, ms (about 11.6 days): the boundary arithmetic stays exact to print.
MAX_MS = 1e9
#: Shortest nonzero duration accepted, ms (1 ns): a subnormal one (5e-324) makes part / S, and with it
#: the projected inner duration, round to 0 (a division by zero) while the inputs look valid.
MIN_MS = 1e-6


def _check(f: float, s: float, f_name: str = "f", s_name: str = "s") -> None:
    if not (finite_real(f) and 0.0 <= f <= 1.0):
        raise InputError(f"{f_name}: expected a time share in [0, 1], got {short(f)}")
    if not (finite_real(s) and S_MIN <= s <= S_MAX):
        raise InputError(f"{s_name}: expected a kernel speedup in [{S_MIN:g}, {S_MAX:g}], got {short(s)}")


def speedup(f: float, s: float) -> float:
    """Overall speedup when a part taking time share ``f`` gets ``s`` times faster."""
    _check(f, s)
    return 1.0 / ((1.0 - f) + f / s)


def reduction(f: float, s: float) -> float:
    """Latency reduction, 1 - 1/speedup (0.1071 for f = 0.15, s = 3.5)."""
    return 1.0 - 1.0 / speedup(f, s)


@dataclass(frozen=True)
class Projection:
    f: float
    s: float
    speedup: float
    reduction: float

    def to_json(self) -> dict:
        return asdict(self)


def project(f: float, s: float) -> Projection:
    return Projection(f=f, s=s, speedup=speedup(f, s), reduction=reduction(f, s))


def sensitivity(s: float, fs=DEFAULT_SENSITIVITY) -> list[Projection]:
    """One projection per time share in ``fs`` for the same kernel speedup ``s``."""
    return [project(f, s) for f in fs]


@dataclass(frozen=True)
class Boundary:
    """A projection carried from an inner boundary to an outer one.

    The inner segment (e.g. GPU prefill, ``inner_ms``) contains the part sped up (``part_ms``, e.g.
    attention); the outer boundary (e.g. client TTFT, ``outer_ms``) adds segments held fixed — an
    assumption the caller must state (queue dwell, network and serialisation do not move).
    """

    part_ms: float
    inner_ms: float
    outer_ms: float
    s: float
    inner_projected_ms: float
    outer_projected_ms: float
    f_inner: float          # part_ms / inner_ms
    inner_speedup: float    # inner_ms / inner_projected_ms
    outer_speedup: float
    inner_reduction: float  # 1 - inner_projected_ms / inner_ms
    outer_reduction: float

    def to_json(self) -> dict:
        return asdict(self)


def carry(part_ms: float, inner_ms: float, outer_ms: float, s: float, names: dict | None = None) -> Boundary:
    """Speed up ``part_ms`` by ``s`` inside ``inner_ms``, and carry the saving to ``outer_ms``.

    Spec exit task: part 116.0 ms of a 290.0 ms prefill inside a 380.0 ms TTFT, S = 3.00 gives a
    212.67 ms prefill (1.3636x) and a 302.67 ms TTFT (1.2555x).

    Durations are 0 or in [`MIN_MS`, `MAX_MS`]: the projected inner and outer durations are then > 0.

    names: what the caller's user calls each argument ({"part_ms": "--part-ms", ...}), so an error
    names the input field, not this function's parameter.
    """
    n = {"part_ms": "part_ms", "inner_ms": "inner_ms", "outer_ms": "outer_ms", "s": "s", **(names or {})}
    for name, v in (("part_ms", part_ms), ("inner_ms", inner_ms), ("outer_ms", outer_ms)):
        if not (finite_real(v) and 0 <= v <= MAX_MS):
            raise InputError(f"{n[name]}: expected a finite duration in [0, {MAX_MS:g}] ms, got {short(v)}")
        if 0 < v < MIN_MS:
            raise InputError(f"{n[name]}: expected 0 or a duration of at least {MIN_MS:g} ms, got {short(v)}")
    if not 0 < inner_ms <= outer_ms:
        raise InputError(f"{n['inner_ms']}: expected 0 < {n['inner_ms']} <= {n['outer_ms']} ({outer_ms:g}), "
                         f"got {inner_ms:g}")
    if part_ms > inner_ms:
        raise InputError(f"{n['part_ms']}: expected at most {n['inner_ms']} ({inner_ms:g} ms), "
                         f"got {part_ms:g}")
    _check(part_ms / inner_ms, s, f_name=f"{n['part_ms']} / {n['inner_ms']}", s_name=n["s"])
    saved = part_ms - part_ms / s
    inner, outer = inner_ms - saved, outer_ms - saved
    return Boundary(part_ms, inner_ms, outer_ms, s, inner, outer, part_ms / inner_ms, inner_ms / inner,
                    outer_ms / outer, 1.0 - inner / inner_ms, 1.0 - outer / outer_ms)
