"""Which proxy an endpoint is reached through, read from the environment as httpx (the openai
client's HTTP library) reads it: ``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` with hosts,
wildcards, ports and networks, the most specific rule first (docs/design.md).

Why here: httpx reads the environment only for a transport of its own, and the openai
client's is the plugin's (runtime/client.py); the ``vllm`` preset sends with aiohttp
(runtime/wire.py says why), whose reading differs (no ``ALL_PROXY``, no CIDR or port in
``NO_PROXY``, ``~/.netrc``). The same endpoint is reached the same way whichever client
sends; tests/unit/core/test_proxy.py compares these rules with the installed httpx.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Rule:
    """One pattern (``scheme://host:port``, ``all`` for any scheme) and the proxy it sends
    matching URLs through (None: directly)."""

    scheme: str  # "" for any
    host: str  # "" for any; may start with "*" or "*."
    port: int | None
    network: Network | None
    proxy: str | None

    @property
    def priority(self) -> tuple[int, int, int, int, int]:
        return (
            0 if self.port is not None else 1,
            1 if self.network is not None else 0 if self.host else 2,
            self.network.num_addresses if self.network is not None else 0,
            -len(self.host) if self.network is None else 0,
            -len(self.scheme),
        )

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        if self.scheme and self.scheme != scheme:
            return False
        if self.network is not None:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                return False
            if address not in self.network:
                return False
        elif self.host and not _host_pattern(self.host).match(host):
            return False
        return self.port is None or self.port == port


def _host_pattern(host: str) -> re.Pattern[str]:
    if host.startswith("*."):
        return re.compile(rf"^.+\.{re.escape(host[2:])}$")  # subdomains only
    if host.startswith("*"):
        return re.compile(rf"^(.+\.)?{re.escape(host[1:])}$")  # the host and subdomains
    return re.compile(rf"^{re.escape(host)}$")


def _is_ip(text: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        kind(text.split("/")[0])
    except ValueError:
        return False
    return True


def _rule(pattern: str, proxy: str | None) -> Rule | None:
    """The rule a pattern states, or None for one that cannot be read (ignored, as httpx,
    curl and Go ignore them)."""
    try:
        parts = urlsplit(pattern)
        scheme = "" if parts.scheme == "all" else parts.scheme
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return None
    if port == _DEFAULT_PORTS.get(scheme):
        port = None  # a URL's default port is no port (as httpx normalises it)
    host = "" if host == "*" else host
    prefix = parts.path.removeprefix("/")
    network: Network | None = None
    if prefix and (_is_ip(host, ipaddress.IPv4Address) or _is_ip(host, ipaddress.IPv6Address)):
        shown = f"[{host}]" if ":" in host else host
        if "@" in pattern or "%" in pattern or not prefix.isdigit():
            return None
        if not pattern.endswith(f"{shown}/{prefix}"):
            return None
        try:
            network = ipaddress.ip_network(f"{host}/{prefix}", strict=False)
        except ValueError:
            return None
    return Rule(scheme=scheme, host=host, port=port, network=network, proxy=proxy)


def rules(proxies: Mapping[str, str]) -> list[Rule]:
    """The rules ``proxies`` (``urllib.request.getproxies()``) states, most specific first."""
    patterns: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        value = proxies.get(scheme)
        if value:
            patterns[f"{scheme}://"] = value if "://" in value else f"http://{value}"
    for entry in (part.strip() for part in proxies.get("no", "").split(",")):
        if entry == "*":
            return []
        if not entry:
            continue
        if "://" in entry:
            patterns[entry] = None
        elif _is_ip(entry, ipaddress.IPv4Address):
            patterns[f"all://{entry}"] = None
        elif _is_ip(entry, ipaddress.IPv6Address):
            address, slash, size = entry.partition("/")
            patterns[f"all://[{address}]/{size}" if slash else f"all://[{entry}]"] = None
        elif (
            entry.lower() == "localhost"
            or entry.startswith("[")
            or (entry.startswith("*.") and "/" not in entry)
        ):
            patterns[f"all://{entry}"] = None
        elif "/" not in entry:
            patterns[f"all://*{entry}"] = None
    found = [rule for p, v in patterns.items() if (rule := _rule(p, v)) is not None]
    return sorted(found, key=lambda rule: rule.priority)


def proxy_for(url: str, proxies: Mapping[str, str]) -> str | None:
    """The proxy URL ``url`` is reached through under ``proxies``, or None (directly)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    if port == _DEFAULT_PORTS.get(scheme):
        port = None
    for rule in rules(proxies):
        if rule.matches(scheme, host, port):
            return rule.proxy
    return None
