"""The run's report as one self-contained HTML page. Pure: a function of its arguments.

Why a separate renderer: the JSON report is the record of a run; this page is a view of it
for a person reviewing a release (in CI artifacts, opened from disk, offline). So it reads the
JSON report dict (``Summary.to_json()``, schema 1) and never the plugin's state, and it does no
I/O besides reading its two package assets (``html_report.css``, ``html_report.js``).

Inputs (what the plugin passes to :func:`render_html`):

- ``report``: the JSON report dict. Fields used: ``headline``, ``accuracy``, ``ci95``, ``n``,
  ``expected``, ``complete``, ``counts``, ``rules``, ``format_failures``, ``pass_at_k``,
  ``protocol`` (``label``, ``name``, ``extractor``, ...), ``model``, ``reported_models``,
  ``endpoint``, ``dataset``, ``subset``, ``tokens``, ``from_cache``, ``gates``, ``baseline``,
  ``problems``; optional, read when present: ``resumed``, ``interrupted``, ``early_stop`` (``mode``,
  ``alpha``, ``decided_after``, ``verdicts``, ``interval``/``bounds``, shown as given),
  ``started_at``, ``finished_at``, ``duration_s``. The min-acc mark on the axis is the
  ``min-acc`` gate's ``threshold`` field. With ``--gsm8k-config``: ``configs`` (each config's
  report without its problems); a config's ``baseline`` block and its ``<config>:baseline``
  gate make its comparison, shown as a single run's is, and its problems are those whose ids
  start with ``<config>:``.
- ``problems``: problem id -> :class:`ProblemText` (question and worked solution), which the
  JSON report does not hold; build it with :func:`problem_texts` from the loaded split.
  Fallback: a record's own ``question``/``solution`` fields, if the report ever carries them.
- ``baseline_outcomes``: problem id -> the baseline's outcome, from the stored baseline
  document via :func:`outcomes_from_baseline` (with ``--gsm8k-config``, every config's
  baseline's in one map: the ids carry the config's name). Fallback: a record's
  ``baseline_outcome``; then, when every problem was compared (``baseline.shared == n``),
  "correct"/"not correct" derived from the newly failing/passing lists.

Safety: every text from the model, the data or the run is escaped. Header text goes through
:func:`html.escape`; the problem data is embedded as JSON in a ``<script type=
"application/json">`` block with every ``<``, ``>`` and ``&`` written as a ``\\u00XX`` escape
(so no ``</script>``, ``<!--`` or tag can occur in it), and the page's script builds the list
with ``textContent`` only. Credentials in the endpoint URL (user info, query) are dropped; the
report holds no API key and nothing from the environment is read.
Header text is also one line without control or bidi characters, as on the terminal
(:func:`~pytest_gsm8k.core.scrub.printable`): a model id a server reported, a config's name.

Speed: the page builds one summary row per problem once, fills a problem's details when it is
first opened, and filters by toggling ``hidden`` on the rows (see ``html_report.js``).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeGuard

from pytest_gsm8k.core.dataset import describe_subset
from pytest_gsm8k.core.jsontext import escape_surrogates, to_json
from pytest_gsm8k.core.scrub import printable, shown_url

__all__ = ["ProblemText", "outcomes_from_baseline", "problem_texts", "render_html"]

#: outcome order and colours; the CSS classes ``o-<outcome>`` use the same colours
OUTCOME_COLOURS = {
    "correct": "#1a7f37",
    "wrong": "#cf222e",
    "unparsed": "#bf8700",
    "truncated": "#8250df",
    "error": "#57606a",
}
_CALC = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class ProblemText:
    """What the page shows of a problem beyond the JSON report: its text and worked solution."""

    question: str
    solution: str = ""


class _ProblemLike(Protocol):
    """A GSM8K row (``pytest_gsm8k.core.types.Problem`` fits): id, question, full answer text."""

    @property
    def id(self) -> str: ...

    @property
    def question(self) -> str: ...

    @property
    def answer(self) -> str: ...


def problem_texts(problems: Iterable[_ProblemLike]) -> dict[str, ProblemText]:
    """id -> question and worked solution (the answer before ``####``, calculator
    annotations ``<<48/2=24>>`` removed: they are for the dataset's tooling, not for readers)."""
    out: dict[str, ProblemText] = {}
    for p in problems:
        solution = p.answer.rpartition("####")[0] if "####" in p.answer else p.answer
        out[p.id] = ProblemText(p.question, _CALC.sub("", solution).strip())
    return out


def outcomes_from_baseline(baseline: Mapping[str, Any]) -> dict[str, str]:
    """id -> outcome from a stored baseline document (``baseline.build``): its ``problems``
    map holds an outcome string, or for sampled protocols a dict with an ``outcome``."""
    out: dict[str, str] = {}
    for pid, entry in dict(baseline.get("problems") or {}).items():
        outcome = entry.get("outcome") if isinstance(entry, Mapping) else entry
        if outcome is not None:
            out[str(pid)] = str(outcome)
    return out


def render_html(
    report: Mapping[str, Any],
    problems: Mapping[str, ProblemText] | None = None,
    baseline_outcomes: Mapping[str, str] | None = None,
) -> str:
    """The whole page as one string (inline CSS, JS, SVG and data; no external resource)."""
    texts = problems or {}
    records = list(report.get("problems") or [])
    configs = _configs(report)
    comparisons = _comparisons(report)
    compared = bool(comparisons)
    changes = _changes(comparisons, records, matrix=bool(configs))
    position = {_config_name(c): i for i, c in enumerate(configs)}
    ordered = sorted(
        records,
        key=lambda r: changes.order(
            str(r.get("id")), position.get(_config_of(str(r.get("id"))), 0), _int(r.get("index"))
        ),
    )
    rows = [_row(r, texts, baseline_outcomes or {}, changes) for r in ordered]
    rule_names = list(report.get("rules") or {})
    for r in records:
        rule_names += [k for k in (r.get("rules") or {}) if k not in rule_names]
    data = {
        "problems": rows,
        "rules": rule_names,
        "gated": (report.get("protocol") or {}).get("extractor"),
        "baseline": compared,
        "outcomes": list(OUTCOME_COLOURS),
    }
    title = (
        f"gsm8k {_fmt(report.get('accuracy'))} {report.get('model', '')} "
        f"({(report.get('protocol') or {}).get('label', '')})"
    )
    script = _asset("html_report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    # text UTF-8 cannot encode (a lone surrogate from a reply) shows as its escape; in the
    # data block that escape is JSON, which the page's script reads back as the same text
    page = "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # a second wall behind the escaping: no network, and only the page's own script runs
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            f"style-src 'unsafe-inline'; script-src 'sha256-{digest}'\">",
            f"<title>{_e(title)}</title><style>{_asset('html_report.css')}</style></head><body>",
            _header(report, comparisons),
            _toolbar(report, comparisons),
            '<div id="rows" aria-live="polite"></div>',
            '<noscript><p class="note">The problem list needs JavaScript; the JSON report holds '
            "the same data.</p></noscript></main>",
            f'<script type="application/json" id="gsm8k-data">{_script_json(data)}</script>',
            f"<script>{script}</script></body></html>\n",
        ]
    )
    return escape_surrogates(page)


# -- the baseline comparisons: a single run's, or each config's (--gsm8k-config) ---------------


@dataclass(frozen=True)
class _Comparison:
    """One baseline comparison the page shows: the run's, or one config's."""

    #: the config's name; "" for a single run
    config: str
    #: the report's baseline block (``shared``, ``newly_failing``, ...)
    base: Mapping[str, Any]
    #: its baseline gate's record, when the gate gave a verdict
    gate: Mapping[str, Any] | None

    def ids(self, key: str) -> list[str]:
        return [str(i) for i in self.base.get(key) or []]


@dataclass(frozen=True)
class _Changes:
    """Per problem id: how it changed against its baseline (``failing``, ``passing``; ``none``
    for a problem of a config that was not compared with a baseline, on a page where others
    were), its rank in the list, and the baseline outcome the flips imply."""

    change: dict[str, str]
    rank: dict[str, int]
    derived: dict[str, str]

    def order(self, pid: str, config: int, index: int) -> tuple[int, int, int, int]:
        """Sort key: failing now (ranks 0-2), newly passing (3), unchanged (4), no baseline
        (5); configs in run order within each, so a config's failures stay together."""
        rank = self.rank.get(pid, 5 if self.change.get(pid) == "none" else 4)
        return (max(rank - 2, 0), config, rank, index)


def _configs(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in report.get("configs") or [] if isinstance(c, Mapping)]


def _config_name(config: Mapping[str, Any]) -> str:
    return str((config.get("config") or {}).get("name", ""))


def _config_of(pid: str) -> str:
    """The config a problem id belongs to (``Qwen3:test-0042``); "" outside --gsm8k-config."""
    return pid.rpartition(":")[0]


def _baseline_gate(gates: Any) -> Mapping[str, Any] | None:
    """The baseline gate among ``gates`` (``baseline``, or ``<config>:baseline``)."""
    for g in gates or []:
        if isinstance(g, Mapping) and str(g.get("name", "")).rpartition(":")[2] == "baseline":
            return g
    return None


def _compared(base: object) -> TypeGuard[Mapping[str, Any]]:
    """A baseline block of a comparison (not of a baseline just written)."""
    return isinstance(base, Mapping) and "shared" in base


def _comparisons(report: Mapping[str, Any]) -> list[_Comparison]:
    """The run's comparison with its baseline, or each config's with its own, in run order."""
    configs = _configs(report)
    if not configs:
        base = report.get("baseline")
        if not _compared(base):
            return []
        return [_Comparison("", base, _baseline_gate(report.get("gates")))]
    return [
        _Comparison(_config_name(c), c["baseline"], _baseline_gate(c.get("gates")))
        for c in configs
        if _compared(c.get("baseline"))
    ]


def _changes(comparisons: list[_Comparison], records: list[Any], *, matrix: bool) -> _Changes:
    """The regressions worth reading first: problems right in every baseline run that fail
    now, then the noisy ones failing, then any other newly failing, then newly passing, then
    the rest; a config with no comparison (none, or written now) last."""
    change: dict[str, str] = {}
    rank: dict[str, int] = {}
    derived: dict[str, str] = {}
    for c in comparisons:
        failing, passing = c.ids("newly_failing"), c.ids("newly_passing")
        own = [r for r in records if _config_of(str(r.get("id"))) == c.config]
        derived |= _derived_baseline(c.base, own, failing, passing)
        change |= {pid: "passing" for pid in passing} | {pid: "failing" for pid in failing}
        rank |= (
            {pid: 3 for pid in passing}
            | {pid: 2 for pid in failing}
            | {pid: 1 for pid in c.ids("noisy_failing")}
            | {pid: 0 for pid in c.ids("stable_flips")}
        )
    if matrix and comparisons:
        names = {c.config for c in comparisons}
        for r in records:
            pid = str(r.get("id"))
            if _config_of(pid) not in names:
                change[pid] = "none"
    return _Changes(change, rank, derived)


# -- data for the page's script ----------------------------------------------------------------


def _row(
    r: Mapping[str, Any],
    texts: Mapping[str, ProblemText],
    base_given: Mapping[str, str],
    changes: _Changes,
) -> dict[str, Any]:
    """One problem in the short keys the page's script reads (see html_report.js)."""
    pid = str(r.get("id"))
    text = texts.get(pid)
    response = str(r.get("response") or "")
    samples: list[dict[str, Any]] = []
    for s in r.get("samples") or []:
        sample: dict[str, Any] = {"f": s.get("finish_reason"), "x": s.get("extracted") or {}}
        if s.get("text") != response or not samples:  # sample 0 is usually the response itself
            sample["t"] = str(s.get("text") or "")
        samples.append(sample)
    if samples and samples[0].get("t") == response:
        del samples[0]["t"]
    row = {
        "i": r.get("index"),
        "id": pid,
        "o": r.get("outcome"),
        "b": base_given.get(pid) or r.get("baseline_outcome") or changes.derived.get(pid),
        "ch": changes.change.get(pid, ""),
        "g": r.get("gold"),
        "x": r.get("extracted"),
        "q": text.question if text else str(r.get("question") or ""),
        "s": text.solution if text else str(r.get("solution") or ""),
        "r": response,
        "sm": samples,
        "rules": r.get("rules") or {},
        "nc": r.get("n_correct"),
        "ns": r.get("n_samples"),
        "v": r.get("votes"),
        "e": r.get("error"),
        "note": r.get("note"),
        "u": r.get("usage") or {},
    }
    if _config_of(pid):
        row["c"] = _config_of(pid)
    return row


def _derived_baseline(
    base: Mapping[str, Any], records: list[Any], failing: list[str], passing: list[str]
) -> dict[str, str]:
    """Baseline correctness implied by the comparison, when every problem was compared."""
    if base.get("shared") != len(records):
        return {}
    out = {}
    for r in records:
        pid = str(r.get("id"))
        was = (pid in failing) or (bool(r.get("correct")) and pid not in passing)
        out[pid] = "correct" if was else "not correct"
    return out


def _script_json(data: Any) -> str:
    """JSON that cannot end its ``<script>`` element or open a comment: ``<``, ``>`` and ``&``
    become ``\\u003c``/``\\u003e``/``\\u0026``, which JSON.parse turns back into the same text."""
    text = to_json(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# -- the header ----------------------------------------------------------------------------


def _header(report: Mapping[str, Any], comparisons: list[_Comparison]) -> str:
    gates = [g for g in report.get("gates") or [] if isinstance(g, Mapping)]
    counts = {str(k): _int(v) for k, v in (report.get("counts") or {}).items()}
    failed = [g for g in gates if not g.get("passed")]
    errors = counts.get("error", 0)
    if failed or errors:
        verdict, cls = "FAIL", "fail"
    else:
        verdict, cls = ("PASS", "pass") if gates else ("NO GATE", "none")
    headline = report.get("headline") or _headline(report)
    parts = [
        f'<header><div class="top"><span class="verdict {cls}">{verdict}</span>',
        f"<h1>{_e(headline)}</h1></div>",
    ]
    n, expected = _int(report.get("n")), _int(report.get("expected"))
    if report.get("complete") is False or report.get("interrupted"):
        why = " (run interrupted)" if report.get("interrupted") or n >= expected else ""
        parts.append(
            f'<p class="banner warn">INCOMPLETE: {n} of {expected} problems have a '
            f"result{why}; every number here covers only those.</p>"
        )
    early = report.get("early_stop")
    if isinstance(early, Mapping) and early:
        parts.append(f'<p class="banner info">EARLY STOP: {_early_line(early)}</p>')
    if errors:
        parts.append(
            f'<p class="banner warn">{errors} problem(s) ended in an error (no '
            "answer): the run fails.</p>"
        )
    parts.append('<section class="cards">')
    parts.append(_gates_card(gates))
    parts.append(_run_card(report))
    configs = _configs(report)
    if comparisons and not configs:
        parts.append(_baseline_card(comparisons[0]))
    elif isinstance(report.get("baseline"), Mapping):
        written = report["baseline"]
        parts.append(
            f'<div class="card"><h2>Baseline</h2><p>written to '
            f"<code>{_e(written.get('path'))}</code></p></div>"
        )
    if isinstance(early, Mapping) and early:
        parts.append(_early_card(early))
    parts.append('</section><section class="cards charts">')
    if configs:  # --gsm8k-config: each config's accuracy; the pooled counts mean nothing
        parts.append(_configs_card(configs))
        parts.append(_outcome_card(counts))
        if comparisons:  # each config against its own baseline, as a single run's card
            parts.append('</section><section class="cards">')
            parts.extend(_baseline_card(c) for c in comparisons)
    else:
        parts.append(_accuracy_card(report, bool(comparisons)))
        parts.append(_outcome_card(counts))
        if report.get("pass_at_k"):
            parts.append(_pass_at_card(report["pass_at_k"]))
        parts.append(_rules_card(report))
    parts.append("</section></header><main>")
    return "".join(parts)


def _configs_card(configs: list[Mapping[str, Any]]) -> str:
    """--gsm8k-config: one row per config: its model, n, accuracy with its interval, the
    floor vLLM's rule needs (threshold - tolerance), its baseline (the gate's word and the
    baseline's accuracy before this run's), with --gsm8k-early-stop after how many of its
    problems it stopped, the verdict and its protocol."""
    rows = []
    early = any(isinstance(c.get("early_stop"), Mapping) for c in configs)
    for c in configs:
        config = c.get("config") or {}
        gates = [g for g in c.get("gates") or [] if isinstance(g, Mapping)]
        # the floor gate by its name: decided by an early stop, its rule is "early-stop"
        floor = next(
            (g.get("threshold") for g in gates if str(g.get("name")).endswith(":vllm-threshold")),
            None,
        )
        passed = all(g.get("passed") for g in gates)
        low, high = [*(c.get("ci95") or []), None, None][:2]
        accuracy = (
            f"{_fmt(c.get('accuracy'))} [{_fmt(low)}-{_fmt(high)}]"
            if c.get("accuracy") is not None
            else "no answers"
        )
        rows.append(
            f'<tr><td><span class="badge {"pass" if passed else "fail"}">'
            f"{'PASS' if passed else 'FAIL'}</span></td><th>{_e(config.get('name'))}</th>"
            f"<td>{_e(c.get('model'))}</td><td>{_int(c.get('n'))}</td><td>{_e(accuracy)}</td>"
            f"<td>{_e(_fmt(floor) if floor is not None else '-')}</td>"
            f"<td>{_e(_baseline_cell(c))}</td>"
            + (f"<td>{_e(_stopped_cell(c.get('early_stop')))}</td>" if early else "")
            + f"<td>{_e((c.get('protocol') or {}).get('label', ''))}</td></tr>"
        )
    head = (
        "<tr><td></td><th>config</th><th>model</th><th>n</th><th>accuracy, 95% interval</th>"
        "<th>floor</th><th>baseline</th>"
        + ("<th>stopped</th>" if early else "")
        + "<th>protocol</th></tr>"
    )
    return (
        '<div class="card full gates"><h2>vLLM configs (accuracy &gt;= threshold - '
        f"tolerance)</h2><table>{head}{''.join(rows)}</table></div>"
    )


def _stopped_cell(early: object) -> str:
    """A config's early stop in the configs card: ``after 8 of 40``, or ``-`` when it ran
    every problem (the terminal's ``stopped`` column says the same)."""
    if not isinstance(early, Mapping):
        return "-"
    after, total = early.get("decided_after"), early.get("n_total")
    if isinstance(after, int) and isinstance(total, int) and after < total:
        return f"after {after} of {total}"
    return "-"


def _baseline_cell(config: Mapping[str, Any]) -> str:
    """A config's baseline in the configs card: ``FAIL 1.0000 -> 0.6000``, ``written``, the
    gate's word alone (a baseline refused or required and missing), else ``none`` (the
    terminal's verdict table says the same)."""
    base = config.get("baseline")
    gate = _baseline_gate(config.get("gates"))
    word = ("PASS" if gate.get("passed") else "FAIL") if gate is not None else ""
    if _compared(base):
        accuracies = (
            f"{_fmt(base.get('baseline_accuracy'))} \u2192 {_fmt(base.get('current_accuracy'))}"
        )
        return f"{word} {accuracies}".strip()
    if isinstance(base, Mapping) and base.get("written"):
        return "written"
    return word or "none"


def _headline(report: Mapping[str, Any]) -> str:
    """The terminal headline, for a report written before it carried one."""
    low, high = [*(report.get("ci95") or []), 0.0, 0.0][:2]
    label = (report.get("protocol") or {}).get("label", "?")
    return (
        f"gsm8k acc ({label}) = {_fmt(report.get('accuracy'))}  "
        f"[95% CI {_fmt(low)}-{_fmt(high)}]  n={report.get('n')}"
    )


def _gates_card(gates: list[Mapping[str, Any]]) -> str:
    if not gates:
        return '<div class="card"><h2>Gates</h2><p class="note">no gate was set</p></div>'
    rows = "".join(
        f'<tr><td><span class="badge {"pass" if g.get("passed") else "fail"}">'
        f"{'PASS' if g.get('passed') else 'FAIL'}</span></td><th>{_e(g.get('name'))}</th>"
        f"<td>{_e(g.get('detail'))}</td></tr>"
        for g in gates
    )
    return f'<div class="card gates"><h2>Gates</h2><table>{rows}</table></div>'


def _run_card(report: Mapping[str, Any]) -> str:
    proto = report.get("protocol") or {}
    ds = report.get("dataset") or {}
    sub = report.get("subset") or {}
    tokens = report.get("tokens") or {}
    model = str(report.get("model", ""))
    reported = [str(m) for m in report.get("reported_models") or []]
    if reported and reported != [model]:
        model += f" (server reported: {', '.join(reported)})"
    subset = describe_subset(sub)
    if sub.get("deselected"):
        subset += f"{'; ' if subset else ''}{sub['deselected']} deselected (-k/-m/--lf)"
    settings = ", ".join(
        f"{k} {proto[k]}"
        for k in ("temperature", "max_tokens", "api", "extractor", "preset")
        if proto.get(k) not in (None, "")
    )
    items = [
        ("model", model),
        ("endpoint", shown_url(str(report.get("endpoint") or ""))),
        ("protocol", f"{proto.get('label', '')}; {settings}"),
        (
            "dataset",
            f"{ds.get('name', '')} {ds.get('config', '')}/{ds.get('split', '')}"
            + (f", {ds['rows']} rows" if ds.get("rows") else ""),
        ),
        ("fingerprint", str(ds.get("fingerprint", ""))),
        ("subset", subset),
        (
            "tokens",
            f"prompt {_int(tokens.get('prompt_tokens')):,}, completion "
            f"{_int(tokens.get('completion_tokens')):,}; answers from cache: "
            f"{_int(report.get('from_cache'))} of {report.get('n')}"
            + (" (earlier runs, read with --gsm8k-resume)" if report.get("resumed") else ""),
        ),
        ("time", _time_line(report)),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{_e(v)}</dd>" for k, v in items if v)
    return f'<div class="card"><h2>Run</h2><dl>{dl}</dl></div>'


def _time_line(report: Mapping[str, Any]) -> str:
    parts = []
    if report.get("started_at"):
        parts.append(f"started {report['started_at']}")
    if report.get("finished_at"):
        parts.append(f"finished {report['finished_at']}")
    if isinstance(report.get("duration_s"), int | float):
        parts.append(f"{float(report['duration_s']):.1f} s")
    return ", ".join(parts)


def _baseline_card(comparison: _Comparison) -> str:
    """A comparison with its baseline: the gate's verdict (rule, p-value, threshold), the
    accuracy before and now, the flips and what the noise-aware gate sees. One card for a
    single run, one per config with --gsm8k-config."""
    base = comparison.base
    low, high = [*(base.get("difference_ci95") or []), 0.0, 0.0][:2]
    where = (
        f"on the {base.get('shared')} problems shared with the baseline's "
        f"{base.get('baseline_n')} (subset)"
        if base.get("subset")
        else f"on {base.get('shared')} problems"
    )
    gate = comparison.gate
    items = [("file", str(base.get("path", "")))]
    if gate is not None:
        items.append(("gate", f"{gate.get('rule')}: {gate.get('detail')}"))
    items += [
        (
            "accuracy",
            f"{_fmt(base.get('baseline_accuracy'))} \u2192 "
            f"{_fmt(base.get('current_accuracy'))} {where}",
        ),
        (
            "paired diff",
            f"{_float(base.get('difference')):+.4f} "
            f"[95% CI {_float(low):+.4f}, {_float(high):+.4f}]",
        ),
        ("McNemar", f"one-sided p = {_float(base.get('mcnemar_p')):.4g}"),
        (
            "flips",
            f"{len(base.get('newly_failing') or [])} newly failing, "
            f"{len(base.get('newly_passing') or [])} newly passing",
        ),
    ]
    runs = (base.get("repeats") or {}).get("baseline", 1)
    if "stable_flips" in base and isinstance(runs, int) and runs > 1:
        stability = base.get("stability") or {}
        drop = base.get("detectable_drop") or {}
        items += [
            (
                "noise-aware",
                f"p = {_float(base.get('p_value')):.4g} at alpha {_value(base.get('alpha'))}; "
                f"detects a drop of {_float(drop.get('points')):.1f} points or more "
                f"({_value(drop.get('problems'))} problems, 80% power)",
            ),
            (
                "baseline noise",
                f"{_value(runs)} runs per problem: {_int(stability.get('stable_correct'))} "
                f"stable-correct, {_int(stability.get('stable_wrong'))} stable-wrong, "
                f"{_int(stability.get('noisy'))} noisy",
            ),
            (
                "failing now",
                f"{len(base.get('newly_failing') or [])} newly failing: "
                f"{len(base.get('stable_flips') or [])} stable (listed first), "
                f"{len(base.get('noisy_failing') or [])} noisy",
            ),
        ]
    dl = "".join(f"<dt>{k}</dt><dd>{_e(v)}</dd>" for k, v in items)
    title = (
        f"{_e(comparison.config)}: against its baseline"
        if comparison.config
        else ("Against the baseline")
    )
    if gate is not None:
        word = "PASS" if gate.get("passed") else "FAIL"
        title += f' <span class="badge {word.lower()}">{word}</span>'
    return f'<div class="card baseline"><h2>{title}</h2><dl>{dl}</dl></div>'


def _early_line(early: Mapping[str, Any]) -> str:
    bits = [
        f"{k.replace('_', ' ')} {_value(early[k])}"
        for k in ("mode", "alpha", "decided_after")
        if k in early
    ]
    return _e("; ".join(bits) or "the run stopped before every problem was asked")


def _early_card(early: Mapping[str, Any]) -> str:
    dl = "".join(
        f"<dt>{_e(str(k).replace('_', ' '))}</dt><dd>{_e(_value(v))}</dd>" for k, v in early.items()
    )
    return f'<div class="card"><h2>Early stop</h2><dl>{dl}</dl></div>'


def _value(v: Any) -> str:
    """A JSON value as a short readable phrase (numbers to 4 places)."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


# -- pictures (inline SVG, drawn here) ------------------------------------------------------------


def _min_acc(report: Mapping[str, Any]) -> float | None:
    """The min-acc gate's threshold, from its field (the rule states it; nothing is parsed)."""
    for gate in report.get("gates") or []:
        if isinstance(gate, Mapping) and gate.get("name") == "min-acc":
            threshold = gate.get("threshold")
            if isinstance(threshold, int | float) and not isinstance(threshold, bool):
                return float(threshold)
    return None


def _accuracy_card(report: Mapping[str, Any], compared: bool) -> str:
    """Accuracy, its Wilson interval, the min-acc threshold and the baseline on one axis;
    a run with no answer has no accuracy, and the card says so instead of drawing 0."""
    if report.get("accuracy") is None:
        counts = report.get("counts") or {}
        return (
            '<div class="card chart-card wide"><h2>Accuracy, 95% interval</h2>'
            f'<p class="note">no answers: {_int(counts.get("error"))} errors, so no accuracy'
            "</p></div>"
        )
    acc = _float(report.get("accuracy"))
    low, high = [*(report.get("ci95") or []), acc, acc][:2]
    marks: list[tuple[str, float]] = []
    threshold = _min_acc(report)
    if threshold is not None:
        marks.append(("min-acc", threshold))
    if compared:
        marks.append(("baseline", _float(report["baseline"].get("baseline_accuracy"))))
    values = [acc, _float(low), _float(high)] + [v for _, v in marks]
    lo = max(0.0, math.floor((min(values) - 0.02) * 20) / 20)
    hi = min(1.0, math.ceil((max(values) + 0.02) * 20) / 20)
    width, left, right = 560, 20, 540

    def x(v: float) -> float:
        return left + (right - left) * (v - lo) / ((hi - lo) or 1)

    step = next(s for s in (0.01, 0.02, 0.05, 0.1, 0.2) if (hi - lo) / s <= 10.001)
    svg = [
        f'<svg viewBox="0 0 {width} 112" role="img" class="chart" aria-label="accuracy {acc:.4f}">',
        f'<line x1="{left}" x2="{right}" y1="80" y2="80" class="axis"/>',
    ]
    tick = lo
    while tick <= hi + 1e-9:
        svg.append(
            f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="80" y2="85" '
            f'class="axis"/><text x="{x(tick):.1f}" y="98" class="tick">'
            f"{tick:.2f}</text>"
        )
        tick = round(tick + step, 6)
    svg.append(
        f'<rect x="{x(_float(low)):.1f}" y="26" width="'
        f'{max(1.0, x(_float(high)) - x(_float(low))):.1f}" height="14" rx="3" '
        f'class="ci"><title>Wilson 95% interval {_fmt(low)}-{_fmt(high)}</title></rect>'
    )
    svg.append(
        f'<circle cx="{x(acc):.1f}" cy="33" r="5" class="acc"/>'
        f'<text x="{x(acc):.1f}" y="18" class="label strong">{acc:.4f}</text>'
    )
    for name, value in marks:
        if name == "min-acc":
            svg.append(
                f'<line x1="{x(value):.1f}" x2="{x(value):.1f}" y1="8" y2="80" '
                f'class="threshold"/><text x="{x(value) + 4:.1f}" y="74" '
                f'class="label left fail-text">min-acc {value:g}</text>'
            )
        else:
            cx = x(value)
            svg.append(
                f'<path d="M{cx:.1f} 50 l6 6 l-6 6 l-6 -6 z" class="base"/>'
                f'<text x="{cx + 9:.1f}" y="60" class="label left">baseline '
                f"{value:.4f}</text>"
            )
    svg.append("</svg>")
    return (
        '<div class="card chart-card wide"><h2>Accuracy, 95% interval</h2>'
        + "".join(svg)
        + "</div>"
    )


def _outcome_card(counts: Mapping[str, int]) -> str:
    """Outcome counts as one stacked bar with a legend."""
    total = sum(counts.values()) or 1
    names = list(OUTCOME_COLOURS) + [k for k in counts if k not in OUTCOME_COLOURS]
    svg = ['<svg viewBox="0 0 560 28" role="img" class="chart" aria-label="outcomes">']
    offset = 0.0
    for name in names:
        count = counts.get(name, 0)
        if not count:
            continue
        w = 560 * count / total
        svg.append(
            f'<rect x="{offset:.1f}" y="2" width="{w:.1f}" height="24" '
            f'fill="{OUTCOME_COLOURS.get(name, "#888")}"><title>{_e(name)}: {count}'
            f"</title></rect>"
        )
        offset += w
    svg.append("</svg>")
    legend = "".join(
        f'<span class="legend"><i class="o-{_e(name)}"></i>{counts.get(name, 0)} {_e(name)}</span>'
        for name in names
        if counts.get(name) or name in ("correct", "wrong")
    )
    return (
        '<div class="card chart-card"><h2>Outcomes</h2>' + "".join(svg) + f"<p>{legend}</p></div>"
    )


def _pass_at_card(pass_at: Mapping[str, Any]) -> str:
    """The pass@k curve, k on a log axis (the ks are 1, powers of two and N)."""
    points = sorted((_int(k.split("@")[-1]), _float(v)) for k, v in pass_at.items())
    if not points:
        return ""
    lo = max(0.0, math.floor((min(v for _, v in points) - 0.05) * 10) / 10)
    width, height, left, right, top, bottom = 360, 170, 44, 340, 14, 136

    def x(i: int) -> float:
        return left + (right - left) * (i / max(1, len(points) - 1))

    def y(v: float) -> float:
        return bottom - (bottom - top) * (v - lo) / ((1.0 - lo) or 1)

    svg = [
        f'<svg viewBox="0 0 {width} {height}" role="img" class="chart small" aria-label="pass@k">',
        f'<line x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}" class="axis"/>',
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{bottom}" class="axis"/>',
    ]
    for v in (lo, (lo + 1) / 2, 1.0):
        svg.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" class="tick right">{v:.2f}</text>')
    line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, (_, v) in enumerate(points))
    svg.append(f'<polyline points="{line}" class="curve"/>')
    for i, (k, v) in enumerate(points):
        svg.append(
            f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" class="acc">'
            f"<title>pass@{k} = {v:.4f}</title></circle>"
            f'<text x="{x(i):.1f}" y="{bottom + 16}" class="tick">{k}</text>'
            f'<text x="{x(i):.1f}" y="{y(v) - 8:.1f}" class="label">{v:.3f}</text>'
        )
    svg.append(f'<text x="{(left + right) / 2}" y="{height - 2}" class="tick">k</text>')
    svg.append("</svg>")
    return '<div class="card chart-card"><h2>pass@k</h2>' + "".join(svg) + "</div>"


def _rules_card(report: Mapping[str, Any]) -> str:
    gated = (report.get("protocol") or {}).get("extractor")
    rows = "".join(
        f"<tr><th>{_e(rule)}{' *' if rule == gated else ''}</th><td>{_fmt(acc)}</td>"
        f'<td><span class="meter"><i style="width:{100 * _float(acc):.1f}%"></i></span></td>'
        f"</tr>"
        for rule, acc in (report.get("rules") or {}).items()
    )
    return (
        f'<div class="card"><h2>By extractor</h2><table class="rules">{rows}</table>'
        f'<p class="note">* gates; format failures: {_int(report.get("format_failures"))}'
        "</p></div>"
    )


def _toolbar(report: Mapping[str, Any], comparisons: list[_Comparison]) -> str:
    counts = report.get("counts") or {}
    options = "".join(
        f'<option value="{_e(o)}">{_e(o)} ({_int(counts.get(o))})</option>' for o in OUTCOME_COLOURS
    )
    change = ""
    if comparisons:
        failing = sum(len(c.ids("newly_failing")) for c in comparisons)
        passing = sum(len(c.ids("newly_passing")) for c in comparisons)
        change = (
            '<label>change <select id="f-change"><option value="all">all</option>'
            f'<option value="failing">newly failing ({failing})</option>'
            f'<option value="passing">newly passing ({passing})</option>'
            '<option value="same">unchanged</option></select></label>'
        )
    configs = [_config_name(c) for c in _configs(report)]
    if len(configs) > 1:
        change += (
            '<label>config <select id="f-config"><option value="all">all</option>'
            + "".join(f'<option value="{_e(name)}">{_e(name)}</option>' for name in configs)
            + "</select></label>"
        )
    return (
        '<div class="toolbar"><h2>Problems</h2><label>outcome <select id="f-outcome">'
        f'<option value="all">all ({_int(report.get("n"))})</option>'
        f'<option value="notcorrect">not correct</option>{options}</select></label>{change}'
        '<input id="f-search" type="search" placeholder="search id or text" '
        'aria-label="search"><span id="f-count"></span></div>'
    )


# -- small helpers -------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return resources.files("pytest_gsm8k.core").joinpath(name).read_text(encoding="utf-8")


def _e(value: Any) -> str:
    """Text for the page's markup: one line without escapes or reordering characters
    (:func:`~pytest_gsm8k.core.scrub.printable`, as on the terminal), HTML-escaped."""
    return html.escape(printable("" if value is None else str(value)), quote=True)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _fmt(value: Any) -> str:
    return f"{_float(value):.4f}"
