"""What to install for an optional part: the hint that errors print.

The package is installed from a clone or a built wheel as often as from an index, so a hint
names the extra's own requirements (read from this installation's metadata, the one list in
``setup.cfg``), which ``pip`` finds wherever the package came from, and, for a source
checkout, the extra as a path install.

Examples
--------
>>> install_hint("plot")  # doctest: +SKIP
"pip install 'matplotlib>=3.7' (the [plot] extra; from a clone: pip install -e '/src/trilink-spark[plot]')"
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

__all__ = ["install_hint", "extra_requirements", "DISTRIBUTION"]

#: The distribution's name.
DISTRIBUTION = "trilink-spark"
_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_requirements(extra: str) -> list[str]:
    """The requirements of ``extra`` as this installation declares them (empty when the
    metadata is not there: a source tree put on the path by hand)."""
    try:
        declared = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        found = _MARKER.search(marker)
        if found is not None and found.group(1) == extra:
            out.append(requirement.strip())
    return out


def _source_tree() -> Path | None:
    """The checkout this package runs from (an editable or path install), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "setup.cfg").is_file() and (root / "pyproject.toml").is_file() \
        else None


def install_hint(extra: str, fallback: str | None = None) -> str:
    """``pip install ...`` for the optional part ``extra`` (module docs); ``fallback``: the
    requirement to name when the metadata does not list the extra. O(metadata)."""
    requirements = extra_requirements(extra) or ([fallback] if fallback else [])
    parts = []
    if requirements:
        parts.append("pip install " + " ".join(shlex.quote(r) for r in requirements)
                     + f" (the [{extra}] extra")
    tree = _source_tree()
    if tree is not None:
        clone = f"pip install -e {shlex.quote(f'{tree}[{extra}]')}"
        parts.append(f"; from this clone: {clone})" if parts else clone)
    elif parts:
        parts.append(")")
    return "".join(parts) or f"pip install '{DISTRIBUTION}[{extra}]'"
