"""Unit tests for pytest_gsm8k.core.scoring (answer extraction and comparison)."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from decimal import Decimal

import pytest
from gsm8k_copy import data_dir

from pytest_gsm8k.core import scoring
from pytest_gsm8k.core.scoring import (
    RULES,
    STRICT_PATTERN,
    TOLERANCE,
    SampleScore,
    format_number,
    gold_number,
    majority_vote,
    numbers_equal,
    parse_number,
    score_text,
    strip_reasoning,
)
from pytest_gsm8k.core.settings import SettingsError, build_settings

DATA_DIR = data_dir()
D = Decimal


def extract(text: str, rule: str, pattern: re.Pattern[str] | None = None) -> Decimal | None:
    """What ``rule`` extracts from ``text``, through :func:`score_text` as every run scores."""
    return score_text(text, D(0), pattern).extracted[rule]


# --------------------------------------------------------------------------- constants


def test_rules_and_strict_pattern_are_the_documented_ones() -> None:
    assert RULES == ("strict", "answer-is", "boxed", "flexible", "last-int")
    assert tuple(score_text("", D(0)).extracted) == RULES  # every rule scored, in this order
    assert STRICT_PATTERN == r"####\s*(-?[\d,]+(?:\.\d+)?)"
    assert D("1e-6") == TOLERANCE


# --------------------------------------------------------------------------- parse_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("18", "18"),
        ("18.00", "18"),
        ("18.0", "18"),
        ("  18  ", "18"),
        ("18.", "18"),
        ("$18", "18"),
        ("$1,800", "1800"),
        ("$1,800.", "1800"),
        ("1,000", "1000"),
        ("1000", "1000"),
        ("1000.0", "1000"),
        ("$1,000", "1000"),
        ("1,450,000", "1450000"),
        ("-3", "-3"),
        ("\u22123", "-3"),
        ("-$3", "-3"),
        ("$-3", "-3"),
        ("50%", "50"),
        ("50%.", "50"),
        ("12.5%", "12.5"),
        ("0.5", "0.5"),
        (".5", "0.5"),
        ("0.50", "0.5"),
        ("0", "0"),
        ("0.000", "0"),
        ("-0", "0"),
        ("007", "7"),
        ("1.05", "1.05"),
    ],
)
def test_parse_number_accepts(text: str, expected: str) -> None:
    value = parse_number(text)
    assert value is not None
    assert value == D(expected)
    assert format_number(value) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "-",
        "$",
        ".",
        "%",
        "--3",
        "1.5e3",
        "1e6",
        "1/2",
        "12abc",
        "1,,000",
        ",5",
        "5,",
        "1.2.3",
        "1.000,5",
        "NaN",
        "Infinity",
        "3 4",
    ],
)
def test_parse_number_rejects(text: str) -> None:
    assert parse_number(text) is None


def test_parse_number_never_rounds() -> None:
    # 31 significant digits: beyond the default decimal context (28) and far
    # beyond float precision.
    long = "1234567890123456789012345678901.5"
    assert parse_number(long) == D(long)
    assert format_number(parse_number(long)) == long
    # No 5-significant-digit style rounding either.
    assert parse_number("123456") != parse_number("123457")
    assert parse_number("0.1") == D("0.1")  # not the float 0.1000000000000000055...


def test_parse_number_normalises_trailing_zeros_without_exponent() -> None:
    value = parse_number("1000")
    assert value is not None
    assert str(value) == "1000"  # Decimal.normalize() would give "1E+3"
    eighteen = parse_number("18.00")
    assert eighteen is not None
    assert str(eighteen) == "18"


def test_all_spellings_of_one_thousand_are_equal() -> None:
    values = [parse_number(s) for s in ("1,000", "1000", "1000.0", "$1,000", "1,000.00")]
    assert all(numbers_equal(v, D(1000)) for v in values)
    assert len({format_number(v) for v in values}) == 1


# --------------------------------------------------------------------------- strip_reasoning


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no reasoning here", "no reasoning here"),
        ("<think>5 apples</think>#### 7", "#### 7"),
        ("<think>a</think> middle <think>b</think> end", "middle \n end"),
        ("<think>multi\nline\n#### 5\n</think>\n#### 7", "#### 7"),
        ("<THINK>x</THINK>y", "y"),
        # Opening tag stripped by the server: drop up to the last </think>.
        ("thinking about 5</think>#### 7", "#### 7"),
        ("a</think>b</think>#### 7", "#### 7"),
        # Never finished thinking: there is no answer part.
        ("<think>still thinking about 5", ""),
        ("#### 7 <think> but wait, 5", "#### 7"),
        # Orphan close, then an unclosed block.
        ("r</think>#### 7<think>more", "#### 7"),
        ("", ""),
    ],
)
def test_strip_reasoning(text: str, expected: str) -> None:
    assert strip_reasoning(text) == expected


def test_strip_reasoning_does_not_fuse_numbers_around_a_block() -> None:
    assert extract("12<think>x</think>34", "flexible") == D(34)


# --------------------------------------------------------------------------- extract: strict


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so she makes 18 dollars\n#### 18", "18"),
        ("#### 1,800", "1800"),
        ("####-3", "-3"),
        ("#### 18.00", "18"),
        ("#### 2.5", "2.5"),
        ("#### 5\nwait, no\n#### 7", "7"),  # last match wins
        ("The answer is 18", None),
        ("#### abc", None),
        ("", None),
    ],
)
def test_extract_strict(text: str, expected: str | None) -> None:
    result = extract(text, "strict")
    assert result == (None if expected is None else D(expected))


def test_strict_custom_pattern_with_group() -> None:
    pattern = re.compile(r"ANSWER:\s*(\S+)")
    text = "ANSWER: 5\nno, ANSWER: $1,800.\n#### 3"
    assert extract(text, "strict", pattern) == D(1800)
    # The custom pattern replaces the seed rule: "#### 3" is ignored.
    assert extract("#### 3", "strict", pattern) is None


def test_strict_custom_pattern_without_group_uses_whole_match() -> None:
    pattern = re.compile(r"-?\d+(?=\s*apples)")
    assert extract("4 apples and then 9 apples", "strict", pattern) == D(9)


def test_strict_custom_pattern_unparseable_last_match_gives_none() -> None:
    pattern = re.compile(r"ANSWER:\s*(\S+)")
    assert extract("ANSWER: 5 then ANSWER: lots", "strict", pattern) is None


def test_strict_custom_pattern_optional_group_not_taking_part() -> None:
    pattern = re.compile(r"result(?:=(\d+))?")
    assert extract("result=4 result", "strict", pattern) is None
    assert extract("result result=4", "strict", pattern) == D(4)


def test_custom_pattern_only_affects_strict() -> None:
    pattern = re.compile(r"ANSWER:\s*(\d+)")
    text = "ANSWER: 5. The answer is 6. \\boxed{7} and 8"
    assert extract(text, "strict", pattern) == D(5)
    assert extract(text, "answer-is", pattern) == D(6)
    assert extract(text, "boxed", pattern) == D(7)
    assert extract(text, "flexible", pattern) == D(8)


# --------------------------------------------------------------------------- extract: answer-is


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42", "42"),
        ("The answer is $1,800.", "1800"),
        ("answer is: 42", "42"),
        ("The final answer is: 18.00", "18"),
        ("THE FINAL ANSWER IS 7.", "7"),
        ("The answer is **-3**.", "-3"),
        ("So the answer is \u22125.", "-5"),
        ("The answer is $ 18", "18"),
        ("The answer is 42, because 6*7=42", "42"),
        ("The answer is 0.5", "0.5"),
        ("Final answer: 12", "12"),
        ("The answer is 3. Actually, the answer is 4.", "4"),  # last match wins
        ("The answer isn't 5", None),
        ("The answer is a lot", None),
        ("#### 18", None),
    ],
)
def test_extract_answer_is(text: str, expected: str | None) -> None:
    assert extract(text, "answer-is") == (None if expected is None else D(expected))


# --------------------------------------------------------------------------- extract: boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{18}", "18"),
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{\$18}", "18"),
        (r"\boxed{$18}", "18"),
        (r"\boxed{18.00}", "18"),
        (r"\boxed{-3}", "-3"),
        (r"\boxed{18\text{ dollars}}", "18"),
        (r"\boxed{18 \text{dollars}}", "18"),
        (r"\boxed{50\%}", "50"),
        (r"\boxed{50%}", "50"),
        (r"\boxed{1\,000}", "1000"),
        (r"\boxed{1{,}000}", "1000"),
        (r"\boxed{{42}}", "42"),
        (r"\boxed{\text{42}}", "42"),
        (r"$\boxed{\mathbf{12}}$", "12"),
        (r"\boxed{x = 5}", "5"),
        (r"The final answer is $\boxed{ 7 }$.", "7"),
        (r"\boxed{5} and then \boxed{7}", "7"),  # last match wins
        (r"\boxed{5} and then \boxed{7", "5"),  # unclosed (truncated) box ignored
        (r"\boxed{\frac{1}{2}}", None),  # ambiguous: two numbers
        (r"\boxed{}", None),
        (r"\boxed{many}", None),
        ("#### 18", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract(text, "boxed") == (None if expected is None else D(expected))


# --------------------------------------------------------------------------- extract: flexible


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It costs $1,800.", "1800"),
        ("Total: 1,000 apples.", "1000"),
        ("She has 18.00 dollars.", "18"),
        ("The result is -3.", "-3"),
        ("The result is \u22127", "-7"),
        ("5 - 3 = 2", "2"),
        ("5-3", "3"),  # a minus after a digit is subtraction, not a sign
        ("first 5, then 7, finally 12.", "12"),  # last match wins
        ("the values 1,2,3", "3"),  # not a thousands group: separate numbers
        ("from 10 to 1,000,000", "1000000"),
        ("pi is about 3.14.", "3.14"),
        ("no digits at all", None),
        ("", None),
    ],
)
def test_extract_flexible(text: str, expected: str | None) -> None:
    assert extract(text, "flexible") == (None if expected is None else D(expected))


# --------------------------------------------------------------------------- reasoning + rules


def test_wrong_number_inside_think_is_ignored_right_answer_outside_counts() -> None:
    text = (
        "<think>Maybe the answer is 5. \\boxed{5}\n#### 5\nNo wait, it is 18.</think>"
        "She makes $18 a day. The answer is 18. \\boxed{18}\n#### 18"
    )
    gold = D(18)
    score = score_text(text, gold)
    assert score.extracted == {rule: gold for rule in RULES}
    assert all(score.correct.values())


#: the rules that read only what strip_reasoning leaves (last-int reads the whole text)
STRIPPING_RULES = tuple(rule for rule in RULES if rule != "last-int")


def test_answer_only_inside_think_does_not_count() -> None:
    text = "<think>the answer is 5 \\boxed{5} #### 5</think>I am not sure."
    for rule in STRIPPING_RULES:
        assert extract(text, rule) is None, rule
    assert extract(text, "last-int") == D(5)  # vLLM's rule reads the reasoning too


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 5 #### 5 \\boxed{5}</think>The answer is 18 #### 18 \\boxed{18} 18",
        "The answer is 18 #### 18 \\boxed{18} 18<think>The answer is 5 #### 5 \\boxed{5} 5",
    ],
)
def test_orphan_and_unclosed_think_tags(text: str) -> None:
    for rule in STRIPPING_RULES:
        assert extract(text, rule) == D(18), rule
    assert extract(text, "last-int") == D(text.split()[-1])  # the whole text's last integer


def test_think_tags_fold_ascii_case_only() -> None:
    """Any ASCII case is a tag; a look-alike with the Kelvin sign (U+212A, a ``k`` to Unicode
    case folding) is text, never a tag that hides the numbers after it."""
    assert strip_reasoning("1 <THINK>2</THINK> 3 </tHiNk> 4") == "4"
    for text in ("5 <thin\u212a>6", "5 </thin\u212a> 6"):
        assert strip_reasoning(text) == text


def test_unknown_rule_raises_naming_rule_and_valid_ones() -> None:
    get = {"gsm8k_extract": "nonsense"}.get
    with pytest.raises(SettingsError, match="nonsense") as info:
        build_settings(lambda option: get(option.dest), lambda _: None)
    for rule in RULES:
        assert rule in str(info.value)


# --------------------------------------------------------------------------- gold_number


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
        ("#### 1,450,000", "1450000"),
        ("x\n#### -10", "-10"),
        ("#### 5 \n", "5"),
        ("weird #### 3 text\n#### 4", "4"),  # the last #### counts
    ],
)
def test_gold_number(answer: str, expected: str) -> None:
    assert gold_number(answer) == D(expected)


def test_gold_number_missing_marker() -> None:
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        gold_number("the answer is 18")


@pytest.mark.parametrize("answer", ["#### abc", "####", "#### 1/2"])
def test_gold_number_unparseable(answer: str) -> None:
    with pytest.raises(ValueError, match="not a number"):
        gold_number(answer)


@pytest.mark.parametrize(("split", "rows"), [("test", 1319), ("train", 7473)])
def test_gold_number_parses_every_row_of_the_dataset(split: str, rows: int) -> None:
    path = DATA_DIR / f"{split}.jsonl"
    if not path.is_file():
        pytest.skip(f"GSM8K data not available at {path}")
    count = 0
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            answer = json.loads(line)["answer"]
            value = gold_number(answer)
            # Independent check: GSM8K golds are (possibly negative) integers
            # with thousands commas.
            raw = answer.rsplit("####", 1)[1].strip()
            assert value == D(int(raw.replace(",", ""))), raw
            # The seed's strict rule applied to the gold text agrees.
            assert extract(answer, "strict") == value, raw
            count += 1
    assert count == rows


# --------------------------------------------------------------------------- numbers_equal


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (D(18), D("18.00"), True),
        (D(18), D(19), False),
        (D(1000000), D(1000001), False),
        (D("0.3"), D("0.3000001"), True),  # within 1e-6
        (D("0.3"), D("0.300001"), True),  # exactly 1e-6 apart
        (D("0.3"), D("0.3000011"), False),
        (D(-3), D(3), False),
        (None, D(1), False),
        (D(1), None, False),
        (None, None, False),
        (D("Infinity"), D("Infinity"), False),
    ],
)
def test_numbers_equal(a: Decimal | None, b: Decimal | None, expected: bool) -> None:
    assert numbers_equal(a, b) is expected
    assert numbers_equal(b, a) is expected


def test_numbers_equal_is_exact_beyond_decimal_context_precision() -> None:
    # A difference of 1e-6 + 1e-40 must not be rounded down to 1e-6.
    a = D(0)
    b = D("0.0000010000000000000000000000000000000001")
    assert not numbers_equal(a, b)


# --------------------------------------------------------------------------- score_text


def test_score_text_covers_every_rule() -> None:
    text = "The answer is 7. #### 8 and finally 9"
    score = score_text(text, D(8))
    assert isinstance(score, SampleScore)
    assert list(score.extracted) == list(RULES)
    assert list(score.correct) == list(RULES)
    assert score.extracted == {
        "strict": D(8),
        "answer-is": D(7),
        "boxed": None,
        "flexible": D(9),
        "last-int": D(9),
    }
    assert score.correct == {
        "strict": True,
        "answer-is": False,
        "boxed": False,
        "flexible": False,
        "last-int": False,
    }


def test_score_text_ignores_reasoning() -> None:
    text = "<think>the answer is 5 \\boxed{5} #### 5</think>I am not sure."
    score = score_text(text, D(5))
    assert score.extracted == {**dict.fromkeys(STRIPPING_RULES), "last-int": D(5)}
    assert score.correct == {**dict.fromkeys(STRIPPING_RULES, False), "last-int": True}


def test_score_text_uses_custom_pattern() -> None:
    score = score_text("ANSWER=12", D(12), re.compile(r"ANSWER=(\d+)"))
    assert score.correct["strict"] is True
    assert score_text("ANSWER=12", D(12)).correct["strict"] is False


def test_sample_score_is_frozen() -> None:
    score = score_text("#### 1", D(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        score.extracted = {}  # type: ignore[misc]


# --------------------------------------------------------------------------- format_number


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (D("18.00"), "18"),
        (D("18"), "18"),
        (D("-3"), "-3"),
        (D("0.5"), "0.5"),
        (D("0.50"), "0.5"),
        (D("1E+3"), "1000"),
        (D("1.5E-7"), "0.00000015"),
        (D("-0.0"), "0"),
        (D("0E+5"), "0"),
        (D("1450000"), "1450000"),
        (None, None),
    ],
)
def test_format_number(value: Decimal | None, expected: str | None) -> None:
    assert format_number(value) == expected


def test_format_number_never_uses_exponent() -> None:
    for value in (D("1E+30"), D("1E-30"), D("123456789E+10")):
        text = format_number(value)
        assert text is not None
        assert "E" not in text.upper()
        assert D(text) == value


# --------------------------------------------------------------------------- majority_vote


def test_majority_vote_simple() -> None:
    winner, counts = majority_vote([D(3), D(18), D(18), None, D(5)])
    assert winner == D(18)
    assert counts == [("18", 2), ("3", 1), ("5", 1)]


def test_majority_vote_pools_numerically_equal_values() -> None:
    winner, counts = majority_vote([D(3), D("18.00"), D(3), D(18), D("18.0")])
    assert winner == D(18)
    assert counts == [("18", 3), ("3", 2)]


@pytest.mark.parametrize(
    ("values", "expected_winner", "expected_counts"),
    [
        # Two-way tie: the candidate whose first vote came first wins.
        ([D(18), D(3), D(3), D(18)], D(18), [("18", 2), ("3", 2)]),
        ([D(3), D(18), D(18), D(3)], D(3), [("3", 2), ("18", 2)]),
        # None first does not matter; it does not vote.
        ([None, D(7), D(9)], D(7), [("7", 1), ("9", 1)]),
        # Tie at the top, then a smaller candidate; ties listed by first appearance.
        ([D(1), D(2), D(3), D(2), D(3)], D(2), [("2", 2), ("3", 2), ("1", 1)]),
    ],
)
def test_majority_vote_ties(
    values: list[Decimal | None],
    expected_winner: Decimal,
    expected_counts: list[tuple[str, int]],
) -> None:
    winner, counts = majority_vote(values)
    assert winner == expected_winner
    assert counts == expected_counts


@pytest.mark.parametrize("values", [[], [None], [None, None, None]])
def test_majority_vote_nobody_voted(values: list[Decimal | None]) -> None:
    assert majority_vote(values) == (None, [])


def test_majority_vote_counts_sum_to_non_none_votes() -> None:
    values = [D(1), None, D(2), D(1), None, D("1.0"), D(4)]
    _, counts = majority_vote(values)
    assert sum(c for _, c in counts) == 5


# -- hostile lengths: linear scoring ---------------------------------------------------

_OLD_PAIR = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def _reference_strip(text: str) -> str:
    """The old, quadratic definition of strip_reasoning: the meaning to keep."""
    out = _OLD_PAIR.sub("\n", text)
    closes = list(re.finditer(r"</think>", out, re.IGNORECASE))
    if closes:
        out = out[closes[-1].end() :]
    opening = re.search(r"<think>", out, re.IGNORECASE)
    return (out[: opening.start()] if opening else out).strip()


def test_linear_strip_reasoning_means_what_the_regex_meant() -> None:
    rng = random.Random(7)
    tokens = ["<think>", "</think>", "<THINK>", "</Think>", "a", " 1 ", "\n", "é", "<thi", "nk>"]
    for _ in range(20000):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 14)))
        assert strip_reasoning(text) == _reference_strip(text), text


def test_last_prose_number_from_the_end_equals_the_left_to_right_scan() -> None:
    rng = random.Random(11)
    tokens = [" ", "1", "2", ",", ".", "-", "$", "\n", "1,000", "\u2212", "x", "12,34"]
    for _ in range(20000):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 16)))
        expected = None
        for match in re.finditer(scoring._PROSE_NUMBER, text):
            expected = parse_number(match.group(0))
        assert extract(text, "flexible") == expected, text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>" * 1_500_000, {}),  # unclosed reasoning: no answer at all
        ("</think>" * 1_000_000 + "#### 18", {"strict": "18", "flexible": "18", "last-int": "18"}),
        (
            "<think>1</think>" * 600_000 + "The answer is 18.",
            {"answer-is": "18", "flexible": "18", "last-int": "18"},
        ),
        ("\\boxed{" * 1_400_000, {}),
        ("\\boxed{7}" * 1_100_000, {"boxed": "7", "flexible": "7", "last-int": "7"}),
        ("#### 1 " * 1_600_000, {"strict": "1", "flexible": "1", "last-int": "1"}),
        ("The answer is 5 " * 600_000, {"answer-is": "5", "flexible": "5", "last-int": "5"}),
        # a run of number characters longer than 256 is read from its last 256; last-int
        # reads it as a Python literal, which has at most 4300 digits (vLLM's INVALID)
        ("1" * 10_000_000, {"flexible": "1" * 256}),
    ],
    ids=["open", "closes", "pairs", "boxed-open", "boxed", "hashes", "answer-is", "digits"],
)
def test_ten_megabyte_answers_score_linearly(text: str, expected: dict[str, str]) -> None:
    """Each shape was quadratic somewhere (reasoning tags, braces, Fraction of a huge
    number, a Python loop over millions of matches). Run, not timed: benchmarks time."""
    score = score_text(text, Decimal(18))
    want = {rule: Decimal(expected[rule]) if rule in expected else None for rule in RULES}
    assert score.extracted == want
    assert score.correct == {rule: want[rule] == 18 for rule in RULES}


def test_numbers_equal_on_huge_and_tiny_numbers_without_big_integer_work() -> None:
    assert numbers_equal(D("18"), D("18." + "0" * 100_000 + "1"))  # within 1e-6
    assert not numbers_equal(D("1" * 100_000), D("1"))  # magnitudes apart: no Fraction
    assert not numbers_equal(D("1" * 80), D("1" * 79 + "2"))
    assert numbers_equal(D("0"), D("0.0000001"))
    assert not numbers_equal(D("0"), D("1"))
    assert not numbers_equal(D("-1"), D("1"))
    assert numbers_equal(D("0"), D("-0"))
    assert not numbers_equal(D("0.0000001"), D("5"))
