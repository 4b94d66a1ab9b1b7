"""Replies no real model sends, and the xdist channel that carries them.

A hostile or broken server may send a reply of 70 MB, a gzip bomb, text that
UTF-8 cannot encode (a lone surrogate) or token counts that are not counts.
Each must be that problem's own outcome (an ``error`` with one line, or the
answer kept exactly), the same with and without xdist, and never a crash, a
lost summary or another problem's answer. Every run talks HTTP to the
scripted fake server; the channel tests speak its wire format over a real
loopback socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeserver import LONE_SURROGATE, FakeOpenAIServer, Script
from helpers import XDIST, output, report, sent

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.html_report import render_html
from pytest_gsm8k.core.jsontext import escape_surrogates, to_json
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.answers import AnswerServer, RemoteAnswers
from pytest_gsm8k.runtime.bounded import PIECE, Counter, Decoder, Refused, encoding_of
from pytest_gsm8k.runtime.cache import ResponseCache
from pytest_gsm8k.runtime.client import MAX_REPLY_BYTES, Breaker, OpenAIClient
from pytest_gsm8k.runtime.data import load_split
from pytest_gsm8k.runtime.engine import EndpointAborted, EndpointError, Engine

CRASHES = ("Traceback", "INTERNALERROR", "JSONDecodeError", "UnicodeEncodeError")


def chosen(limit: int) -> list[int]:
    """The problem indices ``--gsm8k-limit=limit`` runs, in run order."""
    return [p.index for p in select(load_split(None).problems, limit, 1234)]


def by_index(rep: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(p["index"]): p for p in rep["problems"]}


# -- replies too large to keep ---------------------------------------------------------------


@XDIST
def test_replies_over_the_bound_are_their_own_errors_and_never_shift_answers(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """70 MB answers (longer than a line-based channel reads at once, so the rest would be
    read as the next reply) are refused at 32 MiB: each is its own problem's error; every
    other problem is scored with its own answer, under xdist too."""
    indices = chosen(20)
    huge = {indices[2], indices[9], indices[15]}
    server.set_script(Script(behaviours=dict.fromkeys(huge, "huge")))
    result = pytester.runpytest(
        *gsm8k_args, *xdist, "--gsm8k-limit=20", "--gsm8k-concurrency=4", "--gsm8k-report=r.json"
    )
    text = output(result)
    assert result.ret == 1, text  # an error fails the run
    assert not any(crash in text for crash in CRASHES), text
    problems = by_index(report(pytester))
    assert set(problems) == set(indices)
    for index, record in problems.items():
        if index in huge:
            assert record["outcome"] == "error", record
            assert record["error"].startswith("the endpoint's reply is over 32 MiB (7")
            assert "\n" not in record["error"]
        else:
            assert record["outcome"] == "correct", (index, record["response"][-200:])
            assert record["extracted"] == server.golds[index].replace(",", "")
    assert sent(server) == 20  # a refused reply is not asked for again


def test_an_answer_over_the_channels_frame_is_that_items_error_and_the_next_is_its_own(
    tmp_path: Path,
) -> None:
    """The controller never sends a frame longer than it may: such an answer becomes that
    item's error, and the channel stays in step for the next problem."""

    class Sized:
        endpoint, model, persistent_cache = "sized", "m", False

        async def complete(self, request: Request) -> ModelResponse:
            size = 5000 if request.problem_id == "p1" else 10
            return ModelResponse([Completion(text="x" * size + f"#### {request.problem_id}")])

        async def aclose(self) -> None:
            pass

    known = {f"p{i}": Request(problem_id=f"p{i}", api="chat") for i in range(3)}
    engine = Engine(Sized(), ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=2)
    server = AnswerServer(engine, known.get, max_frame=2000)
    remote = RemoteAnswers(server.start(), server.token, endpoint="e", model="m", wait=1e300)
    try:
        remote.offer(list(known))
        assert remote.result(known["p0"]).completions[0].text.endswith("#### p0")
        with pytest.raises(EndpointError, match="more than the xdist answer channel carries"):
            remote.result(known["p1"])
        assert remote.result(known["p2"]).completions[0].text.endswith("#### p2")
    finally:
        remote.close()
        server.close()
        engine.close()


@pytest.fixture
def scripted_controller() -> Iterator[tuple[tuple[str, int], list[bytes]]]:
    """A loopback socket that answers each frame it reads with the next of ``replies``
    (raw bytes, framing included), then waits: a controller gone wrong."""
    replies: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as stream:
            while head := stream.read(4):
                stream.read(struct.unpack(">I", head)[0])
                if replies:
                    conn.sendall(replies.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[:2], replies
    listener.close()
    thread.join(timeout=5)


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def test_a_reply_for_another_problem_breaks_the_channel_for_good(
    scripted_controller: tuple[tuple[str, int], list[bytes]],
) -> None:
    address, replies = scripted_controller
    answer = {"completions": [{"text": "#### 1"}], "usage": {}, "model": None}
    replies += [b"", b"", _frame({"id": "p1", "response": answer, "cached": 0})]
    remote = RemoteAnswers(address, "t", endpoint="e", model="m", wait=10)
    try:
        remote.offer(["p0", "p1"])
        with pytest.raises(EndpointAborted, match="a reply for 'p1' where 'p0' was asked for"):
            remote.result(Request(problem_id="p0", api="chat"))
        # what follows on the stream cannot be trusted: nothing more is read from it
        with pytest.raises(EndpointAborted, match="a reply for 'p1'"):
            remote.result(Request(problem_id="p1", api="chat"))
    finally:
        remote.close()


def test_a_frame_longer_than_the_channel_carries_is_never_read(
    scripted_controller: tuple[tuple[str, int], list[bytes]],
) -> None:
    address, replies = scripted_controller
    replies += [b"", b"", struct.pack(">I", 1 << 31)]
    remote = RemoteAnswers(address, "t", endpoint="e", model="m", wait=10)
    try:
        remote.offer(["p0"])
        with pytest.raises(EndpointAborted, match="over the .*-byte limit"):
            remote.result(Request(problem_id="p0", api="chat"))
    finally:
        remote.close()


# -- a gzip bomb -----------------------------------------------------------------------------


def test_a_gzip_bomb_is_refused_before_it_is_decoded(
    server: FakeOpenAIServer, keyed_env: str
) -> None:
    """200 KB on the wire that inflate to 200 MB: the transport stops decoding at the bound,
    so the request costs about the bound in memory, not the bomb's size."""
    index = chosen(1)[0]
    server.set_script(Script(behaviours={index: "gzipbomb"}))
    problem = load_split(None).problems[index]
    request = Request(problem_id=problem.id, api="chat", messages=(("user", problem.question),))
    client = OpenAIClient(
        model="fake-model",
        base_url=server.base_url,
        api_key=keyed_env,
        timeout=60,
        max_retries=2,
        concurrency=1,
        breaker=Breaker(),
    )
    client.warm()

    async def ask_twice() -> tuple[BaseException | None, int, str]:
        """The bomb (its error, and the peak memory of asking), then the same reply small."""
        error: BaseException | None = None
        tracemalloc.start()
        try:
            await client.complete(request)
        except Exception as exc:  # noqa: BLE001 - what was raised is the point
            error = exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        server.set_script(Script(behaviours={index: "gzipbomb"}, bomb_chars=100_000))
        try:
            return error, peak, (await client.complete(request)).completions[0].text
        finally:
            await client.aclose()

    error, peak, answer = asyncio.run(ask_twice())
    assert type(error).__name__ == "RefusedReply", error
    assert "over 32 MiB decoded" in str(error)
    assert peak < 2 * MAX_REPLY_BYTES + (16 << 20), f"peak {peak:,} bytes"
    assert sent(server) == 2  # the bomb once (refused at once, not retried), then the small one
    # the same reply compressed, but small: decoded and answered as usual
    assert answer.strip().endswith(f"#### {server.golds[index]}") and len(answer) > 100_000


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw deflate", ""])
def test_the_bounded_decoder_reads_what_it_asked_for_in_pieces(encoding: str) -> None:
    data = b"".join(b"%d answer, " % i for i in range(300_000))  # about 3.5 MB
    wbits = {"gzip": 31, "deflate": 15, "raw deflate": -15, "": 0}[encoding]
    packed = data
    if wbits:
        packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
        packed = packer.compress(data) + packer.flush()
    decoder = Decoder(encoding.replace("raw ", ""))
    pieces = [p for i in range(0, len(packed), 65536) for p in decoder.feed(packed[i : i + 65536])]
    pieces.append(decoder.finish())
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= PIECE


def test_the_bounded_decoder_refuses_what_it_cannot_bound() -> None:
    with pytest.raises(Refused, match="encoded as 'br'"):
        Decoder(encoding_of(["br"]))
    with pytest.raises(Refused, match="encoded 2 times"):
        encoding_of(["gzip", "deflate"])
    assert encoding_of(["identity", " GZIP "]) == "gzip"
    with pytest.raises(Refused, match="not valid compressed data"):
        list(Decoder("gzip").feed(b"this is not gzip"))
    counter = Counter(10)
    counter.add(b"x" * 10)
    with pytest.raises(Refused, match="over .* MiB decoded"):
        counter.add(b"x")


@XDIST
def test_a_gzip_bomb_is_that_problems_error_with_one_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    indices = chosen(6)
    server.set_script(Script(behaviours={indices[3]: "gzipbomb"}))
    result = pytester.runpytest(*gsm8k_args, *xdist, "--gsm8k-limit=6", "--gsm8k-report=r.json")
    text = output(result)
    assert result.ret == 1, text
    assert not any(crash in text for crash in CRASHES), text
    problems = by_index(report(pytester))
    assert problems[indices[3]]["outcome"] == "error"
    assert "over 32 MiB decoded" in problems[indices[3]]["error"]
    assert [problems[i]["outcome"] for i in indices if i != indices[3]] == ["correct"] * 5


# -- text UTF-8 cannot encode ----------------------------------------------------------------


@XDIST
def test_a_lone_surrogate_is_kept_exactly_in_the_report_the_page_and_the_cache(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
    xdist: list[str],
) -> None:
    indices = chosen(6)
    odd = indices[1]
    server.set_script(
        Script(behaviours={odd: "surrogate"}, reported_model=f"fake-model{LONE_SURROGATE}")
    )
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    run = [*gsm8k_args, *xdist, "--gsm8k-limit=6", "--gsm8k-cache-dir=cache"]
    first = pytester.runpytest(*run, "--gsm8k-report=r.json", "--gsm8k-html=p.html")
    text = output(first)
    assert first.ret == 0, text
    assert not any(crash in text for crash in CRASHES), text
    assert "answer channel" not in text and "gsm8k cache" not in text
    assert "(server reported: fake-model\\ud83d)" in text  # shown as its escape
    record = by_index(report(pytester))[odd]
    assert record["outcome"] == "correct"
    assert LONE_SURROGATE in record["response"]
    assert record["samples"][0]["finish_reason"] == "stop" + LONE_SURROGATE
    # the files are UTF-8 and hold the escape, which reads back as the same text
    assert "\\ud83d" in (pytester.path / "r.json").read_text(encoding="utf-8")
    page = (pytester.path / "p.html").read_text(encoding="utf-8")
    assert "\\ud83d" in page and "<h1>gsm8k acc" in page
    assert (pytester.path / "summary.md").read_text(encoding="utf-8").startswith("### gsm8k acc")
    entries = list((pytester.path / "cache" / "responses").rglob("*.json"))
    assert len(entries) == 6
    server.reset()
    again = pytester.runpytest(*run, "--gsm8k-report=r2.json")
    assert again.ret == 0, output(again)
    assert sent(server) == 0, output(again)
    again.stdout.fnmatch_lines(["*answers from cache: 6 of 6*"])
    assert by_index(report(pytester, "r2.json"))[odd]["response"] == record["response"]


def test_surrogates_are_written_as_their_escapes_everywhere() -> None:
    text = f"a{LONE_SURROGATE}b \u00e9 \U0001f600"
    assert json.loads(to_json({"t": text})) == {"t": text}
    assert to_json({"t": text}).encode("utf-8")  # encodable
    assert escape_surrogates(text) == "a\\ud83db \u00e9 \U0001f600"
    assert escape_surrogates("plain") == "plain"
    assert printable(f"model{LONE_SURROGATE}\x1b[31m") == "model\\ud83d"
    report_json = {"problems": [{"id": "test-0001", "response": text, "index": 1}]}
    assert "\\ud83d" in render_html(report_json).encode("utf-8").decode("utf-8")
    stored = bl.dumps({"model": "m", "reported_models": [f"m{LONE_SURROGATE}"]})
    assert json.loads(stored)["reported_models"] == [f"m{LONE_SURROGATE}"]


# -- token counts that are not counts --------------------------------------------------------


def test_token_counts_that_are_not_counts_are_left_out_and_said_once(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    indices = chosen(5)
    server.set_script(
        Script(
            usage_by_index={
                indices[0]: {"prompt_tokens": -5},
                indices[1]: {"completion_tokens": 10**30},
                indices[2]: {"prompt_tokens": "many", "completion_tokens": True},
            }
        )
    )
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=5", "--gsm8k-report=r.json")
    text = output(result)
    assert result.ret == 0, text
    rep = report(pytester)
    problems = by_index(rep)
    assert "prompt_tokens" not in problems[indices[0]]["usage"]
    assert "completion_tokens" not in problems[indices[1]]["usage"]
    assert problems[indices[2]]["usage"] == {}
    assert problems[indices[3]]["usage"]["prompt_tokens"] > 0  # good counts are kept
    for name in ("prompt_tokens", "completion_tokens"):
        counted = [p["usage"][name] for p in problems.values() if name in p["usage"]]
        assert rep["tokens"][name] == sum(counted) and all(0 < c < 10**6 for c in counted)
    tokens = rep["tokens"]
    assert f"tokens: prompt {tokens['prompt_tokens']:,}, completion " in text
    assert f"completion {tokens['completion_tokens']:,};" in text
    assert text.count("token counts that are not counts (prompt_tokens=-5)") == 1, text
