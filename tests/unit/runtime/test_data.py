"""Loading the data (pytest_gsm8k.runtime.data): the embedded copy, files, the hub layout.

No pytest glue: each bad input must be a :class:`DatasetError` whose
one-line message names the file, the line and what is wrong. The ``datasets`` path
is exercised on a folder laid out like the hub repository, built in a tmp dir with pyarrow
from the embedded copy; the file tests read files unpacked from it into a tmp dir.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from gsm8k_copy import data_dir

from pytest_gsm8k.core.dataset import (
    TEST_SIZE,
    DatasetError,
    Split,
)
from pytest_gsm8k.runtime.data import EMBEDDED, EMBEDDED_NAME, load_split

#: Pinned: baselines and reports name the data by this; it must not drift between releases.
SHARED_TEST_FINGERPRINT = "7573bc2082847ca0"
DATA = data_dir()


@pytest.fixture(scope="module")
def loaded_split() -> Split:
    return load_split(str(DATA), "test", "main")


def rows(n: int = 3) -> list[dict[str, str]]:
    lines = (DATA / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items)
    path.write_text(text, encoding="utf-8")
    return path


def error_of(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(DatasetError) as info:
        load_split(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# -- the embedded copy ----------------------------------------------------------------


def test_embedded_copy_is_the_default_and_equals_the_files(loaded_split: Split) -> None:
    embedded = load_split(None, "test", "main")
    assert embedded.name == EMBEDDED_NAME == "embedded openai/gsm8k"
    assert embedded.fingerprint == loaded_split.fingerprint == SHARED_TEST_FINGERPRINT
    assert embedded.problems == loaded_split.problems
    train = load_split(None, "train", "main")
    assert len(train.problems) == 7473
    assert train.fingerprint == load_split(str(DATA), "train", "main").fingerprint
    socratic = load_split(None, "test", "socratic")
    assert socratic.fingerprint == load_split(str(DATA), "test", "socratic").fingerprint
    assert socratic.fingerprint != embedded.fingerprint


def test_embedded_copy_is_checked_against_its_pinned_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load_split(None, "test", "main")  # read once a process: a wrong pin is still refused after
    monkeypatch.setitem(EMBEDDED, ("main", "test"), "0" * 64)
    message = error_of(None, "test", "main")
    assert "embedded openai/gsm8k main/test" in message
    assert "expected 000000000000" in message
    assert "reinstall pytest-gsm8k" in message


def test_embedded_copy_has_no_socratic_train() -> None:
    message = error_of(None, "train", "socratic")
    assert "socratic/train" in message
    assert "--gsm8k-data" in message


def test_hub_layout_through_datasets_has_the_embedded_fingerprint(
    hub_folder: Path, hf_cache: Path
) -> None:
    """The same rows through the real ``datasets.load_dataset(NAME, "main")`` call the hub
    path makes, on a local folder laid out like the hub repository (README configs)."""
    split = load_split(None, "test", "main", hub_name=str(hub_folder))
    assert split.name == str(hub_folder)
    assert (
        split.fingerprint == load_split(None, "test", "main").fingerprint == SHARED_TEST_FINGERPRINT
    )
    assert split.problems == load_split(None, "test", "main").problems
    assert any(hf_cache.rglob("*.arrow"))


# -- files -----------------------------------------------------------------------------


def test_shared_folder_loads_the_official_test_split(loaded_split: Split) -> None:
    assert len(loaded_split.problems) == TEST_SIZE == 1319
    assert loaded_split.name.endswith("test.jsonl")
    assert (loaded_split.config, loaded_split.split) == ("main", "test")
    first = loaded_split.problems[0]
    assert first.index == 0
    assert first.id == "test-0000"
    assert first.gold == Decimal(18)
    assert [p.index for p in loaded_split.problems] == list(range(1319))
    assert loaded_split.problems[42].id == "test-0042"
    assert all(isinstance(p.gold, Decimal) for p in loaded_split.problems)
    assert loaded_split.fingerprint == SHARED_TEST_FINGERPRINT
    assert loaded_split.identity() == {
        "name": loaded_split.name,
        "config": "main",
        "split": "test",
        "rows": 1319,
        "fingerprint": SHARED_TEST_FINGERPRINT,
    }


def test_train_split_and_socratic_config(loaded_split: Split) -> None:
    train = load_split(str(DATA), "train", "main")
    assert len(train.problems) == 7473
    assert train.problems[0].id == "train-0000"
    assert train.fingerprint != loaded_split.fingerprint
    socratic = load_split(str(DATA), "test", "socratic")
    assert socratic.name.endswith("test_socratic.jsonl")
    assert len(socratic.problems) == 1319
    assert [p.gold for p in socratic.problems] == [p.gold for p in loaded_split.problems]
    assert socratic.fingerprint != loaded_split.fingerprint


def test_a_users_own_file_is_not_size_checked(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mine.jsonl", rows(3))
    split = load_split(str(path), "test", "main")
    assert len(split.problems) == 3
    assert split.name == str(path)


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    good = rows(2)
    path = write_jsonl(tmp_path / "gaps.jsonl", [good[0], "", "   ", good[1]])
    assert [p.index for p in load_split(str(path), "test", "main").problems] == [0, 1]
    write_jsonl(path, [good[0], "", good[1], '{"question": '])
    assert error_of(str(path), "test", "main").startswith(f"{path}:4: not valid JSON")


def test_crlf_and_bom_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "windows.jsonl"
    text = "\r\n".join(json.dumps(r) for r in rows(3)) + "\r\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    split = load_split(str(path), "test", "main")
    assert [p.question for p in split.problems] == [r["question"] for r in rows(3)]


# -- bad files: one line naming file, line and problem -------------------------------


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"question": "x", ', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"answer": "#### 4"}', "missing or empty 'question'"),
        ('{"question": "  ", "answer": "#### 4"}', "missing or empty 'question'"),
        ('{"question": "q"}', "missing or empty 'answer'"),
        ('{"question": "q", "answer": 4}', "missing or empty 'answer'"),
        ('{"question": "q", "answer": "it is 4"}', "####"),
        ('{"question": "q", "answer": "#### four"}', "four"),
        # JSON's \ud800 escape: a lone surrogate the fingerprint cannot encode (was a traceback)
        ('{"question": "q \\ud800", "answer": "#### 4"}', "'question' is not UTF-8 text"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [*rows(2), line, rows(3)[2]])
    message = error_of(str(path), "test", "main")
    assert message.startswith(f"{path}:3: "), message
    assert needle in message


def test_non_utf8_line_is_a_dataset_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        json.dumps(rows(1)[0]).encode()
        + b"\n"
        + '{"question": "caf\u00e9", "answer": "#### 1"}\n'.encode("latin-1")
    )
    message = error_of(str(path), "test", "main")
    assert message.startswith(f"{path}:2: ")
    assert "UTF-8" in message


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    assert error_of(str(path), "test", "main") == f"{path}: no rows"


def test_missing_path_and_folder_without_split(tmp_path: Path) -> None:
    message = error_of(str(tmp_path / "nope.jsonl"), "test", "main")
    assert "--gsm8k-data" in message
    assert "nope.jsonl" in message
    write_jsonl(tmp_path / "folder" / "train.jsonl", rows(3))
    message = error_of(str(tmp_path / "folder"), "test", "main")
    assert "--gsm8k-data" in message
    assert "test.jsonl" in message
    assert "main/test-*.parquet" in message


def test_official_test_split_must_have_1319_rows(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "short" / "test.jsonl", rows(5))
    message = error_of(str(tmp_path / "short"), "test", "main")
    assert str(tmp_path / "short" / "test.jsonl") in message
    assert "1319" in message
    assert "5" in message
    write_jsonl(tmp_path / "short" / "train.jsonl", rows(5))
    assert (
        len(load_split(str(tmp_path / "short"), "train", "main").problems) == 5
    )  # train: any size


def test_unknown_config() -> None:
    message = error_of(str(DATA), "test", "mian")
    assert "--gsm8k-dataset-config" in message
    assert "mian" in message


def test_hub_failure_points_at_a_local_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    text = "Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nsecond line"

    def offline(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError(text)

    monkeypatch.setattr(datasets, "load_dataset", offline)
    message = error_of(None, "test", "main", hub_name="openai/gsm8k")
    assert "openai/gsm8k" in message
    assert "--gsm8k-data" in message
    assert "second line" not in message
    text = ""  # an error without words is named by its type alone, as before the one loader
    assert "with datasets (ConnectionError); offline" in error_of(
        None, "test", "main", hub_name="openai/gsm8k"
    )


def test_hub_rows_are_validated_and_size_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    calls: list[tuple[Any, ...]] = []

    def fake(*args: Any, **kwargs: Any) -> Any:
        calls.append((*args, kwargs.get("split")))
        return rows(3)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    split = load_split(None, "train", "main", hub_name="openai/gsm8k")
    assert calls == [("openai/gsm8k", "main", "train")]
    assert split.name == "openai/gsm8k"
    assert len(split.problems) == 3
    assert "1319" in error_of(None, "test", "main", hub_name="openai/gsm8k")


# -- the datasets path: a folder laid out like the hub repository ------------------------


def test_hub_layout_folder_matches_jsonl(
    hub_folder: Path, hf_cache: Path, loaded_split: Split
) -> None:
    split = load_split(str(hub_folder), "test", "main")
    assert len(split.problems) == 1319
    assert split.fingerprint == loaded_split.fingerprint == SHARED_TEST_FINGERPRINT
    assert [p.gold for p in split.problems] == [p.gold for p in loaded_split.problems]
    assert split.problems == loaded_split.problems
    train = load_split(str(hub_folder), "train", "main")
    assert len(train.problems) == 7473
    assert train.fingerprint == load_split(str(DATA), "train", "main").fingerprint
    assert any(hf_cache.rglob("*.arrow"))  # went through datasets, into the test's cache


def test_single_parquet_file_and_bad_parquet(
    hub_folder: Path, hf_cache: Path, tmp_path: Path
) -> None:
    one = load_split(str(hub_folder / "main" / "test-00000-of-00001.parquet"), "test", "main")
    assert len(one.problems) == 1319
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file at all")
    message = error_of(str(bad), "test", "main")
    assert str(bad) in message
    assert "cannot read parquet" in message


def test_parquet_row_errors_name_the_row(hf_cache: Path, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    good = rows(2)
    path = tmp_path / "rows.parquet"
    pq.write_table(
        pa.table(
            {
                "question": [good[0]["question"], good[1]["question"]],
                "answer": [good[0]["answer"], "no hashes"],
            }
        ),
        path,
    )
    message = error_of(str(path), "test", "main")
    assert str(path) in message
    assert "row 1" in message
    assert "####" in message
