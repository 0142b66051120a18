#!/usr/bin/env python3
"""Walk the package's import graph: print who imports whom, and check the house rules.

Rules checked (exit status 1 when one is broken):

- no import circles between modules (a package's ``__init__`` re-exporting its own modules
  does not count);
- the data plane (partitioners, placement, keyed, state, merge, kafka) never imports
  ``control`` or ``cli``; ``control`` never imports ``cli``;
- no module imports a private (``_name``) name from another module of the package.

Usage::

    python tools/import_graph.py            # the rules, then the subpackage map
    python tools/import_graph.py --modules  # every module edge as well
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "trilink_spark"
PACKAGE = "trilink_spark"
DATA_PLANE = ("partitioners", "placement", "keyed", "state", "merge", "kafka")
LAYERS = {name: 1 for name in DATA_PLANE} | {"control": 2, "cli": 3}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Module edges (importer -> imported module) and the private names imported across."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private: list[str] = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                for alias in node.names:
                    full = f"{name}.{alias.name}"
                    targets.append((full, None) if full in mods else (name, alias.name))
            for target, imported in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if not target or target == mod or target == PACKAGE:
                    continue
                edges[mod].add(target)
                if imported and imported.startswith("_") and not imported.startswith("__"):
                    private.append(f"{mod} imports {imported} from {target}")
    return edges, private


def _is_reexport(a: str, b: str, mods: dict[str, Path]) -> bool:
    """``a`` is a package __init__ importing a module inside itself."""
    return mods[a].name == "__init__.py" and b.startswith(a + ".")


def cycles(edges: dict[str, set[str]], mods: dict[str, Path]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), re-exports ignored."""
    graph = {m: {t for t in ts if not _is_reexport(m, t, mods)} for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def subpackage(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "(facade)"


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, targets in edges.items():
        src = subpackage(mod)
        for target in targets:
            dst = subpackage(target)
            if src in LAYERS and dst in LAYERS and LAYERS[dst] > LAYERS[src]:
                out.append(f"{mod} ({src}) imports {target} ({dst})")
    return out


def package_map(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Subpackage -> the subpackages (and bottom modules) it imports."""
    out: dict[str, set[str]] = defaultdict(set)
    for mod, targets in edges.items():
        src = subpackage(mod)
        for target in targets:
            dst = subpackage(target)
            if dst != src:
                out[src].add(dst)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="print every module edge")
    args = parser.parse_args(argv)
    mods = modules()
    edges, private = imports(mods)
    problems = [f"import circle: {' -> '.join(c)}" for c in cycles(edges, mods)]
    problems += [f"layer rule: {v}" for v in layer_violations(edges)]
    problems += [f"private name: {p}" for p in private]
    for line in problems:
        print(line)
    print(f"{len(mods)} modules, {sum(map(len, edges.values()))} edges, "
          f"{len(problems)} problem(s)")
    for src, dsts in sorted(package_map(edges).items()):
        print(f"{src:>12} -> {', '.join(sorted(dsts))}")
    if args.modules:
        for mod, targets in sorted(edges.items()):
            for target in sorted(targets):
                print(f"{mod} -> {target}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
