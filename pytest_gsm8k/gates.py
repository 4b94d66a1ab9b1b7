"""The release gates after the test loop: baseline write or comparison, Markdown summary.

No pytest here: the plugin calls these on the controller with the finished
:class:`~pytest_gsm8k.core.summary.Summary`, and they add gates, terminal notes
and JSON report fields to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.gates import MaxDrop, McNemar
from pytest_gsm8k.core.scrub import md_code, md_text
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.summary import Summary
from pytest_gsm8k.runtime.files import write_atomic

SHOWN_IDS = 10


def baseline_path(settings: Settings, rootpath: Path, label: str, snapshot_dirname: str) -> Path:
    if settings.baseline:
        return Path(settings.baseline).expanduser()
    name = settings.baseline_name or bl.default_name(label)
    return rootpath / snapshot_dirname / "gsm8k" / f"{name}.gsm8k"


def apply_baseline(
    summary: Summary, settings: Settings, path: Path, update: bool, shown_path: str
) -> None:
    """Write the baseline (``--snapshot-update``) or compare with it; adds a gate either way."""
    report = summary.to_json()
    if update:
        reason = None
        if summary.interrupted:
            reason = "the run was interrupted"
        elif summary.n < summary.expected:
            reason = f"only {summary.n} of {summary.expected} problems have a result"
        elif summary.has_errors():
            reason = f"{summary.counts()['error']} problems ended in an error"
        if reason:
            summary.add_gate("baseline", False, f"not written to {shown_path}: {reason}")
            return
        from pytest_gsm8k.snapshot import serialize

        write_atomic(path, serialize(bl.build(report)))
        summary.notes.append(
            f"  baseline written: {shown_path} (n={summary.n}, accuracy {summary.accuracy:.4f})"
        )
        summary.extra["baseline"] = {"path": shown_path, "written": True}
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
        stored = bl.loads(path.read_text(encoding="utf-8"), shown_path)
    except (OSError, UnicodeDecodeError) as exc:
        summary.add_gate("baseline", False, f"{shown_path}: cannot read ({exc})")
        return
    except bl.BaselineError as exc:
        summary.add_gate("baseline", False, str(exc))
        return
    difference = bl.first_difference(stored, report)
    if difference:
        summary.add_gate("baseline", False, f"refused to compare with {shown_path}: {difference}")
        return
    cmp = bl.compare(stored, summary.records)
    summary.extra["baseline"] = {"path": shown_path, **cmp.to_json()}
    if cmp.shared == 0:
        summary.add_gate("baseline", False, f"no problem id in common with {shown_path}")
        return
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
    if settings.alpha is not None:
        summary.set_gate(
            McNemar(settings.alpha).verdict(len(cmp.newly_failing), len(cmp.newly_passing))
        )
    else:
        rule = MaxDrop(settings.max_drop)
        summary.set_gate(rule.verdict(cmp.baseline_correct, cmp.current_correct, cmp.shared))


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
