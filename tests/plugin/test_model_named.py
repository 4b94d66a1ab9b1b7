"""The model under test is the one named (issue 31, case 12).

``--gsm8k-preset vllm`` sends no ``model`` field, as vLLM's gsm8k_eval.py: the server's
default model answers. With LoRA adapters served, vLLM lists the base and each adapter
(``parent`` naming the base), and the default is the base: a run of ``--gsm8k-model my-lora``
graded the base model under the adapter's name and passed. Here the scripted server plays
that vLLM (a base ``base`` and an adapter ``my-lora``); where ``GET /v1/models`` shows the
named model would not answer, the run is refused at session start in one line, before a
request is sent; where there is no listing, the replies' ``model`` field tells, and the run
stops at the first one. Requests that name the model (no preset, lm-eval, sglang) reach the
adapter and run as before, and so does vLLM's own case: the one model served, or the base.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    NO_EXTRA_PLUGINS,
    TEST_KEY,
    XDIST,
    config_serve,
    output,
    report,
    sent,
    xdist_once,
)

RULE = "the model under test is the one named"


@pytest.fixture
def lora(gsm8k_data: Path) -> Iterator[FakeOpenAIServer]:
    """vLLM serving a base model with one LoRA adapter (``--enable-lora --lora-modules``)."""
    with FakeOpenAIServer(
        gsm8k_data / "test.jsonl",
        model="base",
        adapters=["my-lora"],
        api_key=TEST_KEY,
        record=True,
        root="/models/base",
    ) as srv:
        yield srv


def run(
    pytester: pytest.Pytester, server: FakeOpenAIServer, model: str, *args: str
) -> pytest.RunResult:
    return pytester.runpytest(
        f"--gsm8k-model={model}",
        f"--gsm8k-base-url={server.base_url}",
        "--gsm8k-limit=6",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
        *args,
    )


def gsm8k_errors(result: pytest.RunResult) -> list[str]:
    return [line for line in output(result).splitlines() if line.startswith("ERROR: gsm8k:")]


@xdist_once("api", ["completions", "chat"], ids=["completions", "chat"])
def test_vllm_preset_refuses_an_adapter_that_its_base_would_answer_for(
    pytester: pytest.Pytester, lora: FakeOpenAIServer, keyed_env: str, xdist: list[str], api: str
) -> None:
    gate = "--gsm8k-min-acc=0.5"  # the base answers every problem right: it passed
    result = run(
        pytester, lora, "my-lora", "--gsm8k-preset=vllm", f"--gsm8k-api={api}", gate, *xdist
    )
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"{RULE}: {text}"
    [line] = gsm8k_errors(result)
    assert line.startswith(
        "ERROR: gsm8k: --gsm8k-model 'my-lora' is not the model that answers: GET /v1/models "
        "lists it as an adapter of 'base', which answers instead. The vllm preset sends no "
        "model field"
    ), line
    assert "leave out --gsm8k-preset vllm" in line  # how to run the adapter
    assert "Traceback" not in text
    assert sent(lora) == 0  # refused before any request


def test_vllm_preset_refuses_a_model_beside_other_base_models(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """Several models that are not adapters of the named one: which answers a request that
    names none is the server's choice, not the run's."""
    with FakeOpenAIServer(
        gsm8k_data / "test.jsonl", api_key=TEST_KEY, extra_models=["other-model"]
    ) as srv:
        result = run(pytester, srv, "fake-model", "--gsm8k-preset=vllm")
        assert sent(srv) == 0
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"{RULE}: {output(result)}"
    [line] = gsm8k_errors(result)
    assert "GET /v1/models lists 'other-model' beside it" in line, line


@XDIST
def test_vllm_preset_stops_at_a_reply_that_names_another_model(
    pytester: pytest.Pytester,
    lora: FakeOpenAIServer,
    keyed_env: str,
    xdist: list[str],
) -> None:
    """No listing to go by (a proxy that serves no /v1/models): the first reply names the
    model that answered, and that is not the one named."""
    lora.set_script(Script(unlisted=True))
    result = run(pytester, lora, "my-lora", "--gsm8k-preset=vllm", *xdist)
    text = output(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, f"{RULE}: {text}"  # no gate needed
    stopped = [line for line in text.splitlines() if line.startswith("gsm8k: run stopped:")]
    assert stopped == [
        "gsm8k: run stopped: 'my-lora' is not the model that answers: the replies name 'base'. "
        "The vllm preset sends no model field (as vLLM's gsm8k_eval.py), so the server's "
        "default model answers under this name; to run an adapter, send its name (leave out "
        "--gsm8k-preset vllm, with --gsm8k-api chat for chat mode) or serve it, merged, as "
        "the server's only model"
    ], text
    assert "Traceback" not in text
    problems = report(pytester)["problems"]
    assert {p["outcome"] for p in problems} == {"error"}  # no answer of 'base' is graded


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
def test_vllm_preset_runs_the_base_model_beside_its_adapters(
    pytester: pytest.Pytester, lora: FakeOpenAIServer, keyed_env: str, listed: bool
) -> None:
    """vLLM's own case: its script, too, asks the base model when adapters are served.
    Plain: the controller reads the listing and the replies (the vllm preset's run under
    -n 2: test_engine_presets.py; a stop on a reply under -n 2: the test above)."""
    lora.set_script(Script(unlisted=not listed))
    result = run(pytester, lora, "base", "--gsm8k-preset=vllm")
    assert result.ret == 0, output(result)
    assert sent(lora) == 6
    assert all("model" not in body for body in lora.stats()["bodies"])


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--gsm8k-api=chat"], id="chat"),
        pytest.param(["--gsm8k-preset=lm-eval"], id="lm-eval"),
        pytest.param(["--gsm8k-preset=sglang"], id="sglang"),
    ],
)
def test_requests_that_name_the_adapter_run_it(
    pytester: pytest.Pytester, lora: FakeOpenAIServer, keyed_env: str, args: list[str]
) -> None:
    """The way the refusal points to: the model field names the adapter, which answers."""
    result = run(pytester, lora, "my-lora", *args)
    assert result.ret == 0, output(result)
    bodies: list[dict[str, Any]] = lora.stats()["bodies"]
    assert len(bodies) == 6
    assert {body["model"] for body in bodies} == {"my-lora"}
    assert report(pytester)["reported_models"] == ["my-lora"]


@pytest.mark.parametrize(
    ("served", "why"),
    [
        (
            ["--model=org/Base", "--adapter={model}"],
            re.escape(
                "'org/Lora' is not the model that answers: GET /v1/models lists it as an "
                "adapter of 'org/Base'"
            ),
        ),
        (
            ["--model=org/Other"],
            r"model 'org/Lora' is not served by http://127\.0\.0\.1:\d+/v1 "
            r"\(it serves: org/Other\)",
        ),
    ],
    ids=["adapter", "unlisted"],
)
def test_a_config_whose_model_the_server_would_not_answer_as_is_refused(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, served: list[str], why: str
) -> None:
    """--gsm8k-config runs every config with the vllm preset: a config whose model the
    server lists as an adapter, or does not list, fails (that config alone), in one line,
    before a request."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "Lora.yaml").write_text(
        'model_name: "org/Lora"\naccuracy_threshold: 0.5\nnum_questions: 3\nnum_fewshot: 0\n',
        "utf-8",
    )
    record, events = tmp_path / "bodies.jsonl", tmp_path / "events.jsonl"
    # the last --model wins: the fake serves another model than the config's
    serve = config_serve(gsm8k_data, *served, f"--record-file={record}", f"--events-file={events}")
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={serve}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
    )
    text = output(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, f"{RULE}: {text}"
    assert re.search(f"config Lora: {why}", text), text
    assert "Traceback" not in text
    assert not record.exists()  # no request sent
    # the refused server is stopped by its launch, not left running to the end of pytest
    assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == [
        "start",
        "stop",
    ]
    [config] = report(pytester)["configs"]
    assert config["counts"]["error"] == 3
