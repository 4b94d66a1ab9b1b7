"""The run's output paths: checked before any request, written at the end.

An output (the JSON report, the HTML page, the GitHub step summary, a baseline
being recorded) is checked when the session starts, so a path that cannot be
written is one line before anything is paid for, not a crash after every
request. What a path is decides how it is written:

* a regular file (or a path not there yet, or a symlink to either): a
  temporary file beside the real target and a rename, so a symlink stays a
  link and a reader never sees half a file (the step summary, which GitHub
  appends to, is appended to);
* a character device, a FIFO, or this process's stdout or stderr (``/dev/stdout``,
  ``/proc/self/fd/1``, a symlink to them, the file stdout goes to: the same file by
  ``os.path.samestat``): written to directly, never replaced. The descriptor is
  opened at the check and held to the end: a FIFO with no reader is refused then (it
  would block the run's end), and a reader that stops reading ends the write after
  :data:`STREAM_WAIT` seconds without progress;
* a folder, a block device, a socket, a file under ``/proc`` or ``/sys``, any other
  descriptor (another process's open file), a name longer than the file system
  allows, a folder that cannot be made or written: refused with one line naming the
  option.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
import time
from dataclasses import dataclass

from pytest_gsm8k.runtime.files import write_atomic

#: seconds a FIFO or device may accept nothing before the write gives up
STREAM_WAIT = 30.0

#: where no output file belongs (kernel interfaces); their descriptors are streams
PSEUDO_ROOTS = ("/proc", "/sys")

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
    """One checked output: where and how it is written at the end of the run."""

    #: the option (or variable) that named it, for messages
    what: str
    #: the path as given
    path: str
    #: a regular file: the file the rename replaces (symlinks resolved)
    target: str
    #: an open descriptor for a stream (device, FIFO, this process's fd); None for a file
    fd: int | None = None
    #: a regular file is appended to (the step summary), not replaced
    append: bool = False
    #: the stream is this process's stdout or stderr (where pytest prints)
    terminal: bool = False

    def write(self, data: bytes | str) -> None:
        """Write ``data``: replace the file atomically, append, or write to the stream."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        if self.fd is not None:
            _write_stream(self.fd, payload)
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
    path: str | os.PathLike[str],
    what: str,
    *,
    append: bool = False,
    streams: bool = True,
) -> Output:
    """Check ``path`` for writing at the end of the run; raise :class:`OutputError` if it
    cannot be. With ``streams`` false only a regular file is accepted (a baseline)."""
    given = os.fspath(path)
    if not given:
        raise OutputError(f"{what}: an empty path")
    try:
        info: os.stat_result | None = os.stat(given)
    except (FileNotFoundError, NotADirectoryError):
        info = None  # not there yet (a symlink to a file not there yet; a folder to be made)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            check_name(given, what)
        raise OutputError(f"{what}: cannot use {given}: {reason(exc)}") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{what}: {given} is a folder; give a file path")
    if streams and info is not None:
        for fd in (1, 2):  # where pytest prints (/dev/stdout, /proc/self/fd/1, a link to it)
            with contextlib.suppress(OSError):
                if os.path.samestat(info, os.fstat(fd)):
                    # a copy: writes share its position, in order with pytest's output
                    return Output(what, given, given, fd=os.dup(fd), terminal=True)
        if stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode):
            return _open_stream(given, what, info)
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise OutputError(f"{what}: {given} is {kind}, not a file this output can be written to")
    target = os.path.realpath(given)
    for root in PSEUDO_ROOTS:
        if target == root or target.startswith(root + "/"):
            raise OutputError(f"{what}: {given} is under {root}, where no file can be written")
    if _descriptor_link(given):
        raise OutputError(
            f"{what}: {given} is a descriptor other than this process's stdout or stderr "
            "(another process's open file, or a closed one), not a file this output can be "
            "written to"
        )
    check_name(target, what)
    if append and info is not None:
        try:  # appended to: the file must take writes, not its folder
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            raise OutputError(f"{what}: cannot append to {target}: {reason(exc)}") from None
    else:
        _probe_folder(target, what)
    return Output(what, given, target, append=append)


def check_name(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a path with a name (the file's or a folder's) longer than the file system
    allows."""
    target = os.path.abspath(os.fspath(path))
    limit = name_max(os.path.dirname(target))
    for name in target.split(os.sep):
        size = len(os.fsencode(name))
        if size > limit:
            shown = name if len(name) <= 60 else name[:40] + "..." + name[-12:]
            raise OutputError(
                f"{what}: the name {shown} is {size} bytes, more than the {limit} the file "
                "system allows; choose a shorter one"
            )


def name_max(folder: str) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or its nearest
    existing parent) allows; 255 where it does not say."""
    current = folder or "."
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int(os.pathconf(current, "PC_NAME_MAX"))
        parent = os.path.dirname(current)
        if not parent or parent == current:
            return 255
        current = parent


def reason(exc: BaseException) -> str:
    """An exception as a short clause: an OSError's own words, without its errno prefix."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- streams ---------------------------------------------------------------------------


def _descriptor_link(path: str) -> bool:
    """Whether ``path`` or a symlink on its way is a descriptor link (``/proc/<pid>/fd/<n>``,
    ``/dev/fd/<n>``): not this process's stdout or stderr (:func:`prepare` took those), so
    another process's open file, or a closed descriptor."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own bound on symlinks followed
        here = os.path.join(os.path.realpath(os.path.dirname(current)), os.path.basename(current))
        if here.startswith(("/proc/", "/dev/fd/")):
            return True
        if not os.path.islink(here):
            return False
        current = os.path.join(os.path.dirname(here), os.readlink(here))
    return False


def _open_stream(given: str, what: str, info: os.stat_result) -> Output:
    """Open a device or FIFO for writing now (non-blocking: a FIFO with no reader is
    refused here instead of blocking the end of the run)."""
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(given, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO and stat.S_ISFIFO(info.st_mode):
            raise OutputError(
                f"{what}: {given} is a FIFO with no reader; start its reader first (writing "
                "would wait for one at the end of the run)"
            ) from None
        raise OutputError(f"{what}: cannot open {given}: {reason(exc)}") from None
    return Output(what, given, given, fd=fd)


def _write_stream(fd: int, payload: bytes) -> None:
    """Write all of ``payload`` to a stream, giving up after :data:`STREAM_WAIT` seconds
    in which it took nothing (a reader that stopped reading)."""
    for stream in (sys.stdout, sys.stderr):  # what pytest printed so far comes first
        with contextlib.suppress(Exception):
            stream.flush()
    view = memoryview(payload)
    deadline = time.monotonic() + STREAM_WAIT
    while view:
        try:
            view = view[os.write(fd, view) :]
            deadline = time.monotonic() + STREAM_WAIT
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    errno.ETIMEDOUT, f"its reader took nothing for {STREAM_WAIT:g} s"
                ) from None
            poller = select.poll()  # not select(): no FD_SETSIZE limit on the number
            poller.register(fd, select.POLLOUT)
            poller.poll(min(left, 1.0) * 1000)


# -- files -----------------------------------------------------------------------------


def _probe_folder(target: str, what: str) -> None:
    """Make ``target``'s folder if missing and create and remove a file in it; the folders
    made for the probe are removed again (the write at the end makes them for good)."""
    folder = current = os.path.dirname(target)  # target is absolute: "/" ends the walk
    missing: list[str] = []
    while not os.path.lexists(current):
        missing.insert(0, current)
        current = os.path.dirname(current)
    made: list[str] = []
    try:
        if not os.path.isdir(current):
            raise OutputError(f"{what}: {current} is not a folder")
        for path in missing:
            os.mkdir(path)
            made.append(path)
        probe = os.path.join(folder, f".gsm8k-probe.{os.getpid()}.tmp")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{what}: cannot write in {folder}: {reason(exc)}") from None
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(path)
