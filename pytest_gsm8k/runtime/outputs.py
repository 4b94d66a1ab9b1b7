"""The run's output paths, checked before any request (one line naming the option), written
at the end: a regular file, a new path or a link to either is replaced through a rename (the
step summary appended to); a character device, a FIFO or this process's stdout or stderr is
written to through a descriptor opened at the check, never replaced; anything else is refused
(a folder, a block device, a socket, ``/proc``, ``/sys``, ``/dev/fd``, a name too long). The
one atomic file writer, and the room left for open files."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

#: seconds a FIFO or device may accept nothing before the write gives up
STREAM_WAIT = 30.0

_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


class OutputError(Exception):
    """An output path that cannot be used: the message is one line naming the option."""


@dataclass
class Output:
    """The file a rename replaces (links resolved), or a stream's descriptor ``fd``;
    ``terminal``: that stream is where pytest prints."""

    target: str
    fd: int | None = None
    append: bool = False
    terminal: bool = False

    def write(self, data: bytes | str) -> None:
        """A stream's write gives up after :data:`STREAM_WAIT` seconds its reader took nothing."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        if self.fd is not None:
            for stream in (sys.stdout, sys.stderr):  # what pytest printed so far comes first
                with contextlib.suppress(Exception):
                    stream.flush()
            view, poller = memoryview(payload), select.poll()  # poll: no FD_SETSIZE limit
            poller.register(self.fd, select.POLLOUT)
            while view:
                if not poller.poll(STREAM_WAIT * 1000):
                    raise TimeoutError(
                        errno.ETIMEDOUT, f"its reader took nothing for {STREAM_WAIT:g} s"
                    )
                with contextlib.suppress(BlockingIOError):
                    view = view[os.write(self.fd, view) :]
        elif self.append:
            with open(self.target, "ab") as file:
                file.write(payload)
        else:
            write_atomic(self.target, payload)

    def close(self) -> None:
        """Release a stream's descriptor (a FIFO's reader then sees the end of the data)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def prepare(
    path: str | os.PathLike[str], what: str, *, append: bool = False, streams: bool = True
) -> Output:
    """``path`` checked for writing at the end of the run, or :class:`OutputError`; without
    ``streams`` only a regular file (a baseline)."""
    given = os.fspath(path)
    try:
        info: os.stat_result | None = os.stat(given)
    except (FileNotFoundError, NotADirectoryError):
        info = None  # not there yet (or a folder to be made)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            check_name(given, what)
        raise OutputError(f"{what}: cannot use {given}: {reason(exc)}") from None
    mode = 0 if info is None else info.st_mode
    if stat.S_ISDIR(mode):
        raise OutputError(f"{what}: {given} is a folder; give a file path")
    if streams and info is not None:
        for fd in (1, 2):  # where pytest prints: a copy, so writes keep their order with it
            with contextlib.suppress(OSError):
                if os.path.samestat(info, os.fstat(fd)):
                    return Output(given, fd=os.dup(fd), terminal=True)
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            try:  # not blocking: a FIFO with no reader would block the end of the run
                return Output(given, fd=os.open(given, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY))
            except OSError as exc:
                if exc.errno == errno.ENXIO and stat.S_ISFIFO(mode):
                    raise OutputError(
                        f"{what}: {given} is a FIFO with no reader; start its reader first "
                        "(writing would wait for one at the end of the run)"
                    ) from None
                raise OutputError(f"{what}: cannot open {given}: {reason(exc)}") from None
    if info is not None and not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise OutputError(f"{what}: {given} is {kind}, not a file this output can be written to")
    current = os.path.abspath(given)  # each symlink on its way too (stdout, stderr: taken)
    for _ in range(40):  # the kernel's own bound on symlinks followed
        here = os.path.join(os.path.realpath(os.path.dirname(current)), os.path.basename(current))
        if here in ("/proc", "/sys") or here.startswith(("/proc/", "/sys/", "/dev/fd/")):
            raise OutputError(
                f"{what}: {given} is under /proc, /sys or /dev/fd (a descriptor other than this "
                "process's stdout or stderr), where no file can be written"
            )
        if not os.path.islink(here):
            break
        current = os.path.join(os.path.dirname(here), os.readlink(here))
    target = os.path.realpath(given)
    check_name(target, what)
    if append and info is not None:
        try:  # appended to: the file must take writes, not its folder
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            raise OutputError(f"{what}: cannot append to {target}: {reason(exc)}") from None
    elif append and not os.path.lexists(os.path.dirname(target)):  # appended to: never made
        raise OutputError(f"{what}: the folder of {given} does not exist; create it first")
    else:  # a file made and removed in its folder, or the nearest that exists (made at the end)
        folder = os.path.dirname(target)  # target is absolute: "/" ends the walk
        while not os.path.lexists(folder):
            folder = os.path.dirname(folder)
        if not os.path.isdir(folder):
            raise OutputError(f"{what}: {folder} is not a folder")
        try:
            tempfile.NamedTemporaryFile(dir=folder, prefix=".gsm8k-probe.").close()
        except OSError as exc:
            raise OutputError(f"{what}: cannot write in {folder}: {reason(exc)}") from None
    return Output(target, append=append)


def check_name(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a path with a name (the file's or a folder's) longer than its file system
    allows (the nearest existing folder's ``PC_NAME_MAX``, else 255)."""
    target, limit = os.path.abspath(os.fspath(path)), 255
    for folder in Path(target).parents:
        with contextlib.suppress(OSError, ValueError):
            limit = int(os.pathconf(folder, "PC_NAME_MAX"))
            break
    for name in target.split(os.sep):
        if (size := len(os.fsencode(name))) > limit:
            shown = name if len(name) <= 60 else name[:40] + "..." + name[-12:]
            raise OutputError(
                f"{what}: the name {shown} is {size} bytes, more than the {limit} the file "
                "system allows; choose a shorter one"
            )


def reason(exc: BaseException) -> str:
    """An exception as a short clause: an OSError's own words, without its errno prefix."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (named by pid, thread and
    at most 128 bytes of the target's name; its folders made) and a rename. Only a regular
    file, a symlink or nothing is replaced: a folder, FIFO or device is an OSError."""
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
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
