"""The response cache on its own: keys, atomic entries, corruption, special files.

End-to-end cache behaviour (resume after SIGKILL, reruns, corrupted entries
in a real run, the headline's cache count) is in tests/plugin/test_engine_runs.py and
test_cache_runs.py; these tests pin the pieces those runs rely on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import response_cache

from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime import engine as engine_module
from pytest_gsm8k.runtime.cache import ResponseCache, cache_key
from pytest_gsm8k.runtime.engine import Engine

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "q"}],
    "temperature": 0.0,
    "max_tokens": 1024,
}
RESPONSE = {
    "completions": [{"text": "#### 4", "finish_reason": "stop", "reasoning": None}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    "model": "m",
}


def make(tmp_path: Path, run: str = "run1", persistent: bool = True) -> ResponseCache:
    return response_cache(tmp_path / "cache", run, persistent=persistent)


def entry_files(root: Path) -> list[Path]:
    return sorted((root / "responses").glob("*/*.json"))


# -- keys -----------------------------------------------------------------------------


def test_key_names_everything_that_decides_the_answer() -> None:
    base = cache_key("http://a/v1", BODY, "0", None, 0)
    variants = [
        cache_key("http://b/v1", BODY, "0", None, 0),  # another endpoint
        cache_key("http://a/v1", {**BODY, "model": "m2"}, "0", None, 0),  # another model
        cache_key("http://a/v1", {**BODY, "max_tokens": 512}, "0", None, 0),
        cache_key("http://a/v1", {**BODY, "temperature": 0.7}, "0", None, 0),
        cache_key("http://a/v1", {**BODY, "stop": ["Question:"]}, "0", None, 0),
        cache_key("http://a/v1", {**BODY, "n": 4}, "0", None, 0),
        cache_key("http://a/v1", {**BODY, "seed": 1}, "0", None, 0),
        cache_key(
            "http://a/v1", {**BODY, "messages": [{"role": "user", "content": "q2"}]}, "0", None, 0
        ),
        cache_key("http://a/v1", BODY, "1", None, 0),  # another sample index
    ]
    assert len({base, *variants}) == len(variants) + 1
    # ... and nothing else: the same request in another dict order is the same key
    assert cache_key("http://a/v1", dict(reversed(list(BODY.items()))), "0", None, 0) == base


def test_request_body_is_what_the_key_hashes() -> None:
    chat = Request(problem_id="test-0001", api="chat", messages=(("user", "q"),))
    text = Request(problem_id="test-0001", api="completions", prompt="q")
    assert chat.body("m") == BODY
    assert cache_key("u", chat.body("m"), "0", None, 0) != cache_key(
        "u", text.body("m"), "0", None, 0
    )
    # the problem id is not part of the body: it names the item, not the request
    other = Request(problem_id="test-0002", api="chat", messages=(("user", "q"),))
    assert other.body("m") == chat.body("m")


# -- entries --------------------------------------------------------------------------


def test_put_get_roundtrip_and_layout(tmp_path: Path) -> None:
    cache = make(tmp_path)
    key = cache_key("u", BODY, "0", None, 0)
    assert cache.get(key, BODY) is None
    assert not (tmp_path / "cache").exists()  # nothing is created before the first write
    cache.put(key, BODY, RESPONSE)
    got = cache.get(key, BODY)
    assert got is not None
    assert got["completions"] == RESPONSE["completions"]
    assert got["_run"] == "run1"
    [path] = entry_files(tmp_path / "cache")
    assert path.name == f"{key}.json"
    assert path.parent.name == key[:2]
    data = json.loads(path.read_text())
    assert data["request"] == BODY
    assert data["key"] == key
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_background_writes_run_done_after_the_entry_is_on_disk(tmp_path: Path) -> None:
    cache = make(tmp_path)
    seen: list[bool] = []

    def done(key: str) -> Callable[[], None]:
        return lambda: seen.append(cache.get(key, BODY) is not None)

    keys = [cache_key("u", {**BODY, "seed": i}, "0", None, 0) for i in range(50)]
    for key in keys:
        cache.submit([(key, BODY, RESPONSE, None)], done=done(key))
    both = threading.Event()
    cache.submit(
        [
            (cache_key("u", BODY, "1", None, 0), BODY, RESPONSE, None),
            (cache_key("u", BODY, "2", None, 0), BODY, RESPONSE, None),
        ],
        done=both.set,
    )
    assert both.wait(10)
    assert cache.flush()
    assert seen == [True] * 50
    assert cache.get(cache_key("u", BODY, "1", None, 0), BODY)
    assert cache.get(cache_key("u", BODY, "2", None, 0), BODY)
    assert len(entry_files(tmp_path / "cache")) == 52
    cache.close()


def test_failed_write_is_a_warning_and_still_calls_done(tmp_path: Path) -> None:
    cache = make(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "responses").write_text("a file where the folder should be")
    done = threading.Event()
    cache.submit([(cache_key("u", BODY, "0", None, 0), BODY, RESPONSE, None)], done=done.set)
    assert done.wait(10)
    [warning] = cache.take_warnings()
    assert "cannot write" in warning
    assert "not cached" in warning
    assert cache.take_warnings() == []


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], id="truncated"),
        pytest.param(lambda raw: b"", id="empty"),
        pytest.param(lambda raw: b"\xff\xfe not json", id="garbage"),
        pytest.param(
            lambda raw: json.dumps({"v": 1, "response": {"completions": []}}).encode(),
            id="no-completions",
        ),
        pytest.param(
            lambda raw: json.dumps({"v": 99, "response": RESPONSE}).encode(), id="other-schema"
        ),
        pytest.param(
            lambda raw: json.dumps({"v": 1, "response": {"completions": [{"text": 4}]}}).encode(),
            id="bad-text",
        ),
    ],
)
def test_corrupt_entry_is_ignored_with_one_warning(tmp_path: Path, damage: Any) -> None:
    cache = make(tmp_path)
    key = cache_key("u", BODY, "0", None, 0)
    cache.put(key, BODY, RESPONSE)
    [path] = entry_files(tmp_path / "cache")
    path.write_bytes(damage(path.read_bytes()))
    assert cache.get(key, BODY) is None
    assert cache.get(key, BODY) is None
    [warning] = cache.take_warnings()
    assert "corrupt entry" in warning
    assert "re-requested" in warning
    assert str(path) in warning
    cache.put(key, BODY, RESPONSE)  # the re-requested answer replaces it
    assert cache.get(key, BODY) is not None


def test_a_corrupt_entry_is_named_not_quoted(tmp_path: Path) -> None:
    """User-supplied text is never printed unbounded: an entry that is not UTF-8 gets a
    one-line warning naming it, not its bytes (a decode error's repr holds all of them)."""
    cache = make(tmp_path)
    key = cache_key("u", BODY, "0", None, 0)
    cache.put(key, BODY, RESPONSE)
    [path] = entry_files(tmp_path / "cache")
    path.write_bytes(b'{"v": 1, "response": "' + b"\xc3" * 100_000 + b'"}')
    assert cache.get(key, BODY) is None
    [warning] = cache.take_warnings()
    assert "corrupt entry" in warning
    assert str(path) in warning
    assert len(warning) < len(str(path)) + 300, warning[:400]


def test_throwaway_cache_is_removed_persistent_one_keeps_entries(tmp_path: Path) -> None:
    keep = response_cache(tmp_path / "keep", "r", persistent=True)
    drop = response_cache(tmp_path / "drop", "r", persistent=False)
    for cache in (keep, drop):
        key = cache_key("u", BODY, "0", None, 0)
        cache.submit([(key, BODY, RESPONSE, None)])
        cache.close()
    assert not (tmp_path / "drop").exists()
    assert len(entry_files(tmp_path / "keep")) == 1
    assert response_cache(tmp_path / "keep", "r2", resume=True).get(
        cache_key("u", BODY, "0", None, 0), BODY
    )


# -- whose entries are read: a verdict rests on answers this run received --------------------


def test_rule1_another_runs_entries_are_read_only_with_resume(tmp_path: Path) -> None:
    """Rule 1: by default a cache hands out this run's own entries only (another xdist
    worker's answer); an earlier run's are read only when the user resumes."""
    key = cache_key("u", BODY, "0", None, 0)
    earlier = make(tmp_path, "earlier")
    earlier.put(key, BODY, RESPONSE)
    assert earlier.get(key, BODY) is not None  # its own entry
    earlier.close()
    assert make(tmp_path, "now").get(key, BODY) is None
    hit = response_cache(tmp_path / "cache", "now", resume=True).get(key, BODY)
    assert hit is not None
    assert hit["_run"] == "earlier"
    assert not (tmp_path / "cache" / "runs" / "earlier.lock").exists()  # removed when done


def test_rule1_a_run_still_going_is_never_read_even_with_resume(tmp_path: Path) -> None:
    """Rule 1: a run holds its lock from its first entry until it closes; a resume reads
    none of its entries meanwhile (one warning), and all of them once it has ended."""
    key = cache_key("u", BODY, "0", None, 0)
    going = make(tmp_path, "going")
    going.put(key, BODY, RESPONSE)
    reader = response_cache(tmp_path / "cache", "now", resume=True)
    assert reader.get(key, BODY) is None
    assert reader.get(key, BODY) is None
    [warning] = reader.take_warnings()
    assert "another run that is still going" in warning
    going.close()
    assert response_cache(tmp_path / "cache", "later", resume=True).get(key, BODY) is not None


def test_rule1_a_resume_reads_only_runs_that_ended_before_it_started(tmp_path: Path) -> None:
    """Rule 1: a resumed run that started first read the answers of a run that started
    after it and ended first (its lock released). A resume reads only the runs that had
    ended before it started: not a run going when it started, even once that run has
    ended, nor an entry another run wrote after it started; its own entries it reads."""
    first, second, own = (cache_key("u", BODY, str(i), None, 0) for i in range(3))
    overlapping = make(tmp_path, "overlapping")
    overlapping.put(first, BODY, RESPONSE)  # written before the resumed run started
    resumed = response_cache(tmp_path / "cache", "resumed", resume=True)
    overlapping.close()
    later = make(tmp_path, "later")
    later.put(second, BODY, RESPONSE)
    later.close()
    os.utime(resumed._entry_text(second), (resumed.started + 1, resumed.started + 1))
    resumed.put(own, BODY, RESPONSE)
    assert resumed.get(first, BODY) is None
    assert resumed.get(second, BODY) is None
    assert resumed.get(own, BODY) is not None
    assert len(resumed.take_warnings()) == 2
    # a run that starts after both ended reads them
    fresh = response_cache(tmp_path / "cache", "fresh", resume=True, started=resumed.started + 2)
    assert fresh.get(first, BODY) is not None
    assert fresh.get(second, BODY) is not None
    resumed.close()


def test_rule1_a_killed_runs_entries_can_be_resumed(tmp_path: Path) -> None:
    """Rule 1: the lock goes with the process however it ends: a run killed with SIGKILL
    (it never closed its cache) leaves entries a resume reads."""
    key = cache_key("u", BODY, "0", None, 0)
    code = (
        "import json, os, signal, sys\n"
        "from pathlib import Path\n"
        "from pytest_gsm8k.runtime.cache import ResponseCache\n"
        "key, body, response = json.loads(sys.argv[2])\n"
        "kept = dict(persistent=True, resume=False, started=0)\n"
        "ResponseCache(Path(sys.argv[1]), 'killed', **kept).put(key, body, response)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-c", code, str(root), json.dumps([key, BODY, RESPONSE])],
        check=False,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL
    assert (root / "runs" / "killed.lock").exists()  # left behind, but no longer held
    hit = response_cache(root, "now", resume=True).get(key, BODY)
    assert hit is not None
    assert hit["_run"] == "killed"


# -- entries that do not belong where they are found -------------------------------------


def test_get_uses_an_entry_only_under_its_own_key_and_request(tmp_path: Path) -> None:
    cache = make(tmp_path)
    key, other = cache_key("u", BODY, "0", None, 0), cache_key("u", BODY, "1", None, 0)
    cache.put(key, BODY, RESPONSE)
    assert cache.get(key, BODY) is not None
    assert cache.get(key, {**BODY, "max_tokens": 7}) is None  # another request
    [path] = entry_files(tmp_path / "cache")
    moved = path.parent.parent / other[:2] / f"{other}.json"
    moved.parent.mkdir(exist_ok=True)
    moved.write_bytes(path.read_bytes())
    assert cache.get(other, BODY) is None  # filed under another key
    data = json.loads(path.read_text())
    del data["key"]
    path.write_text(json.dumps(data))
    assert cache.get(key, BODY) is None  # no key: nothing says which request it answers
    [warning] = cache.take_warnings()
    assert "filed under another request" in warning


# -- hung reads -----------------------------------------------------------------------------


def test_a_hung_read_is_given_up_after_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung network file system blocks the reading thread, never the engine's loop: after
    the bound the entry counts as missing, and the cache is not read again this run."""
    release = threading.Event()

    class HungCache(ResponseCache):
        def get(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
            release.wait(30)  # what a read on a hung NFS mount does
            return None

    class Client:
        endpoint, model, persistent_cache = "scripted:", "m", True
        sent = 0

        async def complete(self, request: Request) -> ModelResponse:
            self.sent += 1
            return ModelResponse(completions=[Completion(text="#### 4")])

        async def aclose(self) -> None:
            pass

    cache = HungCache(tmp_path / "cache", "run", persistent=True, resume=False, started=0)
    client = Client()
    monkeypatch.setattr(engine_module, "READ_SECONDS", 0.2)
    engine = Engine(client, cache, concurrency=2)
    planned = [
        Request(problem_id=f"p{i}", api="chat", messages=(("user", f"q{i}"),)) for i in range(4)
    ]
    try:
        engine.start(planned)
        assert [engine.result(r).completions[0].text for r in planned] == ["#### 4"] * 4
        assert client.sent == 4
        [warning] = engine.take_warnings()
        assert "not read for the rest of the run" in warning
    finally:
        release.set()
        engine.close()
