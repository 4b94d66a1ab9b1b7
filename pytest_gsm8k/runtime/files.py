"""The one atomic file writer, and the one CPU count.

Every file this plugin writes that someone may read while it is being
written, or after a kill (the JSON report, the baseline, cache entries, the
model marker, the HTML page), goes through :func:`write_atomic`: a temporary
file in the same folder, then a rename. A reader sees the old file or the new
one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from pytest_gsm8k.core.jsontext import to_json


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mkdir: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename.

    The temporary name holds the pid and thread id, so concurrent writers (xdist
    workers, the cache's writer thread) never share one.
    """
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    if mkdir:
        os.makedirs(folder, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = os.path.join(
        folder, f".{os.path.basename(target)}.{os.getpid()}.{threading.get_ident()}.tmp"
    )
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """The JSON report, written atomically (an interrupted run keeps the previous one whole);
    text UTF-8 cannot encode (a lone surrogate from a reply) is kept as its JSON escape."""
    write_atomic(path, to_json(data, indent=1) + "\n")


def cpu_count() -> int:
    """CPUs this process may run on (affinity and cgroup cpusets count), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        with contextlib.suppress(OSError):
            return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
