"""An HTTP reply's body decoded here, in bounded pieces, and refused past a limit: a reply is
held whole in memory and HTTP libraries decode without one (a gzip bomb: 200 KB that inflates
to 200 MB). An encoding not asked for is refused: it could not be bounded.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

#: the most one decoding step produces (zlib's output bound per call)
PIECE = 1 << 20
#: what the transport asks the server for; a reply may use any of these or none
ACCEPTED = ("gzip", "deflate")


class Refused(Exception):
    """The reply cannot be read within the bound (too large, or an encoding not asked for)."""


class Decoder:
    """Incremental decoding of one body: identity, gzip or deflate, in bounded pieces."""

    def __init__(self, encoding: str) -> None:
        wbits = {"gzip": 31, "x-gzip": 31, "deflate": 15, "": 0, "identity": 0}.get(encoding)
        if wbits is None:
            raise Refused(f"the endpoint's reply is encoded as {encoding!r}, not as asked for")
        self.encoding, self._first = encoding, True
        self._inflater = zlib.decompressobj(wbits) if wbits else None

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded pieces of ``data`` (each at most :data:`PIECE` bytes)."""
        if (inflater := self._inflater) is None:
            yield data
            return
        first, self._first = self._first, False
        try:
            try:
                out = inflater.decompress(data, PIECE)
            except zlib.error:
                if not (first and self.encoding == "deflate"):
                    raise
                # "deflate" without the zlib wrapper, as some servers send it
                inflater = self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                out = inflater.decompress(data, PIECE)
            while out:
                yield out
                if inflater.eof:
                    return  # anything after the end of the compressed data is ignored
                out = inflater.decompress(inflater.unconsumed_tail, PIECE)
        except zlib.error:
            raise Refused("the endpoint's reply is not valid compressed data") from None

    def finish(self) -> bytes:
        """What the decoder still holds once the body ended (bounded: the input is consumed)."""
        return b"" if self._inflater is None else self._inflater.flush()


def mib(size: int) -> str:
    """``size`` bytes in MiB for a message (``32 MiB``)."""
    return f"{size / (1 << 20):g} MiB"


def encoding_of(values: list[str]) -> str:
    """The one content coding of a reply (its Content-Encoding values), or Refused."""
    codings = [v.strip().lower() for v in values if v.strip().lower() not in ("", "identity")]
    if len(codings) > 1:
        raise Refused(
            f"the endpoint's reply is encoded {len(codings)} times ({', '.join(codings)}); "
            "one encoding was asked for"
        )
    return codings[0] if codings else ""


class Counter:
    """Adds up decoded bytes; Refused once they pass ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0

    def add(self, piece: bytes) -> bytes:
        self.total += len(piece)
        if self.total > self.limit:
            raise Refused(
                f"the endpoint's reply is over {mib(self.limit)} decoded, the most one "
                "problem's answer may take; refused, the rest unread"
            )
        return piece
