"""The one launcher of a model server (a ``--gsm8k-serve`` command, the local GGUF, a
``--gsm8k-config`` config): :func:`launch` starts it on a free loopback port under
supervise.py, so that its whole process tree ends with pytest however pytest ends; waits until
it serves and checks its model. Any failure is one :class:`ServeError` line (docs/serving.md)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import IO, Any

from pytest_gsm8k.core.command import CommandError, ServeCommand, serve_command
from pytest_gsm8k.core.identity import describe_server, unnamed_answerer, unnamed_refusal
from pytest_gsm8k.core.plan import Endpoint
from pytest_gsm8k.core.scrub import Scrubber, clip, printable, redact_options, shown_url
from pytest_gsm8k.runtime.client import PreflightError, get_json, list_models
from pytest_gsm8k.runtime.supervise import descendants

PROGRESS_EVERY = 30.0  # seconds between two "waiting for the model server" lines
DEATH_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when pytest dies without stopping it
_PORT_ATTEMPTS = 3
#: the longest line the log copier holds, and what it keeps back of it (longer than a secret)
_LOG_LINE_LIMIT = 1 << 20
_LOG_KEEP = 4096
_SUPERVISOR = Path(__file__).with_name("supervise.py")
_FOREGROUND = "run the server in the foreground (no &, nohup, setsid or --daemon)"

#: what a serving stack reads from its environment (backends, kernels, devices, checkpoints):
#: the started server inherits these variables, so they name it in cache keys
SERVER_ENV_PREFIXES = tuple(
    "VLLM_ SGLANG_ CUDA_ NCCL_ ROCM_ HIP_ HSA_ TORCH PYTORCH_ TRITON_ HF_ TRANSFORMERS_ "  # noqa: SIM905
    "LLAMA_ GGML_ OMP_ FAKESERVER_".split()
)


class ServeError(Exception):
    """A server could not be started or taken into use: one line, the log's tail after it."""


def server_env_digest(extra: Sequence[tuple[str, str]] = ()) -> str:
    """What a started server reads from its environment (and a config's ``env``), digested:
    the values may hold tokens."""
    env = {k: v for k, v in os.environ.items() if k.startswith(SERVER_ENV_PREFIXES)}
    env.update(dict(extra))
    text = json.dumps(sorted(env.items()), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(eq=False, kw_only=True)
class ServedProcess:
    """A model server started under its supervisor (``process``, the leader of its group);
    :attr:`pid` and :attr:`returncode` are the command's own, as the supervisor reports them."""

    argv: InitVar[Sequence[str]]
    env: InitVar[Mapping[str, str]]
    scrub: InitVar[Callable[[str], str]]  # what its output goes through to the log
    log_path: Path
    base_url: str
    model: str
    what: str  # how messages name it, its detail in parentheses: "the model server (vllm ...)"
    startup_seconds: float = 0.0

    def __post_init__(
        self, argv: Sequence[str], env: Mapping[str, str], scrub: Callable[[str], str]
    ) -> None:
        log = self.log_path.open("ab")  # unwritable: an OSError now, before anything starts
        status_r, status_w = os.pipe()
        status = os.fdopen(status_r, "rb")
        supervisor = [sys.executable, "-I", str(_SUPERVISOR), str(status_w), f"{DEATH_GRACE:g}"]
        supervisor.append(str(os.getpid()))  # a pytest gone before it starts is gone too
        try:
            self.process = subprocess.Popen(
                [*supervisor, "--", *argv],
                bufsize=0,
                stdin=subprocess.PIPE,  # our end closed: the supervisor stops the tree
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
                pass_fds=(status_w,),
            )
        finally:  # a failed start leaves ``log`` and ``status`` to the collector
            os.close(status_w)
        self.pgid, self._stopping = self.process.pid, False  # the supervisor leads its group
        self._status: dict[str, Any] = {}
        self._said = threading.Event()  # its first word (the pid or an error), or its end
        output = self.process.stdout
        self._copier = threading.Thread(target=_copy_log, args=(output, log, scrub), daemon=True)
        self._reader = threading.Thread(target=self._read_status, args=(status,), daemon=True)
        self._copier.start()
        self._reader.start()
        self.starter = threading.current_thread()  # a matrix's driver: Matrix.close stops it
        _LIVE.add(self)

    def _read_status(self, pipe: IO[bytes]) -> None:
        with pipe:
            for line in pipe:
                self._status.update(json.loads(line))
                self._said.set()
        self._said.set()

    def _news(self) -> dict[str, Any]:
        if self.process.poll() is not None:
            self._reader.join(timeout=1.0)
        return self._status

    @property
    def pid(self) -> int:
        return int(self._status.get("pid", self.process.pid))

    @property
    def returncode(self) -> int | None:
        news = self._news()
        code = news.get("exit", news.get("ended"))
        return code if isinstance(code, int) else self.process.poll()

    @property
    def left(self) -> list[int]:
        """Processes the command left running when it exited on its own (now stopped)."""
        return list(self._news().get("left", []))

    def log_text(self, offset: int = 0) -> str:
        self._copier.join(timeout=2.0)
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def probe(self) -> None:
        """A check once it serves, before the run uses it (:class:`~.local.LocalServer`'s)."""

    def ended(self, verb: str, when: str = "") -> str:
        """``died with signal SIGSEGV``, ``died with exit code 7``; ``exited (daemonised?) with
        exit code 0{when}, leaving 1 process (pid 12) running, now stopped``."""
        code, left = self.returncode, self.left
        how = "an unknown status" if code is None else f"exit code {code}"
        if code is not None and code < 0:
            how = f"signal {-code}"
            with contextlib.suppress(ValueError):
                how = f"signal {signal.Signals(-code).name}"
        text = f"{'exited (daemonised?)' if code == 0 and left else verb} with {how}{when}"
        if not left:
            return text
        pids = ", ".join(map(str, left[:5])) + (", ..." if len(left) > 5 else "")
        many = "processes" if len(left) > 1 else "process"
        return f"{text}, leaving {len(left)} {many} (pid {pids}) running, now stopped"

    def death_message(self, hint: str = "") -> str:
        head = f"{self.what[:-1]}, pid {self.pid}) {self.ended('died')}{hint} (log {self.log_path})"
        return _with_tail(head, self.log_text(), 8)

    def watch(self, on_death: Callable[[str], None]) -> None:
        """``on_death(message)`` from a thread as soon as the server exits unasked: a dead
        child must stop the run at once, never look like an unreachable endpoint."""

        def wait() -> None:
            self.process.wait()
            if not self._stopping:
                on_death(self.death_message())

        threading.Thread(target=wait, name="gsm8k-serve-watch", daemon=True).start()

    def stop(self, timeout: float = 10.0) -> None:
        """The supervisor ends the tree (supervise.py, GRACE ``timeout``); what outlives it (hung,
        or killed) is SIGKILLed: its group's id is ours while it is unreaped or has members."""
        proc, control, self._stopping = self.process, self.process.stdin, True
        assert control is not None
        try:
            with contextlib.suppress(OSError, ValueError), control:  # ValueError: closed already
                control.write(f"stop {timeout:g}\n".encode())
            with contextlib.suppress(subprocess.TimeoutExpired):  # it may be stopping a daemon
                proc.wait(timeout=max(timeout, DEATH_GRACE) + 7.0)
            for pid in [*descendants(proc.pid), *([proc.pid] if proc.poll() is None else [])]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            self._news()
        finally:
            _LIVE.discard(self)


_LIVE: set[ServedProcess] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(timeout=5.0)


def _copy_log(pipe: IO[bytes], log: IO[bytes], scrub: Callable[[str], str]) -> None:
    """The server's output into its log, line by line through ``scrub``: no secret it prints
    reaches the disk. A line not ended waits up to :data:`_LOG_LINE_LIMIT` characters, then
    is written but for its last :data:`_LOG_KEEP` (where a secret cut by the pipe may
    start). A log that cannot be written is still drained: the server never blocks."""

    def write(text: str) -> None:
        with contextlib.suppress(OSError):
            log.write(text.encode("utf-8", "surrogateescape"))
            log.flush()

    with pipe, log:
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
        write(scrub(pending))
        with contextlib.suppress(OSError):  # a full disk: what the buffer kept is dropped
            log.close()


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def _wait_ready(
    server: ServedProcess, port: int, deadline: float, progress: Callable[[float], None] | None
) -> str:
    """ "ready", "exited" or "timeout"; ``progress(seconds waited)`` now and then."""
    delay, started = 0.05, time.monotonic()
    next_progress = started + PROGRESS_EVERY
    while server.returncode is None:
        wait = max(0.05, min(2.0, deadline - time.monotonic()))
        try:  # one deadline for the whole answer: a server that drips it is not ready
            ok = get_json(server.base_url + "/models", None, wait, proxies=False) or True
        except PreflightError as exc:
            ok = exc.status in (401, 403)  # up, and wants a key (vllm serve --api-key)
        if ok and server.returncode is None and _owns_port(server.pgid, port) is not False:
            return "ready"
        now = time.monotonic()
        if now >= deadline:
            return "exited" if server.returncode is not None else "timeout"
        if progress is not None and now >= next_progress:
            progress(now - started)
            next_progress += PROGRESS_EVERY
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 1.5, 0.5)
    return "exited"


def _owns_port(root: int, port: int) -> bool | None:
    """Whether a process of the server (``root`` and all below it) holds the listening
    socket on loopback ``port`` (None: cannot tell without ``/proc``): another server that
    took the port must never be measured as ours."""
    if not os.path.exists("/proc/net/tcp"):
        return None
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):  # no IPv6
            for cols in (line.split() for line in Path(table).read_text().splitlines()[1:]):
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(OSError):  # gone meanwhile
            if any(
                os.readlink(f"/proc/{pid}/fd/{fd}") in inodes
                for fd in os.listdir(f"/proc/{pid}/fd")
            ):
                return True
    return False


def _with_tail(head: str, text: str, lines: int = 20) -> str:
    tail = [f"    {line[:400]}{'...' * (len(line) > 400)}" for line in text.splitlines()[-lines:]]
    if not "".join(tail).strip():
        return head + "\n(the server log is empty)"
    return head + "\nlast lines of the server log:\n" + "\n".join(tail)


def _exited_head(server: ServedProcess, port: int) -> str:
    before = " before it was ready"
    if server.left:
        return f"{server.what} {server.ended('exited', before)}: {_FOREGROUND}"
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
        return (
            f"{server.what} {server.ended('exited (daemonised?)', before)}, and port {port} is "
            f"served by a process that is not one of its own: stop that server, and {_FOREGROUND}"
        )
    return f"{server.what} {server.ended('exited', before)}"


def serve_spec(
    command: str,
    model: str | None,
    server_args: tuple[str, ...] | None = None,
    *,
    env: Mapping[str, str] = os.environ,
    context: str = "",
) -> Launch:
    """The spec of ``--gsm8k-serve`` ``command``, ``{port}`` and ``{model}`` filled in so
    that the model name never becomes code (core/command.py); refused now, as one line."""

    def fill(port: int) -> ServeCommand:
        try:
            return serve_command(command, port, model, server_args)
        except CommandError as exc:
            raise ServeError(f"--gsm8k-serve: {exc}") from None

    fill(0)  # refused now, before anything starts
    shown = f"the model server ({clip(redact_options(command), 80)})"
    return Launch(fill, model or "", shown, ServedProcess, env=env, context=context)


@dataclass(frozen=True)
class Launch:
    """A server to start for the run (a command: serve_spec; a GGUF: local.local_spec), and
    how to take it into use (docs/serving.md)."""

    command: Callable[[int], ServeCommand]  # the command line for a port
    model: str
    what: str  # ServedProcess.what
    factory: Callable[..., ServedProcess]  # a subclass adds its own checks (local.LocalServer)
    env: Mapping[str, str]  # the command's own variables are added
    context: str = ""  # what error lines add beside the log: "model /path/to.gguf"
    scrub: Scrubber = field(default_factory=lambda: Scrubber(None, None, ()))
    api_key: str | None = None
    list_timeout: float = 10.0
    #: the model, once it serves: "adopt" the one it lists (--gsm8k-serve without a model);
    #: "listed": refuse one it does not list or that would answer unnamed (a config, whose
    #: vllm preset names no model); "": the session's preflight checks it
    check: str = ""
    about: Mapping[str, Any] = field(default_factory=dict)  # the report's command/gguf/args
    progress: Callable[[float], None] | None = None


@dataclass(frozen=True)
class Started:
    server: ServedProcess
    info: dict[str, Any]
    identity: dict[str, Any] | None = None  # what its GET /models says of the model

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.server.base_url, self.server.model, self.identity)


def launch(order: Launch, *, log_path: Path, startup_timeout: float, **how: Any) -> Started:
    """Start ``order`` (``how``: any other field of it) as the module says; a port taken
    meanwhile is retried, and ``startup_timeout`` bounds all tries together."""
    order = dataclasses.replace(order, **how)
    log_path.unlink(missing_ok=True)  # a fresh file: a run that still writes the old one keeps it
    log_path.write_bytes(b"")
    what, started = order.what, time.monotonic()
    deadline = started + startup_timeout
    where = f" ({order.context}; log {log_path})" if order.context else f" (log {log_path})"
    text = ""
    for _attempt in range(_PORT_ATTEMPTS):
        port = _free_port()
        command = order.command(port)
        env = {**order.env, **command.env, "PYTHONUNBUFFERED": "1"}  # a current log tail
        offset = log_path.stat().st_size
        try:
            server = order.factory(
                argv=command.argv,
                env=env,
                scrub=order.scrub.command,
                log_path=log_path,
                base_url=f"http://127.0.0.1:{port}/v1",
                model=order.model,
                what=what,
            )
        except OSError as exc:
            raise ServeError(f"{what} could not be started: {exc}") from None
        try:
            server._said.wait(max(0.0, deadline - time.monotonic()))  # the pid, or why not
            failure = None
            if "pid" not in server._status:
                failure = str(server._status.get("error", "its supervisor did not start it"))
            outcome = failure or _wait_ready(server, port, deadline, order.progress)
            if outcome == "ready":
                server.startup_seconds = time.monotonic() - started
                server.probe()
                return _taken(server, order)
        except BaseException:  # KeyboardInterrupt included: never leave it running
            server.stop(timeout=2.0)
            raise
        server.stop(timeout=2.0)
        if failure:
            raise ServeError(f"{what} could not be started: {failure}{where}")
        text = server.log_text(offset)
        in_use = "address already in use" in text.lower() or "errno 98" in text.lower()
        if outcome == "exited" and not server.left and in_use:
            continue
        late = f"{what} did not answer GET {server.base_url}/models within {startup_timeout:g} s"
        head = _exited_head(server, port) if outcome == "exited" else late
        raise ServeError(_with_tail(head + where, text))
    head = f"Port in use: {what} could not bind a free port in {_PORT_ATTEMPTS} tries"
    raise ServeError(_with_tail(f"{head} (log {log_path})", text))


def _taken(server: ServedProcess, order: Launch) -> Started:
    """The serving server's model adopted or checked (``order.check``), and its report."""
    identity = None
    if order.check == "adopt":
        try:
            cards = list_models(server.base_url, order.api_key, order.list_timeout)
        except PreflightError as exc:
            raise ServeError(
                f"--gsm8k-serve: cannot list the server's models ({exc}); give --gsm8k-model"
            ) from None
        models = [str(card["id"]) for card in cards]
        if len(models) != 1:
            raise ServeError(
                f"--gsm8k-serve: the server lists {len(models)} models "
                f"({_listing(models, order.scrub) or 'none'}); choose one with --gsm8k-model"
            )
        if order.scrub.text(models[0]) != models[0]:  # the key would be the run's model name
            raise ServeError(
                f"--gsm8k-serve: the server's only model id holds the API key "
                f"({_listing(models, order.scrub)}); choose the model with --gsm8k-model"
            )
        server.model = models[0]
    elif order.check:
        with contextlib.suppress(PreflightError):  # the first replies tell
            identity = check_model(
                server.base_url, server.model, order.scrub, order.api_key, order.list_timeout
            )
    info = {
        "pid": server.pid,
        **order.about,
        "base_url": server.base_url,
        "model": server.model,
        "startup_seconds": round(server.startup_seconds, 2),
        "log": str(server.log_path),
    }
    return Started(server, order.scrub.obj(info), identity)


def _listing(models: list[str], scrub: Scrubber) -> str:
    shown = ", ".join(printable(scrub.text(m)) for m in models[:10])
    return shown + (", ..." if len(models) > 10 else "")


def check_model(
    base_url: str,
    model: str,
    scrub: Scrubber,
    api_key: str | None,
    timeout: float,
    unnamed: str | None = "",
) -> dict[str, Any] | None:
    """What ``GET /models`` says of ``model`` (for the cache), or one :class:`ServeError` line:
    a model the server does not list, or one that would not answer requests without a model
    field (the vllm preset's) as itself, an adapter grading its base (``unnamed``: what the
    refusal names the model by; None: the requests name it). A failed listing: PreflightError."""
    cards = list_models(base_url, api_key, timeout)
    models = [str(card["id"]) for card in cards]
    if models and model not in models:
        raise ServeError(
            f"model {model!r} is not served by {shown_url(base_url)} "
            f"(it serves: {_listing(models, scrub)})"
        )
    if unnamed is not None and (why := unnamed_answerer(cards, model)) is not None:
        raise ServeError(unnamed + printable(scrub.text(unnamed_refusal(model, why))))
    return describe_server(cards, model)
