"""The one launcher of a model server: :func:`launch` starts a :class:`Launch` (a
``--gsm8k-serve`` command, the local GGUF, a ``--gsm8k-config`` config) on a free loopback
port, waits until it serves, checks its model and returns it :class:`Started`; any failure
is one :class:`ServeError` line, the server stopped. What a user sees: docs/serving.md. The
process underneath, which never outlives pytest: process.py. No pytest here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pytest_gsm8k.core.command import CommandError, ServeCommand, serve_command
from pytest_gsm8k.core.identity import describe_server, unnamed_answerer, unnamed_refusal
from pytest_gsm8k.core.plan import Endpoint
from pytest_gsm8k.core.scrub import Scrubber, printable, redact_options
from pytest_gsm8k.runtime.client import PreflightError, get_json, list_models
from pytest_gsm8k.runtime.process import Supervised, describe_exit, processes, remember, spawn
from pytest_gsm8k.runtime.supervise import descendants

PROGRESS_EVERY = 30.0  # seconds between two "waiting for the model server" lines
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 20

#: an opener for the server's loopback URL: never through an HTTP(S)_PROXY of the environment
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: what a serving stack reads from its environment (backends, kernels, devices, checkpoints):
#: the started server inherits these variables, so they name it in cache keys
SERVER_ENV_PREFIXES = tuple(
    "VLLM_ SGLANG_ CUDA_ NCCL_ ROCM_ HIP_ HSA_ TORCH PYTORCH_ TRITON_ HF_ TRANSFORMERS_ "  # noqa: SIM905
    "LLAMA_ GGML_ OMP_ FAKESERVER_".split()
)


class ServeError(Exception):
    """A server could not be started or taken into use: one line, the log's tail after it."""


def server_env_digest(extra: Sequence[tuple[str, str]] = ()) -> str:
    """A digest (the values may hold tokens) of what a started server reads from its
    environment: the :data:`SERVER_ENV_PREFIXES` variables, ``extra`` (a config's ``env``)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(SERVER_ENV_PREFIXES)}
    env.update(dict(extra))
    text = json.dumps(sorted(env.items()), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(eq=False, kw_only=True)
class ServedProcess(Supervised):
    """A running model server: a supervised command with a URL and a model."""

    base_url: str
    model: str
    what: str  # how messages name it, its detail in parentheses: "the model server (vllm ...)"
    startup_seconds: float = 0.0

    def probe(self) -> None:
        """A check once it serves, before the run uses it (:class:`~.local.LocalServer`'s)."""

    def death_head(self) -> str:
        code = self.returncode
        how = describe_exit(code) if code is not None else "an unknown status"
        verb = "exited (daemonised?)" if code == 0 and self.left else "died"
        head = f"{self.what[:-1]}, pid {self.pid}) {verb} with {how}"  # "...(llama.cpp, pid 42)"
        if self.left:
            head += f", leaving {processes(self.left)} running, now stopped"
        return head

    def death_message(self) -> str:
        """One line saying how the server died, then the last lines of its log."""
        return _with_tail(self.death_head() + f" (log {self.log_path})", self.log_text(), 8)

    def watch(self, on_death: Callable[[str], None]) -> None:
        """``on_death(message)`` from a thread as soon as the server exits unasked: a dead
        child must stop the run at once, never look like an unreachable endpoint."""

        def wait() -> None:
            self.process.wait()
            if not self._stopping:
                on_death(self.death_message())

        threading.Thread(target=wait, name="gsm8k-serve-watch", daemon=True).start()


_S = TypeVar("_S", bound=ServedProcess)


@dataclass(frozen=True)
class ServerSpec(Generic[_S]):
    """How to start one server; :func:`start_server` adds the port and runs it."""

    command: Callable[[int], ServeCommand]  # the command line for a port
    model: str
    what: str  # ServedProcess.what
    factory: Callable[..., _S]  # a subclass adds its own checks (local.LocalServer)
    error: type[ServeError] = ServeError
    env: Mapping[str, str] | None = None  # None: ours; the command's own variables are added
    context: str = ""  # what error lines add beside the log: "model /path/to.gguf"


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


def _wait_ready(
    server: ServedProcess, deadline: float, progress: Callable[[float], None] | None
) -> str:
    """Poll ``/models`` until "ready", "exited" or "timeout"; ``progress(seconds waited)``
    every :data:`PROGRESS_EVERY` seconds."""
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
            get_json(url, None, wait, proxies=False)
            ok = True
        except PreflightError as exc:
            ok = exc.status in (401, 403)  # up, and wants a key (vllm serve --api-key)
        if ok and not server.finished() and _owns_port(server.pgid, port) is not False:
            return "ready"
        now = time.monotonic()
        if now >= deadline:
            return "exited" if server.finished() else "timeout"
        if progress is not None and now >= next_progress:
            progress(now - started)
            next_progress += PROGRESS_EVERY
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 1.5, 0.5)


def _owns_port(root: int, port: int) -> bool | None:
    """Whether a process of the server (``root`` and all below it) holds the listening
    socket on loopback ``port`` (None: cannot tell without ``/proc``): another server that
    took the port must never be measured as ours."""
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


def _with_tail(head: str, text: str, lines: int = _LOG_TAIL_LINES) -> str:
    """``head``, then the last lines of a log, long lines clipped to stay readable."""
    tail = [line if len(line) <= 400 else line[:400] + "..." for line in text.splitlines()]
    if not "".join(tail[-lines:]).strip():
        return head + "\n(the server log is empty)"
    indented = "\n".join("    " + line for line in tail[-lines:])
    return f"{head}\nlast lines of the server log:\n{indented}"


def _exited_head(server: ServedProcess, port: int) -> str:
    """The first line for a command that ended before it was ready."""
    code = server.returncode
    how = describe_exit(code) if code is not None else "an unknown status"
    foreground = "run the server in the foreground (no &, nohup, setsid or --daemon)"
    if server.left:
        verb = "exited (daemonised?)" if code == 0 else "exited"
        return (
            f"{server.what} {verb} with {how} before it was ready, leaving "
            f"{processes(server.left)} running, now stopped: {foreground}"
        )
    if _listening(port):
        return (
            f"{server.what} exited (daemonised?) with {how} before it was ready, and port "
            f"{port} is served by a process that is not one of its own: stop that server, "
            f"and {foreground}"
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
    """Start ``spec`` on a free loopback port and wait until ``GET /v1/models`` answers from
    the server's own processes (docs/serving.md); a port taken meanwhile is retried. Any
    other early exit, or no answer within ``startup_timeout`` (all tries together), raises
    ``spec.error`` with the exit status and the tail of ``log_path`` (which stays)."""
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
            proc, control, status, copier = spawn(command.argv, log_path, env, scrub)
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
        remember(server)
        try:
            failure = server._wait_started(deadline)
            outcome = failure or _wait_ready(server, deadline, progress)
        except BaseException:  # KeyboardInterrupt included: never leave it running
            server.stop(timeout=2.0)
            raise
        if outcome == "ready":
            server.startup_seconds = time.monotonic() - started
            return server
        server.stop(timeout=2.0)
        if failure:
            raise spec.error(f"{what} could not be started: {failure}{where}")
        text = server.log_text(offset)
        lowered = text.lower()
        in_use = "address already in use" in lowered or "errno 98" in lowered
        if outcome == "exited" and not server.left and in_use:
            last_port_error = text
            continue
        if outcome == "exited":
            head = _exited_head(server, port) + where
        else:
            head = (
                f"{what} did not answer GET {server.base_url}/models within "
                f"{startup_timeout:g} s{where}"
            )
        raise spec.error(_with_tail(head, text))
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
    """The spec of ``--gsm8k-serve`` ``command``, ``{port}`` and ``{model}`` filled in so
    that the model name never becomes code (core/command.py); refused now, as one line."""
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


@dataclass(frozen=True)
class Launch:
    """What to start for the run and how to take it into use (docs/serving.md)."""

    spec: ServerSpec[Any]  # a command (serve_spec) or a GGUF (local.local_spec)
    log_path: Path
    startup_timeout: float
    scrub: Scrubber = field(default_factory=Scrubber)
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
    """A server launched for the run: what to ask it and what the report says of it."""

    server: ServedProcess
    info: dict[str, Any]
    identity: dict[str, Any] | None = None  # what its GET /models says of the model

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.server.base_url, self.server.model, self.identity)


def launch(order: Launch) -> Started:
    """Start ``order``, wait until it serves, probe it and check its model. Any failure is
    one :class:`ServeError` (the spec's subclass) line, the server stopped."""
    server = start_server(
        order.spec,
        log_path=order.log_path,
        startup_timeout=order.startup_timeout,
        progress=order.progress,
        scrub=order.scrub.command,
    )
    try:
        server.probe()
        identity = _check_model(server, order) if order.check else None
    except BaseException:
        server.stop(timeout=2.0)
        raise
    info = {
        "pid": server.pid,
        **order.about,
        "base_url": server.base_url,
        "model": server.model,
        "startup_seconds": round(server.startup_seconds, 2),
        "log": str(server.log_path),
    }
    return Started(server, order.scrub.obj(info), identity)


def _check_model(server: ServedProcess, order: Launch) -> dict[str, Any] | None:
    cards: list[dict[str, Any]] = []
    adopt = order.check == "adopt"
    try:
        models = list_models(server.base_url, order.api_key, order.list_timeout, cards)
    except PreflightError as exc:
        if adopt:
            raise ServeError(
                f"--gsm8k-serve: cannot list the server's models ({exc.detail}); give --gsm8k-model"
            ) from None
        models = []  # the first replies tell

    def shown(text: str) -> str:
        return printable(order.scrub.text(text))

    listing = ", ".join(shown(m) for m in models[:10]) + (", ..." if len(models) > 10 else "")
    if adopt and len(models) != 1:
        raise ServeError(
            f"--gsm8k-serve: the server lists {len(models)} models ({listing or 'none'}); "
            "choose one with --gsm8k-model"
        )
    if adopt and order.scrub.text(models[0]) != models[0]:
        # adopted, the key would be the run's model name: terminal, report, baseline
        raise ServeError(
            f"--gsm8k-serve: the server's only model id holds the API key "
            f"({shown(models[0])}); choose the model with --gsm8k-model"
        )
    if adopt:
        server.model = models[0]
        return None
    if models and server.model not in models:
        raise ServeError(f"the server does not serve {server.model!r} (it serves: {listing})")
    why = unnamed_answerer(cards, server.model)
    if why is not None:
        raise ServeError(shown(unnamed_refusal(server.model, why)))
    return describe_server(cards, server.model)
