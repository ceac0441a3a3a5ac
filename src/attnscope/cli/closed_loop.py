"""The rows of `attnscope share --project-to`'s closed-loop table (measure/share.py `ClosedLoop`): what was
projected, what was measured (synced, back to back, as graph replays) and where the error comes from."""

from __future__ import annotations


def loop_rows(loop, train: bool) -> list[list[str]]:
    """[label, value] rows of ``loop`` (a `measure.share.ClosedLoop`); ``train``: a training step's loop."""
    a, b = loop.baseline, loop.candidate
    step, alone = ("training step", "attention alone, forward + backward") if train \
        else ("prefill", "attention alone")
    rows = [[f"f_time (profiler, baseline {step})", f"{loop.f_time:.3f}"],
            [f"{alone}: {a} / {b} (ms)", f"{loop.kernel_ms[a]:,.3f} / {loop.kernel_ms[b]:,.3f}"],
            ["S_kernel", f"{loop.s_kernel:.3f}x"],
            [f"projected {step} speedup (Amdahl)", f"{loop.projected:.3f}x"],
            [f"{step}: {a} / {b} (ms)", f"{loop.prefill_ms[a]:,.3f} / {loop.prefill_ms[b]:,.3f}"],
            [f"measured {step} speedup", f"{loop.measured:.3f}x"],
            ["error (projected / measured - 1)", f"{loop.error:+.1%}"]]
    if loop.s_kernel_busy is not None:
        rows += [[f"{alone}, kernel time (profiler, f_time's unit): {a} / {b} (ms)",
                  f"{loop.kernel_busy_ms[a]:,.3f} / {loop.kernel_busy_ms[b]:,.3f}"],
                 ["S_kernel on kernel time", f"{loop.s_kernel_busy:.3f}x"],
                 ["projected on kernel time (Amdahl)", f"{loop.projected_busy:.3f}x"],
                 ["error on kernel time (projected / measured - 1)", f"{loop.error_busy:+.1%}"]]
        if loop.graph_ms:
            rows.append(["error on kernel time against the graph replays", f"{loop.error_busy_graph:+.1%}"])
    if loop.sustained_ms:
        rows += [[f"{step}s back to back (sustained load): {a} / {b} (ms)",
                  f"{loop.sustained_ms[a]:,.3f} / {loop.sustained_ms[b]:,.3f}"],
                 ["measured speedup, sustained", f"{loop.measured_sustained:.3f}x"],
                 ["error, sustained (projected / sustained speedup - 1)", f"{loop.error_sustained:+.1%}"]]
    if loop.s_in_step is not None:  # where the error comes from: both steps profiled
        cs, rest = loop.candidate_share, loop.rest_ms
        rows += [[f"attention in the {step} (profiler): {a} / {b} (ms)",
                  f"{loop.share.attention_ms:,.3f} / {cs.attention_ms:,.3f}"],
                 [f"S in the {step} (alone: S_kernel)", f"{loop.s_in_step:.3f}x"],
                 ["Amdahl with S in the step", f"{loop.projected_in_step:.3f}x"],
                 [f"rest of the {step}, kernels outside attention: {a} / {b} (ms)",
                  f"{rest[a]:,.3f} / {rest[b]:,.3f}"]]
        gap = loop.host_gap_ms
        rows.append([f"GPU idle in the {step} (measured - kernel time): {a} / {b} (ms)",
                     f"{gap[a]:,.3f} / {gap[b]:,.3f}"])
    if loop.graph_ms:
        rows += [[f"{step} as CUDA-graph replays: {a} / {b} (ms)",
                  f"{loop.graph_ms[a]:,.3f} / {loop.graph_ms[b]:,.3f}"],
                 ["measured speedup, graph replays", f"{loop.measured_graph:.3f}x"],
                 ["error on device time (projected / graph speedup - 1)", f"{loop.error_graph:+.1%}"]]
    elif loop.graph_note and not train:
        rows.append([f"{step} as CUDA-graph replays", loop.graph_note])
    if loop.projected_host_aware is not None:
        rows += [[f"host per attention call alone: {a} / {b} (µs)",
                  f"{loop.host_us[a]:,.1f} / {loop.host_us[b]:,.1f}"],
                 [f"host time to issue the {step}: {a} / {b} (ms)",
                  f"{loop.issue_ms[a]:,.3f} / {loop.issue_ms[b]:,.3f}"],
                 ["projected with the host (max(host, device) per step)",
                  f"{loop.projected_host_aware:.3f}x"],
                 ["error, host-aware (projected / measured - 1)", f"{loop.error_host_aware:+.1%}"]]
    return rows
