"""The pieces of the Markdown summaries: the gate table, a comparison with a baseline and a
list of problems. Pure.

The run's summary (``$GITHUB_STEP_SUMMARY``, ``--gsm8k-markdown``) and the comparison of
two reports (``python -m pytest_gsm8k compare``) are built from these, so both read the
same in a pull request. Everything from outside (gate details, ids, questions) goes
through :func:`~pytest_gsm8k.core.scrub.md_text` or :func:`~pytest_gsm8k.core.scrub.md_code`:
no escape or Markdown syntax of a model's reaches the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from pytest_gsm8k.core.gates import GateVerdict, flip_words, points_words
from pytest_gsm8k.core.scrub import md_code, md_text

__all__ = [
    "LISTED",
    "MAX_BYTES",
    "QUESTION_CHARS",
    "against_baseline",
    "cell_code",
    "fit",
    "gate_table",
    "problem_list",
]

#: problems a list shows before it says how many more there are
LISTED = 50
#: characters of a question shown beside its id
QUESTION_CHARS = 100
#: bytes a summary may take: GitHub shows a step's summary only up to 1 MiB (a larger one
#: is an error annotation and no summary at all); the rest is left for what else the job
#: appends to the same file
MAX_BYTES = 800_000
#: list lengths tried, longest first, until the summary fits (many configs' lists add up)
_LENGTHS = (LISTED, 20, 5, 0)


def cell_code(text: str) -> str:
    """``text`` as inline code in a table cell: a pipe inside would end the cell, even in
    code, so it is escaped (GitHub shows ``\\|`` in a cell as ``|``)."""
    return md_code(text).replace("|", "\\|")


def gate_table(gates: Sequence[GateVerdict]) -> list[str]:
    """The gates as a table (``| gate | result | detail |``) and a blank line; nothing
    when there is no gate."""
    if not gates:
        return []
    lines = ["| gate | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {md_text(g.name)} | {g.word} | {md_text(g.detail)} |" for g in gates]
    return [*lines, ""]


def against_baseline(
    base: Mapping[str, Any], questions: Mapping[str, str], config: str = "", listed: int = LISTED
) -> list[str]:
    """A report's baseline block (a run's, or a ``config``'s: then named in each title) as a
    reviewer reads it: the baseline's accuracy and this run's on the shared problems, each
    with its interval, the one difference estimate and the flips in the terminal's words
    (core/gates.py), then the problems: the newly failing (against a calibrated baseline
    the stable flips, then the noisy ones) and the newly passing, each list at most
    ``listed`` long. Every number is the block's: nothing is computed again here. A baseline
    written is one line; nothing when nothing was compared (the gate says why)."""
    path = md_code(_repository_path(str(base.get("path", ""))))
    if base.get("written"):
        return [f"Baseline written: {path}.", ""]
    shared = base.get("shared")
    if not shared or "baseline_ci95" not in base:
        return []

    def title(text: str) -> str:
        return f"{md_text(config)}: {text}" if config else text[0].upper() + text[1:]

    where = f"on {shared} problems"
    if base.get("subset"):
        where = f"on the {shared} problems shared with the baseline's {base['baseline_n']} (subset)"
    if base.get("not_in_baseline"):
        where += f"; {base['not_in_baseline']} of this run's problems are not in it"
    runs = int((base.get("repeats") or {}).get("baseline", 1))
    failing = base.get("newly_failing") or []
    passing = base.get("newly_passing") or []
    stable = base.get("stable_flips") or []
    said = f"{points_words(base['difference'], *base['difference_ci95'])}; " + flip_words(
        len(failing), len(passing), len(stable), runs
    )
    lines = [
        f"**{title('against its baseline' if config else 'against the baseline')}** {path}, "
        f"{md_text(where)}:",
        "",
        "| | accuracy | 95% CI |",
        "| --- | --- | --- |",
    ]
    for side, accuracy, (low, high) in (
        (
            f"baseline ({runs} runs per problem)" if runs > 1 else "baseline",
            base["baseline_accuracy"],
            base["baseline_ci95"],
        ),
        ("this run", base["current_accuracy"], base["current_ci95"]),
    ):
        lines.append(f"| {side} | {accuracy:.4f} | {low:.4f}-{high:.4f} |")
    lines += ["", md_text(said[0].upper() + said[1:] + "."), ""]
    rest = "see the JSON report"
    if runs > 1:
        lists = [
            ("newly failing, stable (right in every baseline run)", stable),
            ("newly failing, noisy (right in some baseline runs)", base.get("noisy_failing")),
            ("newly passing (wrong in some baseline runs)", passing),
        ]
    else:
        lists = [("newly failing", failing), ("newly passing", passing)]
    for text, ids in lists:
        lines += problem_list(title(text), ids or [], questions, rest, listed)
    return lines


def _repository_path(path: str) -> str:
    """A path as the report holds it (relative to the repository when inside it), or the
    file's name for a path of this machine (a reader elsewhere cannot open it)."""
    if PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        return PurePosixPath(path.replace("\\", "/")).name
    return path


def problem_list(
    title: str,
    ids: Sequence[str],
    questions: Mapping[str, str],
    rest: str,
    listed: int = LISTED,
) -> list[str]:
    """``**title (N):**`` and one bullet per problem (its id and the start of its
    question), at most ``listed``; ``rest`` says where the others are. Nothing
    when ``ids`` is empty."""
    if not ids:
        return []
    lines = [f"**{title} ({len(ids)}):**", ""]
    for pid in ids[:listed]:
        text = " ".join(questions.get(pid, "").split())
        if len(text) > QUESTION_CHARS:
            text = text[: QUESTION_CHARS - 3] + "..."
        lines.append(f"- {md_code(pid)}: {md_text(text)}")
    if len(ids) > listed:
        more = f"{len(ids) - listed} more" if listed else f"{len(ids)}"
        lines.append(f"- ... {'and ' if listed else ''}{more} ({rest})")
    return [*lines, ""]


def fit(build: Callable[[int], str], limit: int = MAX_BYTES) -> str:
    """The summary ``build(listed)`` makes with the longest lists that keep it within
    ``limit`` bytes; if even lists of none do not, its first ``limit`` bytes, cut at a
    line, and one line saying so. A summary too large is not shown at all."""
    text = ""
    for listed in _LENGTHS:
        text = build(listed)
        if len(text.encode()) <= limit:
            return text
    note = "\n_... cut here: a step summary holds at most 1 MiB; see the JSON report._\n"
    head = text.encode()[: limit - len(note.encode())].decode(errors="ignore")
    return head[: head.rfind("\n") + 1] + note
