"""The release gates after the test loop: baseline write or comparison, Markdown summary.

No pytest here: the plugin calls these on the controller with the finished
:class:`~pytest_gsm8k.core.summary.Summary`, and they add gates, terminal notes
and JSON report fields to it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.gates import MaxDrop, McNemar
from pytest_gsm8k.core.scrub import md_code, md_text
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.summary import Summary
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.runtime.files import write_atomic

SHOWN_IDS = 10


def baseline_path(settings: Settings, rootpath: Path, label: str, snapshot_dirname: str) -> Path:
    if settings.baseline:
        return Path(settings.baseline).expanduser()
    name = settings.baseline_name or bl.default_name(label)
    return rootpath / snapshot_dirname / "gsm8k" / f"{name}.gsm8k"


def read_baseline(
    path: Path, shown: str, here: dict[str, Any], split: Sequence[Problem]
) -> dict[str, Any]:
    """The baseline at ``path``, checked: readable, consistent in itself, of the protocol and
    dataset of ``here`` (a JSON report, or its protocol and dataset), and holding problems of
    ``split`` (all of its selection unless it says it is partial).

    Raises :class:`~pytest_gsm8k.core.baseline.BaselineError` with one line naming ``shown``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bl.BaselineError(f"{shown}: cannot read ({exc})") from None
    stored = bl.loads(text, shown)
    difference = bl.first_difference(stored, here)
    if difference:
        raise bl.BaselineError(f"refused to compare with {shown}: {difference}")
    bl.check_problem_set(stored, shown, split)
    return stored


def apply_baseline(
    summary: Summary,
    settings: Settings,
    path: Path,
    update: bool,
    shown_path: str,
    *,
    split: Sequence[Problem],
    stopped_early: bool = False,
    deselected_by: str = "-k/-m/--lf",
    run_ids: Collection[str] | None = None,
) -> None:
    """Write the baseline (``--snapshot-update``) or compare with it; adds a gate either way.

    ``split``: the dataset split's problems (what a baseline's ids are checked against);
    ``stopped_early``: the run stopped on ``--gsm8k-early-stop``; ``deselected_by``: the
    options that deselected problems, for the message when that makes a run partial;
    ``run_ids``: the problems the run set out to do (default: those with a record), all of
    which a baseline must hold for ``--gsm8k-require-baseline``.
    """
    report = summary.to_json()
    if update:
        _write_baseline(summary, settings, path, shown_path, split, stopped_early, deselected_by)
        return
    if not path.exists():
        message = (
            f"no baseline at {shown_path}; record one with: pytest <same options> --snapshot-update"
        )
        if settings.require_baseline:
            summary.add_gate("baseline", False, message + " (--gsm8k-require-baseline)")
        else:
            summary.notes.append(f"  baseline: {message}")
        return
    try:
        stored = read_baseline(path, shown_path, report, split)
    except bl.BaselineError as exc:
        summary.add_gate("baseline", False, str(exc))
        return
    cmp = bl.compare(stored, summary.records, run_ids)
    partial = stored.get("partial")
    summary.extra["baseline"] = {
        "path": shown_path,
        "partial": partial is not None,
        **cmp.to_json(),
    }
    if cmp.shared == 0:
        summary.add_gate("baseline", False, f"no problem id in common with {shown_path}")
        return
    uncovered = None
    if cmp.not_in_baseline:
        # A baseline that holds fewer problems than the run: the comparison below counts only
        # the shared ones, which must never pass unsaid for a comparison of the whole run.
        uncovered = (
            f"{shown_path} covers {cmp.run_n - cmp.not_in_baseline} of this run's {cmp.run_n} "
            f"problems: {cmp.not_in_baseline} are not in it"
        )
        if partial is not None:
            uncovered += f" (a partial baseline: {partial.get('reason', '')})"
        if not settings.require_baseline:
            summary.notes.append(
                f"  baseline: {uncovered}; the gate compares the {cmp.shared} it holds"
            )
    where = (
        f"on the {cmp.shared} problems shared with the baseline's {cmp.baseline_n} (subset)"
        if cmp.subset
        else f"on {cmp.shared} problems"
    )
    summary.notes.append(
        f"  baseline {shown_path}: {cmp.baseline_acc:.4f} -> {cmp.current_acc:.4f} {where}; "
        f"diff {cmp.diff:+.4f} [95% CI {cmp.low:+.4f}, {cmp.high:+.4f}]"
    )
    summary.notes.append(
        f"  {len(cmp.newly_failing)} newly failing, {len(cmp.newly_passing)} newly passing; "
        f"McNemar one-sided p={cmp.p_value:.4g}"
    )
    if cmp.newly_failing:
        shown = ", ".join(cmp.newly_failing[:SHOWN_IDS])
        more = (
            f" (+{len(cmp.newly_failing) - SHOWN_IDS} more in the JSON report)"
            if len(cmp.newly_failing) > SHOWN_IDS
            else ""
        )
        summary.notes.append(f"  newly failing: {shown}{more}")
    if uncovered is not None and settings.require_baseline:
        summary.add_gate(
            "baseline",
            False,
            f"{uncovered}; --gsm8k-require-baseline needs every problem of the run in it: "
            "record a baseline of the whole selection with --snapshot-update",
        )
        return
    if settings.alpha is not None:
        summary.set_gate(
            McNemar(settings.alpha).verdict(len(cmp.newly_failing), len(cmp.newly_passing))
        )
    else:
        rule = MaxDrop(settings.max_drop)
        summary.set_gate(rule.verdict(cmp.baseline_correct, cmp.current_correct, cmp.shared))


def _write_baseline(
    summary: Summary,
    settings: Settings,
    path: Path,
    shown: str,
    split: Sequence[Problem],
    stopped_early: bool,
    deselected_by: str,
) -> None:
    """``--snapshot-update``: write the baseline only from a run that covers its whole
    selection, and never over a baseline that holds problems the run does not; both may be
    forced with ``--gsm8k-baseline-partial`` (a partial baseline then says it is one)."""
    reason = None
    if summary.interrupted:
        reason = "the run was interrupted"
    elif summary.has_errors():
        reason = f"{summary.counts()['error']} problems ended in an error"
    elif summary.n < summary.expected and not stopped_early:
        reason = f"only {summary.n} of {summary.expected} problems have a result"
    if reason:
        summary.add_gate("baseline", False, f"not written to {shown}: {reason}")
        return
    deselected = int(summary.subset.get("deselected") or 0)
    selection = summary.expected + deselected
    partial = None
    if stopped_early:
        partial = (
            f"the run stopped early (--gsm8k-early-stop) after {summary.n} of the {selection} "
            "problems of its selection"
        )
    elif deselected:
        partial = (
            f"{deselected} of the {selection} problems of its selection were deselected "
            f"({deselected_by})"
        )
    if partial is not None and not settings.baseline_partial:
        summary.add_gate(
            "baseline",
            False,
            f"not written to {shown}: {partial}; a baseline holds the whole selection "
            "(--gsm8k-baseline-partial writes a partial one)",
        )
        return
    report = summary.to_json()
    if not settings.baseline_partial:
        dropped = _dropped(path, shown, report, split)
        if dropped:
            summary.add_gate(
                "baseline",
                False,
                f"not written to {shown}: it holds {dropped} problems this run does not have; "
                "delete it to record a smaller one, or pass --gsm8k-baseline-partial",
            )
            return
    from pytest_gsm8k.snapshot import serialize

    write_atomic(path, serialize(bl.build(report, partial)))
    size = f"n={summary.n}"
    if partial is not None:
        size += f" of the {selection} of its selection, partial: {partial};"
    else:
        size += ","
    summary.notes.append(f"  baseline written: {shown} ({size} accuracy {summary.accuracy:.4f})")
    summary.extra["baseline"] = {"path": shown, "written": True, "partial": partial is not None}


def _dropped(path: Path, shown: str, report: dict[str, Any], split: Sequence[Problem]) -> int:
    """How many problems the usable baseline at ``path`` holds that the run has not (0 when
    there is none, or it cannot be compared with this run: then it is replaced)."""
    if not path.exists():
        return 0
    try:
        stored = read_baseline(path, shown, report, split)
    except bl.BaselineError:
        return 0
    ran = {str(record["id"]) for record in report["problems"]}
    return len(set(stored["problems"]) - ran)


def markdown(summary: Summary, questions: dict[str, str], html: str | None = None) -> str:
    """The GitHub step summary: headline, gates, newly failing problems, where the page is."""
    lines = [f"### {md_text(summary.headline())}", ""]
    if html:
        lines += [
            f"The run's page: `{md_text(html)}` (a self-contained HTML file; see the artifacts).",
            "",
        ]
    counts = ", ".join(f"{v} {k}" for k, v in summary.counts().items() if v)
    dataset = f"{summary.dataset['config']}/{summary.dataset['split']}"
    lines.append(f"Outcomes: {counts}. Model {md_code(summary.model)}, dataset {md_code(dataset)}.")
    lines.append("")
    if summary.gates:
        lines += ["| gate | result | detail |", "| --- | --- | --- |"]
        for gate in summary.gates:
            detail = md_text(gate.detail)
            name = md_text(gate.name)
            lines.append(f"| {name} | {gate.word} | {detail} |")
        lines.append("")
    base: Any = summary.extra.get("baseline") or {}
    failing = base.get("newly_failing") or []
    if failing:
        lines += [f"**Newly failing ({len(failing)}):**", ""]
        for pid in failing[:50]:
            text = " ".join(questions.get(pid, "").split())
            if len(text) > 100:
                text = text[:97] + "..."
            lines.append(f"- {md_code(pid)}: {md_text(text)}")
        if len(failing) > 50:
            lines.append(f"- ... and {len(failing) - 50} more (see the JSON report)")
        lines.append("")
    return "\n".join(lines) + "\n"
