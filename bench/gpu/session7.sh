#!/usr/bin/env bash
# 2026-12-01 seventh session, one device call: issue 15's per-variant ncu evidence (ncu_variants.sh), then
# issue 18's held-out grid 9 (bytes9.sh). Everything goes into $OUT/all.tgz; the two summaries stay beside it.
O=${OUT:-/tmp/out}; mkdir -p "$O"
cd "$(dirname "$0")/../.." || exit 1
timeout 330 bash bench/gpu/ncu_variants.sh; echo "ncu_variants rc=$?"
timeout 200 bash bench/gpu/bytes9.sh; echo "bytes9 rc=$?"
cp "$O/ncu_variants/tables.md" "$O/tables.md" 2>/dev/null; cp "$O/bytes9/heldout9.log" "$O/heldout9.log" 2>/dev/null
tar czf "$O/all.tgz" -C "$O" ncu_variants bytes9 && rm -rf "$O/ncu_variants" "$O/bytes9"
ls -la "$O"
