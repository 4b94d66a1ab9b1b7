"""``{port}`` and ``{model}`` in a ``--gsm8k-serve`` command line: the model name is data,
never code (:mod:`pytest_gsm8k.core.command`).

Every filled-in line runs for real (through ``/bin/sh`` when it has shell syntax, else
directly), as a program that prints the arguments it got; a marker file shows whether any
part of the model name ran as a command. A line that needs a shell refuses a name that is
not plain, in one line that says to write ``"$GSM8K_MODEL"`` there.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gsm8k.core.command import CommandError, serve_command

#: prints its arguments as JSON: what a server would receive
ECHO_CODE = "import json, sys; print(json.dumps(sys.argv[1:]))"
ECHO = f"{shlex.quote(sys.executable)} -c {shlex.quote(ECHO_CODE)}"
#: a name a shell line may hold: nothing in it means anything to a shell
PLAIN = "Qwen/Qwen3-8B:q4_k_m@rev+1,x=y%2"

HOSTILE = [
    "$(touch {mark})",
    "`touch {mark}`",
    "m & touch {mark} & true",
    "m'; touch {mark}; '",
    'm"; touch {mark}; "',
    "m\ntouch {mark}",
    "m' \"$(touch {mark})\" '",
    "${{HOME}}\\",
]
#: where {model} stands, and what the server must get for it
FORMS = {
    '"{model}"': "{}",
    "'{model}'": "{}",
    "{model}": "{}",
    "pre-{model}-post": "pre-{}-post",
    'pre"{model}"post': "pre{}post",
}
#: the same line without shell syntax (run directly) and with some (run by /bin/sh)
SHAPES = ["{line}", "{line} 2>&1", "GSM8K_TEST_VAR=1 {line}", "{line} | cat"]


@pytest.fixture
def echo(tmp_path: Path) -> str:
    """The echo program as a line without shell syntax (a script file, no ``-c '...'``)."""
    script = tmp_path / "echo.py"
    script.write_text(ECHO_CODE + "\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def _refused_in_one_line(command: str, model: str) -> str:
    with pytest.raises(CommandError) as info:
        serve_command(command, 8123, model)
    message = str(info.value)
    assert "\n" not in message
    assert '"$GSM8K_MODEL"' in message
    assert "would be read as code" in message
    return message


def _run(command: str, model: str, tmp_path: Path) -> list[str]:
    filled = serve_command(command, 8123, model)
    proc = subprocess.run(
        filled.argv,
        env={**os.environ, **filled.env},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    words: list[str] = json.loads(proc.stdout)
    return words


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_a_model_name_reaches_the_server_verbatim_or_is_refused_and_never_runs(
    tmp_path: Path, echo: str, form: str, shape: str
) -> None:
    """Without shell syntax every name reaches the server as it is; through a shell a plain
    name does, and any other is refused in one line before anything runs."""
    mark = tmp_path / "ran"
    command = shape.format(line=f"{echo} --port {{port}} --model {form}")
    for template in HOSTILE:
        model = template.format(mark=shlex.quote(str(mark)))
        if shape == "{line}":
            words = _run(command, model, tmp_path)
            assert words == ["--port", "8123", "--model", FORMS[form].format(model)], model
        else:
            assert "runs through /bin/sh" in _refused_in_one_line(command, model)
        assert not mark.exists(), f"{model!r} in {command!r} ran a command"
    words = _run(command, PLAIN, tmp_path)
    assert words == ["--port", "8123", "--model", FORMS[form].format(PLAIN)]


@pytest.mark.parametrize(
    "command",
    [
        "sh -c 'serve --model {model} --port {port}'",  # run directly, the script is one word
        "sh -c 'serve --model {model} --port {port}' 2>&1",
        'bash -lc "serve --model {model}" --port {port}',
        "bash -c {model} --port {port}",
        "sh -c {model} {port} 2>&1",
        "eval serve {model} --port {port} 2>&1",
    ],
)
def test_a_name_that_would_be_code_in_a_script_is_refused(command: str) -> None:
    message = _refused_in_one_line(command, "$(touch x)")
    filled = serve_command(command, 8123, "Qwen/Qwen3-8B")  # a plain name is fine there
    if filled.argv[0] != "/bin/sh":  # run as words, not through a shell
        assert "stands in a script another program reads" in message
    assert "Qwen/Qwen3-8B" in " ".join(filled.argv)


@pytest.mark.parametrize(
    "command",
    [
        "serve --model $(echo {model}) --port {port}",
        'serve --model "$(echo "{model}")" --port {port}',
        "serve --model `echo {model}` --port {port}",
        "serve --model ${MODEL:-{model}} --port {port}",
        "serve --port {port} --model \\{model}",
        "cat <<EOF | serve --port {port}\n{model}\nEOF",
        "serve --port {port} --model '{model} 2>&1",  # unterminated quote
    ],
)
def test_a_name_inside_an_expansion_is_refused(command: str) -> None:
    _refused_in_one_line(command, "m & touch x")


def test_the_environment_carries_the_values_for_the_user_to_quote(tmp_path: Path) -> None:
    command = f'{ECHO} --port "$GSM8K_PORT" --model "$GSM8K_MODEL" # {{port}}'
    assert _run(command, "$(touch x) '", tmp_path) == ["--port", "8123", "--model", "$(touch x) '"]
    assert not (tmp_path / "x").exists()


def test_model_placeholder_without_a_model_is_refused() -> None:
    with pytest.raises(CommandError, match=r"uses \{model\} but no model is given"):
        serve_command("serve {model} --port {port}", 1, None)
    assert serve_command("serve --port {port}", 1, None).argv == ["serve", "--port", "1"]


def test_server_args_are_spliced_as_words_never_read_by_a_shell() -> None:
    args = ("--enforce-eager", "--speculative-config", '{"method": "mtp"}', "$(touch x)")
    filled = serve_command("vllm serve {model} {server_args} --port {port}", 8000, "org/m", args)
    assert filled.argv == ["vllm", "serve", "org/m", *args, "--port", "8000"]
    with pytest.raises(CommandError, match="only --gsm8k-config fills"):
        serve_command("vllm serve {model} {server_args} --port {port}", 1, "m")
    with pytest.raises(CommandError, match="without shell syntax"):
        serve_command("vllm serve {model} {server_args} --port {port} | tee log", 1, "m", args)
    with pytest.raises(CommandError, match="a word of its own"):
        serve_command("serve --args={server_args} --port {port}", 1, "m", args)
