"""The JSON report as one self-contained HTML page (docs/report.md). Pure. Text from outside
is one printable line, HTML-escaped; the problems travel as JSON with ``<``, ``>`` and ``&``
escaped, and the page's script writes them with ``textContent`` only."""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from string import Template
from typing import Any

from pytest_gsm8k.core import render
from pytest_gsm8k.core.jsontext import escape_surrogates, to_json
from pytest_gsm8k.core.prompts import CALCULATOR
from pytest_gsm8k.core.records import OUTCOMES
from pytest_gsm8k.core.scrub import printable, shown_url
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.core.verdict import word_of

#: a problem's place in the list is the first of these lists that holds it (then unchanged,
#: then a config with no comparison): the regressions worth reading first come first
_RANKED = ("stable_flips", "noisy_failing", "newly_failing", "newly_passing")
_Obj = Mapping[str, Any]  # a JSON object of the report
#: a comparison: the config's name ("" a run's), its baseline block, its baseline gate or None
_Comparison = tuple[str, _Obj, _Obj | None]
ProblemText = tuple[str, str]  # a problem's question and worked solution (problem_texts)
#: a problem's record as the page's script reads it (html_report.js): short keys, read once
_ROW = {"o": "outcome", "g": "gold", "x": "extracted", "nc": "n_correct", "ns": "n_samples"}
_ROW |= {"v": "votes", "e": "error", "note": "note"}


def problem_texts(problems: Iterable[Problem]) -> dict[str, ProblemText]:
    """id -> question and worked solution (the answer before ``####``, calculator
    annotations ``<<48/2=24>>`` removed: they are for the dataset's tooling, not for readers)."""
    answers = {p.id: (p.question, p.answer.rpartition("####")[0] or p.answer) for p in problems}
    return {pid: (q, CALCULATOR.sub("", a).strip()) for pid, (q, a) in answers.items()}


def outcomes_from_baseline(baseline: _Obj) -> dict[str, str]:
    """id -> outcome from a checked baseline document (core/baseline.check: every entry has
    one): an outcome string, or for sampled and calibrated baselines a dict with an ``outcome``."""
    entries = dict(baseline.get("problems") or {}).items()
    return {str(k): str(e["outcome"] if isinstance(e, Mapping) else e) for k, e in entries}


def render_html(report: _Obj, texts: Mapping[str, ProblemText], baseline: Mapping[str, str]) -> str:
    """The whole page (inline CSS, JS, SVG and data); ``texts``: problem_texts (the report holds
    none), ``baseline``: the compared baselines' outcomes (outcomes_from_baseline)."""
    configs = [c for c in report.get("configs") or [] if isinstance(c, Mapping)]
    comparisons = [
        (_name(c) if configs else "", c["baseline"], render.baseline_gate(c))
        for c in configs or [report]
        if render.compared(c.get("baseline"))
    ]
    records = list(report.get("problems") or [])
    change: dict[str, str] = {}
    rank: dict[str, int] = {}
    for _, base, _ in comparisons:
        failing, passing = _ids(base, "newly_failing"), _ids(base, "newly_passing")
        change |= dict.fromkeys(passing, "passing") | dict.fromkeys(failing, "failing")
        for place, key in enumerate(_RANKED):
            for pid in _ids(base, key):
                rank.setdefault(pid, place)
    if configs and comparisons:
        compared = {config for config, _, _ in comparisons}
        change |= {r["id"]: "none" for r in records if _config_of(r["id"]) not in compared}
    position = {_name(c): i for i, c in enumerate(configs)}

    def order(r: _Obj) -> tuple[int, int, int, int]:
        # failing now first, configs in run order within each place, so theirs stay together
        place = rank.get(r["id"], 5 if change.get(r["id"]) == "none" else 4)
        return max(place - 2, 0), position.get(_config_of(r["id"]), 0), place, int(r["index"])

    data = {
        "problems": [_row(r, texts, baseline, change) for r in sorted(records, key=order)],
        "rules": list(report.get("rules") or {}),  # ours, then a preset's (the records')
        "gated": (report.get("protocol") or {}).get("extractor"),
        "baseline": bool(comparisons),
    }
    label = (report.get("protocol") or {}).get("label", "")
    title = f"gsm8k {float(report.get('accuracy') or 0):.4f} {report.get('model', '')} ({label})"
    script = _asset("html_report.js")
    # no ``</script>`` or ``<!--`` in the data: JSON.parse reads the escapes back as text
    escaped = to_json(data, separators=(",", ":")).translate(_JSON_ESCAPES)
    # the page (html_report.html); its Content-Security-Policy is a second wall behind the
    # escaping: no network, and only the page's own script runs
    page = Template(_parts()["page"]).substitute(
        title=_e(title),
        digest=base64.b64encode(hashlib.sha256(script.encode()).digest()).decode("ascii"),
        css=_asset("html_report.css"),
        header=_header(report, configs, comparisons),
        selects=_selects(report, configs, comparisons),
        data=escaped,
        script=script,
    )
    # text UTF-8 cannot encode (a lone surrogate from a reply) shows as its escape; in the
    # data block that escape is JSON, which the page's script reads back as the same text
    return escape_surrogates(page + "\n")


def _name(config: _Obj) -> str:
    return str((config.get("config") or {}).get("name", ""))


def _config_of(pid: object) -> str:  # Qwen3:test-0042 -> Qwen3; "" outside --gsm8k-config
    return str(pid).rpartition(":")[0]


def _ids(base: _Obj, key: str) -> list[str]:
    return [str(i) for i in base.get(key) or []]


def _row(
    r: _Obj, texts: Mapping[str, ProblemText], was: Mapping[str, str], change: Mapping[str, str]
) -> dict[str, Any]:
    """One problem in the short keys html_report.js reads (``was``: its baseline outcome); a
    sample's text only where it is not the response."""
    pid, response = str(r.get("id")), str(r.get("response") or "")
    question, solution = texts.get(pid, ("", ""))
    row = {key: r.get(field) for key, field in _ROW.items()}
    row |= {"id": pid, "b": was.get(pid), "ch": change.get(pid, ""), "r": response}
    row |= {"q": question, "s": solution, "u": r.get("usage") or {}}
    row["rules"] = r.get("rules") or {}
    row["sm"] = [
        {"f": s.get("finish_reason"), "x": s.get("extracted") or {}}
        | ({} if s.get("text") == response else {"t": str(s.get("text") or "")})
        for s in r.get("samples") or []
    ]
    return row | ({"c": _config_of(pid)} if _config_of(pid) else {})


def _header(report: _Obj, configs: list[_Obj], comparisons: list[_Comparison]) -> str:
    gates = list(report.get("gates") or [])
    counts = {str(k): int(v) for k, v in (report.get("counts") or {}).items()}
    n, expected = int(report.get("n") or 0), int(report.get("expected") or 0)
    errors = counts.get("error", 0)
    word: str = "FAIL" if errors else word_of(g["verdict"] for g in gates)
    word, cls = (word, word.lower()) if gates or errors else ("NO GATE", "none")
    out = [f'<header><div class="top"><span class="verdict {cls}">{word}</span>']
    out.append(f"<h1>{_e(report.get('headline'))}</h1></div>")
    early = report.get("early_stop") or {}
    said = "; ".join(f"{k.replace('_', ' ')} {_value(early[k])}" for k in _EARLY if k in early)
    why = " (run interrupted)" if n >= expected else ""  # not complete, yet every result
    incomplete = report.get("complete") is False
    banners = [
        ("warn", f"INCOMPLETE: {n} of {expected} problems have a result{why}; {_ONLY}", incomplete),
        ("info", f"EARLY STOP: {said}", early),
        ("warn", f"{errors} problem(s) ended in an error (no answer): the run fails.", errors),
    ]
    out += [f'<p class="banner {c}">{_e(text)}</p>' for c, text, shown in banners if shown]
    rows = [(_badge(g["verdict"]), g.get("name"), g.get("detail")) for g in gates]
    shown = _card("Gates", _table(rows), " gates") if gates else _card("Gates", _NO_GATE)
    out.append(f'<section class="cards">{shown}')
    out.append(_card("Run", _dl(_run_items(report))))
    base = report.get("baseline")
    if comparisons and not configs:
        out.append(_baseline_card(*comparisons[0]))
    elif isinstance(base, Mapping) and base.get("written"):
        out.append(_card("Baseline", f"<p>written to <code>{_e(base.get('path'))}</code></p>"))
    if early:
        out.append(_card("Early stop", _dl((k.replace("_", " "), v) for k, v in early.items())))
    out.append('</section><section class="cards charts">')
    if configs:  # --gsm8k-config: each config's accuracy; the pooled counts mean nothing
        out += [_configs_card(configs), _outcome_card(counts)]
        if comparisons:  # each config against its own baseline, as a single run's card
            out += ['</section><section class="cards">', *(_baseline_card(*c) for c in comparisons)]
    else:
        gated = (report.get("protocol") or {}).get("extractor")
        rules = [
            (f"{rule}{' *' if rule == gated else ''}", f"{acc:.4f}", _Raw(_METER.format(100 * acc)))
            for rule, acc in (report.get("rules") or {}).items()
        ]
        table = _table(rules, th=0).replace("<table>", '<table class="rules">')
        note = f'<p class="note">* gates; format failures: {report.get("format_failures") or 0}</p>'
        out += [_accuracy_card(report, comparisons), _outcome_card(counts)]
        out += [_pass_at_card(report.get("pass_at_k") or {}), _card("By extractor", table + note)]
    return "".join(out) + "</section></header><main>"


def _run_items(report: _Obj) -> list[tuple[str, str]]:
    proto, ds = report.get("protocol") or {}, report.get("dataset") or {}
    settings = ", ".join(f"{k} {proto[k]}" for k in _SETTINGS if proto.get(k) not in (None, ""))
    rows = f", {ds['rows']} rows" if ds.get("rows") else ""
    times = [f"{k.split('_')[0]} {report[k]}" for k in _TIMES if report.get(k)]
    if isinstance(report.get("duration_s"), int | float):
        times.append(f"{float(report['duration_s']):.1f} s")
    tokens = report.get("tokens") or {}
    cached, resumed = int(report.get("from_cache") or 0), bool(report.get("resumed"))
    model = render.model_words(str(report.get("model", "")), report.get("reported_models") or [])
    return [
        ("model", model),
        ("endpoint", shown_url(str(report.get("endpoint") or ""))),
        ("protocol", f"{proto.get('label', '')}; {settings}"),
        ("dataset", f"{ds.get('name', '')} {ds.get('config', '')}/{ds.get('split', '')}{rows}"),
        ("fingerprint", str(ds.get("fingerprint", ""))),
        ("subset", render.subset_words(report.get("subset") or {})),
        ("tokens", render.tokens_words(tokens, cached, report.get("n"), resumed)),
        ("time", ", ".join(times)),
    ]


def _baseline_card(config: str, base: _Obj, gate: _Obj | None) -> str:
    items = [("file", str(base.get("path", "")))]
    items += [("gate", f"{gate.get('rule')}: {gate.get('detail')}" if gate is not None else "")]
    title = f"{_e(config)}: against its baseline" if config else "Against the baseline"
    badge = f" {_badge(gate['verdict'])}" if gate is not None else ""
    return _card(title + badge, _dl([*items, *render.baseline_rows(base)]), " baseline")


def _configs_card(configs: list[_Obj]) -> str:
    """--gsm8k-config: the terminal's verdict table (render.config_rows), its verdict first."""
    head, *rows = render.config_rows(configs)
    table = [["", *head[:-1]], *([_badge(r[-1]), *r[:-1]] for r in rows)]
    title = "vLLM configs (accuracy &gt;= threshold - tolerance)"
    return _card(title, _table(table, head=True), " full gates")


def _accuracy_card(report: _Obj, comparisons: list[_Comparison]) -> str:
    """Accuracy, its Wilson interval, the min-acc threshold and the baseline on one axis;
    a run with no answer has no accuracy, and the card says so instead of drawing 0."""
    title = "Accuracy, 95% interval"
    if report.get("accuracy") is None:
        errors = (report.get("counts") or {}).get("error", 0)
        return _card(title, f'<p class="note">no answers: {errors} errors, so no accuracy</p>', _W)
    acc = float(report["accuracy"])
    low, high = (float(v) for v in [*(report.get("ci95") or []), acc, acc][:2])
    gates = [g for g in report.get("gates") or [] if g.get("threshold") is not None]
    mins = [float(g["threshold"]) for g in gates if g.get("name") == "min-acc"]
    bases = [float(comparisons[0][1].get("baseline_accuracy") or 0)] if comparisons else []
    values = [acc, low, high, *mins, *bases]
    lo = max(0.0, math.floor((min(values) - 0.02) * 20) / 20)
    hi = min(1.0, math.ceil((max(values) + 0.02) * 20) / 20)

    def x(v: float) -> float:
        return 20 + 520 * (v - lo) / ((hi - lo) or 1)

    step = next(s for s in (0.01, 0.02, 0.05, 0.1, 0.2) if (hi - lo) / s <= 10.001)
    at = (round(lo + i * step, 6) for i in range(int((hi - lo) / step + 1e-9) + 1))
    ticks = "".join(_part("tick", x=x(t), v=t) for t in at)
    marks = [_part("threshold", x=x(v), label_x=x(v) + 4, v=v) for v in mins]
    marks += [_part("base", x=x(v), label_x=x(v) + 9, v=v) for v in bases]
    ci = {"low": low, "high": high, "low_x": x(low), "width": max(1.0, x(high) - x(low))}
    svg = _part("accuracy", x=x(acc), acc=acc, ticks=ticks, marks="".join(marks), **ci)
    return _card(title, svg, _W)


def _outcome_card(counts: Mapping[str, int]) -> str:
    """Outcome counts as one stacked bar with a legend (each outcome's colour is the CSS's)."""
    total, offset, bars = sum(counts.values()) or 1, 0.0, ""
    for name in (n for n in OUTCOMES if counts.get(n)):
        width = 560 * counts[name] / total
        bars += _part("bar", x=offset, width=width, name=name, n=counts[name])
        offset += width
    shown = [n for n in OUTCOMES if counts.get(n) or n in ("correct", "wrong")]
    legend = "".join(_part("legend", name=n, n=counts.get(n, 0)) for n in shown)
    return _card("Outcomes", _part("outcomes", bars=bars, legend=legend), " chart-card")


def _pass_at_card(pass_at: _Obj) -> str:
    """The pass@k curve, k evenly spaced (the ks are 1, powers of two and N)."""
    points = sorted((int(k.split("@")[-1]), float(v)) for k, v in pass_at.items())
    if not points:
        return ""
    lo = max(0.0, math.floor((min(v for _, v in points) - 0.05) * 10) / 10)

    def xy(i: int, v: float) -> tuple[float, float]:
        return 44 + 296 * i / max(1, len(points) - 1), 136 - 122 * (v - lo) / ((1.0 - lo) or 1)

    at = [(k, v, *xy(i, v)) for i, (k, v) in enumerate(points)]
    levels = "".join(_part("level", y=xy(0, v)[1] + 4, v=v) for v in (lo, (lo + 1) / 2, 1.0))
    line = " ".join(f"{x:.1f},{y:.1f}" for _, _, x, y in at)
    shown = "".join(_part("point", k=k, v=v, x=x, y=y, label_y=y - 8) for k, v, x, y in at)
    return _card("pass@k", _part("pass_at", levels=levels, line=line, points=shown), " chart-card")


def _selects(report: _Obj, configs: list[_Obj], comparisons: list[_Comparison]) -> str:
    counts = report.get("counts") or {}
    outcomes = [("all", f"all ({report.get('n')})"), ("notcorrect", "not correct")]
    selects = _select("outcome", outcomes + [(o, f"{o} ({counts.get(o, 0)})") for o in OUTCOMES])
    if comparisons:
        flips = {k: sum(len(_ids(b, f"newly_{k}")) for _, b, _ in comparisons) for k in _FLIPS}
        changes = [(k, f"newly {k} ({n})") for k, n in flips.items()]
        selects += _select("change", [("all", "all"), *changes, ("same", "unchanged")])
    if len(configs) > 1:
        selects += _select("config", [("all", "all"), *((_name(c), _name(c)) for c in configs)])
    return selects


_FLIPS = ("failing", "passing")
_JSON_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in "<>&"}
_EARLY = ("mode", "alpha", "decided_after")
_SETTINGS = ("temperature", "max_tokens", "api", "extractor", "preset")
_TIMES = ("started_at", "finished_at")
_METER = '<span class="meter"><i style="width:{:.1f}%"></i></span>'
_NO_GATE = '<p class="note">no gate was set</p>'
_ONLY = "every number here covers only those."
_W = " chart-card wide"


class _Raw(str):
    """Markup made here (a badge, a meter): a table cell keeps it as it is."""


def _asset(name: str) -> str:
    return resources.files("pytest_gsm8k.core").joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _parts() -> dict[str, str]:
    """html_report.html's parts (the page, its charts), each after a ``<!-- name -->`` line."""
    found = re.findall(
        r"^<!-- (\w+).*?-->\n(.*?)\n(?=<!-- |\Z)", _asset("html_report.html"), re.M | re.S
    )
    return dict(found)


def _part(part: str, **fields: object) -> str:
    return _parts()[part].format(**fields)


def _e(value: Any) -> str:
    return html.escape(printable("" if value is None else str(value)), quote=True)


def _card(title: str, body: str, cls: str = "") -> str:
    return f'<div class="card{cls}"><h2>{title}</h2>{body}</div>'


def _dl(items: Iterable[tuple[str, Any]]) -> str:
    shown = (f"<dt>{_e(k)}</dt><dd>{_e(_value(v))}</dd>" for k, v in items if v != "")
    return f"<dl>{''.join(shown)}</dl>"


def _table(rows: Iterable[Iterable[Any]], th: int = 1, head: bool = False) -> str:
    """Cells escaped unless :class:`_Raw`; cell ``th`` of a row, and with ``head`` every
    non-empty cell of the first row, is a ``<th>``."""
    out = ""
    for number, row in enumerate(rows):
        out += "<tr>"
        for i, cell in enumerate(row):
            tag = "th" if i == th or (head and number == 0 and cell != "") else "td"
            out += f"<{tag}>{cell if isinstance(cell, _Raw) else _e(cell)}</{tag}>"
        out += "</tr>"
    return f"<table>{out}</table>"


def _badge(word: str) -> _Raw:
    return _Raw(f'<span class="badge {word.lower()}">{word}</span>')


def _select(name: str, options: Iterable[tuple[str, str]]) -> str:
    shown = "".join(f'<option value="{_e(v)}">{_e(text)}</option>' for v, text in options)
    return f'<label>{name} <select id="f-{name}">{shown}</select></label>'


def _value(v: Any) -> str:
    if isinstance(v, Mapping):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(map(_value, v)) + "]"
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v) if v in (None, True, False) else str(v)
