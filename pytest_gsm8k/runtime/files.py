"""The one atomic file writer, the one CPU count, and the room left for open files.

Every file this plugin writes that someone may read while it is being
written, or after a kill (the JSON report, the baseline, cache entries, the
model marker, the HTML page), goes through :func:`write_atomic`: a temporary
file in the same folder, then a rename. A reader sees the old file or the new
one, never half of one. It replaces only a regular file (or a symlink, or
nothing): a device, FIFO or folder at the path is refused, never renamed over.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Mapping
from typing import Any

from pytest_gsm8k.core.jsontext import to_json


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mkdir: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename.

    The temporary name holds the pid and thread id, so concurrent writers (xdist
    workers, the cache's writer thread) never share one; a long target name is cut
    in it, so the temporary name fits wherever the target's name does.
    """
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    if mkdir:
        os.makedirs(folder, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    _refuse_special(target)
    tmp = os.path.join(
        folder, f".{_short(os.path.basename(target))}.{os.getpid()}.{threading.get_ident()}.tmp"
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


def _short(name: str, limit: int = 128) -> str:
    """``name`` cut to its longest prefix of at most ``limit`` bytes, for a temporary name."""
    while len(os.fsencode(name)) > limit:
        name = name[: max(0, min(len(name) - 1, limit))]
    return name


def _refuse_special(target: str) -> None:
    """Raise when ``target`` exists and is neither a regular file nor a symlink."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not replaced", target)
    raise FileExistsError(errno.EEXIST, "is not a regular file, not replaced", target)


def json_text(data: Mapping[str, Any]) -> str:
    """The JSON report's text; text UTF-8 cannot encode (a lone surrogate from a reply) is
    kept as its JSON escape."""
    return to_json(data, indent=1) + "\n"


def cpu_count() -> int:
    """CPUs this process may run on (affinity and cgroup cpusets count), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        with contextlib.suppress(OSError):
            return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def descriptor_room(reserve: int) -> tuple[int, int] | None:
    """(descriptors this process may still open beyond ``reserve``, its soft limit), or
    None where the limit is unlimited or unknown.

    Every request in flight holds a socket; the end of the run needs a few more
    (imports, the report, the page): a concurrency above this room ends the run
    with "too many open files" after every request was paid for.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - no such limit on this platform
        return None
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    open_now = 0
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            open_now = len(os.listdir(folder))
            break
        except OSError:
            continue
    return soft - open_now - reserve, int(soft)
