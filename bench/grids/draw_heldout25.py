"""Held-out grid 25 (heldout25.csv), drawn 2026-12-01 after `l2.launch_fill_share` (74793f4),
before any of its points was measured. Run from the repository root, it prints the CSV rows
(`_draw.print_grid`)."""

from _draw import print_grid

print_grid(25)
