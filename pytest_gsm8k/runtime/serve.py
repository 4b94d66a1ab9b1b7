"""Start, watch and stop a model server process: the one way the plugin runs a server,
for ``--gsm8k-serve "CMD"`` (:func:`serve_spec`) and the ``--gsm8k-model=local`` preset
(``local.py`` builds its spec).

Plain process management, no pytest imports. :func:`start_server` gives the server a
free loopback port, waits until ``GET /v1/models`` answers 200 from a socket one of its
own processes holds, and :meth:`ServedProcess.stop` ends it: SIGTERM to every process it
started, SIGKILL after a grace period.

Why the process handling is this careful: a leaked server keeps a model in memory and a
port bound after the test run, and a run that dies half-way (Ctrl-C, an OOM kill, a
SIGKILLed pytest) must not leave one behind, also when CMD is a shell line
(``CUDA_VISIBLE_DEVICES=0 vllm serve ...``, ``... | tee log``) or a command that forks
into the background. Three layers make sure it does not:

* every server runs under a small supervisor (``supervise.py``) in a session of its
  own, the subreaper of all the command starts; ``stop()`` asks it to end the whole
  tree, and a SIGKILL to its process group is the fallback;
* an ``atexit`` handler stops every server still running at interpreter exit;
* when no Python code runs any more (pytest SIGKILLed), the supervisor sees its control
  pipe close, and on Linux also gets ``PR_SET_PDEATHSIG``, and ends the tree itself.
  The kernel sends that signal when the *thread* that forked the supervisor exits, so
  all supervisors are forked by one daemon thread that lives as long as the process.

A command whose main process exits while others it started keep running (it
daemonised) is reported as such and what it left is stopped: the run never measures a
server it cannot stop.

The server's output reaches its log through a pipe, each line scrubbed of the run's
secrets first (a server prints its arguments at startup, ``--api-key`` among them, and
the log stays after the run): :func:`_copy_log`.
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
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Generic, TypeVar

from pytest_gsm8k.core.command import CommandError, ServeCommand, serve_command
from pytest_gsm8k.core.scrub import redact_options
from pytest_gsm8k.runtime.client import PreflightError, get_json
from pytest_gsm8k.runtime.supervise import descendants

__all__ = [
    "LOOPBACK",
    "PROGRESS_EVERY",
    "ServeError",
    "ServedProcess",
    "ServerSpec",
    "describe_exit",
    "serve_spec",
    "start_server",
]

PROGRESS_EVERY = 30.0
"""Seconds between two progress lines while a server is not ready yet."""

#: seconds between SIGTERM and SIGKILL when pytest dies without stopping the server
DEATH_GRACE = 10.0

_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 20
#: how long a log's reader waits for the output of a server that ended to arrive
_LOG_DRAIN_SECONDS = 2.0
#: the longest line the log copier holds before it writes, and what it keeps back of it
#: then (longer than any secret)
_LOG_LINE_LIMIT = 1 << 20
_LOG_KEEP = 4096
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SUPERVISOR = Path(__file__).with_name("supervise.py")

#: an opener for the server's loopback URL: never through an HTTP(S)_PROXY of the environment
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServeError(Exception):
    """A server could not be started; the first line is for the user, the log tail follows."""


#: environment variables a serving stack reads (its backends, kernels, devices, checkpoints):
#: the server a run starts inherits them, so they name it in cache keys
SERVER_ENV_PREFIXES = (
    "VLLM_",
    "SGLANG_",
    "CUDA_",
    "NCCL_",
    "ROCM_",
    "HIP_",
    "HSA_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "HF_",
    "TRANSFORMERS_",
    "LLAMA_",
    "GGML_",
    "OMP_",
    "FAKESERVER_",
)


def server_env_digest(extra: Sequence[tuple[str, str]] = ()) -> str:
    """A digest of what a started server reads from its environment: the variables of
    :data:`SERVER_ENV_PREFIXES` it inherits, and ``extra`` (a vLLM config's ``env``) on top.
    A digest, not the values: they may hold tokens (``HF_TOKEN``)."""
    import hashlib

    env = {k: v for k, v in os.environ.items() if k.startswith(SERVER_ENV_PREFIXES)}
    env.update(dict(extra))
    text = json.dumps(sorted(env.items()), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def describe_exit(returncode: int) -> str:
    """``signal SIGSEGV`` or ``exit code 3``: how a child process ended."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _processes(pids: Sequence[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:5]) + (", ..." if len(pids) > 5 else "")
    return f"{len(pids)} process{'es' if len(pids) > 1 else ''} (pid {shown})"


@dataclass(eq=False)
class ServedProcess:
    """A running model server; ``stop()`` it (or use it as a context manager).

    ``process`` is its supervisor; :attr:`pid` the command's own process, and
    :attr:`returncode` how that one ended, as the supervisor reports it.
    """

    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_seconds: float = field(default=0.0)
    #: how messages name it, e.g. ``the model server (vllm serve ...)``
    what: str = field(default="the model server")
    #: write end of the supervisor's control pipe, read end of its status pipe
    control_fd: int = field(default=-1, repr=False)
    status_fd: int = field(default=-1, repr=False)
    _stopping: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _pending: bytes = field(default=b"", repr=False)
    _status: dict[str, Any] = field(default_factory=dict, repr=False)
    #: the thread that copies the server's output into its log
    copier: threading.Thread | None = field(default=None, repr=False)

    def log_text(self, offset: int = 0) -> str:
        """What the server wrote to its log from ``offset``, once its output has arrived
        (the server has ended: the copier drains the pipe, briefly)."""
        if self.copier is not None:
            self.copier.join(timeout=_LOG_DRAIN_SECONDS)
        return _read_log(self.log_path, offset)

    def use_model(self, model: str) -> None:
        """The model id to ask this server for (the one it lists, when none was given)."""
        self.model = model

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
        """Whether the command's main process has ended (or its supervisor has)."""
        self._update()
        ended = "ended" in self._status or "exit" in self._status
        return ended or self.process.poll() is not None

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

    def death_head(self) -> str:
        code = self.returncode
        how = describe_exit(code) if code is not None else "an unknown status"
        verb = "exited (daemonised?)" if code == 0 and self.left else "died"
        if self.what.endswith(")"):
            head = f"{self.what[:-1]}, pid {self.pid}) {verb} with {how}"
        else:
            head = f"{self.what} (pid {self.pid}) {verb} with {how}"
        if self.left:
            head += f", leaving {_processes(self.left)} running, now stopped"
        return head

    def death_message(self) -> str:
        """One line saying how the server died, then the last lines of its log."""
        head = self.death_head() + f" (log {self.log_path})"
        return _with_tail(head, _tail(self.log_text(), 8))

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

    def stop(self, timeout: float = 10.0) -> None:
        """End every process of the server: SIGTERM, SIGKILL after ``timeout``; idempotent.

        The supervisor does it (it sees processes that left the group); should it not
        end in time, its process group is SIGKILLed. The group is only signalled while
        the supervisor is not yet reaped or the group still has members: until then its
        id cannot have been reused by anyone else.
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
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            self._close_control()
            _kill_stragglers(proc.pid, timeout)
            self._update()
        finally:
            _forget(self)

    def _close_control(self, message: bytes = b"") -> None:
        if self.control_fd < 0:
            return
        with contextlib.suppress(OSError):
            if message:
                os.write(self.control_fd, message)
        os.close(self.control_fd)
        self.control_fd = -1

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


@dataclass(frozen=True)
class ServerSpec(Generic[_S]):
    """How to start one server; :func:`start_server` adds the port and runs it."""

    #: the command line for a port
    command: Callable[[int], ServeCommand]
    #: the model id it serves (with ``adopt_model``: the id it lists replaces it)
    model: str
    #: how messages name it, e.g. ``the model server (vllm serve ...)``
    what: str
    #: makes the :class:`ServedProcess` (a subclass adds its own checks)
    factory: Callable[..., _S]
    #: the exception its failures raise
    error: type[Exception] = ServeError
    #: its environment (None: ours); the command's own variables are added to it
    env: Mapping[str, str] | None = None
    adopt_model: bool = False
    #: what error lines add beside the log, e.g. ``model /path/to.gguf``
    context: str = ""


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
    """Members of the group left after its supervisor ended: TERM, then KILL after ``timeout``.

    Only called right after our own supervisor was reaped, so the group id is still ours
    while it has members: a new process cannot get a pid that is some live group's id.
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


def _listening(port: int) -> bool:
    """Whether something accepts connections on loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGTERM the supervisor when we die (Linux only).

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
    sigterm, sigkill = int(signal.SIGTERM), int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return preexec


def _spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str], scrub: Callable[[str], str]
) -> tuple[subprocess.Popen[bytes], int, int, threading.Thread]:
    """Start ``argv`` under its supervisor, detached into a new session, all output through
    ``scrub`` to the log; returns the supervisor, our ends of its control and status pipes
    and the log's copier."""
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
    """The server's output into its log until every process holding the pipe has ended,
    line by line through ``scrub``: no secret it prints reaches the disk. A line not ended
    yet waits, up to :data:`_LOG_LINE_LIMIT` characters; then it is scrubbed and written
    but for its last :data:`_LOG_KEEP`, where a secret cut short by the pipe may start.
    A log that cannot be written (a full disk) is still drained: the server never blocks."""
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


def _wait_ready(
    server: ServedProcess,
    deadline: float,
    progress: Callable[[float], None] | None = None,
    adopt_model: bool = False,
) -> bool | str:
    """Poll until ready (True), the command exits ("exited") or time runs out ("timeout").

    ``progress(seconds waited)`` is called every :data:`PROGRESS_EVERY` seconds.
    With ``adopt_model`` the served id replaces ``server.model`` when that is not served.
    """
    url = server.base_url + "/models"
    port = int(server.base_url.rsplit(":", 1)[1].split("/", 1)[0])
    delay = 0.05
    started = time.monotonic()
    next_progress = started + PROGRESS_EVERY
    while True:
        if server.finished():
            return "exited"
        # one deadline for the whole answer: a server that drips it is not ready
        wait = max(0.05, min(2.0, deadline - time.monotonic()))
        try:
            listing = get_json(url, None, wait, proxies=False)
            ok = True
        except PreflightError as exc:
            listing = None
            ok = exc.status in (401, 403)  # up, and wants a key (vllm serve --api-key)
        if ok and not server.finished() and _owns_port(server.pgid, port) is not False:
            served = _served_ids(listing)
            if adopt_model and served and server.model not in served:
                server.model = served[0]
            return True
        now = time.monotonic()
        if now >= deadline:
            return "exited" if server.finished() else "timeout"
        if progress is not None and now >= next_progress:
            progress(now - started)
            next_progress += PROGRESS_EVERY
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 1.5, 0.5)


def _served_ids(listing: Any) -> list[str]:
    try:
        return [str(item["id"]) for item in listing.get("data", [])]
    except (TypeError, KeyError, AttributeError):
        return []


def _owns_port(root: int, port: int) -> bool | None:
    """Whether a process of the server (``root``, its supervisor, and all below it) holds
    the listening socket on loopback ``port`` (None: can't tell).

    Linux only (``/proc``): lists the inodes of TCP sockets listening on the
    port and looks for one of them among the file descriptors of the server's
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
    seen_any = False
    for pid in [root, *descendants(root)]:
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


def _exited_head(server: ServedProcess, port: int) -> str:
    """The first line for a command that ended before it was ready."""
    code = server.returncode
    how = describe_exit(code) if code is not None else "an unknown status"
    if server.left:
        verb = "exited (daemonised?)" if code == 0 else "exited"
        return (
            f"{server.what} {verb} with {how} before it was ready, leaving "
            f"{_processes(server.left)} running, now stopped: run the server in the "
            "foreground (no &, nohup, setsid or --daemon)"
        )
    if _listening(port):
        return (
            f"{server.what} exited (daemonised?) with {how} before it was ready, and port "
            f"{port} is served by a process that is not one of its own: stop that server, "
            "and run this one in the foreground (no &, nohup, setsid or --daemon)"
        )
    return f"{server.what} exited with {how} before it was ready"


def start_server(
    spec: ServerSpec[_S],
    *,
    log_path: Path,
    startup_timeout: float,
    progress: Callable[[float], None] | None = None,
    scrub: Callable[[str], str] = str,
) -> _S:
    """Start ``spec`` on a free loopback port and wait until it serves; its output goes
    to ``log_path`` through ``scrub`` (which removes the run's secrets).

    Ready means ``GET http://127.0.0.1:{port}/v1/models`` answered 200 *from the
    server's own processes* (on Linux the listening socket is checked to belong to
    one of them, so another server that grabbed the same port is never mistaken for
    ours). If the port was taken between choosing and binding it, another one is
    tried; any other early exit, or no answer within ``startup_timeout`` seconds (for
    all tries together), raises ``spec.error`` with the server's exit status and the
    tail of its log (``log_path``, which stays for the user to read).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.unlink(missing_ok=True)  # a fresh file: a run that still writes the old one keeps it
    log_path.write_bytes(b"")
    what = spec.what
    started = time.monotonic()
    deadline = started + startup_timeout
    last_port_error = ""
    where = f" ({spec.context}; log {log_path})" if spec.context else f" (log {log_path})"
    base_env = os.environ if spec.env is None else spec.env
    for _attempt in range(_PORT_ATTEMPTS):
        port = _free_port()
        try:
            command = spec.command(port)
        except CommandError as exc:
            raise spec.error(str(exc)) from None
        env = {**base_env, **command.env, "PYTHONUNBUFFERED": "1"}  # a current log tail
        offset = log_path.stat().st_size
        try:
            proc, control, status, copier = _spawn(command.argv, log_path, env, scrub)
        except OSError as exc:
            raise spec.error(f"{what} could not be started: {exc}") from None
        server = spec.factory(
            base_url=f"http://127.0.0.1:{port}/v1",
            model=spec.model,
            process=proc,
            log_path=log_path,
            what=what,
            control_fd=control,
            status_fd=status,
            copier=copier,
        )
        _remember(server)
        try:
            failure = server._wait_started(deadline)
            outcome = failure or _wait_ready(server, deadline, progress, spec.adopt_model)
        except BaseException:  # KeyboardInterrupt included: never leave it running
            server.stop(timeout=2.0)
            raise
        if outcome is True:
            server.startup_seconds = time.monotonic() - started
            return server
        server.stop(timeout=2.0)
        if failure:
            raise spec.error(f"{what} could not be started: {failure}{where}")
        text = server.log_text(offset)
        tail = _tail(text)
        if outcome == "exited" and not server.left and _port_in_use(text):
            last_port_error = tail
            continue
        if outcome == "exited":
            head = _exited_head(server, port) + where
        else:
            head = (
                f"{what} did not answer GET {server.base_url}/models within "
                f"{startup_timeout:g} s{where}"
            )
        raise spec.error(_with_tail(head, tail))
    raise spec.error(
        _with_tail(
            f"Port in use: {what} could not bind a free port in {_PORT_ATTEMPTS} tries"
            f" (log {log_path})",
            last_port_error,
        )
    )


def serve_spec(
    command: str,
    model: str | None,
    *,
    server_args: tuple[str, ...] | None = None,
    env: Mapping[str, str] | None = None,
    context: str = "",
) -> ServerSpec[ServedProcess]:
    """The spec of ``--gsm8k-serve`` ``command``: ``{port}`` and ``{model}`` filled in so
    that the model name can never become code (see :mod:`pytest_gsm8k.core.command`).

    :raises ServeError: an empty or unusable command line, as one line.
    """
    if not command.strip():
        raise ServeError("--gsm8k-serve: empty command line")

    def fill(port: int) -> ServeCommand:
        try:
            return serve_command(command, port, model, server_args)
        except CommandError as exc:
            raise ServeError(f"--gsm8k-serve: {exc}") from None

    fill(0)  # refused now, before anything starts
    shown = redact_options(command)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ServerSpec(
        command=fill,
        model=model or "",
        what=f"the model server ({shown})",
        factory=ServedProcess,
        env=env,
        context=context,
    )
