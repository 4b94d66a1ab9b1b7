"""The pieces of the Markdown summaries: the gate table and a list of problems. Pure.

The run's summary (``$GITHUB_STEP_SUMMARY``, ``--gsm8k-markdown``) and the comparison of
two reports (``python -m pytest_gsm8k compare``) are built from these, so both read the
same in a pull request. Everything from outside (gate details, ids, questions) goes
through :func:`~pytest_gsm8k.core.scrub.md_text` or :func:`~pytest_gsm8k.core.scrub.md_code`:
no escape or Markdown syntax of a model's reaches the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pytest_gsm8k.core.gates import GateVerdict
from pytest_gsm8k.core.scrub import md_code, md_text

__all__ = [
    "LISTED",
    "MAX_BYTES",
    "QUESTION_CHARS",
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
