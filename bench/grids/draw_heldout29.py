"""Held-out grid 29 (heldout29.csv), drawn 2026-12-01 after `L2Params.hot_d64` (f21e61e),
before any of its points was measured. Run from the repository root, it prints the CSV rows
(`_draw.print_grid`)."""

from _draw import print_grid

print_grid(29)
