#!/usr/bin/env python3
"""Walk the package's import graph: print who imports whom, and check the house rules.

Rules checked (exit status 1 when one is broken):

- no import circles between modules (a package's ``__init__`` re-exporting its own modules
  does not count, but a module importing its own package's ``__init__`` does);
- layers: a module imports only its own subpackage, the bottom layer, or a subpackage of a
  lower rank (``RANKS``): the data plane never imports the control plane (``CONTROL_PLANE``:
  ``measurement``, ``switching``, ``advice``, ``elastic``, ``ui``) or ``cli``, the control plane never
  imports ``cli``, and inside each plane imports point one way (the README's map);
  the bottom layer (top-level modules) imports only the bottom layer; every subpackage has a
  rank (or is ``_internal``, the bottom layer);
- rooms: inside a subpackage cut into rooms (``ROOMS``), a room imports only itself and the
  rooms below it, and every module but the ``__init__`` sits in a room;
- no module imports the facade (``trilink_spark/__init__``), by ``from`` or ``import``;
- no module imports a private (``_name``) name from another module of the package, or reads
  one as an attribute of an imported module;
- no dynamic import (``importlib.import_module``, ``__import__``): the walker could not see it.

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
#: The control plane, one subpackage per job.
CONTROL_PLANE = ("measurement", "switching", "advice", "elastic", "ui")
#: Rank of each subpackage: imports go to a strictly lower rank (or the bottom layer, rank 0:
#: the top-level modules and ``_internal``).
RANKS = {
    "partitioners": 1,
    "kafka": 1,
    "state": 2,
    "merge": 3,
    "placement": 4,
    "keyed": 5,
    "measurement": 6,
    "switching": 7,
    "advice": 7,
    "elastic": 8,
    "ui": 9,  # the live view, on top of what the control plane reports
    "cli": 10,
    "testing": 10,  # launchers and the keyed tester, for users' own tests: nothing imports it
}
#: Rooms inside a subpackage, bottom to top: a module of a room imports only its own room
#: and the rooms below it (the subpackage's ``__init__`` re-exports from every room).
ROOMS = {
    "partitioners": {"core": 1, "tables": 2, "choosing": 3},
    "keyed": {"semantics": 1, "durable": 2, "swaps": 3, "records": 4, "run": 5},
    "merge": {"algebra": 1, "engines": 2, "stores": 3},
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


FACADE_IMPORTS: list[str] = []
DYNAMIC_IMPORTS: list[str] = []


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Module edges (importer -> imported module) and the private names used across modules.

    Also fills :data:`FACADE_IMPORTS` (modules importing the facade) and
    :data:`DYNAMIC_IMPORTS` (calls the walker cannot follow).
    """
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private: list[str] = []
    FACADE_IMPORTS.clear()
    DYNAMIC_IMPORTS.clear()
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}  # local name -> package module it is bound to
        for node in ast.walk(tree):  # the names imports bind, before any use is judged
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.name != mod:
                        # ``import a.b`` binds ``a`` (the package), ``import a.b as x`` binds b
                        aliases[a.asname or a.name.split(".")[0]] = (
                            a.name if a.asname else a.name.split(".")[0])
                    if a.name == PACKAGE and mod != PACKAGE:
                        FACADE_IMPORTS.append(f"{mod} imports the facade ({PACKAGE})")
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    full = f"{_absolute(node, mod, is_pkg)}.{alias.name}"
                    if full in mods:
                        aliases[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("import_module", "__import__"):
                    DYNAMIC_IMPORTS.append(f"{mod} calls {name}")
            if isinstance(node, ast.Attribute):
                bound = _module_of(node.value, aliases, mods)
                if bound and node.attr.startswith("_") and not node.attr.startswith("__"):
                    private.append(f"{mod} reads {node.attr} of {bound}")
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                name = _absolute(node, mod, is_pkg)
                for alias in node.names:
                    full = f"{name}.{alias.name}"
                    if full in mods:
                        targets.append((full, None))
                    else:
                        targets.append((name, alias.name))
            for target, imported in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target == PACKAGE and mod != PACKAGE and (imported or "").isidentifier():
                    FACADE_IMPORTS.append(f"{mod} imports {imported} from the facade")
                if not target or target == mod or target == PACKAGE:
                    continue
                edges[mod].add(target)
                if imported and imported.startswith("_") and not imported.startswith("__"):
                    private.append(f"{mod} imports {imported} from {target}")
    return edges, private


def _absolute(node: ast.ImportFrom, mod: str, is_pkg: bool) -> str:
    """The absolute module name a ``from ... import`` in module ``mod`` reads from."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _module_of(node: ast.expr, aliases: dict[str, str], mods: dict[str, Path]) -> str | None:
    """The package module an expression names (``wire``, ``switching.wire``,
    ``trilink_spark.switching.wire``), or None when it names no module."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = _module_of(node.value, aliases, mods)
        if parent and f"{parent}.{node.attr}" in mods:
            return f"{parent}.{node.attr}"
    return None


def unranked_subpackages(mods: dict[str, Path]) -> list[str]:
    """Subpackages the layer rule does not know (no rank in ``RANKS``): each would count as
    the bottom layer, which every layer may import."""
    known = {*RANKS, "_internal", "(facade)"}
    return sorted({f"{subpackage(m)} has no rank in RANKS" for m, path in mods.items()
                   if path.name == "__init__.py" and subpackage(m) not in known})


def _is_reexport(a: str, b: str, mods: dict[str, Path]) -> bool:
    """``a`` is a package __init__ importing a module inside itself."""
    return mods[a].name == "__init__.py" and b.startswith(a + ".")


def own_package_imports(edges: dict[str, set[str]], mods: dict[str, Path]) -> list[str]:
    """Modules that import the ``__init__`` of a package they belong to (a hidden circle)."""
    return [f"{m} imports its own package {t}" for m, ts in edges.items() for t in ts
            if mods[t].name == "__init__.py" and m.startswith(t + ".")]


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


def rank(mod: str) -> int:
    """0 for the bottom layer (top-level modules), else the subpackage's rank."""
    return RANKS.get(subpackage(mod), 0)


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports that point up a layer, or sideways between two subpackages of one rank."""
    out = []
    for mod, targets in edges.items():
        src = subpackage(mod)
        if src == "(facade)":
            continue
        for target in targets:
            dst = subpackage(target)
            if dst == src or dst == "(facade)":
                continue
            if rank(target) > rank(mod) or (rank(target) == rank(mod) and rank(mod) > 0):
                out.append(f"{mod} ({src}) imports {target} ({dst})")
    return out


def room(mod: str) -> tuple[str, str] | None:
    """``(subpackage, room)`` of a module inside a room of :data:`ROOMS`, else None."""
    parts = mod.split(".")
    if len(parts) > 3 and parts[2] in ROOMS.get(parts[1], {}):
        return parts[1], parts[2]
    return None


def room_violations(edges: dict[str, set[str]], mods: dict[str, Path] | None = None) -> list[str]:
    """Imports from a room up to a higher room of the same subpackage, and modules of a
    roomed subpackage that sit in no room (only its ``__init__`` may)."""
    out = []
    for mod, targets in edges.items():
        src = room(mod)
        if src is None:
            continue
        ranks = ROOMS[src[0]]
        for target in targets:
            dst = room(target)
            if dst is not None and dst[0] == src[0] and ranks[dst[1]] > ranks[src[1]]:
                out.append(f"{mod} ({src[0]}/{src[1]}) imports {target} ({dst[0]}/{dst[1]})")
    for mod, path in (mods or {}).items():
        parts = mod.split(".")
        if len(parts) == 3 and parts[1] in ROOMS and path.name != "__init__.py" \
                and parts[2] not in ROOMS[parts[1]]:
            out.append(f"{mod} sits in no room of {parts[1]} ({', '.join(ROOMS[parts[1]])})")
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
    problems += [f"room rule: {v}" for v in room_violations(edges, mods)]
    problems += [f"private name: {p}" for p in private]
    problems += [f"facade import: {p}" for p in FACADE_IMPORTS]
    problems += [f"dynamic import: {p}" for p in DYNAMIC_IMPORTS]
    problems += [f"import circle: {p}" for p in own_package_imports(edges, mods)]
    problems += [f"layer rule: {p}" for p in unranked_subpackages(mods)]
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
