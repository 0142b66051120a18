"""Handing a task's freed memory back to the operating system.

PySpark reuses its Python workers: one worker runs many tasks, and whatever a large task
allocated stays with the worker. Arrow's allocator (mimalloc or jemalloc in the wheels) keeps
freed pages for later allocations, and glibc keeps freed heap below its top. A worker that once
loaded a million keys would hold that peak for the rest of the query.
:func:`release_unused_memory` returns both at the end of a task: Arrow's
``MemoryPool.release_unused`` and, where the C library has it, ``malloc_trim(0)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["release_unused_memory"]


@functools.cache
def _malloc_trim() -> Any:
    """The C library's ``malloc_trim``, or None where it has none (resolved once)."""
    try:
        name = ctypes.util.find_library("c")
        found = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError as err:  # no C library to load: nothing to trim
        logger.debug("malloc_trim unavailable (%s)", err)
        return None
    if found is not None:
        found.argtypes = [ctypes.c_size_t]
        found.restype = ctypes.c_int
    return found


def release_unused_memory() -> None:
    """Return Arrow's cached pages and freed heap to the operating system
    (``pyarrow.default_memory_pool().release_unused()`` and glibc's ``malloc_trim(0)``, where
    present). Never raises. Cost: proportional to what is freed (milliseconds after a task of
    a few hundred MB); the next task allocates afresh.

    Examples
    --------
    >>> release_unused_memory()
    """
    trim = _malloc_trim()
    if trim is not None:
        try:
            trim(0)
        except (OSError, ValueError) as err:  # pragma: no cover - a C call that failed
            logger.debug("malloc_trim failed (%s)", err)
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError, OSError) as err:  # pragma: no cover
        logger.debug("Arrow's pool not released (%s)", err)
