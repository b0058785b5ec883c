"""Addresses lorarl listens on or connects to: what makes a string the base URL of an HTTP server, and
which hosts are this machine's loopback (a server there needs no key, one reachable from other machines
does). Config validation (`[inference]`, `[serve]`) and the servers share these rules."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def url_problem(url: str) -> str | None:
    """What makes `url` no base URL of an HTTP server, or None."""
    if not url.isprintable() or any(c.isspace() for c in url):
        return "has spaces or unprintable characters"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "does not start with http:// or https://"
    if not parts.hostname:
        return "names no host"
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number in 0..65535)
    except ValueError:
        return "has a port that is not a number from 1 to 65535"
    if parts.port == 0:
        return "has port 0"
    return None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
