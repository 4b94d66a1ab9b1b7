"""``{port}`` and ``{model}`` in a ``--gsm8k-serve`` command line: the model name is data,
never code (:mod:`pytest_gsm8k.core.command`).

Every filled-in line runs for real (through ``/bin/sh`` when it has shell syntax, else
directly), as a program that prints the arguments it got; a marker file shows whether any
part of the model name ran as a command.
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
ECHO = f"{shlex.quote(sys.executable)} -c 'import json, sys; print(json.dumps(sys.argv[1:]))'"

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
def test_a_model_name_reaches_the_server_verbatim_and_never_runs(
    tmp_path: Path, form: str, shape: str
) -> None:
    mark = tmp_path / "ran"
    command = shape.format(line=f"{ECHO} --port {{port}} --model {form}")
    for template in HOSTILE:
        model = template.format(mark=shlex.quote(str(mark)))
        words = _run(command, model, tmp_path)
        assert words == ["--port", "8123", "--model", FORMS[form].format(model)], model
        assert not mark.exists(), f"{model!r} in {command!r} ran a command"


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
    with pytest.raises(CommandError) as info:
        serve_command(command, 8123, "$(touch x)")
    message = str(info.value)
    assert "stands in a script another program reads" in message
    assert "\n" not in message
    assert '"$GSM8K_MODEL"' in message
    filled = serve_command(command, 8123, "Qwen/Qwen3-8B")  # a plain name is fine there
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
    with pytest.raises(CommandError, match=r"stands inside \$\(\.\.\.\), backquotes"):
        serve_command(command, 8123, "m & touch x")


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
