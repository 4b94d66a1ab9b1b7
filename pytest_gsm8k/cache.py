"""On-disk response cache with cross-process claims.

One small JSON file per request, named by the sha256 of everything that
determines the answer (base URL, model, full request body, sample index), so
a different model or protocol can never hit another's entries. Files are
written to a temporary name and renamed, so a run killed at any point
(SIGKILL included) leaves only complete entries behind: that is the resume.

Claims make xdist workers share the work: before sending a request a
process creates ``claims/<run>/<key>`` with O_EXCL; whoever wins sends it,
the others wait for the entry to appear. Claims live in a per-run folder, so
a crashed earlier run can never block a new one; within a run a claim whose
process died is taken over.

Entries never hold the API key: only the request body and the response.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
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


class ResponseCache:
    """Response store under ``root``; ``persistent=False`` deletes it at :meth:`close`."""

    def __init__(self, root: Path, run_id: str, *, persistent: bool = True) -> None:
        self.root = root
        self.entries = root / "responses"
        self.claims = root / "claims" / run_id
        self.run_id = run_id
        self.persistent = persistent
        self._warned: set[str] = set()
        self.warnings: list[str] = []
        self.entries.mkdir(parents=True, exist_ok=True)
        self.claims.mkdir(parents=True, exist_ok=True)
        self._made_dirs: set[str] = set()

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
            if not isinstance(data, dict) or data.get("v") != SCHEMA or "response" not in data:
                raise ValueError("unexpected layout")
            response = data["response"]
            if not isinstance(response, dict) or not isinstance(response.get("completions"), list):
                raise ValueError("no completions")
        except ValueError as exc:
            self._warn(key, f"gsm8k cache: corrupt entry {path} ({exc}); it will be re-requested")
            return None
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
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, ensure_ascii=False, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def claim(self, key: str) -> bool:
        """True when this process now owns ``key``; False while another live process does."""
        path = self.claims / key
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    owner = int(path.read_text() or "0")
                except (OSError, ValueError):
                    return False  # being written right now: treat as taken
                if owner == os.getpid():
                    return True
                if owner and _pid_alive(owner):
                    return False
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # owner died mid-request: take it over
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(str(os.getpid()))
            return True
        return False

    def claim_owner_alive(self, key: str) -> bool:
        """Whether somebody still holds a claim on ``key`` (a waiter gives up otherwise)."""
        path = self.claims / key
        try:
            owner = int(path.read_text() or "0")
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            return True
        return owner == os.getpid() or _pid_alive(owner)

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

    def _warn(self, key: str, message: str) -> None:
        # Collected, not warned: this runs on the engine's thread, and the
        # plugin re-issues them on the main thread where pytest records them.
        if key not in self._warned:
            self._warned.add(key)
            self.warnings.append(message)
