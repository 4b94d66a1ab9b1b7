"""--gsm8k-config PATH: a config file, a folder of them, or a vLLM list file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gsm8k.core.vllm_config import ConfigError
from pytest_gsm8k.runtime.configs import load

BODY = "model_name: m-{n}\naccuracy_threshold: 0.5\nnum_questions: 3\nnum_fewshot: 0\n"


def _write(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text(BODY.format(n=path.stem), encoding="utf-8")
    return path


def test_file_folder_and_list(tmp_path: Path) -> None:
    for name in ("b.yaml", "a.yml", "c.yaml"):
        _write(tmp_path, name)
    (tmp_path / "notes.md").write_text("not a config", encoding="utf-8")
    assert [c.name for c in load(str(tmp_path / "b.yaml"))] == ["b"]
    assert [c.name for c in load(str(tmp_path))] == ["a", "b", "c"]
    listing = tmp_path / "models-small.txt"
    listing.write_text("# order matters\nc.yaml\nb.yaml\n", encoding="utf-8")
    configs = load(str(listing))
    assert [(c.name, c.model_name) for c in configs] == [("c", "m-c"), ("b", "m-b")]


def test_a_missing_listed_config_names_its_line(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml")
    listing = tmp_path / "models.txt"
    listing.write_text("a.yaml\ngone.yaml\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"models\.txt:2: no config file .*gone\.yaml"):
        load(str(listing))


def test_same_name_twice_and_empty_folder(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml")
    _write(tmp_path, "a.yml")
    with pytest.raises(ConfigError, match="two configs are named 'a'"):
        load(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"holds no \.yaml config"):
        load(str(empty))
    with pytest.raises(ConfigError, match="no such file or folder"):
        load(str(tmp_path / "nope"))


def test_a_file_name_is_a_name_fit_for_one_line(tmp_path: Path) -> None:
    """Issue 31, case 18: a config's name (its file's stem) is in every item id, gate name
    and output: escaped once, where it is read (core.scrub.printable), so a newline, an
    escape or a right-to-left override in a file name forges no line anywhere."""
    evil = tmp_path / "evil\n  gate x: PASS\x1b[2J\r\u202e.yaml"
    evil.write_text(BODY.format(n="evil"), encoding="utf-8")
    (config,) = load(str(tmp_path))
    assert config.name == "evil   gate x: PASS\\u202e"
    assert not {"\n", "\r", "\x1b", "\u202e"} & set(config.source)
    # two names that escape alike are one name: refused, not run under one id
    for name in ("a\nb.yaml", "a b.yaml"):
        (tmp_path / name).write_text(BODY.format(n="x"), encoding="utf-8")
    with pytest.raises(ConfigError, match="two configs are named 'a b'"):
        load(str(tmp_path))
