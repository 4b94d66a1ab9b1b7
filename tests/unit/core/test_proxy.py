"""core/proxy.py against the installed httpx (the openai client's HTTP library): for every
environment and endpoint below both pick the same proxy, or both go directly."""

from __future__ import annotations

import itertools
import urllib.request
from typing import Any

import pytest

from pytest_gsm8k.core.proxy import proxy_for

httpx: Any = pytest.importorskip("httpx2", reason="the openai client's httpx2 is not installed")
from httpx2._utils import URLPattern, get_environment_proxies  # noqa: E402

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

ENVIRONMENTS: list[dict[str, str]] = [
    {},
    {"HTTP_PROXY": "http://proxy:3128"},
    {"HTTPS_PROXY": "http://sproxy:3128"},
    {"HTTP_PROXY": "proxy:3128"},  # no scheme: http:// assumed
    {"ALL_PROXY": "http://all:1080"},
    {"ALL_PROXY": "http://all:1080", "HTTP_PROXY": "http://proxy:3128"},
    {"http_proxy": "http://lower:1", "HTTP_PROXY": "http://upper:2"},  # lower case wins
    {"HTTP_PROXY": "http://u:p@proxy:3128"},
    *(
        {"HTTP_PROXY": "http://proxy:3128", "HTTPS_PROXY": "http://sproxy:3128", "NO_PROXY": no}
        for no in (
            "*",
            "localhost,*",
            "10.0.0.0/8",
            "10.1.2.3",
            "192.168.0.0/16,10.0.0.0/8",
            "::1",
            "fd00::/8",
            "[::1]",
            "localhost",
            "example.com",
            ".example.com",
            "*.example.com",
            "example.com:8000",
            "http://example.com",
            "https://*.example.com:443",
            "vllm-0.svc.cluster.local",
            "svc.cluster.local, other.org ,",
            "10.0.0.0/99",  # not a network: ignored
            "*example.com",
        )
    ),
]

ENDPOINTS = [
    "http://127.0.0.1:8000/v1",
    "http://localhost:8000/v1",
    "http://[::1]:8000/v1",
    "http://[fd00::5]/v1",
    "http://10.1.2.3:8000/v1",
    "http://10.200.0.1/v1",
    "http://192.168.1.20:80/v1",
    "https://example.com/v1",
    "http://example.com:8000/v1",
    "http://example.com:8001/v1",
    "https://api.example.com/v1",
    "http://notexample.com/v1",
    "http://vllm-0.svc.cluster.local:8000/v1",
    "http://other.org/v1",
    "https://EXAMPLE.com/v1",
]


def httpx_proxy(url: str) -> str | None:
    """What httpx picks for ``url`` from the environment: its mounts, most specific first."""
    mounts = {URLPattern(pattern): proxy for pattern, proxy in get_environment_proxies().items()}
    for pattern, proxy in sorted(mounts.items()):
        if pattern.matches(httpx.URL(url)):
            return proxy
    return None


@pytest.mark.parametrize(
    "env",
    ENVIRONMENTS,
    ids=[",".join(f"{k}={v}" for k, v in e.items()) or "none" for e in ENVIRONMENTS],
)
def test_the_proxy_is_the_one_httpx_picks(env: dict[str, str], monkeypatch: Any) -> None:
    for name in itertools.chain(PROXY_VARIABLES, (v.upper() for v in PROXY_VARIABLES)):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proxies = urllib.request.getproxies()
    for url in ENDPOINTS:
        assert proxy_for(url, proxies) == httpx_proxy(url), (url, env)


def test_the_comparison_sees_proxies_at_all(monkeypatch: Any) -> None:
    """The table is not vacuous: some endpoints go through a proxy, some directly."""
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8")
    proxies = urllib.request.getproxies()
    assert proxy_for("http://10.200.0.1/v1", proxies) is None
    assert proxy_for("http://example.com/v1", proxies) == "http://proxy:3128"
