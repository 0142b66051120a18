"""Versioned keyed state of a streaming keyed processor, on any ``pyarrow.fs`` filesystem.

Layout under the state path::

    strategy.json                         the placement, fixed at the first batch
    partition=00003/000000000042.state    partition 3's state after batch 42

A task writes ``<version>.state.tmp-<uuid>`` and renames it, so readers see whole files only.
"""

from __future__ import annotations

import logging
import uuid
import pickle
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ..errors import StateStoreError
from ..files import resolve_filesystem, write_atomic
from ..partitioners import Partitioner
from ..partitioners.persistence import read_strategy, write_strategy

__all__ = ["KeyedStateStore", "StatefulBatchFunction"]

logger = logging.getLogger(__name__)

_SUFFIX = ".state"


class KeyedStateStore:
    """Per-partition state files, one version per micro-batch.

    Parameters
    ----------
    path : str
        Local directory or URI (``file://``, ``s3://``, ``gs://``, ``hdfs://`` ...).
    filesystem : pyarrow.fs.FileSystem, optional
        Default: ``pyarrow.fs.FileSystem.from_uri(path)`` (a plain path is local).
    keep_versions : int
        Versions kept per partition; older ones are deleted by :meth:`prune`.

    Raises
    ------
    StateStoreError
        The path cannot be created or written (checked once, on the driver, with a probe file).

    Notes
    -----
    Picklable (it travels to executors with the task). Cost per task: one directory listing
    and one read before, one write and one rename after. Executors need access to the path
    (local mode: any directory; a cluster: a shared filesystem). A file ``<name>.state`` whose
    name is not a version, or a ``partition=<name>`` directory whose name is not a number, is
    not this store's: reading the store then raises
    :class:`~trilink_spark.StateCorruptError` naming it, rather than guessing.
    """

    def __init__(self, path: str, filesystem: Any = None, keep_versions: int = 10) -> None:
        if not isinstance(path, str) or not path:
            raise InvalidArgumentTypeError("state path must be a non-empty str")
        if isinstance(keep_versions, bool) or not isinstance(keep_versions, int) or keep_versions < 1:
            raise InvalidArgumentError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
        filesystem, path = resolve_filesystem(path, filesystem)
        self.fs = filesystem
        self.path = path.rstrip("/")
        self.keep_versions = keep_versions
        probe = f"{self.path}/.probe-{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(self.path, recursive=True)
            with self.fs.open_output_stream(probe) as f:
                f.write(b"")
            self.fs.delete_file(probe)
        except OSError as err:
            raise StateStoreError(
                f"state path {self.path} cannot be written ({type(err).__name__}: {err}); give "
                "a writable directory"
            ) from None

    def _dir(self, partition: int) -> str:
        return f"{self.path}/partition={partition:05d}"

    def versions(self, partition: int) -> list[int]:
        """Stored versions of a partition, ascending."""
        from pyarrow import fs

        infos = self._list(self._dir(partition))
        out = []
        for info in infos:
            name = info.base_name
            if info.type == fs.FileType.File and name.endswith(_SUFFIX):
                stem = name[: -len(_SUFFIX)]
                if not stem.isdigit():
                    raise StateCorruptError(
                        f"{info.path} is not a state version of this store (versions are "
                        "named <batch id>.state); move it out of the state path"
                    )
                out.append(int(stem))
        return sorted(out)

    def _list(self, directory: str) -> list[Any]:
        from pyarrow import fs

        try:
            infos: list[Any] = self.fs.get_file_info(
                fs.FileSelector(directory, allow_not_found=True))
        except OSError as err:
            raise StateStoreError(
                f"cannot list {directory} ({type(err).__name__}: {err})") from None
        return infos

    def load_before(self, partition: int, version: int) -> bytes | None:
        """The newest state of ``partition`` older than ``version`` (None: start empty)."""
        older = [v for v in self.versions(partition) if v < version]
        if not older:
            return None
        with self.fs.open_input_stream(f"{self._dir(partition)}/{older[-1]:012d}{_SUFFIX}") as f:
            data: bytes = f.read()
        return data

    def save(self, partition: int, version: int, data: bytes) -> None:
        """Write ``partition``'s state as ``version`` (atomically: temporary file, rename)."""
        directory = self._dir(partition)
        try:
            self.fs.create_dir(directory, recursive=True)
            write_atomic(self.fs, f"{directory}/{version:012d}{_SUFFIX}", data)
        except OSError as err:
            raise StateStoreError(
                f"cannot write state version {version} of partition {partition} under "
                f"{self.path} ({type(err).__name__}: {err})"
            ) from None

    def has_version(self, version: int, partitions: int) -> bool:
        """Whether every partition ``0..partitions-1`` has state ``version``."""
        return all(version in self.versions(p) for p in range(partitions))

    def prune(self, partitions: int, newest: int,
              listed: list[list[int]] | None = None) -> None:
        """Delete versions beyond the newest ``keep_versions`` up to ``newest``.

        ``listed``: each partition's :meth:`versions`, when the caller has just read them.
        """
        for p in range(partitions):
            versions = self.versions(p) if listed is None else listed[p]
            for v in [v for v in versions if v <= newest][: -self.keep_versions]:
                self.fs.delete_file(f"{self._dir(p)}/{v:012d}{_SUFFIX}")

    def latest(self, partition: int) -> bytes | None:
        """The newest state of ``partition``."""
        return self.load_before(partition, 2**62)

    # ------------------------------------------------------------------ placement
    def save_strategy(self, strategy: Partitioner) -> None:
        write_strategy(self.fs, f"{self.path}/strategy.json", strategy)

    def load_strategy(self) -> Partitioner | None:
        return read_strategy(self.fs, f"{self.path}/strategy.json")

    def partitions(self) -> list[int]:
        from pyarrow import fs

        out = []
        for info in self._list(self.path):
            if info.type != fs.FileType.Directory or not info.base_name.startswith("partition="):
                continue
            number = info.base_name.split("=", 1)[1]
            if not number.isdigit():
                raise StateCorruptError(
                    f"{info.path} is not a partition of this store (partitions are named "
                    "partition=<number>); move it out of the state path"
                )
            out.append(int(number))
        return sorted(out)

    def counters(self) -> dict[str, int]:
        """Rows, late and partition-late rows summed over every partition's newest state."""
        total = {"rows": 0, "late": 0, "late_partition": 0}
        for p in self.partitions():
            data = self.latest(p)
            if data is None:
                continue
            state = pickle.loads(data)
            for name in total:
                total[name] += int(getattr(state.counters, name))
        return total

    def state_bytes(self) -> int:
        """Total size of every partition's newest state (for state-cost measurements)."""
        return sum(len(self.latest(p) or b"") for p in self.partitions())


class StatefulBatchFunction:
    """Base of the ``foreachBatch`` callables whose tasks keep state in a KeyedStateStore."""

    def __init__(self, func: Callable[[Any, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        self.func = func
        self.store = store
        self.options = options

    def _complete(self, out: Any, batch_id: int, partitions: int) -> None:
        """After ``func``: make sure every partition wrote state ``batch_id`` (computing ``out``
        once more, to a no-op sink, if ``func`` did not), then prune old versions."""
        listed = [self.store.versions(p) for p in range(partitions)]  # one listing each
        if not all(batch_id in versions for versions in listed):
            logger.info("batch %d: output not computed by func; computing it for the state",
                        batch_id)
            out.write.format("noop").mode("overwrite").save()
            listed = [sorted({*versions, batch_id}) for versions in listed]
        self.store.prune(partitions, batch_id, listed)
