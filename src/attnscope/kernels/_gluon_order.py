"""The launch order of the one-CTA-per-tile Gluon kernels (sm_90): which tile the CTA launched ``pid``-th
runs (`model.tiles.launch_tile`, the one definition; `model.tiles.launch_tail` picks ``TAIL``). Causal, the
last heads go rank by rank, heaviest tiles first: in the grid's order the last head's heaviest tile started
when little work was left and ran alone at the end of the grid.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def cta_tile(TAIL):
    """(rank, head) of this CTA of a (blocks, heads) grid: `model.tiles.launch_tile` with ``pid`` the CTA's
    launch position (x fastest) and the last ``TAIL`` heads interleaved (1: the grid's own order)."""
    blocks = gl.num_programs(0)
    pid = gl.program_id(1) * blocks + gl.program_id(0)
    lead = (gl.num_programs(1) - TAIL) * blocks
    if pid < lead:
        rank = pid % blocks
        head = pid // blocks
    else:
        rank = (pid - lead) // TAIL
        head = gl.num_programs(1) - TAIL + (pid - lead) % TAIL
    return rank, head
