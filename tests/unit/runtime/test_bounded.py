"""Bounded decoding of replies: compressed bodies are read in pieces up to a limit, and what
cannot be bounded is refused."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator

import pytest

from pytest_gsm8k.core.scrub import Scrubber
from pytest_gsm8k.runtime import client
from pytest_gsm8k.runtime.client import PIECE, Breaker, Refused, bounded_body, reply_coding


def decoded(coding: str, chunks: list[bytes]) -> list[bytes]:
    """The pieces :func:`bounded_body` makes of ``chunks`` as they arrive."""

    async def read() -> list[bytes]:
        async def arriving() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return [piece async for piece in bounded_body(coding, arriving())]

    return asyncio.run(read())


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw deflate", ""])
def test_the_bounded_decoder_reads_what_it_asked_for_in_pieces(encoding: str) -> None:
    data = b"".join(b"%d answer, " % i for i in range(300_000))  # about 3.5 MB
    wbits = {"gzip": 31, "deflate": 15, "raw deflate": -15, "": 0}[encoding]
    packed = data
    if wbits:
        packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
        packed = packer.compress(data) + packer.flush()
    chunks = [packed[i : i + 65536] for i in range(0, len(packed), 65536)]
    pieces = decoded(encoding.replace("raw ", ""), chunks)
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= PIECE


def test_the_bounded_decoder_refuses_what_it_cannot_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    def coding(encodings: list[str]) -> str:  # a 200 reply with these Content-Encodings
        return reply_coding(Breaker(), 200, {}, encodings)

    with pytest.raises(Refused, match="encoded as 'br'"):
        coding(["br"])
    with pytest.raises(Refused, match="encoded 2 times"):
        coding(["gzip", "deflate"])
    with pytest.raises(Refused, match="encoded 2 times"):
        coding(["gzip, deflate"])  # one header, two codings
    assert coding(["identity", " GZIP "]) == "gzip"
    with pytest.raises(Refused, match="not valid compressed data"):
        decoded("gzip", [b"this is not gzip"])

    monkeypatch.setattr(client, "MAX_REPLY_BYTES", 10)
    assert decoded("", [b"x" * 10]) == [b"x" * 10]
    with pytest.raises(Refused, match=r"over .* MiB decoded"):
        decoded("", [b"x" * 10, b"x"])


KEY = "sk-" + "k" * 40
#: a server's Content-Encoding of 5,000 characters, sending the key back where a cut falls
LONG = "z" * 150 + KEY + "z" * 5000


@pytest.mark.parametrize("encodings", [[LONG], ["gzip", LONG], ["gzip"] * 3000])
def test_a_coding_the_refusal_quotes_is_cut_at_the_messages_end(encodings: list[str]) -> None:
    """Rule: outside text a message quotes is bounded (first_line: 200 characters), cut at the
    message's end, where the scrubber hides a key the cut falls inside (a server's
    Content-Encoding was printed and stored whole, for every item)."""
    with pytest.raises(Refused) as info:
        reply_coding(Breaker(), 200, {}, encodings)
    message = str(info.value)
    assert message.startswith("the endpoint's reply is encoded "), message
    assert len(message) <= 200, len(message)
    assert KEY[:6] not in Scrubber(KEY, None, ()).text(message, cut=True)


def test_what_follows_the_end_of_compressed_data_is_read_and_ignored() -> None:
    """The body is read to its end (the connection stays reusable), its trailing bytes unused."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    packed = packer.compress(b"answer") + packer.flush()
    read: list[bytes] = []

    async def arriving() -> AsyncIterator[bytes]:
        for chunk in (packed, b"trailing garbage", b"more"):
            read.append(chunk)
            yield chunk

    async def pieces() -> list[bytes]:
        return [piece async for piece in bounded_body("gzip", arriving())]

    assert b"".join(asyncio.run(pieces())) == b"answer"
    assert len(read) == 3


@pytest.mark.parametrize("wbits", [31, 15], ids=["gzip", "deflate"])
def test_a_body_broken_past_its_first_piece_is_refused_not_a_zlib_error(wbits: int) -> None:
    """Rule: a reply that cannot be read is one refusal line; the error came after the
    first decoded MiB of one network read and escaped as zlib.error."""
    data = b"".join(b"%d answer, " % i for i in range(300_000))
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = bytearray(packer.compress(data) + packer.flush())
    packed[len(packed) * 3 // 4] ^= 0xFF
    with pytest.raises(Refused, match="not valid compressed data"):
        decoded("gzip" if wbits == 31 else "deflate", [bytes(packed)])
