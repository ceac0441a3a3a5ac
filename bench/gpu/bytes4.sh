#!/usr/bin/env bash
# Held-out grid 4 (issue 18; run 2026-12-01 04:03 UTC, BENCHMARKS.md): see bytes_heldout.sh.
ATTNSCOPE_NCU_TIMEOUT_S=100 exec bash "$(dirname "$0")/bytes_heldout.sh" heldout4 105
