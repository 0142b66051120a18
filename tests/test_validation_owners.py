"""One owner per rule: the "must be one of" check, the int64 bound, the count check and the key
display rule live in ``_internal/validation``; the history record has one checker, which the
run that writes a record, the reader of a state path and the dashboard all call. The scans
below fail when a second copy comes back (each is shown failing on a synthetic module)."""

from __future__ import annotations

import ast
import importlib
import logging
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from trilink_spark._internal import validation
from trilink_spark.errors import (ConfigError, ConfigTypeError, InvalidArgumentError,
                                  InvalidArgumentTypeError, StateCorruptError)
from trilink_spark.keyed.records import history
from trilink_spark.state import KeyedStateStore, formats
from trilink_spark.ui import records

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trilink_spark"
OWNER = PACKAGE / "_internal" / "validation.py"

#: Modules whose owners are moving their copies to validation now: each entry goes once its
#: module no longer holds one (the scans never fail for a module listed here).
PENDING_CHOICES: set[str] = set()
PENDING_INT64: set[str] = set()

_ONE_OF = re.compile(r"must be\b.{0,60}?\bone of\b")
_INT64_VALUES = {2**63 - 1, 2**63}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of ``tree`` (modules, classes, functions)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def _text_of(node: ast.AST) -> str | None:
    """The text of a string literal or f-string (``{}`` for each placeholder)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                       else "{}" for v in node.values)
    return None


def hand_written_choices(source: str) -> list[int]:
    """Lines of ``source`` holding a "must be ... one of" message outside a docstring: a
    choice check written by hand instead of through ``validation.choice``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        text = _text_of(node)
        if text is not None and _ONE_OF.search(text):
            found.append(node.lineno)
    return sorted(set(found))


def int64_literals(source: str) -> list[int]:
    """Lines of ``source`` spelling the int64 bound: ``2 ** 63`` (and ``- 1``), its value as
    a literal, ``np.iinfo(np.int64)``, or ``1 << 63`` outside a ``uint64(...)`` bit mask."""
    tree = ast.parse(source)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant) \
                and isinstance(node.right, ast.Constant):
            pair = (node.left.value, node.right.value)
            if isinstance(node.op, ast.Pow) and pair == (2, 63):
                found.append(node.lineno)
            if isinstance(node.op, ast.LShift) and pair == (1, 63):
                call = getattr(node, "parent", None)
                mask = isinstance(call, ast.Call) and ast.unparse(call.func).endswith("uint64")
                if not mask:
                    found.append(node.lineno)
        elif isinstance(node, ast.Constant) and type(node.value) is int \
                and abs(node.value) in _INT64_VALUES:
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("iinfo") \
                and node.args and ast.unparse(node.args[0]).endswith("int64"):
            found.append(node.lineno)
    return sorted(set(found))


def _modules() -> list[tuple[str, str]]:
    return [(p.relative_to(PACKAGE).as_posix(), p.read_text(encoding="utf-8"))
            for p in sorted(PACKAGE.rglob("*.py")) if p != OWNER]


# ------------------------------------------------------------------ the scans
SYNTHETIC = '''
"""A module whose docstring says a mode must be one of a few: that is prose, not a check."""
MODES = ("a", "b")
LIMIT = 2**63 - 1
BIG = 9223372036854775807
MASK = np.uint64(1 << 63)
TOP = 1 << 63
RANGE = np.iinfo(np.int64).max


def check(mode):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def check_auto(mode):
    if mode not in MODES:
        raise ValueError(f"mode must be 'auto' or one of {MODES}, got {mode!r}")
'''


def test_the_scans_find_a_second_copy_in_a_synthetic_module() -> None:
    assert hand_written_choices(SYNTHETIC) == [13, 18]
    assert int64_literals(SYNTHETIC) == [4, 5, 7, 8]  # the uint64 sign-bit mask is no bound
    assert hand_written_choices(OWNER.read_text(encoding="utf-8"))  # the owner's own message


def test_no_module_but_validation_writes_a_one_of_check_by_hand() -> None:
    found = {name: lines for name, text in _modules()
             if (lines := hand_written_choices(text)) and name not in PENDING_CHOICES}
    assert found == {}, "use trilink_spark._internal.validation.choice"


def test_no_module_but_validation_spells_the_int64_bound() -> None:
    found = {name: lines for name, text in _modules()
             if (lines := int64_literals(text)) and name not in PENDING_INT64}
    assert found == {}, "use validation.INT64_MIN / INT64_MAX / fits_int64"


def test_the_key_display_rule_and_the_limits_have_one_home() -> None:
    assert history.display_key is validation.display_key
    assert records.key_text is validation.key_text
    assert formats.is_count is validation.is_count
    assert history.MAX_KEY_CHARS == validation.KEY_DISPLAY_CHARS
    assert formats.MAX_PROFILE_KEY_CHARS == validation.MAX_KEY_TEXT_CHARS
    longest = validation.display_key(bytes(1000))
    assert isinstance(longest, str) and len(longest) <= validation.MAX_KEY_TEXT_CHARS
    assert validation.key_text("k" * 500) == validation.display_key("k" * 500)
    assert validation.check_key(validation.display_key("x" * 10_000), "key")
    with pytest.raises(InvalidArgumentError, match="at most 100"):
        validation.check_key("x" * 101, "key")


def test_counts_and_the_int64_range_have_one_check() -> None:
    assert validation.is_count(validation.INT64_MAX, 0, validation.INT64_MAX)
    assert not validation.is_count(validation.INT64_MAX + 1, 0, validation.INT64_MAX)
    assert not validation.is_count(True) and not validation.is_count(-1)
    assert validation.fits_int64(validation.INT64_MIN)
    assert not validation.fits_int64(validation.INT64_MIN - 1)
    with pytest.raises(InvalidArgumentError, match=r"at most 9,223,372,036,854,775,807"):
        validation.count(10**400, "rows", 0, high=validation.INT64_MAX)


def test_choice_names_what_is_allowed_with_the_callers_classes() -> None:
    with pytest.raises(ConfigTypeError, match=r"mode must be a str, one of 'a', 'b', got int"):
        validation.choice(1, "mode", ("a", "b"), error=ConfigError, type_error=ConfigTypeError)
    with pytest.raises(InvalidArgumentError,
                       match=r"store must be one of 'x' or a RedisStore, got 'y'"):
        validation.choice("y", "store", ("x",), also=" or a RedisStore")


# ------------------------------------------------------------------ the history record
def good(batch: int = 3, **fields: Any) -> dict[str, Any]:
    """A record as a run writes it: every field of the layout."""
    body: dict[str, Any] = {
        "v": 1, "batch": batch, "time": 1795000000.0, "seconds": 0.5, "strategy": "hash",
        "partitions": 2, "rows": [10, 5], "task_ms": [1.5, -1.0], "late": [0, 0],
        "late_partition": [0, 1], "hot_keys": [["a", 6, 0]],
        "sample": {"keys": ["a", "b"], "weights": [6.0, 4.0]},
        "swap": None, "request": {"request_id": "r1", "strategy": "hash",
                                  "num_partitions": 2, "mode": "sync"},
        "rebalance": {"state": "steady", "moves": 0, "reason": "balanced"}}
    body.update(fields)
    return body


#: Records the old state-path check took and the dashboard refused: now both refuse them.
REFUSED = {
    "hot key on a partition not there": (good(hot_keys=[["k", 5, 2]]),
                                         "record.hot_keys[0] partition must be at most 1"),
    "a key longer than a stored key": (good(hot_keys=[["k" * 101, 5, 0]]),
                                       "record.hot_keys[0] key is 101 characters long"),
    "a figure of -2": (good(rows=[10, -2]), "record.rows[1] must be a finite number >= 0"),
    "negative seconds": (good(seconds=-1), "record.seconds must be >= 0.0, got -1"),
    "a strategy name too long": (good(strategy="s" * 201), "record.strategy is 201 characters"),
    "too many hot keys": (good(hot_keys=[["k", 1, 0]] * 101), "at most 100 are allowed"),
    "sample lengths differ": (good(sample={"keys": ["a"], "weights": []}),
                              "holds 1 keys and 0 weights"),
    "a request without an id": (good(request={"strategy": "hash"}),
                                "record.request.request_id must be a str"),
    "a batch of -1": (good(batch=-1), "record.batch must be >= 0, got -1"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_run_the_reader_and_the_dashboard_refuse_a_record_alike(
        tmp_path: Path, case: str) -> None:
    body, words = REFUSED[case]
    message = re.escape(words)
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match=message):
        records.parse_batch_record(body)  # given as an argument: an argument error
    store = KeyedStateStore(str(tmp_path / "state"))
    name = history.record_name(7)
    store.save_record(name, body)
    path = store.record_path(name)
    for read in (lambda: history.read_history_record(store, 7),
                 lambda: records.read_batch_record(store, 7, "run")):
        with pytest.raises(StateCorruptError, match=message) as caught:
            read()  # read from a state path: the file is named
        assert str(caught.value).startswith(f"{path}: not a history record of version 1")


def test_a_stored_record_must_hold_every_field_a_given_one_need_not(tmp_path: Path) -> None:
    body = {k: v for k, v in good().items() if k != "late_partition"}
    assert records.parse_batch_record(body).late_partition is None
    store = KeyedStateStore(str(tmp_path / "state"))
    store.save_record(history.record_name(3), body)
    with pytest.raises(StateCorruptError, match="record lacks late_partition"):
        history.read_history(store)


def test_a_record_read_once_is_the_view_of_the_record_given(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    store.save_record(history.record_name(3), good())
    read = records.read_batch_record(store, 3, "clicks")
    given = records.parse_batch_record({**history.read_history_record(store, 3), "run": "clicks"})
    assert read is not None and read.run == "clicks" == given.run
    for field in ("batch", "time", "seconds", "strategy", "partitions", "hot_keys", "sample",
                  "swap", "request", "rebalance"):
        assert getattr(read, field) == getattr(given, field), field
    assert read.rows.tolist() == given.rows.tolist() == [10.0, 5.0]
    assert read.request == records.SwapRequestView("r1", "hash", 2, "sync")
    assert records.read_batch_record(store, 4, "clicks") is None


def test_the_run_does_not_write_a_record_the_view_would_refuse(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    with caplog.at_level(logging.WARNING, logger=history.__name__):
        assert history.record_batch(store, 5, 2, "s" * 201, seconds=0.1, keep=10) is None
    assert "record.strategy is 201 characters" in caplog.text
    assert history.history_batches(store) == []
    written = history.record_batch(store, 6, 2, "hash", seconds=0.1, keep=10)
    assert written is not None and history.history_batches(store) == [6]
    assert records.read_batch_record(store, 6, "run") is not None


# ------------------------------------------------------------------ the names that moved
@pytest.mark.parametrize(("module", "old", "new"), [
    ("trilink_spark.ui.records", "parse_record", "parse_batch_record"),
    ("trilink_spark.ui.records", "SwapRequest", "SwapRequestView"),
    ("trilink_spark.state.formats", "parse_record", "parse_small_record"),
])
def test_a_renamed_name_still_resolves_with_one_warning(module: str, old: str, new: str) -> None:
    home = getattr(importlib.import_module(module), new)
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(f"from {module} import {old} as got", "user_code.py", "exec"), namespace)
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert namespace["got"] is home
    assert len(moved) == 1 and f"{module}.{old} has moved to {module}.{new}" \
        in str(moved[0].message)
    assert moved[0].filename == "user_code.py"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        getattr(importlib.import_module(module), "nothing")
