"""Cleaning text that came from outside before anyone prints or writes it. Pure.

Two concerns, one module:

* secrets: the API key (from the environment) and credentials in the base URL
  (``user:password@``) must never reach the terminal, a report, a cache
  file or a log, even when a hostile or careless server echoes them back (in
  an error body, or in a 200 reply's text). :class:`Scrubber` replaces every
  occurrence; the runtime applies it where responses and error messages enter
  the engine, so everything downstream only ever sees scrubbed text.
* the terminal and Markdown: a model name or an error message from a server
  may hold ANSI escapes or control characters (:func:`printable`), or Markdown
  syntax (:func:`md_text`, :func:`md_code`).
"""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from pytest_gsm8k.core.jsontext import escape_surrogates

REDACTED = "[redacted]"
#: a secret shorter than this is not scrubbed from answers: replacing, say, a 2-character
#: "key" everywhere would corrupt the model's answers (numbers included), and a key that
#: short protects nothing anyway
MIN_SECRET = 6

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#!~])")


class Scrubber:
    """Replaces the secrets it was given (and their usual encodings) in text."""

    def __init__(self, api_key: str | None = None, base_url: str | None = None) -> None:
        pairs: list[tuple[str, str]] = []
        secrets: list[str] = []
        if api_key and len(api_key) >= MIN_SECRET:
            secrets.append(api_key)
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


def printable(text: str) -> str:
    """``text`` without ANSI escape sequences and control characters (newlines -> spaces),
    a lone surrogate shown as its ``\\uXXXX`` escape (a terminal cannot encode it)."""
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    return escape_surrogates(_CONTROL.sub("", text))


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
