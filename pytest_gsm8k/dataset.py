"""Loading and validating GSM8K splits.

Local JSONL is parsed here directly (no ``datasets`` import: it costs a
second and ~100 MB per process, and every xdist worker loads the split).
``datasets`` is imported only for the hub and for parquet folders laid out
like the hub repository. Every row is validated before any request is sent,
and a bad row is reported as ``file:line: what is wrong``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gsm8k.scoring import gold_number
from pytest_gsm8k.types import Problem

HUB_NAME = "openai/gsm8k"
TEST_SIZE = 1319  # rows in the official main test split (Cobbe et al. 2021)
CONFIGS = ("main", "socratic")


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
        return {
            "name": self.name,
            "config": self.config,
            "split": self.split,
            "rows": len(self.problems),
            "fingerprint": self.fingerprint,
        }


def fingerprint(rows: Iterable[tuple[str, str]]) -> str:
    """Content hash of (question, answer) pairs, order included: detects edited data."""
    digest = hashlib.sha256()
    for question, answer in rows:
        digest.update(question.encode("utf-8"))
        digest.update(b"\x00")
        digest.update(answer.encode("utf-8"))
        digest.update(b"\x01")
    return digest.hexdigest()[:16]


def _problem(index: int, split: str, row: Any, where: str) -> Problem:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object with 'question' and 'answer'")
    for key in ("question", "answer"):
        value = row.get(key)
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f"{where}: missing or empty '{key}'")
    try:
        gold = gold_number(row["answer"])
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    return Problem(
        index=index, split=split, question=row["question"], answer=row["answer"], gold=gold
    )


def _read_jsonl(path: Path, split: str) -> list[Problem]:
    problems: list[Problem] = []
    try:
        handle = path.open("rb")  # decoded line by line, so a bad byte names its line
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            problems.append(_problem(len(problems), split, row, f"{path}:{lineno}"))
    if not problems:
        raise DatasetError(f"{path}: no rows")
    return problems


def _rows_to_problems(rows: Iterable[Any], split: str, where: str) -> list[Problem]:
    problems = [
        _problem(i, split, row, f"{where}: row {i}") for i, row in enumerate(rows)
    ]
    if not problems:
        raise DatasetError(f"{where}: no rows")
    return problems


def _read_parquet(files: list[Path], split: str, where: str) -> list[Problem]:
    """Parquet through ``datasets`` (the same code path as the hub download)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a hard dependency
        raise DatasetError("reading parquet needs the 'datasets' package") from None
    try:
        ds = datasets.load_dataset(
            "parquet", data_files={split: [str(f) for f in files]}, split=split
        )
    except Exception as exc:  # datasets raises many types; the user needs the one line
        raise DatasetError(f"{where}: cannot read parquet ({type(exc).__name__}: {exc})") from None
    return _rows_to_problems(iter(ds), split, where)


def _hub_files(folder: Path, config: str, split: str) -> list[Path]:
    return sorted((folder / config).glob(f"{split}-*.parquet"))


def _load_hub(name: str, config: str, split: str) -> list[Problem]:
    try:
        import datasets
    except ImportError:  # pragma: no cover
        raise DatasetError("loading from the hub needs the 'datasets' package") from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(
            f"cannot load {name} ({config}/{split}) with datasets: {first}; "
            "offline, point --gsm8k-data at a local copy (a folder with test.jsonl/train.jsonl)"
        ) from None
    return _rows_to_problems(iter(ds), split, f"{name} {config}/{split}")


def load_split(
    data: str | None,
    split: str = "test",
    config: str = "main",
    hub_name: str = HUB_NAME,
) -> Split:
    """Load one split from the hub (``data`` None), a file, or a folder.

    A folder may hold ``<split>.jsonl`` (the openai/grade-school-math layout,
    ``<split>_socratic.jsonl`` for the socratic config) or be laid out like
    the hub repository (``<config>/<split>-*.parquet``).
    """
    if config not in CONFIGS:
        raise DatasetError(f"--gsm8k-config: unknown config {config!r} (expected main or socratic)")
    check_size = split == "test" and config == "main"
    if data is None:
        name = hub_name
        problems = _load_hub(hub_name, config, split)
    else:
        path = Path(data).expanduser()
        name = str(path)
        if path.is_dir():
            jsonl = path / (f"{split}.jsonl" if config == "main" else f"{split}_socratic.jsonl")
            hub = _hub_files(path, config, split)
            if jsonl.is_file():
                problems = _read_jsonl(jsonl, split)
                name = str(jsonl)
            elif hub:
                problems = _read_parquet(hub, split, str(path / config))
            else:
                raise DatasetError(
                    f"--gsm8k-data {path}: no {jsonl.name} and no {config}/{split}-*.parquet in it"
                )
        elif path.is_file():
            check_size = False  # a user's own file: named in the report, not the official split
            if path.suffix == ".parquet":
                problems = _read_parquet([path], split, str(path))
            else:
                problems = _read_jsonl(path, split)
        else:
            raise DatasetError(f"--gsm8k-data {path}: no such file or folder")
    if check_size and len(problems) != TEST_SIZE:
        raise DatasetError(
            f"{name}: the GSM8K main test split has {TEST_SIZE} rows, this has {len(problems)}"
        )
    fp = fingerprint((p.question, p.answer) for p in problems)
    return Split(name=name, config=config, split=split, problems=tuple(problems), fingerprint=fp)


def train_source(data: str | None) -> str | None:
    """Where few-shot exemplars come from: the train split beside the evaluated data.

    A folder holds its own ``train.jsonl`` (or hub layout); for a single file
    the ``train.jsonl`` next to it is used; otherwise the hub. Never the
    evaluated file itself: exemplars must not come from test.
    """
    if data is None:
        return None
    path = Path(data).expanduser()
    if path.is_dir():
        return str(path)
    sibling = path.parent / "train.jsonl"
    if sibling.is_file() and sibling.resolve() != path.resolve():
        return str(sibling)
    raise DatasetError(
        f"--gsm8k-shots: no train.jsonl next to {path} to draw exemplars from; "
        "use --gsm8k-fewshot-file"
    )


def subset_order(problems: Iterable[Problem], seed: int) -> Iterator[Problem]:
    """Problems in a seeded, stable pseudo-random order.

    The order comes from sha256 of seed and problem id, not from
    :mod:`random`, so ``--gsm8k-limit 50`` picks the same problems on every
    Python version and release, and a limit of 20 is a subset of a limit of 50.
    """

    def key(p: Problem) -> str:
        return hashlib.sha256(f"{seed}:{p.id}".encode()).hexdigest()

    return iter(sorted(problems, key=key))


def select(problems: tuple[Problem, ...], limit: int | None, seed: int) -> tuple[Problem, ...]:
    """The seeded subset of size ``limit`` (all problems when None), in split order."""
    if limit is None or limit >= len(problems):
        return problems
    chosen = {p.index for _, p in zip(range(limit), subset_order(problems, seed), strict=False)}
    return tuple(p for p in problems if p.index in chosen)
