"""Answer extraction and comparison for GSM8K.

A model's completion is free text; the gold answer is a number after ``####``.
Scoring therefore has two halves: *extracting* a number from the completion
under some rule, and *comparing* it with the gold number.  Both halves are
deliberately kept free of floats: GSM8K answers are exact integers (sometimes
with thousands separators, e.g. ``1,450,000``) and a float or a
significant-digit rounding step can silently turn a wrong answer into a
right one (or the reverse).  Every number is therefore a :class:`Decimal`
built directly from its digits.

Several extraction rules are offered because models answer in different
styles and the choice of rule is itself a large source of score differences:

``strict``
    The original GSM8K ``#### <number>`` convention (the seed's regex, or a
    user-supplied one).
``answer-is``
    "The answer is 42" / "The final answer is: $1,800." / "Final answer: 42"
    style.
``boxed``
    LaTeX ``\\boxed{...}`` as produced by math-tuned models.
``flexible``
    The last number anywhere in the text; the most lenient rule.
``last-int``
    vLLM's and SGLang's GSM8K rule (``get_answer_value`` in vLLM's
    ``tests/evals/gsm8k/gsm8k_eval.py`` and SGLang's ``few_shot_gsm8k.py``):
    commas removed, the last run of digits, read as a Python integer literal.
    No sign, no decimals, no ``<think>`` stripping; ``007`` is no answer (a
    Python literal cannot have leading zeros).  The gating rule of
    ``--gsm8k-preset vllm`` and ``sglang``.

For every rule the *last* match wins, because models often restate or correct
intermediate values before giving the final one.

This module is pure logic: no pytest, no I/O, standard library only.
"""

from __future__ import annotations

import ast
import re
import string
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import overload

__all__ = [
    "RULES",
    "STRICT_PATTERN",
    "TOLERANCE",
    "WHOLE_TEXT_RULES",
    "SampleScore",
    "extract",
    "format_number",
    "gold_number",
    "last_int",
    "majority_vote",
    "numbers_equal",
    "parse_number",
    "rule_gold",
    "score_text",
    "strip_reasoning",
]

RULES: tuple[str, ...] = ("strict", "answer-is", "boxed", "flexible", "last-int")
"""Every extraction rule, in the order reports list them."""

WHOLE_TEXT_RULES: tuple[str, ...] = ("last-int",)
"""Rules that read the whole text, ``<think>`` reasoning included, as the peers they copy
do; every other rule reads only what :func:`strip_reasoning` leaves."""

STRICT_PATTERN = r"####\s*(-?[\d,]+(?:\.\d+)?)"
"""The GSM8K seed's rule, kept verbatim so strict scores match other harnesses."""

TOLERANCE = Decimal("1e-6")
"""Largest absolute difference still counted as equal.

Values are exact decimals, so this only matters for answers such as ``0.3333333``
versus a gold ``1/3``-style rounding; it is far below any GSM8K answer's
resolution (answers are integers or have at most a couple of decimals).
"""

_STRICT_RE = re.compile(STRICT_PATTERN)

# A number as it is written in prose: optional minus (ASCII or U+2212), an
# optional dollar sign, digits with *well-formed* thousands groups (so that
# "1,000" is one number but "1,2,3" is three), and an optional fraction.  The
# fraction requires digits after the point so a sentence-ending period is never
# swallowed.  The minus is only taken when it does not follow a digit, so the
# "3" in "5-3" is read as 3, not -3.
_PROSE_NUMBER = (
    r"(?:(?<![\d])[-\u2212])?\$?"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)"
    r"(?:\.\d+)?"
)
_FLEXIBLE_RE = re.compile(_PROSE_NUMBER)
_NUMBER_CHARS = "0123456789,.$-\u2212"  # every character a prose number can hold
_RUN_CAP = 256

# "The answer is ...", "the final answer is: $1,800.", "answer is: 42",
# "The answer is **42**", "Final answer: 42".  A leading "the" is not required
# (it adds nothing once "answer is" matched).  "is" must be a whole word so
# "the answer isn't 5" does not count.  The number part is lenient about comma
# placement (like the strict rule) but never ends in a comma or a period, so
# "is 42, because" gives 42.
_ANSWER_IS_RE = re.compile(
    r"\banswer\s*(?:is\b\s*[:=]?|:)[\s*]*\$?\s*"
    r"([-\u2212]?\$?\d+(?:,\d+)*(?:\.\d+)?)",
    re.IGNORECASE,
)

# The content may hold braces two levels deep (\boxed{\frac{1}{2}}, \boxed{\text{\$}18}).
# Possessive quantifiers: linear, even on a text of unclosed \boxed{ (a looping answer).
_BOXED_RE = re.compile(r"\\boxed\s*\{((?:[^{}]++|\{(?:[^{}]++|\{[^{}]*+\})*+\})*+)\}")

# LaTeX wrappers whose content is a unit or label, never the number itself.
_TEXT_MACRO_RE = re.compile(r"\\(?:text|textrm|textbf|mathrm|mbox|mathbf)\s*\{[^{}]*\}")
# LaTeX noise that may appear inside a boxed number: escaped dollar/percent,
# thin/negative spaces, "{,}" thousands separators, \left/\right.
_LATEX_NOISE_RE = re.compile(r"\\[$%,!;: ]|\{,\}|\\left|\\right|[$%]")

_THINK_PAIR_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE | re.ASCII)
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

_PLAIN_NUMBER_RE = re.compile(r"\d+\.?\d*|\.\d+")

# The peers use the third-party ``regex`` module; for a str pattern its ``\d`` is the same
# class as the standard library's: every Unicode decimal digit.
_DIGITS_RE = re.compile(r"\d+")

# The peers use the third-party ``regex`` module; for a str pattern its ``\d`` is the same
# class as the standard library's: every Unicode decimal digit.
_DIGITS_RE = re.compile(r"\d+")


def parse_number(text: str) -> Decimal | None:
    """Turn one number token into an exact, normalised :class:`Decimal`.

    Accepts the forms models and GSM8K gold answers actually use: surrounding
    whitespace, a leading ``$`` (before or after the minus sign), a trailing
    ``%``, a trailing sentence period, thousands commas and the Unicode minus
    sign U+2212.  Commas are simply removed (as the seed rule and common
    harnesses do), so ``"1,000"`` is 1000.

    The result is normalised *without* going through a decimal context
    (``Decimal.normalize`` would round to 28 digits and produce ``1E+3``):
    trailing fractional zeros are dropped from the digit string, so
    ``"18.00"`` gives ``Decimal("18")`` and ``"1000"`` stays ``Decimal("1000")``.
    Negative zero becomes zero.

    Returns ``None`` for anything that is not a plain decimal number,
    including exponent notation, fractions and empty strings, so callers can
    treat "no answer" uniformly.
    """
    s = text.strip().replace("\u2212", "-")
    negative = False
    if s.startswith("-"):
        negative = True
        s = s[1:].lstrip()
    if s.startswith("$"):
        s = s[1:].lstrip()
    if not negative and s.startswith("-"):  # "$-3"
        negative = True
        s = s[1:].lstrip()
    s = s.rstrip()
    if s.endswith("."):
        s = s[:-1]
    if s.endswith("%"):
        s = s[:-1].rstrip()
    if s.endswith("."):  # "50%." is "50% ." after the sentence period goes
        s = s[:-1]
    if s.startswith(",") or s.endswith(",") or ",," in s:
        return None
    if "," in s.partition(".")[2]:
        return None  # a comma in the fractional part is not a thousands separator
    s = s.replace(",", "")
    if not _PLAIN_NUMBER_RE.fullmatch(s):
        return None
    if "." in s:
        s = s.rstrip("0").rstrip(".")
        if s == "":  # ".0", "0.000"
            s = "0"
    try:
        value = Decimal(s)
    except InvalidOperation:  # pragma: no cover - the regex already guards this
        return None
    if value == 0:
        return Decimal(0)
    return -value if negative else value


def strip_reasoning(text: str) -> str:
    """Remove ``<think>`` reasoning so only the visible answer is scored.

    Reasoning models often try (and discard) wrong numbers while thinking; if
    those were scored, the lenient rules would pick them up.  Three shapes
    occur in practice:

    * complete ``<think>...</think>`` blocks (possibly several) are removed;
    * a ``</think>`` with no opening tag -- some servers strip the opening tag
      from the returned text -- means everything up to and including the last
      ``</think>`` was reasoning;
    * an ``<think>`` that is never closed means the model ran out of tokens
      while thinking, so there is no answer part: everything from that tag on
      is dropped.

    Removed blocks are replaced by a newline (so the numbers on either side
    cannot fuse into one) and the result is stripped of outer whitespace.
    """
    # Linear in the text's length. The pair regex alone is quadratic on unclosed tags (from
    # each one it scans to the end for a close), and a cached answer full of them would stall
    # every rerun; so it only runs on the part up to the last </think>, where every opening
    # tag has a closing one after it. Tags match ASCII case-insensitively, as the regex does.
    last = _ascii_lower(text).rfind("</think>")
    head, tail = ("", text) if last == -1 else (text[: last + 8], text[last + 8 :])
    opening = _ascii_lower(tail).find("<think>")
    if opening != -1:
        tail = tail[:opening]  # never closed: the model ran out of tokens while thinking
    head = _THINK_PAIR_RE.sub("\n", head)
    orphan = _ascii_lower(head).rfind("</think>")
    if orphan != -1:
        head = head[orphan + 8 :]  # everything up to a closing tag without opening was reasoning
    return (head + tail).strip()


def _ascii_lower(text: str) -> str:
    """Lowercase A-Z only: the same length as ``text``, so indices carry over."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def _last_match_number(regex: re.Pattern[str], text: str, use_group: bool) -> Decimal | None:
    """Parse the number in the last match of ``regex`` (``None`` if none).

    Only the last match is considered, even if its text does not parse: the
    rule is "the final stated answer counts", not "the final parseable one".
    """
    # deque(maxlen=1) consumes the matches in C: a looping 10 MB answer can hold millions
    final = deque(regex.finditer(text), maxlen=1)
    if not final:
        return None
    last = final[0]
    token = last.group(1) if use_group else last.group(0)
    if token is None:  # optional group that did not take part in the match
        return None
    return parse_number(token)


def _last_prose_number(text: str) -> Decimal | None:
    """The last number in prose (the flexible rule), found from the end of the text.

    The last match holds the text's last digit, and no match crosses a character
    outside :data:`_NUMBER_CHARS`, so scanning the run of number characters that
    ends there gives exactly the left-to-right scan's last match. A run longer than
    :data:`_RUN_CAP` (no real answer) is read from its last ``_RUN_CAP`` characters.
    """
    last = max(text.rfind(digit) for digit in string.digits)
    if last == -1:
        return None
    start = max(len(text[: last + 1].rstrip(_NUMBER_CHARS)), last + 1 - _RUN_CAP)
    final = deque(_FLEXIBLE_RE.finditer(text, start), maxlen=1)
    return parse_number(final[0].group(0)) if final else None


def _last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{}``, the innermost one when nested
    (``\\boxed{\\boxed{1}}`` gives ``1``): the box whose opening comes last."""
    final = deque(_BOXED_RE.finditer(text), maxlen=1)
    if not final:
        return None
    content = final[0].group(1)
    inner = _last_boxed(content) if "\\boxed" in content else None
    return content if inner is None else inner


def _boxed_number(content: str) -> Decimal | None:
    """Read the number inside one ``\\boxed{}``.

    Units (``\\text{ dollars}``), escaped ``\\$``/``\\%``, thin spaces and
    redundant outer braces are removed first.  If what is left is not a single
    number, the content is accepted only when it contains exactly one number
    (``x = 5``, ``18 dollars``); anything with several numbers, such as
    ``\\frac{1}{2}``, is ambiguous and gives ``None`` rather than a guess.
    """
    without_units = _TEXT_MACRO_RE.sub(" ", content)
    value = _single_number(without_units)
    if value is None:
        # \text{18} or \mathbf{18}: the wrapper held the number itself.
        value = _single_number(_TEXT_MACRO_RE.sub(_macro_body, content))
    return value


def _macro_body(match: re.Match[str]) -> str:
    """The braced argument of a ``\\text{...}``-like macro match."""
    whole = match.group(0)
    return " " + whole[whole.index("{") + 1 : -1] + " "


def _single_number(content: str) -> Decimal | None:
    """The number in ``content`` if it holds exactly one, else ``None``."""
    cleaned = _LATEX_NOISE_RE.sub("", content).strip()
    while cleaned.startswith("{") and cleaned.endswith("}"):
        cleaned = cleaned[1:-1].strip()
    direct = parse_number(cleaned)
    if direct is not None:
        return direct
    tokens = _FLEXIBLE_RE.findall(cleaned)
    if len(tokens) == 1:
        return parse_number(tokens[0])
    return None


#: digit runs up to this long are read without ``ast.literal_eval`` (which reads them the
#: same way: Python's int literal; its limit on digits is 4300)
_PLAIN_DIGITS = 4000


def last_int(text: str) -> Decimal | None:
    """vLLM's ``get_answer_value`` on a response: ``None`` where it returns ``INVALID``.

    Commas go first (so ``1,2`` is ``12``), then the last run of ``\\d`` (any Unicode
    decimal digit) is read with ``ast.literal_eval``, exactly as the peers do; its
    ``SyntaxError`` (leading zeros, a non-ASCII digit, over 4300 digits) is their
    ``INVALID``. Any other failure is ``None`` too, where the peers' script would stop.
    The text is used whole: no ``<think>`` stripping, as the peers score the content.
    """
    final = deque(_DIGITS_RE.finditer(text.replace(",", "")), maxlen=1)
    if not final:
        return None
    digits = final[0].group(0)
    if digits.isascii() and len(digits) <= _PLAIN_DIGITS and (digits[0] != "0" or digits == "0"):
        return Decimal(int(digits))  # what literal_eval gives for these, 20x faster
    try:
        value = ast.literal_eval(digits)
    except (SyntaxError, ValueError, MemoryError):
        return None
    return Decimal(value) if isinstance(value, int) else None


def _extract_stripped(visible: str, rule: str, pattern: re.Pattern[str] | None) -> Decimal | None:
    """Apply ``rule`` to text that has already had its reasoning removed."""
    if rule == "strict":
        if pattern is None:
            return _last_match_number(_STRICT_RE, visible, use_group=True)
        return _last_match_number(pattern, visible, use_group=pattern.groups >= 1)
    if rule == "answer-is":
        if "answer" not in _ascii_lower(visible):
            return None  # the case-insensitive regex scan costs ten times this check
        return _last_match_number(_ANSWER_IS_RE, visible, use_group=True)
    if rule == "boxed":
        content = _last_boxed(visible)
        return None if content is None else _boxed_number(content)
    if rule == "flexible":
        return _last_prose_number(visible)
    raise ValueError(f"unknown extraction rule {rule!r}; valid rules are: {', '.join(RULES)}")


def extract(text: str, rule: str, pattern: re.Pattern[str] | None = None) -> Decimal | None:
    """Extract the model's final answer from ``text`` under ``rule``.

    The text first goes through :func:`strip_reasoning`, then the *last* match
    of the rule wins.  ``pattern`` replaces the strict rule's regex (it is the
    user's ``--gsm8k-answer-regex``): its first capturing group is the number,
    or the whole match when it has no group.  It does not affect other rules.

    Raises ``ValueError`` for an unknown rule, naming the valid ones, so a
    typo in configuration fails loudly instead of scoring everything wrong.
    """
    if rule not in RULES:
        raise ValueError(f"unknown extraction rule {rule!r}; valid rules are: {', '.join(RULES)}")
    if rule in WHOLE_TEXT_RULES:
        return last_int(text)
    return _extract_stripped(strip_reasoning(text), rule, pattern)


def gold_number(answer: str) -> Decimal:
    """The gold number of a GSM8K ``answer`` field (the text after the last ``####``).

    Raises ``ValueError`` when there is no ``####`` or what follows it is not
    a number; a malformed data row should stop an evaluation, not silently
    count as a failure for every model.
    """
    if "####" not in answer:
        raise ValueError("answer has no '#### <number>' line")
    tail = answer.rsplit("####", 1)[1].strip()
    value = parse_number(tail)
    if value is None:
        raise ValueError(f"text after #### is not a number: {tail!r}")
    return value


_EXACT_DIGITS = 60  # longer numbers are compared after rounding to _FINE
_FINE = Decimal("1e-9")


def numbers_equal(a: Decimal | None, b: Decimal | None) -> bool:
    """Whether two answers agree, within :data:`TOLERANCE`.

    ``None`` (no answer extracted) never equals anything, not even another
    ``None``: two missing answers are not a correct answer.  The difference is
    computed with :class:`Fraction`, i.e. exactly, so no decimal-context
    rounding can creep in for very long numbers.  Non-finite values (which
    :func:`parse_number` never produces) are never equal.
    """
    if a is None or b is None:
        return False
    if not (a.is_finite() and b.is_finite()):
        return False
    # Cheap answers first, so a 10-million-digit "number" from a looping model costs no
    # big-integer arithmetic: magnitudes 100x apart (the larger >= 1) differ by far more
    # than the tolerance; a very long number is compared at 1e-9, well inside it.
    top = max(a.adjusted(), b.adjusted())
    if a.is_zero() or b.is_zero():
        if max(a, b, key=abs).adjusted() >= 0 and not (a.is_zero() and b.is_zero()):
            return False
    elif top >= 0 and abs(a.adjusted() - b.adjusted()) >= 2:
        return False
    if a == b:  # exact (1000 == 1E+3 == 1000.0): most answers, no Fraction needed
        return True
    if max(len(a.as_tuple().digits), len(b.as_tuple().digits)) > _EXACT_DIGITS:
        with localcontext() as ctx:
            ctx.prec = max(top, 0) + 20
            a, b = a.quantize(_FINE), b.quantize(_FINE)
    return abs(Fraction(a) - Fraction(b)) <= Fraction(TOLERANCE)


@dataclass(frozen=True)
class SampleScore:
    """Outcome of one completion under every rule.

    All rules are always computed so that reports can show how much the
    choice of rule matters without re-running the model.
    """

    extracted: dict[str, Decimal | None]
    """Rule name -> extracted number (``None`` if the rule found nothing)."""
    correct: dict[str, bool]
    """Rule name -> whether the extracted number equals the gold one."""


def score_text(
    text: str,
    gold: Decimal,
    pattern: re.Pattern[str] | None = None,
    label: Decimal | None = None,
) -> SampleScore:
    """Score one completion against ``gold`` under every rule in :data:`RULES`.

    ``pattern`` is forwarded to the strict rule (see :func:`extract`).  The
    reasoning is stripped once and shared by all rules.  ``label`` is what the
    ``last-int`` rule compares with: the peers' label, the same rule applied to the
    gold answer text (:func:`rule_gold`); ``gold`` when not given.
    """
    visible = strip_reasoning(text)
    extracted = {
        rule: last_int(text)
        if rule in WHOLE_TEXT_RULES
        else _extract_stripped(visible, rule, pattern)
        for rule in RULES
    }
    correct = {
        rule: numbers_equal(value, label if rule == "last-int" and label is not None else gold)
        for rule, value in extracted.items()
    }
    return SampleScore(extracted=extracted, correct=correct)


def rule_gold(rule: str, answer: str, gold: Decimal) -> Decimal | None:
    """What ``rule`` counts as the right answer for a GSM8K ``answer`` field whose gold
    number is ``gold``: ``gold`` itself, except for ``last-int``, whose peers compare with
    the last integer of the answer text (so the gold ``-10`` is ``10``, and a model that
    answers ``-10`` is right by their rule, as their scripts score it)."""
    return last_int(answer) if rule == "last-int" else gold


@overload
def format_number(d: Decimal) -> str: ...


@overload
def format_number(d: Decimal | None) -> str | None: ...


def format_number(d: Decimal | None) -> str | None:
    """Canonical string for a number, for JSON reports and vote keys.

    Fixed-point only (``1E+3`` -> ``"1000"``), no trailing fractional zeros
    (``18.00`` -> ``"18"``), no negative zero, so that equal numbers always
    print identically and reports stay readable and diffable.  ``None`` stays
    ``None`` (JSON ``null``).  Non-finite values print as ``str(d)``.
    """
    if d is None:
        return None
    if not d.is_finite():
        return str(d)
    if d == 0:
        return "0"
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def majority_vote(
    values: Sequence[Decimal | None],
) -> tuple[Decimal | None, list[tuple[str, int]]]:
    """maj@N: the most common extracted answer among N samples.

    ``None`` values (no answer extracted) and non-finite values do not vote.
    Numerically equal values are one candidate (``18`` and ``18.00`` pool
    their votes); the candidate is represented by its first-seen value.

    Tie-break: among the candidates with the most votes, the one whose
    *first* vote came earliest in sample order wins.  This is deterministic
    and independent of hash or dict ordering, so reruns of the same samples
    always report the same winner.

    Returns ``(winner, counts)`` where ``winner`` is ``None`` if nobody voted
    and ``counts`` is ``[(format_number(value), votes), ...]`` sorted by votes
    descending, then by first appearance.
    """
    # Decimal hashes consistently with numeric equality (hash(Decimal("18.00"))
    # == hash(Decimal("18"))); a dict keeps insertion order (the order of first
    # appearance) and keeps the first-inserted key object on later updates.
    counts: dict[Decimal, int] = {}
    for value in values:
        if value is None or not value.is_finite():
            continue
        counts[value] = counts.get(value, 0) + 1
    # sorted() is stable, so equal counts keep first-appearance order.
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    table: list[tuple[str, int]] = []
    for key, votes in ranked:
        label = format_number(key)
        assert label is not None
        table.append((label, votes))
    winner = ranked[0][0] if ranked else None
    return winner, table
