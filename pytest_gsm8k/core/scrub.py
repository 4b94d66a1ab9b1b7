"""Cleaning text from outside before anyone prints or writes it. Pure. Secrets (the API key,
a URL's password, secret-named options and variables) never reach terminal, report, cache or
log, even echoed back by a server; terminal text loses escapes and invisible characters."""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "[redacted]"
#: a shorter secret is not scrubbed: replacing a 2-character "key" everywhere would corrupt
#: the answers, and a key that short protects nothing
MIN_SECRET = 6

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: invisible characters that reorder, hide or smuggle text (bidi controls, zero-width and
#: invisible operators, BOM, annotations, tags), line separators, lone surrogates; the
#: zero-width (non-)joiners stay (Persian and emoji need them, they hide nothing alone)
_FORMAT = re.compile(
    "[\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)
#: what names a secret: the end of a name (``--hftoken``) or one part of it (``--secret-key``)
#: unless the last part points at one (``--hf-token-file``); ``--max-tokens`` is no secret
_SECRET_END = re.compile(r"(?:api[-_]?key|token|secret|password|passwd)$", re.IGNORECASE)
_SECRET_PARTS = {"key", "token", "secret", "password", "passwd", "credential", "credentials"}
_SECRET_PARTS |= {"auth", "apikey"}
_POINTER_PARTS = {"file", "path", "dir", "env", "var", "id", "ids"}
_VALUE = r"""(?P<value>"[^"]*"|'[^']*'|(?!-)[^\s"']+)"""
#: an option and its value (a shell word: quoted, or up to the next blank; never an option)
_OPTION = re.compile(rf"(?<![\w.-])(?P<name>--?[\w.-]+)(?P<sep>=|\s+){_VALUE}")
#: secrets inside a word: a URL's password, a JSON key's string value, a ``k=v`` pair
#: (``HF_TOKEN=x``, ``a=1,token=x``); ``name`` is None for the URL, whose password it is
_INSIDE = (
    # scheme bounded and user without a colon (the password is all after the first, as
    # urlsplit reads it): a try at each position costs little, never the rest of the text
    re.compile(r"""(?P<sep>[a-z][a-z0-9+.-]{0,63}://[^\s/@'":]*:)(?P<value>[^\s/'"]+)@""", re.I),
    re.compile(r'(?P<name>"[^"\\]*")(?P<sep>\s*:\s*)"(?P<value>(?:[^"\\]|\\.)*)"'),
    re.compile(
        r"""(?<![\w.-])(?P<name>[a-z_][\w.-]*)(?P<sep>=)(?P<value>"[^"]*"|'[^']*'|[^\s"',;}]+)""",
        re.I,
    ),
)
#: a secret-named value shown as it is: empty, hidden already, or a ``$VARIABLE``
_KEPT = re.compile("|" + re.escape(REDACTED) + r"""|["']?\$\{?\w+\}?["']?""")
#: one argument that is an option, or gives one or a variable its value (``HF_TOKEN=X``)
_FLAG = re.compile(r"--?[\w.-]+")
_ASSIGNMENT = re.compile(r"(?P<name>--?[\w.-]+|[a-z_]\w*)=(?P<value>.*)", re.IGNORECASE | re.DOTALL)
#: a value that is a key whatever its variable is called: the usual tokens' prefixes
_KEYLIKE = re.compile(
    r"(?:sk|pk|rk)-[\w-]{8,}|hf_\w{8,}|gh[pousr]_\w{8,}|github_pat_\w{8,}|glpat-[\w-]{8,}"
    r"|xox[abporst]-[\w-]{8,}|AKIA[0-9A-Z]{12,}"
)


def shown_url(url: str) -> str:
    """``url`` fit to print or store: without the user info, query or fragment, where a secret
    can hide (``user:pw@``, ``?api-key=``); host (IPv6 in brackets), port and path as written."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "(unparseable URL)"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class Scrubber:
    """Replaces the secrets it was given (and their usual encodings) in text."""

    def __init__(self, api_key: str | None, base_url: str | None, others: Iterable[str]) -> None:
        self.pairs: list[tuple[str, str]] = []
        secrets = {s for s in (api_key, *others) if s and len(s) >= MIN_SECRET}
        # not urlsplit: it raises on a URL the preflight refuses later ("http://u:p@[::1")
        netloc = re.split(r"[/?#]", (base_url or "").partition("//")[2], maxsplit=1)[0]
        userinfo, at, _ = netloc.rpartition("@")
        if at:
            self.pairs.append((userinfo + "@", ""))  # the URL without its credentials
            user, _, password = userinfo.partition(":")
            secrets |= {p for p in (password, unquote(password)) if len(p) >= MIN_SECRET}
            if password:
                basic = f"{unquote(user)}:{unquote(password)}".encode()
                secrets.add(base64.b64encode(basic).decode())
        self.pairs += [(s, REDACTED) for s in sorted(secrets, key=len, reverse=True)]

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def text(self, value: str, cut: bool = False) -> str:
        """``cut``: ``value`` may end inside a secret (an excerpt cut short): that tail goes too."""
        for secret, replacement in self.pairs:
            value = value.replace(secret, replacement)
            ends = [n for n in range(MIN_SECRET, len(secret) * cut) if value.endswith(secret[:n])]
            value = value[: -max(ends)] + replacement if ends else value
        return value

    def command(self, value: str) -> str:
        return redact_options(self.text(value))

    def words(self, words: Sequence[str]) -> list[str]:
        return [self.text(word) for word in secret_args(words)[0]]

    def obj(self, value: Any) -> Any:
        if not self.pairs:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.obj(k): self.obj(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.obj(v) for v in value)
        return value


def _secret_name(name: str) -> bool:
    """Whether an option, variable or key called ``name`` holds a secret (:data:`_SECRET_END`)."""
    name = name.strip("\"'-")
    parts = re.split(r"[-_.]+", name.lower())
    pointer = parts[-1] in _POINTER_PARTS
    return not pointer and (bool(_SECRET_END.search(name)) or not _SECRET_PARTS.isdisjoint(parts))


def _hide(match: re.Match[str], values: list[str]) -> str:
    """``match`` with its ``value`` replaced if its ``name`` (a URL has none) is a secret's,
    the value (and a URL password decoded) added to ``values``."""
    name = match.groupdict().get("name")
    value = match["value"]
    if (name is not None and not _secret_name(name)) or _KEPT.fullmatch(value):
        return match[0]
    values += [value] if name is not None or unquote(value) == value else [value, unquote(value)]
    start, end = match.start("value") - match.start(), match.end("value") - match.start()
    return match[0][:start] + REDACTED + match[0][end:]


def _inside(text: str, values: list[str], patterns: Sequence[re.Pattern[str]] = _INSIDE) -> str:
    for pattern in patterns:
        text = pattern.sub(lambda match: _hide(match, values), text)
    return text


def redact_options(command: str) -> str:
    """``command`` with the value of every option, assignment or JSON key named like a secret
    (``--api-key X``, ``HF_TOKEN=X``) and every URL password replaced."""
    return _inside(command, [], (_OPTION, *_INSIDE))


def secret_args(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """``words`` with secret values replaced as :func:`redact_options` does, and those values
    (the server prints its arguments: they are secrets of the run)."""
    shown: list[str] = []
    values: list[str] = []
    previous = ""
    for word in words:
        assigned = _ASSIGNMENT.fullmatch(word)
        if assigned and _secret_name(assigned["name"]) and not _KEPT.fullmatch(assigned["value"]):
            values.append(assigned["value"])
            word = f"{assigned['name']}={REDACTED}"
        elif _FLAG.fullmatch(previous) and _secret_name(previous) and word[:1] != "-":
            if not _KEPT.fullmatch(word):
                values.append(word)
                word = REDACTED
        else:
            word = _inside(word, values)
        shown.append(word)
        previous = word
    return shown, values


def command_secrets(command: str) -> list[str]:
    try:
        return secret_args(shlex.split(command))[1]
    except ValueError:  # unbalanced quotes
        return secret_args(command.split())[1]


def secret_env(variables: Iterable[tuple[str, str]]) -> list[str]:
    return [value for name, value in variables if _secret_name(name) or _KEYLIKE.fullmatch(value)]


def printable(text: str) -> str:
    """``text`` fit for one terminal line: ANSI escapes and control characters removed
    (newlines -> spaces), invisible format characters shown as escapes (``\\u202e``)."""
    text = _ANSI.sub("", text).replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    # every _FORMAT character (lone surrogates too) is above U+00FF: a \uXXXX or \UXXXXXXXX
    return _FORMAT.sub(lambda m: m[0].encode("unicode_escape").decode(), _CONTROL.sub("", text))


def md_text(text: str) -> str:
    return re.sub(r"([\\`*_\[\]<>|#!~])", r"\\\1", printable(text))


def md_code(text: str) -> str:
    """``text`` as inline code, in a backtick fence longer than any run inside."""
    text = printable(text)
    fence = "`" * (max(map(len, re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
