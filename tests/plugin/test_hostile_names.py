"""Names from outside are escaped wherever they are shown, as the model's own text is.

Rule (issue 31, case 18): a name the run did not make itself (a config's file name, the
``--gsm8k-model`` name, the protocol label a ``--gsm8k-param`` key is part of, the model id a
server lists or reports in its replies) reaches no output with a raw control character
(ESC, CR, NUL), a newline or an invisible character that reorders text (U+202E): not the
terminal (no forged ``gate ... PASS`` line, no forged "2 of 2 pass"), not JUnit (a test
case's name and message are one line), not the JSON report's display strings (headline,
gate names and details), not Markdown (no table cell broken by ``|``, no ``<script>``), not
the HTML page. Every such name goes through ``core.scrub.printable`` (Markdown: ``md_text``
/ ``md_code``, which call it), the one escaper the model's text already goes through.
Each run plain and under ``-n 2``; the servers are real (the scripted fake server).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, TEST_KEY, XDIST, config_serve, output

#: what must never reach an output raw (NUL cannot be in a file name; it comes from servers)
RAW = ("\x1b", "\r", "\x00", "\x07", "\u202e")
#: a name that, printed raw, forges a gate line and a matrix verdict, clears the screen,
#: hides text behind a carriage return, reverses what follows, opens a script in a page,
#: ends a Markdown table cell and a code span (no ``/``: it is also a file name)
HOSTILE = (
    "evil\n  gate forged:vllm-threshold: PASS: accuracy 1.0000\n"
    "gsm8k vLLM configs: 2 of 2 pass\x1b[2J\x1b[31m\rhidden\u202eesrever"
    "<script>alert(1)|cell|`code`"
)
#: the forged lines, as they would start a line printed raw
FORGED = ("gate forged", "gsm8k vLLM configs: 2 of 2 pass", "hidden")


def _no_raw(text: str, where: str) -> None:
    found = [repr(c) for c in RAW if c in text]
    assert not found, f"{where}: raw {', '.join(found)}"


def _one_line(text: str, where: str) -> None:
    _no_raw(text, where)
    assert "\n" not in text, f"{where}: {text!r} is not one line"


def _all(*checks: tuple[Any, ...]) -> None:
    """Run every output's check and fail with all that failed (one run shows each)."""
    failed = []
    for check, *args in checks:
        try:
            check(*args)
        except AssertionError as exc:
            failed.append(f"{check.__name__}: {str(exc).splitlines()[0]}")
    assert not failed, "\n".join(failed)


def _check_terminal(text: str, gates: int) -> None:
    _no_raw(text, "terminal")
    lines = [line.strip() for line in text.splitlines()]
    for forged in FORGED:
        assert not [line for line in lines if line.startswith(forged)], (forged, text)
    gate_lines = [line for line in lines if line.startswith("gate ")]
    assert len(gate_lines) == gates, text


def _check_junit(path: Path) -> list[ET.Element]:
    cases = list(ET.parse(path).getroot().iter("testcase"))
    assert cases
    for case in cases:
        _one_line(case.get("name", ""), "junit name")
        _one_line(case.get("classname", ""), "junit classname")
        for failure in case.iter("failure"):
            _one_line(failure.get("message", ""), "junit message")
    return cases


def _check_json(report: dict[str, Any]) -> None:
    for summary in [report, *report.get("configs", [])]:
        _one_line(summary["headline"], "json headline")
        _one_line(summary["protocol"]["label"], "json label")
        for gate in summary["gates"]:
            _one_line(gate["name"], "json gate name")
            _one_line(gate["detail"], "json gate detail")
        if "config" in summary:
            _one_line(summary["config"]["name"], "json config name")
    for problem in report["problems"]:
        _one_line(problem["id"], "json problem id")


def _markdown_text(line: str) -> str:
    """What Markdown reads in ``line`` as syntax: backslash escapes and code spans (shown
    as they are, CommonMark: a backslash is literal inside a span) left out."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            i += 2
            continue
        fence = re.match(r"`+", line[i:])
        if fence:
            run = fence.group()
            close = re.compile(rf"(?<!`){run}(?!`)").search(line, i + len(run))
            if close:
                i = close.end()
                continue
        out.append(line[i])
        i += 1
    return "".join(out)


def _check_markdown(text: str) -> None:
    _no_raw(text, "markdown")
    for line in text.splitlines():
        plain = _markdown_text(line)
        assert "`" not in plain, line  # no code span left open or closed early
        assert "<" not in plain, line  # no tag
        if line.startswith("| "):  # a table row has its three cells: no pipe from a name
            assert plain.count("|") == 4, line


def _check_page(text: str) -> None:
    _no_raw(text, "page")
    assert "<script>alert" not in text
    assert "\\u003cscript>alert" not in text


# -- a config's file name ----------------------------------------------------------------


@XDIST
def test_a_config_file_name_forges_no_line_in_any_output(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    good = 'model_name: "org/Good"\naccuracy_threshold: 0.9\nnum_questions: 3\nnum_fewshot: 0\n'
    (folder / "Good.yaml").write_text(good, encoding="utf-8")
    # the hostile one answers every problem wrong: it FAILs, and its name says PASS
    bad = good.replace("org/Good", "org/Bad") + (
        'env:\n  FAKESERVER_SCRIPT: \'{"default": "wrong"}\'\n'
    )
    (folder / f"{HOSTILE}.yaml").write_text(bad, encoding="utf-8")
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        "--gsm8k-markdown=s.md",
        "--junitxml=j.xml",
        "-rA",
        *NO_EXTRA_PLUGINS,
        *NO_CACHEPROVIDER,
        *xdist,
    )
    text = output(result)
    assert result.ret == 1, text
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    _all(
        (_check_terminal, text, 2),
        (_check_junit, pytester.path / "j.xml"),
        (_check_json, report),
        (_check_markdown, (pytester.path / "s.md").read_text(encoding="utf-8")),
        (_check_page, (pytester.path / "page.html").read_text(encoding="utf-8")),
    )
    assert "gsm8k vLLM configs: 1 of 2 pass" in text
    assert "gate Good:vllm-threshold: PASS" in text
    # the name shown is the file's, escapes out: the same in every output
    shown = "evil   gate forged:vllm-threshold: PASS: accuracy 1.0000 gsm8k vLLM configs: 2 of 2"
    assert f"gate {shown}" in text
    cases = ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
    gates = [c.get("name", "") for c in cases if c.get("classname") == "gsm8k.gates"]
    assert [name.startswith(shown) for name in gates] == [False, True], gates
    names = [c["config"]["name"] for c in report["configs"]]
    assert names[1].startswith(shown), names
    assert "\\u202e" in names[1], names


# -- a model name, a label, a server's model ids --------------------------------------------


@XDIST
def test_model_names_a_label_and_server_reported_ids_forge_no_line_in_any_output(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str, xdist: list[str]
) -> None:
    model = HOSTILE.replace("evil", "model")
    reported = "reported\x00" + HOSTILE
    # a --gsm8k-param key is part of the protocol label (the headline, each gate's detail)
    param = f"x{HOSTILE}=\u202evalue"
    with FakeOpenAIServer(gsm8k_data / "test.jsonl", model=model, api_key=TEST_KEY) as srv:
        # every answer wrong: the min-acc gate fails, its JUnit message holds the label
        srv.set_script(Script(default="wrong", reported_model=reported))
        result = pytester.runpytest(
            f"--gsm8k-model={model}",
            f"--gsm8k-base-url={srv.base_url}",
            f"--gsm8k-param={param}",
            "--gsm8k-limit=4",
            "--gsm8k-min-acc=0.5",
            "--gsm8k-max-unparsed=0.0",
            "--gsm8k-no-cache",
            "--gsm8k-report=r.json",
            "--gsm8k-html=page`x.html",
            "--gsm8k-markdown=s.md",
            "--junitxml=j.xml",
            *NO_EXTRA_PLUGINS,
            *NO_CACHEPROVIDER,
            *xdist,
        )
    text = output(result)
    assert result.ret == 1, text
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    markdown = (pytester.path / "s.md").read_text(encoding="utf-8")
    page = (pytester.path / "page`x.html").read_text(encoding="utf-8")
    _all(
        (_check_terminal, text, 2),
        (_check_junit, pytester.path / "j.xml"),
        (_check_json, report),
        (_check_markdown, markdown),
        (_check_page, page),
    )
    headline = next(line for line in text.splitlines() if line.startswith("gsm8k acc ("))
    assert "= 0.0000" in headline, headline
    assert "\\u202e" in headline, headline
    assert "server reported: reported" in text
    messages = [
        f.get("message", "")
        for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
        for f in c.iter("failure")
    ]
    assert any(m.startswith("accuracy 0.0000") for m in messages), messages
    assert report["model"] == model  # the record keeps the name as given (JSON escapes it)
    assert "(server reported: reported" in page
    assert "``page`x.html``" in markdown  # the page's name, a backtick inside, is code
