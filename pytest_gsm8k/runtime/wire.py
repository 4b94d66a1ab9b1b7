"""The ``vllm`` preset's client: its exact request bytes over aiohttp, as vLLM's script sends them.

For speed: through the openai client the preset took 1.25-1.33x vLLM's script's wall time,
through aiohttp 1.05x, and a plain ``httpx.AsyncClient`` costs 4x aiohttp's CPU per request
(benchmarks/README.md, "One HTTP stack?"). It keeps what the openai client gave: its retry
policy (core/retry.py), its failures' wording (:mod:`.failures`), the breaker, the reply bound,
httpx's reading of the proxy environment (no ``~/.netrc``); ``Authorization`` only with a key.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from pytest_gsm8k.core.retry import retry_delay, should_retry
from pytest_gsm8k.runtime.client import ACCEPTED, OpenAIClient, Refused, bounded_body, reply_coding
from pytest_gsm8k.runtime.failures import Said, WireFailure, bad_reply


class WireClient(OpenAIClient):
    """:class:`OpenAIClient`'s construction, endpoint, cache identity and breaker; only the
    sending differs. A request without wire bytes goes as its JSON body."""

    via_aiohttp = True

    def _build(self) -> Any:
        """The aiohttp session (made on the engine's loop: aiohttp binds a session to it)."""
        import aiohttp

        headers = {"Content-Type": "application/json", "Accept-Encoding": ", ".join(ACCEPTED)}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._concurrency),
            headers=headers,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self._timeout),
            # not trust_env: it reads ~/.netrc and the proxy variables again for every request
            # (a thread each), and a netrc entry for the host makes every request with a key
            # fail (Basic auth beside Bearer)
            trust_env=False,
        )

    async def _post(self, client: Any, path: str, payload: bytes) -> Any:
        """One request, retried as the openai client would retry it."""
        import asyncio

        for retries in range(self._max_retries):
            try:
                return await self._once(client, self.endpoint + path, payload)
            except WireFailure as exc:
                status, headers = exc.status_code, exc.headers
                if status is not None and not should_retry(status, headers, time.time()):
                    raise
                await asyncio.sleep(retry_delay(retries, headers, time.time(), random.random))
        return await self._once(client, self.endpoint + path, payload)  # the last attempt

    async def _once(self, session: Any, url: str, payload: bytes) -> Any:
        """One attempt: the decoded JSON of a 2xx reply, or a :class:`WireFailure`."""
        import aiohttp

        try:
            # a proxy's credentials in its URL: aiohttp sends them as Proxy-Authorization
            async with session.post(url, data=payload, proxy=self._proxy) as response:
                status, headers = response.status, response.headers
                try:
                    encodings = headers.getall("Content-Encoding", [])
                    coding = reply_coding(self.breaker, status, headers, encodings)
                    chunks = response.content.iter_chunked(1 << 16)
                    raw = b"".join([piece async for piece in bounded_body(coding, chunks)])
                except Refused as exc:
                    response.close()
                    raise Said(str(exc)) from None
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError too
            self.breaker.failure(exc)
            raise WireFailure(url, None, "the request timed out", timed_out=True) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            self.breaker.failure(exc)  # a payload error: a reply cut off mid-body
            raise WireFailure(url, None, str(exc) or type(exc).__name__) from exc
        as_json = status >= 400 or headers.get("Content-Type", "*").split(";")[0].endswith("json")
        try:  # a 2xx is JSON when labelled so, as the openai client and vLLM's script read it
            data = json.loads(raw) if as_json else raw.decode("utf-8", "replace")  # else: text
        except ValueError:
            data = raw.decode("utf-8", "replace").strip()
            if status < 400:
                raise bad_reply("is not JSON", data) from None
        if status >= 400:
            raise WireFailure(url, status, data, dict(headers))
        return data
