"""Analytic models: pure Python, no torch, no triton, answers in milliseconds.

Each module's docstring says what it holds; `tiles` is the one place of the tile arithmetic and `flops`
the one definition of attention FLOPs. The ledger function is ``attnscope.model.traffic.traffic(n=...)``
(not ``attnscope.model.traffic(n=...)``): rebinding the package attribute to the function would make
``from attnscope.model import traffic`` mean the module or the function depending on import order.
"""
