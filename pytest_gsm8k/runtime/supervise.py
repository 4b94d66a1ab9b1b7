"""The supervisor between pytest and a served command (``python -I supervise.py STATUS_FD GRACE
PARENT -- ARGV...``, stdlib only, a session leader): the Linux subreaper of all ARGV starts, so
that its whole tree, daemons included, ends (SIGTERM, SIGKILL after GRACE s) on ``stop GRACE``
on stdin, when pytest is gone (stdin's end, or a parent other than PARENT, pytest's pid: even
after a SIGKILL before we started, with a child of pytest holding stdin), on SIGTERM, and
when the main process exited (what still runs a second later is reported). STATUS_FD gets
``{"pid": N}`` or ``{"error": TEXT}``, ``{"ended": RC}``, last ``{"exit": RC, "left": [PIDS]}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

__all__ = ["descendants", "main"]

_POLL = 0.05
_LINGER = 1.0  # seconds the rest of the tree gets to end by itself after the main process


def _process_table() -> dict[int, tuple[str, int, int]] | None:
    """pid -> (state, parent pid, process group) of every process; None without ``/proc``."""
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    table = {}
    for name in names:
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            table[int(name)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def descendants(root: int, *, unreaped: bool = False) -> list[int]:
    """Live processes below ``root`` (by parent links) or in its process group, not ``root``
    itself; ``[]`` without ``/proc``. ``unreaped``: also its children that ended uncollected
    (a multi-threaded process is a zombie while its other threads still exit)."""
    table = _process_table() or {}
    children: dict[int, list[int]] = {}
    found = set()
    for pid, (state, ppid, pgid) in table.items():
        if state not in "ZX":
            children.setdefault(ppid, []).append(pid)
            if pgid == root:
                found.add(pid)
        elif unreaped and ppid == root:
            found.add(pid)
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(root)
    return sorted(found)


class _Supervisor:
    def __init__(self, status_fd: int, grace: float) -> None:
        self.status_fd, self.grace = status_fd, grace
        self.main: int | None = None
        self.returncode: int | None = None
        self.signalled = False

    def say(self, **message: object) -> None:
        with contextlib.suppress(OSError):
            os.write(self.status_fd, (json.dumps(message) + "\n").encode())

    def reap(self) -> None:
        """Collect every exited child (orphans come to us as their subreaper)."""
        with contextlib.suppress(ChildProcessError):  # no child left
            while (waited := os.waitpid(-1, os.WNOHANG))[0]:
                if waited[0] == self.main:
                    self.returncode = os.waitstatus_to_exitcode(waited[1])
                    self.say(ended=self.returncode)

    def others(self) -> list[int]:
        """The rest of the tree once reaped, including children not collected yet."""
        self.reap()
        return descendants(os.getpid(), unreaped=True)

    def stop_tree(self, grace: float) -> None:
        """SIGTERM to the whole tree, SIGKILL to what is left after ``grace`` seconds."""
        if _process_table() is None:  # no /proc: the process group is what we can reach
            with contextlib.suppress(OSError):
                os.killpg(os.getpgrp(), signal.SIGTERM)
        end, termed = time.monotonic() + grace, set[int]()
        while (left := self.others()) and time.monotonic() < end + 5.0:
            kill = time.monotonic() >= end  # SIGTERM once to each: a second may mean "now"
            for pid in left if kill else set(left) - termed:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
            termed.update(left)
            time.sleep(_POLL)

    def run(self, argv: list[str], parent: int) -> int:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() below
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        try:  # posix_spawn rather than subprocess: the supervisor reaps every child itself
            self.main = os.posix_spawnp(
                argv[0],
                argv,
                dict(os.environ),
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess restores them
            )
        except OSError as exc:
            self.say(error=str(exc))
            return 127
        self.say(pid=self.main)
        grace: float | None = None
        pending = b""
        while grace is None and self.returncode is None:
            readable, _, _ = select.select([0, wake_r], [], [], 1.0)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            self.reap()
            data = os.read(0, 512) if 0 in readable else None
            pending += data or b""
            if data == b"" or self.signalled or os.getppid() != parent:  # pytest is gone
                grace = self.grace
            elif b"\n" in pending:
                word, _, value = pending.partition(b"\n")[0].decode().partition(" ")
                grace = float(value) if word == "stop" and value else self.grace
        left: list[int] = []
        if grace is None:  # the main process ended on its own: what of its tree stays?
            deadline = time.monotonic() + _LINGER
            while (left := self.others()) and time.monotonic() < deadline:
                time.sleep(_POLL)
        self.stop_tree(self.grace if grace is None else grace)
        self.reap()
        self.say(exit=self.returncode, left=left)
        return 0

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True


def main(args: list[str]) -> int:
    status_fd, grace, parent, separator, *argv = args
    if separator != "--" or not argv:
        raise SystemExit("usage: supervise.py STATUS_FD GRACE PARENT -- ARGV...")
    os.set_inheritable(int(status_fd), False)
    if sys.platform.startswith("linux"):  # PR_SET_CHILD_SUBREAPER, from <linux/prctl.h>
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    return _Supervisor(int(status_fd), float(grace)).run(argv, int(parent))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
