"""Start, watch and stop a model server process: ``--gsm8k-serve "CMD"`` and the
``--gsm8k-model=local`` preset (which builds its command line in ``local.py``).

Plain process management, no pytest imports. The server gets a free loopback
port (``{port}`` in the command line), is ready when ``GET /v1/models``
answers 200 from a socket its own process group holds, and is stopped at the
end: SIGTERM to its process group, SIGKILL after a grace period.

Why the process handling is this careful: a leaked server keeps a model in
memory and a port bound after the test run, and a run that dies half-way
(Ctrl-C, an OOM kill, a SIGKILLed pytest) must not leave one behind. Three
layers make sure it does not:

* ``stop()`` signals the server's whole process group (it runs in its own
  session), first SIGTERM, then SIGKILL;
* an ``atexit`` handler stops every server still running at interpreter exit;
* on Linux the child asks the kernel for ``PR_SET_PDEATHSIG = SIGKILL``, which
  covers the cases where no Python code runs any more (the parent SIGKILLed).
  The kernel sends it when the *thread* that forked the server exits, so all
  servers are forked by one daemon thread that lives as long as the process.
  A command line without shell syntax is started directly (no shell between
  us and the server), so the signal reaches the server itself.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from pytest_gsm8k.core.scrub import redact_options
from pytest_gsm8k.runtime.fetch import fetch

__all__ = [
    "PROGRESS_EVERY",
    "ServeError",
    "ServedProcess",
    "describe_exit",
    "serve_argv",
    "start_process",
    "start_served",
]

PROGRESS_EVERY = 30.0
"""Seconds between two progress lines while a server is not ready yet."""

_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
#: characters that make a command line need a shell (pipes, lists, redirections, expansions)
_SHELL_SYNTAX = re.compile(r"[;&|<>()$`\\\n*?~]|^\s*\w+=")


class ServeError(Exception):
    """A server could not be started; the first line is for the user, the log tail follows."""


def describe_exit(returncode: int) -> str:
    """``signal SIGSEGV`` or ``exit code 3``: how a child process ended."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(eq=False)
class ServedProcess:
    """A running model server; ``stop()`` it (or use it as a context manager)."""

    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_seconds: float = field(default=0.0)
    #: how messages name it, e.g. ``the model server (vllm serve ...)``
    what: str = field(default="the model server")
    _stopping: bool = field(default=False, repr=False)

    def death_head(self) -> str:
        code = self.process.returncode
        how = describe_exit(code) if code is not None else "an unknown status"
        if self.what.endswith(")"):
            return f"{self.what[:-1]}, pid {self.pid}) died with {how}"
        return f"{self.what} (pid {self.pid}) died with {how}"

    def death_message(self) -> str:
        """One line saying how the server died, then the last lines of its log."""
        head = self.death_head() + f" (log {self.log_path})"
        return _with_tail(head, _tail(_read_log(self.log_path, 0), 8))

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call ``on_death(message)`` from a thread as soon as the server exits unasked.

        A dead child must never look like an unreachable endpoint: the engine
        stops at once with this message, not after its connection retries.
        """

        def wait() -> None:
            self.process.wait()
            if not self._stopping:
                on_death(self.death_message())

        threading.Thread(target=wait, name="gsm8k-serve-watch", daemon=True).start()

    @property
    def pid(self) -> int:
        """The server's pid, which is also its process-group id."""
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout``; idempotent.

        The group is only signalled while the leader is not yet reaped: until
        then its pid (= the group id) cannot have been reused by anyone else.
        A leader that exits on SIGTERM while others of its group linger gets
        them SIGKILLed too (nothing of the group outlives ``stop()``).
        """
        proc = self.process
        self._stopping = True
        try:
            if proc.returncode is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            _kill_stragglers(proc.pid, timeout)
        finally:
            _forget(self)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_S = TypeVar("_S", bound=ServedProcess)


def _group_members(pgid: int) -> list[int]:
    """Pids of the processes (not zombies) in process group ``pgid`` (Linux; else [])."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def _kill_stragglers(pgid: int, timeout: float) -> None:
    """Members of the group left after its leader ended: TERM, then KILL after ``timeout``.

    Only called right after our own leader was reaped, so the group id is still ours:
    a new process cannot get a pid that is some live group's id.
    """
    members = _group_members(pgid)
    if not members:
        return
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_members(pgid):
        _signal_group(pgid, signal.SIGKILL)


_LIVE: list[ServedProcess] = []
_LIVE_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def _remember(server: ServedProcess) -> None:
    global _ATEXIT_REGISTERED
    with _LIVE_LOCK:
        _LIVE.append(server)
        if not _ATEXIT_REGISTERED:
            atexit.register(_stop_all)
            _ATEXIT_REGISTERED = True


def _forget(server: ServedProcess) -> None:
    with _LIVE_LOCK, contextlib.suppress(ValueError):
        _LIVE.remove(server)


def _stop_all() -> None:
    """atexit: no server outlives an interpreter that exits normally."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop(timeout=5.0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _free_port() -> int:
    """A loopback port that was free a moment ago (the race is handled by retrying)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the server when we die (Linux only).

    libc and ``prctl`` are looked up here, in the parent, so the forked child
    only makes the call (no dlopen/locks between fork and exec). If the parent
    already died before the call took effect, the child kills itself.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return preexec


def _spawn(
    cmd: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the server detached into its own session, all output to the log."""
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONUNBUFFERED"] = "1"  # the log tail must be current when we read it

    def popen() -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            return subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec(),  # only calls prctl, see there
                close_fds=True,
            )

    return _on_spawner_thread(popen)


_SpawnJob = tuple[Callable[[], "subprocess.Popen[bytes]"], "Future[subprocess.Popen[bytes]]"]
_SPAWN_JOBS: queue.SimpleQueue[_SpawnJob] = queue.SimpleQueue()
_SPAWNER: threading.Thread | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner_loop() -> None:
    while True:
        job, future = _SPAWN_JOBS.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(job())
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)


def _on_spawner_thread(job: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Fork on the process-lifetime daemon thread so PDEATHSIG means "process died".

    A daemon thread is never joined at shutdown, so it outlives the atexit
    handler that stops the servers gracefully; only the process's end ends it.
    If the caller is interrupted while waiting, the server that still gets
    started is killed at once rather than leaked.
    """
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
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


# Loopback must never go through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _wait_ready(
    server: ServedProcess,
    deadline: float,
    progress: Callable[[float], None] | None = None,
    adopt_model: bool = False,
) -> bool | str:
    """Poll until ready (True), the process exits ("exited") or time runs out ("timeout").

    ``progress(seconds waited)`` is called every :data:`PROGRESS_EVERY` seconds.
    With ``adopt_model`` the served id replaces ``server.model`` when that is not served.
    """
    url = server.base_url + "/models"
    port = int(server.base_url.rsplit(":", 1)[1].split("/", 1)[0])
    delay = 0.05
    started = time.monotonic()
    next_progress = started + PROGRESS_EVERY
    while True:
        if server.process.poll() is not None:
            return "exited"
        # one deadline for the whole answer: a server that drips it is not ready
        wait = max(0.05, min(2.0, deadline - time.monotonic()))
        try:
            body = fetch(url, timeout=wait, proxies=False)
            ok = True
        except urllib.error.HTTPError as exc:
            body = b""
            ok = exc.code in (401, 403)  # up, and wants a key (vllm serve --api-key)
        except (urllib.error.URLError, OSError, ValueError):
            ok = False
        if ok and server.process.poll() is None and _owns_port(server.pid, port) is not False:
            served = _served_ids(body)
            if adopt_model and served and server.model not in served:
                server.model = served[0]
            return True
        now = time.monotonic()
        if now >= deadline:
            return "exited" if server.process.poll() is not None else "timeout"
        if progress is not None and now >= next_progress:
            progress(now - started)
            next_progress += PROGRESS_EVERY
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 1.5, 0.5)


def _served_ids(body: bytes) -> list[str]:
    try:
        data = json.loads(body)
        return [str(item["id"]) for item in data.get("data", [])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []


def _owns_port(pgid: int, port: int) -> bool | None:
    """Whether a process of group ``pgid`` holds the listening socket on loopback ``port``
    (None: can't tell).

    Linux only (``/proc``): lists the inodes of TCP sockets listening on the
    port and looks for one of them among the file descriptors of the group's
    processes (a server may listen from a child of the process we started).
    """
    inodes: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not readable:
        return None
    pids = [pgid] + [pid for pid in _group_members(pgid) if pid != pgid]
    seen_any = False
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        seen_any = True
        for fd in fds:
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False if seen_any else None


def _port_in_use(log_text: str) -> bool:
    lowered = log_text.lower()
    return "address already in use" in lowered or "errno 98" in lowered


def _read_log(log_path: Path, offset: int) -> str:
    """What one attempt wrote to the log (earlier attempts come before ``offset``)."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    """The last lines of a log, long lines clipped to keep error messages readable."""
    tail = [line if len(line) <= 400 else line[:400] + "..." for line in text.splitlines()]
    return "\n".join(tail[-lines:])


def _with_tail(head: str, tail: str) -> str:
    if not tail.strip():
        return head + "\n(the server log is empty)"
    indented = "\n".join("    " + line for line in tail.splitlines())
    return f"{head}\nlast lines of the server log:\n{indented}"


def start_process(
    argv_for_port: Callable[[int], Sequence[str]],
    *,
    model: str,
    log_path: Path,
    startup_timeout: float,
    what: str,
    error: type[Exception] = ServeError,
    factory: Callable[..., _S] = ServedProcess,  # type: ignore[assignment]
    env: Mapping[str, str] | None = None,
    progress: Callable[[float], None] | None = None,
    adopt_model: bool = False,
    context: str = "",
) -> _S:
    """Start ``argv_for_port(port)`` on a free loopback port and wait until it serves.

    Ready means ``GET http://127.0.0.1:{port}/v1/models`` answered 200 *from
    the process group we started* (on Linux the listening socket is checked
    to belong to it, so another server that grabbed the same port is never
    mistaken for ours). If the port was taken between choosing and binding
    it, another one is tried; any other early exit, or no answer within
    ``startup_timeout`` seconds (for all tries together), raises ``error``
    with the server's exit status and the tail of its log.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    started = time.monotonic()
    deadline = started + startup_timeout
    last_port_error = ""
    where = f" ({context}; log {log_path})" if context else f" (log {log_path})"
    for _attempt in range(_PORT_ATTEMPTS):
        port = _free_port()
        cmd = list(argv_for_port(port))
        offset = log_path.stat().st_size
        try:
            proc = _spawn(cmd, log_path, env)
        except OSError as exc:
            raise error(f"{what} could not be started: {exc}") from None
        server = factory(
            base_url=f"http://127.0.0.1:{port}/v1",
            model=model,
            process=proc,
            log_path=log_path,
            what=what,
        )
        _remember(server)
        try:
            outcome = _wait_ready(server, deadline, progress, adopt_model)
        except BaseException:  # KeyboardInterrupt included: never leave it running
            server.stop(timeout=2.0)
            raise
        if outcome is True:
            server.startup_seconds = time.monotonic() - started
            return server
        server.stop(timeout=2.0)
        text = _read_log(log_path, offset)
        tail = _tail(text)
        if outcome == "exited" and _port_in_use(text):
            last_port_error = tail
            continue
        if outcome == "exited":
            head = f"{what} exited with {describe_exit(proc.returncode)} before it was ready{where}"
        else:
            head = (
                f"{what} did not answer GET {server.base_url}/models within "
                f"{startup_timeout:g} s{where}"
            )
        raise error(_with_tail(head, tail))
    raise error(
        _with_tail(
            f"Port in use: {what} could not bind a free port in {_PORT_ATTEMPTS} tries"
            f" (log {log_path})",
            last_port_error,
        )
    )


def serve_argv(command: str, port: int, model: str | None) -> list[str]:
    """The argv that runs ``command`` with ``{port}`` and ``{model}`` filled in.

    Without shell syntax the words are run directly (``shlex`` splitting, so
    quotes work), which puts the server itself in our kill-on-death net;
    anything else runs through ``/bin/sh -c`` with the model quoted.
    """
    if _SHELL_SYNTAX.search(command):
        text = command.replace("{port}", str(port)).replace("{model}", shlex.quote(model or ""))
        return ["/bin/sh", "-c", text]
    words = shlex.split(command)
    return [w.replace("{port}", str(port)).replace("{model}", model or "") for w in words]


def start_served(
    command: str,
    *,
    model: str | None,
    log_path: Path,
    startup_timeout: float,
    progress: Callable[[float], None] | None = None,
) -> ServedProcess:
    """Start ``--gsm8k-serve`` ``command`` and wait until it serves (see :func:`start_process`)."""
    if not command.strip():
        raise ServeError("--gsm8k-serve: empty command line")
    try:
        serve_argv(command, 0, model)
    except ValueError as exc:
        raise ServeError(f"--gsm8k-serve: cannot split the command line ({exc})") from None
    shown = redact_options(command)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return start_process(
        lambda port: serve_argv(command, port, model),
        model=model or "",
        log_path=log_path,
        startup_timeout=startup_timeout,
        what=f"the model server ({shown})",
        progress=progress,
    )
