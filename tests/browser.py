"""Headless Chromium over the DevTools protocol, standard library only.

Why not a driver library: the suite installs nothing beyond Debian's ``chromium``. CDP speaks
JSON over a websocket, and the client side of a websocket is small: an HTTP upgrade, masked
text frames out, unmasked (possibly fragmented) frames in. Chromium writes the port it chose
(``--remote-debugging-port=0``) to ``DevToolsActivePort`` in its profile directory.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--disable-crash-reporter",
    "--disable-breakpad",
    "--remote-debugging-port=0",
]


def chromium() -> str | None:
    return shutil.which("chromium")


#: a test that drives headless Chromium: skipped, saying why, where it is not installed
NEEDS_CHROMIUM = pytest.mark.skipif(
    chromium() is None, reason="chromium not found on PATH (apt-get install chromium)"
)


class Browser:
    """One Chromium with one page; ``events`` keeps every CDP event received."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        exe = chromium()
        assert exe, "chromium not found"
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a reused profile's file names a dead browser's port
        self.proc = subprocess.Popen(
            [
                exe,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.events: list[dict[str, Any]] = []
        self._id = 0
        self.sock: socket.socket | None = None
        try:
            self._connect(port_file)
        except BaseException:
            self.close()
            raise

    def _connect(self, port_file: Path) -> None:
        def written() -> bool:
            return port_file.is_file() and port_file.read_text().count("\n") >= 1

        def ended() -> bool:
            return written() or self.proc.poll() is not None

        if not (wait_until(ended, 60, interval=0.05) and written()):
            raise RuntimeError("chromium did not open its DevTools port")
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        path = page["webSocketDebuggerUrl"].split(str(port), 1)[1]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket"
                f"\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head

    # -- websocket frames ---------------------------------------------------------------------

    def _socket(self) -> socket.socket:
        if self.sock is None:
            raise ConnectionError("DevTools connection not open")
        return self.sock

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._socket().recv(n - len(buf))
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            buf += chunk
        return bytes(buf)

    def _send_frame(self, payload: bytes, opcode: int = 1) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        stream = (mask * (n // 4 + 1))[:n]
        body = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")
        self._socket().sendall(head + mask + body)

    def _recv_message(self) -> dict[str, Any]:
        data = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            payload = self._recv_exact(n)
            opcode = b0 & 0x0F
            if opcode == 9:  # ping
                self._send_frame(payload, opcode=10)
                continue
            if opcode == 8:
                raise ConnectionError("DevTools connection closed")
            data += payload
            if b0 & 0x80:
                return dict(json.loads(data))

    # -- CDP ----------------------------------------------------------------------------------

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a CDP method and wait for its result (events that arrive meanwhile are kept)."""
        self._id += 1
        self._send_frame(json.dumps({"id": self._id, "method": method, "params": params}).encode())
        while True:
            msg = self._recv_message()
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result") or {})
            self.events.append(msg)

    def wait_event(self, method: str) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            msg = self._recv_message()
            self.events.append(msg)
            if msg.get("method") == method:
                return msg

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited); page exceptions raise."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Enable the event domains first, so nothing the page logs on load is missed."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries (e.g. CSP reports)."""
        out = []
        for e in self.events:
            params = e.get("params") or {}
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails"))[:500])
            elif e.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
                out.append(json.dumps(params.get("args"))[:500])
            elif e.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"].get("text", "")[:500])
        return out

    def requested_urls(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(png)
        return png

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
