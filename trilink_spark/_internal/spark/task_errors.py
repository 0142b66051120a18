"""A :class:`~trilink_spark.errors.TrilinkError` raised inside a Spark task, typed again on the
driver.

Spark hands a task's exception to the driver as text: a ``PythonException`` (classic and
Connect) or a ``Py4JJavaError`` whose message holds the Python worker's traceback, and a JVM
``raise_error`` as a ``SparkRuntimeException`` holding its message. :func:`task_error` finds
the last ``trilink_spark.errors.<Name>: <message>`` in that text (the exception that left the
task) and builds the same class with the same message; :func:`typed_task_errors` raises it in
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

_NAMED = re.compile(r"trilink_spark\.errors\.([A-Z][A-Za-z]*): ")
#: Where a task's message ends in Spark's text: the JVM's frames or its stack trace section.
_END = re.compile(r"\n\s*\n|\n\tat |\n\s*JVM stacktrace:|\n\s*at [a-z]+\.[a-z]")
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
    found = None
    for found in _NAMED.finditer(text):
        pass
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
