"""The one atomic file writer (a reader, or a run after a kill, sees the old file or the new
one, never half of one), and the room left for open files."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mkdir: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (named by pid, thread and
    at most 128 bytes of the target's name) and a rename. Only a regular file, a symlink or
    nothing is replaced: a folder, FIFO or device is an OSError."""
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    if mkdir:
        os.makedirs(folder, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        mode = os.lstat(target).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder, not replaced", target)
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise FileExistsError(errno.EEXIST, "is not a regular file, not replaced", target)
    short = os.fsdecode(os.fsencode(os.path.basename(target))[:128])
    tmp = os.path.join(folder, f".{short}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as file:
            file.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def descriptor_room(reserve: int) -> tuple[int, int] | None:
    """(descriptors this process may still open beyond ``reserve``, its soft limit), or None
    where unlimited or unknown: past this room the run fails after every request was paid for."""
    import resource

    if (soft := resource.getrlimit(resource.RLIMIT_NOFILE)[0]) == resource.RLIM_INFINITY:
        return None
    for folder in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return soft - len(os.listdir(folder)) - reserve, soft
    return soft - reserve, soft
