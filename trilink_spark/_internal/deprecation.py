"""Deprecated names: the warning a name that moved gives when it is read at its old place.

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

import sys
import warnings

__all__ = ["warn_moved"]


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
