"""GSM8K rows (read by runtime/data.py) as problems: validation, fingerprint, the seeded
subset. Pure. A bad row is reported as ``where:line: what is wrong`` before any request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pytest_gsm8k.core import jsontext
from pytest_gsm8k.core.scoring import gold_number
from pytest_gsm8k.core.types import Problem

HUB_NAME = "openai/gsm8k"
TEST_SIZE = 1319  # rows in the official main test split (Cobbe et al. 2021)


class DatasetError(Exception):
    """A one-line, user-facing problem with the data (file, line, what)."""


@dataclass(frozen=True)
class Split:
    """A loaded split plus what identifies it in reports and baselines."""

    name: str  # "openai/gsm8k" or the local file/folder
    config: str
    split: str
    problems: tuple[Problem, ...]
    fingerprint: str

    def identity(self) -> dict[str, Any]:
        identity = {"name": self.name, "config": self.config, "split": self.split}
        return {**identity, "rows": len(self.problems), "fingerprint": self.fingerprint}


def fingerprint(rows: Iterable[tuple[str, str]]) -> str:
    """Content hash of (question, answer) pairs, order included: detects edited data."""
    text = "".join(f"{question}\x00{answer}\x01" for question, answer in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _problem(index: int, split: str, row: Any, where: str) -> Problem:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object with 'question' and 'answer'")
    for key in ("question", "answer"):
        if not isinstance(value := row.get(key), str) or not value.strip():
            raise DatasetError(f"{where}: missing or empty '{key}'")
        try:
            value.encode()
        except UnicodeEncodeError:  # JSON's \ud800: no hash (fingerprint, prompts) encodes it
            raise DatasetError(f"{where}: '{key}' is not UTF-8 text (a lone surrogate)") from None
    try:
        return Problem(index, split, row["question"], row["answer"], gold_number(row["answer"]))
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None


def parse_jsonl(lines: Iterable[bytes], split: str, where: str) -> tuple[Problem, ...]:
    """Rows of a JSONL byte stream; a bad line is reported as ``where:line``."""
    problems: list[Problem] = []
    for lineno, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{where}:{lineno}: not UTF-8 text ({exc.reason})") from None
        if not line.strip():
            continue
        try:
            row = jsontext.loads(line)
        except jsontext.TooDeep as exc:
            raise DatasetError(f"{where}:{lineno}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}:{lineno}: not valid JSON ({exc.msg})") from None
        problems.append(_problem(len(problems), split, row, f"{where}:{lineno}"))
    if not problems:
        raise DatasetError(f"{where}: no rows")
    return tuple(problems)


def rows_to_problems(rows: Iterable[Any], split: str, where: str) -> tuple[Problem, ...]:
    problems = tuple(_problem(i, split, row, f"{where}: row {i}") for i, row in enumerate(rows))
    if not problems:
        raise DatasetError(f"{where}: no rows")
    return problems


def select(
    problems: tuple[Problem, ...], limit: int | None, seed: int, *, first: bool = False
) -> tuple[Problem, ...]:
    """The seeded subset of size ``limit`` (all problems when None), in split order; with
    ``first``, the first ``limit`` problems instead (an engine's ``--num-questions``). Drawn
    in the order of sha256 of seed and id, not :mod:`random`: ``--gsm8k-limit 50`` picks the
    same problems on every Python version and release, and a limit of 20 is a subset of 50."""
    if limit is None or limit >= len(problems):
        return problems
    if first:
        return problems[:limit]
    order = sorted(problems, key=lambda p: hashlib.sha256(f"{seed}:{p.id}".encode()).digest())
    chosen = {p.index for p in order[:limit]}
    return tuple(p for p in problems if p.index in chosen)
