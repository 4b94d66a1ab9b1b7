"""The end of a run, without pytest: decide with the baselines written, then render every
output from the verdict and write it. A run's end (reporting.py) and ``merge`` (__main__.py)
call these same functions, so merged shards write what the unsharded run would."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import RunPlan
    from pytest_gsm8k.core.settings import Settings
    from pytest_gsm8k.core.verdict import Group, GroupInput, RunVerdict
    from pytest_gsm8k.runtime.outputs import Output

#: each output: key -> (the option or variable that names it, appended to)
OUTPUTS = {
    "step_summary": ("$GITHUB_STEP_SUMMARY", True),
    "markdown": ("--gsm8k-markdown", False),
    "report": ("--gsm8k-report", False),
    "html": ("--gsm8k-html", False),
    "junitxml": ("--junitxml", False),  # the merge's own; a run's is pytest's
}


def output_paths(settings: Settings) -> dict[str, str | None]:
    paths = {key: getattr(settings, key) for key in ("markdown", "report", "html")}
    return {"step_summary": os.environ.get("GITHUB_STEP_SUMMARY") or None, **paths}


def settle(
    inputs: Sequence[GroupInput], top: Group | None, times: tuple[str, str, float]
) -> RunVerdict:
    """Decide, write each baseline the verdict holds (``--snapshot-update``); a failed
    write is decided once more with its error (the one derived copy)."""
    from pytest_gsm8k.core.baseline import dumps
    from pytest_gsm8k.core.verdict import decide_run
    from pytest_gsm8k.runtime.outputs import reason, write_atomic

    verdict = decide_run(inputs, top=top, times=times)
    failed: dict[str, str] = {}
    for group in verdict.groups:
        if group.baseline_write is not None and group.baseline is not None:
            try:
                write_atomic(group.baseline.stored.path, dumps(dict(group.baseline_write)))
            except Exception as exc:
                failed[group.group.name] = reason(exc)
    if not failed:
        return verdict
    inputs = [
        replace(i, baseline=replace(i.baseline, write_error=failed[i.group.name]))
        if i.baseline is not None and i.group.name in failed
        else i
        for i in inputs
    ]
    return decide_run(inputs, top=top, times=times)


def write_outputs(
    plan: RunPlan,
    verdict: RunVerdict,
    page: tuple[str, bool] | None,
    prepared: Mapping[str, Output] = {},
    junitxml: str | None = None,
    on_terminal: Callable[[], None] = lambda: None,
) -> dict[str, str]:
    """Every output rendered from the verdict and written, through the check made at
    session start (``prepared``) or now; returns key -> the one line why, for each that
    failed (rendering included). ``page``: where the Markdown says the page is."""
    from pytest_gsm8k.core.html_report import outcomes_from_baseline, problem_texts, render_html
    from pytest_gsm8k.core.jsontext import to_json
    from pytest_gsm8k.core.render import markdown
    from pytest_gsm8k.runtime.outputs import OutputError, prepare, reason

    # --gsm8k-config: the problems' ids carry their config's name, the split's do not
    problems = (*plan.split.problems, *plan.problems)
    report = verdict.to_json()
    compared: dict[str, str] = {}
    for group in verdict.groups:
        compared |= outcomes_from_baseline(group.compared or {})
    summary = functools.cache(
        lambda: markdown(verdict, {p.id: p.question for p in problems}, html=page)
    )
    renders: dict[str, Callable[[], str]] = {
        "step_summary": summary,
        "markdown": summary,
        "report": lambda: to_json(report, indent=1) + "\n",
        "html": lambda: render_html(report, problem_texts(problems), compared),
        "junitxml": lambda: junit_xml(verdict),
    }
    errors: dict[str, str] = {}
    for key, path in {**output_paths(plan.settings), "junitxml": junitxml}.items():
        what, append = OUTPUTS[key]
        try:
            if path:
                output = prepared.get(key) or prepare(path, what, append=append)
                text = renders[key]()
                if output.terminal:
                    on_terminal()
                output.write(text)
                output.close()
        except OutputError as exc:
            errors[key] = f"gsm8k: {exc}"
        except Exception as exc:
            errors[key] = f"gsm8k: {what}: cannot write {path}: {reason(exc)}"
    return errors


def page_path(html: str | None, cwd: Path, root: Path, stream: bool) -> tuple[str, bool] | None:
    """Where the Markdown says the page is: its path relative to the repository (``root``)
    and True, or its file's name (what the job's artifact holds) and False; never this
    machine's absolute path. None without a page, or for a page written to a stream."""
    if not html or stream:
        return None
    full = Path(os.path.abspath(cwd / Path(html).expanduser()))
    # as written first (a link keeps its name), then with the links resolved
    for here, under in ((full, root.absolute()), (full.resolve(), root.resolve())):
        if here.is_relative_to(under):
            return here.relative_to(under).as_posix(), True
    return full.name, False


def junit_xml(verdict: RunVerdict) -> str:
    """The gates as JUnit test cases (classname ``gsm8k.gates``), as a run's ``--junitxml``
    holds them (core/render.junit_cases)."""
    from xml.etree import ElementTree as ET

    from pytest_gsm8k.core.render import junit_cases

    cases = junit_cases(verdict)
    outcomes = [case.outcome for case in cases]
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root,
        "testsuite",
        name="pytest",
        tests=str(len(cases)),
        failures=str(outcomes.count("failed")),
        skipped=str(outcomes.count("skipped")),
    )
    for case in cases:
        element = ET.SubElement(suite, "testcase", classname="gsm8k.gates", name=case.name)
        if case.outcome != "passed":
            tag = "failure" if case.outcome == "failed" else "skipped"
            ET.SubElement(element, tag, message=case.message or "").text = case.message
        if case.earlier:
            props = ET.SubElement(element, "properties")
            ET.SubElement(props, "property", name="answers_from_earlier_runs", value=case.earlier)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
