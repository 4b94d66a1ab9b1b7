"""xdist: the controller's one fetcher (:class:`Lead`) and the workers that follow it.

Under xdist with the plugin's own model and protocol fixtures, the
controller, which runs no tests, is the run's one fetcher, with the whole
``--gsm8k-concurrency``; the workers' engines only *follow*: their tests read
the fetcher's entries (its feed file) as they appear, and a worker sends a
request itself only if the fetcher is gone. The workers import no HTTP
client at all.

The protocol is three small files in the run's folder, so that a fetcher
that dies or never starts costs nothing but speed:

* ``gsm8k-lead.json``: the fetcher's state (listening, fetching with the
  plan's digest, declined, closed); its mtime is the heartbeat;
* ``gsm8k-plan.json``: the plan the first worker offers (its exact requests);
* ``gsm8k-lead.ready``: the fetcher's first answer is in (the controller
  holds back workers the machine has no core for until then).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pytest_gsm8k.core.types import Request
from pytest_gsm8k.runtime.cache import ResponseCache
from pytest_gsm8k.runtime.client import Breaker, ModelClient
from pytest_gsm8k.runtime.engine import Engine

PLAN_FILE = "gsm8k-plan.json"
LEAD_FILE = "gsm8k-lead.json"
READY_FILE = "gsm8k-lead.ready"
LOG_FILE = "gsm8k-lead.log"
HEARTBEAT_SECONDS = 0.5
LEAD_GONE_SECONDS = 5.0


def _plan_bytes(client: ModelClient, requests: list[Request]) -> bytes:
    """A worker's plan: the endpoint and model its cache keys name, and its requests."""
    plan = {"endpoint": client.endpoint, "model": client.model,
            "requests": [vars(r) for r in requests]}
    return json.dumps(plan, ensure_ascii=False, separators=(",", ":")).encode()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Follow:
    """A worker's view of the leading controller: alive while its heartbeat is fresh."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._checked = 0.0
        self._alive = True

    def alive(self) -> bool:
        now = time.monotonic()
        if now - self._checked >= HEARTBEAT_SECONDS / 2:
            self._checked = now
            data = None if _stale(self.path) else _read_json(self.path)
            self._alive = data is not None and data.get("state") == "fetching"
        return self._alive


def offer_plan(
    folder: Path, client: ModelClient, requests: list[Request], wait: float = 30.0
) -> Follow | None:
    """Worker: ask the controller's fetcher to fetch these requests. A :class:`Follow` if so.

    All workers collect the same items, so the first plan offered is the
    run's (the fetcher answers with its digest: a worker with another plan
    does not follow); the fetcher answers in milliseconds (it polls for the
    plan from session start). No answer, a refusal or another plan: None,
    and the worker prefetches for itself, sharing the work through claims.
    The worker waits for the answer while the fetcher's heartbeat is fresh
    (it beats while listening too), ``wait`` seconds at most: a worker that
    gave up on a slow fetcher that then takes the plan would fetch beside it.
    """
    lead = folder / LEAD_FILE
    if _read_json(lead) is None:
        return None  # no controller listening (it writes the file before workers start)
    data = _plan_bytes(client, requests)
    digest = hashlib.sha256(data).hexdigest()
    plan = folder / PLAN_FILE
    if not plan.exists():
        tmp = plan.with_name(f".{plan.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, plan)
    deadline = time.monotonic() + wait
    while True:
        answer = _read_json(lead)
        if answer is not None and answer.get("state") != "listening":
            if answer.get("state") == "fetching" and answer.get("digest") == digest:
                return Follow(lead)
            return None
        if time.monotonic() > deadline or _stale(lead):
            return None
        time.sleep(0.005)


def _stale(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > LEAD_GONE_SECONDS
    except OSError:
        return True


class _Forked:
    """The little of ``subprocess.Popen`` that :class:`Lead` uses, for a forked child."""

    def __init__(self, pid: int, pipe: int) -> None:
        self.pid = pid
        self._pipe: int | None = pipe  # its read end is the child's "parent alive" line
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (a SIGCHLD handler): gone
                self.returncode = 0
                return 0
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def close_pipe(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = None

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetcher {self.pid} did not end")
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.returncode = -signal.SIGKILL


def _can_fork() -> bool:
    """Fork only where it is safe: Linux, and no other thread running yet.

    Threads the interpreter does not know of count too (a native library's
    pool, imported by a conftest): a child forked beside them could inherit
    a lock one of them held, and Python 3.12+ warns about it.
    """
    if not sys.platform.startswith("linux") or threading.active_count() != 1:
        return False
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Threads:"):
                    return int(line.split()[1]) == 1
    except (OSError, ValueError):
        pass
    return False


class Lead:
    """The xdist controller's fetcher: a small process of its own, started at session start.

    It waits for the plan the first worker offers (the requests themselves,
    see :func:`offer_plan`), fetches it with the whole concurrency and writes
    the entries the workers' tests read; a heartbeat in the answer file tells
    the followers it is alive. Its own process, not a thread of the
    controller: the controller's interpreter is busy with xdist (unpacking
    and reporting every test's results), and on a small machine sharing that
    GIL slows the fetching more than a second interpreter costs.

    On Linux it is forked from the controller, before xdist starts any
    thread: the child has pytest's modules (asyncio, ssl, json, ...) already
    imported and only imports openai, which, with a fresh interpreter's
    start-up, was the longest step before the first request (about 0.2 s on
    a 2-core machine). The child never returns into pytest: it lets go of
    the controller's files (:func:`_leave_the_controllers_files`), runs
    :func:`_lead_child` and leaves with ``os._exit``. Elsewhere (or if a
    thread is running, or fork fails) it is a fresh ``python -c`` process
    running :func:`lead_main`. ``config``: what :func:`_lead_child` needs to
    rebuild the client and cache.
    """

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        self.folder = folder
        self.config = config
        self.proc: Any = None
        self._log: Any = None
        self._waited_out = False  # wait_ready timed out once

    def start(self, fork: bool | None = None) -> None:
        """Listen for a plan (say so first: workers only wait for a listening controller).

        ``fork``: None forks where :func:`_can_fork` says it is safe; False always
        starts a fresh interpreter.
        """
        _write_json(self.folder / LEAD_FILE, {"state": "listening"})
        self._log = open(self.folder / LOG_FILE, "wb")  # noqa: SIM115 - closed in close
        if fork if fork is not None else _can_fork():
            with contextlib.suppress(OSError):  # no fork (a pids limit, memory): a fresh one
                self.proc = self._fork()
                return
        import subprocess

        code = ("import sys; from pytest_gsm8k.lead import lead_main; "
                "sys.exit(lead_main(sys.argv[1:]))")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(self.config)],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, close_fds=True,
        )

    def _fork(self) -> _Forked:
        for stream in (sys.stdout, sys.stderr):  # or the child would write them out again
            with contextlib.suppress(Exception):
                stream.flush()
        read_end, write_end = os.pipe()
        # No Ctrl-C between fork and the child's own handlers: a KeyboardInterrupt there
        # would carry the child back into pytest as a second controller.
        signals = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
            raise
        if pid:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
            os.close(read_end)
            return _Forked(pid, write_end)
        code = 1
        try:  # the child: never back into pytest (_lead_child unblocks the signals)
            _leave_the_controllers_files(self._log.fileno(), keep=read_end)
            code = _lead_child(self.config, read_end)
        except BaseException:  # noqa: BLE001 - report it in the log, whatever it is
            import traceback

            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(code)

    def failure(self) -> str | None:
        """One line when the fetcher ended on its own with an error (its log's last line).

        The workers then fetched the rest themselves (slower, not wrong); the
        log goes with the run folder, so this is the only trace a user sees.
        """
        proc = self.proc
        code = proc.poll() if proc is not None else None
        if code in (None, 0):
            return None
        last = ""
        with contextlib.suppress(OSError):
            lines = (self.folder / LOG_FILE).read_text(errors="replace").strip().splitlines()
            last = lines[-1].strip() if lines else ""
        return f"the fetcher process ended with code {code}" + (f": {last}" if last else "")

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the fetcher's first answer is in (or it has nothing to fetch, or is gone).

        Why: on a machine with few cores, the xdist workers' own start-up
        (importing pytest and every plugin, collecting) takes the CPU the
        fetcher needs for its slowest steps: importing openai and opening
        its connections for the first round of requests. Nothing can be
        answered before that round is back, so the controller holds back the
        workers the machine has no spare core for until then (see
        ``StatePlugin.pytest_configure_node``); the first worker starts at
        once, so its plan is there when the fetcher can send it.
        """
        marker = self.folder / READY_FILE
        if self._waited_out:
            return marker.exists()  # once is enough: the next workers do not wait again
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.exists() or self.proc is None or self.proc.poll() is not None:
                return marker.exists()
            time.sleep(0.005)
        self._waited_out = True
        return False

    def close(self) -> None:
        """Tell the fetcher to finish (it writes what it has), wait for it, then say so."""
        proc = self.proc
        if proc is not None:
            if isinstance(proc, _Forked):
                proc.close_pipe()  # EOF: stop
            else:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - never hang the end of a run on it
                proc.kill()
                if not isinstance(proc, _Forked):
                    proc.wait()
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        with contextlib.suppress(OSError):
            _write_json(self.folder / LEAD_FILE, {"state": "closed"})


_INHERITED: list[Any] = []  # the controller's objects the forked child must never free


def _leave_the_controllers_files(log: int, keep: int) -> None:
    """Forked child: write only to ``log``, and hold none of the controller's files open.

    Inherited, they would let the child write into the user's terminal
    (faulthandler's copy of stderr, pytest's saved capture fds), interleave
    with ``--log-file`` through the logging handlers pytest attached, and
    keep the user's output pipe open after the controller ends. The objects
    that own them are kept referenced, so none is finalized here.
    """
    import faulthandler
    import logging

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        _INHERITED.append(list(logger.handlers))
        logger.handlers.clear()
    _INHERITED.extend([sys.stdout, sys.stderr])
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    faulthandler.enable(file=sys.stderr)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)  # an event loop's, if the controller had one
    # /dev/null over each one, not close: a descriptor number closed here would be reused by
    # this child's sockets, and an inherited object still writing to its old number would
    # write into an HTTP connection.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in (log, keep, null):
            with contextlib.suppress(OSError):
                os.dup2(null, fd)


def _lead_signals(stop: threading.Event) -> None:
    """Ctrl-C is the controller's to handle (it then closes the fetcher, which writes what it
    has); SIGTERM stops it the same way. Set from a thread: ``Event.set`` takes a lock the
    interrupted main thread may hold inside ``Event.wait``. Then unblocks both (a forked
    child has them blocked since the fork, so none is lost or taken too early)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM,
                  lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _request_from_json(data: dict[str, Any]) -> Request:
    fields = dict(data)
    fields["messages"] = tuple((str(role), str(text)) for role, text in fields["messages"])
    fields["stop"] = tuple(str(x) for x in fields.get("stop") or ())
    return Request(**fields)


def lead_main(argv: list[str]) -> int:
    """The fetcher as a fresh process (see :class:`Lead`): ``argv[0]`` is its JSON config."""
    return _lead_child(json.loads(argv[0]), sys.stdin.fileno())


def _lead_child(config: dict[str, Any], parent: int) -> int:
    """The fetcher: wait for the plan, fetch it, heartbeat until ``parent`` (a fd) closes.

    ``parent`` reaches end of file when the controller closes it or dies,
    however it dies; SIGTERM stops it too (see :func:`_lead_signals`).
    """
    import gc

    from pytest_gsm8k.runtime.client import OpenAIClient

    gc.freeze()  # forked: what the controller had stays shared, not copied by collections
    folder = Path(config["run_dir"])
    plan_path, lead_path = folder / PLAN_FILE, folder / LEAD_FILE
    stop = threading.Event()
    _lead_signals(stop)

    def watch_parent() -> None:
        with contextlib.suppress(Exception):
            while os.read(parent, 4096):
                pass
        stop.set()

    threading.Thread(target=watch_parent, name="gsm8k-lead-parent", daemon=True).start()
    breaker = Breaker()
    client = OpenAIClient(
        model=config["model"], base_url=config["endpoint"],
        api_key=os.environ.get(config["api_key_env"]) or None, timeout=config["timeout"],
        max_retries=config["max_retries"], concurrency=config["concurrency"], breaker=breaker,
    )
    ready_once = threading.Lock()

    def ready(*_: object) -> None:  # the held-back workers may start (see Lead.wait_ready)
        if ready_once.acquire(blocking=False):
            with contextlib.suppress(OSError):
                (folder / READY_FILE).touch()

    def warm_up() -> None:  # import openai while the first worker starts and collects
        try:
            client.warm()
        except Exception:  # noqa: BLE001 - a broken client shows at its first request
            ready()

    threading.Thread(target=warm_up, name="gsm8k-warm", daemon=True).start()
    raw = None
    beat = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(FileNotFoundError):
            raw = plan_path.read_bytes()
            break
        if time.monotonic() - beat >= HEARTBEAT_SECONDS:  # listening, alive (offer_plan)
            beat = time.monotonic()
            with contextlib.suppress(OSError):
                os.utime(lead_path)
        stop.wait(0.003)
    if raw is None:
        ready()
        return 0
    digest = hashlib.sha256(raw).hexdigest()
    try:
        plan = json.loads(raw)
        requests = [_request_from_json(r) for r in plan["requests"]]
        # The same keys on both sides: the followers look the answers up by them.
        accepted = (plan["endpoint"], plan["model"]) == (client.endpoint, client.model)
    except (KeyError, TypeError, ValueError) as exc:
        print(f"gsm8k lead: unusable plan ({exc})", flush=True)
        accepted = False
    if not accepted:
        _write_json(lead_path, {"state": "declined", "digest": digest})
        ready()
        return 0
    cache = ResponseCache(Path(config["cache_root"]), config["run_id"],
                          persistent=config["persistent"])
    engine = Engine(client, cache, concurrency=config["concurrency"], use_claims=True,
                    breaker=breaker, lead=True)
    engine.start(requests)
    for job in engine.jobs:
        job.future.add_done_callback(ready)
    if not requests:
        ready()
    _write_json(lead_path, {"state": "fetching", "digest": digest})
    while not stop.wait(HEARTBEAT_SECONDS):
        with contextlib.suppress(OSError):
            os.utime(lead_path)
    engine.close()
    cache.flush()
    # Everything is written; the controller waits for this process before it cleans up,
    # so skip the interpreter's teardown (this process is ours alone, nothing else runs).
    sys.stdout.flush()
    os._exit(0)
