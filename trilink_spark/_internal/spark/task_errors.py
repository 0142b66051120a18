"""A :class:`~trilink_spark.errors.TrilinkError` raised inside a Spark task, typed again on the
driver.

Spark hands a task's exception to the driver as text: a ``PythonException`` (classic and
Connect) or a ``Py4JJavaError`` whose message holds the Python worker's traceback, and a JVM
``raise_error`` as a ``SparkRuntimeException`` holding its message. :func:`task_error` reads
the exception line that ends the text's last traceback (the exception that left the task,
not one it handled or was raised from) or, without a traceback, a ``raise_error``'s message;
when that line is ``trilink_spark.errors.<Name>: <message>`` it builds the same class with
the same message (Spark's ``SQLSTATE`` suffix left off); :func:`typed_task_errors` raises it in
place of Spark's exception, which stays chained (``__cause__``) with the task's traceback.
Nothing is evaluated or unpickled: the class is looked up by name among the package's own
error classes, and any other name leaves Spark's exception as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from ... import errors
from ...errors import TrilinkError

__all__ = ["task_error", "typed_task_errors"]

#: A Python traceback's start: the exception that left the task ends the last one.
_TRACEBACK = "Traceback (most recent call last):"
#: The exception line that ends a traceback, or a JVM raise_error's message: at a line's start.
_NAMED = re.compile(r"^(?:\[USER_RAISED_EXCEPTION\] )?trilink_spark\.errors\.([A-Z][A-Za-z]*): ",
                    re.MULTILINE)
#: Where a task's message ends in Spark's text: the JVM's frames or its stack trace section,
#: or the SQLSTATE Spark appends to a raised error.
_END = re.compile(r"\n\s*\n|\n\tat |\n\s*JVM stacktrace:|\n\s*at [a-z]+\.[a-z]|"
                  r"\s*SQLSTATE: [0-9A-Z]{5}")
#: The longest message kept (a task's message is short; Spark's text may hold megabytes).
MAX_MESSAGE = 8_000


def task_error(err: BaseException) -> TrilinkError | None:
    """The :class:`TrilinkError` a Spark task raised, as Spark's exception ``err`` tells it,
    or None (no package error named in it, or ``err`` is one already). O(len(str(err))).

    Examples
    --------
    >>> text = ("An exception was thrown from the Python worker.\\nTraceback (most recent "
    ...         "call last):\\n  File \\"task.py\\", line 1\\ntrilink_spark.errors."
    ...         "StateCorruptError: p00001.json fails its checksum\\n")
    >>> found = task_error(RuntimeError(text))
    >>> type(found).__name__, str(found)
    ('StateCorruptError', 'p00001.json fails its checksum')
    >>> task_error(RuntimeError("java.lang.OutOfMemoryError")) is None
    True
    """
    if isinstance(err, TrilinkError):
        return None
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - an exception whose text fails names nothing
        return None
    at = text.rfind(_TRACEBACK)
    if at >= 0:  # the last traceback's exception line: the first unindented line after it
        tail = text[at + len(_TRACEBACK):]
        last = re.search(r"^\S.*$", tail, re.MULTILINE)
        found = _NAMED.match(tail, last.start()) if last is not None else None
        text = tail
    else:  # no Python traceback: a JVM raise_error's message
        found = _NAMED.search(text)
    if found is None:
        return None
    cls = getattr(errors, found.group(1), None)
    if not (isinstance(cls, type) and issubclass(cls, TrilinkError)):
        return None
    rest = text[found.end():]
    end = _END.search(rest)
    message = (rest[: end.start()] if end else rest).strip()[:MAX_MESSAGE]
    return cls(message)


@contextmanager
def typed_task_errors() -> Iterator[None]:
    """Raise the :class:`TrilinkError` a Spark task raised inside the block as that error
    (:func:`task_error`), Spark's exception chained; every other exception as it is.

    Examples
    --------
    >>> with typed_task_errors():  # doctest: +SKIP
    ...     df.write.format("noop").mode("overwrite").save()
    """
    try:
        yield
    except TrilinkError:
        raise
    except Exception as err:
        typed = task_error(err)
        if typed is None:
            raise
        raise typed from err
