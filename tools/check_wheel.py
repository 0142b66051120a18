#!/usr/bin/env python3
"""Check that the package builds and installs cleanly beside an existing PySpark.

What it does (exit status 1 when a check fails, 2 when a tool it needs is missing):

1. ``python -m build`` makes the sdist and, from that sdist, the wheel in a temporary
   directory; ``twine check --strict`` checks both.
2. The wheel's contents: ``trilink_spark/py.typed`` is there, every module of the source
   tree is there, and no tests, benches, examples, tools or ``__pycache__``. Its metadata:
   ``Requires-Python`` is ``>=3.11`` (as ``setup.cfg`` says), PySpark is only in extras,
   never in the base ``Requires-Dist``, and the base requirements, extras and console
   scripts are exactly those of ``setup.cfg``. The sdist carries what building and testing
   need, and no caches.
3. A fresh virtual environment gets the PySpark version of the running environment
   (``pip install pyspark==X``), then the wheel without extras. PySpark (and py4j) must be
   left alone: same version, same place, the same dist-info files (size, mtime, inode), the
   same RECORD hash, and pip must not have uninstalled or installed them. ``pip check``
   passes, ``import trilink_spark`` imports the installed copy, and the ``trilink-spark``
   command runs.
4. The README's quick-start Python snippet runs with that environment's Python
   (``PYSPARK_PYTHON`` set to it, Java 17+ needed), from an empty directory, so the source
   tree cannot be imported by accident. The snippet is each python block that follows a
   ``<!-- wheel-check -->`` line, or else the first python block after the "Quick start"
   heading (``--section TITLE`` picks the first block under another heading). Its Spark
   driver runs with ``--java-options`` (default: the C1 JIT alone, which only makes a short
   job cheaper).

Step 3's fresh venv is made while step 1 builds, and ``import trilink_spark`` runs while the
README snippet does: neither needs the other.

Usage::

    .venv/bin/python tools/check_wheel.py
    .venv/bin/python tools/check_wheel.py --section "Placing a DataFrame" --keep-temp

Only the standard library is imported; ``build`` and ``twine`` must be installed in the
running environment (the ``test`` extra has them).
"""

from __future__ import annotations

import argparse
import configparser
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "trilink_spark"
#: Distributions that make up an installed PySpark; installing the wheel must not touch them.
SPARK_DISTS = ("pyspark", "py4j")
#: Distributions the base requirements must never name: they would install or replace Spark.
SPARK_NAMES = frozenset({"pyspark", "pyspark-connect", "pyspark-client", "py4j"})
#: The extra the README tells users to install PySpark with.
SPARK_EXTRA = "spark"
MIN_PYTHON = (3, 11)
MIN_JAVA = 17
#: Path components that must not appear in the wheel.
WHEEL_FORBIDDEN_PARTS = frozenset(
    {"tests", "test", "benches", "examples", "tools", "__pycache__", ".hypothesis",
     ".mypy_cache", ".pytest_cache", ".benchmarks", "spark-warehouse", "metastore_db"}
)
#: Path components that must not appear in the sdist.
SDIST_FORBIDDEN_PARTS = frozenset(
    {"__pycache__", ".git", ".venv", ".hypothesis", ".mypy_cache", ".pytest_cache",
     ".benchmarks", "build", "dist", "spark-warehouse", "metastore_db"}
)
#: Files (relative to the sdist's top directory) it must carry: to build the wheel, and for the
#: test suite it ships to run (``tests/`` reads ``tools/``, ``examples/``, the README and
#: imports the YSB application ``benches/ysb/``).
SDIST_REQUIRED = (
    "PKG-INFO", "pyproject.toml", "setup.cfg", "MANIFEST.in", "README.md", "LICENSE",
    f"{PACKAGE}/__init__.py", f"{PACKAGE}/py.typed",
    f"{PACKAGE}/_internal/spark/jars/trilink-spark-jvm.jar", "jvm/src/trilinkspark/PreferredRDD.java",
    "tools/build_jar.py", "tests/conftest.py", "tools/import_graph.py", "examples/balance_orders.py",
    "benches/ysb/__init__.py",
)
MARKER = "<!-- wheel-check -->"
#: JVM options the README snippet's Spark driver gets (``--java-options``): a short job on a
#: fresh JVM spends most of its CPU in the C2 JIT; C1 alone changes no result, only its cost.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
PYTHON_INFO = frozenset({"python", "py", "python3"})


class CheckFailed(Exception):
    """A check did not hold; the message says what and why."""


class ToolMissing(Exception):
    """Something this script needs is not available (exit status 2)."""


# ------------------------------------------------------------------ requirements and metadata
def normalize_name(name: str) -> str:
    """PEP 503 normalised distribution (or extra) name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    """A requirement reduced to what comparing setup.cfg with METADATA needs."""

    name: str
    extras: frozenset[str] = frozenset()
    specifiers: frozenset[str] = frozenset()
    marker: str = ""
    extra: str | None = None  # the ``extra == "..."`` clause of the marker, if any

    def __str__(self) -> str:
        extras = f"[{','.join(sorted(self.extras))}]" if self.extras else ""
        text = self.name + extras + ",".join(sorted(self.specifiers))
        markers = [m for m in (self.marker, f'extra=="{self.extra}"' if self.extra else "") if m]
        return text + ("; " + " and ".join(markers) if markers else "")


_REQ = re.compile(
    r"""^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*
        (?:\[(?P<extras>[^\]]*)\])?\s*
        (?P<spec>[^;]*?)\s*
        (?:;\s*(?P<marker>.*?))?\s*$""",
    re.X,
)
_EXTRA_CLAUSE = re.compile(r"""\bextra\s*==\s*(['"])(?P<extra>[^'"]+)\1""")


def _normalize_marker(marker: str) -> str:
    marker = marker.strip().replace("'", '"')
    while marker.startswith("(") and marker.endswith(")"):
        marker = marker[1:-1].strip()
    return re.sub(r"\s+", "", marker)


def parse_requirement(line: str) -> Requirement:
    """Parse one PEP 508 requirement (no URL requirements) as setup.cfg or METADATA spell it.

    >>> str(parse_requirement('pyspark[connect] (<5,>=4.1) ; extra == "connect"'))
    'pyspark[connect]<5,>=4.1; extra=="connect"'
    """
    match = _REQ.match(line)
    if match is None or "@" in (match.group("spec") or ""):
        raise ValueError(f"cannot parse requirement {line!r}")
    spec = (match.group("spec") or "").strip()
    if spec.startswith("(") and spec.endswith(")"):
        spec = spec[1:-1]
    specifiers = frozenset(re.sub(r"\s+", "", s) for s in spec.split(",") if s.strip())
    extras = frozenset(normalize_name(e.strip()) for e in (match.group("extras") or "").split(",")
                       if e.strip())
    marker = match.group("marker") or ""
    extra: str | None = None
    found = _EXTRA_CLAUSE.search(marker)
    if found is not None:
        extra = normalize_name(found.group("extra"))
        rest = marker[: found.start()] + marker[found.end():]
        rest = re.sub(r"^\s*and\s+|\s+and\s*$", "", rest.strip())
        marker = re.sub(r"\(\s*\)", "", rest)
    return Requirement(normalize_name(match.group("name")), extras, specifiers,
                       _normalize_marker(marker), extra)


@dataclass(frozen=True)
class ProjectSpec:
    """What setup.cfg declares about the distribution."""

    name: str
    python_requires: str
    install_requires: tuple[Requirement, ...]
    extras: Mapping[str, tuple[Requirement, ...]]
    console_scripts: Mapping[str, str]


def _lines(value: str) -> list[str]:
    out = []
    for raw in value.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def parse_setup_cfg(text: str) -> ProjectSpec:
    """Read name, python_requires, install_requires, extras and console scripts of setup.cfg."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    name = cfg.get("metadata", "name", fallback="")
    python_requires = cfg.get("options", "python_requires", fallback="")
    install = tuple(parse_requirement(r) for r in
                    _lines(cfg.get("options", "install_requires", fallback="")))
    extras: dict[str, tuple[Requirement, ...]] = {}
    if cfg.has_section("options.extras_require"):
        for key, value in cfg.items("options.extras_require"):
            extra = normalize_name(key)
            extras[extra] = tuple(replace(parse_requirement(line), extra=extra)
                                  for line in _lines(value))
    scripts: dict[str, str] = {}
    if cfg.has_option("options.entry_points", "console_scripts"):
        for line in _lines(cfg.get("options.entry_points", "console_scripts")):
            script, _, target = line.partition("=")
            scripts[script.strip()] = re.sub(r"\s+", "", target)
    return ProjectSpec(name, python_requires, install, extras, scripts)


@dataclass(frozen=True)
class Metadata:
    """The core-metadata fields this script checks (METADATA of a wheel, PKG-INFO of an sdist)."""

    name: str
    version: str
    requires_python: str
    requires_dist: tuple[Requirement, ...]
    provides_extra: frozenset[str]
    metadata_version: str = ""

    def base_requirements(self) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requires_dist if r.extra is None)

    def extra_requirements(self, extra: str) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requires_dist if r.extra == normalize_name(extra))


def parse_metadata(text: str) -> Metadata:
    """Parse a METADATA / PKG-INFO text (RFC 822 headers; the body is the description)."""
    msg = HeaderParser().parsestr(text)
    return Metadata(
        name=msg.get("Name", ""),
        version=msg.get("Version", ""),
        requires_python=msg.get("Requires-Python", ""),
        requires_dist=tuple(parse_requirement(r) for r in msg.get_all("Requires-Dist") or []),
        provides_extra=frozenset(normalize_name(e) for e in msg.get_all("Provides-Extra") or []),
        metadata_version=msg.get("Metadata-Version", ""),
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in text.split("."))
    return parts + (0,) * (3 - len(parts))


def python_floor_ok(spec: str, minimum: tuple[int, ...] = MIN_PYTHON) -> bool:
    """Whether the specifier set ``spec`` excludes every Python older than ``minimum``.

    >>> python_floor_ok(">=3.11"), python_floor_ok(">=3.9"), python_floor_ok("")
    (True, False, False)
    """
    want = _version_tuple(".".join(map(str, minimum)))
    for clause in (re.sub(r"\s+", "", c) for c in spec.split(",")):
        # >=V, ~=V, ==V, ==V.* and >V all exclude everything below V
        match = re.fullmatch(r"(>=|>|~=|==)(\d+(?:\.\d+)*)(\.\*)?", clause)
        if match is not None and _version_tuple(match.group(2)) >= want:
            return True
    return False


def _spec_set(spec: str) -> frozenset[str]:
    return frozenset(re.sub(r"\s+", "", c) for c in spec.split(",") if c.strip())


def _compare_requirements(where: str, want: Iterable[Requirement],
                          got: Iterable[Requirement]) -> list[str]:
    want_set, got_set = set(want), set(got)
    problems = [f"{where}: setup.cfg has {r}, the metadata does not"
                for r in sorted(want_set - got_set, key=str)]
    problems += [f"{where}: the metadata has {r}, setup.cfg does not"
                 for r in sorted(got_set - want_set, key=str)]
    return problems


def check_metadata(meta: Metadata, project: ProjectSpec, version: str | None = None) -> list[str]:
    """Problems of ``meta`` against setup.cfg: Requires-Python, base requirements, extras."""
    problems: list[str] = []
    if normalize_name(meta.name) != normalize_name(project.name):
        problems.append(f"Name is {meta.name!r}, setup.cfg says {project.name!r}")
    if version is not None and meta.version != version:
        problems.append(f"Version is {meta.version!r}, the source says {version!r}")
    if not meta.requires_python:
        problems.append("no Requires-Python")
    elif not python_floor_ok(meta.requires_python):
        problems.append(f"Requires-Python {meta.requires_python!r} admits Python older than "
                        f"{'.'.join(map(str, MIN_PYTHON))}")
    if _spec_set(meta.requires_python) != _spec_set(project.python_requires):
        problems.append(f"Requires-Python {meta.requires_python!r} differs from setup.cfg's "
                        f"python_requires {project.python_requires!r}")
    base = meta.base_requirements()
    for req in base:
        if req.name in SPARK_NAMES:
            problems.append(f"base Requires-Dist names {req}: installing the package would "
                            "install or replace PySpark; it belongs in an extra")
    problems += _compare_requirements("base requirements", project.install_requires, base)
    if meta.provides_extra != set(project.extras):
        problems.append(f"Provides-Extra {sorted(meta.provides_extra)} differs from setup.cfg's "
                        f"extras {sorted(project.extras)}")
    for extra, reqs in sorted(project.extras.items()):
        problems += _compare_requirements(f"extra {extra!r}", reqs, meta.extra_requirements(extra))
    if not any(r.name == "pyspark" for r in meta.extra_requirements(SPARK_EXTRA)):
        problems.append(f"the {SPARK_EXTRA!r} extra does not require pyspark "
                        f"(the README says: pip install 'trilink-spark[{SPARK_EXTRA}]')")
    unknown = {r.extra for r in meta.requires_dist if r.extra is not None} - meta.provides_extra
    if unknown:
        problems.append(f"Requires-Dist uses extras not in Provides-Extra: {sorted(unknown)}")
    return problems


def parse_entry_points(text: str) -> dict[str, dict[str, str]]:
    """entry_points.txt as {group: {name: target}}."""
    cfg = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    cfg.optionxform = str  # type: ignore[assignment,method-assign]
    cfg.read_string(text)
    return {g: {k: re.sub(r"\s+", "", v) for k, v in cfg.items(g)} for g in cfg.sections()}


def check_entry_points(text: str, project: ProjectSpec) -> list[str]:
    """Problems of the wheel's entry_points.txt against setup.cfg's console scripts."""
    got = parse_entry_points(text).get("console_scripts", {})
    if got != dict(project.console_scripts):
        return [f"console_scripts {got} differ from setup.cfg's {dict(project.console_scripts)}"]
    return []


# ------------------------------------------------------------------------ archive contents
@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name (PEP 427)."""

    distribution: str
    version: str
    python_tag: str
    abi_tag: str
    platform_tag: str


def parse_wheel_filename(filename: str) -> WheelName:
    """``trilink_spark-0.1.0-py3-none-any.whl`` -> its parts (build tags are not expected)."""
    stem = filename.removesuffix(".whl")
    parts = stem.split("-")
    if not filename.endswith(".whl") or len(parts) != 5:
        raise ValueError(f"not a wheel file name (or one with a build tag): {filename!r}")
    return WheelName(*parts)


def check_wheel_names(names: Iterable[str], package: str, dist_info: str) -> list[str]:
    """Problems of a wheel's file list: required files, stray top-level entries, forbidden paths."""
    names = list(names)
    have = set(names)
    required = [f"{package}/__init__.py", f"{package}/py.typed", f"{dist_info}/METADATA",
                f"{dist_info}/WHEEL", f"{dist_info}/RECORD"]
    if package == PACKAGE:  # the JVM helper the keyed stage's locality needs
        required.append(f"{package}/_internal/spark/jars/trilink-spark-jvm.jar")
    problems = [f"missing {req}" for req in required if req not in have]
    for name in names:
        parts = PurePosixPath(name).parts
        if not parts:
            continue
        if parts[0] not in (package, dist_info):
            problems.append(f"unexpected top-level entry {name}")
        elif any(p in WHEEL_FORBIDDEN_PARTS for p in parts):
            problems.append(f"forbidden path {name}")
        elif name.endswith((".pyc", ".pyo")):
            problems.append(f"compiled file {name}")
        elif parts[-1] == "conftest.py" or (parts[-1].startswith("test_")
                                             and parts[-1].endswith(".py")):
            problems.append(f"test module {name}")
    return problems


def source_modules(root: Path, package: str = PACKAGE) -> list[str]:
    """Every ``.py`` file of the package in the source tree, as a wheel would name it."""
    base = root / package
    return sorted(p.relative_to(root).as_posix() for p in base.rglob("*.py")
                  if "__pycache__" not in p.parts)


def missing_modules(expected: Iterable[str], names: Iterable[str], prefix: str = "") -> list[str]:
    """The ``expected`` paths that ``names`` (optionally under ``prefix``) lack."""
    have = set(names)
    return [p for p in expected if prefix + p not in have]


def check_sdist_names(names: Iterable[str], top: str,
                      required: Sequence[str] = SDIST_REQUIRED) -> list[str]:
    """Problems of an sdist's member list; ``top`` is its top directory (``name-version``)."""
    names = list(names)
    have = set(names)
    problems = [f"missing {top}/{req}" for req in required if f"{top}/{req}" not in have]
    for name in names:
        parts = PurePosixPath(name).parts
        if not parts:
            continue
        if parts[0] != top:
            problems.append(f"entry outside {top}/: {name}")
        elif any(p in SDIST_FORBIDDEN_PARTS for p in parts[1:]):
            problems.append(f"forbidden path {name}")
        elif name.endswith((".pyc", ".pyo")):
            problems.append(f"compiled file {name}")
    return problems


# --------------------------------------------------------------------------- README snippet
@dataclass(frozen=True)
class Snippet:
    """A fenced python block of the README."""

    code: str
    line: int  # 1-based line of the opening fence
    heading: str  # the nearest heading above it ("" when none)
    marked: bool  # preceded by the MARKER line (blank lines may sit between)


_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(?P<title>.*?)\s*#*\s*$")


def python_blocks(text: str) -> tuple[list[Snippet], int]:
    """Every fenced python block, and how many MARKER lines the README holds (outside fences)."""
    blocks: list[Snippet] = []
    markers = 0
    heading = ""
    pending_marker = False
    fence: str | None = None
    is_python = False
    start = 0
    body: list[str] = []
    marked = False
    for number, line in enumerate(text.splitlines(), start=1):
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence[0]) and set(stripped) == {fence[0]} \
                    and len(stripped) >= len(fence):
                if is_python:
                    blocks.append(Snippet("\n".join(body) + "\n", start, heading, marked))
                fence = None
            else:
                body.append(line)
            continue
        opening = _FENCE.match(line)
        if opening is not None:
            fence = opening.group("fence")
            is_python = opening.group("info").lower() in PYTHON_INFO
            start, body, marked = number, [], pending_marker
            pending_marker = False
            continue
        if line.strip() == MARKER:
            markers += 1
            pending_marker = True
            continue
        if not line.strip():
            continue
        pending_marker = False
        found = _HEADING.match(line)
        if found is not None:
            heading = found.group("title")
    return blocks, markers


def _is_quick_start(title: str) -> bool:
    return re.sub(r"[\s_-]+", "", title.casefold()).startswith("quickstart")


def find_snippets(text: str, section: str | None = None) -> tuple[list[Snippet], str]:
    """The README snippets to run, and a sentence saying how they were chosen.

    ``section``: the first python block under a heading containing it. Otherwise every block
    marked with MARKER; otherwise the first python block after the "Quick start" heading (or
    the first python block at all when there is no such heading).
    """
    blocks, markers = python_blocks(text)
    if not blocks:
        raise CheckFailed("the README has no ```python block")
    if section is not None:
        for block in blocks:
            if section.casefold() in block.heading.casefold():
                return [block], f"first python block under heading {block.heading!r}"
        raise CheckFailed(f"no python block under a heading containing {section!r}")
    marked = [b for b in blocks if b.marked]
    if markers:
        if len(marked) != markers:
            raise CheckFailed(f"{markers} {MARKER} line(s) but {len(marked)} python block(s) "
                              "right after one: a marker must sit just above a ```python fence")
        return marked, f"the python block(s) marked {MARKER}"
    heading_line = 0
    for number, line in enumerate(text.splitlines(), start=1):
        found = _HEADING.match(line)
        if found is not None and _is_quick_start(found.group("title")):
            heading_line = number
            break
    after = [b for b in blocks if b.line > heading_line]
    if not after:
        raise CheckFailed("no python block after the Quick start heading")
    how = ("first python block after the 'Quick start' heading" if heading_line
           else "first python block (no 'Quick start' heading)")
    return [after[0]], how + f" (no {MARKER} marker)"


# --------------------------------------------------------------------- PySpark left alone
class DistSnapshot(TypedDict):
    """What is on disk of one installed distribution (see ``_PROBE``)."""

    version: str
    copies: int
    dist_info: str
    record_sha256: str
    dist_info_files: dict[str, list[int]]  # name -> [size, mtime_ns, inode]
    package_dir: str | None
    package_init: list[int] | None  # [size, mtime_ns, inode] of the package's __init__.py


#: Run by the fresh environment's Python: a JSON snapshot of the distributions named in argv.
_PROBE = r"""
import hashlib, importlib.util, json, os, sys
from importlib import metadata
from pathlib import Path

def stat(path):
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino]

out = {}
for name in sys.argv[1:]:
    dists = [d for d in metadata.distributions()
             if (d.metadata["Name"] or "").lower().replace("_", "-") == name]
    if not dists:
        out[name] = None
        continue
    dist = dists[0]
    record = next(f for f in dist.files or [] if f.name == "RECORD"
                  and f.parent.name.endswith(".dist-info"))
    info = Path(dist.locate_file(record.parent)).resolve()
    top = (dist.read_text("top_level.txt") or name).split()[0]
    spec = importlib.util.find_spec(top)
    pkg = (Path(list(spec.submodule_search_locations)[0]).resolve()
           if spec and spec.submodule_search_locations else None)
    out[name] = {
        "version": dist.version,
        "copies": len(dists),
        "dist_info": str(info),
        "record_sha256": hashlib.sha256((info / "RECORD").read_bytes()).hexdigest(),
        "dist_info_files": {p.name: stat(p) for p in sorted(info.iterdir()) if p.is_file()},
        "package_dir": str(pkg) if pkg else None,
        "package_init": stat(pkg / "__init__.py") if pkg and (pkg / "__init__.py").exists() else None,
    }
print(json.dumps(out))
"""


def compare_snapshots(before: Mapping[str, DistSnapshot | None],
                      after: Mapping[str, DistSnapshot | None]) -> list[str]:
    """How the distributions changed between two snapshots (empty: untouched)."""
    problems: list[str] = []
    for name, old in before.items():
        new = after.get(name)
        if old is None:
            problems.append(f"{name} was not installed before the wheel")
            continue
        if new is None:
            problems.append(f"{name} was uninstalled")
            continue
        if new["version"] != old["version"]:
            problems.append(f"{name} changed version {old['version']} -> {new['version']}")
        if new["copies"] != old["copies"]:
            problems.append(f"{name}: {new['copies']} installed copies, was {old['copies']}")
        if new["dist_info"] != old["dist_info"]:
            problems.append(f"{name} moved: dist-info {old['dist_info']} -> {new['dist_info']}")
        if new["package_dir"] != old["package_dir"]:
            problems.append(f"{name} moved: package {old['package_dir']} -> {new['package_dir']}")
        if new["record_sha256"] != old["record_sha256"]:
            problems.append(f"{name}: RECORD changed (reinstalled)")
        old_files, new_files = old["dist_info_files"], new["dist_info_files"]
        for fname in sorted(set(old_files) | set(new_files)):
            if fname not in new_files:
                problems.append(f"{name}: dist-info file {fname} removed")
            elif fname not in old_files:
                problems.append(f"{name}: dist-info file {fname} added")
            elif new_files[fname] != old_files[fname]:
                problems.append(f"{name}: dist-info file {fname} rewritten")
        if new["package_init"] != old["package_init"]:
            problems.append(f"{name}: package __init__.py rewritten")
    return problems


def pip_touched(output: str, names: Iterable[str]) -> list[str]:
    """What pip's output says it did to the distributions ``names``."""
    wanted = {normalize_name(n) for n in names}
    problems: list[str] = []
    for line in output.splitlines():
        line = line.strip()
        for prefix in ("Attempting uninstall:", "Found existing installation:"):
            if line.startswith(prefix):
                name = line[len(prefix):].split()[0] if line[len(prefix):].split() else ""
                if normalize_name(name) in wanted:
                    problems.append(f"pip: {line}")
        if line.startswith("Successfully installed "):
            for token in line.split()[2:]:
                if normalize_name(token.rsplit("-", 1)[0]) in wanted:
                    problems.append(f"pip installed {token}")
        if line.startswith("Successfully uninstalled "):
            token = line.split()[-1]
            if normalize_name(token.rsplit("-", 1)[0]) in wanted:
                problems.append(f"pip uninstalled {token}")
    return problems


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output (``1.8.0`` -> 8).

    >>> java_major('openjdk version "17.0.15" 2025-04-15')
    17
    """
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def source_version(init_text: str) -> str | None:
    """``__version__`` as the package's ``__init__.py`` assigns it."""
    match = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", init_text, re.M)
    return match.group(1) if match else None


# -------------------------------------------------------------------------------- running
def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_cmd(cmd: Sequence[str | Path], *, cwd: Path | None = None,
            env: Mapping[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, capturing its output as text; never raises on a non-zero status."""
    try:
        return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"{' '.join(map(str, cmd))} ran longer than {timeout:.0f} s") from exc


def must(proc: subprocess.CompletedProcess[str], what: str) -> str:
    """``proc``'s stdout, or CheckFailed naming ``what`` with the end of its output."""
    if proc.returncode != 0:
        raise CheckFailed(f"{what} failed (exit {proc.returncode}):\n"
                          + _tail(proc.stdout + "\n" + proc.stderr))
    return proc.stdout


def venv_bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if sys.platform == "win32" else "bin") / name


def venv_env(venv: Path) -> dict[str, str]:
    """The environment a user of ``venv`` has: its bin first, nothing leaking from here."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "SPARK_HOME",
            "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS", "__PYVENV_LAUNCHER__"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    python = str(venv_bin(venv, "python"))
    env.update(PATH=f"{venv_bin(venv, '')}{os.pathsep}{env.get('PATH', '')}",
               VIRTUAL_ENV=str(venv), PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python,
               PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@dataclass
class Result:
    step: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def add(self, step: str, ok: bool, detail: str, seconds: float) -> None:
        self.results.append(Result(step, ok, detail, seconds))
        mark = "ok  " if ok else "FAIL"
        print(f"[{mark}] {step} ({seconds:.1f} s)", flush=True)
        if detail:
            print(_indent(detail), flush=True)

    def summary(self, total: float) -> str:
        lines = ["", "summary:"]
        for r in self.results:
            first, *rest = (r.detail or "").splitlines() or [""]
            lines.append(f"  [{'ok  ' if r.ok else 'FAIL'}] {r.step:<22} {r.seconds:6.1f} s  {first}")
            if not r.ok:
                lines += ["        " + ln for ln in rest]
        verdict = "all checks passed" if self.ok else \
            f"{sum(not r.ok for r in self.results)} check(s) FAILED"
        lines.append(f"{verdict} in {total:.1f} s")
        return "\n".join(lines)


def _indent(text: str, prefix: str = "       ") -> str:
    return "\n".join(prefix + ln for ln in text.splitlines())


class _Abort(Exception):
    """A step that later steps depend on failed."""


class WheelCheck:
    """The steps, sharing the temporary directory and what earlier steps found."""

    def __init__(self, args: argparse.Namespace, tmp: Path, report: Report) -> None:
        self.args = args
        self.tmp = tmp
        self.report = report
        self.dist_dir = tmp / "dist"
        self.venv = tmp / "venv"
        self.workdir = tmp / "run"
        self.project = parse_setup_cfg((ROOT / "setup.cfg").read_text())
        self.version = source_version((ROOT / PACKAGE / "__init__.py").read_text())
        self.sdist: Path | None = None
        self.wheel: Path | None = None
        self.before: dict[str, DistSnapshot | None] = {}
        self.pip_output = ""

    def step(self, name: str, fn: Callable[[], str], fatal: bool = False) -> None:
        print(f"--> {name}", flush=True)
        self.report_step(name, self.timed(fn), fatal)

    @staticmethod
    def timed(fn: Callable[[], str]) -> tuple[bool, str, float]:
        """Run one step: (passed, detail, seconds); only CheckFailed counts as a failed check."""
        start = time.monotonic()
        try:
            detail = fn()
        except CheckFailed as exc:
            return False, str(exc), time.monotonic() - start
        return True, detail, time.monotonic() - start

    def report_step(self, name: str, outcome: tuple[bool, str, float],
                    fatal: bool = False) -> None:
        ok, detail, seconds = outcome
        self.report.add(name, ok, detail, seconds)
        if fatal and not ok:
            raise _Abort

    def run(self) -> None:
        # The fresh venv with PySpark does not need the build: it is made in a thread beside
        # the build and the checks of what was built, and reported in its place. So is the
        # import check beside the README snippet (both only read the venv).
        with ThreadPoolExecutor(max_workers=1) as pool:
            print("--> venv with PySpark (beside the build)", flush=True)
            venv = pool.submit(self.timed, self.venv_with_pyspark)
            try:
                self.step("build sdist + wheel", self.build, fatal=True)
                self.step("twine check --strict", self.twine_check)
                self.step("wheel contents", self.wheel_contents)
                self.step("wheel metadata", self.wheel_metadata)
                self.step("sdist contents", self.sdist_contents)
            finally:
                outcome = venv.result()  # the temporary directory outlives the thread
            self.report_step("venv with PySpark", outcome, fatal=True)
            self.step("pip install wheel", self.install_wheel, fatal=True)
            self.step("PySpark untouched", self.pyspark_untouched)
            print("--> import in venv (beside the README snippet)", flush=True)
            imported = pool.submit(self.timed, self.import_in_venv)
            try:
                self.step("README snippet", self.readme_snippet)
            finally:
                outcome = imported.result()
            self.report_step("import in venv", outcome)

    # ----------------------------------------------------------------- steps
    def build(self) -> str:
        proc = run_cmd([sys.executable, "-m", "build", "--outdir", self.dist_dir, ROOT],
                       cwd=ROOT)
        must(proc, "python -m build")
        sdists = sorted(self.dist_dir.glob("*.tar.gz"))
        wheels = sorted(self.dist_dir.glob("*.whl"))
        if len(sdists) != 1 or len(wheels) != 1:
            raise CheckFailed(f"expected one sdist and one wheel, got {sdists + wheels}")
        self.sdist, self.wheel = sdists[0], wheels[0]
        return (f"{self.sdist.name} ({self.sdist.stat().st_size // 1024} KiB), "
                f"{self.wheel.name} ({self.wheel.stat().st_size // 1024} KiB, built from the sdist)")

    def twine_check(self) -> str:
        assert self.sdist is not None and self.wheel is not None
        proc = run_cmd([sys.executable, "-m", "twine", "check", "--strict", self.sdist,
                        self.wheel], env={**os.environ, "NO_COLOR": "1"})
        must(proc, "twine check --strict")
        return "both PASSED"

    def _wheel_meta(self) -> tuple[zipfile.ZipFile, str, WheelName]:
        assert self.wheel is not None
        parts = parse_wheel_filename(self.wheel.name)
        return zipfile.ZipFile(self.wheel), f"{parts.distribution}-{parts.version}.dist-info", parts

    def wheel_contents(self) -> str:
        zf, dist_info, _ = self._wheel_meta()
        with zf:
            names = zf.namelist()
            problems = check_wheel_names(names, PACKAGE, dist_info)
            problems += [f"module of the source tree missing: {m}"
                         for m in missing_modules(source_modules(ROOT), names)]
            try:
                problems += check_entry_points(zf.read(f"{dist_info}/entry_points.txt").decode(),
                                               self.project)
            except KeyError:
                if self.project.console_scripts:
                    problems.append("no entry_points.txt, setup.cfg declares console scripts")
        if problems:
            raise CheckFailed("\n".join(problems))
        modules = sum(n.endswith(".py") for n in names)
        return f"{len(names)} files: {modules} modules, py.typed, dist-info; no tests/caches"

    def wheel_metadata(self) -> str:
        zf, dist_info, parts = self._wheel_meta()
        with zf:
            meta = parse_metadata(zf.read(f"{dist_info}/METADATA").decode())
        problems = check_metadata(meta, self.project, self.version)
        if (parts.python_tag, parts.abi_tag, parts.platform_tag) != ("py3", "none", "any"):
            problems.append(f"wheel tag {parts.python_tag}-{parts.abi_tag}-{parts.platform_tag}"
                            ", expected py3-none-any for a pure-Python package")
        if parts.version != meta.version:
            problems.append(f"file name version {parts.version} != METADATA {meta.version}")
        if problems:
            raise CheckFailed("\n".join(problems))
        base = ", ".join(str(r) for r in meta.base_requirements())
        spark = ", ".join(sorted(e for e in meta.provides_extra
                                 if any(r.name == "pyspark" for r in meta.extra_requirements(e))))
        return (f"Requires-Python {meta.requires_python}; base: {base}; "
                f"pyspark only in extras: {spark}")

    def sdist_contents(self) -> str:
        assert self.sdist is not None
        top = self.sdist.name.removesuffix(".tar.gz")
        with tarfile.open(self.sdist) as tf:
            members = tf.getmembers()
            names = [m.name for m in members]
            files = [m.name for m in members if m.isfile()]
            pkg_info = tf.extractfile(f"{top}/PKG-INFO") if f"{top}/PKG-INFO" in names else None
            meta_text = pkg_info.read().decode() if pkg_info is not None else None
        problems = check_sdist_names(names, top)
        problems += [f"module of the source tree missing: {m}"
                     for m in missing_modules(source_modules(ROOT), names, prefix=f"{top}/")]
        if meta_text is not None:
            problems += [f"PKG-INFO: {p}" for p in
                         check_metadata(parse_metadata(meta_text), self.project, self.version)]
        if problems:
            raise CheckFailed("\n".join(problems))
        return f"{len(files)} files, builds the wheel and carries tests/, tools/, examples/"

    def venv_with_pyspark(self) -> str:
        must(run_cmd([sys.executable, "-m", "venv", self.venv]), "python -m venv")
        python = venv_bin(self.venv, "python")
        env = venv_env(self.venv)
        version = self.args.pyspark_version
        proc = run_cmd([python, "-m", "pip", "install", f"pyspark=={version}"], env=env,
                       timeout=self.args.pip_timeout)
        must(proc, f"pip install pyspark=={version}")
        self.before = self._snapshot()
        spark = self.before.get("pyspark")
        if spark is None or spark["version"] != version:
            raise CheckFailed(f"pyspark {version} is not what the venv holds: {spark}")
        return f"pyspark {version} at {spark['package_dir']}"

    def _snapshot(self) -> dict[str, DistSnapshot | None]:
        proc = run_cmd([venv_bin(self.venv, "python"), "-c", _PROBE, *SPARK_DISTS],
                       cwd=self.tmp, env=venv_env(self.venv))
        snap: dict[str, DistSnapshot | None] = json.loads(must(proc, "the PySpark probe"))
        return snap

    def install_wheel(self) -> str:
        assert self.wheel is not None
        proc = run_cmd([venv_bin(self.venv, "python"), "-m", "pip", "install", self.wheel],
                       env=venv_env(self.venv), timeout=self.args.pip_timeout)
        self.pip_output = must(proc, f"pip install {self.wheel.name}") + proc.stderr
        installed = next((ln.strip() for ln in self.pip_output.splitlines()
                          if ln.startswith("Successfully installed")), "")
        return installed.replace("Successfully installed", "installed:")

    def pyspark_untouched(self) -> str:
        after = self._snapshot()
        problems = pip_touched(self.pip_output, SPARK_DISTS)
        problems += compare_snapshots(self.before, after)
        if problems:
            raise CheckFailed("the wheel's install changed PySpark:\n" + "\n".join(problems))
        parts = []
        for name, snap in after.items():
            assert snap is not None
            parts.append(f"{name} {snap['version']} ({len(snap['dist_info_files'])} dist-info "
                         "files, RECORD hash and inodes unchanged)")
        return "; ".join(parts)

    def import_in_venv(self) -> str:
        env = venv_env(self.venv)
        python = venv_bin(self.venv, "python")
        self.workdir.mkdir(exist_ok=True)
        must(run_cmd([python, "-m", "pip", "check"], env=env), "pip check")
        code = ("import json, pyspark, trilink_spark as tl; print(json.dumps({'tl': tl.__file__, "
                "'version': tl.__version__, 'pyspark': pyspark.__version__}))")
        found = json.loads(must(run_cmd([python, "-c", code], cwd=self.workdir, env=env),
                                "import trilink_spark"))
        location = Path(found["tl"]).resolve()
        problems = []
        if not location.is_relative_to(self.venv.resolve()):
            problems.append(f"trilink_spark imported from {location}, not from the venv")
        if found["version"] != self.version:
            problems.append(f"trilink_spark.__version__ {found['version']} != {self.version}")
        if found["pyspark"] != self.args.pyspark_version:
            problems.append(f"pyspark {found['pyspark']} imported, not {self.args.pyspark_version}")
        for script in self.project.console_scripts:
            must(run_cmd([venv_bin(self.venv, script), "--help"], cwd=self.workdir, env=env),
                 f"{script} --help")
        if problems:
            raise CheckFailed("\n".join(problems))
        scripts = ", ".join(f"{s} --help" for s in self.project.console_scripts)
        return (f"pip check clean; trilink_spark {found['version']} from the venv with "
                f"pyspark {found['pyspark']}; {scripts} runs")

    def readme_snippet(self) -> str:
        snippets, how = find_snippets((ROOT / "README.md").read_text(), self.args.section)
        env = venv_env(self.venv)
        java = os.path.join(env["JAVA_HOME"], "bin", "java") if env.get("JAVA_HOME") else "java"
        if shutil.which(java) is None:
            raise CheckFailed(f"no Java found ({java}): Spark needs Java {MIN_JAVA}+")
        jv = run_cmd([java, "-version"], env=env)
        major = java_major(jv.stderr + jv.stdout)
        if major is None or major < MIN_JAVA:
            raise CheckFailed(f"Java {MIN_JAVA}+ needed, found: {_tail(jv.stderr, 1)}")
        self.workdir.mkdir(exist_ok=True)
        if self.args.java_options:
            env["PYSPARK_SUBMIT_ARGS"] = shlex.join(
                ["--driver-java-options", self.args.java_options, "pyspark-shell"])
        outputs = []
        for number, snippet in enumerate(snippets):
            path = self.workdir / f"readme_snippet_{number}.py"
            path.write_text(snippet.code)
            proc = run_cmd([venv_bin(self.venv, "python"), path], cwd=self.workdir, env=env,
                           timeout=self.args.snippet_timeout)
            must(proc, f"README.md line {snippet.line} (under {snippet.heading!r})")
            outputs.append(f"README.md line {snippet.line} (under {snippet.heading!r}) printed:\n"
                           + _indent(proc.stdout.rstrip(), "    | "))
        return f"{how}; Java {major}\n" + "\n".join(outputs)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pyspark-version",
                        help="PySpark to preinstall (default: the one of this environment)")
    parser.add_argument("--section", help="run the first python block under this README heading")
    parser.add_argument("--keep-temp", action="store_true",
                        help="keep the temporary directory (dist, venv) for inspection")
    parser.add_argument("--pip-timeout", type=float, default=1800, help="seconds per pip install")
    parser.add_argument("--snippet-timeout", type=float, default=900,
                        help="seconds the README snippet may run")
    parser.add_argument("--java-options", default=JAVA_OPTIONS,
                        help="JVM options of the snippet's Spark driver (default %(default)r: "
                             "the C1 JIT alone, a third less CPU for a short job; '' for none)")
    args = parser.parse_args(argv)
    if args.pyspark_version is None:
        try:
            args.pyspark_version = metadata.version("pyspark")
        except metadata.PackageNotFoundError:
            raise ToolMissing("pyspark is not installed here: pass --pyspark-version") from None
    for module in ("build", "twine"):
        if importlib.util.find_spec(module) is None:
            raise ToolMissing(f"{module} is not installed in {sys.prefix}: "
                              "pip install -e '.[test]'")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    try:
        args = parse_args(argv)
    except ToolMissing as exc:
        print(f"check_wheel: {exc}", file=sys.stderr)
        return 2
    report = Report()
    tmp = Path(tempfile.mkdtemp(prefix="trilink-wheel-check-"))
    try:
        WheelCheck(args, tmp, report).run()
    except _Abort:
        print("stopping: later checks need this step", flush=True)
    except KeyboardInterrupt:
        report.add("interrupted", False, "interrupted", 0.0)
    finally:
        if args.keep_temp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report.summary(time.monotonic() - started), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
