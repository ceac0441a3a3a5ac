#!/usr/bin/env bash
# Held-out grid 11 (issue 18; drawn 2026-12-01 ~11:10 UTC by bench/grids/draw_heldout11.py, after the
# l2.head_gap_rereads change): see bytes_heldout.sh. Run at the commit the model was frozen at (env.txt records it). ~1.5-2.5 min on one H200.
ATTNSCOPE_NCU_TIMEOUT_S=100 exec bash "$(dirname "$0")/bytes_heldout.sh" heldout11 120
