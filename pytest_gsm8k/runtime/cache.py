"""On-disk response cache: one JSON file per request, named by the sha256 of all that decides
the answer, written atomically (a killed run leaves whole entries: the resume), never holding the
API key. Read: this run's entries and, with ``resume``, those of runs that had ended before it
started, told by the shared ``flock`` each run holds on ``runs/<run id>.lock`` while it writes
(docs/design.md, "The cache and its identity rule")."""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import json
import os
import queue
import re
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pytest_gsm8k.core.jsontext import to_json
from pytest_gsm8k.core.types import stable_hash
from pytest_gsm8k.runtime.outputs import write_atomic

SCHEMA = 1
Json = dict[str, Any]
#: one entry to store: (key, request body, response, the server's description or None)
Write = tuple[str, Json, Json, Json | None]
_SKIPPED = {
    "special": "is not a regular file; it is ignored and its request asked again",
    "mismatch": "is filed under another request (its stored key or request is not the one "
    "asked); such entries are ignored and asked again",
}
_NOT_READ = {
    "later": "another run wrote after this run started",
    "going": "of another run that is still going (or was when this run started)",
}


def cache_key(base_url: str, body: Json, sample: str, wire: str | None, repeat: int) -> str:
    """Key of one request: the endpoint, the exact body, which samples it yields (``r<i>:`` in
    front for repeat ``i``) and, where a preset fixes them byte for byte, the body's exact
    text; without a wire text or a repeat, the key that was written before they existed."""
    sample = f"r{repeat}:{sample}" if repeat else sample
    key: dict[str, Any] = {"v": SCHEMA, "base_url": base_url, "body": body, "sample": sample}
    return stable_hash(key if wire is None else {**key, "wire": wire})


def _parse(raw: bytes) -> Json:
    """The entry in ``raw``; ValueError, LookupError or TypeError unless it has the layout
    ModelResponse.from_json reads (which leaves out token counts that are not counts)."""
    data: Json = json.loads(raw)
    texts = [c["text"] for c in data["response"]["completions"]]
    if data["v"] != SCHEMA or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("not an entry of this layout")
    if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", data["run"]):  # a uuid's hex: it names a lock
        raise ValueError("no run id")
    return data


def _running(path: str) -> bool:
    """Whether a process still holds the run lock at ``path``: taking it exclusively without
    waiting fails while any process of that run holds it shared. No file: the run ended (or
    never wrote). A lock that cannot be tried counts as held: its entries are asked again."""
    for flags in (os.O_RDWR, os.O_RDONLY):  # NFS locks only for writing; a read-only copy
        try:
            fd = os.open(path, flags | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)  # and with it the lock just taken
    return True


class ResponseCache:
    """Response store under ``root``; ``persistent=False`` deletes it at :meth:`close`.
    ``resume``: also read the entries of runs that had ended before ``started`` (the run's
    start, ``time.time()``; xdist workers take the controller's)."""

    def __init__(
        self, root: Path, run_id: str, *, persistent: bool, resume: bool, started: float
    ) -> None:
        self.root, self.run_id, self.persistent, self.resume = root, run_id, persistent, resume
        self.started = started
        self._entries = os.fspath(root / "responses")  # strings: pathlib costs more than I/O
        self._run_lock: IO[bytes] | None = None  # held from the first entry until close
        self._going: dict[str, bool] = {}  # whether each other run found is still going
        #: the runs going when this cache was opened: never read, even once they end
        self._going_at_start = self._runs_going() if resume else frozenset()
        self._lock = threading.Lock()  # the warnings and the threads
        self._warned: dict[str, str] = {}  # each warning by its key, in order
        self._taken = 0  # how many of them take_warnings handed out
        self._jobs: dict[str, queue.SimpleQueue[Callable[[], None] | None]] = {}  # by thread
        self.unreadable: str | None = None  # why the cache is no longer read (a hung read)

    def _entry_text(self, key: str) -> str:
        return f"{self._entries}{os.sep}{key[:2]}{os.sep}{key}.json"

    def get(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The stored response to ``body`` under ``key``, with the run (``_run``) and server
        (``_server``) it was recorded under. None when missing, corrupt, not a regular file or
        filed under another request (a warning each), or another run's (see the module)."""
        path = self._entry_text(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO would wait for a writer
            with open(fd, "rb") as handle:
                info = os.fstat(fd)
                data = _parse(handle.read()) if stat.S_ISREG(info.st_mode) else None
        except (FileNotFoundError, NotADirectoryError):
            return None  # a folder that cannot exist: the write warns about it
        except OSError as exc:
            self._warn_folder("read", exc)
            return None
        except (ValueError, LookupError, TypeError) as exc:
            why = f"{type(exc).__name__}: {exc}"  # not its repr: a decode error's holds every byte
            self._warn(key, f"gsm8k cache: corrupt entry {path} ({why}); it will be re-requested")
            return None
        if data is None or data.get("key") != key or data.get("request") != body:
            kind = "special" if data is None else "mismatch"
            self._warn(kind, f"gsm8k cache: {path} {_SKIPPED[kind]}")
            return None
        run = data["run"]
        if run != self.run_id and not (self.resume and self._ended_before(run, info.st_mtime)):
            return None
        return {**data["response"], "_run": run, "_server": data.get("server")}

    def _lock_path(self, run: str) -> str:
        return os.path.join(self.root, "runs", f"{run}.lock")

    def _runs_going(self) -> frozenset[str]:
        """The other runs that hold their lock now (an unreadable folder: none known)."""
        try:
            names = os.listdir(os.path.join(self.root, "runs"))
        except OSError:
            return frozenset()
        runs = (name.removesuffix(".lock") for name in names if name.endswith(".lock"))
        return frozenset(r for r in runs if r != self.run_id and _running(self._lock_path(r)))

    def _ended_before(self, run: str, written: float) -> bool:
        """Whether ``run``, which wrote an entry at ``written``, had ended before this run
        started (judged once per run: all its entries are read, or none)."""
        if run not in self._going:
            self._going[run] = run in self._going_at_start or _running(self._lock_path(run))
        why = "later" if written >= self.started else "going" if self._going[run] else None
        if why is not None:
            said = f"holds answers {_NOT_READ[why]}; they are not read (asked again)"
            self._warn(why, f"gsm8k cache: {self.root} {said}")
        return why is None

    def _hold_run(self) -> None:
        """Hold the run's lock, shared (the controller and xdist workers write for one run); an
        OSError when it cannot be: an entry no lock guards from other runs is not written."""
        if self._run_lock is not None or not self.persistent:
            return
        path = self._lock_path(self.run_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+b")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        except BaseException:
            handle.close()
            raise
        self._run_lock = handle

    def put(self, key: str, body: Json, response: Json, server: Json | None = None) -> None:
        """Store one entry atomically; ``server``: what the server said about itself then."""
        self._hold_run()
        path = self._entry_text(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = {"v": SCHEMA, "key": key, "run": self.run_id, "request": body, "server": server}
        payload = to_json({**data, "response": response}, separators=(",", ":")).encode()
        # a FIFO, device or folder at the path is never renamed over; its read warned, once
        with contextlib.suppress(FileExistsError, IsADirectoryError):
            write_atomic(path, payload)

    # -- the reader and the writer thread: daemons, so a hung file system holds only them --

    def _on(self, name: str, job: Callable[[], None]) -> None:
        """Run ``job`` on the thread ``name``, after the jobs put there before it."""
        with self._lock:
            if (jobs := self._jobs.get(name)) is None:
                jobs = self._jobs[name] = queue.SimpleQueue()
                thread = f"gsm8k-cache-{name}"
                threading.Thread(target=_drain, args=(jobs,), name=thread, daemon=True).start()
        jobs.put(job)

    def read(self, key: str, body: Json) -> concurrent.futures.Future[Json | None]:
        """:meth:`get` on the reader thread: a hung file system blocks that thread, never the
        caller, who bounds its wait and then calls :meth:`stop_reading`."""
        future: concurrent.futures.Future[Json | None] = concurrent.futures.Future()

        def get() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(None if self.unreadable else self.get(key, body))
                except BaseException as exc:  # handed to the reader's caller
                    future.set_exception(exc)

        if self.unreadable is None:
            self._on("reader", get)
        else:
            future.set_result(None)
        return future

    def stop_reading(self, seconds: float) -> None:
        """A read took longer than ``seconds``: every later read is a miss (one warning)."""
        if self.unreadable is None:
            self.unreadable = f"a read took more than {seconds:g} s"
            self._warn(
                "hung",
                f"gsm8k cache: reading an entry in {self.root} took more than {seconds:g} s "
                "(a hung file system?); the cache is not read for the rest of the run",
            )

    def submit(self, items: list[Write], done: Callable[[], None] | None = None) -> None:
        """Write the entries on the writer thread, then call ``done``, also when a write
        failed (a warning: the answer is good, just not cached); no entries: ``done`` now."""
        if items:
            self._on("writer", functools.partial(self._write, items, done))
        elif done is not None:
            done()

    def _write(self, items: list[Write], done: Callable[[], None] | None) -> None:
        for key, body, response, server in items:
            try:
                self.put(key, body, response, server)
            except OSError as exc:
                self._warn_folder("write", exc)
            except Exception as exc:  # a cache problem never fails the run
                self._warn(key, f"gsm8k cache: cannot store an entry ({exc})")
        if done is not None:
            with contextlib.suppress(Exception):
                done()

    def flush(self) -> bool:
        """Wait until every submitted entry is written; False after 30 s."""
        if "writer" not in self._jobs:
            return True
        written = threading.Event()
        self._on("writer", written.set)
        return written.wait(30.0)  # a hung file system holds only the writer thread

    def _generation_path(self, name: str) -> Path:
        return self.root / "generations" / f"{stable_hash({'server': name})}.json"

    def generation(self, name: str) -> int:
        """How many runs against the server ``name`` (one this run starts) finished so far (0
        when none did or it cannot be read): a started server is the thing under test, so its
        answers resume an unfinished run and are never reused by the next one."""
        value = None  # a throw-away cache has none: finished() writes none there
        with contextlib.suppress(OSError, ValueError, LookupError, TypeError):
            value = json.loads(self._generation_path(name).read_text("utf-8"))["generation"]
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def finished(self, name: str, generation: int) -> None:
        """The run against ``name`` that read ``generation`` has every answer: the next run
        asks again (a folder that cannot be written is one warning)."""
        if not self.persistent:
            return
        try:
            data = json.dumps({"generation": generation + 1}) + "\n"
            write_atomic(self._generation_path(name), data)
        except OSError as exc:
            self._warn(
                "generation",
                f"gsm8k cache: cannot record in {self.root} that this run finished "
                f"({_reason(exc)}); the next run reuses its answers",
            )

    def close(self) -> None:
        """Finish writing, let go of the run's lock (its file goes with the run's last holder),
        and remove everything for a throw-away cache."""
        self.flush()
        with self._lock:  # a reader stuck in a hung read is a daemon: left behind
            for jobs in self._jobs.values():
                jobs.put(None)
            self._jobs.clear()
        handle, self._run_lock = self._run_lock, None
        if handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(handle.name)
            handle.close()
        if not self.persistent:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- warnings: collected on the cache's threads, issued by the plugin on the main one --

    def take_warnings(self) -> list[str]:
        """The warnings collected since the last call (each once per run)."""
        with self._lock:
            taken = list(self._warned.values())[self._taken :]
            self._taken += len(taken)
        return taken

    def _warn_folder(self, action: str, exc: OSError) -> None:
        """One warning per action and reason for the whole folder, not one per entry."""
        what = "write to" if action == "write" else "read from"
        then = "answers are not cached" if action == "write" else "entries are ignored"
        self._warn(
            f"{action}:{exc.errno}",
            f"gsm8k cache: cannot {what} the cache folder {self.root} ({_reason(exc)}); {then}",
        )

    def _warn(self, key: str, message: str) -> None:
        with self._lock:
            self._warned.setdefault(key, message)


def _drain(jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
    while (job := jobs.get()) is not None:
        job()


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__
