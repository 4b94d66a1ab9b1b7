"""The release gates after the test loop: baseline write or comparison, Markdown summary.

No pytest here: the plugin calls these on the controller with the finished
:class:`~pytest_gsm8k.core.summary.Summary`, and they add gates, terminal notes
and JSON report fields to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.calibrated import Pair, difference, evidence, reach
from pytest_gsm8k.core.gates import difference_words, failing_words
from pytest_gsm8k.core.markdown import against_baseline, fit, gate_table
from pytest_gsm8k.core.plan import RunPlan, StoredBaseline
from pytest_gsm8k.core.records import Report
from pytest_gsm8k.core.scrub import md_code, md_text
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.stats import accuracy_interval
from pytest_gsm8k.core.summary import Summary
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.runtime.files import write_atomic

SHOWN_IDS = 10


def check_baseline(
    stored: StoredBaseline, here: Mapping[str, Any], split: Sequence[Problem]
) -> dict[str, Any]:
    """The stored baseline's document, checked: readable, consistent in itself, of the
    protocol and dataset of ``here`` (a JSON report, or its protocol and dataset), and
    holding problems of ``split`` (all of its selection unless it says it is partial).

    Raises :class:`~pytest_gsm8k.core.baseline.BaselineError` with one line naming the file.
    """
    if stored.error is not None:
        raise bl.BaselineError(stored.error)
    if stored.document is None:
        raise bl.BaselineError(f"no baseline at {stored.shown}")
    difference = bl.first_difference(stored.document, here)
    if difference:
        raise bl.BaselineError(f"refused to compare with {stored.shown}: {difference}")
    bl.check_problem_set(stored.document, stored.shown, split)
    return stored.document


def apply_baseline(
    summary: Summary,
    plan: RunPlan,
    *,
    stopped_early: bool = False,
    deselected_by: str = "-k/-m/--lf",
    run_ids: Collection[str] | None = None,
    stored: StoredBaseline | None = None,
    split: Sequence[Problem] | None = None,
) -> None:
    """Write the baseline (``--snapshot-update``) or compare with it; adds a gate either way.

    ``stopped_early``: the run stopped on ``--gsm8k-early-stop``; ``deselected_by``: the
    options that deselected problems, for the message when that makes a run partial;
    ``run_ids``: the problems the run set out to do (default: those with a record), all of
    which a baseline must hold for ``--gsm8k-require-baseline``; ``stored`` and ``split``:
    a config's baseline and its split's problems under the config's ids (``--gsm8k-config``;
    default: the run's).
    """
    stored = stored if stored is not None else plan.baseline
    settings = plan.settings
    split = split if split is not None else plan.split.problems
    assert stored is not None
    shown_path = stored.shown
    report = summary.to_json()
    if plan.update_baseline:
        _write_baseline(summary, settings, stored, split, stopped_early, deselected_by)
        return
    if not stored.exists:
        record = "pytest <same options> --snapshot-update"
        moved = bl.moved_from(stored.beside, report)
        if moved is not None and not (settings.baseline or settings.baseline_name):
            # found by its label, a changed protocol finds no file: never "no baseline yet"
            summary.add_gate(
                "baseline",
                False,
                f"no baseline of this protocol at {shown_path}, but one of another protocol on "
                f"the same data: {moved}; record this protocol's with: {record}",
            )
            return
        message = f"no baseline at {shown_path}; record one with: {record}"
        if moved is not None:
            message += f" (one of another protocol is beside it: {moved})"
        if settings.require_baseline:
            summary.add_gate("baseline", False, message + " (--gsm8k-require-baseline)")
        else:
            summary.notes.append(f"  baseline: {message}")
        return
    try:
        document = check_baseline(stored, report, split)
    except bl.BaselineError as exc:
        summary.add_gate("baseline", False, str(exc))
        return
    cmp = bl.compare(document, summary.records, run_ids)
    partial = document.get("partial")
    rule = plan.gates.baseline
    pairs = bl.pairs(document, summary.records)
    seen = noise_block(pairs, rule.alpha)
    summary.extra["baseline"] = {
        "path": shown_path,
        "partial": partial is not None,
        **cmp.to_json(),
        **seen,
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
        f"  baseline {shown_path}: {seen['baseline_accuracy']:.4f} -> "
        f"{seen['current_accuracy']:.4f} {where}; {difference_words(pairs)}"
    )
    recorded_with = document.get("model")
    if isinstance(recorded_with, str) and recorded_with != summary.model:
        summary.notes.append(
            f"  the baseline was recorded with model {recorded_with} (this run: {summary.model})"
        )
    summary.notes.append(f"  {noise_sentence(seen)}")
    summary.notes.append(f"  {failing_words(pairs)}; p={seen['p_value']:.4g}")
    rise = rule.rise(pairs)
    if rise is not None:
        summary.notes.append(f"  {rise}")
    where_all = "in the JSON report" if settings.report else "with --gsm8k-report PATH"
    runs = seen["repeats"]["baseline"]
    for title, ids in (
        (
            f"newly failing, stable (right in all {runs} baseline runs)"
            if runs > 1
            else "newly failing",
            seen["stable_flips"] if runs > 1 else seen["newly_failing"],
        ),
        ("newly failing, noisy (right in some baseline runs)", seen["noisy_failing"]),
    ):
        if ids:
            shown = ", ".join(ids[:SHOWN_IDS])
            left = len(ids) - SHOWN_IDS
            more = f" (+{left} more {where_all})" if left > 0 else ""
            summary.notes.append(f"  {title}: {shown}{more}")
    if uncovered is not None and settings.require_baseline:
        summary.add_gate(
            "baseline",
            False,
            f"{uncovered}; --gsm8k-require-baseline needs every problem of the run in it: "
            "record a baseline of the whole selection with --snapshot-update",
        )
        return
    summary.set_gate(rule.verdict(pairs))


def noise_block(pairs: Sequence[Pair], alpha: float) -> dict[str, Any]:
    """What the noise-aware gate sees in the shared problems, for the report's baseline
    block: its p-values, the one estimate of the difference, the smallest drop it detects,
    the newly failing problems (stable ones first: the regressions worth reading first),
    and the baseline's stability."""
    counts = {"stable_correct": 0, "stable_wrong": 0, "noisy": 0}
    for pair in pairs:
        counts[pair.stability.replace("-", "_")] += 1
    seen = evidence(pairs)
    can = reach(pairs, alpha)
    diff, low, high = difference(pairs)
    shared = len(pairs)
    runs = max((p.base_runs for p in pairs), default=1)
    now_runs = max((p.now_runs for p in pairs), default=1)
    return {
        # like with like: the mean rates over every run of each side, one estimate
        "baseline_accuracy": sum(p.base_rate for p in pairs) / shared if shared else 0.0,
        "current_accuracy": sum(p.now_rate for p in pairs) / shared if shared else 0.0,
        # each side's interval by the headline's rule (one run: Wilson; repeats: clustered)
        "baseline_ci95": list(accuracy_interval([p.base_rate for p in pairs], runs)),
        "current_ci95": list(accuracy_interval([p.now_rate for p in pairs], now_runs)),
        "difference": diff,
        "difference_ci95": [low, high],
        "p_value": seen.p,
        "p_values": {"flips": seen.flip, "drop": seen.drop, "rise": seen.rise},
        "alpha": alpha,
        "repeats": {"baseline": runs, "run": now_runs},
        "detectable_drop": {
            "problems": round(can.problems, 1),
            "points": round(can.points, 2) if shared else None,
            "power": can.power,
            "repeats_for_one_point": can.repeats_for_one_point,
        },
        "newly_failing": [p.problem_id for p in pairs if p.failing],
        "newly_passing": [
            p.problem_id for p in pairs if p.base_correct < p.base_runs and p.now_correct > 0
        ],
        "stable_flips": [p.problem_id for p in pairs if p.stable_flip],
        "noisy_failing": [p.problem_id for p in pairs if p.failing and p.stability == "noisy"],
        "stability": counts,
        "flip_rate": counts["noisy"] / shared if shared else 0.0,
    }


def noise_sentence(seen: Mapping[str, Any]) -> str:
    """The terminal's line on what the gate can see (from :func:`noise_block`)."""
    counts = seen["stability"]
    shared = sum(counts.values())
    runs = seen["repeats"]["baseline"]
    drop = seen["detectable_drop"]
    more = drop["repeats_for_one_point"]
    can_see = (
        f"detects a drop of {drop['points']:.1f} points or more spread over the noisy "
        f"problems ({drop['problems']:g} problems; 80% power, n={shared}, "
        f"alpha={seen['alpha']:g}); "
        + (
            f"{more} candidate run{'s' if more != 1 else ''} per problem (--gsm8k-repeats) "
            "would reach 1 point"
            if more is not None
            else "no number of candidate repeats reaches 1 point with this baseline"
        )
    )
    if drop["points"] > 5:
        can_see += "; it cannot reach 80% power against a 5-point drop at this size"
    if runs == 1:
        return (
            f"noise: a single-run baseline cannot tell noisy problems from stable ones "
            f"(record it with --gsm8k-repeats K); the gate {can_see}"
        )
    return (
        f"noise: baseline of {runs} runs per problem: {counts['stable_correct']} stable-correct, "
        f"{counts['stable_wrong']} stable-wrong, {counts['noisy']} noisy (flip rate "
        f"{seen['flip_rate']:.1%}); the gate {can_see}"
    )


def _write_baseline(
    summary: Summary,
    settings: Settings,
    stored: StoredBaseline,
    split: Sequence[Problem],
    stopped_early: bool,
    deselected_by: str,
) -> None:
    """``--snapshot-update``: write the baseline only from a run that covers its whole
    selection, and never over a baseline that holds problems the run does not; both may be
    forced with ``--gsm8k-baseline-partial`` (a partial baseline then says it is one)."""
    shown = stored.shown
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
        dropped = _dropped(stored, report, split)
        if dropped:
            summary.add_gate(
                "baseline",
                False,
                f"not written to {shown}: it holds {dropped} problems this run does not have; "
                "delete it to record a smaller one, or pass --gsm8k-baseline-partial",
            )
            return
    fewer = _fewer_repeats(stored, settings.repeats)
    if fewer is not None:
        summary.add_gate("baseline", False, f"not written to {shown}: {fewer}")
        return
    from pytest_gsm8k.snapshot import serialize

    write_atomic(stored.path, serialize(bl.build(report, partial)))
    size = f"n={summary.n}"
    if partial is not None:
        size += f" of the {selection} of its selection, partial: {partial};"
    else:
        size += ","
    summary.notes.append(f"  baseline written: {shown} ({size} accuracy {summary.accuracy:.4f})")
    summary.extra["baseline"] = {"path": shown, "written": True, "partial": partial is not None}


def _fewer_repeats(stored: StoredBaseline, repeats: int) -> str | None:
    """Why a run with ``repeats`` per problem may not replace ``stored``: a calibrated
    baseline of more runs per problem knows each problem's noise, and a single-run one in
    its place would silently cost the gate its power (a 1-point drop caught 13% of the time
    instead of 99%). None when it may."""
    document = stored.document
    calibration = document.get("calibration") if isinstance(document, dict) else None
    stored_k = calibration.get("repeats") if isinstance(calibration, dict) else None
    if not isinstance(stored_k, int) or stored_k <= repeats:
        return None
    made = f"{repeats} runs" if repeats > 1 else "1 run"
    return (
        f"it is calibrated over {stored_k} runs per problem and this run made {made}; "
        f"record it with --gsm8k-repeats {stored_k} (or delete the file to record a "
        "baseline of fewer runs)"
    )


def _dropped(stored: StoredBaseline, report: Report, split: Sequence[Problem]) -> int:
    """How many problems the usable stored baseline holds that the run has not (0 when
    there is none, or it cannot be compared with this run: then it is replaced)."""
    if not stored.exists:
        return 0
    try:
        document = check_baseline(stored, report, split)
    except bl.BaselineError:
        return 0
    ran = {record["id"] for record in report["problems"]}
    return len(set(document["problems"]) - ran)


def markdown(
    summary: Summary, questions: dict[str, str], html: tuple[str, bool] | None = None
) -> str:
    """The GitHub step summary: headline, gates, the comparison with the baseline and its
    flips (each config's, with ``--gsm8k-config``), where the page is (``html``: its path
    relative to the repository and True, or its file's name and False: writing.py
    ``page_path``); the lists as long as GitHub's size bound allows (many configs'
    lists add up)."""
    return fit(lambda listed: _markdown(summary, questions, html, listed))


def _markdown(
    summary: Summary, questions: dict[str, str], html: tuple[str, bool] | None, listed: int
) -> str:
    lines = [f"### {md_text(summary.headline())}", ""]
    if html:
        where = (
            f"{md_code(html[0])} (relative to the repository; a self-contained HTML file: "
            "see the job's artifacts)"
            if html[1]
            else f"{md_code(html[0])} in the job's artifact (a self-contained HTML file)"
        )
        lines += [f"The run's page: {where}.", ""]
    counts = ", ".join(f"{v} {k}" for k, v in summary.counts().items() if v)
    dataset = f"{summary.dataset['config']}/{summary.dataset['split']}"
    lines.append(f"Outcomes: {counts}. Model {md_code(summary.model)}, dataset {md_code(dataset)}.")
    if summary.resumed:
        lines[-1] += f" {summary.earlier_answers()}."
    lines.append("")
    lines += gate_table(summary.gates)
    lines += against_baseline(summary.extra.get("baseline") or {}, questions, listed=listed)
    for config in summary.configs:
        name = str(config.extra.get("config", {}).get("name", config.label))
        lines += against_baseline(config.extra.get("baseline") or {}, questions, name, listed)
    return "\n".join(lines) + "\n"
