"""A command run under ``supervise.py`` so that its whole process tree ends with pytest,
however pytest ends (docs/serving.md): the fork, the scrubbed copy of its output, the
fallbacks of a stop. serve.py's servers are its only users. No pytest here.

The supervisor is the subreaper of everything the command starts, in a session of its own;
it ends the tree when asked, when our control pipe closes (pytest died, also by SIGKILL) or
when ``PR_SET_PDEATHSIG`` fires. That signal follows the *thread* that forked, so one daemon
thread that lives as long as the process forks every supervisor.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pytest_gsm8k.runtime.supervise import descendants

DEATH_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when pytest dies without stopping it
#: the longest line the log copier holds, and what it keeps back of it (longer than a secret)
_LOG_LINE_LIMIT = 1 << 20
_LOG_KEEP = 4096
_LOG_DRAIN_SECONDS = 2.0  # how long a reader waits for an ended server's output to arrive
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SUPERVISOR = Path(__file__).with_name("supervise.py")


@dataclass(eq=False, kw_only=True)
class Supervised:
    """A command under its supervisor. ``process`` is the supervisor; :attr:`pid` and
    :attr:`returncode` are the command's own, as the supervisor reports them."""

    process: subprocess.Popen[bytes]
    log_path: Path
    control_fd: int = field(default=-1, repr=False)  # the supervisor's control pipe (ours)
    status_fd: int = field(default=-1, repr=False)  # its status pipe (ours)
    copier: threading.Thread | None = field(default=None, repr=False)  # output -> log
    _stopping: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _pending: bytes = field(default=b"", repr=False)
    _status: dict[str, Any] = field(default_factory=dict, repr=False)

    def log_text(self, offset: int = 0) -> str:
        """The log from ``offset``, once an ended server's output has arrived."""
        if self.copier is not None:
            self.copier.join(timeout=_LOG_DRAIN_SECONDS)
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        """The command's own pid (the supervisor's until the command runs)."""
        pid = self._status.get("pid")
        return int(pid) if isinstance(pid, int) else self.process.pid

    @property
    def pgid(self) -> int:
        """The process group of the supervisor and the command (the supervisor's pid)."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """How the command ended (negative: a signal); None while it runs."""
        self._update()
        code = self._status.get("exit", self._status.get("ended"))
        return code if isinstance(code, int) else self.process.poll()

    @property
    def left(self) -> list[int]:
        """Processes the command left running when it exited on its own (now stopped)."""
        self._update()
        return [int(p) for p in self._status.get("left", [])]

    def finished(self) -> bool:
        return self.returncode is not None

    def _update(self) -> None:
        """Take the supervisor's news; all of it once the supervisor has exited."""
        if self.process.poll() is None:
            self._read_status()
            return
        deadline = time.monotonic() + 1.0  # its pipe is at its end: only a bound, never a wait
        while self._read_status(wait=0.05) and time.monotonic() < deadline:
            pass

    def _read_status(self, wait: float = 0.0) -> bool:
        """Take what the supervisor reported so far; False once its pipe is closed."""
        with self._lock:
            if self.status_fd < 0:
                return False
            readable, _, _ = select.select([self.status_fd], [], [], wait)
            if not readable:
                return True
            data = os.read(self.status_fd, 65536)
            if not data:
                os.close(self.status_fd)
                self.status_fd = -1
                return False
            self._pending += data
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError):
                    message = json.loads(line)
                    if isinstance(message, dict):
                        self._status.update(message)
            return True

    def _wait_started(self, deadline: float) -> str | None:
        """Wait for the supervisor to report the command running; its error otherwise."""
        while "pid" not in self._status and "error" not in self._status:
            if not self._read_status(wait=0.05) or time.monotonic() > deadline:
                break
        if "pid" in self._status:
            return None
        return str(self._status.get("error", "its supervisor did not start it"))

    def stop(self, timeout: float = 10.0) -> None:
        """End every process of the server: SIGTERM, SIGKILL after ``timeout``; idempotent.

        The supervisor does it (it sees processes that left the group); should it not end
        in time, its group is SIGKILLed. The group is signalled only while the supervisor is
        unreaped or the group has members: until then no one else can have its id.
        """
        proc = self.process
        self._stopping = True
        try:
            if proc.returncode is None:
                self._close_control(f"stop {timeout:g}\n".encode())
                try:
                    # it may be stopping what a daemonising command left (DEATH_GRACE)
                    proc.wait(timeout=max(timeout, DEATH_GRACE) + 7.0)
                except subprocess.TimeoutExpired:
                    for pid in descendants(proc.pid):
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            self._close_control()
            kill_stragglers(proc.pid, timeout)
            self._update()
        finally:
            forget(self)

    def _close_control(self, message: bytes = b"") -> None:
        if self.control_fd < 0:
            return
        with contextlib.suppress(OSError):
            if message:
                os.write(self.control_fd, message)
        os.close(self.control_fd)
        self.control_fd = -1


def describe_exit(returncode: int) -> str:
    """``signal SIGSEGV`` or ``exit code 3``: how a child process ended."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def processes(pids: Sequence[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:5]) + (", ..." if len(pids) > 5 else "")
    return f"{len(pids)} process{'es' if len(pids) > 1 else ''} (pid {shown})"


def kill_stragglers(pgid: int, timeout: float) -> None:
    """Members of the group left after its supervisor was reaped (so the id is still ours
    while it has members): TERM, then KILL after ``timeout``. ``descendants`` of a reaped
    root are its group's members."""
    if not descendants(pgid):
        return
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while descendants(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if descendants(pgid):
        signal_group(pgid, signal.SIGKILL)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Stoppable(Protocol):
    def stop(self, timeout: float = ...) -> None: ...


_LIVE: list[_Stoppable] = []
_LIVE_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def remember(server: _Stoppable) -> None:
    global _ATEXIT_REGISTERED
    with _LIVE_LOCK:
        _LIVE.append(server)
        if not _ATEXIT_REGISTERED:
            atexit.register(_stop_all)
            _ATEXIT_REGISTERED = True


def forget(server: _Stoppable) -> None:
    with _LIVE_LOCK, contextlib.suppress(ValueError):
        _LIVE.remove(server)


def _stop_all() -> None:
    """atexit: no server outlives an interpreter that exits normally."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop(timeout=5.0)


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGTERM the supervisor when we die (Linux).
    libc is looked up here, in the parent: the forked child only calls ``prctl`` (no dlopen
    or locks between fork and exec), and kills itself if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()
    sigterm, sigkill = int(signal.SIGTERM), int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return preexec


def spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str], scrub: Callable[[str], str]
) -> tuple[subprocess.Popen[bytes], int, int, threading.Thread]:
    """``argv`` under its supervisor in a new session, its output through ``scrub`` to the
    log; returns the supervisor, our ends of its control and status pipes, the copier."""
    log = log_path.open("ab")  # unwritable: an OSError now, before anything starts
    control_r, control_w = os.pipe()
    status_r, status_w = os.pipe()
    output_r, output_w = os.pipe()
    supervisor = [sys.executable, "-I", str(_SUPERVISOR), str(status_w), f"{DEATH_GRACE:g}"]

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*supervisor, "--", *argv],
            stdin=control_r,
            stdout=output_w,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=_pdeathsig_preexec(),  # only calls prctl, see there
            pass_fds=(status_w,),
            close_fds=True,
        )

    try:
        proc = _on_spawner_thread(popen)
    except BaseException:
        for fd in (control_w, status_r, output_r):
            os.close(fd)
        log.close()
        raise
    finally:
        for fd in (control_r, status_w, output_w):
            os.close(fd)
    copier = threading.Thread(
        target=_copy_log, args=(output_r, log, scrub), name="gsm8k-serve-log", daemon=True
    )
    copier.start()
    return proc, control_w, status_r, copier


def _copy_log(source: int, log: BinaryIO, scrub: Callable[[str], str]) -> None:
    """The server's output into its log, line by line through ``scrub``: no secret it prints
    reaches the disk. A line not ended waits up to :data:`_LOG_LINE_LIMIT` characters, then
    is written but for its last :data:`_LOG_KEEP` (where a secret cut by the pipe may
    start). A log that cannot be written is still drained: the server never blocks."""
    failed = False

    def write(text: str) -> None:
        nonlocal failed
        if failed:
            return
        try:
            log.write(text.encode("utf-8", "surrogateescape"))
            log.flush()
        except OSError:
            failed = True

    with os.fdopen(source, "rb", buffering=0) as pipe, log:
        pending = ""
        while data := pipe.read(65536):
            pending += data.decode("utf-8", "surrogateescape")
            cut = pending.rfind("\n") + 1
            if cut:
                write(scrub(pending[:cut]))
                pending = pending[cut:]
            elif len(pending) > _LOG_LINE_LIMIT:
                text = scrub(pending)
                write(text[:-_LOG_KEEP])
                pending = text[-_LOG_KEEP:]
        if pending:
            write(scrub(pending))


_SPAWN_JOBS: queue.SimpleQueue[
    tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
] = queue.SimpleQueue()
_SPAWNER: threading.Thread | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner_loop() -> None:
    while True:
        job, future = _SPAWN_JOBS.get()
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)


def _on_spawner_thread(job: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Fork on the process-lifetime daemon thread, so that PDEATHSIG means "the process
    died" (a daemon thread outlives the atexit handler that stops servers gracefully). A
    server started for a caller interrupted meanwhile is killed at once, not leaked."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or not _SPAWNER.is_alive():
            _SPAWNER = threading.Thread(
                target=_spawner_loop, name="pytest-gsm8k-spawner", daemon=True
            )
            _SPAWNER.start()
    future: Future[subprocess.Popen[bytes]] = Future()
    _SPAWN_JOBS.put((job, future))
    try:
        return future.result()
    except BaseException:
        future.cancel()
        future.add_done_callback(_kill_orphan)
        raise


def _kill_orphan(future: Future[subprocess.Popen[bytes]]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    proc = future.result()
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
