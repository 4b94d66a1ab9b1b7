"""The supervisor between pytest and a served command (``python -I supervise.py STATUS_FD GRACE
PARENT -- ARGV...``, stdlib only, a session leader and the Linux subreaper of all ARGV starts):
its whole tree, daemons included, ends (SIGTERM, SIGKILL after GRACE s) on ``stop GRACE`` on
stdin, when pytest is gone (stdin's end, or a parent other than PARENT: pytest SIGKILLed before
we started, with a child of pytest holding stdin), on SIGTERM, and when the main process exited
(what still runs a second later is reported). STATUS_FD gets ``{"pid": N}`` or ``{"error":
TEXT}``, ``{"ended": RC}``, last ``{"exit": RC, "left": [PIDS]}``."""

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

_POLL = 0.05


def descendants(root: int, *, unreaped: bool = False) -> list[int]:
    """Live processes below ``root`` (by parent links) or in its process group, not ``root``
    itself; ``[]`` without ``/proc``. ``unreaped``: also its children that ended uncollected
    (a multi-threaded process is a zombie while its other threads still exit)."""
    children: dict[int, list[int]] = {}
    found = set()
    for name in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        with contextlib.suppress(OSError, IndexError):
            state, ppid, pgid = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[:3]
            if state not in "ZX":
                children.setdefault(int(ppid), []).append(int(name))
                if int(pgid) == root:
                    found.add(int(name))
            elif unreaped and int(ppid) == root:
                found.add(int(name))
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(root)
    return sorted(found)


def main(args: list[str]) -> int:
    status_fd, grace_text, parent, _, *argv = args  # serve.py's call: ARGV is never empty
    status, grace = int(status_fd), float(grace_text)
    os.set_inheritable(status, False)
    if sys.platform.startswith("linux"):  # PR_SET_CHILD_SUBREAPER, from <linux/prctl.h>
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    ended: list[int] = []  # the main process's exit code, once collected

    def say(**message: object) -> None:
        with contextlib.suppress(OSError):
            os.write(status, (json.dumps(message) + "\n").encode())

    def reap() -> list[int]:  # orphans come to us as their subreaper; then the rest of the tree
        with contextlib.suppress(ChildProcessError):  # no child left
            while (waited := os.waitpid(-1, os.WNOHANG))[0]:
                if waited[0] == spawned:
                    ended.append(os.waitstatus_to_exitcode(waited[1]))
                    say(ended=ended[0])
        return descendants(os.getpid(), unreaped=True)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, lambda *_: None)  # each wakes select() below through the pipe
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    try:  # posix_spawn rather than subprocess: the supervisor reaps every child itself
        spawned = os.posix_spawnp(
            argv[0],
            argv,
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess restores them
        )
    except OSError as exc:
        say(error=str(exc))
        return 127
    say(pid=spawned)
    stop: float | None = None  # the grace of the stop
    pending = b""
    while stop is None and not ended:
        readable = select.select([0, wake_r], [], [], 1.0)[0]
        signals = set(os.read(wake_r, 512) if wake_r in readable else b"") - {signal.SIGCHLD}
        reap()
        data = os.read(0, 512) if 0 in readable else None
        pending += data or b""
        if data == b"" or signals or os.getppid() != int(parent):  # pytest is gone
            stop = grace
        elif b"\n" in pending:
            word, _, value = pending.partition(b"\n")[0].decode().partition(" ")
            stop = float(value) if word == "stop" and value else grace
    left: list[int] = []
    if stop is None:  # the main process ended on its own: what of its tree stays?
        deadline = time.monotonic() + 1.0  # the rest of the tree may end by itself
        while (left := reap()) and time.monotonic() < deadline:
            time.sleep(_POLL)
    if not os.path.isdir("/proc"):  # the process group is what we can reach
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGTERM)
    end, termed = time.monotonic() + (grace if stop is None else stop), set[int]()
    while (tree := reap()) and time.monotonic() < end + 5.0:
        kill = time.monotonic() >= end  # SIGTERM once to each: a second may mean "now"
        for pid in tree if kill else set(tree) - termed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        termed.update(tree)
        time.sleep(_POLL)
    say(exit=ended[0] if ended else None, left=left)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
