"""Deprecated names: the warning a name that moved gives when it is read at its old place.

A module path that moved keeps resolving through :class:`ModuleShims` (a finder on
:data:`sys.meta_path`): its names are read from their new homes, each with the same warning.

A package keeps a moved name resolving through a module ``__getattr__`` that calls
:func:`warn_moved`: one :class:`DeprecationWarning` per read, pointing at the user's line, and
none for the import system's own probe (``from package import name`` first asks
``hasattr(package, name)`` to learn whether ``name`` is a submodule, then reads it).

Examples
--------
>>> import warnings
>>> def __getattr__(name):
...     warn_moved(f"pkg.{name}", f"pkg.home.{name}")
...     return 1
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     __getattr__("x")
1
>>> str(caught[0].message)
'pkg.x has moved to pkg.home.x; the old name is deprecated and goes in the next minor release'
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
import warnings
from typing import Any

__all__ = ["warn_moved", "MovedModule", "ModuleShims", "Renamed"]


def _import_probe(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller is the import system's
    ``hasattr`` probe of ``from package import name`` (``importlib._bootstrap``). O(1)."""
    frame = sys._getframe(depth + 1)
    return (frame.f_code.co_name == "_handle_fromlist"
            and frame.f_globals.get("__name__") == "importlib._bootstrap")


def warn_moved(old: str, new: str, *, note: str = "", what: str = "the old name") -> None:
    """Warn that ``old`` has moved to ``new``, from a module ``__getattr__``.

    Call it from the ``__getattr__`` itself: the warning points at the line that read the name,
    and the import system's probe of ``from package import name`` gives none (the read that
    follows it does). The message: ``"{old} has moved to {new}{note}; {what} is deprecated and
    goes in the next minor release"``. O(1).
    """
    if _import_probe(2):
        return
    warnings.warn(f"{old} has moved to {new}{note}; {what} is deprecated and goes in the next "
                  "minor release", DeprecationWarning, stacklevel=3)


#: Names a moved module had under another name: old name -> (new name, its home).
Renamed = dict[str, tuple[str, types.ModuleType]]


class MovedModule(types.ModuleType):
    """What a module path that moved resolves to: each name it had is read from its new home,
    with :func:`warn_moved` naming that home (a name that was renamed, by its new name).
    ``__all__`` is the homes' public names, so ``from old.path import *`` binds them, each
    with its warning. O(homes) per read."""

    def __init__(self, name: str, homes: tuple[types.ModuleType, ...],
                 renamed: Renamed | None = None) -> None:
        super().__init__(name, f"Deprecated: {name} has moved to "
                         f"{', '.join(h.__name__ for h in homes)}.")
        self.__dict__["_homes"] = homes
        self.__dict__["_renamed"] = dict(renamed or {})

    def __getattr__(self, attr: str) -> Any:
        if attr == "__all__":
            return self.__dir__()
        if attr.startswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        if attr in self.__dict__["_renamed"]:
            new, home = self.__dict__["_renamed"][attr]
            warn_moved(f"{self.__name__}.{attr}", f"{home.__name__}.{new}")
            return getattr(home, new)
        for home in self.__dict__["_homes"]:
            if attr in home.__dict__:
                warn_moved(f"{self.__name__}.{attr}", f"{home.__name__}.{attr}")
                return home.__dict__[attr]
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}; it has "
                             f"moved to {', '.join(h.__name__ for h in self.__dict__['_homes'])}")

    def __dir__(self) -> list[str]:
        return sorted({n for h in self.__dict__["_homes"] for n in getattr(h, "__all__", ())}
                      | set(self.__dict__["_renamed"]))


class ModuleShims(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Keeps module paths that moved importable for one minor version.

    ``moved`` maps each old dotted path to the modules that now hold its names, searched in
    order; ``renamed`` maps an old path to the names it had under another name
    (:data:`Renamed`). Installed once per package (:meth:`install`); ``import old.path``,
    ``from old.path import name`` and ``package.old_name`` then resolve through one
    :class:`MovedModule` per path (made once, under a lock, however the first read comes), each
    name read with one :class:`DeprecationWarning`. Nothing is imported by name: the homes are
    module objects the package already holds.
    """

    def __init__(self, moved: dict[str, tuple[types.ModuleType, ...]],
                 renamed: dict[str, Renamed] | None = None) -> None:
        self.moved = dict(moved)
        self.renamed = dict(renamed or {})
        self._made: dict[str, MovedModule] = {}
        self._lock = threading.Lock()

    def install(self) -> ModuleShims:
        """Put this finder on :data:`sys.meta_path` (once); returns ``self``."""
        if self not in sys.meta_path:
            sys.meta_path.append(self)
        return self

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._shim(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: a :class:`MovedModule` reads its names from their homes."""

    def module(self, fullname: str) -> types.ModuleType:
        """The shim of ``fullname`` as an attribute of its package gives it: the one module
        object of that path (the one in :data:`sys.modules` once imported)."""
        return sys.modules.get(fullname) or sys.modules.setdefault(fullname, self._shim(fullname))

    def _shim(self, fullname: str) -> MovedModule:
        with self._lock:
            made = self._made.get(fullname)
            if made is None:
                made = self._made[fullname] = MovedModule(
                    fullname, self.moved[fullname], self.renamed.get(fullname))
            return made
