"""On-disk response cache: one atomic file per request.

One small JSON file per request, named by the sha256 of everything that
determines the answer (base URL, or the command line of a server the run
starts itself; model, full request body, sample index), so
a different model or protocol can never hit another's entries. Files are
written to a temporary name and renamed, so a run killed at any point
(SIGKILL included) leaves only complete entries behind: that is the resume.

An entry is used only under its own key and for its own request: it stores
both, and a file that holds another key or another request body (copied or
renamed into place) is ignored. It also stores what the server said about
itself when it answered (its ``/v1/models`` card; the reply's model and
fingerprint are in the response): the engine decides whether that still
matches the server of this run (:mod:`pytest_gsm8k.core.identity`).

Reads happen on a reader thread (:meth:`ResponseCache.read`) that the engine
waits for with a bound, so a hung file system cannot stall its event loop;
a file that is not a regular file (a FIFO) is refused without blocking.
Writes happen on a background writer thread (:meth:`ResponseCache.submit`),
so the event loop never waits for the file system; the engine hands an
answer to its test only once it is on disk, so an answer a test has seen
survives any kill.

Entries never hold the API key: only the request body, the response and the
server's description, all scrubbed before they get here.

**A verdict rests on answers this run received.** Every entry names the run that wrote it,
and by default the cache is written but only this run's own entries are read (answers
another xdist worker of the run already stored): the same served name can hide new weights,
and the same command a rebuilt engine, so only asking again tests the build. With
``resume`` (``--gsm8k-resume``) earlier runs' entries are read too, except those of a run
still going: a process that writes entries holds a shared ``flock`` on
``runs/<run id>.lock`` for as long as it may write, which the operating system drops when
the process ends, however it ends (a crashed or killed run's answers can be resumed; two
runs at once never read each other's). And only runs that had **ended before this run
started** are read: a run that held its lock when this cache was opened is never read, nor
is any entry another run wrote after this run started (its file's mtime against the run's
start, which xdist workers take from the controller; the same clock on one machine), so a
run that started later and ended first never lends this run its answers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import queue
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pytest_gsm8k.core.jsontext import to_json_bytes
from pytest_gsm8k.core.types import stable_hash
from pytest_gsm8k.runtime.files import write_atomic

SCHEMA = 1

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # POSIX; Windows has no FIFOs to guard against

#: one entry to store: (key, request body, response, the server's description or None)
Write = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any] | None]

#: what a run id stored in an entry must look like to name its lock file (a uuid's hex)
_RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


def cache_key(base_url: str, body: dict[str, Any], sample: str, wire: str | None = None) -> str:
    """Key of one request: the endpoint, the exact body and which samples it yields.

    ``wire`` is the body's exact text when a preset fixes it byte for byte: the key then
    names those bytes too (key order and escapes included), not only what they decode to.
    """
    key: dict[str, Any] = {"v": SCHEMA, "base_url": base_url, "body": body, "sample": sample}
    if wire is not None:  # absent otherwise: every other run's keys stay as they were
        key["wire"] = wire
    return stable_hash(key)


def _check_response(response: Any) -> None:
    """Raise ValueError unless ``response`` has the shape ModelResponse.from_json reads."""
    if not isinstance(response, dict):
        raise ValueError("no response object")
    completions = response.get("completions")
    if not isinstance(completions, list) or not completions:
        raise ValueError("no completions")
    for completion in completions:
        if not isinstance(completion, dict) or not isinstance(completion.get("text"), str):
            raise ValueError("a completion without text")
    usage = response.get("usage")
    if usage is not None and not (
        isinstance(usage, dict) and all(isinstance(v, int) for v in usage.values())
    ):
        raise ValueError("bad usage")


def _replaceable(path: str) -> bool:
    """Whether an entry may be written at ``path``: nothing there yet, or a regular file
    (the atomic writer never renames over a FIFO, a device or a folder)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return True
    return stat.S_ISREG(mode)


def _running(path: str) -> bool:
    """Whether a process still holds the run lock at ``path`` (a run still going).

    Taking the lock exclusively, without waiting, fails while any process of that run
    holds it shared. No file: the run ended (it removes its lock) or never wrote. A lock
    that cannot be tried (an unreadable file) counts as held: its entries are asked again.
    """
    try:
        fd = os.open(path, os.O_RDWR | _NONBLOCK)  # NFS locks exclusively only for writing
    except FileNotFoundError:
        return False
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY | _NONBLOCK)  # a read-only copy of a cache
        except FileNotFoundError:
            return False
        except OSError:
            return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # held (or the file system cannot tell): not read
    finally:
        os.close(fd)  # and with it the lock just taken
    return False


class ResponseCache:
    """Response store under ``root``; ``persistent=False`` deletes it at :meth:`close`.

    ``resume``: also read the entries of earlier runs that had ended before ``started``
    (``--gsm8k-resume``; the run's start, ``time.time()``, now when not given); otherwise
    only this run's own entries are read.
    """

    def __init__(
        self,
        root: Path,
        run_id: str,
        *,
        persistent: bool = True,
        resume: bool = False,
        started: float | None = None,
    ) -> None:
        self.root = root
        self.entries = root / "responses"
        self.run_id = run_id
        self.persistent = persistent
        self.resume = resume
        self.started = time.time() if started is None else started
        #: held (shared) from this process's first entry until :meth:`close`: the run is going
        self._run_lock: IO[bytes] | None = None
        #: whether each other run whose entries were found is still going (asked once each)
        self._going: dict[str, bool] = {}
        #: the runs going when this cache was opened: never read, even once they end
        self._going_at_start = self._runs_going() if resume else frozenset()
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self.warnings: list[str] = []
        self._made_dirs: set[str] = set()
        self._entries_text = os.fspath(self.entries)  # string paths: pathlib costs more than I/O
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._submitted = 0
        self._written = 0
        self._submit_lock = threading.Lock()
        self._idle = threading.Condition()
        self._reads: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        #: why the cache is no longer read this run (a hung read), or None
        self.unreadable: str | None = None

    # -- entries -------------------------------------------------------------

    def _entry_text(self, key: str) -> str:
        return f"{self._entries_text}{os.sep}{key[:2]}{os.sep}{key}.json"

    def get(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The stored response to ``body`` filed under ``key``, or None.

        An entry is used only when it names the same key and holds the same request
        body: a file copied or renamed into place answers another request. Such an
        entry, a corrupt one or a file that is not a regular file (a FIFO would block
        the read forever) is warned about and treated as missing. So is, silently, an
        entry another run wrote, unless ``resume`` and that run is no longer going
        (:func:`_running`). The response comes with the run (``_run``) and the server
        description (``_server``) it was recorded under, for the engine to decide
        whether it still applies.
        """
        path = self._entry_text(key)
        try:
            # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
            fd = os.open(path, os.O_RDONLY | _NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            return None  # not there (a folder that cannot exist: the write warns about it)
        except OSError as exc:
            self._warn_folder("read", exc)
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._warn(
                    "special",
                    f"gsm8k cache: {path} is not a regular file; it is ignored and its "
                    "request asked again",
                )
                return None
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
            raw = b"".join(chunks)
        except OSError as exc:
            self._warn_folder("read", exc)
            return None
        finally:
            os.close(fd)
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("v") != SCHEMA:
                raise ValueError("unexpected layout")
            response = data.get("response")
            _check_response(response)
            run = data.get("run")
            if not isinstance(run, str) or not _RUN_ID.fullmatch(run):
                raise ValueError("no run id")
        except ValueError as exc:
            self._warn(key, f"gsm8k cache: corrupt entry {path} ({exc}); it will be re-requested")
            return None
        if data.get("key") != key or data.get("request") != body:
            self._warn(
                "mismatch",
                f"gsm8k cache: {path} is filed under another request (its stored key or "
                "request is not the one asked); such entries are ignored and asked again",
            )
            return None
        if run != self.run_id and not (self.resume and self._ended_before(run, info.st_mtime)):
            return None
        assert isinstance(response, dict)
        response["_run"] = run
        response["_server"] = data.get("server")
        return response

    def _lock_path(self, run: str) -> str:
        return os.path.join(self.root, "runs", f"{run}.lock")

    def _runs_going(self) -> frozenset[str]:
        """The runs that hold their lock now (an unreadable folder: none known)."""
        try:
            names = os.listdir(os.path.join(self.root, "runs"))
        except OSError:
            return frozenset()
        runs = (name.removesuffix(".lock") for name in names if name.endswith(".lock"))
        return frozenset(
            run for run in runs if run != self.run_id and _running(self._lock_path(run))
        )

    def _ended_before(self, run: str, written: float) -> bool:
        """Whether the run that wrote an entry (at ``written``) had ended before this run
        started: it wrote the entry before then, it was not going then, and it is not going
        now (judged once per run: its entries are all read or all asked again). One warning
        when it overlapped this run."""
        if written >= self.started:
            self._warn(
                "later",
                f"gsm8k cache: {self.root} holds answers another run wrote after this run "
                "started; they are not read (asked again)",
            )
            return False
        going = self._going.get(run)
        if going is None:
            going = run in self._going_at_start or _running(self._lock_path(run))
            self._going[run] = going
            if going:
                self._warn(
                    "going",
                    f"gsm8k cache: {self.root} holds answers of another run that is still "
                    "going (or was when this run started); they are not read (asked again)",
                )
        return not going

    def _hold_run(self) -> None:
        """Before this process's first entry: hold the run's lock, shared (an xdist worker
        and the controller write for one run), so that no resume reads these entries while
        the run goes on. A lock that cannot be held is an OSError: the entry is not
        written (a warning), since nothing would then keep another run from reading it."""
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

    def _release_run(self) -> None:
        """The run's entries are all written: let go of its lock, and remove the file when
        no other process of the run still holds it."""
        handle, self._run_lock = self._run_lock, None
        if handle is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(handle.name)
        handle.close()

    def put(
        self,
        key: str,
        body: dict[str, Any],
        response: dict[str, Any],
        server: dict[str, Any] | None = None,
    ) -> None:
        """Store atomically: write a temporary file in the same folder, then rename.
        ``server``: what the server said about itself when it gave this answer."""
        self._hold_run()
        path = self._entry_text(key)
        folder = os.path.dirname(path)
        if key[:2] not in self._made_dirs:
            os.makedirs(folder, exist_ok=True)
            self._made_dirs.add(key[:2])
        data = {
            "v": SCHEMA,
            "key": key,
            "run": self.run_id,
            "request": body,
            "server": server,
            "response": response,
        }
        payload = to_json_bytes(data, separators=(",", ":"))  # a lone surrogate stays escaped
        if not _replaceable(path):
            return  # a FIFO or device sits there: its read already warned, once
        write_atomic(path, payload, mkdir=False)

    # -- reads off the caller's thread -----------------------------------------

    def read(self, key: str, body: dict[str, Any]) -> concurrent.futures.Future[Any]:
        """:meth:`get` on the reader thread: a hung file system (a network mount that no
        longer answers) blocks that thread, never the caller, who bounds its wait and then
        calls :meth:`stop_reading`."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.unreadable is not None:
            future.set_result(None)
            return future
        with self._submit_lock:
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read_loop, name="gsm8k-cache-reader", daemon=True
                )
                self._reader.start()
        self._reads.put((key, body, future))
        return future

    def _read_loop(self) -> None:
        while True:
            job = self._reads.get()
            if job is None:
                return
            key, body, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(None if self.unreadable is not None else self.get(key, body))
            except BaseException as exc:  # handed to the reader's caller
                future.set_exception(exc)

    def stop_reading(self, seconds: float) -> None:
        """A read took longer than ``seconds``: every later read is a miss (one warning)."""
        if self.unreadable is None:
            self.unreadable = f"a read took more than {seconds:g} s"
            self._warn(
                "hung",
                f"gsm8k cache: reading an entry in {self.root} took more than {seconds:g} s "
                "(a hung file system?); the cache is not read for the rest of the run",
            )

    # -- background writes ---------------------------------------------------

    def submit(self, items: list[Write], done: Callable[[], None] | None = None) -> None:
        """Write ``(key, body, response, server)`` entries on the writer thread, then call
        ``done``.

        A failed write is a warning (the answer is still good, it is just not
        cached); ``done`` is called either way. The writer takes whatever has
        queued up at each wake-up, so a burst of answers costs one thread
        switch, not one per answer.
        """
        with self._submit_lock:
            self._submitted += 1
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="gsm8k-cache-writer", daemon=True
                )
                self._writer.start()
        self._queue.put((items, done))

    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 512:
                    batch.append(self._queue.get_nowait())
            stop = None in batch
            items = [item for item in batch if item is not None]
            for item in items:
                self._write_item(*item)
            with self._idle:
                self._written += len(items)
                self._idle.notify_all()
            if stop:
                return

    def _write_item(self, items: list[Write], done: Callable[[], None] | None) -> None:
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

    # -- generations of a server this run starts ------------------------------

    def _generation_path(self, name: str) -> Path:
        return self.root / "generations" / f"{stable_hash({'server': name})}.json"

    def generation(self, name: str) -> int:
        """How many runs against the server ``name`` (one this run starts: its command,
        config and environment) finished, so far (0 when none did, or when it cannot be
        read). A started server is the thing under test: its answers resume a run that did
        not finish, and are never reused by the next run (a rebuilt engine, an edited
        kernel, a changed environment variable describe themselves the same)."""
        if not self.persistent:
            return 0
        try:
            data = json.loads(self._generation_path(name).read_text("utf-8"))
            value = data.get("generation") if isinstance(data, dict) else None
        except (OSError, ValueError):
            return 0
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def finished(self, name: str, generation: int) -> None:
        """The run against ``name`` that read ``generation`` has every answer it needs: the
        next run asks again. A folder that cannot be written is one warning (the next run
        would then reuse these answers, which it says as it does)."""
        if not self.persistent:
            return
        try:
            write_atomic(
                self._generation_path(name),
                json.dumps({"generation": generation + 1}) + "\n",
            )
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            self._warn(
                "generation",
                f"gsm8k cache: cannot record in {self.root} that this run finished ({reason}); "
                "the next run reuses its answers",
            )

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every submitted entry is written; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._written >= self._submitted, timeout)

    # -- the end ---------------------------------------------------------------

    def close(self) -> None:
        """Finish writing (and remove everything, for a throw-away cache)."""
        self.flush()
        if self._reader is not None:
            self._reads.put(None)  # a reader stuck in a hung read is a daemon: left behind
            self._reader = None
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=5)
            self._writer = None
        self._release_run()
        if not self.persistent:
            shutil.rmtree(self.root, ignore_errors=True)

    def take_warnings(self) -> list[str]:
        """The warnings collected so far (each once), for the main thread to issue."""
        with self._warn_lock:
            taken = list(self.warnings)
            self.warnings.clear()
        return taken

    def _warn_folder(self, action: str, exc: OSError) -> None:
        """One warning per action and reason for the whole folder, not one per entry: an
        unwritable or full cache folder fails every entry the same way."""
        reason = exc.strerror or str(exc) or type(exc).__name__
        verb = "write to" if action == "write" else "read from"
        consequence = "answers are not cached" if action == "write" else "entries are ignored"
        self._warn(
            f"{action}:{exc.errno}",
            f"gsm8k cache: cannot {verb} the cache folder {self.root} ({reason}); {consequence}",
        )

    def _warn(self, key: str, message: str) -> None:
        # Collected, not warned: this runs on the engine's threads, and the
        # plugin re-issues them on the main thread where pytest records them.
        with self._warn_lock:
            if key not in self._warned:
                self._warned.add(key)
                self.warnings.append(message)
