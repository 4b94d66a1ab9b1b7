"""A scriptable, fast, OpenAI-compatible HTTP server for tests and benchmarks.

Why this exists: the plugin talks to real HTTP endpoints, so its tests need a
real server (real sockets, keep-alive, retries, dropped connections) whose
answers, latency and faults are known in advance.  Mocking the ``openai``
client would not exercise the transport at all.

Design notes
------------
* Standard library only: ``asyncio`` streams and a hand-written HTTP/1.1
  parser (request line, headers, ``Content-Length`` or chunked body,
  keep-alive by default).  Every response carries ``Content-Length`` so
  clients can reuse the connection.  No per-request threads, so at zero
  latency one core serves thousands of requests per second and latency is an
  ``asyncio.sleep`` that never blocks other connections.
* The server runs its own event loop in a daemon thread (``start()``), so
  synchronous tests can use it directly; ``python tests/fakeserver.py ...``
  runs it as a separate process (see ``serve_in_subprocess``).

Problem identification
----------------------
The server must know which GSM8K test question a request is about in order to
answer it.  The text searched is the content of the LAST ``user`` message
(chat) or the prompt (completions).  ``QuestionIndex.find`` then:

1. tries an exact dict lookup of the stripped text (the question *is* the
   message body);
2. otherwise scans the text backwards, position by position, looking up the
   40-character window starting there in a dict keyed by the first 40
   characters of every question (no two GSM8K test questions share a
   40-character prefix, but collisions are handled: candidates are verified
   with ``str.startswith`` at that position and the longest match wins).
   Scanning from the end means the question that starts LAST in the prompt is
   found (few-shot examples before it are ignored even if they were test
   questions), and the cost is proportional to the distance from the end of
   the prompt to the question (an instruction after it), not to the number of
   questions: typically a few hundred dict lookups, well under a millisecond;
3. if nothing matched, repeats 1-2 with all whitespace runs collapsed to one
   space on both sides, so a client that normalises whitespace still matches.

Requests whose problem cannot be identified get an unparseable answer and are
counted in ``stats()["unidentified"]``.

Samples
-------
``Script.samples[i]`` is a list of answers (strings; ``None`` = unparseable)
for problem ``i``.  It is used only for *sampling* requests: ``n > 1`` or
``temperature > 0``.  The server keeps a per-problem counter of samples
already served; each choice of each sampling request takes the next sample
in order (wrapping around at the end of the list).  So one request with
``n=4`` gets samples 0..3 as choices 0..3, and four separate ``n=1``
requests get samples 0, 1, 2, 3 in arrival order.  ``honour_n=False`` makes
the server return one choice regardless of ``n`` (consuming one sample).
Counters are cleared by ``reset()`` and ``set_script()``.

Noise
-----
Batched GPU serving answers some problems differently from run to run even at
temperature 0. ``Script.noisy_rate`` makes that share of the problems noisy
(which ones: a hash of ``noise_seed`` and the index, the same in every run and
process); every single-sample request for a noisy problem is right with
probability ``noisy_p``, each request drawing independently (the k-th request
for problem i draws from a hash of the seed, i and k), so the repeats of one
run differ and so do two runs. The draw counters are never cleared (not by
``reset()``, not by ``set_script()``, nor by ``POST /_script``): a rerun after a
reset is a new run, not a replay of the last one. They live as long as the
server process: a restarted server draws its first answers again, so change a
running server's script over ``POST /_script`` rather than restarting it.
``noise_draws()`` and ``take_noise_draws()`` carry them from one server to another: a
baseline recorded once and shared by several tests, each server then drawing as the
recording's would after it.
``Script.drop`` turns that many stable-correct problems wrong (a true
regression): the first ones in ``drop_pool`` (default: index order) that are
neither noisy nor scripted otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BEHAVIOURS",
    "FakeOpenAIServer",
    "QuestionIndex",
    "Script",
    "load_gsm8k",
    "serve_in_subprocess",
    "stop_subprocess",
]

#: Behaviours a problem can have.  "hang" never answers (for client timeouts).
BEHAVIOURS = frozenset(
    {
        "correct",
        "wrong",
        "unparsed",
        "truncated",
        "think",
        "error500",
        "hang",
        # 200 replies with no usable answer: an empty ``choices`` list, a null
        # ``content`` (chat) / ``text`` (completions) without reasoning, a body that is not JSON,
        # a text/plain body of whitespace only (a proxy's empty page); labelled JSON, a body
        # of whitespace only or one that is not UTF-8
        "nochoices",
        "nullcontent",
        "badjson",
        "blank",
        "blankjson",
        "badutf8",
        # labelled JSON, not JSON: the request's Authorization header at the 190th character
        # of its one line (an excerpt cut at 200 characters cuts the key)
        "echojson",
        # hostile sizes and text: a lone UTF-16 surrogate (``\ud83d``, legal in JSON, not
        # encodable as UTF-8) in the answer; ``Script.huge_chars`` spaces before the answer;
        # the same behind gzip (``Script.bomb_chars`` spaces: a few hundred KB on the wire)
        "surrogate",
        "huge",
        "gzipbomb",
        # a chat model asked through /v1/completions: it answers in its own turn markup
        # (Llama 3's header and end-of-turn tokens) and gives no number
        "template",
    }
)

#: the lone surrogate the "surrogate" behaviour puts in its answers (and its finish_reason)
LONE_SURROGATE = "\ud83d"

#: Fault kinds accepted in ``Script.fail_first``; any other 3-digit status is allowed too.
FAULT_KINDS = frozenset({"429", "500", "drop"})

#: Text that contains no digit at all, so no parser can extract a number.
UNPARSED_TEXT = "I am not sure how to solve this problem. Let me skip it."

#: What a base model would go on to generate after its answer (no digits).
COMPLETION_TAIL = (
    "\n\nQuestion: A farmer has some apples and gives some away. How many are left?\nAnswer:"
)

_CALC_RE = re.compile(r"<<[^>]*>>")
_WS_RE = re.compile(r"\s+")
_WORD_RE = re.compile(r"\S+")

_REASONS = {
    200: "OK",
    302: "Found",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


# --------------------------------------------------------------------------- data


def load_gsm8k(path: str | Path) -> tuple[list[str], list[str], list[str]]:
    """Return (questions, gold answers as written after ``####``, solutions)."""
    questions: list[str] = []
    golds: list[str] = []
    solutions: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            answer: str = row["answer"]
            sol, _, gold = answer.rpartition("####")
            questions.append(row["question"])
            golds.append(gold.strip())
            solutions.append(sol.strip())
    return questions, golds, solutions


def _norm_ws(text: str) -> str:
    return _WS_RE.sub(" ", text).strip()


class QuestionIndex:
    """Find which known question occurs last in a prompt (see module docstring)."""

    PREFIX = 40

    def __init__(self, questions: list[str]) -> None:
        self.questions = [q.strip() for q in questions]
        self.k = min([self.PREFIX, *(len(q) for q in self.questions if q)])
        self._exact, self._prefix = self._build(self.questions)
        self._norm_questions = [_norm_ws(q) for q in self.questions]
        self._norm_exact, self._norm_prefix = self._build(self._norm_questions)

    def _build(self, qs: list[str]) -> tuple[dict[str, int], dict[str, list[int]]]:
        exact: dict[str, int] = {}
        prefix: dict[str, list[int]] = {}
        for i, q in enumerate(qs):
            if not q:
                continue
            exact.setdefault(q, i)
            prefix.setdefault(q[: self.k], []).append(i)
        return exact, prefix

    def find(self, text: str) -> int | None:
        """Index of the question that starts last in ``text``, or None."""
        if not text:
            return None
        found = self._exact.get(text.strip())
        if found is None:
            found = self._scan(text, self.questions, self._prefix)
        if found is None:
            norm = _norm_ws(text)
            found = self._norm_exact.get(norm)
            if found is None:
                found = self._scan(norm, self._norm_questions, self._norm_prefix)
        return found

    def _scan(self, text: str, qs: list[str], prefix: dict[str, list[int]]) -> int | None:
        k = self.k
        get = prefix.get
        startswith = text.startswith
        for pos in range(len(text) - k, -1, -1):
            cands = get(text[pos : pos + k])
            if cands is None:
                continue
            best: int | None = None
            for i in cands:
                if startswith(qs[i], pos) and (best is None or len(qs[i]) > len(qs[best])):
                    best = i
            if best is not None:
                return best
        return None


@functools.lru_cache(maxsize=4)
def _corpus(path: str, _stamp: tuple[int, int]) -> tuple[list[str], list[str], QuestionIndex]:
    """Questions, golds and the solution steps' index of a data file, built once per
    process and file version (``_stamp``: mtime, size) and only read after: a quarter of a
    second each, and most tests start a server of their own."""
    questions, golds, solutions = load_gsm8k(path)
    steps = [" ".join(_CALC_RE.sub("", s).split()) for s in solutions]
    return golds, steps, QuestionIndex(questions)


# --------------------------------------------------------------------------- script


def _int_keys(d: dict[Any, Any] | None) -> dict[int, Any]:
    return {int(k): v for k, v in (d or {}).items()}


@dataclass
class Script:
    """What the server answers, per problem index (0-based line in test.jsonl).

    ``fail_first[i] = {"429": 2, "500": 1}`` means the first two requests for
    problem ``i`` get 429 (with ``Retry-After: retry_after`` seconds and
    ``retry-after-ms``), the third gets 500, later ones are answered normally;
    ``"drop"`` closes the TCP connection without a response.  Kinds apply in
    dict order.  ``latency`` (if not None) overrides the server's global
    latency; ``latency_by_index`` adds to it.
    """

    default: str = "correct"
    behaviours: dict[int, str] = field(default_factory=dict)
    fail_first: dict[int, dict[str, int]] = field(default_factory=dict)
    retry_after: float = 0.05
    latency: float | None = None
    latency_by_index: dict[int, float] = field(default_factory=dict)
    samples: dict[int, list[str | None]] = field(default_factory=dict)
    #: hostile: echo the request's Authorization header (the API key) in every error body,
    #: at the end of every answer's text and in a response header
    echo_auth: bool = False
    #: the model name the replies report (default: the served model), e.g. with ANSI escapes
    reported_model: str | None = None
    #: "huge": spaces before the answer (70 MB: past the plugin's 32 MiB bound on a reply)
    huge_chars: int = 70_000_000
    #: "gzipbomb": spaces before the answer, gzip-compressed about 1000:1 on the wire
    bomb_chars: int = 200_000_000
    #: per problem: replace these fields of the reply's ``usage`` (e.g. negative counts)
    usage_by_index: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: hostile: the request's Authorization header as every choice's ``finish_reason`` and
    #: the reply's ``system_fingerprint`` (fields a client stores without reading them)
    echo_auth_fields: bool = False
    #: the Content-Type of the completion replies (None: application/json; "": no header)
    reply_content_type: str | None = None
    #: hostile: GET /models lists the key it was sent (the bearer token) as a model id
    echo_auth_models: bool = False
    #: GET /models answers 302 to this URL (a request whose query holds ``redirected`` is
    #: served normally, so a redirect to the same server ends)
    redirect_models: str | None = None
    #: seconds between two bytes of GET /models's response (head and body): a server that
    #: answers every read in time but never finishes
    drip_models: float = 0.0
    #: GET /models answers 404: a server (or a proxy in front of one) that lists no models
    unlisted: bool = False
    #: serve only paths under /v1/ (as vLLM and Ollama do): any other path answers 404 with
    #: FastAPI's body, the reply a base URL without /v1 gets
    v1_only: bool = False
    #: serving noise (see "Noise" above): the share of problems that flip from request to
    #: request, their chance of being right in each, and the seed of both choices
    noisy_rate: float = 0.0
    noisy_p: float = 0.5
    noise_seed: int = 0
    #: a true regression: this many stable-correct problems answered wrong, the first ones
    #: of ``drop_pool`` (default: every problem, in index order)
    drop: int = 0
    drop_pool: list[int] = field(default_factory=list)
    #: refuse as OpenAI's reasoning models do: 400 for ``max_tokens`` (they take
    #: ``max_completion_tokens``), then 400 for any temperature but 1
    reasoning: bool = False

    def __post_init__(self) -> None:
        self.behaviours = _int_keys(self.behaviours)
        self.drop_pool = [int(i) for i in self.drop_pool]
        if not 0.0 <= self.noisy_rate <= 1.0 or not 0.0 <= self.noisy_p <= 1.0:
            raise ValueError("noisy_rate and noisy_p are shares, between 0 and 1")
        self.fail_first = {
            k: {str(kind): int(c) for kind, c in v.items()}
            for k, v in _int_keys(self.fail_first).items()
        }
        self.latency_by_index = {k: float(v) for k, v in _int_keys(self.latency_by_index).items()}
        self.usage_by_index = {k: dict(v) for k, v in _int_keys(self.usage_by_index).items()}
        self.samples = {
            k: [None if s is None else str(s) for s in v]
            for k, v in _int_keys(self.samples).items()
        }
        for b in [self.default, *self.behaviours.values()]:
            if b not in BEHAVIOURS:
                raise ValueError(f"unknown behaviour {b!r}; expected one of {sorted(BEHAVIOURS)}")
        for faults in self.fail_first.values():
            for kind in faults:
                if kind not in FAULT_KINDS and not (kind.isdigit() and len(kind) == 3):
                    raise ValueError(
                        f"unknown fault kind {kind!r}; expected 'drop' or an HTTP status"
                    )

    def behaviour(self, index: int) -> str:
        return self.behaviours.get(index, self.default)

    def noisy(self, index: int) -> bool:
        """Whether problem ``index`` is one of the noisy ones (``noisy_rate``)."""
        return self.noisy_rate > 0 and _unit(self.noise_seed, index, -1) < self.noisy_rate

    def dropped(self, count: int) -> frozenset[int]:
        """The problems ``drop`` turns wrong, of ``count`` problems."""
        if self.drop <= 0:
            return frozenset()
        pool = self.drop_pool or range(count)
        stable = (i for i in pool if self.behaviour(i) == "correct" and not self.noisy(i))
        return frozenset(i for _, i in zip(range(self.drop), stable, strict=False))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """JSON text; int keys become strings and are converted back by ``from_json``."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, data: str | bytes | dict[str, Any]) -> Script:
        obj = json.loads(data) if isinstance(data, str | bytes) else data
        if not isinstance(obj, dict):
            raise ValueError("script JSON must be an object")
        return cls(**obj)


# --------------------------------------------------------------------------- answers


def _plus_one(gold: str) -> str:
    plain = gold.replace(",", "")
    try:
        return str(int(plain) + 1)
    except ValueError:
        try:
            return repr(float(plain) + 1)
        except ValueError:
            return "1" + plain


def _unit(seed: int, index: int, draw: int) -> float:
    """A uniform number in [0, 1) from SHA-256 of (seed, index, draw): the same everywhere."""
    digest = hashlib.sha256(f"{seed}:{index}:{draw}".encode()).digest()
    return int.from_bytes(digest[:7], "big") / 2**56


def _answer_text(value: str) -> str:
    return f"Let me think step by step. The answer is {value}.\n#### {value}"


def _cut_words(text: str, max_words: int) -> tuple[str, bool]:
    """Cut ``text`` after ``max_words`` whitespace-separated words (token proxy)."""
    if max_words <= 0:
        return "", True
    for n, m in enumerate(_WORD_RE.finditer(text), 1):
        if n == max_words:
            end = m.end()
            return text[:end], end < len(text.rstrip())
    return text, False


def _count_words(text: str) -> int:
    return len(text.split())


def _error_body(
    message: str, type_: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _reasoning_refusal(req: dict[str, Any]) -> dict[str, Any] | None:
    """The 400 bodies OpenAI's reasoning models answer, one fault at a time as they do."""
    if "max_tokens" in req:
        return _error_body(
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "invalid_request_error",
            "unsupported_parameter",
            "max_tokens",
        )
    temperature = req.get("temperature")
    if temperature is not None and temperature != 1:
        return _error_body(
            f"Unsupported value: 'temperature' does not support {temperature} with this "
            "model. Only the default (1) value is supported.",
            "invalid_request_error",
            "unsupported_value",
            "temperature",
        )
    return None


@dataclass
class _Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False
    hang: bool = False
    completed: bool = False  # a successful completion response (counts for die_after)
    drip: float = 0.0  # seconds between two bytes of the response
    kill_after: bool = False  # /_shutdown: kill once this response is flushed


def _json_response(status: int, obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> _Response:
    return _Response(status, json.dumps(obj).encode(), headers=headers)


#: where the "gzipbomb" behaviour's spaces go (replaced when the body is compressed)
BOMB_MARK = "\x00BOMB\x00"


def _gzip_bomb(resp: _Response, spaces: int) -> _Response:
    """``resp`` gzip-encoded, with ``spaces`` spaces in place of :data:`BOMB_MARK`: compressed
    piece by piece, so the server never holds the decoded body (200 MB -> about 200 KB)."""
    mark = json.dumps(BOMB_MARK)[1:-1].encode()
    head, _, tail = resp.body.partition(mark)
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [packer.compress(head)]
    block = b" " * (1 << 20)
    for start in range(0, spaces, len(block)):
        parts.append(packer.compress(block[: min(len(block), spaces - start)]))
    parts += [packer.compress(tail), packer.flush()]
    return _Response(
        resp.status,
        b"".join(parts),
        headers=(*resp.headers, ("Content-Encoding", "gzip")),
        completed=resp.completed,
    )


class _BadRequest(Exception):
    pass


# --------------------------------------------------------------------------- server


class FakeOpenAIServer:
    """OpenAI-compatible server with scripted answers, latency and faults.

    Use as ``with FakeOpenAIServer(path).start() as srv: ...`` or call
    ``start()``/``stop()``.  ``kill()`` simulates a crash: the listening socket
    and every open connection are closed at once, so new requests are refused.
    """

    def __init__(
        self,
        questions_path: str | Path,
        *,
        model: str = "fake-model",
        api_key: str | None = None,
        latency: float = 0.0,
        script: Script | None = None,
        honour_n: bool = True,
        record: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        die_after: int | None = None,
        extra_models: Iterable[str] = (),
        adapters: Iterable[str] = (),
        reasoning_field: bool = False,
        record_file: str | Path | None = None,
        raw_file: str | Path | None = None,
        root: str | None = None,
        owned_by: str = "fake",
        max_model_len: int | None = None,
        fingerprint: str | None = "fake",
    ) -> None:
        stat = os.stat(questions_path)
        self.golds, self._steps, self.index = _corpus(
            os.fspath(questions_path), (stat.st_mtime_ns, stat.st_size)
        )
        self.model = model
        self.api_key = api_key
        self.latency = latency
        self.script = script or Script()
        self.honour_n = honour_n
        self.record = record
        self.host = host
        self.port = port
        self.die_after = die_after
        #: more ids listed by GET /models (requests must still name ``model``)
        self.extra_models = list(extra_models)
        #: LoRA adapters on top of ``model``, listed as vLLM lists them (``root`` their
        #: folder, ``parent`` the base); a request naming one is answered (the same answers)
        #: with its name in the reply, a request naming none by the base, as vLLM does
        self.adapters = list(adapters)
        #: chat replies carry <think> reasoning in ``reasoning_content``, not in the content
        self.reasoning_field = reasoning_field
        #: every completion request body is appended here as one JSON line (server side)
        self.record_file = Path(record_file) if record_file is not None else None
        self.raw_file = Path(raw_file) if raw_file is not None else None
        #: what GET /models says about the served model (``root``, ``max_model_len``: only
        #: when set, as vLLM gives them); a test changes them between runs to play a server
        #: restarted with another model under the same name
        self.root = root
        self.owned_by = owned_by
        self.max_model_len = max_model_len
        #: every reply's ``system_fingerprint`` (None: the field is left out)
        self.fingerprint = fingerprint
        self.on_kill: Callable[[], None] | None = None  # called (in the loop thread) after a kill

        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._killed = False
        self._ids = 0
        #: draws taken per noisy problem (never cleared: see "Noise" in the module docstring)
        self._noise_pos: dict[int, int] = {}
        self._drop_cache: tuple[Script, frozenset[int]] | None = None
        self._reset_locked()

    # ----------------------------------------------------------- public API

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> FakeOpenAIServer:
        """Start serving in a daemon thread; returns once the socket listens."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._killed = False
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle_conn, self.host, self.port, backlog=1024)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # report to start() instead of dying silently
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                # A connection accepted just before the stop has a task whose handler never
                # started: cancel and run it, or its coroutine is "never awaited" at close.
                # (none left: gather() of nothing asks for this thread's loop, and fails)
                if left := asyncio.all_tasks(loop):
                    for task in left:
                        task.cancel()
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name=f"fakeserver-{id(self):x}", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            self._thread = None
            raise errors[0]
        return self

    def stop(self) -> None:
        """Close everything and stop the event loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def shutdown() -> None:
            self._close_all(graceful=None)
            # Let cancelled connection handlers finish, so none is destroyed pending.
            pending = [t for t in self._tasks if t is not asyncio.current_task()]
            if pending:
                await asyncio.wait(pending, timeout=2)
            loop.stop()

        loop.call_soon_threadsafe(lambda: loop.create_task(shutdown()))
        thread.join(timeout=5)
        self._thread = None

    def kill(self) -> None:
        """Abruptly close the listening socket and every open connection.

        The event loop keeps running so ``stats()`` stays readable; ``stop()``
        still has to be called (the context manager does it).
        """
        loop = self._loop
        if loop is None or self._killed:
            return
        if self._thread is None or not self._thread.is_alive():
            self._killed = True  # loop already stopped: nothing left to close
            return
        if self._in_loop_thread():
            self._close_all(graceful=None)
            return
        done = threading.Event()

        def do() -> None:
            try:
                self._close_all(graceful=None)
            finally:
                done.set()

        loop.call_soon_threadsafe(do)
        done.wait(timeout=5)

    @property
    def killed(self) -> bool:
        return self._killed

    def stats(self) -> dict[str, Any]:
        """A snapshot (deep enough to be safe to keep) of the counters."""
        with self._lock:
            out: dict[str, Any] = {
                "requests_total": self._requests_total,
                "requests_by_path": dict(self._by_path),
                "requests_by_index": dict(self._by_index),
                "in_flight": self._in_flight,
                "peak_in_flight": self._peak,
                "status_counts": dict(self._status_counts),
                "n_4xx": self._n4xx,
                "n_5xx": self._n5xx,
                "dropped": self._dropped,
                "completed": self._completed,
                "unidentified": self._unidentified,
                "auth_headers": list(self._auth_seen),
                "requests_without_auth": self._no_auth,
                "killed": self._killed,
                "proxied": dict(self._proxied),
                "proxy_auth": list(self._proxy_auth),
            }
            if self.record:
                out["bodies"] = list(self._bodies)
                out["raw_bodies"] = list(self._raw_bodies)
                out["request_headers"] = list(self._headers_seen)
            return out

    def reset(self) -> None:
        """Clear statistics, fault counters and sample counters."""
        with self._lock:
            self._reset_locked()

    def noise_draws(self) -> dict[int, int]:
        """The draws taken so far, per noisy problem (a copy)."""
        with self._lock:
            return dict(self._noise_pos)

    def take_noise_draws(self, draws: dict[int, int]) -> None:
        """Count ``draws`` (another server's ``noise_draws()``) as taken here too."""
        with self._lock:
            for index, taken in draws.items():
                self._noise_pos[index] = self._noise_pos.get(index, 0) + taken

    def set_script(self, script: Script) -> None:
        """Replace the script; fault and sample counters start again."""
        with self._lock:
            self.script = script
            self._attempts.clear()
            self._sample_pos.clear()

    def __enter__(self) -> FakeOpenAIServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FakeOpenAIServer(base_url={self.base_url!r}, model={self.model!r})"

    # ----------------------------------------------------------- internals

    def _reset_locked(self) -> None:
        self._requests_total = 0
        self._by_path: dict[str, int] = {}
        self._by_index: dict[int, int] = {}
        self._in_flight = getattr(self, "_in_flight", 0)
        self._peak = self._in_flight
        self._status_counts: dict[int, int] = {}
        self._n4xx = 0
        self._n5xx = 0
        self._dropped = 0
        self._completed = 0
        self._unidentified = 0
        self._auth_seen: list[str] = []
        self._no_auth = 0
        self._bodies: list[Any] = []
        self._raw_bodies: list[str] = []
        #: with ``record``: each completion request's headers (names as received, lowered)
        self._headers_seen: list[dict[str, str]] = []
        #: requests that came as a forward proxy gets them (absolute-form targets), by host
        self._proxied: dict[str, int] = {}
        #: the distinct Proxy-Authorization headers those requests carried ("" for none)
        self._proxy_auth: list[str] = []
        self._attempts: dict[int, int] = {}
        self._sample_pos: dict[int, int] = {}

    def _in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _close_all(self, graceful: asyncio.StreamWriter | None) -> None:
        """Close the listener, abort connections (``graceful`` is flushed first)."""
        first = not self._killed
        self._killed = True
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            if w is graceful:
                w.close()
            else:
                w.transport.abort()
        current = (
            asyncio.current_task() if self._loop is not None and self._loop.is_running() else None
        )
        for t in list(self._tasks):
            if t is not current:
                t.cancel()
        if first and self.on_kill is not None:
            self.on_kill()

    async def _handle_conn(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._killed:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._writers.add(writer)
        self._tasks.add(task)
        try:
            await self._serve_conn(reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            if not writer.transport.is_closing():
                writer.close()

    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self._killed:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            except asyncio.LimitOverrunError:
                writer.write(
                    self._encode(
                        _json_response(
                            431, _error_body("headers too large", "invalid_request_error", None)
                        ),
                        False,
                    )
                )
                return
            lines = head.decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                writer.write(
                    self._encode(
                        _json_response(
                            400, _error_body("bad request line", "invalid_request_error", None)
                        ),
                        False,
                    )
                )
                return
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            conn_hdr = headers.get("connection", "").lower()
            keep_alive = conn_hdr != "close" if version == "HTTP/1.1" else conn_hdr == "keep-alive"

            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = await self._read_chunked(reader)
            else:
                try:
                    length = int(headers.get("content-length", "0"))
                except ValueError:
                    length = -1
                if length < 0:
                    writer.write(
                        self._encode(
                            _json_response(
                                400,
                                _error_body("bad Content-Length", "invalid_request_error", None),
                            ),
                            False,
                        )
                    )
                    return
                body = await reader.readexactly(length) if length else b""

            if target.startswith(("http://", "https://")):
                # absolute-form (RFC 9112 3.2.2): a client sent it here as to a proxy; served
                # as if for this server, and counted by the host it named
                host, _, rest = target.partition("://")[2].partition("/")
                target = "/" + rest
                with self._lock:
                    self._proxied[host] = self._proxied.get(host, 0) + 1
                    if (
                        proxy_auth := headers.get("proxy-authorization", "")
                    ) not in self._proxy_auth:
                        self._proxy_auth.append(proxy_auth)
            path, _, query = target.partition("?")
            resp = await self._dispatch(method, path, headers, body, query)
            if self._killed and not resp.kill_after:
                return
            if resp.drop:
                writer.transport.abort()
                return
            data = self._encode(resp, keep_alive)
            if resp.drip > 0:
                for i in range(len(data)):
                    writer.write(data[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(resp.drip)
            else:
                writer.write(data)
            await writer.drain()
            if resp.kill_after or (
                resp.completed and self.die_after is not None and self._completed >= self.die_after
            ):
                self._close_all(graceful=writer)
                return
            if not keep_alive:
                return

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # trailers until empty line
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    @staticmethod
    def _encode(resp: _Response, keep_alive: bool) -> bytes:
        head = [
            f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, 'Status')}",
            f"Content-Length: {len(resp.body)}",
            "Connection: keep-alive" if keep_alive else "Connection: close",
        ]
        if resp.content_type:  # "": a reply without the header
            head.insert(1, f"Content-Type: {resp.content_type}")
        head.extend(f"{k}: {v}" for k, v in resp.headers)
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + resp.body

    def _count_status(self, status: int) -> None:
        with self._lock:
            self._status_counts[status] = self._status_counts.get(status, 0) + 1
            if 400 <= status < 500:
                self._n4xx += 1
            elif status >= 500:
                self._n5xx += 1

    async def _dispatch(
        self, method: str, path: str, headers: dict[str, str], body: bytes, query: str = ""
    ) -> _Response:
        if path.startswith("/_"):
            return self._admin(method, path, body)
        if self.script.v1_only and not path.startswith("/v1/"):
            self._count_status(404)
            return _json_response(404, {"detail": "Not Found"})
        if path.startswith("/v1/"):
            path = path[3:]
        with self._lock:
            self._requests_total += 1
            key = "/v1" + path
            self._by_path[key] = self._by_path.get(key, 0) + 1
            self._in_flight += 1
            if self._in_flight > self._peak:
                self._peak = self._in_flight
            if self.record and path.endswith("completions"):
                self._headers_seen.append(dict(headers))
            auth = headers.get("authorization")
            if auth is None:
                self._no_auth += 1
            elif auth not in self._auth_seen:
                self._auth_seen.append(auth)
        try:
            resp = await self._route(method, path, headers, body, query)
        finally:
            with self._lock:
                self._in_flight -= 1
        if self.script.echo_auth and auth is not None:
            # proxies and gateways echo request headers back in response headers too
            resp.headers = (*resp.headers, ("X-Echo-Authorization", auth))
        if resp.drop:
            with self._lock:
                self._dropped += 1
        else:
            self._count_status(resp.status)
        return resp

    def _admin(self, method: str, path: str, body: bytes) -> _Response:
        if path == "/_stats" and method == "GET":
            return _json_response(200, self.stats())
        if path == "/_reset" and method == "POST":
            self.reset()
            return _json_response(200, {"ok": True})
        if path == "/_script" and method == "POST":
            try:
                self.set_script(Script.from_json(body or b"{}"))
            except (ValueError, TypeError) as exc:
                return _json_response(
                    400, _error_body(f"bad script: {exc}", "invalid_request_error", None)
                )
            return _json_response(200, {"ok": True})
        if path in ("/_shutdown", "/_kill") and method == "POST":
            resp = _json_response(200, {"ok": True})
            resp.kill_after = True
            return resp
        return _json_response(
            404, _error_body(f"unknown admin path {path}", "invalid_request_error", None)
        )

    async def _route(
        self, method: str, path: str, headers: dict[str, str], body: bytes, query: str = ""
    ) -> _Response:
        script = self.script
        if path == "/models" and script.redirect_models and "redirected" not in query:
            return _Response(302, headers=(("Location", script.redirect_models),))
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return _json_response(
                401,
                _error_body(
                    "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            )
        if script.unlisted and (path == "/models" or path.startswith("/models/")):
            return self._model_not_found(path)
        if path == "/models" or path.startswith("/models/"):
            if method != "GET":
                return _json_response(
                    405, _error_body("method not allowed", "invalid_request_error", None)
                )
            card: dict[str, Any] = {
                "id": self.model,
                "object": "model",
                "created": 0,
                "owned_by": self.owned_by,
            }
            if self.root is not None:
                card["root"] = self.root
            if self.max_model_len is not None:
                card["max_model_len"] = self.max_model_len
            if path == "/models":
                extra = list(self.extra_models)
                auth = headers.get("authorization", "")
                if script.echo_auth_models and auth:
                    extra.append(auth.removeprefix("Bearer "))
                cards = (
                    [card]
                    + [
                        {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                        for m in extra
                    ]
                    + [
                        {**card, "id": a, "root": f"/adapters/{a}", "parent": self.model}
                        for a in self.adapters
                    ]
                )
                listing = _json_response(200, {"object": "list", "data": cards})
                listing.drip = script.drip_models
                return listing
            name = path[len("/models/") :]
            if name != self.model:
                return self._model_not_found(name)
            return _json_response(200, card)
        if path in ("/chat/completions", "/completions"):
            if method != "POST":
                return _json_response(
                    405, _error_body("method not allowed", "invalid_request_error", None)
                )
            try:
                return await self._completion(
                    path == "/chat/completions", body, headers.get("authorization")
                )
            except _BadRequest as exc:
                return _json_response(400, _error_body(str(exc), "invalid_request_error", None))
        return _json_response(
            404, _error_body(f"Invalid URL ({method} {path})", "invalid_request_error", None)
        )

    def _model_not_found(self, name: str) -> _Response:
        return _json_response(
            404,
            _error_body(
                f"The model `{name}` does not exist",
                "invalid_request_error",
                "model_not_found",
                "model",
            ),
        )

    @staticmethod
    def _content_text(content: Any) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(
                str(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and p.get("type", "text") == "text"
            )
        return ""

    async def _completion(self, chat: bool, body: bytes, auth: str | None = None) -> _Response:
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(req, dict):
            raise _BadRequest("request body must be a JSON object")
        if self.record:
            with self._lock:
                self._bodies.append(req)
                self._raw_bodies.append(body.decode("utf-8", "replace"))
        if self.record_file is not None:
            with self._lock, self.record_file.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(req) + "\n")
        if self.raw_file is not None:  # the bytes as received, one JSON string a line
            with self._lock, self.raw_file.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(body.decode("utf-8", "replace")) + "\n")
        # No model at all is the served one, as vLLM answers (its GSM8K script sends none).
        model = req.get("model", self.model)
        if not isinstance(model, str) or not model:
            raise _BadRequest("you must provide a model parameter")
        if model != self.model and model not in self.adapters:
            return self._model_not_found(model)
        refusal = _reasoning_refusal(req) if self.script.reasoning else None
        if refusal is not None:
            return _json_response(400, refusal)

        # ---- which problem(s)
        prompts: list[str]
        if chat:
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("'messages' must be a non-empty list")
            users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            prompts = [self._content_text(users[-1].get("content")) if users else ""]
            prompt_words = sum(
                _count_words(self._content_text(m.get("content")))
                for m in messages
                if isinstance(m, dict)
            )
        else:
            prompt = req.get("prompt")
            if isinstance(prompt, str):
                prompts = [prompt]
            elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
                prompts = list(prompt)
            else:
                raise _BadRequest("'prompt' must be a string or a list of strings")
            prompt_words = sum(_count_words(p) for p in prompts)
        indices = [self.index.find(p) for p in prompts]
        n = req.get("n") or 1
        if not isinstance(n, int) or n < 1:
            raise _BadRequest("'n' must be a positive integer")
        n_choices = n if self.honour_n else 1
        temperature = req.get("temperature")
        sampling = n > 1 or (isinstance(temperature, int | float) and temperature > 0)

        # ---- faults and latency (decided by the first identified problem)
        script = self.script
        first = next((i for i in indices if i is not None), None)
        fault: str | None = None
        with self._lock:
            for idx in indices:
                if idx is None:
                    self._unidentified += 1
                else:
                    self._by_index[idx] = self._by_index.get(idx, 0) + 1
            if first is not None:
                attempt = self._attempts.get(first, 0)
                self._attempts[first] = attempt + 1
                for kind, count in script.fail_first.get(first, {}).items():
                    if attempt < count:
                        fault = kind
                        break
                    attempt -= count
        echo = f" (you sent Authorization: {auth})" if script.echo_auth else ""
        if fault == "drop":
            return _Response(0, drop=True)
        if fault is not None:
            status = int(fault)
            if status == 429:
                ra = script.retry_after
                return _json_response(
                    429,
                    _error_body(
                        "Rate limit reached (scripted)." + echo, "requests", "rate_limit_exceeded"
                    ),
                    headers=(("Retry-After", f"{ra:g}"), ("retry-after-ms", f"{ra * 1000:g}")),
                )
            return _json_response(
                status, _error_body(f"Scripted fault {status}.{echo}", "server_error", None)
            )

        delay = (self.latency if script.latency is None else script.latency) + (
            script.latency_by_index.get(first, 0.0) if first is not None else 0.0
        )
        behaviour = script.behaviour(first) if first is not None else "correct"
        if behaviour == "hang":
            await asyncio.sleep(3600)
        if delay > 0:
            await asyncio.sleep(delay)
        if behaviour == "error500":
            return _json_response(
                500, _error_body("The server had an error (scripted)." + echo, "server_error", None)
            )
        if behaviour == "badjson":
            with self._lock:
                self._completed += 1
            return _Response(200, b'{"id": "cmpl-broken", "choices": [{"index": 0, "mess')
        if behaviour == "blank":
            return _Response(200, b" \r\n ", content_type="text/plain")
        if behaviour in ("blankjson", "badutf8"):
            return _Response(200, b" \r\n " if behaviour == "blankjson" else b'{"x": "\xff"}')
        if behaviour == "echojson":
            return _Response(200, ("<" * (190 - len("Bearer ")) + str(auth)).encode())

        # ---- generate choices
        stop = req.get("stop")
        stops = (
            [stop]
            if isinstance(stop, str)
            else [s for s in (stop or []) if isinstance(s, str) and s]
        )
        max_tokens = req.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = req.get("max_tokens")
        texts: list[tuple[str, str]] = []
        for idx in indices:
            for _ in range(n_choices):
                text, finish = self._generate(idx, chat, sampling)
                if stops:
                    cut = min((p for p in (text.find(s) for s in stops) if p >= 0), default=-1)
                    if cut >= 0:
                        text, finish = text[:cut], "stop"
                if isinstance(max_tokens, int):
                    text, over = _cut_words(text, max_tokens)
                    if over:
                        finish = "length"
                texts.append((text, finish))

        with self._lock:
            self._ids += 1
            rid = self._ids
            self._completed += 1
        completion_words = sum(_count_words(t) for t, _ in texts)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_words,
            "completion_tokens": completion_words,
            "total_tokens": prompt_words + completion_words,
        }
        for idx in indices:
            if idx is not None:
                usage.update(script.usage_by_index.get(idx, {}))
        kinds = {script.behaviour(i) for i in indices if i is not None}
        if "surrogate" in kinds:
            texts = [(t, f + LONE_SURROGATE) for t, f in texts]
        if script.echo_auth:
            texts = [(f"{t}\n(debug: your header was {auth})", f) for t, f in texts]
        if script.echo_auth_fields:
            texts = [(t, str(auth)) for t, _ in texts]
        resp = self._render(
            chat, rid, texts, usage, bool(req.get("stream")), req.get("stream_options")
        )
        resp.completed = True
        resp = self._hostile(chat, resp, indices, auth, model)
        if "gzipbomb" in kinds and resp.content_type == "application/json":
            loop = asyncio.get_running_loop()
            resp = await loop.run_in_executor(None, _gzip_bomb, resp, script.bomb_chars)
        if script.reply_content_type is not None:
            resp.content_type = script.reply_content_type
        return resp

    def _generate(self, idx: int | None, chat: bool, sampling: bool) -> tuple[str, str]:
        """(text, finish_reason) for one choice, before stop/max_tokens handling."""
        lead = "" if chat else " "
        tail = "" if chat else COMPLETION_TAIL
        if idx is None:
            return lead + UNPARSED_TEXT + tail, "stop" if chat else "length"
        finish = "stop" if chat else "length"  # a base model without `stop` rambles on
        samples = self.script.samples.get(idx)
        if sampling and samples:
            with self._lock:
                pos = self._sample_pos.get(idx, 0)
                self._sample_pos[idx] = pos + 1
            value = samples[pos % len(samples)]
            body = UNPARSED_TEXT if value is None else _answer_text(value)
            return lead + body + tail, finish
        gold = self.golds[idx]
        behaviour = self._noisy_behaviour(idx)
        steps = self._steps[idx]
        if behaviour == "wrong":
            body = _answer_text(_plus_one(gold))
        elif behaviour == "unparsed":
            body = UNPARSED_TEXT
        elif behaviour == "template":
            body = f"<|start_header_id|>assistant<|end_header_id|>\n{UNPARSED_TEXT}<|eot_id|>"
        elif behaviour == "truncated":
            words = steps.split()
            body = "Let me think step by step. " + " ".join(words[: max(1, len(words) // 2)])
            return lead + body, "length"
        elif behaviour == "surrogate":
            body = (
                f"Let me think {LONE_SURROGATE} step by step. {steps} "
                f"The answer is {gold}.\n#### {gold}"
            )
        elif behaviour == "huge":
            body = " " * self.script.huge_chars + _answer_text(gold)
        elif behaviour == "gzipbomb":
            body = BOMB_MARK + _answer_text(gold)
        elif behaviour == "think":
            body = (
                f"<think>\nMaybe the answer is {_plus_one(gold)}. "
                f"No, let me recompute: {steps}\n</think>\n"
                f"The answer is {gold}.\n#### {gold}"
            )
        else:
            body = f"Let me think step by step. {steps} The answer is {gold}.\n#### {gold}"
        return lead + body + tail, finish

    def _noisy_behaviour(self, idx: int) -> str:
        """The script's behaviour for one answer, after ``drop`` and the serving noise."""
        script = self.script
        behaviour = script.behaviour(idx)
        if behaviour != "correct" or not (script.noisy_rate > 0 or script.drop > 0):
            return behaviour
        if script.noisy(idx):
            with self._lock:
                draw = self._noise_pos.get(idx, 0)
                self._noise_pos[idx] = draw + 1
            return "correct" if _unit(script.noise_seed, idx, draw) < script.noisy_p else "wrong"
        with self._lock:
            if self._drop_cache is None or self._drop_cache[0] is not script:
                self._drop_cache = (script, script.dropped(len(self.golds)))
            dropped = self._drop_cache[1]
        if idx in dropped:
            return "wrong"
        return behaviour

    def _message(self, text: str) -> dict[str, Any]:
        """The chat message; with ``reasoning_field`` a leading ``<think>`` block (closed or
        cut by the token limit) goes to ``reasoning_content``, as vLLM's reasoning parsers do."""
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.reasoning_field and text.lstrip().startswith("<think>"):
            inner = text.lstrip()[len("<think>") :]
            reasoning, closed, rest = inner.partition("</think>")
            message["reasoning_content"] = reasoning.strip()
            message["content"] = rest.strip() if closed else ""
        return message

    def _hostile(
        self,
        chat: bool,
        resp: _Response,
        indices: list[int | None],
        auth: str | None = None,
        model: str | None = None,
    ) -> _Response:
        """Apply the script's no-answer behaviours, reported model name (else the adapter
        ``model`` asked for) and echoed Authorization header to a 200 reply."""
        script = self.script
        kinds = {script.behaviour(i) for i in indices if i is not None}
        reported = script.reported_model if script.reported_model is not None else model
        if reported == self.model:
            reported = None
        if resp.content_type != "application/json" or not (
            kinds & {"nochoices", "nullcontent"} or reported is not None or script.echo_auth_fields
        ):
            return resp
        data = json.loads(resp.body)
        if reported is not None:
            data["model"] = reported
        if script.echo_auth_fields:
            data["system_fingerprint"] = str(auth)
        if "nochoices" in kinds:
            data["choices"] = []
        elif "nullcontent" in kinds:
            for choice in data["choices"]:
                if chat:
                    choice["message"]["content"] = None
                else:
                    choice["text"] = None
        return _Response(200, json.dumps(data).encode(), completed=resp.completed)

    def _render(
        self,
        chat: bool,
        rid: int,
        texts: list[tuple[str, str]],
        usage: dict[str, int],
        stream: bool,
        stream_options: Any,
    ) -> _Response:
        created = int(time.time())
        if chat:
            base = {
                "id": f"chatcmpl-fake{rid}",
                "created": created,
                "model": self.model,
            }
            if self.fingerprint is not None:
                base["system_fingerprint"] = self.fingerprint
            if not stream:
                return _json_response(
                    200,
                    {
                        **base,
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": i,
                                "message": self._message(t),
                                "logprobs": None,
                                "finish_reason": f,
                            }
                            for i, (t, f) in enumerate(texts)
                        ],
                        "usage": usage,
                    },
                )
            events: list[dict[str, Any]] = []
            for i, (t, f) in enumerate(texts):
                events.append(
                    {
                        **base,
                        "object": "chat.completion.chunk",
                        "choices": [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": t},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
                events.append(
                    {
                        **base,
                        "object": "chat.completion.chunk",
                        "choices": [
                            {"index": i, "delta": {}, "logprobs": None, "finish_reason": f}
                        ],
                    }
                )
        else:
            base = {
                "id": f"cmpl-fake{rid}",
                "object": "text_completion",
                "created": created,
                "model": self.model,
            }
            if self.fingerprint is not None:
                base["system_fingerprint"] = self.fingerprint
            if not stream:
                return _json_response(
                    200,
                    {
                        **base,
                        "choices": [
                            {"index": i, "text": t, "logprobs": None, "finish_reason": f}
                            for i, (t, f) in enumerate(texts)
                        ],
                        "usage": usage,
                    },
                )
            events = [
                {**base, "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": f}]}
                for i, (t, f) in enumerate(texts)
            ]
        if isinstance(stream_options, dict) and stream_options.get("include_usage"):
            events.append({**base, "choices": [], "usage": usage})
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return _Response(200, sse.encode(), content_type="text/event-stream")


# --------------------------------------------------------------------------- subprocess / CLI


def serve_in_subprocess(
    questions_path: str | Path,
    *,
    latency: float = 0.0,
    model: str = "fake-model",
    api_key: str | None = None,
    script: Script | None = None,
    honour_n: bool = True,
    die_after: int | None = None,
    port: int = 0,
    extra_args: Iterable[str] = (),
    timeout: float = 15.0,
) -> tuple[subprocess.Popen[str], str]:
    """Start ``python tests/fakeserver.py`` and return (process, base_url).

    Why: benchmarks and "the server lives elsewhere" tests need the server
    outside the test process (its own GIL, a real crash).  The caller must
    call ``stop_subprocess(proc)`` (or POST ``/_shutdown`` and then
    ``stop_subprocess``, which also closes the stdout pipe).
    """
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--data",
        str(questions_path),
        "--latency",
        str(latency),
        "--port",
        str(port),
        "--model",
        model,
    ]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    if script is not None:
        cmd += ["--script", script.to_json()]
    if not honour_n:
        cmd.append("--no-honour-n")
    if die_after is not None:
        cmd += ["--die-after", str(die_after)]
    cmd += list(extra_args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                proc.kill()
                proc.wait()
                raise TimeoutError("fake server did not print its URL in time")
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                raise RuntimeError(f"fake server exited early with code {proc.returncode}")
            if line.startswith("FAKESERVER_URL="):
                return proc, line.strip().split("=", 1)[1]


def stop_subprocess(proc: subprocess.Popen[str], timeout: float = 5.0) -> int:
    """SIGTERM a ``serve_in_subprocess`` server (if still running), reap it, close its pipe."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    """CLI: serve until SIGTERM/SIGINT (or POST /_shutdown, or --die-after)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--data", required=True, help="GSM8K test.jsonl")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added before each answer")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--script", default=None, help="path to a Script JSON file, or inline JSON")
    ap.add_argument("--no-honour-n", action="store_true")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--die-after", type=int, default=None)
    ap.add_argument(
        "--exit-code", type=int, default=0, help="exit status after --die-after or /_kill"
    )
    ap.add_argument(
        "--exit-at-once", type=int, default=None, metavar="CODE", help="print and exit with CODE"
    )
    ap.add_argument(
        "--never-ready", action="store_true", help="print a line, then never listen (sleep)"
    )
    ap.add_argument("--extra-model", action="append", default=[], help="also listed in /models")
    ap.add_argument("--adapter", action="append", default=[], help="a LoRA adapter of --model")
    ap.add_argument("--reasoning-field", action="store_true")
    ap.add_argument("--record-file", default=None, help="append request bodies here (JSONL)")
    ap.add_argument(
        "--raw-file", default=None, help="append each request body's bytes here (JSON strings)"
    )
    ap.add_argument("--root", default=None, help="the model's root in GET /models")
    ap.add_argument("--owned-by", default="fake", help="the model's owned_by in GET /models")
    ap.add_argument("--max-model-len", type=int, default=None, help="... and its max_model_len")
    ap.add_argument("--system-fingerprint", default="fake", help="every reply's fingerprint")
    ap.add_argument("--argv-file", default=None, help="write the command line here (JSON)")
    ap.add_argument(
        "--events-file",
        default=None,
        help="append a JSON line when serving starts and when it stops (pid, port, model, "
        "the command line and the VLLM_*/FAKESERVER_* environment): a matrix's sequence",
    )
    ap.add_argument(
        "--accept-unknown",
        action="store_true",
        help="take flags meant for another server (vllm serve's) and only record them",
    )
    args, unknown = ap.parse_known_args(argv)
    if unknown and not args.accept_unknown:
        ap.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.argv_file:
        Path(args.argv_file).write_text(json.dumps(sys.argv if argv is None else argv))
    if not args.script and os.environ.get("FAKESERVER_SCRIPT"):
        args.script = os.environ["FAKESERVER_SCRIPT"]  # a config's env can script its server
    if args.die_after is None and os.environ.get("FAKESERVER_DIE_AFTER"):
        args.die_after = int(os.environ["FAKESERVER_DIE_AFTER"])  # ... or make it die

    def event(kind: str, **fields: object) -> None:
        if args.events_file:
            line = {"event": kind, "pid": os.getpid(), "time": time.time(), **fields}
            with open(args.events_file, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")

    if args.exit_at_once is not None:
        print(f"fakeserver: exiting at once with code {args.exit_at_once}", flush=True)
        return int(args.exit_at_once)
    if args.never_ready:
        print("fakeserver: loading a very large model...", flush=True)
        while True:
            time.sleep(3600)

    script = None
    if args.script:
        text = (
            args.script if args.script.lstrip().startswith("{") else Path(args.script).read_text()
        )
        script = Script.from_json(text)
    srv = FakeOpenAIServer(
        args.data,
        model=args.model,
        api_key=args.api_key,
        latency=args.latency,
        script=script,
        honour_n=not args.no_honour_n,
        record=args.record,
        host=args.host,
        port=args.port,
        die_after=args.die_after,
        extra_models=args.extra_model,
        adapters=args.adapter,
        reasoning_field=args.reasoning_field,
        record_file=args.record_file,
        raw_file=args.raw_file,
        root=args.root,
        owned_by=args.owned_by,
        max_model_len=args.max_model_len,
        fingerprint=args.system_fingerprint,
    )
    done = threading.Event()
    srv.on_kill = done.set
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    srv.start()
    print(f"FAKESERVER_URL={srv.base_url}", flush=True)
    event(
        "start",
        port=srv.port,
        model=args.model,
        argv=sys.argv if argv is None else argv,
        unknown=unknown,
        env={k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "FAKESERVER_"))},
    )
    while not done.wait(0.2):
        pass
    killed = srv.killed
    by_path = srv.stats()["requests_by_path"]
    srv.stop()
    # the completion requests it answered or refused, for a matrix's per-config counts
    event(
        "stop",
        completions=by_path.get("/v1/completions", 0) + by_path.get("/v1/chat/completions", 0),
    )
    if killed and args.exit_code:
        print(f"fakeserver: dying with exit code {args.exit_code}", flush=True)
        return int(args.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
