"""A stand-in for ncu in `attnscope bytes --sweep` tests (not a test module): no GPU check, and
`ncu.measure_many` answering from the test's own function."""

from attnscope.measure import ncu
from attnscope.measure.ncu import KernelBytes

#: The L2 and SM flags every stubbed sweep passes (the H200's), so its estimates are the shipped ones.
MACHINE = ("--l2-bytes", "62914560", "--sms", "132")


def point(spec: dict, read: int, write: int, kernel: str = "k") -> ncu.Point:
    """One measured point: a single kernel's DRAM read and write bytes."""
    return ncu.Point(spec, ncu.Measured([KernelBytes(1, kernel, read, write)], "none", "ncu x"))


def stub_sweep(monkeypatch, points) -> None:
    """Make `attnscope bytes --sweep` run without a GPU: ``points(specs)`` gives the `ncu.Point` of each spec,
    reported as one group (``progress`` once, as `ncu.measure_many` does after each group)."""
    from attnscope.cli import gpu

    monkeypatch.setattr(gpu, "gpu_problem", lambda: None)

    def fake_many(specs, cache_control="none", per_child=8, timeout_s=None, progress=None, **kw):
        pts = points(specs)
        if progress is not None:
            progress(pts, len(pts))
        return pts

    monkeypatch.setattr(ncu, "measure_many", fake_many)
