"""Analytic models: pure Python, no torch, no triton, answers in milliseconds (DESIGN.md, "Layers").

Each module's docstring says what it holds; `tiles` is the one place of the tile arithmetic and `flops`
the one definition of attention FLOPs. DESIGN.md's ``attnscope.model.traffic(n=...)`` is
``attnscope.model.traffic.traffic(n=...)``: rebinding the package attribute to the function would make
``from attnscope.model import traffic`` mean the module or the function depending on import order.
"""
