"""README's options table, field by field against the one options definition.

Every option in ``pytest_gsm8k.core.settings.OPTIONS`` has exactly one row whose flag, ini
name and default are the definition's; a row for an option that does not exist fails too.

The default column follows one rule, so a test can check it:

* a default decided at run time (``Option.default`` is None) is its words in ``RUN_TIME``,
  word for word (empty when there is none: the option is off unless given);
* any other default is the value in backquotes (a float without a trailing ``.0``), with
  `` (`X` with `--gsm8k-model=local`)`` added where the local preset changes it
  (``LOCAL_DEFAULTS``); a bool default of False is an empty cell (a flag).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from helpers import REPO

from pytest_gsm8k.core.settings import LOCAL_DEFAULTS, OPTIONS, Option

README = REPO / "README.md"

#: a row of the table: a cell with the flag, then the ini name, the default, the description
_ROW = re.compile(r"^\|\s*`(--[^`]+)`\s*\|")
#: the words of each default decided at run time (``Option.default`` None), by flag
RUN_TIME = {
    "--gsm8k-base-url": "`$OPENAI_BASE_URL`, else OpenAI",
    "--gsm8k-data": "the embedded copy",
    "--gsm8k-dataset": "the embedded copy",
    "--gsm8k-temperature": "0, or 0.7 when sampling",
    "--gsm8k-stop": "completions: `Question:`, `</s>`, `<|im_end|>`, blank line",
    "--gsm8k-cache-dir": "`.pytest_cache/d/gsm8k`",
    "--gsm8k-local-threads": "the CPUs available",
    "--gsm8k-local-ctx": "2048, more if `--gsm8k-max-tokens` needs it",
    "--gsm8k-baseline": "`__snapshots__/gsm8k/<name>.gsm8k`",
    "--gsm8k-baseline-name": "from the protocol",
    "--gsm8k-progress": "on when the output is a terminal",
}


@dataclass(frozen=True)
class Row:
    flag: str
    ini: str
    default: str


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def expected_default(option: Option) -> str:
    """What the table's default column says for ``option``, by the rule above."""
    if option.default is None:
        return RUN_TIME.get(option.flag, "")
    if option.default is False:
        return ""
    text = f"`{_value(option.default)}`"
    local = LOCAL_DEFAULTS.get(option.dest.removeprefix("gsm8k_"))
    if local is not None:
        text += f" (`{_value(local)}` with `--gsm8k-model=local`)"
    return text


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row; ``\\|`` is a pipe inside a cell."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def options_table(text: str) -> list[Row]:
    """The rows of the table under ``## Options`` (the section ends at the next heading)."""
    section = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if _ROW.match(line):
            flag, ini, default = _cells(line)[:3]
            rows.append(Row(flag.strip("`"), ini.strip("`"), default))
    return rows


def problems(rows: list[Row], options: tuple[Option, ...] = OPTIONS) -> list[str]:
    """Every way the rows differ from ``options``, one line each (empty: they agree)."""
    found: list[str] = []
    by_flag = {o.flag: o for o in options}
    seen: dict[str, int] = {}
    for row in rows:
        seen[row.flag] = seen.get(row.flag, 0) + 1
        option = by_flag.get(row.flag)
        if option is None:
            found.append(f"{row.flag}: a row for an option that does not exist")
            continue
        if row.ini != option.dest:
            found.append(f"{row.flag}: ini {row.ini!r}, the option's twin is {option.dest!r}")
        if row.default != (expected := expected_default(option)):
            found.append(f"{row.flag}: default {row.default!r}, expected {expected!r}")
    found += [f"{flag}: {n} rows" for flag, n in seen.items() if n > 1]
    found += [f"{o.flag}: no row" for o in options if o.flag not in seen]
    return found


def test_the_readme_table_is_the_options_definition() -> None:
    rows = options_table(README.read_text())
    assert problems(rows) == []
    assert len(rows) == len(OPTIONS)
    # words stand only for a default decided at run time, never for a real one
    assert set(RUN_TIME) <= {o.flag for o in OPTIONS if o.default is None}


def _mutated(text: str, flag: str, edit: str) -> str:
    lines = text.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith(f"| `{flag}` |")]
    if edit == "drop":
        del lines[i]
    elif edit == "twice":
        lines.insert(i, lines[i])
    elif edit == "unknown":
        lines.insert(i, lines[i].replace(flag, "--gsm8k-no-such-option", 1))
    elif edit == "ini":
        lines[i] = lines[i].replace("` | `gsm8k_", "` | `gsm8k_x_", 1)
    elif edit.startswith("default"):  # "default" writes `7`, "default:TEXT" writes TEXT
        cells = _cells(lines[i])
        cell = edit.partition(":")[2] if ":" in edit else "`7`"
        lines[i] = "| " + " | ".join([*cells[:2], cell, *cells[3:]]) + " |"
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("flag", "edit", "message"),
    [
        ("--gsm8k-min-acc", "drop", "--gsm8k-min-acc: no row"),
        ("--gsm8k-seed", "twice", "--gsm8k-seed: 2 rows"),
        ("--gsm8k-html", "unknown", "--gsm8k-no-such-option: a row for an option that does not"),
        ("--gsm8k-split", "ini", "--gsm8k-split: ini 'gsm8k_x_split'"),
        ("--gsm8k-shots", "default", "--gsm8k-shots: default '`7`', expected '`0` (`5` with"),
        ("--gsm8k-data", "default", "--gsm8k-data: default '`7`', expected 'the embedded copy'"),
        ("--gsm8k-no-cache", "default", "--gsm8k-no-cache: default '`7`', expected ''"),
        # an option off unless given said to be on; a run-time default's words lost or changed
        ("--gsm8k-early-stop", "default:`certain`", "--gsm8k-early-stop: default '`certain`'"),
        ("--gsm8k-data", "default:", "--gsm8k-data: default '', expected 'the embedded copy'"),
        ("--gsm8k-temperature", "default:0.7", "--gsm8k-temperature: default '0.7', expected"),
    ],
)
def test_a_table_that_drifts_is_named(flag: str, edit: str, message: str) -> None:
    found = problems(options_table(_mutated(README.read_text(), flag, edit)))
    assert any(line.startswith(message) for line in found), found


def test_an_option_added_without_a_row_is_named() -> None:
    extra = Option("brand-new", "str", "an option nobody documented")
    rows = options_table(README.read_text())
    assert problems(rows, (*OPTIONS, extra)) == ["--gsm8k-brand-new: no row"]


def test_a_pipe_inside_a_cell_is_part_of_it() -> None:
    assert _cells(r"| `--x` | `x` | `a\|b` | it |") == ["`--x`", "`x`", "`a|b`", "it"]
