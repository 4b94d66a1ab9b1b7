"""On-disk response cache with cross-process claims.

One small JSON file per request, named by the sha256 of everything that
determines the answer (base URL, model, full request body, sample index), so
a different model or protocol can never hit another's entries. Files are
written to a temporary name and renamed, so a run killed at any point
(SIGKILL included) leaves only complete entries behind: that is the resume.

Claims make xdist workers share the work: before sending a request a
process creates ``claims/<run>/<key>`` with O_EXCL; whoever wins sends it,
the others leave it alone (or wait for its entry when their own test needs
it). Claims live in a per-run folder, so a crashed earlier run can never
block a new one; within a run a claim whose process died is taken over.

Entries never hold the API key: only the request body and the response.

Cost: a miss is one failed ``open``; a write is one ``open``/``write``/
``rename`` (no ``mkstemp`` name hunting, no folder creation after the first
entry of a folder); folders are created on first use, so a cache that is
never written touches nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from pytest_gsm8k.types import stable_hash

SCHEMA = 1


def cache_key(base_url: str, body: dict[str, Any], sample: str) -> str:
    """Key of one request: the endpoint, the exact body and which samples it yields."""
    return stable_hash({"v": SCHEMA, "base_url": base_url, "body": body, "sample": sample})


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(path: Path, seconds: float = 2.0) -> bool:
    """An empty claim older than ``seconds``: its owner died between create and write."""
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return True


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


class ResponseCache:
    """Response store under ``root``; ``persistent=False`` deletes it at :meth:`close`."""

    def __init__(self, root: Path, run_id: str, *, persistent: bool = True) -> None:
        self.root = root
        self.entries = root / "responses"
        self.claims = root / "claims" / run_id
        self.run_id = run_id
        self.persistent = persistent
        self._pid = os.getpid()
        self._pid_text = str(self._pid).encode()
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self.warnings: list[str] = []
        self._made_dirs: set[str] = set()
        self._claims_made = False

    def _entry_path(self, key: str) -> Path:
        return self.entries / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored response, or None. A corrupt entry is warned about once and ignored."""
        path = self._entry_path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn(key, f"gsm8k cache: cannot read {path} ({exc.strerror}); ignoring it")
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("v") != SCHEMA:
                raise ValueError("unexpected layout")
            if data.get("key") not in (None, key):
                raise ValueError("entry of another request")
            response = data.get("response")
            _check_response(response)
        except ValueError as exc:
            self._warn(key, f"gsm8k cache: corrupt entry {path} ({exc}); it will be re-requested")
            return None
        assert isinstance(response, dict)
        response["_run"] = data.get("run")
        return response

    def put(self, key: str, body: dict[str, Any], response: dict[str, Any]) -> None:
        """Store atomically: write a temporary file in the same folder, then rename."""
        path = self._entry_path(key)
        folder = path.parent
        if folder.name not in self._made_dirs:
            folder.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(folder.name)
        data = {"v": SCHEMA, "key": key, "run": self.run_id, "request": body, "response": response}
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        # Unique per process and key: two processes never share a temporary file.
        tmp = folder / f".{key}.{self._pid}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def claim(self, key: str) -> bool:
        """True when this process now owns ``key``; False while another live process does."""
        path = self.claims / key
        for _ in range(3):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileNotFoundError:
                self.claims.mkdir(parents=True, exist_ok=True)
                continue
            except FileExistsError:
                try:
                    owner = int(path.read_bytes() or b"0")
                except FileNotFoundError:
                    continue  # released just now: try again
                except (OSError, ValueError):
                    return False  # unreadable: treat as taken
                if owner == self._pid:
                    return True
                if owner == 0 and not _stale(path):
                    return False  # created, its pid not written yet
                if owner and _pid_alive(owner):
                    return False
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # owner died mid-request: take it over
                continue
            try:
                os.write(fd, self._pid_text)
            finally:
                os.close(fd)
            return True
        return False

    def claim_owner_alive(self, key: str) -> bool:
        """Whether somebody still holds a claim on ``key`` (a waiter gives up otherwise)."""
        path = self.claims / key
        try:
            owner = int(path.read_bytes() or b"0")
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            return True
        if owner == 0:
            return not _stale(path)
        return owner == self._pid or _pid_alive(owner)

    def release(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.claims / key).unlink()

    def close(self) -> None:
        """Remove this run's claims (and everything, for a throw-away cache)."""
        if self.persistent:
            shutil.rmtree(self.claims, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.claims.parent.rmdir()
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def take_warnings(self) -> list[str]:
        """The warnings collected so far (each once), for the main thread to issue."""
        with self._warn_lock:
            taken = list(self.warnings)
            self.warnings.clear()
        return taken

    def _warn(self, key: str, message: str) -> None:
        # Collected, not warned: this runs on the engine's thread, and the
        # plugin re-issues them on the main thread where pytest records them.
        with self._warn_lock:
            if key not in self._warned:
                self._warned.add(key)
                self.warnings.append(message)
