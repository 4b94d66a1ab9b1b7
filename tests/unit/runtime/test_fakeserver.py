"""Tests for the fake OpenAI server, driven through the real ``openai`` package.

Why through ``openai``: the point of the fake is that the plugin's real client
stack (httpx transport, retries, error mapping) works against it, so the
tests check exactly that rather than poking the handler directly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fakeserver import (
    UNPARSED_TEXT,
    FakeOpenAIServer,
    QuestionIndex,
    Script,
    load_gsm8k,
    serve_in_subprocess,
    stop_subprocess,
)
from gsm8k_copy import data_dir
from openai.types.chat import ChatCompletionMessageParam

DATA = data_dir() / "test.jsonl"
MODEL = "fake-model"


@pytest.fixture(scope="module")
def gsm8k() -> tuple[list[str], list[str]]:
    questions, golds, _ = load_gsm8k(DATA)
    return questions, golds


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(DATA, record=True) as srv:
        yield srv


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink openai's exponential backoff (0.5 s base) so retry tests stay fast."""
    monkeypatch.setattr("openai._base_client.INITIAL_RETRY_DELAY", 0.01)


def client(srv: FakeOpenAIServer, **kw: Any) -> openai.OpenAI:
    kw.setdefault("max_retries", 0)
    kw.setdefault("api_key", "sk-test")
    return openai.OpenAI(base_url=srv.base_url, **kw)


def chat_prompt(question: str) -> list[ChatCompletionMessageParam]:
    """A realistic chat prompt: few-shot turns, then question + instruction."""
    return [
        {"role": "system", "content": "You are a careful math tutor."},
        {"role": "user", "content": "Question: Tom has 3 apples and buys 2 more. How many?"},
        {"role": "assistant", "content": "3 + 2 = 5.\n#### 5"},
        {
            "role": "user",
            "content": f"Question: {question}\nThink step by step, end with '#### <number>'.",
        },
    ]


def ask(c: openai.OpenAI, question: str, **kw: Any) -> Any:
    return c.chat.completions.create(model=MODEL, messages=chat_prompt(question), **kw)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: Any = None) -> Any:
    data = json.dumps(body if body is not None else {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


# --------------------------------------------------------------------------- answers


def test_stop_ends_its_thread_cleanly_and_closes_its_loop(
    monkeypatch: pytest.MonkeyPatch, gsm8k: tuple[list[str], list[str]]
) -> None:
    """The stop's cleanup of tasks left (none here) must not raise in the server's thread:
    gather() with no task asks for a current loop, which that thread has not (every test's
    server then warned PytestUnhandledThreadExceptionWarning and left its loop open)."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    srv = FakeOpenAIServer(DATA, model=MODEL).start()
    assert [m.id for m in client(srv).models.list().data] == [MODEL]
    loop = srv._loop
    srv.stop()
    assert raised == []
    assert loop is not None
    assert loop.is_closed()


def test_models_list(server: FakeOpenAIServer) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "fake"


def test_correct_answers_end_with_gold(
    server: FakeOpenAIServer, gsm8k: tuple[list[str], list[str]]
) -> None:
    questions, golds = gsm8k
    c = client(server)
    for i in (0, 1, 500, 1318):
        r = ask(c, questions[i])
        text = r.choices[0].message.content
        assert text.endswith(f"#### {golds[i]}"), (i, text)
        assert r.choices[0].finish_reason == "stop"
        assert r.object == "chat.completion"
        assert r.model == MODEL
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert server.stats()["requests_by_index"] == {0: 1, 1: 1, 500: 1, 1318: 1}


def test_scripted_behaviours(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k
    script = Script(behaviours={1: "wrong", 2: "unparsed", 3: "truncated", 4: "think"})
    with FakeOpenAIServer(DATA, script=script) as srv:
        c = client(srv)
        wrong = ask(c, questions[1]).choices[0]
        assert wrong.message.content.endswith(f"#### {int(golds[1].replace(',', '')) + 1}")
        unparsed = ask(c, questions[2]).choices[0]
        assert unparsed.message.content == UNPARSED_TEXT
        assert not any(ch.isdigit() for ch in unparsed.message.content)
        truncated = ask(c, questions[3]).choices[0]
        assert truncated.finish_reason == "length"
        assert "####" not in truncated.message.content
        think = ask(c, questions[4]).choices[0].message.content
        assert think.startswith("<think>")
        assert "</think>" in think
        assert think.endswith(f"#### {golds[4]}")


def test_noisy_mode_flips_a_share_of_problems_per_request_and_drops_stable_ones(
    gsm8k: tuple[list[str], list[str]],
) -> None:
    """noisy_rate picks the same problems every time; each request for one of them draws
    anew (so repeats differ, a reset does not replay them); drop turns the first stable
    problems of its pool wrong."""
    questions, golds = gsm8k
    script = Script(noisy_rate=0.3, noisy_p=0.5, noise_seed=3, drop=2, drop_pool=list(range(40)))
    noisy = [i for i in range(40) if script.noisy(i)]
    assert noisy == [i for i in range(40) if Script.from_json(script.to_json()).noisy(i)]
    assert 5 <= len(noisy) <= 20
    dropped = sorted(script.dropped(len(questions)))
    assert dropped == [i for i in range(40) if i not in noisy][:2]

    def right(c: openai.OpenAI, i: int) -> bool:
        text = ask(c, questions[i]).choices[0].message.content
        return bool(text.endswith(f"#### {golds[i]}"))

    with FakeOpenAIServer(DATA, script=script) as srv:
        c = client(srv)
        stable = [i for i in range(40) if i not in noisy and i not in dropped][:3]
        assert all(right(c, i) for i in stable for _ in range(3))
        assert not any(right(c, i) for i in dropped for _ in range(3))
        first = [right(c, i) for i in noisy for _ in range(4)]
        srv.reset()
        srv.set_script(script)
        again = [right(c, i) for i in noisy for _ in range(4)]
    assert 0.25 < sum(first) / len(first) < 0.75  # about noisy_p
    assert first != again  # fresh draws after reset and set_script


def test_completions_and_stop(server: FakeOpenAIServer, gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k
    c = client(server)
    prompt = (
        "Question: Tom has 3 apples.\nAnswer: 3\n#### 3\n\nQuestion: " + questions[7] + "\nAnswer:"
    )
    no_stop = c.completions.create(model=MODEL, prompt=prompt, max_tokens=256)
    assert no_stop.object == "text_completion"
    assert "\n\nQuestion:" in no_stop.choices[0].text  # a base model rambles on
    assert no_stop.choices[0].finish_reason == "length"
    stopped = c.completions.create(model=MODEL, prompt=prompt, stop=["\n\nQuestion:"])
    text = stopped.choices[0].text
    assert text.startswith(" ")
    assert text.endswith(f"#### {golds[7]}")
    assert stopped.choices[0].finish_reason == "stop"
    chat = ask(c, questions[7], stop=["####"]).choices[0]
    assert "####" not in chat.message.content
    assert chat.finish_reason == "stop"
    short = ask(c, questions[7], max_tokens=3).choices[0]
    assert short.finish_reason == "length"
    assert len(short.message.content.split()) == 3


def test_unknown_model_is_404(server: FakeOpenAIServer, gsm8k: tuple[list[str], list[str]]) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client(server).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": gsm8k[0][0]}]
        )
    assert exc.value.code == "model_not_found"
    assert "`nope` does not exist" in exc.value.message
    assert server.stats()["n_4xx"] == 1


def test_api_key_checked_and_recorded(gsm8k: tuple[list[str], list[str]]) -> None:
    with FakeOpenAIServer(DATA, api_key="sk-right") as srv:
        with pytest.raises(openai.AuthenticationError):
            ask(client(srv, api_key="sk-wrong"), gsm8k[0][0])
        assert ask(client(srv, api_key="sk-right"), gsm8k[0][0]).choices
        stats = srv.stats()
        assert stats["auth_headers"] == ["Bearer sk-wrong", "Bearer sk-right"]
        assert stats["status_counts"] == {401: 1, 200: 1}
        assert "sk-right" not in repr(srv)


# --------------------------------------------------------------------------- faults


def test_429_retry_after_is_honoured(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k
    script = Script(fail_first={3: {"429": 2}}, retry_after=0.05)
    with FakeOpenAIServer(DATA, script=script) as srv:
        with pytest.raises(openai.RateLimitError) as exc:
            ask(client(srv), questions[3])
        assert exc.value.response.headers["retry-after"] == "0.05"
        assert exc.value.response.headers["retry-after-ms"] == "50"
        r = ask(client(srv, max_retries=3), questions[3])  # second 429, then success
        assert r.choices[0].message.content.endswith(f"#### {golds[3]}")
        stats = srv.stats()
        assert stats["requests_by_index"] == {3: 3}
        assert stats["status_counts"] == {429: 2, 200: 1}


def test_500_and_drop_first_k(fast_retries: None, gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k
    script = Script(
        fail_first={1: {"500": 2}, 2: {"drop": 1, "429": 1}}, behaviours={9: "error500"}
    )
    with FakeOpenAIServer(DATA, script=script) as srv:
        assert (
            ask(client(srv, max_retries=2), questions[1])
            .choices[0]
            .message.content.endswith(f"#### {golds[1]}")
        )
        assert ask(client(srv, max_retries=2), questions[2]).choices
        with pytest.raises(openai.InternalServerError):
            ask(client(srv, max_retries=1), questions[9])
        stats = srv.stats()
        assert stats["requests_by_index"] == {1: 3, 2: 3, 9: 2}
        assert stats["dropped"] == 1
        assert stats["status_counts"] == {500: 4, 200: 2, 429: 1}
        assert stats["n_5xx"] == 4


def test_reset_and_set_script(server: FakeOpenAIServer, gsm8k: tuple[list[str], list[str]]) -> None:
    c = client(server)
    ask(c, gsm8k[0][5])
    server.set_script(Script(default="unparsed"))
    assert ask(c, gsm8k[0][5]).choices[0].message.content == UNPARSED_TEXT
    server.reset()
    stats = server.stats()
    assert stats["requests_total"] == 0
    assert stats["requests_by_index"] == {}
    assert stats["bodies"] == []


def test_record_bodies(server: FakeOpenAIServer, gsm8k: tuple[list[str], list[str]]) -> None:
    ask(client(server), gsm8k[0][0], temperature=0, seed=1)
    stats = server.stats()
    assert stats["bodies"][0]["messages"] == chat_prompt(gsm8k[0][0])
    assert stats["bodies"][0]["seed"] == 1
    assert json.loads(stats["raw_bodies"][0]) == stats["bodies"][0]


# --------------------------------------------------------------------------- samples / n


def test_n_honoured_with_samples(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k
    script = Script(samples={5: ["18", "19", None, "18"]})
    with FakeOpenAIServer(DATA, script=script) as srv:
        c = client(srv)
        r = ask(c, questions[5], n=4, temperature=0.7)
        texts = [ch.message.content for ch in r.choices]
        assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
        assert texts[0].endswith("#### 18")
        assert texts[1].endswith("#### 19")
        assert texts[2] == UNPARSED_TEXT
        assert texts[3].endswith("#### 18")
        # greedy requests ignore samples
        assert ask(c, questions[5]).choices[0].message.content.endswith(f"#### {golds[5]}")
        # a problem without samples: all n choices follow its behaviour
        r = ask(c, questions[6], n=3, temperature=1.0)
        assert all(ch.message.content.endswith(f"#### {golds[6]}") for ch in r.choices)


def test_n_not_honoured_serves_samples_in_order(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, _ = gsm8k
    script = Script(samples={5: ["18", "19", None]})
    with FakeOpenAIServer(DATA, script=script, honour_n=False) as srv:
        c = client(srv)
        r = ask(c, questions[5], n=4, temperature=0.7)
        assert len(r.choices) == 1
        assert r.choices[0].message.content.endswith("#### 18")
        later = [ask(c, questions[5], temperature=0.7).choices[0].message.content for _ in range(3)]
        assert later[0].endswith("#### 19")
        assert later[1] == UNPARSED_TEXT
        assert later[2].endswith("#### 18")  # wraps around


# --------------------------------------------------------------------------- identification


def test_question_index_finds_last_question(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, _ = gsm8k
    index = QuestionIndex(questions)
    assert index.find(questions[42]) == 42
    prompt = f"Question: {questions[3]}\nAnswer: 7\n\nQuestion: {questions[900]}\nAnswer:"
    assert index.find(prompt) == 900
    assert index.find(" ".join(questions[11].split()) + "  Please answer.") == 11
    assert index.find("Question: how many legs has a cat?") is None
    long_prompt = "Question: something else entirely.\nAnswer: 4\n\n" * 30 + prompt
    assert index.find(long_prompt) == 900


def test_unidentified_prompt_is_unparsed(server: FakeOpenAIServer) -> None:
    r = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather like?"}]
    )
    assert r.choices[0].message.content == UNPARSED_TEXT
    assert server.stats()["unidentified"] == 1


def test_script_json_round_trip() -> None:
    script = Script(
        default="wrong",
        behaviours={3: "think"},
        fail_first={1: {"429": 2, "drop": 1}},
        retry_after=0.1,
        latency_by_index={4: 0.5},
        samples={5: ["1", None]},
    )
    assert Script.from_json(script.to_json()) == script
    with pytest.raises(ValueError, match="unknown behaviour 'explode'"):
        Script(behaviours={1: "explode"})
    with pytest.raises(ValueError, match="unknown fault kind 'boom'"):
        Script(fail_first={1: {"boom": 1}})


# --------------------------------------------------------------------------- concurrency, death


def test_concurrency_is_real(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k

    async def run(srv: FakeOpenAIServer) -> tuple[list[str], float]:
        async with openai.AsyncOpenAI(
            base_url=srv.base_url, api_key="sk-test", max_retries=0
        ) as ac:
            t0 = time.perf_counter()
            rs = await asyncio.gather(
                *(
                    ac.chat.completions.create(model=MODEL, messages=chat_prompt(questions[i]))
                    for i in range(32)
                )
            )
            return [r.choices[0].message.content or "" for r in rs], time.perf_counter() - t0

    with FakeOpenAIServer(DATA, latency=0.2) as srv:
        texts, _elapsed = asyncio.run(run(srv))
        assert all(t.endswith(f"#### {golds[i]}") for i, t in enumerate(texts))
        # What the server counted, not seconds: all 32 were in flight at once.
        stats = srv.stats()
        assert stats["peak_in_flight"] == 32
        assert stats["in_flight"] == 0


def test_kill_refuses_new_requests(
    server: FakeOpenAIServer, gsm8k: tuple[list[str], list[str]]
) -> None:
    c = client(server)
    assert ask(c, gsm8k[0][0]).choices
    server.kill()
    with pytest.raises(openai.APIConnectionError):
        ask(c, gsm8k[0][0])
    with pytest.raises(openai.APIConnectionError):
        ask(client(server), gsm8k[0][0])
    assert server.stats()["killed"] is True


def test_die_after(gsm8k: tuple[list[str], list[str]]) -> None:
    with FakeOpenAIServer(DATA, die_after=2) as srv:
        c = client(srv)
        assert ask(c, gsm8k[0][0]).choices
        assert ask(c, gsm8k[0][1]).choices  # the K-th answer is still delivered
        with pytest.raises(openai.APIConnectionError):
            ask(c, gsm8k[0][2])
        assert srv.stats()["completed"] == 2


def test_cli_subprocess(gsm8k: tuple[list[str], list[str]]) -> None:
    questions, golds = gsm8k
    proc, url = serve_in_subprocess(DATA, latency=0.0, model="m2", script=Script(default="wrong"))
    try:
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/v1")
        c = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
        r = c.chat.completions.create(model="m2", messages=chat_prompt(questions[0]))
        assert (r.choices[0].message.content or "").endswith("#### 19")
        root = url.removesuffix("/v1")
        assert post_json(root + "/_script", json.loads(Script().to_json())) == {"ok": True}
        r = c.chat.completions.create(model="m2", messages=chat_prompt(questions[0]))
        assert (r.choices[0].message.content or "").endswith(f"#### {golds[0]}")
        stats = get_json(root + "/_stats")
        assert stats["requests_by_index"] == {"0": 2}
        assert stats["completed"] == 2
        post_json(root + "/_reset")
        assert get_json(root + "/_stats")["requests_total"] == 0
        post_json(root + "/_shutdown")
        assert proc.wait(timeout=5) == 0  # /_shutdown ends the process
        with pytest.raises(openai.APIConnectionError):
            c.models.list()
    finally:
        stop_subprocess(proc)
