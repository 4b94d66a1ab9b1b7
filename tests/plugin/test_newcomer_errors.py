"""What a newcomer's first mistakes print: one line that says what to do, once, and never a
green exit for a run that measured nothing.

A user's test that needs a model when none is given, gate options with no model, a base
URL without ``/v1``, a run in which no problem got an answer, and path options written
with a space (``--gsm8k-report /abs/r.json``), which pytest reads before the plugin is
loaded.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, XDIST, GsmRun, output, read_json, sent, xdist_once

USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)

USER_TEST = """
def test_math(gsm8k_outcome):
    assert gsm8k_outcome.outcome in ("correct", "wrong", "unparsed", "truncated")
"""


def schema() -> dict[str, Any]:
    text = resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "gsm8k: no model given" in line]


@XDIST
def test_a_users_test_without_a_model_is_one_line_once(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    pytester.makepyfile(test_mine=USER_TEST)
    result = pytester.runpytest(*NO_EXTRA_PLUGINS, *xdist)
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = error_lines(text)
    assert len(lines) == 1, text
    assert lines[0].startswith("ERROR: gsm8k: no model given: test_mine.py::test_math[test-0000]")
    assert "and 1318 more use the gsm8k_model fixture" in lines[0]
    assert "--gsm8k-model=ID" in lines[0]
    assert "override gsm8k_model" in lines[0]
    for noise in ("Traceback", "UsageError", "INTERNALERROR", "passed", "failed"):
        assert noise not in text, text
    assert text.count("gsm8k_model fixture") == 1, text


def test_a_users_test_without_a_model_names_it_bounded(pytester: pytest.Pytester) -> None:
    """The test named in the line is user text: a long parametrize id is cut, never printed
    whole (and the line stays one line)."""
    long_id = "x" * 3000
    pytester.makepyfile(
        test_mine=f"""
import pytest

@pytest.mark.parametrize("v", [1], ids=["{long_id}"])
def test_math(v, gsm8k_outcome):
    pass
"""
    )
    result = pytester.runpytest(*NO_EXTRA_PLUGINS)
    text = output(result)
    lines = error_lines(text)
    assert result.ret == USAGE_ERROR, text
    assert len(lines) == 1, text
    assert lines[0].startswith("ERROR: gsm8k: no model given: test_mine.py::test_math["), text
    assert long_id not in text
    assert len(lines[0]) < 600, len(lines[0])
    assert "--gsm8k-model=ID" in lines[0]


def test_a_users_test_with_its_own_model_needs_no_option(pytester: pytest.Pytester) -> None:
    """(Under -n 2: test_inert.py's user's own test with no option.)"""
    pytester.makepyfile(
        test_mine=USER_TEST
        + """
import pytest

@pytest.fixture(scope="session")
def gsm8k_model():
    return lambda request: "#### 0"
"""
    )
    result = pytester.runpytest("--gsm8k-limit=3", *NO_EXTRA_PLUGINS)
    text = output(result)
    assert result.ret == 0, text
    assert not error_lines(text), text


@XDIST
def test_gate_options_without_a_model_are_a_usage_error_not_a_green_run(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    # no gsm8k option: the plugin stays out of the way (plain; under -n 2: test_inert.py)
    plain = pytester.runpytest(*NO_EXTRA_PLUGINS)
    assert plain.ret == 0, output(plain)
    result = pytester.runpytest("--gsm8k-min-acc", "0.9", *NO_EXTRA_PLUGINS, *xdist)
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = error_lines(text)
    assert len(lines) == 1, text
    assert "nothing was measured or gated (--gsm8k-min-acc given)" in lines[0], text
    assert "--gsm8k-model=ID" in lines[0], text
    assert "--gsm8k-serve CMD" in lines[0], text
    assert "gsm8k_outcome" in lines[0], text
    listed = pytester.runpytest("--co", "--gsm8k-min-acc=0.9", *NO_EXTRA_PLUGINS, *xdist)
    assert listed.ret == 0, output(listed)  # listing asks for no model


def test_gate_options_in_an_empty_folder_say_why_nothing_ran(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gsm8k-report", "r.json", *NO_EXTRA_PLUGINS)
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    assert len(error_lines(text)) == 1, text
    assert "(--gsm8k-report given)" in text


# -- a base URL without /v1 ------------------------------------------------------------


@XDIST
def test_a_base_url_without_v1_is_named_with_the_url_to_use(
    pytester: pytest.Pytester, server: FakeOpenAIServer, keyed_env: str, xdist: list[str]
) -> None:
    server.set_script(Script(v1_only=True))
    bare = server.base_url.removesuffix("/v1")
    result = pytester.runpytest(
        "--gsm8k-model=fake-model", f"--gsm8k-base-url={bare}", *NO_EXTRA_PLUGINS, *xdist
    )
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = [line for line in text.splitlines() if line.startswith("ERROR: gsm8k:")]
    assert lines == [
        f"ERROR: gsm8k: GET {bare}/models answered 404 and {server.base_url}/models answers: "
        f"the base URL needs /v1 (--gsm8k-base-url={server.base_url})"
    ], text
    assert "gsm8k acc" not in text


def test_a_rejected_key_is_one_line_at_session_start(
    pytester: pytest.Pytester, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: a 401 to the session-start GET /models is one line naming the variable the key
    is read from, before any request (the preflight's refusals are keyed by the status)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-the-servers-key")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    url = f"--gsm8k-base-url={server.base_url}"
    result = pytester.runpytest("--gsm8k-model=fake-model", url, *NO_EXTRA_PLUGINS)
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = [line for line in text.splitlines() if line.startswith("ERROR: gsm8k:")]
    assert lines == [
        f"ERROR: gsm8k: {server.base_url} rejected the API key (HTTP 401); "
        "set it in $OPENAI_API_KEY"
    ], text
    assert "sk-not-the-servers-key" not in text
    assert sent(server) == 0


@xdist_once("where", ["option", "env", "env-vllm"], ids=["option", "env", "env-vllm"])
def test_a_base_url_with_a_bad_port_is_one_line_naming_where_it_came_from(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: list[str], where: str
) -> None:
    """A port out of range used to be an INTERNALERROR wall from the session-start check.
    The line names the option or the variable, never the URL (it may carry a secret)."""
    url = "http://user:s3cret@127.0.0.1:99999/v1"
    args = ["--gsm8k-model=m", "--gsm8k-limit=2", *NO_EXTRA_PLUGINS, *xdist]
    if where == "option":
        args.append(f"--gsm8k-base-url={url}")
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", url)
    if where == "env-vllm":
        args.append("--gsm8k-preset=vllm")
    result = pytester.runpytest_subprocess(*args)
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    source = "--gsm8k-base-url" if where == "option" else "$OPENAI_BASE_URL"
    lines = [line for line in text.splitlines() if "gsm8k" in line and "ERROR" in line]
    assert lines == [f"ERROR: gsm8k: {source}: Port out of range 0-65535"], text
    for noise in ("Traceback", "INTERNALERROR", "s3cret"):
        assert noise not in text, text


@XDIST
def test_a_request_404_names_the_url_and_the_run_prints_no_accuracy(
    pytester: pytest.Pytester, server: FakeOpenAIServer, keyed_env: str, xdist: list[str]
) -> None:
    """(Its -n 2 run is also the one of a run with no answers, the test below.)"""
    # No /models under this URL nor under its /v1: the session start cannot tell, the first
    # request's 404 does, once for every item.
    server.set_script(Script(v1_only=True))
    base = server.base_url.removesuffix("/v1") + "/api"
    result = pytester.runpytest(
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={base}",
        "--gsm8k-limit=3",
        "--gsm8k-report=r.json",
        "--gsm8k-min-acc=0.5",
        *NO_EXTRA_PLUGINS,
        *xdist,
    )
    text = output(result)
    assert result.ret == 1, text
    stopped = [line for line in text.splitlines() if line.startswith("gsm8k: run stopped:")]
    assert stopped == [
        f"gsm8k: run stopped: POST {base}/chat/completions answered 404 "
        f"(the base URL {base} does not end in /v1: try --gsm8k-base-url={base}/v1): Not Found"
    ], text
    _no_accuracy(pytester, text, 3)


def _no_accuracy(pytester: pytest.Pytester, text: str, n: int) -> None:
    """A run in which no problem got an answer prints and reports no accuracy."""
    assert f"gsm8k acc (test@1, 0-shot CoT): no answers: {n} errors  n={n}" in text, text
    assert not re.search(r"gsm8k acc .*= 0\.0000", text), text
    assert "by extractor" not in text, text
    data = read_json(pytester.path / "r.json")
    assert data["accuracy"] is None
    assert data["ci95"] is None
    assert data["counts"]["error"] == n
    jsonschema.Draft202012Validator(schema()).validate(data)


def test_a_run_with_no_answers_prints_no_accuracy(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """(Under -n 2: the run of the request 404 above, which has no answer either.)"""
    server.set_script(Script(default="nochoices"))
    result, _ = gsm8k_run(
        "--gsm8k-limit=4", "--gsm8k-report=r.json", "--gsm8k-min-acc=0.5", ret=1, report=None
    )
    _no_accuracy(pytester, output(result), 4)


# -- path options written with a space ---------------------------------------------------


def _project(pytester: pytest.Pytester) -> None:
    """A repository with a pytest.ini (testpaths holding one ordinary test, addopts) and a
    test outside testpaths that fails when collected."""
    pytester.makeini("[pytest]\ntestpaths = tests\naddopts = -rA\n")
    tests = pytester.mkdir("tests")
    (tests / "test_unit.py").write_text("def test_unit():\n    pass\n", encoding="utf-8")
    other = pytester.mkdir("other")
    (other / "test_other.py").write_text("def test_other():\n    assert False\n", "utf-8")


def _seen(result: pytest.RunResult) -> tuple[str, str, str]:
    """(rootdir line, the count of items, the baseline gate) of a run's output."""
    text = output(result)
    rootdir = next(line for line in text.splitlines() if line.startswith("rootdir:"))
    collected = re.search(r"(?:collected |workers \[)(\d+) items", text)
    gate = re.search(r"gate baseline: (\w+)", text)
    assert collected is not None, text
    assert gate is not None, text
    return rootdir.split(",")[0], collected.group(1), gate.group(1)


def test_path_options_written_with_a_space_warn_and_the_equals_form_keeps_the_rootdir(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    gsm8k_run: GsmRun,
    gsm8k_data: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """pytest picks the rootdir before it knows the plugin's options, so an existing value
    written with a space is a test path to it (pytest-dev/pytest#8846) and no public API can
    undo that: ``--gsm8k-x=PATH`` (README) keeps the project's rootdir, ini and baseline, and
    the spaced form says so in one line (rule: no silent change of what the run reads),
    plain and under -n 2 (one set-up and one joined run for both: they are plain either way)."""
    _project(pytester)
    out = tmp_path_factory.mktemp("outside")
    report = out / "r.json"
    data = gsm8k_data  # a folder outside the project, as the report's
    # 7 problems: the fewest a single-run baseline gate can fail on at alpha 0.01 (rule 2)
    args = ["--gsm8k-limit=7"]
    gsm8k_run(  # the set-up: plain (what crosses processes is the warning)
        *args, f"--gsm8k-data={data}", f"--gsm8k-report={report}", "--snapshot-update", report=None
    )
    assert report.exists()
    assert data.exists()
    joined = pytester.runpytest(  # plain: the rootdir, ini and baseline are the controller's
        *gsm8k_args,
        *args,
        f"--gsm8k-data={data}",
        f"--gsm8k-report={report}",
        "--gsm8k-require-baseline",
    )
    assert joined.ret == 0, output(joined)
    assert _seen(joined) == (f"rootdir: {pytester.path}", "8", "PASS")
    assert "PASSED tests/test_unit.py::test_unit" in output(joined), output(joined)  # addopts
    assert read_json(report)["n"] == 7
    assert "written with a space" not in output(joined)
    for xdist in ([], ["-n", "2"]):
        spaced = pytester.runpytest(
            *gsm8k_args, *xdist, *args, "--gsm8k-data", str(data), "--gsm8k-report", str(report)
        )
        warned = [line for line in output(spaced).splitlines() if "written with a space" in line]
        assert len(warned) == 1, (xdist, output(spaced))
        assert "gsm8k: --gsm8k-data, --gsm8k-report written with a space" in warned[0]
        assert "write --gsm8k-data=PATH" in warned[0], warned[0]


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--gsm8k-dataset=someone/gsm8k-variant"], "--gsm8k-dataset someone/gsm8k-variant"),
        (["--gsm8k-data=rows.parquet"], "reading parquet"),
    ],
    ids=["hub", "parquet"],
)
def test_a_hub_dataset_without_the_hub_extra_names_the_extra_in_one_line(
    pytester: pytest.Pytester, args: list[str], what: str
) -> None:
    """``datasets`` is in the ``hub`` extra, not a dependency (pyarrow and pandas, some 250 MB
    no embedded-copy run uses): where it is missing, the run that needs it says which extra
    and the pip command for this install, once, before anything is sent."""
    # a module that shadows the installed package, as a machine without it would see it
    pytester.makepyfile(datasets="raise ImportError('No module named datasets')")
    pytester.path.joinpath("rows.parquet").write_bytes(b"PAR1")
    result = pytester.runpytest_subprocess(
        *NO_EXTRA_PLUGINS, "--gsm8k-model=m", "--gsm8k-base-url=http://127.0.0.1:9/v1", *args
    )
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = [line for line in text.splitlines() if "'hub' extra" in line]
    assert len(lines) == 1, text
    assert f"{what} needs the 'datasets' package, in the 'hub' extra: pip install" in lines[0]
    assert "pytest-gsm8k[hub]" in lines[0] or "[hub]'" in lines[0], lines[0]
    assert "Traceback" not in text, text


@XDIST
def test_the_gate_selected_with_no_model_is_one_line_naming_the_option(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    """``pytest -m gsm8k`` with no model: the GSM8K items exist only with a model, so pytest
    saw nothing to select ("4 deselected", exit 5) and said nothing of why. One line naming
    --gsm8k-model and the ini key; ``-m "not gsm8k"`` (the rest of the suite) is untouched."""
    pytester.makepyfile(test_mine="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    result = pytester.runpytest(*NO_EXTRA_PLUGINS, *xdist, "-m", "gsm8k")
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = error_lines(text)
    assert len(lines) == 1, text
    assert "-m 'gsm8k' selects the GSM8K items" in lines[0]
    assert "--gsm8k-model=ID" in lines[0]
    assert "gsm8k_model in the ini" in lines[0]
    assert "Traceback" not in text, text
    rest = pytester.runpytest(*NO_EXTRA_PLUGINS, *xdist, "-m", "not gsm8k")
    assert rest.ret == 0, output(rest)
    rest.assert_outcomes(passed=2)
    # plain: which expressions select the gate is decided in one place (the -n 2 run above
    # shows a non-selecting one passes under xdist; the table: the test below)
    both = pytester.runpytest(*NO_EXTRA_PLUGINS, "-m", "gsm8k or not gsm8k")
    assert both.ret == 0, output(both)


@pytest.mark.parametrize(
    ("markexpr", "selects"),
    [
        ("gsm8k", True),
        ("gsm8k and not slow", True),
        ("(gsm8k or smoke) and not slow", True),
        ("not gsm8k", False),
        ("gsm8k or not gsm8k", False),
        ("smoke", False),
        ("", False),
        ("gsm8k(x=1)", False),
        ("gsm8k and", False),
    ],
)
def test_which_mark_expressions_ask_for_the_gate(markexpr: str, selects: bool) -> None:
    from pytest_gsm8k.fixtures import selects_gsm8k

    assert selects_gsm8k(markexpr) is selects
