"""Held-out grid 24 (heldout24.csv), drawn 2026-12-01 with grid 23's estimate (a replication),
before any of its points was measured. Run from the repository root, it prints the CSV rows
(`_draw.print_grid`)."""

from _draw import print_grid

print_grid(24)
