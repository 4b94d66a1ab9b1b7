"""Cleaning text that came from outside before anyone prints or writes it. Pure.

Two concerns, one module:

* secrets: the API key (from the environment) and credentials in the base URL
  (``user:password@``) must never reach the terminal, a report, a cache
  file or a log, even when a hostile or careless server echoes them back (in
  an error body, or in a 200 reply's text). :class:`Scrubber` replaces every
  occurrence; the runtime applies it where responses and error messages enter
  the engine, so everything downstream only ever sees scrubbed text.
  Command lines (``--gsm8k-serve``) are shown and stored with the run's secrets
  and the values of secret-named options (``--api-key X``, ``HF_TOKEN=X``)
  replaced (:meth:`Scrubber.command`, :func:`redact_options`): the shell may
  have expanded ``$OPENAI_API_KEY`` into the command before pytest saw it. Those values,
  ``VLLM_API_KEY`` and a vLLM config's secrets (its ``server_args``' secret options, its
  ``env``'s secret-named or token-shaped values: :func:`secret_args`, :func:`secret_env`)
  are secrets of the run as well: a server prints its arguments into its log.
* the terminal and Markdown: a model name or an error message from a server
  may hold ANSI escapes, control characters or invisible format characters
  that reorder or hide text (bidi overrides) (:func:`printable`), or Markdown
  syntax (:func:`md_text`, :func:`md_code`).
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from pytest_gsm8k.core.jsontext import escape_surrogates

REDACTED = "[redacted]"
#: a secret shorter than this is not scrubbed from answers: replacing, say, a 2-character
#: "key" everywhere would corrupt the model's answers (numbers included), and a key that
#: short protects nothing anyway
MIN_SECRET = 6

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: invisible characters that reorder, hide or smuggle text (bidi embeddings, overrides,
#: isolates and marks; zero-width space, word joiner and invisible operators; the byte
#: order mark; interlinear annotations; tag characters; musical format controls), the line
#: and paragraph separators some terminals break lines at, and lone surrogates (which
#: cannot even be encoded). Zero-width (non-)joiners are kept: scripts such as Persian
#: and emoji sequences need them, and they hide nothing on their own.
_FORMAT = re.compile(
    "[\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)
#: what names a secret: at the end of an option's or a variable's name (``--hftoken``), or
#: as one part of it (``--secret-key``, ``AWS_SECRET_ACCESS_KEY``) unless the last part
#: says the value only points at one (``--hf-token-file``: a path); ``--max-tokens`` and
#: ``--tokenizer`` are not secret names
_SECRET_WORD = r"(?:api[-_]?key|token|secret|password|passwd)"
_SECRET_END = re.compile(rf"{_SECRET_WORD}$", re.IGNORECASE)
_SECRET_PARTS = {"key", "token", "secret", "password", "passwd", "credential", "credentials"}
_SECRET_PARTS |= {"auth", "apikey"}
_POINTER_PARTS = {"file", "path", "dir", "env", "var", "id", "ids"}
_VALUE = r"""(?P<value>"[^"]*"|'[^']*'|(?!-)[^\s"']+)"""
#: an option and its value (a shell word: quoted, or up to the next blank; never an option)
_OPTION = re.compile(rf"(?<![\w.-])(?P<name>--?[\w.-]+)(?P<sep>=|\s+){_VALUE}")
#: secrets inside a word: a URL's password, a JSON key's string value, a ``k=v`` pair
#: (``HF_TOKEN=x``, ``a=1,token=x``); ``name`` is None for the URL, whose password it is
_INSIDE = (
    re.compile(r"""(?P<sep>\b[a-z][a-z0-9+.-]*://[^\s/@'"]*:)(?P<value>[^\s/'"]+)@""", re.I),
    re.compile(r'(?P<name>"[^"\\]*")(?P<sep>\s*:\s*)"(?P<value>(?:[^"\\]|\\.)*)"'),
    re.compile(
        r"""(?<![\w.-])(?P<name>[a-z_][\w.-]*)(?P<sep>=)(?P<value>"[^"]*"|'[^']*'|[^\s"',;}]+)""",
        re.I,
    ),
)
#: a value that only names a variable (``$OPENAI_API_KEY``): not a secret, kept
_VARIABLE = re.compile(r"""["']?\$\{?\w+\}?["']?""")
#: one argument that is an option, or gives one or a variable its value (``--api-key=X``,
#: ``HF_TOKEN=X``)
_FLAG = re.compile(r"--?[\w.-]+")
_ASSIGNMENT = re.compile(r"(?P<name>--?[\w.-]+|[a-z_]\w*)=(?P<value>.*)", re.IGNORECASE | re.DOTALL)
#: a value that is a key whatever its variable is called: the usual tokens' prefixes
_KEYLIKE = re.compile(
    r"(?:sk|pk|rk)-[\w-]{8,}|hf_\w{8,}|gh[pousr]_\w{8,}|github_pat_\w{8,}|glpat-[\w-]{8,}"
    r"|xox[abporst]-[\w-]{8,}|AKIA[0-9A-Z]{12,}"
)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#!~])")


def shown_url(url: str) -> str:
    """``url`` fit to print or store (reports, the page, error lines): without the user
    info, query or fragment, where a secret can hide (``user:pw@``, ``?api-key=``); the
    host (an IPv6 one in its brackets), port and path as written."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "(unparseable URL)"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class Scrubber:
    """Replaces the secrets it was given (and their usual encodings) in text."""

    def __init__(
        self, api_key: str | None = None, base_url: str | None = None, others: Iterable[str] = ()
    ) -> None:
        pairs: list[tuple[str, str]] = []
        secrets = [s for s in (api_key, *others) if s and len(s) >= MIN_SECRET]
        if base_url:
            parts = urlsplit(base_url)
            netloc = parts.netloc
            if "@" in netloc:
                userinfo = netloc.rsplit("@", 1)[0]
                pairs.append((userinfo + "@", ""))  # the URL without its credentials
                user, _, password = userinfo.partition(":")
                for raw in {password, unquote(password)}:
                    if len(raw) >= MIN_SECRET:
                        secrets.append(raw)
                basic = f"{unquote(user)}:{unquote(password)}"
                if password:
                    secrets.append(base64.b64encode(basic.encode()).decode())
        for secret in sorted(set(secrets), key=len, reverse=True):
            pairs.append((secret, REDACTED))
        self.pairs = pairs

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def text(self, value: str) -> str:
        for secret, replacement in self.pairs:
            if secret in value:
                value = value.replace(secret, replacement)
        return value

    def command(self, value: str) -> str:
        """A command line fit to show or store: the run's secrets and the values of
        secret-named options replaced (:func:`redact_options`)."""
        return redact_options(self.text(value))

    def words(self, words: Sequence[str]) -> list[str]:
        """A command's arguments fit to show or store (:meth:`command`, word by word)."""
        return [self.text(word) for word in secret_args(words)[0]]

    def obj(self, value: Any) -> Any:
        """``value`` with every string inside (dict keys and values, lists) scrubbed."""
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
    """Whether an option, variable or key called ``name`` holds a secret (:data:`_SECRET_WORD`)."""
    name = name.strip("\"'-")
    parts = re.split(r"[-_.]+", name.lower())
    if parts[-1] in _POINTER_PARTS:
        return False
    return bool(_SECRET_END.search(name)) or not _SECRET_PARTS.isdisjoint(parts)


def _kept(value: str) -> bool:
    """Whether a secret-named ``value`` is shown as it is: empty, hidden already, or only
    the name of a variable (``$OPENAI_API_KEY``)."""
    return value in ("", REDACTED) or bool(_VARIABLE.fullmatch(value))


def _hide(match: re.Match[str], values: list[str]) -> str:
    """``match`` with its ``value`` replaced if its ``name`` (a URL has none) is a secret's;
    the value (and a URL password's decoded form) added to ``values``."""
    name = match.groupdict().get("name")
    value = match["value"]
    if (name is not None and not _secret_name(name)) or _kept(value):
        return match[0]
    values += [value] if name is not None or unquote(value) == value else [value, unquote(value)]
    start, end = match.start("value") - match.start(), match.end("value") - match.start()
    return match[0][:start] + REDACTED + match[0][end:]


def _inside(text: str, values: list[str]) -> str:
    """``text`` with the secrets inside a word replaced (:data:`_INSIDE`), added to ``values``."""
    for pattern in _INSIDE:
        text = pattern.sub(lambda match: _hide(match, values), text)
    return text


def redact_options(command: str) -> str:
    """``command`` with the value of every option or assignment named like a secret
    (``--api-key X``, ``--secret-key=X``, ``HF_TOKEN=X``), every URL password and every
    secret-named JSON key's value replaced; a value that only names a variable
    (``$OPENAI_API_KEY``) is kept."""
    values: list[str] = []
    return _inside(_OPTION.sub(lambda match: _hide(match, values), command), values)


def secret_args(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """``words`` (a command's arguments) with the value of every option or assignment named
    like a secret replaced (``--api-key X``, ``--api-key=X``, ``HF_TOKEN=X``), and URL
    passwords and secret-named keys' values inside a word (``{"hf_token": X}``), and those
    values: the server prints its arguments, so they are secrets of the run (a value that
    only names a variable is neither)."""
    shown: list[str] = []
    values: list[str] = []
    previous = ""
    for word in words:
        assigned = _ASSIGNMENT.fullmatch(word)
        if assigned and _secret_name(assigned["name"]) and not _kept(assigned["value"]):
            values.append(assigned["value"])
            word = f"{assigned['name']}={REDACTED}"
        elif _FLAG.fullmatch(previous) and _secret_name(previous) and word[:1] != "-":
            if not _kept(word):
                values.append(word)
                word = REDACTED
        else:
            word = _inside(word, values)
        shown.append(word)
        previous = word
    return shown, values


def command_secrets(command: str) -> list[str]:
    """The secret option values of a command line (:func:`secret_args` of its words)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return secret_args(words)[1]


def secret_env(variables: Iterable[tuple[str, str]]) -> list[str]:
    """The values of ``variables`` that are secrets: named like one (``HF_TOKEN``,
    ``VLLM_API_KEY``), or shaped like a token whatever the name (``sk-...``, ``hf_...``)."""
    return [value for name, value in variables if _secret_name(name) or _KEYLIKE.fullmatch(value)]


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` fit for one terminal line: ANSI escape sequences and control characters
    removed (newlines -> spaces), invisible format characters that could reorder or hide
    text (a right-to-left override) shown as escapes (``\\u202e``)."""
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    return escape_surrogates(_FORMAT.sub(_escape, _CONTROL.sub("", text)))


def md_text(text: str) -> str:
    """``text`` fit for a Markdown line: printable, its Markdown syntax escaped."""
    return _MD_SPECIAL.sub(r"\\\1", printable(text))


def md_code(text: str) -> str:
    """``text`` as inline code: printable, in a backtick fence longer than any run inside."""
    text = printable(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
