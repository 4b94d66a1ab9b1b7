"""Answer extraction and comparison (docs/protocols.md#extraction-and-comparison). Pure.
No floats: a rounding can turn a wrong answer right, so every number is a :class:`Decimal` from
its digits. For every rule the *last* match wins: models restate values before the final one."""

from __future__ import annotations

import ast
import re
import string
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import overload

RULES: tuple[str, ...] = ("strict", "answer-is", "boxed", "flexible", "last-int")
#: the GSM8K seed's rule, verbatim so strict scores match other harnesses
STRICT_PATTERN = r"####\s*(-?[\d,]+(?:\.\d+)?)"
#: the largest difference still equal (``0.3333333`` against a rounded gold)
TOLERANCE = Decimal("1e-6")

# A number in prose: well-formed thousands groups ("1,2,3" is three numbers), digits after a
# point (a sentence's period is never swallowed), a minus only when not after a digit ("5-3").
_PROSE_NUMBER = r"(?:(?<![\d])[-\u2212])?\$?(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:\.\d+)?"
_FLEXIBLE_RE = re.compile(_PROSE_NUMBER)
_NUMBER_CHARS = "0123456789,.$-\u2212"  # every character a prose number can hold
# "The answer is **42**", "the final answer is: $1,800.", "Final answer: 42"; "is" a whole
# word ("the answer isn't 5" does not count); the number never ends in a comma or period.
_ANSWER_IS_RE = re.compile(
    r"\banswer\s*(?:is\b\s*[:=]?|:)[\s*]*\$?\s*([-\u2212]?\$?\d+(?:,\d+)*(?:\.\d+)?)", re.I
)
# The content may hold braces two levels deep (\boxed{\frac{1}{2}}, \boxed{\text{\$}18}).
# Unrolled, one way to match: linear on unclosed \boxed{.
_BOXED_RE = re.compile(r"\\boxed\s*\{((?:[^{}]*\{(?:[^{}]*\{[^{}]*\})*[^{}]*\})*[^{}]*)\}")
# LaTeX wrappers whose content is a unit or label (or, failing that, the number itself)
_TEXT_MACRO_RE = re.compile(r"\\(?:text|textrm|textbf|mathrm|mbox|mathbf)\s*\{([^{}]*)\}")
# noise inside a boxed number: escaped $ and %, thin spaces, "{,}" separators, \left/\right
_LATEX_NOISE_RE = re.compile(r"\\[$%,!;: ]|\{,\}|\\left|\\right|[$%]")

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# the peers' third-party ``regex`` module: for a str its ``\d`` is every Unicode decimal digit too
_DIGITS_RE = re.compile(r"\d+")


def parse_number(text: str) -> Decimal | None:
    """One number token as an exact :class:`Decimal`, or None (no exponents, no fractions):
    ``$`` before or after the minus, U+2212, a trailing ``%`` or period, thousands commas.
    Trailing zeros are cut from the digits, not by ``Decimal.normalize`` (which rounds to 28
    digits and writes ``1E+3``); negative zero is zero."""
    s = text.strip().replace("\u2212", "-")
    negative = s.startswith("-")
    s = s.removeprefix("-").lstrip().removeprefix("$").lstrip()
    if not negative and s.startswith("-"):  # "$-3"
        negative, s = True, s[1:].lstrip()
    s = s.removesuffix(".")
    if s.endswith("%"):
        s = s[:-1].rstrip()
    s = s.removesuffix(".")  # "50%." is "50% ." after the sentence period goes
    # a comma in the fractional part is no thousands separator
    if s.startswith(",") or s.endswith(",") or ",," in s or "," in s.partition(".")[2]:
        return None
    s = s.replace(",", "")
    if not re.fullmatch(r"\d+\.?\d*|\.\d+", s):
        return None
    value = Decimal((s.rstrip("0").rstrip(".") or "0") if "." in s else s)  # ".0", "0.000"
    return Decimal(0) if value == 0 else -value if negative else value


def strip_reasoning(text: str) -> str:
    """The visible answer without ``<think>`` reasoning (whose numbers the lenient rules would
    pick up): each block leaves a newline (numbers on either side never fuse), a block never
    closed runs to the end (out of tokens while thinking: linear, no tag scanned twice), and
    everything up to an orphan ``</think>`` goes (some servers strip the opening tag)."""
    if "think>" not in ascii_lower(text):  # most answers: no regex scans them (a slow one)
        return text.strip()
    text = re.sub(r"<think>.*?(?:</think>|\Z)", "\n", text, flags=re.DOTALL | re.I | re.ASCII)
    return re.split(r"</think>", text, flags=re.I | re.ASCII)[-1].strip()


def ascii_lower(text: str) -> str:
    """Lowercase A-Z only: the same length as ``text``, so indices carry over."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def _last_match_number(regex: re.Pattern[str], text: str) -> Decimal | None:
    """The number in the last match of ``regex`` (group 1, or the whole match of a pattern
    without one), even when it does not parse: the final stated answer counts."""
    # deque(maxlen=1) consumes the matches in C: a looping 10 MB answer can hold millions
    final = deque(regex.finditer(text), maxlen=1)
    token = final[0].group(1 if regex.groups else 0) if final else None
    return None if token is None else parse_number(token)  # None: an optional group unused


def _last_prose_number(text: str) -> Decimal | None:
    """The flexible rule's last number, found from the end: the last match holds the last
    digit and never crosses a character outside :data:`_NUMBER_CHARS`, so the run of them
    ending there (its last 256 characters) gives the same match."""
    last = max(text.rfind(digit) for digit in string.digits)
    if last == -1:
        return None
    start = max(len(text[: last + 1].rstrip(_NUMBER_CHARS)), last + 1 - 256)
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
    """The number inside one ``\\boxed{}``, units and LaTeX noise removed: only when it
    holds exactly one (``x = 5``); ``\\frac{1}{2}`` is ambiguous and gives None."""
    value = _single_number(_TEXT_MACRO_RE.sub(" ", content))
    return _single_number(_TEXT_MACRO_RE.sub(r" \1 ", content)) if value is None else value


def _single_number(content: str) -> Decimal | None:
    cleaned = _LATEX_NOISE_RE.sub("", content).strip()
    while cleaned.startswith("{") and cleaned.endswith("}"):
        cleaned = cleaned[1:-1].strip()
    if (direct := parse_number(cleaned)) is not None:
        return direct
    tokens = _FLEXIBLE_RE.findall(cleaned)
    return parse_number(tokens[0]) if len(tokens) == 1 else None


def last_int(text: str) -> Decimal | None:
    """vLLM's ``get_answer_value``: commas removed (``1,2`` is ``12``), the last run of
    ``\\d`` read by ``ast.literal_eval``; None where it returns ``INVALID`` (leading zeros, a
    non-ASCII digit, over 4300 digits) or its script would stop. The whole text, no
    ``<think>`` stripping, as the peers score it."""
    final = _DIGITS_RE.search(text.replace(",", "")[::-1])  # the last run: the first reversed
    if not final:
        return None
    digits = final.group(0)[::-1]
    # what literal_eval gives for these (within its 4300-digit limit), 20x faster
    if digits.isascii() and len(digits) <= 4000 and (digits[0] != "0" or digits == "0"):
        return Decimal(int(digits))
    try:  # a run of \d is an int literal or no literal at all
        return Decimal(ast.literal_eval(digits))
    except (SyntaxError, ValueError, MemoryError):
        return None


def gold_number(answer: str) -> Decimal:
    """The number after the last ``####`` of a GSM8K ``answer``; ValueError otherwise (a bad
    row stops the evaluation rather than failing every model)."""
    if "####" not in answer:
        raise ValueError("answer has no '#### <number>' line")
    tail = answer.rsplit("####", 1)[1].strip()
    value = parse_number(tail)
    if value is None:
        raise ValueError(f"text after #### is not a number: {tail!r}")
    return value


def numbers_equal(a: Decimal | None, b: Decimal | None) -> bool:
    """Whether two answers agree within :data:`TOLERANCE`, exactly (in fractions). None
    (no answer) and non-finite values never equal anything, not even themselves."""
    if a is None or b is None or not (a.is_finite() and b.is_finite()):
        return False
    # Cheap first: a 10-million-digit "number" costs no big-integer arithmetic (magnitudes 100x
    # apart differ by far more than the tolerance; a long number is compared at 1e-9)
    top = max(a.adjusted(), b.adjusted())
    if a.is_zero() or b.is_zero():
        if max(a, b, key=abs).adjusted() >= 0 and not (a.is_zero() and b.is_zero()):
            return False
    elif top >= 0 and abs(a.adjusted() - b.adjusted()) >= 2:
        return False
    if a == b:  # exact (1000 == 1E+3 == 1000.0): most answers, no Fraction needed
        return True
    if max(len(a.as_tuple().digits), len(b.as_tuple().digits)) > 60:
        with localcontext() as ctx:
            ctx.prec = max(top, 0) + 20
            a, b = a.quantize(Decimal("1e-9")), b.quantize(Decimal("1e-9"))
    return abs(Fraction(a) - Fraction(b)) <= Fraction(TOLERANCE)


@dataclass(frozen=True)
class SampleScore:
    """One completion under every rule (reports show how much the rule matters)."""

    extracted: dict[str, Decimal | None]
    correct: dict[str, bool]


def score_text(
    text: str, gold: Decimal, pattern: re.Pattern[str] | None = None, label: Decimal | None = None
) -> SampleScore:
    """One completion against ``gold`` under every rule; ``pattern``: --gsm8k-answer-regex (the
    strict rule's); ``label``: what ``last-int`` compares with (its peers take the answer's last
    integer; ``gold`` when not given)."""
    visible = strip_reasoning(text)
    boxed = _last_boxed(visible)
    extracted = {  # in the order of RULES
        "strict": _last_match_number(pattern or re.compile(STRICT_PATTERN), visible),
        # the case-insensitive regex scan costs ten times the check before it
        "answer-is": (
            _last_match_number(_ANSWER_IS_RE, visible) if "answer" in ascii_lower(visible) else None
        ),
        "boxed": None if boxed is None else _boxed_number(boxed),
        "flexible": _last_prose_number(visible),
        "last-int": last_int(text),  # the whole text, as the peers score it
    }
    correct = {
        rule: numbers_equal(value, label if rule == "last-int" and label is not None else gold)
        for rule, value in extracted.items()
    }
    return SampleScore(extracted=extracted, correct=correct)


@overload
def format_number(d: Decimal) -> str: ...


@overload
def format_number(d: Decimal | None) -> str | None: ...


def format_number(d: Decimal | None) -> str | None:
    """Fixed point, no trailing fractional zeros, no negative zero: equal numbers print alike."""
    if d is None or not d.is_finite():
        return None if d is None else str(d)
    if d == 0:
        return "0"
    s = format(d, "f")
    return s.rstrip("0").rstrip(".") if "." in s else s


def majority_vote(values: Sequence[Decimal | None]) -> tuple[Decimal | None, list[tuple[str, int]]]:
    """maj@N: ``(winner, [(number, votes), ...])`` by votes, a tie to the earliest first vote;
    ``18`` and ``18.00`` pool their votes (Decimal hashes by value); None does not vote."""
    ranked = Counter(v for v in values if v is not None and v.is_finite()).most_common()
    return (ranked[0][0] if ranked else None), [(format_number(k), n) for k, n in ranked]
