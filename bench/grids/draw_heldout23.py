"""Held-out grid 23 (heldout23.csv), drawn 2026-12-01 after the hot-set term (`l2.hot_miss`, 7f8563d),
before any of its points was measured. Run from the repository root, it prints the CSV rows
(`_draw.print_grid`)."""

from _draw import print_grid

print_grid(23)
