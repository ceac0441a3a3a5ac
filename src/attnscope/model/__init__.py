"""Analytic models: pure Python, no torch, no triton, answers in milliseconds.

tiles.py     the tile arithmetic (the one place it lives): rows, loaded/skipped/masked KV tiles
traffic.py   logical HBM bytes of the naive baseline and FlashAttention-2, itemised
backward.py  the same ledger for the backward pass; serving.py: a packed batch, a paged KV-cache step
footprint.py the memory scopes of spec §1.2 and §3.3, and shared-memory fit
roofline.py  the device table and the roofline (ridge point, intensity, time floor)
flops.py     attention FLOPs (forward, backward): the one definition
amdahl.py    Amdahl's law, sensitivity, and carrying a projection to an outer boundary

DESIGN.md's ``attnscope.model.traffic(n=...)`` is ``attnscope.model.traffic.traffic(n=...)``: rebinding
the package attribute to the function would make ``from attnscope.model import traffic`` mean the
module or the function depending on import order.
"""
