#!/usr/bin/env bash
# Held-out grid 3 (issue 18; run 2026-12-01 03:30 UTC, BENCHMARKS.md): see bytes_heldout.sh.
ATTNSCOPE_NCU_TIMEOUT_S=120 exec bash "$(dirname "$0")/bytes_heldout.sh" heldout3 300
