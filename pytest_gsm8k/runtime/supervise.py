"""The supervisor between pytest and a served command: the command's whole process tree ends
with pytest, and pytest learns how the command ended (docs/serving.md).

``serve.py`` runs this file (``python -I supervise.py STATUS_FD GRACE -- ARGV...``, standard
library only) as a session leader. It starts ARGV in its own process group and, on Linux, is
the *subreaper* of all it starts, so a process that daemonises stays its descendant (what a
shell line needs: the kernel's parent-death signal reaches only the first process).

* stdin is a pipe from pytest: ``stop GRACE`` stops the tree; end of file (pytest died, even
  by SIGKILL) or SIGTERM does too. Stopping is SIGTERM to the tree, SIGKILL after GRACE s.
* When the main process exits on its own, what of its tree still runs a second later (it
  daemonised) is stopped the same way and reported.
* STATUS_FD gets JSON lines: ``{"pid": N}``, or ``{"error": TEXT}`` when it cannot start;
  ``{"ended": RC}`` once the main process exited (negative for a signal); last ``{"exit":
  RC, "left": [PIDS]}`` (``left``: what still ran after it exited on its own, now stopped).
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

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
_POLL = 0.05
#: seconds the rest of the tree gets to end by itself after the main process exited
_LINGER = 1.0


def _process_table() -> dict[int, tuple[str, int, int]] | None:
    """pid -> (state, parent pid, process group) of every process; None without ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2:
            table[int(name)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def descendants(root: int, *, unreaped: bool = False) -> list[int]:
    """Live processes below ``root`` (by parent links) or in its process group, not ``root``
    itself; ``[]`` without ``/proc``. ``unreaped``: also its children that ended uncollected
    (a multi-threaded process is a zombie while its other threads still exit)."""
    table = _process_table() or {}
    children: dict[int, list[int]] = {}
    for pid, (state, ppid, _pgid) in table.items():
        if state not in ("Z", "X"):
            children.setdefault(ppid, []).append(pid)
    found = {pid for pid, (state, _, pgid) in table.items() if pgid == root and state not in "ZX"}
    if unreaped:
        found |= {pid for pid, (_state, ppid, _pgid) in table.items() if ppid == root}
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
        self.status_fd = status_fd
        self.grace = grace
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
        """The rest of the tree, including children not collected yet."""
        return descendants(os.getpid(), unreaped=True)

    def lingering(self) -> list[int]:
        """What of the tree still runs a moment after the main process ended on its own
        (the helpers of a crashed server end with it; a daemon stays)."""
        deadline = time.monotonic() + _LINGER
        while (left := self.others()) and time.monotonic() < deadline:
            time.sleep(_POLL)
            self.reap()
        return left

    def stop_tree(self, grace: float) -> None:
        """SIGTERM to the whole tree, SIGKILL to what is left after ``grace`` seconds."""
        if _process_table() is None:  # no /proc: the process group is what we can reach
            with contextlib.suppress(OSError):
                os.killpg(os.getpgrp(), signal.SIGTERM)
        deadline = time.monotonic() + grace
        termed: set[int] = set()
        while True:
            self.reap()
            left = self.others()
            if not left:
                return
            if time.monotonic() >= deadline:
                break
            for pid in set(left) - termed:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
                termed.add(pid)
            time.sleep(_POLL)
        end = time.monotonic() + 5.0
        while left and time.monotonic() < end:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL)
            self.reap()
            left = self.others()

    def run(self, argv: list[str]) -> int:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() below
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        try:
            # posix_spawn rather than subprocess: the supervisor reaps every child itself
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
            if self.signalled:
                grace = self.grace
                break
            readable, _, _ = select.select([0, wake_r], [], [], 1.0)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            self.reap()
            if 0 in readable:
                data = os.read(0, 512)
                pending += data
                if not data:
                    grace = self.grace  # pytest is gone
                elif b"\n" in pending:
                    word, _, value = pending.partition(b"\n")[0].decode().partition(" ")
                    grace = float(value) if word == "stop" and value else self.grace
        left: list[int] = []
        if grace is None:  # the main process ended on its own
            left = self.lingering()
            grace = self.grace
        self.stop_tree(grace)
        self.reap()
        self.say(exit=self.returncode, left=left)
        return 0

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True


def _subreaper() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main(args: list[str]) -> int:
    status_fd, grace, separator, *argv = args
    if separator != "--" or not argv:
        raise SystemExit("usage: supervise.py STATUS_FD GRACE -- ARGV...")
    os.set_inheritable(int(status_fd), False)
    _subreaper()
    return _Supervisor(int(status_fd), float(grace)).run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
