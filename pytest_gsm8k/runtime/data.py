"""Where GSM8K rows come from: the embedded copy (default), a local file or folder, or a
dataset on the Hugging Face hub. JSONL is parsed here: ``datasets`` (slow to import, large in
memory, loaded by every xdist worker) only reads the hub and parquet files."""

from __future__ import annotations

import functools
import hashlib
import lzma
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_gsm8k.core.dataset import (
    HUB_NAME,
    TEST_SIZE,
    DatasetError,
    Split,
    fingerprint,
    parse_jsonl,
    rows_to_problems,
)
from pytest_gsm8k.core.settings import DATASET_CONFIGS
from pytest_gsm8k.core.types import Problem

#: (config, split) -> sha256 of the uncompressed JSONL in pytest_gsm8k/data/CONFIG-SPLIT.jsonl.xz:
#: those of openai/grade-school-math's grade_school_math/data files (MIT licence,
#: pytest_gsm8k/data/LICENSE); the hub's openai/gsm8k parquet holds the same rows.
EMBEDDED = {
    ("main", "test"): "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    ("main", "train"): "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    ("socratic", "test"): "c96673362fa7a699f4836a9b6474a067448f95fe58064727501ee63ba4c3fdb6",
}
EMBEDDED_NAME = f"embedded {HUB_NAME}"


@functools.cache  # once a process, by pin: pytester runs pytest in one again and again (30 ms)
def _read_embedded(config: str, split: str, pinned: str | None) -> tuple[Problem, ...]:
    """The copy inside the package, checked against its pinned sha256: every machine scores
    the same bytes, with no hub and no network."""
    if pinned is None:
        have = ", ".join(f"{c}/{s}" for c, s in EMBEDDED)
        raise DatasetError(
            f"the embedded GSM8K copy has no {config}/{split} split (it has {have}); "
            "use --gsm8k-data PATH or --gsm8k-dataset NAME"
        )
    filename = f"{config}-{split}.jsonl.xz"
    where = f"embedded {HUB_NAME} {config}/{split}"
    try:
        raw = lzma.decompress((resources.files("pytest_gsm8k") / "data" / filename).read_bytes())
    except (OSError, lzma.LZMAError) as exc:
        raise DatasetError(
            f"{where}: cannot read pytest_gsm8k/data/{filename} ({exc}); reinstall pytest-gsm8k"
        ) from None
    if (digest := hashlib.sha256(raw).hexdigest()) != pinned:
        raise DatasetError(
            f"{where}: pytest_gsm8k/data/{filename} has sha256 {digest[:12]}..., "
            f"expected {pinned[:12]}...; reinstall pytest-gsm8k"
        )
    return parse_jsonl(raw.splitlines(keepends=True), split, where)


def _load_dataset(
    what: str, where: str, failed: str, then: str, split: str, *args: Any, **kwargs: Any
) -> tuple[Problem, ...]:
    """Rows through ``datasets``, the hub's and parquet files' alike. It is the ``hub`` extra
    (some 250 MB no other run needs): ``what`` needs it, one line when it is missing. Any
    failure (datasets raises many types) is one line: ``failed`` (the error) ``then``."""
    try:
        import datasets
    except ImportError:
        from pytest_gsm8k.runtime.local import install_hint

        raise DatasetError(
            f"{what} needs the 'datasets' package, in the 'hub' extra: {install_hint('hub')}"
        ) from None
    try:
        ds = datasets.load_dataset(*args, split=split, **kwargs)
    except Exception as exc:
        kind, first = type(exc).__name__, (str(exc).strip().splitlines() or [""])[0]
        raise DatasetError(f"{failed} ({f'{kind}: {first}' if first else kind}){then}") from None
    return rows_to_problems(iter(ds), split, where)


def load_split(data: str | None, split: str, config: str, hub_name: str | None = None) -> Split:
    """One split: the embedded copy (the default), ``hub_name`` on the hub, or ``data``, a
    file or a folder holding ``<split>.jsonl`` (``<split>_socratic.jsonl``; the layout of
    openai/grade-school-math) or laid out like the hub (``<config>/<split>-*.parquet``)."""
    if config not in DATASET_CONFIGS:
        raise DatasetError(
            f"--gsm8k-dataset-config: unknown config {config!r} (expected main or socratic)"
        )
    official = split == "test" and config == "main"  # its size is known
    if data is not None:
        path = Path(data).expanduser()
        option = "--gsm8k-fewshot-file" if split == "fewshot" else "--gsm8k-data"
        name, parquet = str(path), [path] if path.suffix == ".parquet" else []
        try:
            is_dir, is_file = path.is_dir(), path.is_file()
        except OSError as exc:  # a name the file system cannot hold (ENAMETOOLONG)
            raise DatasetError(f"{option} {path!s:.200}: cannot read ({exc.strerror})") from None
        if is_dir:
            jsonl = path / (f"{split}.jsonl" if config == "main" else f"{split}_socratic.jsonl")
            parquet = [] if jsonl.is_file() else sorted((path / config).glob(f"{split}-*.parquet"))
            if not (parquet or jsonl.is_file()):
                raise DatasetError(
                    f"{option} {path}: no {jsonl.name} and no {config}/{split}-*.parquet in it"
                )
            name, path = (name, path / config) if parquet else (str(jsonl), jsonl)
        elif is_file:
            official = False  # a user's own file: named in the report, not the official split
        else:
            raise DatasetError(f"{option} {path}: no such file or folder")
        if parquet:
            files = {split: [str(f) for f in parquet]}
            failed = f"{path}: cannot read parquet"
            problems = _load_dataset(
                "reading parquet", str(path), failed, "", split, "parquet", data_files=files
            )
        else:
            try:
                handle = path.open("rb")  # decoded line by line, so a bad byte names its line
            except OSError as exc:
                raise DatasetError(f"{path}: cannot read ({exc.strerror})") from None
            with handle:
                problems = parse_jsonl(handle, split, str(path))
    elif hub_name is None:
        pinned = EMBEDDED.get((config, split))
        name, problems = EMBEDDED_NAME, _read_embedded(config, split, pinned)
    else:
        name, where = hub_name, f"{hub_name} {config}/{split}"
        failed = f"cannot load {hub_name} ({config}/{split}) with datasets"
        offline = (
            "; offline, leave out --gsm8k-dataset (the embedded copy) or point --gsm8k-data at "
            "a local copy"
        )
        what = f"--gsm8k-dataset {hub_name}"
        problems = _load_dataset(what, where, failed, offline, split, hub_name, config)
    if official and len(problems) != TEST_SIZE:
        raise DatasetError(
            f"{name}: the GSM8K main test split has {TEST_SIZE} rows, this has {len(problems)}"
        )
    fp = fingerprint((p.question, p.answer) for p in problems)
    return Split(name=name, config=config, split=split, problems=problems, fingerprint=fp)


def train_source(data: str | None) -> str | None:
    """Where few-shot exemplars come from: the folder ``data`` is, the ``train.jsonl`` beside
    a file (never the evaluated file itself: exemplars must not come from test), or None for
    the embedded copy or the hub dataset."""
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
