"""The package's import graph follows DESIGN.md's layers: no circle, nothing imports from above itself.

Walks every module of src/attnscope with `ast` (imports inside functions count: a lazy import is still
a dependency), so new modules and packages are checked without listing them here.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnscope"

#: DESIGN.md's layers, bottom first; a module may import from its own rank or below. The first dotted
#: prefix of a module's name that is listed decides its rank.
RANKS = {
    "attnscope.errors": 0,
    "attnscope.inputs": 0,         # safe file reading and atomic writes (standard library only)
    "attnscope.model": 1,
    "attnscope.chrome_trace": 1,   # pure-Python trace reader shared by measure/ and report/
    "attnscope.reference": 2,
    "attnscope.kernels": 3,
    "attnscope.distributed": 4,
    "attnscope.checks": 4,         # verify's checks: reference + kernels through the public API
    "attnscope": 4,                # the package root: the public API over kernels/ and distributed/
    "attnscope.measure": 5,
    "attnscope.report": 6,
    "attnscope.cli": 7,
    "attnscope.__main__": 7,
}
#: report/ must never import torch, triton or measure/ (DESIGN.md: the report runs on a laptop).
FORBIDDEN = {"attnscope.report": ("torch", "triton", "attnscope.measure"),
             "attnscope.model": ("torch", "triton"), "attnscope.chrome_trace": ("torch", "triton")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = ("attnscope",) + path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _rank(mod: str) -> int:
    parts = mod.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in RANKS:
            return RANKS[".".join(parts[:i])]
    raise AssertionError(f"{mod}: no layer in RANKS")


def _imports(mod: str) -> set[str]:
    """Every module of the project and every top-level third-party name ``mod`` imports."""
    tree = ast.parse(MODULES[mod].read_text(encoding="utf-8"))
    package = mod if MODULES[mod].name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            if name in MODULES or name.split(".")[0] != "attnscope":
                out.add(name)
            else:  # attnscope.x.y.z where z is a function or class: the deepest module prefix
                parts = name.split(".")
                out.add(next(".".join(parts[:i]) for i in range(len(parts), 0, -1)
                             if ".".join(parts[:i]) in MODULES))
    out.discard(mod)
    return out


GRAPH = {m: {i for i in _imports(m) if i in MODULES} for m in MODULES}


def test_the_walk_sees_the_package():
    assert {"attnscope.chrome_trace", "attnscope.measure.share", "attnscope.report.evidence",
            "attnscope.cli.gpu", "attnscope.model.flops"} <= set(MODULES)
    assert "attnscope.chrome_trace" in GRAPH["attnscope.report.evidence"]
    assert "attnscope.chrome_trace" in GRAPH["attnscope.measure.share"]


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_module_imports_from_a_layer_above_its_own(mod):
    above = sorted(i for i in GRAPH[mod] if _rank(i) > _rank(mod)
                   and not (mod == "attnscope" or i == "attnscope"))  # the root is a facade: see below
    assert not above, f"{mod} (layer {_rank(mod)}) imports from above: {above}"
    for prefix, banned in FORBIDDEN.items():
        if mod == prefix or mod.startswith(prefix + "."):
            bad = sorted(i for i in _imports(mod) if any(i == b or i.startswith(b + ".") for b in banned))
            assert not bad, f"{mod} must not import {bad}"


def test_the_package_root_imports_only_kernels_and_below():
    assert all(_rank(i) <= RANKS["attnscope"] for i in GRAPH["attnscope"]), GRAPH["attnscope"]
    users = sorted(m for m, deps in GRAPH.items() if "attnscope" in deps and _rank(m) < RANKS["attnscope"])
    assert not users, f"modules below the public API import it: {users}"


def test_no_import_circle():
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m, path):
        state[m] = 1
        for n in sorted(GRAPH[m]):
            if n == "attnscope" or m == "attnscope":
                continue  # the root's lazy re-exports are checked above
            if state.get(n) == 1:
                cycle = path[path.index(n):] + [n]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m, [m])
