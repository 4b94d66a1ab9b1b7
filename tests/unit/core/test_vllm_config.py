"""vLLM's GSM8K config YAMLs: their fields with vLLM's test's defaults, and one-line errors."""

from __future__ import annotations

import pytest

from pytest_gsm8k.core.gates import ToleranceFloor
from pytest_gsm8k.core.vllm_config import ConfigError, VllmConfig, parse, parse_list

QWEN = """\
model_name: "Qwen/Qwen3-0.6B-FP8"
accuracy_threshold: 0.375
num_questions: 1319
num_fewshot: 5
server_args: "--enforce-eager --max-model-len 4096"
"""


def test_a_config_of_vllms_own_gets_its_tests_defaults() -> None:
    config = parse(QWEN, "configs/Qwen3-0.6B-FP8.yaml", "Qwen3-0.6B-FP8")
    assert config == VllmConfig(
        name="Qwen3-0.6B-FP8",
        source="configs/Qwen3-0.6B-FP8.yaml",
        model_name="Qwen/Qwen3-0.6B-FP8",
        accuracy_threshold=0.375,
        num_questions=1319,
        num_fewshot=5,
        server_args=("--enforce-eager", "--max-model-len", "4096"),
        given=("model_name", "accuracy_threshold", "num_questions", "num_fewshot", "server_args"),
    )
    assert config.tolerance == 0.08
    assert ToleranceFloor(config.name, config.accuracy_threshold, config.tolerance).floor == (
        0.375 - 0.08
    )
    assert config.startup_max_wait_seconds == 1200
    assert (config.max_tokens, config.temperature, config.seed) == (256, 0.0, 42)
    assert config.serve_args() == (
        "--enforce-eager",
        "--max-model-len",
        "4096",
        "--trust-remote-code",
        "--disable-uvicorn-access-log",
        "--seed",
        "0",
    )


def test_folded_server_args_env_and_tolerance() -> None:
    text = """\
model_name: "deepseek-ai/DeepSeek-R1"
accuracy_threshold: 0.95
tolerance: 0.02
num_questions: 50
num_fewshot: 3
startup_max_wait_seconds: 2400
server_args: >-
  --enforce-eager
  --speculative-config '{"method":"mtp","num_speculative_tokens":1}'
env:
  VLLM_USE_DEEP_GEMM: "1"
  VLLM_LOGGING_LEVEL: DEBUG
  RETRIES: 3
"""
    config = parse(text, "r1.yaml", "r1")
    assert config.server_args == (
        "--enforce-eager",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":1}',
    )
    assert config.tolerance == 0.02
    assert config.serve_env() == {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_USE_DEEP_GEMM": "1",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "RETRIES": "3",
        "VLLM_ENGINE_READY_TIMEOUT_S": "2400",
    }


def test_a_field_vllms_test_never_reads_is_ignored_as_it_ignores_it() -> None:
    config = parse(QWEN + "max_model_len: 4096\n", "q.yaml", "q")
    assert config.model_name == "Qwen/Qwen3-0.6B-FP8"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("acuracy_threshold: 0.5\n", "q.yaml:6: acuracy_threshold: unknown field"),
        ("min_acceptance_length: 2.1\n", "q.yaml:6: min_acceptance_length: not supported"),
        ("tolerance: -0.1\n", "q.yaml:6: tolerance: must be >= 0"),
        ("tolerance: high\n", "q.yaml:6: tolerance: expected a number, got 'high'"),
        ("env: [A]\n", "q.yaml:6: env: expected a mapping"),
        ("env:\n  FLAG: true\n", "q.yaml:7: env.FLAG: expected a string (quote it)"),
        ("max_tokens: 0\n", "q.yaml:6: max_tokens: must be >= 1"),
        ("use_chat_completions: maybe\n", "q.yaml:6: use_chat_completions: expected true or false"),
        ("startup_max_wait_seconds: 0\n", "q.yaml:6: startup_max_wait_seconds: must be > 0"),
    ],
)
def test_bad_fields_are_one_line_naming_file_line_and_field(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(QWEN + extra, "q.yaml", "q")
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (QWEN.replace("num_fewshot: 5\n", ""), "q.yaml: num_fewshot: missing"),
        (QWEN.replace("0.375", "1.5"), "q.yaml:2: accuracy_threshold: must be >= 0 and <= 1"),
        (QWEN.replace("1319", "0"), "q.yaml:3: num_questions: must be >= 1"),
        (QWEN.replace("1319", "12.5"), "q.yaml:3: num_questions: expected an integer"),
        (QWEN.replace('"--enforce-eager', "\"--enforce-eager 'x"), "q.yaml:5: server_args: cannot"),
        (QWEN.replace("4096", "4096 --port 8000"), "q.yaml:5: server_args: --port is chosen"),
        ("model_name: [a\n", "q.yaml:2: not valid YAML"),
        ("- a\n- b\n", "q.yaml: expected a mapping"),
        (QWEN.replace('"Qwen/Qwen3-0.6B-FP8"', '""'), "q.yaml:1: model_name: expected a model"),
    ],
)
def test_bad_configs(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text, "q.yaml", "q")
    assert str(caught.value).startswith(message), str(caught.value)


def test_list_file_lines_as_vllms_conftest_reads_them() -> None:
    text = "# small models\nQwen3-0.6B-FP8.yaml\n\n  Llama.yaml  \n#off.yaml\n"
    assert parse_list(text, "models-small.txt") == [(2, "Qwen3-0.6B-FP8.yaml"), (4, "Llama.yaml")]
    with pytest.raises(ConfigError, match=r"models-x\.txt: names no config file"):
        parse_list("# nothing\n\n", "models-x.txt")


def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_its_line() -> None:
    """Rule: a duplicate key in a config is refused (YAML keeps the later value silently:
    accuracy_threshold 0.9, then 0.05, gated at 0.05)."""
    with pytest.raises(ConfigError) as caught:
        parse(QWEN + "accuracy_threshold: 0.05\n", "q.yaml", "q")
    text = str(caught.value)
    assert text == "q.yaml:6: accuracy_threshold: given twice (first on line 2)", text
    env = QWEN + "env:\n  VLLM_X: '1'\n  VLLM_X: '2'\n"
    with pytest.raises(ConfigError, match=r"^q\.yaml:8: VLLM_X: given twice \(first on line 7\)"):
        parse(env, "q.yaml", "q")


def test_anchors_and_aliases_are_refused_before_anything_expands() -> None:
    """Rule: a config may not use YAML anchors or aliases (vLLM's configs use none): nested
    aliases in 543 bytes expanded to gigabytes, and the error printed the expansion."""
    bomb = 'model_name:\n  - &a ["x","x","x","x","x","x","x","x","x"]\n'
    for level in "bcdefgh":
        previous = ",".join([f"*{chr(ord(level) - 1)}"] * 5)
        bomb += f"  - &{level} [{previous}]\n"
    bomb += QWEN.split("\n", 1)[1]
    assert len(bomb) < 600
    with pytest.raises(ConfigError) as caught:
        parse(bomb, "q.yaml", "q")
    text = str(caught.value)
    assert text.startswith("q.yaml:2: anchors and aliases are not supported"), text[:300]
    assert len(text) < 300
    alias = QWEN + "tolerance: &t 0.1\n"
    with pytest.raises(ConfigError, match=r"^q\.yaml:6: anchors and aliases are not supported"):
        parse(alias, "q.yaml", "q")


def test_a_bad_value_is_shown_bounded() -> None:
    """Rule: a user's value is never printed unbounded: an error shows its beginning."""
    value = "[" + ", ".join(["123456789"] * 10_000) + "]"
    for text in (
        QWEN.replace('"Qwen/Qwen3-0.6B-FP8"', value),
        QWEN + f"tolerance: {value}\n",
        QWEN + f"env: {value}\n",
        QWEN + f"env:\n  {'X' * 100_000}=: '1'\n",
        QWEN.replace("1319", "9" * 5000),  # more digits than Python converts: no traceback
    ):
        with pytest.raises(ConfigError) as caught:
            parse(text, "q.yaml", "q")
        assert len(str(caught.value)) < 300, str(caught.value)[:500]


@pytest.mark.parametrize(
    "nested", ["[" * 5000 + "]" * 5000, "{a: " * 3000 + "1" + "}" * 3000], ids=["list", "map"]
)
def test_a_value_nested_thousands_deep_is_one_line(nested: str) -> None:
    """The hostile review: ``env: [[[[...]]]]`` 5,000 deep was a RecursionError, an
    INTERNALERROR wall of 3,000 lines; a config nested so deep is one line."""
    text = QWEN + f"env: {nested}\n"
    with pytest.raises(ConfigError) as caught:
        parse(text, "q.yaml", "q")
    assert str(caught.value) == "q.yaml: nested too deeply (vLLM's configs are flat)"


@pytest.mark.parametrize("model", ["A" * 3_000_000, "org/model\x00x"], ids=["huge", "nul"])
def test_a_model_name_too_long_or_with_a_nul_is_refused_shown_short(model: str) -> None:
    """The hostile review: a 3 MB model_name was printed whole (9 MB of terminal); a NUL
    failed the server later as "embedded null byte". Refused by name, shown cut short."""
    text = f"model_name: {model!r}\n" + QWEN.split("\n", 1)[1]
    with pytest.raises(ConfigError) as caught:
        parse(text.replace("'", '"'), "q.yaml", "q")
    message = str(caught.value)
    assert message.startswith("q.yaml:1: model_name: expected a model id (at most 1000"), message
    assert len(message) < 400


@pytest.mark.parametrize(
    "extra",
    [
        "server_args: [--api-key, {key}]\n",  # vLLM's server_args is one string, not a list
        "server_args: {{--api-key: {key}}}\n",
        "env: HF_TOKEN={key}\n",  # env is a mapping, not an assignment
        "env: [HF_TOKEN={key}]\n",
        "env:\n  OPENAI_API_KEY: [{key}]\n",
    ],
)
def test_a_key_in_a_field_of_the_wrong_kind_is_never_shown(extra: str) -> None:
    """Rule: secrets never appear in output. A config that gives the server's key in a field
    of the wrong kind is refused naming the field and the kind given; no part of the key is
    in the message (a shortened value kept up to 50 characters of it)."""
    key = "sk-proj-" + "A1b2C3d4E5" * 4
    text = QWEN.replace('server_args: "--enforce-eager --max-model-len 4096"\n', "")
    with pytest.raises(ConfigError) as caught:
        parse(text + extra.format(key=key), "q.yaml", "q")
    message = str(caught.value)
    assert message.startswith(("q.yaml:5: server_args: expected", "q.yaml:5: env", "q.yaml:6: env"))
    assert "A1b2C3" not in message, message
