"""Fill ``{port}`` and ``{model}`` into a ``--gsm8k-serve`` line so the name never becomes code:
a line without shell syntax runs as shlex words; through ``/bin/sh`` only a plain name is written
in, any other is refused with one line: write ``"$GSM8K_MODEL"`` (set in the server's env)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from pytest_gsm8k.core.scrub import clip

MODEL_ENV, PORT_ENV = "GSM8K_MODEL", "GSM8K_PORT"
_MODEL, _PORT, _SERVER_ARGS = "{model}", "{port}", "{server_args}"
#: characters that make a command line need a shell (pipes, lists, redirections, expansions)
_SHELL_SYNTAX = re.compile(r"[;&|<>()$`\\\n*?~]|^\s*\w+=")
#: a model name of these characters means the same to every shell and interpreter
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._/:@+,=%-]*\Z")
#: a short option that takes a script: -c, and clusters ending in it (-lc, -ec)
_SCRIPT_FLAG = re.compile(r"-[A-Za-z]*c\Z")
_HINT = f'write "${MODEL_ENV}" where {{model}} stands instead (the plugin sets it to the name)'


class CommandError(ValueError):
    """The command line cannot be filled in safely; the message is one line for the user."""


@dataclass(frozen=True)
class ServeCommand:
    """The argv (``/bin/sh -c LINE`` when the line needs a shell) and the server's variables."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def serve_command(
    command: str, port: int, model: str | None, server_args: tuple[str, ...] | None = None
) -> ServeCommand:
    """``command`` with ``{port}``, ``{model}`` and ``{server_args}`` filled in; CommandError
    where that cannot be done safely."""
    shell = _SHELL_SYNTAX.search(command) is not None
    if _SERVER_ARGS in command:
        if server_args is None:
            raise CommandError(
                "the command line uses {server_args}, which only --gsm8k-config fills "
                "(a config's server_args and the flags vLLM's test adds)"
            )
        if shell:
            raise CommandError(
                "{server_args} needs a command line without shell syntax (its words are "
                "passed as they are, never read by a shell)"
            )
    if _MODEL in command and model is None:
        raise CommandError("the command line uses {model} but no model is given: add --gsm8k-model")
    name = model or ""
    env = {PORT_ENV: str(port), MODEL_ENV: name}
    line = command.replace(_PORT, str(port))
    if shell:
        if _MODEL in line and not _PLAIN_NAME.match(name):
            raise CommandError(
                f"the command line runs through /bin/sh, where the model name {clip(name, 60)!r} "
                f"(not only letters, digits and ._/:@+,=%-) would be read as code; {_HINT}"
            )
        return ServeCommand(["/bin/sh", "-c", line.replace(_MODEL, name)], env)
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise CommandError(f"cannot split the command line ({exc})") from None
    argv: list[str] = []
    for previous, word in zip(["", *words], words, strict=False):
        script = _SCRIPT_FLAG.match(previous) or re.search(r"\s", word.replace(_MODEL, ""))
        if _MODEL in word and script and not _PLAIN_NAME.match(name):
            raise CommandError(
                "{model} stands in a script another program reads (a quoted string of several "
                f"words, or the word after -c), where the model name {clip(name, 60)!r} would be "
                f"read as code; {_HINT}"
            )
        if word == _SERVER_ARGS:
            argv.extend(server_args or ())
        elif _SERVER_ARGS in word:
            raise CommandError("{server_args} must be a word of its own in the command line")
        else:
            argv.append(word.replace(_MODEL, name))
    return ServeCommand(argv, env)
