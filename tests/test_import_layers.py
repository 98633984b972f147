"""Import structure of nemo_vfm: no import cycle, and layers point down.

Every module under ``nemo_vfm/`` is parsed with ``ast``; every import counts, at module level or inside a
function (lazy), absolute (``from nemo_vfm.x import y``), relative (``from .x import y``) or through
``importlib.import_module("nemo_vfm.x")`` with a literal name. Imports under ``if TYPE_CHECKING:`` count too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nemo_vfm"

# Lowest first. A package may import its own layer or a lower one, never a higher one; packages of one layer
# may import each other, but not in a circle (data uses tokenizers, so tokenizers never imports data).
# "nemo_vfm" is the root ``__init__.py`` (convention 7: it imports nothing); "train" and "train_tokenizer" are
# the entry points ``nemo_vfm/train.py`` and ``nemo_vfm/train_tokenizer.py``. evaluation scores videos against
# data's synthetic vocabulary, so it sits with data.
LAYERS: list[tuple[str, ...]] = [
    ("nemo_vfm", "errors", "io", "parallel"),
    ("models", "diffusion", "data", "tokenizers", "curation", "evaluation"),
    ("lightning", "inference", "cli"),
    ("train", "train_tokenizer"),
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package)."""
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _targets(node: ast.AST, package: str) -> list[list[str]]:
    """Per imported name, the dotted modules it may be (``from a import b``: ``a.b``, else ``a``), best first."""
    if isinstance(node, ast.Import):
        return [[a.name] for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        return [[f"{mod}.{a.name}", mod] for a in node.names]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [[node.args[0].value]]
    return []


@cache
def _graph() -> dict[tuple[str, str], str]:
    """(importer, imported) module edges -> where (``file:line``) the first such import is."""
    mods = _modules()
    edges: dict[tuple[str, str], str] = {}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for candidates in _targets(node, package):
                if candidates[0].partition(".")[0] != "nemo_vfm":
                    continue
                hit = next((c for c in candidates if c in mods), None)
                assert hit is not None, f"{path}:{node.lineno}: imports {candidates[0]}, which is not a module"
                if hit != name:
                    edges.setdefault((name, hit), f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _cycles(adj: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one node (Tarjan)."""
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(adj.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in sorted(adj):
        if v not in index:
            visit(v)
    cycles = []
    for comp in sccs:  # shortest cycle through the component's first node (BFS inside the component)
        start = min(comp)
        prev, frontier = {start: None}, [start]
        while frontier and start not in [w for v in frontier for w in adj[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(adj[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in adj[v])
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


def _describe(cycle: list[str], where) -> str:
    return " -> ".join(cycle) + "\n      " + "\n      ".join(
        f"{a} -> {b}: {where(a, b)}" for a, b in zip(cycle, cycle[1:]))


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules()}
    assert packages <= set(LAYER_OF), f"give these packages a layer in LAYERS: {sorted(packages - set(LAYER_OF))}"
    assert not set(LAYER_OF) - packages, f"LAYERS names packages that no longer exist: {set(LAYER_OF) - packages}"


def _adjacency(pairs) -> dict:
    adj = defaultdict(set)
    for a, b in pairs:
        adj[a].add(b)
        adj.setdefault(b, set())
    return adj


def test_no_import_cycle_between_modules():
    edges = _graph()
    cycles = _cycles(_adjacency(edges))
    assert not cycles, "import cycles between modules:\n  " + "\n  ".join(
        _describe(c, lambda a, b: edges[a, b]) for c in cycles)


def test_no_import_cycle_between_packages():
    edges = _graph()
    by_pkg = defaultdict(list)
    for (a, b), where in edges.items():
        if _package(a) != _package(b):
            by_pkg[_package(a), _package(b)].append(f"{a} -> {b} ({where})")
    cycles = _cycles(_adjacency(by_pkg))
    assert not cycles, "import cycles between packages:\n  " + "\n  ".join(
        _describe(c, lambda a, b: "; ".join(by_pkg[a, b])) for c in cycles)


def test_layers_point_down():
    upward = sorted(f"{where}: {a} ({_package(a)}, layer {LAYER_OF[_package(a)]}) imports {b} "
                    f"({_package(b)}, layer {LAYER_OF[_package(b)]})"
                    for (a, b), where in _graph().items()
                    if LAYER_OF.get(_package(a), 99) < LAYER_OF.get(_package(b), -1))
    assert not upward, "imports from a lower layer into a higher one:\n  " + "\n  ".join(upward)
