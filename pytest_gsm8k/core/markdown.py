"""The pieces of the Markdown summaries: the gate table and a list of problems. Pure.

The run's summary (``$GITHUB_STEP_SUMMARY``, ``--gsm8k-markdown``) and the comparison of
two reports (``python -m pytest_gsm8k compare``) are built from these, so both read the
same in a pull request. Everything from outside (gate details, ids, questions) goes
through :func:`~pytest_gsm8k.core.scrub.md_text` or :func:`~pytest_gsm8k.core.scrub.md_code`:
no escape or Markdown syntax of a model's reaches the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_gsm8k.core.gates import GateVerdict
from pytest_gsm8k.core.scrub import md_code, md_text

__all__ = ["LISTED", "QUESTION_CHARS", "cell_code", "gate_table", "problem_list"]

#: problems a list shows before it says how many more there are
LISTED = 50
#: characters of a question shown beside its id
QUESTION_CHARS = 100


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
    title: str, ids: Sequence[str], questions: Mapping[str, str], rest: str
) -> list[str]:
    """``**title (N):**`` and one bullet per problem (its id and the start of its
    question), at most :data:`LISTED`; ``rest`` says where the others are. Nothing
    when ``ids`` is empty."""
    if not ids:
        return []
    lines = [f"**{title} ({len(ids)}):**", ""]
    for pid in ids[:LISTED]:
        text = " ".join(questions.get(pid, "").split())
        if len(text) > QUESTION_CHARS:
            text = text[: QUESTION_CHARS - 3] + "..."
        lines.append(f"- {md_code(pid)}: {md_text(text)}")
    if len(ids) > LISTED:
        lines.append(f"- ... and {len(ids) - LISTED} more ({rest})")
    return [*lines, ""]
