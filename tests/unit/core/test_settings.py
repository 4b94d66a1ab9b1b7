"""Unit tests for pytest_gsm8k.core.settings: the options table, defaults, validation, ini twins."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from pytest_gsm8k.core.settings import (
    OPTIONS,
    Option,
    Settings,
    SettingsError,
    build_settings,
    parse_params,
    with_v1,
)


def settings(warnings: list[str] | None = None, /, **given: Any) -> Settings:
    """build_settings with ``given`` (keys like min_acc) as the only set values."""
    notes = warnings if warnings is not None else []
    return build_settings(lambda o: given.get(o.dest[len("gsm8k_") :]), notes.append)


def test_defaults_are_test_at_1_zero_shot_chat() -> None:
    s = settings()
    assert (s.protocol, s.samples, s.temperature, s.shots, s.api) == ("test@1", 1, 0.0, 0, "chat")
    assert s.extract == "strict"
    assert s.answer_regex is None
    assert (s.dataset, s.dataset_config, s.split, s.data) == (
        None,
        "main",
        "test",
        None,
    )  # embedded
    assert s.limit is None
    assert s.seed == 1234
    assert s.min_acc is None
    assert s.max_tokens is not None
    assert s.max_tokens >= 512  # generous enough for chain of thought
    assert s.api_key_env == "OPENAI_API_KEY"
    assert s.model is None
    assert s.resume is False  # a verdict rests on answers this run received


def test_the_key_is_never_an_option() -> None:
    names = {o.name for o in OPTIONS}
    assert "api-key" not in names
    assert "key" not in names
    assert "api-key-env" in names


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.kind in ("int", "float")], ids=lambda o: o.name
)
def test_non_numbers_name_the_option(option: Option) -> None:
    with pytest.raises(SettingsError) as info:
        settings(**{option.dest[len("gsm8k_") :]: "lots"})
    assert option.flag in str(info.value)
    assert "lots" in str(info.value)


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"min_acc": "1.01"}, "--gsm8k-min-acc"),
        ({"min_acc": "-0.1"}, "--gsm8k-min-acc"),
        ({"max_unparsed": "1.5"}, "--gsm8k-max-unparsed: must be >= 0 and <= 1, got 1.5"),
        ({"max_truncated": "-0.01"}, "--gsm8k-max-truncated: must be >= 0 and <= 1, got -0.01"),
        ({"max_error": "2"}, "--gsm8k-max-error: must be >= 0 and <= 1, got 2.0"),
        ({"limit": "0"}, "--gsm8k-limit"),
        ({"max_tokens": "-5"}, "--gsm8k-max-tokens"),
        ({"protocol": "best@3"}, "--gsm8k-protocol"),
        ({"protocol": "pass@0"}, "--gsm8k-protocol"),
        ({"temperature": "3"}, "--gsm8k-temperature"),
        ({"api": "grpc"}, "--gsm8k-api"),
        ({"extract": "nope"}, "--gsm8k-extract"),
        ({"answer_regex": "(unclosed"}, "--gsm8k-answer-regex"),
        ({"no_cache": "maybe"}, "--gsm8k-no-cache"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_option(
    given: dict[str, str], needle: str
) -> None:
    with pytest.raises(SettingsError) as info:
        settings(**given)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_sampled_protocols() -> None:
    s = settings(protocol="maj@8")
    assert s.samples == 8
    assert s.temperature == 0.7
    assert s.protocol == "maj@8"  # the aggregation the outcome step reads (maj)
    notes: list[str] = []
    s = settings(notes, protocol="pass@4", temperature="0")
    assert s.temperature == 0.0
    assert any("identical" in n for n in notes)


def test_ini_strings_are_converted() -> None:
    s = settings(min_acc=" 0.85 ", limit="20", no_cache="true", stop=["Question:"])
    assert s.min_acc == 0.85
    assert s.limit == 20
    assert s.no_cache is True
    assert s.stop == ("Question:",)


def test_a_bool_option_takes_the_words_pytests_bool_ini_takes() -> None:
    """Each word of pytest's own bool ini type, any case and blanks, and no other."""
    for words, value in (("1 true yes on y t", True), ("0 false no off n f", False)):
        for word in words.split():
            for raw in (word, f" {word.upper()} "):
                assert settings(no_cache=raw).no_cache is value, raw
    for raw in ("2", "tru", "none", "enabled"):
        with pytest.raises(SettingsError, match=f"expected true or false, got '{raw}'"):
            settings(no_cache=raw)


def test_key_and_base_url_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-123")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env:1/v1")
    s = settings(api_key_env="MY_KEY")
    assert s.api_key() == "sk-123"
    assert s.resolved_base_url() == "http://env:1/v1"
    assert settings(base_url="http://opt:2/v1").resolved_base_url() == "http://opt:2/v1"
    monkeypatch.delenv("MY_KEY")
    assert s.api_key() is None


@pytest.mark.parametrize(
    ("model", "local"),
    [
        ("local", True),
        ("local:/models/x.gguf", True),
        ("local-model", False),  # LM Studio's usual id: a model id like any other
        ("localhost-llama", False),
        ("Local", False),
        (None, False),
    ],
)
def test_one_rule_says_what_the_local_preset_is(model: str | None, local: bool) -> None:
    from pytest_gsm8k.core.settings import LOCAL_DEFAULTS, is_local_spec

    assert is_local_spec(model) is local
    s = settings(model=model)
    preset = (s.api, s.shots, s.max_tokens) == tuple(
        LOCAL_DEFAULTS[k] for k in ("api", "shots", "max_tokens")
    )
    assert preset is local


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e400"])
@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind == "float"], ids=lambda o: o.name)
def test_non_finite_numbers_are_refused_by_name(option: Option, value: str) -> None:
    """nan passes every comparison (a nan stall timeout would turn the watchdog off) and inf
    overflows a socket's timeout under xdist: neither is a value, for any number option."""
    with pytest.raises(SettingsError) as info:
        settings(**{option.dest[len("gsm8k_") :]: value})
    message = str(info.value)
    assert message.startswith(option.flag + ":")
    assert value in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.metavar == "PATH"], ids=lambda o: o.name
)
def test_a_path_under_a_home_that_does_not_exist_is_refused_by_name(option: Option) -> None:
    """``~nosuchuser/x`` stays as it is under os.path.expanduser and raises under pathlib's,
    which every path option is opened through: a traceback (INTERNALERROR) for --gsm8k-data
    and --gsm8k-fewshot-file, or after the run for --gsm8k-html. One line at the start."""
    raw = "~gsm8k-no-such-user-here/x"
    with pytest.raises(SettingsError) as info:
        settings(**{option.dest[len("gsm8k_") :]: raw})
    assert str(info.value) == f"{option.flag}: cannot expand {raw!r}: no such user or home folder"


@pytest.mark.parametrize("raw", ["~" + "x" * 10_000, "x" * 10_000])
def test_a_refused_value_is_quoted_cut_at_200_characters(raw: str) -> None:
    """User text is never printed unbounded: a 10,000-character value (a pasted file) is
    refused in one short line by every option that refuses it."""
    refusals: dict[str, str] = {}
    for option in OPTIONS:
        try:
            settings(**{option.dest[len("gsm8k_") :]: raw})
        except SettingsError as exc:
            refusals[option.flag] = str(exc)
    assert len(refusals) >= 20  # the numbers, the choices, the path options
    for flag, message in refusals.items():
        assert message.startswith(flag)
        assert "x" * 201 not in message, message[:400]
        assert len(message) < 400


@pytest.mark.parametrize("name", ["timeout", "serve_timeout", "stall_timeout"])
def test_waits_too_long_to_mean_anything_are_refused(name: str) -> None:
    with pytest.raises(SettingsError, match=r"must be > 0 and <= 1e\+06 seconds, got 1e\+300$"):
        settings(**{name: "1e300"})
    assert getattr(settings(**{name: "86400"}), name) == 86400.0  # a day is a fine wait


def _settings(**given: Any) -> Any:
    def get(option: Any) -> Any:
        return given.get(option.dest[len("gsm8k_") :])

    return build_settings(get, lambda _: None)


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"answer_regex": r"#### \d+"}, "needs a capture group"),
        ({"protocol": "pass@2000"}, "N must be >= 1 and <= 1024"),
        ({"protocol": "maj@1025"}, "N must be >= 1 and <= 1024"),
        ({"concurrency": "5000"}, "must be > 0 and <= 4096, got 5000"),
        ({"stall_timeout": "0"}, "--gsm8k-stall-timeout"),
        ({"resume": True, "no_cache": True}, "--gsm8k-resume reads the response cache that"),
    ],
)
def test_settings_refused_with_one_line(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle.replace("(", r"\(")):
        _settings(**given)
    assert _settings(answer_regex=r"#### (\d+)", protocol="pass@1024", concurrency="4096")


def test_params_parse_as_json_or_text_and_owned_fields_are_refused() -> None:
    params = dict(
        parse_params(
            [
                "top_p=0.95",
                "seed=7",
                'chat_template_kwargs={"enable_thinking": false}',
                "reasoning_effort=low",
                "max_completion_tokens=4096",
            ]
        )
    )
    assert params == {
        "top_p": "0.95",
        "seed": "7",
        "chat_template_kwargs": '{"enable_thinking":false}',
        "reasoning_effort": '"low"',
        "max_completion_tokens": "4096",
    }
    for item, option in [
        ("max_tokens=5", "--gsm8k-max-tokens"),
        ("temperature=1", "--gsm8k-temperature"),
        ("stop=[]", "--gsm8k-stop"),
        ("model=x", "--gsm8k-model"),
        ("n=3", "--gsm8k-protocol"),
    ]:
        with pytest.raises(SettingsError, match=re.escape(option)):
            parse_params([item])
    for item in ("messages=[]", "prompt=hi", "novalue", "=1"):
        with pytest.raises(SettingsError, match="--gsm8k-param"):
            parse_params([item])


@pytest.mark.parametrize(("given", "progress"), [(None, None), (True, True), ("false", False)])
def test_the_progress_line_is_asked_for_turned_off_or_left_to_the_terminal(
    given: object, progress: bool | None
) -> None:
    """--gsm8k-progress forces it on, ``gsm8k_progress = false`` off, and unset it is on
    only when the output is a terminal (decided by the pytest layer)."""
    assert settings(progress=given).progress is progress


@pytest.mark.parametrize(
    ("base_url", "suggested"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
        ("http://alice:pw@host/api?x=1", "http://host/api/v1"),
        ("http://[::1]:8000", "http://[::1]:8000/v1"),
        ("http://127.0.0.1:8000/v1", None),
        ("http://127.0.0.1:8000/v1/", None),
        ("not a url", None),
    ],
)
def test_a_base_url_without_v1_gets_it_suggested(base_url: str, suggested: str | None) -> None:
    assert with_v1(base_url) == suggested


def test_health_rates_are_read_and_become_gate_specs() -> None:
    """Each given rate is one gate spec, in the fixed order unparsed, truncated, error; the
    rates 0 and 1 are allowed (no problem may / every problem may)."""
    from pytest_gsm8k.core.gates import MaxShare
    from pytest_gsm8k.core.plan import GateSpecs

    s = settings(max_truncated="0.05", max_unparsed=" 0 ", max_error="1")
    assert (s.max_unparsed, s.max_truncated, s.max_error) == (0.0, 0.05, 1.0)
    assert GateSpecs.from_settings(s).health == (
        MaxShare("unparsed", 0.0),
        MaxShare("truncated", 0.05),
        MaxShare("error", 1.0),
    )
    assert GateSpecs.from_settings(settings()).health == ()


def _with_files(files: set[str], **given: Any) -> tuple[Settings, list[str]]:
    notes: list[str] = []
    s = build_settings(
        lambda o: given.get(o.dest[len("gsm8k_") :]), notes.append, files.__contains__
    )
    return s, notes


def test_gsm8k_config_takes_vllm_configs_and_dataset_config_the_dataset() -> None:
    s, notes = _with_files(set(), config="ci/models.txt", dataset_config="socratic")
    assert (s.vllm_config, s.dataset_config, notes) == ("ci/models.txt", "socratic", [])


@pytest.mark.parametrize("name", ["main", "socratic"])
def test_old_gsm8k_config_main_still_selects_the_dataset_config_with_a_note(name: str) -> None:
    s, notes = _with_files(set(), config=name)
    assert (s.vllm_config, s.dataset_config) == (None, name)
    assert notes == [
        f"--gsm8k-config {name} selects the dataset config: write --gsm8k-dataset-config "
        f"{name} (--gsm8k-config now takes vLLM config files)"
    ]


def test_a_path_named_main_is_ambiguous_and_refused() -> None:
    with pytest.raises(SettingsError) as caught:
        _with_files({"main"}, config="main")
    assert str(caught.value) == (
        "--gsm8k-config main: a file or folder named 'main' exists here; write "
        "--gsm8k-config ./main for vLLM configs or --gsm8k-dataset-config main for the "
        "dataset config"
    )
    s, _ = _with_files({"main"}, config="./main")
    assert s.vllm_config == "./main"


def test_a_serve_command_without_server_args_says_they_are_not_passed() -> None:
    s, notes = _with_files(set(), config="c", serve="sglang --model-path {model} --port {port}")
    assert s.serve is not None
    assert notes == [
        "--gsm8k-serve has no {server_args}: the configs' server_args and the flags vLLM's "
        "test adds are not passed to the server"
    ]
    _, quiet = _with_files(set(), config="c", serve="vllm serve {model} {server_args} -p {port}")
    assert quiet == []


def test_old_and_new_dataset_config_options_must_agree() -> None:
    with pytest.raises(SettingsError, match="disagree; give --gsm8k-dataset-config only"):
        _with_files(set(), config="main", dataset_config="socratic")
    s, _ = _with_files(set(), config="main", dataset_config="main")
    assert s.dataset_config == "main"


def test_repeats_default_to_one_and_alpha_to_001() -> None:
    s = settings()
    assert (s.repeats, s.alpha, s.max_drop) == (1, 0.01, 0.0)
    assert settings(repeats=5).repeats == 5
    assert settings(repeats=100).repeats == 100


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"repeats": 0}, "--gsm8k-repeats: must be >= 1 and <= 100, got 0"),
        ({"repeats": 101}, "--gsm8k-repeats: must be >= 1 and <= 100, got 101"),
        (
            {"repeats": 2, "protocol": "pass@4"},
            "--gsm8k-repeats 2: repeats measure a single-sample protocol's run-to-run noise; "
            "--gsm8k-protocol pass@4 samples already (use test@1, or --gsm8k-repeats 1)",
        ),
        (
            {"repeats": 2, "protocol": "maj@1"},
            "--gsm8k-protocol maj@1 samples already",
        ),
        ({"alpha": 0.0}, "--gsm8k-alpha: must be >= 1e-06 and < 1, got 0.0"),
        ({"alpha": 1.0}, "--gsm8k-alpha: must be >= 1e-06 and < 1, got 1.0"),
        ({"alpha": 1e-17}, "--gsm8k-alpha: must be >= 1e-06 and < 1, got 1e-17"),
    ],
)
def test_repeats_and_alpha_refusals_name_the_option(given: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        settings(**given)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def _from(cli: dict[str, Any], ini: dict[str, Any], notes: list[str]) -> Settings:
    """build_settings as pytest reads it: the command line first, then the ini."""

    def get(option: Option) -> Any:
        key = option.dest[len("gsm8k_") :]
        return cli[key] if key in cli else ini.get(key)

    return build_settings(get, notes.append, from_ini=lambda o: o.dest[len("gsm8k_") :] not in cli)


@pytest.mark.parametrize(
    ("key", "raw", "problem"),
    [
        ("min_acc", "5", "must be >= 0 and <= 1, got 5.0"),
        ("no_cache", "maybe", "expected true or false, got 'maybe'"),
        ("api", "grpc", "expected chat or completions, got 'grpc'"),
    ],
)
def test_a_bad_value_is_named_where_it_was_given(key: str, raw: str, problem: str) -> None:
    """An ini value out of range was reported under the command-line flag, never typed."""
    flag, ini = f"--gsm8k-{key.replace('_', '-')}", f"ini gsm8k_{key}"
    for cli, ini_values, said in (({key: raw}, {}, flag), ({}, {key: raw}, ini)):
        with pytest.raises(SettingsError) as info:
            _from(cli, ini_values, [])
        assert str(info.value) == f"{said}: {problem}"


README_INI = {"base_url": "http://127.0.0.1:8000/v1", "min_acc": "0.85"}


def test_a_mode_sets_aside_the_ini_values_it_decides_and_names_each_once() -> None:
    """The ini README suggests (a URL and a floor) broke --gsm8k-config ("--gsm8k-base-url
    cannot be combined", a flag never passed) and gated every config with the ini's floor:
    the mode wins, one note per key set aside."""
    notes: list[str] = []
    s = _from({"config": "configs/"}, README_INI, notes)
    assert s.base_url is None
    assert s.min_acc is None  # each config's accuracy_threshold - tolerance is its floor
    assert len(notes) == 2, notes
    assert notes[0].startswith("ini gsm8k_base_url set aside: --gsm8k-config runs")
    assert notes[1].startswith("ini gsm8k_min_acc set aside: --gsm8k-config runs")
    assert all(note.endswith("= clears it") for note in notes)


@pytest.mark.parametrize(
    "mode", [{"serve": "vllm serve {model} --port {port}"}, {"model": "local"}], ids=str
)
def test_a_server_the_run_starts_sets_aside_the_ini_url(mode: dict[str, str]) -> None:
    """--gsm8k-serve silently overrode the ini's URL: now said, and the floor is kept (it
    applies to a served model as to any)."""
    notes: list[str] = []
    s = _from(mode, README_INI, notes)
    assert s.base_url is None
    assert s.min_acc == 0.85
    [note] = notes
    assert note.startswith("ini gsm8k_base_url set aside: --gsm8k-")


@pytest.mark.parametrize(
    ("cli", "flag", "mode"),
    [
        ({"config": "c/", "base_url": "http://h:1/v1"}, "--gsm8k-base-url", "--gsm8k-config"),
        ({"config": "c/", "shots": "5"}, "--gsm8k-shots", "--gsm8k-config"),
        (
            {"serve": "vllm serve {model} --port {port}", "base_url": "http://h:1/v1"},
            "--gsm8k-base-url",
            "--gsm8k-serve",
        ),
        (
            {"model": "local", "base_url": "http://h:1/v1"},
            "--gsm8k-base-url",
            "--gsm8k-model=local",
        ),
    ],
    ids=["config-url", "config-shots", "serve-url", "local-url"],
)
def test_the_same_values_on_the_command_line_are_a_conflict_refused(
    cli: dict[str, str], flag: str, mode: str
) -> None:
    with pytest.raises(SettingsError, match=f"^{flag} cannot be combined with {mode}: "):
        _from(cli, {}, [])


def test_a_floor_on_the_command_line_still_gates_each_config() -> None:
    notes: list[str] = []
    s = _from({"config": "c/", "min_acc": "0.8"}, {}, notes)
    assert s.min_acc == 0.8
    assert notes == []


@pytest.mark.parametrize("key", ["base_url", "min_acc", "limit", "serve"])
def test_an_empty_value_on_the_command_line_clears_the_ini(key: str) -> None:
    """``--gsm8k-base-url=`` did not clear the ini's value (it was given, as ""): only
    ``-o gsm8k_base_url=`` did, found by trial."""
    ini = {**README_INI, "limit": "20", "serve": "vllm serve {model} --port {port}"}
    notes: list[str] = []
    s = _from({key: "", "config": "c/"}, ini, notes)
    assert getattr(s, key) is None
    assert not any(f"gsm8k_{key} " in note for note in notes)


def test_the_extract_choices_are_the_scoring_rules() -> None:
    """--gsm8k-extract's choices are written in settings (so that pytest's start does not
    import the scoring code): they must be scoring's rules, in its order."""
    from pytest_gsm8k.core.scoring import RULES
    from pytest_gsm8k.core.settings import EXTRACTORS

    assert EXTRACTORS == RULES


def test_the_options_import_nothing_heavy() -> None:
    """Issue 34 #4: the plugin imports the options at every pytest start, used or not, so
    core/settings.py imports only what reading them needs (no scoring, statistics, data)."""
    code = (
        "import sys, pytest_gsm8k; before = set(sys.modules); "
        "import pytest_gsm8k.core.settings; print(*sorted(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = out.stdout.split()
    assert [m for m in new if m.startswith("pytest_gsm8k")] == [
        "pytest_gsm8k.core",
        "pytest_gsm8k.core.jsontext",
        "pytest_gsm8k.core.settings",
    ]
    assert "statistics" not in new


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"limit": "0"}, "--gsm8k-limit: must be > 0, got 0"),
        ({"concurrency": "0"}, "--gsm8k-concurrency: must be > 0 and <= 4096, got 0"),
        ({"timeout": "-1"}, "--gsm8k-timeout: must be > 0 and <= 1e+06 seconds, got -1.0"),
        ({"shots": "-1"}, "--gsm8k-shots: must be >= 0, got -1"),
        ({"max_retries": "-2"}, "--gsm8k-max-retries: must be >= 0, got -2"),
        ({"temperature": "2.5"}, "--gsm8k-temperature: must be >= 0 and <= 2, got 2.5"),
        ({"max_drop": "1.5"}, "--gsm8k-max-drop: must be >= 0 and <= 1, got 1.5"),
        (
            {"early_stop_alpha": "1"},
            "--gsm8k-early-stop-alpha: must be > 0 and < 1, got 1.0",
        ),
        ({"api": "grpc"}, "--gsm8k-api: expected chat or completions, got 'grpc'"),
        (
            {"early_stop": "never"},
            "--gsm8k-early-stop: expected certain or sequential, got 'never'",
        ),
        (
            {"extract": "strict-match"},
            "--gsm8k-extract: expected one of strict, answer-is, boxed, flexible, last-int, "
            "got 'strict-match'",
        ),
    ],
)
def test_each_range_and_choice_says_its_bounds_and_the_value(
    given: dict[str, str], message: str
) -> None:
    """The one loop writes every range and choice message from the declaration: each shape
    (a lower end alone, a closed, an open and a half-open range, two or more choices) says
    the option, its whole range (or its choices) and the value given."""
    with pytest.raises(SettingsError) as info:
        settings(**given)
    assert str(info.value) == message


def test_an_out_of_range_ini_value_is_refused_even_where_a_mode_sets_it_aside() -> None:
    """Each option is checked as it is read: ``gsm8k_limit = 0`` is no value in any recipe,
    so --gsm8k-config refuses it rather than setting it aside (a valid one is set aside)."""
    with pytest.raises(SettingsError, match=r"^ini gsm8k_limit: must be > 0, got 0$"):
        _from({"config": "c/"}, {"limit": "0"}, [])
    notes: list[str] = []
    assert _from({"config": "c/"}, {"limit": "20"}, notes).limit is None
    assert [note.split(":")[0] for note in notes] == ["ini gsm8k_limit set aside"]


@pytest.mark.parametrize("path", ["__snapshots__/base.json", "baseline", "b.gsm8k.bak"])
def test_a_baseline_file_not_named_gsm8k_is_refused_before_syrupy_can_delete_it(path: str) -> None:
    """syrupy's --snapshot-update deletes the files of a __snapshots__ folder it does not
    know; only the .gsm8k kind is kept out of its discovery, so any other name is refused."""
    with pytest.raises(SettingsError, match=r"--gsm8k-baseline .*ends in \.gsm8k"):
        settings(baseline=path)
    assert settings(baseline="__snapshots__/base.gsm8k").baseline == "__snapshots__/base.gsm8k"
