"""--gsm8k-config PATH: a config file, a folder of them, or a vLLM list file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: _write(d, "Bad.YAML"),
            r"Bad\.YAML: a config's name must end in \.yaml or \.yml",
        ),
        (lambda d: (d / "gone.yaml").symlink_to(d / "nowhere.yaml"), r"gone\.yaml: a broken link"),
        (lambda d: (d / "loop.yaml").symlink_to(d / "loop.yaml"), r"loop\.yaml: a broken link"),
        (lambda d: (d / "x.yaml").mkdir(), r"x\.yaml: not a file"),
        (lambda d: (d / "link").symlink_to(d / "nowhere"), r"link: a broken link"),
    ],
    ids=["suffix-case", "dangling-link", "link-loop", "folder", "dangling-any-name"],
)
def test_a_folder_entry_that_is_not_a_config_file_is_refused_by_name(
    tmp_path: Path, make: Any, message: str
) -> None:
    """Rule: a config folder never shrinks unseen: an entry that looks meant as a config
    but cannot be read as one (a suffix in capitals, a broken link, a folder named x.yaml)
    is refused by name, not skipped ("1 of 1 pass" with four configs in the folder)."""
    _write(tmp_path, "good.yaml")
    (tmp_path / "models-ci.txt").write_text("good.yaml\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("kept: not a config", encoding="utf-8")
    assert [c.name for c in load(str(tmp_path))] == ["good"]
    make(tmp_path)
    with pytest.raises(ConfigError, match=message) as caught:
        load(str(tmp_path))
    assert "\n" not in str(caught.value)


def test_a_config_file_named_with_capitals_is_refused_not_read_as_a_list(tmp_path: Path) -> None:
    path = _write(tmp_path, "Bad.YML")
    with pytest.raises(ConfigError, match=r"Bad\.YML: a config's name must end in \.yaml or \.yml"):
        load(str(path))


def test_a_name_too_long_is_one_line_shown_cut_short(tmp_path: Path) -> None:
    """Rule: a user's value is never printed unbounded, and never a traceback."""
    listing = tmp_path / "models.txt"
    listing.write_text("a" * 5000 + ".yaml\n", encoding="utf-8")
    for path in (listing, tmp_path / ("b" * 5000)):
        with pytest.raises(ConfigError) as caught:
            load(str(path))
        assert len(str(caught.value)) < 300 + len(str(tmp_path)), str(caught.value)[:400]


def test_a_long_path_in_a_message_keeps_the_file_name_at_its_end(tmp_path: Path) -> None:
    """Rule: a message names the file that is wrong. A name (a path, a listed file) too long
    to show whole is cut in its middle: a CI checkout's path to vLLM's configs passes 60
    characters, and cutting its end dropped the file's name ("configs/Met...")."""
    deep = tmp_path / ("d" * 80) / "Meta-Llama-3-8B-Instruct.yaml"
    with pytest.raises(ConfigError) as caught:
        load(str(deep))
    message = str(caught.value)
    shown = r"--gsm8k-config /\S+\.\.\.\S*-8B-Instruct\.yaml: no such file or folder"
    assert re.fullmatch(shown, message), message
    assert len(message) < 120, message
    listing = tmp_path / "models.txt"
    listing.write_text("Qwen-" + "q" * 70 + "-FP8.yaml\n", encoding="utf-8")
    listed = r"models\.txt:1: no config file Qwen-q+\.\.\.q+-FP8\.yaml$"
    with pytest.raises(ConfigError, match=listed):
        load(str(listing))
