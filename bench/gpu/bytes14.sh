#!/usr/bin/env bash
# Held-out grid 14 (issue 18; drawn 2026-12-01 ~11:53 UTC by bench/grids/draw_heldout14.py, after the
# symmetric mean_miss fix): see bytes_heldout.sh. Run at the commit the model was frozen at (env.txt records it). ~1.5-2.5 min on one H200.
ATTNSCOPE_NCU_TIMEOUT_S=100 exec bash "$(dirname "$0")/bytes_heldout.sh" heldout14 120
