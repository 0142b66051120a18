"""Does a first snapshot's upload delay a batch's commit? An upload copied beside fsyncs.

A partition's first incremental snapshot uploads all of its table files (130-250 MB at 10M
keys over 4 partitions, RESULTS §26). This measures what such a copy does to the fsync of a
small file written beside it, the shape of a batch's changelog commit. The upload is copied
with its SHA-256 computed on the way, as the snapshot writer does, in three modes: none (the
fsync loop alone), unpaced, and paced (8 MiB steps, each synced, at most ``--rate`` MiB/s).
Each mode after the first runs twice. The fsync loop writes a 2 MiB file, fsyncs it and
removes it every 50 ms.

Run: ``python benches/state/bench_upload_fsync.py [--mb 250] [--rate 96] [--dir DIR]``
(writes benches/results/upload_fsync.json). ``--dir`` must be on the disk the state path and
the local copies use (default: a temporary directory). Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

MIB = 1 << 20


def copy(source: Path, target: Path, paced: bool, rate_mib: float) -> float:
    """Copy ``source`` to ``target`` as the snapshot writer uploads (SHA-256 on the way),
    paced or not; its seconds."""
    digest = hashlib.sha256()
    done = 0
    started = time.perf_counter()
    with open(source, "rb") as f, open(target, "wb") as out:
        while chunk := f.read(MIB):
            digest.update(chunk)
            out.write(chunk)
            done += len(chunk)
            if paced and done % (8 * MIB) == 0:
                out.flush()
                os.fdatasync(out.fileno())
                time.sleep(max(0.0, done / (rate_mib * MIB) - (time.perf_counter() - started)))
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - started


def fsync_loop(folder: Path, stop: threading.Event, took: list[float]) -> None:
    """Write, fsync and remove a 2 MiB file every 50 ms until ``stop``; each one's seconds."""
    payload = os.urandom(2 * MIB)
    i = 0
    while not stop.is_set():
        started = time.perf_counter()
        path = folder / f"commit-{i}"
        with open(path, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()
        took.append(time.perf_counter() - started)
        i += 1
        time.sleep(0.05)


def run_mode(mode: str, folder: Path, source: Path, rate_mib: float) -> dict[str, Any]:
    os.sync()
    time.sleep(1.0)
    stop = threading.Event()
    took: list[float] = []
    loop = threading.Thread(target=fsync_loop, args=(folder, stop, took))
    loop.start()
    if mode == "none":
        time.sleep(3.0)
        upload_s = None
    else:
        upload_s = copy(source, folder / "upload.bin", mode == "paced", rate_mib)
    time.sleep(0.5)
    stop.set()
    loop.join()
    return {"mode": mode, "upload_s": upload_s, "fsyncs": len(took),
            "fsync_median_ms": statistics.median(took) * 1000.0,
            "fsync_max_ms": max(took) * 1000.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=250)
    parser.add_argument("--rate", type=float, default=96.0)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tl-upload-fsync-", dir=args.dir))
    try:
        source = folder / "tables.bin"
        with open(source, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(MIB))
        rows = []
        for mode in ("none", "unpaced", "paced", "unpaced", "paced"):
            row = run_mode(mode, folder, source, args.rate)
            rows.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()},
                  flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(write_json("upload_fsync", {"upload_mb": args.mb, "paced_rate_mib_s": args.rate,
                                      "rows": rows}))


if __name__ == "__main__":
    main()
