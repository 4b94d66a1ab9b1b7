"""Every view of a verdict for people (terminal, verdict table, Markdown); nothing is decided
here. Pure. Text from outside goes through ``printable`` or ``md_text``/``md_code``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeGuard, cast

from pytest_gsm8k.core.baseline import noise_sentence
from pytest_gsm8k.core.early_stop import FLOOR
from pytest_gsm8k.core.gates import GateVerdict, flip_words, points_words
from pytest_gsm8k.core.health import chat_api_hint
from pytest_gsm8k.core.scoring import RULES
from pytest_gsm8k.core.scrub import clip, md_code, md_text, printable
from pytest_gsm8k.core.verdict import GroupVerdict, RunVerdict, word_of

if TYPE_CHECKING:
    from pytest_gsm8k.core.compare import Comparison

LISTED = 50  # problems a list shows before it says how many more there are
SHOWN_IDS = 10  # problem ids a terminal list shows before "+N more"
#: GitHub shows no step summary at all past 1 MiB; the rest is left for the job's other lines
MAX_BYTES = 800_000


def cell_code(text: str) -> str:
    """``text`` as inline code in a table cell: a pipe inside would end the cell, even in
    code, so it is escaped (GitHub shows ``\\|`` in a cell as ``|``)."""
    return md_code(text).replace("|", "\\|")


class JunitCase(NamedTuple):
    """A gate as a JUnit test case, for a run's ``--junitxml`` and the merge's alike."""

    name: str
    outcome: Literal["passed", "failed", "skipped"]  # an undecided gate is never a pass
    message: str | None
    earlier: str | None  # with resumed answers, how many came from earlier runs ("39 of 40")


def junit_cases(verdict: RunVerdict) -> list[JunitCase]:
    """Each gate's JUnit case (a config's gate counts its config's resumed answers; the run's
    gates are its groups' in order: core/verdict.decide_run)."""
    outcome = {"PASS": "passed", "FAIL": "failed", "UNDECIDED": "skipped"}
    return [
        JunitCase(
            gate.name,
            outcome[gate.word],  # type: ignore[arg-type]
            None if gate.word == "PASS" else gate.detail,
            f"{group.from_cache()} of {group.n}" if group.selection.resumed else None,
        )
        for group in verdict.groups
        for gate in group.gates
    ]


def gate_table(gates: Sequence[GateVerdict]) -> list[str]:
    rows = [f"| {md_text(g.name)} | {g.word} | {md_text(g.detail)} |" for g in gates]
    return ["| gate | result | detail |", "| --- | --- | --- |", *rows, ""] if gates else []


def baseline_rows(
    base: Mapping[str, Any], sides: tuple[str, str] = ("baseline", "this run")
) -> list[tuple[str, str]]:
    """A comparison with a baseline as every output says it (terminal, Markdown, page,
    ``compare``; issue 32): one estimate of the difference, one interval, one set of counts."""
    runs = int(base["repeats"]["baseline"])
    failing, passing, stable = (len(base.get(k) or ()) for k in _FLIP_KEYS)
    shared, subset = base.get("shared"), base.get("subset")
    where = f"on the {shared} problems shared with the baseline's {base.get('baseline_n')} (subset)"
    where = where if subset else f"on {shared} problems"
    if base.get("not_in_baseline"):
        where += f"; {base['not_in_baseline']} of this run's problems are not in it"
    (b_low, b_high), (c_low, c_high) = base["baseline_ci95"], base["current_ci95"]
    was, now = base["baseline_accuracy"], base["current_accuracy"]
    diff = points_words(base["difference"], *base["difference_ci95"])
    flips = flip_words(failing, passing, stable, runs) + f"; {passing} newly passing" * (runs > 1)
    p = f"p={base['p_value']:.4g} (one-sided: the gate's test), McNemar p={base['mcnemar_p']:.4g}"
    per = f" ({runs} runs per problem)" * (runs > 1)
    return [
        ("accuracy", f"{was:.4f} -> {now:.4f} {where}; {diff}"),
        (
            "95% CI",
            f"{sides[0]}{per} {b_low:.4f}-{b_high:.4f}, {sides[1]} {c_low:.4f}-{c_high:.4f}",
        ),
        ("flips", f"{flips}; {p}"),
        ("noise", noise_sentence(base).removeprefix("noise: ")),
    ]


def flip_lists(base: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """The problems that changed, each list titled as every output titles it."""
    runs, ids = int(base["repeats"]["baseline"]), {k: list(base.get(k) or ()) for k in _LISTS}
    if runs == 1:
        return [("newly failing", ids["newly_failing"]), ("newly passing", ids["newly_passing"])]
    return [
        (f"newly failing, stable (right in all {runs} baseline runs)", ids["stable_flips"]),
        ("newly failing, noisy (right in some baseline runs)", ids["noisy_failing"]),
        ("newly passing (wrong in some baseline runs)", ids["newly_passing"]),
    ]


_FLIP_KEYS = ("newly_failing", "newly_passing", "stable_flips")
_LISTS = (*_FLIP_KEYS, "noisy_failing")


def compared(base: object) -> TypeGuard[Mapping[str, Any]]:
    """A baseline block of a comparison (not of a baseline written, missing or refused, nor
    of one sharing no problem: its gate FAILs and there are no numbers to show)."""
    return isinstance(base, Mapping) and "baseline_ci95" in base and bool(base.get("shared"))


def against_baseline(
    base: Mapping[str, Any], questions: Mapping[str, str], config: str = "", listed: int = LISTED
) -> list[str]:
    """A baseline block in Markdown: its rows, then the lists of flips (a ``config``'s titled
    by its name)."""
    path = str(base.get("path", ""))
    if PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        path = PurePosixPath(path.replace("\\", "/")).name  # of this machine: its name only
    if base.get("written"):
        return [f"Baseline written: {md_code(path)}.", ""]
    if not compared(base):
        return []

    def title(text: str) -> str:
        return f"{md_text(config)}: {text}" if config else text[0].upper() + text[1:]

    heading = title("against its baseline" if config else "against the baseline")
    return [f"**{heading}** {md_code(path)}:", "", *_md_rows(baseline_rows(base))] + [
        line
        for text, ids in flip_lists(base)
        for line in problem_list(title(text), ids, questions, "see the JSON report", listed)
    ]


def _md_rows(rows: Sequence[tuple[str, str]]) -> list[str]:
    return [*(f"- {label}: {md_text(text)}" for label, text in rows), ""]


def problem_list(
    title: str, ids: Sequence[str], questions: Mapping[str, str], rest: str, listed: int = LISTED
) -> list[str]:
    """``**title (N):**`` and a bullet per problem (id, its question's start), at most
    ``listed``; ``rest`` says where the others are."""
    if not ids:
        return []
    lines = [f"**{title} ({len(ids)}):**", ""]
    for pid in ids[:listed]:
        text = clip(" ".join(questions.get(pid, "").split()), 100)  # the question's start
        lines.append(f"- {md_code(pid)}: {md_text(text)}")
    if len(ids) > listed:
        more = f"{len(ids) - listed} more" if listed else f"{len(ids)}"
        lines.append(f"- ... {'and ' if listed else ''}{more} ({rest})")
    return [*lines, ""]


def fit(build: Callable[[int], str], limit: int = MAX_BYTES) -> str:
    """``build(listed)`` with the longest lists within ``limit`` bytes; else its head, cut at a
    line, and a line saying so."""
    text = ""
    for listed in (LISTED, 20, 5, 0):  # longest first, until the summary fits
        text = build(listed)
        if len(text.encode()) <= limit:
            return text
    note = "\n_... cut here: a step summary holds at most 1 MiB; see the JSON report._\n"
    head = text.encode()[: limit - len(note.encode())].decode(errors="ignore")
    return head[: head.rfind("\n") + 1] + note


def model_words(model: str, reported: Sequence[str]) -> str:
    shown = reported and list(reported) != [model]
    return model + (f" (server reported: {', '.join(reported)})" if shown else "")


def subset_words(subset: Mapping[str, Any]) -> str:
    """The subset of the split and what -k/-m/--lf deselected ("" for the whole split)."""
    words = []
    if (limit := subset.get("limit")) is not None:
        of = subset.get("of")
        seeded = f"seeded subset of {of} (limit {limit}, seed {subset.get('seed')})"
        words.append(f"the first {limit} of {of}" if subset.get("first") else seeded)
    if subset.get("deselected"):
        words.append(f"{subset['deselected']} deselected (-k/-m/--lf)")
    return "; ".join(words)


def tokens_words(tokens: Mapping[str, int], cached: int, n: object, resumed: bool) -> str:
    return (
        f"prompt {tokens.get('prompt_tokens', 0):,}, completion "
        f"{tokens.get('completion_tokens', 0):,}; answers from cache: {cached} of {n}"
        + (" (earlier runs, read with --gsm8k-resume)" if resumed else "")
    )


def styled_lines(verdict: RunVerdict) -> list[tuple[str, str]]:
    """The terminal block with each line's kind: ``headline``, ``info``, ``pass``, ``fail``
    (a matrix: each config's block, then the matrix headline and the verdict table)."""
    blocks = [line for group in verdict.groups for line in _group_lines(group)]
    if verdict.matrix:  # the verdict table (no protocol column, for a CI log's width: the
        rows = config_rows(verdict.to_json()["configs"], protocol=False)  # headlines say it)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        blocks.append((verdict.matrix_headline(), "headline"))
        for row in rows:
            line = "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            blocks.append((f"  {printable(line)}", "info"))
    return blocks


def config_rows(configs: Sequence[Mapping[str, Any]], protocol: bool = True) -> list[list[str]]:
    """A header and a row per config for the terminal's verdict table and the page's configs
    card (``protocol``: its column, the page's): ``baseline`` its gate's word (else written,
    none) and the accuracy before and now, ``stopped`` only with --gsm8k-early-stop."""
    early = any("early_stop" in c for c in configs)
    head = ["config", "model", *["protocol"] * protocol, "n", "accuracy, 95% interval", "floor"]
    rows = [[*head, "baseline", *["stopped"] * early, "verdict"]]
    for c in configs:
        gates, base, gate = c.get("gates") or [], c.get("baseline") or {}, baseline_gate(c)
        # the floor gate by its name: decided by an early stop, its rule is "early-stop"
        floor = next((g["threshold"] for g in gates if str(g["name"]).endswith(f":{FLOOR}")), None)
        said = gate["verdict"] if gate is not None else "written" if base.get("written") else "none"
        if compared(base):
            said += f" {base['baseline_accuracy']:.4f} -> {base['current_accuracy']:.4f}"
        (low, high), accuracy = c.get("ci95") or (0.0, 0.0), c.get("accuracy")
        shown = "no answers" if accuracy is None else f"{accuracy:.4f} [{low:.4f}-{high:.4f}]"
        name = str((c.get("config") or {}).get("name", ""))
        label = str(c["protocol"].get("label", "")).removeprefix(f"{name}: ")
        row = [name, str(c.get("model")), *[label] * protocol, str(c["n"]), shown]
        row += ["-" if floor is None else f"{floor:.4f}", said]
        stop: Mapping[str, int] = c.get("early_stop") or {}
        after, of = stop.get("decided_after"), stop.get("n_total", 0)
        stopped = after is not None and after < of and "not_stopped" not in stop
        row += [f"after {after} of {of}" if stopped else "-"] * early
        rows.append([*row, word_of(g["verdict"] for g in gates)])
    return rows


def baseline_gate(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    gates = report.get("gates") or []
    return next((g for g in gates if str(g.get("name")).rpartition(":")[2] == "baseline"), None)


def _group_lines(v: GroupVerdict) -> list[tuple[str, str]]:
    """One group's block: headline, the context a reader needs, gates."""
    report, counts, gated = v.to_json(), v.counts(), v.group.protocol["extractor"]
    out = [", ".join(f"{n} {k}" for k, n in counts.items() if n or k in ("correct", "wrong"))]
    out[0] = f"outcomes: {out[0]}"
    if v.answered:  # with no answer every rule would read 0.0000
        samples = [s for r in v.records for s in r["samples"]]
        silent = set(RULES) - {rule for s in samples for rule, x in s["extracted"].items() if x}
        rules = [(r, a) for r, a in report["rules"].items() if r == gated or r not in silent]
        quiet = ", ".join(sorted(silent - {gated}))
        said = ", ".join(f"{r}{'*' if r == gated else ''} {a:.4f}" for r, a in rules)
        said += f"  (* gates; format failures: {report['format_failures']}"
        out.append(f"by extractor: {said}{f'; no number found by {quiet}' if quiet else ''})")
    pass_at, repeats, k = report["pass_at_k"], report.get("repeats"), v.runs
    out += [", ".join(f"{name} {a:.4f}" for name, a in pass_at.items())] * bool(pass_at)
    if repeats is not None:
        out.append(
            f"repeats: {k} per problem ({repeats['answers']} answers): the accuracy above "
            f"and the gates are the mean over every answer (interval over problems); "
            f"maj@{k} (each problem's most common answer, what the outcomes count) "
            f"{cast(float, repeats['majority_accuracy']):.4f}"
        )
    ds, subset = v.group.dataset, subset_words(v.group.subset)
    out += [
        f"model: {model_words(v.group.model, v.reported_models())}  endpoint: {v.group.endpoint}",
        f"dataset: {ds['name']} {ds['config']}/{ds['split']} (fingerprint {ds['fingerprint']})"
        + (f"; {subset}" if subset else ""),
        f"tokens: {tokens_words(report['tokens'], v.from_cache(), v.n, v.selection.resumed)}",
    ]
    cut = counts["truncated"] / v.n if v.n else 0.0
    if cut > 0.01:
        out.append(
            f"WARNING: {counts['truncated']} of {v.n} answers ({cut:.1%}) were cut "
            f"by --gsm8k-max-tokens {v.group.protocol['max_tokens']}"
        )
    if v.n < v.expected:
        stop = " (run interrupted)" if v.selection.interrupted else ""
        out.append(f"INCOMPLETE: {v.n} of {v.expected} problems have a result{stop}")
    out += [note[2:] for note in v.notes]
    base = v.extra.get("baseline")
    if compared(base):
        rest = "in the JSON report" if v.group.report else "with --gsm8k-report PATH"
        out += [f"baseline {base['path']}:", *(f"  {k}: {text}" for k, text in baseline_rows(base))]
        for title, ids in flip_lists(base):
            more = f" (+{len(ids) - SHOWN_IDS} more {rest})" if len(ids) > SHOWN_IDS else ""
            out += [f"  {title}: {', '.join(ids[:SHOWN_IDS])}{more}"] * bool(ids)
    texts = (s["text"] for r in v.records for s in r["samples"])  # read until a sign is found
    models = [v.group.model, *v.reported_models()]
    hint = chat_api_hint(str(v.group.protocol.get("api")), models, counts["unparsed"], v.n, texts)
    out += [hint] if hint else []
    # model names, endpoints and messages come from outside: no escapes reach a terminal
    styled = [(printable(v.headline()), "headline")]
    styled += [("  " + printable(line), "info") for line in out]
    for gate in v.gates:
        line = f"  gate {gate.name}: {gate.word}: {printable(gate.detail)}"
        styled.append((line, "fail" if not gate.passed else "pass"))
    return styled


def markdown(
    verdict: RunVerdict, questions: Mapping[str, str], html: tuple[str, bool] | None = None
) -> str:
    """The GitHub step summary: headline, where the page is (``html``: its path relative to
    the repository and True, or its file's name and False), gates, each group's comparison."""
    lines = [f"### {md_text(verdict.headline())}", ""]
    if html:
        where = "(relative to the repository; a self-contained HTML file: see the job's artifacts)"
        where = where if html[1] else "in the job's artifact (a self-contained HTML file)"
        lines += [f"The run's page: {md_code(html[0])} {where}.", ""]
    counts = ", ".join(f"{n} {k}" for k, n in verdict.counts().items() if n)
    dataset = f"{verdict.group.dataset['config']}/{verdict.group.dataset['split']}"
    lines.append(
        f"Outcomes: {counts}. Model {md_code(verdict.group.model)}, dataset {md_code(dataset)}."
    )
    lines[-1] += f" {verdict.earlier_answers()}." * verdict.selection.resumed
    lines += ["", *gate_table(verdict.gates)]
    bases = [(g.extra.get("baseline") or {}, g.group.name) for g in verdict.groups]

    def text(listed: int) -> str:  # a config's lists are named after it; a run's name is ""
        lists = [ln for b, name in bases for ln in against_baseline(b, questions, name, listed)]
        return "\n".join(lines + lists) + "\n"

    return fit(text)


def compare_markdown(result: Comparison, questions: Mapping[str, str] | None = None) -> str:
    """The comparison in the step summary's Markdown: headline, the two runs, the pairing,
    the verdict as a gate table, then the rows and flips every comparison shows."""
    a, b, shared = result.a, result.b, result.block["shared"]
    pairs = f"{shared} problem{'s' if shared != 1 else ''}"
    unpaired = (
        (result.only_a, "only in A"),
        (result.only_b, "only in B"),
        (result.errors, "that ended in an error in either, left out"),
    )
    left = ", ".join(f"{count} {what}" for count, what in unpaired if count)
    lines = [
        f"### gsm8k compare ({md_text(clip(result.label))}): B {b.accuracy:.4f} vs A "
        f"{a.accuracy:.4f} on {pairs}",
        "",
        "| run | report | model | accuracy (paired) | problems |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {side.name} | {cell_code(side.where)} | {cell_code(clip(side.model))} | "
            f"{side.accuracy:.4f} | {side.n}{'' if side.complete else ' (incomplete run)'} |"
            for side in (a, b)
        ),
        "",
        md_text(
            f"Paired on the {pairs} both reports hold "
            f"(A holds {a.n}, B holds {b.n}{'; ' * bool(left)}{left})."
        ),
        "",
        *gate_table([result.verdict]),
        *_md_rows(baseline_rows(result.block, ("A", "B"))),
    ]
    for title, ids in flip_lists(result.block):
        title = f"{title[0].upper()}{title[1:]} in B"
        lines += problem_list(title, ids, questions or {}, "see the JSON reports")
    return "\n".join(lines) + "\n"
