"""Which proxy an endpoint is reached through, read from the environment as httpx (the openai
client's HTTP library) reads it: ``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` with wildcards,
ports and networks, where the vllm preset's aiohttp differs; tests/unit/core/test_proxy.py
compares these rules with the installed httpx."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Rule:
    """One pattern (``scheme://host:port``; scheme "" for any, host "" for any or starting
    with ``*``) and the proxy it sends matching URLs through (None: directly)."""

    scheme: str
    host: str
    port: int | None
    network: Network | None
    proxy: str | None

    @property
    def priority(self) -> tuple[int, int, int, int, int]:
        network = self.network
        return (
            0 if self.port is not None else 1,
            1 if network is not None else 0 if self.host else 2,
            network.num_addresses if network is not None else 0,
            -len(self.host) if network is None else 0,
            -len(self.scheme),
        )

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        if (self.scheme and self.scheme != scheme) or self.port not in (None, port):
            return False
        if self.network is not None:
            return (ip := _ip(host)) is not None and ip in self.network
        if self.host.startswith("*."):  # subdomains only
            return re.fullmatch(rf".+\.{re.escape(self.host[2:])}", host) is not None
        if self.host.startswith("*"):  # the host and its subdomains
            return re.fullmatch(rf"(.+\.)?{re.escape(self.host[1:])}", host) is not None
        return not self.host or self.host == host


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("/")[0])
    except ValueError:
        return None


def _parts(url: str) -> tuple[str, str, int | None, str]:
    """Scheme, host, port (None for the scheme's default, as httpx normalises it) and path."""
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    port = None if parts.port == {"http": 80, "https": 443}.get(scheme) else parts.port
    return scheme, host, port, parts.path


def _rule(pattern: str, proxy: str | None) -> Rule | None:
    """The rule a pattern states, or None for one that cannot be read (ignored, as httpx,
    curl and Go ignore them)."""
    try:
        scheme, host, port, path = _parts(pattern)
    except ValueError:
        return None
    scheme, host = "" if scheme == "all" else scheme, "" if host == "*" else host
    prefix = path.removeprefix("/")
    network: Network | None = None
    if prefix and _ip(host):
        shown = f"[{host}]" if ":" in host else host
        plain = "@" not in pattern and "%" not in pattern and prefix.isdigit()
        if not plain or not pattern.endswith(f"{shown}/{prefix}"):
            return None
        try:
            network = ipaddress.ip_network(f"{host}/{prefix}", strict=False)
        except ValueError:
            return None
    return Rule(scheme=scheme, host=host, port=port, network=network, proxy=proxy)


def proxy_for(url: str, proxies: Mapping[str, str]) -> str | None:
    """The proxy URL ``url`` is reached through under ``proxies``
    (``urllib.request.getproxies()``), or None (directly): the most specific rule decides."""
    scheme, host, port, _ = _parts(url)  # first: a bad URL is a ValueError whatever NO_PROXY says
    patterns: dict[str, str | None] = {}
    for kind in ("http", "https", "all"):
        if value := proxies.get(kind):
            patterns[f"{kind}://"] = value if "://" in value else f"http://{value}"
    for entry in (part.strip() for part in proxies.get("no", "").split(",")):
        if entry == "*":
            return None
        ip, star = _ip(entry), entry.startswith("*.") and "/" not in entry
        if not entry:
            continue
        if "://" in entry:
            patterns[entry] = None
        elif isinstance(ip, ipaddress.IPv6Address):
            address, slash, size = entry.partition("/")
            patterns[f"all://[{address}]/{size}" if slash else f"all://[{entry}]"] = None
        elif ip or star or entry.lower() == "localhost" or entry.startswith("["):
            patterns[f"all://{entry}"] = None
        elif "/" not in entry:
            patterns[f"all://*{entry}"] = None
    found = [rule for p, v in patterns.items() if (rule := _rule(p, v)) is not None]
    found.sort(key=lambda rule: rule.priority)
    return next((r.proxy for r in found if r.matches(scheme, host, port)), None)
