"""Fill ``{port}`` and ``{model}`` into a ``--gsm8k-serve`` command line so that the
model name can never become code.

A line without shell syntax is split into words (``shlex``) and run directly: the
values go into the words as they are, and no shell ever reads them. A line with shell
syntax runs through ``/bin/sh -c``. There the port (digits) is written in, and so is a
model name made only of characters no shell or interpreter treats specially (letters,
digits and ``._/:@+,=%-``, which covers every model id and path seen in practice). Any
other model name stays out of the shell text: the server's environment carries it as
``GSM8K_MODEL`` and the placeholder becomes a reference to it, quoted to fit where it
stands::

    unquoted   {model}     ->  "${GSM8K_MODEL}"
    in "..."   "{model}"   ->  "${GSM8K_MODEL}"    (the reference alone)
    in '...'   '{model}'   ->  ''"${GSM8K_MODEL}"''  (the single quotes close around it)

A shell expands a variable once and never reads its value as code, so quotes, ``$(...)``
or ``&`` in the name stay text. Where the text would be read as code a second time
(inside ``$(...)``, backquotes, ``${...}`` or a here-document; or in a script handed to
another program: a quoted string or word of several words, the word after ``-c``, a
line with ``eval``), such a name is refused with one line that says to write
``"$GSM8K_MODEL"`` there instead (the variable is always set, also for plain names).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

__all__ = [
    "MODEL_ENV",
    "PORT_ENV",
    "CommandError",
    "ServeCommand",
    "needs_shell",
    "serve_command",
]

MODEL_ENV = "GSM8K_MODEL"
PORT_ENV = "GSM8K_PORT"

_MODEL = "{model}"
_PORT = "{port}"
#: characters that make a command line need a shell (pipes, lists, redirections, expansions)
_SHELL_SYNTAX = re.compile(r"[;&|<>()$`\\\n*?~]|^\s*\w+=")
#: a model name of these characters means the same to every shell and interpreter
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._/:@+,=%-]*\Z")
#: a short option that takes a script: -c, and clusters ending in it (-lc, -ec)
_SCRIPT_FLAG = re.compile(r"-[A-Za-z]*c\Z")
_VARIABLE = "${" + MODEL_ENV + "}"
_REFERENCE = {"plain": f'"{_VARIABLE}"', "double": _VARIABLE, "single": f"'\"{_VARIABLE}\"'"}
_CONTEXTS = {"top": "plain", "sq": "single", "dq": "double"}
_HINT = f'write "${MODEL_ENV}" there instead (the plugin sets it to the model name)'


class CommandError(ValueError):
    """The command line cannot be filled in safely; the message is one line for the user."""


@dataclass(frozen=True)
class ServeCommand:
    """What to run: the argv (``/bin/sh -c LINE`` when the line needs a shell) and the
    variables to add to the server's environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def needs_shell(command: str) -> bool:
    """Whether ``command`` uses shell syntax (then it runs through ``/bin/sh -c``)."""
    return _SHELL_SYNTAX.search(command) is not None


_SERVER_ARGS = "{server_args}"


def serve_command(
    command: str, port: int, model: str | None, server_args: tuple[str, ...] | None = None
) -> ServeCommand:
    """``command`` with ``{port}`` and ``{model}`` filled in (see the module docstring).

    :raises CommandError: ``{model}`` without a model name, a line ``shlex`` cannot split,
        or a model name that would be read as code where ``{model}`` stands.
    """
    if _SERVER_ARGS in command:
        if server_args is None:
            raise CommandError(
                "the command line uses {server_args}, which only --gsm8k-config fills "
                "(a config's server_args and the flags vLLM's test adds)"
            )
        if needs_shell(command):
            raise CommandError(
                "{server_args} needs a command line without shell syntax (its words are "
                "passed as they are, never read by a shell)"
            )
    if _MODEL in command and model is None:
        raise CommandError("the command line uses {model} but no model is given: add --gsm8k-model")
    name = model or ""
    env = {PORT_ENV: str(port), MODEL_ENV: name}
    line = command.replace(_PORT, str(port))
    if needs_shell(command):
        return ServeCommand(["/bin/sh", "-c", _fill_shell_line(line, name)], env)
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise CommandError(f"cannot split the command line ({exc})") from None
    previous = ""
    for word in words:
        script = _SCRIPT_FLAG.match(previous) or re.search(r"\s", word.replace(_MODEL, ""))
        if _MODEL in word and script and not _PLAIN_NAME.match(name):
            raise CommandError(_script_message(name))
        previous = word
    argv: list[str] = []
    for word in words:
        if word == _SERVER_ARGS:
            argv.extend(server_args or ())
        elif _SERVER_ARGS in word:
            raise CommandError("{server_args} must be a word of its own in the command line")
        else:
            argv.append(word.replace(_MODEL, name))
    return ServeCommand(argv, env)


def _fill_shell_line(line: str, name: str) -> str:
    if _MODEL not in line or _PLAIN_NAME.match(name):
        return line.replace(_MODEL, name)
    out: list[str] = []
    last = 0
    for spot in _scan(line):
        if spot.context == "nested":
            raise CommandError(
                f"{{model}} stands inside $(...), backquotes, ${{...}}, a here-document or "
                f"after a backslash, where the model name {_shown(name)} would be read as "
                f"shell code; {_HINT}"
            )
        if spot.script:
            raise CommandError(_script_message(name))
        out += [line[last : spot.index], _REFERENCE[spot.context]]
        last = spot.index + len(_MODEL)
    out.append(line[last:])
    return "".join(out)


def _script_message(name: str) -> str:
    return (
        "{model} stands in a script another program reads (a quoted string of several "
        f"words, the word after -c, or a line with eval), where the model name {_shown(name)} "
        f"would be read as code; {_HINT}"
    )


def _shown(name: str) -> str:
    shown = name if len(name) <= 60 else name[:57] + "..."
    return repr(shown)


@dataclass
class _Frame:
    """An open quote or expansion: its kind and, for ``$(``/``$((``, the parens open in it."""

    kind: str  # "top", "sq", "dq", "bq", "cmd" or "brace"
    depth: int = 0


@dataclass
class _Spot:
    """One ``{model}`` in a shell line: where, in which quoting, whether in a script."""

    index: int
    context: str  # "plain", "double", "single" or "nested"
    script: bool


def _scan(line: str) -> list[_Spot]:
    """Every ``{model}`` of a POSIX shell line with the quoting it stands in.

    Tracks quotes, backslashes, ``$(...)``, ``$((...))``, backquotes and ``${...}``
    (nested to any depth), comments, and the words of the outer level (for ``-c`` and
    ``eval``). A here-document or an unterminated construct makes every ``{model}``
    from there on "nested", i.e. refused unless the name is plain.
    """
    spots: list[_Spot] = []
    frames = [_Frame("top")]
    quote: tuple[int, list[_Spot]] | None = None  # an outer-level quote: start, its spots
    words: list[str] = []
    word_start: int | None = None
    heredoc = False
    i, n = 0, len(line)

    def push(kind: str, depth: int = 0) -> None:
        nonlocal quote
        if len(frames) == 1 and kind in ("sq", "dq"):
            quote = (i, [])
        frames.append(_Frame(kind, depth))

    def pop() -> None:
        nonlocal quote
        frames.pop()
        if len(frames) == 1 and quote is not None:
            start, inside = quote
            if re.search(r"\s", line[start + 1 : i].replace(_MODEL, "")):
                for spot in inside:
                    spot.script = True
            quote = None

    def opens_expansion() -> int:
        """Length of a ``$((``, ``$(`` or ``${`` at ``i`` (pushed), else 0."""
        if line.startswith("$((", i):
            push("cmd", 1)
            return 3
        if line.startswith("$(", i):
            push("cmd")
            return 2
        if line.startswith("${", i):
            push("brace")
            return 2
        return 0

    while i < n:
        kind = frames[-1].kind
        if line.startswith(_MODEL, i):
            outer = frames[1].kind if len(frames) > 1 else "top"
            nested = (
                heredoc
                or len(frames) > 2
                or outer not in ("top", "sq", "dq")
                or (i > 0 and line[i - 1] == "\\")
            )
            context = "nested" if nested else _CONTEXTS[outer]
            if len(frames) == 1 and word_start is None:
                word_start = i
            previous = words[-1] if words else ""
            spot = _Spot(i, context, "eval" in words or bool(_SCRIPT_FLAG.match(previous)))
            spots.append(spot)
            if quote is not None and len(frames) == 2:
                quote[1].append(spot)
            i += len(_MODEL)
            continue
        c = line[i]
        if kind == "top":
            if c in " \t\n;&|<>()":
                if word_start is not None:
                    words.append(line[word_start:i])
                    word_start = None
                heredoc = heredoc or line.startswith("<<", i)
                i += 1
                continue
            if c == "#" and word_start is None:
                end = line.find("\n", i)
                i = n if end < 0 else end
                continue
            if word_start is None:
                word_start = i
        if kind in ("top", "cmd", "brace"):
            if c == "\\":
                i += 1 if line.startswith(_MODEL, i + 1) else 2  # an escaped {model}: refused below
                continue
            if c == "'":
                push("sq")
            elif c == '"':
                push("dq")
            elif c == "`":
                push("bq")
            elif (skip := opens_expansion()) > 0:
                i += skip
                continue
            elif kind == "cmd" and c == "(":
                frames[-1].depth += 1
            elif kind == "cmd" and c == ")":
                if frames[-1].depth == 0:
                    pop()
                else:
                    frames[-1].depth -= 1
            elif kind == "brace" and c == "}":
                pop()
            i += 1
            continue
        if kind == "sq":
            if c == "'":
                pop()
            i += 1
            continue
        if c == "\\":  # dq and bq: a backslash quotes the next character
            i += 1 if line.startswith(_MODEL, i + 1) else 2  # an escaped {model}: refused below
            continue
        if kind == "dq":
            if c == '"':
                pop()
            elif c == "`":
                push("bq")
            elif (skip := opens_expansion()) > 0:
                i += skip
                continue
        elif c == "`":  # bq ends
            pop()
        i += 1
    if len(frames) > 1:  # unterminated: the shell will refuse the line; refuse names too
        for spot in spots:
            spot.context = "nested"
    return spots
