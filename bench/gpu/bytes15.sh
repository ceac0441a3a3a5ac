#!/usr/bin/env bash
# Held-out grid 15 (issue 18; drawn 2026-12-01 ~12:52 UTC by bench/grids/draw_heldout15.py, after
# r18w, FA-2 causal GQA split by the batch): see bytes_heldout.sh. Run at the commit the model was frozen
# at (env.txt records it). ~1.5-2.5 min on one H200.
ATTNSCOPE_NCU_TIMEOUT_S=100 exec bash "$(dirname "$0")/bytes_heldout.sh" heldout15 120
