"""Small HTTP requests with the standard library: one deadline for the whole request, and
credentials that never follow a redirect to another origin.

The session-start check (``GET /models``) and the serve readiness poll do not need the
openai client; this is what they use instead of a bare ``urlopen``, whose two defaults
are wrong for them:

* its ``timeout`` bounds each socket operation, not the request: a server that sends one
  byte a second never times out. Here the request runs on a helper thread and the caller
  waits at most ``timeout`` seconds overall; at the deadline the sockets are shut down
  (the helper thread ends at once) and :class:`FetchTimeout` is raised.
* its redirect handler copies every header, ``Authorization`` included, to wherever the
  server points: an API key would be sent to another host. Here a redirect keeps the
  header only to the same origin (scheme, host and port), as httpx does for the openai
  client's own requests.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import ssl
import threading
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pytest_gsm8k.core.proxy import proxy_for

__all__ = ["FetchTimeout", "fetch"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class FetchTimeout(OSError):
    """No complete reply within the request's deadline."""


class _Sockets:
    """The sockets of one request, shut down together at its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._expired = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.append(sock)
            if not self._expired:
                return
        _shut(sock)  # connected after the deadline: end it at once

    def expire(self) -> None:
        with self._lock:
            self._expired = True
            socks, self._open = self._open, []
        for sock in socks:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    """End a socket another thread may be blocked reading: shutdown wakes the reader."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, sockets: _Sockets, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sockets = sockets

    def connect(self) -> None:
        super().connect()
        self._sockets.add(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, sockets: _Sockets, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sockets = sockets

    def connect(self) -> None:
        super().connect()
        self._sockets.add(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, sockets: _Sockets) -> None:
        super().__init__()
        self._sockets = sockets

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPConnection, sockets=self._sockets), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, sockets: _Sockets, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._sockets = sockets
        self._tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_HTTPSConnection, sockets=self._sockets)
        return self.do_open(connection, req, context=self._tls)


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port made explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


class _SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """Follows redirects; the Authorization header only to the same origin."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(new.full_url) != _origin(req.full_url):
            for name in list(new.headers):
                if name.lower() in ("authorization", "proxy-authorization", "cookie"):
                    new.remove_header(name)
        return new


#: the largest body :func:`fetch` reads: a model list or a readiness answer is small, and a
#: server that sends more is not read into memory
MAX_BODY = 8 << 20


class FetchTooLarge(OSError):
    """The reply's body is over :data:`MAX_BODY`."""


def fetch(
    url: str,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    context: ssl.SSLContext | None = None,
    proxies: bool = True,
) -> bytes:
    """The body of a 2xx reply to ``url`` (GET, or POST with ``data``), within ``timeout``
    seconds in all (connecting, redirects, headers and body together).

    Raises :class:`FetchTimeout` at the deadline, ``urllib.error.HTTPError`` for a
    status that is not 2xx, ``urllib.error.URLError`` or ``OSError`` when the server
    cannot be reached. The proxy is the one openai's httpx would use (``core/proxy.py``);
    ``proxies=False`` ignores ``HTTP(S)_PROXY`` (loopback servers).
    """
    sockets = _Sockets()
    handlers: list[urllib.request.BaseHandler] = [
        _HTTPHandler(sockets),
        _HTTPSHandler(sockets, context),
        _SameOriginCredentials(),
    ]
    if proxies:
        # the proxy as the openai client's httpx picks it (urllib's own NO_PROXY reading
        # knows no networks or ports); one urllib cannot use (socks) is left to urllib
        proxy = proxy_for(url, urllib.request.getproxies())
        if proxy is None:
            handlers.append(urllib.request.ProxyHandler({}))
        elif proxy.lower().startswith("http://"):
            handlers.append(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    else:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url, data=data, headers=dict(headers or {}))
    outcome: list[bytes | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            with opener.open(request, timeout=timeout) as reply:
                body = reply.read(MAX_BODY + 1)
                if len(body) > MAX_BODY:
                    raise FetchTooLarge(f"a reply over {MAX_BODY // (1 << 20)} MiB")
                outcome.append(body)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="gsm8k-fetch", daemon=True).start()
    if not done.wait(timeout):
        sockets.expire()
        raise FetchTimeout(f"no complete reply within {timeout:g} s")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result
