"""Shared fixtures: GSM8K files unpacked from the embedded copy and a real loopback
OpenAI-compatible server.

Tests never monkeypatch the openai client: the plugin talks HTTP to
:class:`fakeserver.FakeOpenAIServer`, whose answers, latency and faults are
scripted per problem index.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import pkgutil
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from browser import Browser
from fakeserver import FakeOpenAIServer
from gsm8k_copy import data_dir
from helpers import NO_EXTRA_PLUGINS, TEST_KEY, GsmRun, output, read_json

import pytest_gsm8k


@pytest.fixture(scope="session")
def _warm_imports() -> None:
    """Import, once per process, what every inner run would otherwise import again.

    pytester's in-process runs drop the modules first imported inside them: the plugin's
    lazily imported modules and openai were imported (and assertion-rewritten) anew in
    each run. httpx needs it for correctness too: it imports httpcore on the first
    connection and caches its exception classes, so a dropped httpcore made a later run's
    refused connection escape as a raw ``ConnectError``. (datasets, which cannot be
    imported twice, is imported by ``hub_folder``, the one inner run's that reads through
    it: 1.2 CPU-s a process that no other test needs.)
    """
    import openai

    for info in pkgutil.walk_packages(pytest_gsm8k.__path__, "pytest_gsm8k."):
        importlib.import_module(info.name)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with contextlib.suppress(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=2).models.list()

    async def connect() -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=2)
        with contextlib.suppress(openai.APIConnectionError):
            await client.models.list()
        await client.close()

    asyncio.run(connect())


@pytest.fixture
def pytester(_warm_imports: None, pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester, after :func:`_warm_imports` (a session fixture: set up before pytester
    takes its snapshot of ``sys.modules``)."""
    return pytester


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests (marked ``slow``: the real local model, a wheel in a fresh
    virtualenv) start first: under ``-n`` (``--dist=worksteal``, pyproject.toml) a worker
    that ends on one of them leaves the other idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _terminal_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs lay out their output for 80 columns wherever the suite runs.

    Without it the width comes from the outer terminal or ``COLUMNS``: a CI runner with a
    wide ``COLUMNS`` showed whole error lines in the short test summary that an 80-column
    run truncates, and a test counting a message saw it twice.
    """
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(scope="session")
def gsm8k_data() -> Path:
    """A folder with test.jsonl, train.jsonl and test_socratic.jsonl, unpacked from the
    embedded copy (the layout of openai/grade-school-math), for tests of file loading."""
    return data_dir()


@pytest.fixture
def server(gsm8k_data: Path) -> Iterator[FakeOpenAIServer]:
    """A fresh scripted server (all answers correct), model 'fake-model', key TEST_KEY."""
    srv = FakeOpenAIServer(gsm8k_data / "test.jsonl", model="fake-model", api_key=TEST_KEY)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def gsm8k_args(server: FakeOpenAIServer) -> list[str]:
    """Command-line options pointing the plugin at ``server`` (the data: the embedded copy)."""
    return [
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        *NO_EXTRA_PLUGINS,
    ]


@pytest.fixture
def keyed_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """Put the test key in OPENAI_API_KEY (the plugin reads keys from the environment only)."""
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return TEST_KEY


@pytest.fixture
def xdist() -> list[str]:
    """No xdist: the inner runs are plain unless a test is parametrized with ``@XDIST``
    (helpers.py), whose ``-n 2`` replaces this value for ``gsm8k_run`` too."""
    return []


@pytest.fixture
def gsm8k_run(
    pytester: pytest.Pytester, gsm8k_args: list[str], keyed_env: str, xdist: list[str]
) -> GsmRun:
    """Run pytest in ``pytester``'s folder against ``server``, the set-up every plugin test
    repeats in one place: returns the run and its parsed JSON report.

    ``args`` come after ``gsm8k_args`` (model, base URL, ``NO_EXTRA_PLUGINS``), or after
    ``NO_EXTRA_PLUGINS`` alone with ``model=False``; then ``--gsm8k-report=<report>`` unless
    an argument names a report already, then the test's ``@XDIST`` parameter (``-n 2`` or
    nothing; ``xdist=`` overrides it, e.g. ``xdist=()`` for a plain run inside an ``@XDIST``
    test, and in a fixture that records a set-up run: a fixture's call takes the parameter
    of the test it serves). The exit code must be ``ret`` (None: not checked), with the
    run's output as the message; ``report`` is read back (it must exist), or None is
    returned with ``report=None``.
    """
    param_xdist = xdist

    def run(
        *args: str,
        ret: int | None = 0,
        report: str | None = "r.json",
        model: bool = True,
        xdist: Sequence[str] | None = None,
    ) -> tuple[pytest.RunResult, dict[str, Any] | None]:
        words = [*(gsm8k_args if model else NO_EXTRA_PLUGINS), *args]
        if report is not None and not any(w.startswith("--gsm8k-report") for w in args):
            words.append(f"--gsm8k-report={report}")
        words += param_xdist if xdist is None else xdist
        result = pytester.runpytest(*words)
        if ret is not None:
            assert result.ret == ret, output(result)
        return result, None if report is None else read_json(pytester.path / report)

    return cast(GsmRun, run)


@pytest.fixture(scope="session")
def hub_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out like the openai/gsm8k hub repository, made from the embedded copy.

    Built in a temp dir for the ``datasets`` code path; the project never commits data.
    datasets is imported here, before any pytester snapshot of ``sys.modules`` (a session
    fixture is set up before the test's pytester): it registers pyarrow extension types at
    import, so an import inside an inner run, dropped after it, would fail the next time.
    """
    import datasets  # noqa: F401
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("hub") / "gsm8k"
    (root / "main").mkdir(parents=True)
    gsm8k_data = data_dir()
    for split in ("test", "train"):
        rows = [
            json.loads(line)
            for line in (gsm8k_data / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        table = pa.table(
            {"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]}
        )
        pq.write_table(table, root / "main" / f"{split}-00000-of-00001.parquet")
    # The dataset card's configs, as on the hub: load_dataset(root, "main") reads them.
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n"
        "  - split: train\n    path: main/train-*\n  - split: test\n    path: main/test-*\n"
        "---\n",
        encoding="utf-8",
    )
    return root


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep ``datasets``' arrow cache out of the user's home."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    return tmp_path / "hf"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """Headless Chromium with a fresh profile (tests using it are marked NEEDS_CHROMIUM)."""
    b = Browser(tmp_path / "chromium-profile", height=1500)
    try:
        yield b
    finally:
        b.close()
