"""Where a webhook may point (docs/webhooks.md, "Safety"): pure checks the
API runs when a webhook is written and the sender runs before each POST.

A webhook URL is chosen by a tenant's editor, and the scheduler sends from
inside the cluster's network: without these checks a webhook is a way to
make the scheduler request the cloud's metadata service or an internal
admin port. So: ``https://`` only unless an admin allowed plain HTTP; only
public (globally routable) addresses unless an admin allowed private
targets; and never a link-local or cloud metadata address, allowance or
not. An IPv6 address that carries an IPv4 one (mapped, 6to4, Teredo,
NAT64) is judged by the IPv4 address too, and a host written as a number
in any form but the standard dotted quad is refused: the HTTP client and
the C resolver read ``127.1``, ``2130706433`` or ``0x7f.1`` as loopback.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from yarl import URL

MAX_URL_LENGTH = 2048
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NEVER_ALLOWED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",  # link-local; 169.254.169.254 is AWS's, GCP's and Azure's metadata
        "fe80::/10",  # link-local
        "fd00:ec2::254/128",  # AWS metadata over IPv6
        "100.100.100.200/32",  # Alibaba Cloud metadata
    )
)
"""Refused even with ``allow_private``: an internal receiver is a reason to
allow private targets, the metadata service never is."""

NOT_PUBLIC = tuple(
    ipaddress.ip_network(n)
    for n in (
        "100.64.0.0/10",  # shared (carrier-grade NAT) space
        "192.0.0.0/24",  # IETF protocol assignments
        "192.88.99.0/24",  # deprecated 6to4 relay anycast
        "fec0::/10",  # deprecated site-local
        "64:ff9b:1::/48",  # local-use NAT64
    )
)
"""Not global, though this Python's ``ipaddress`` may not say so for all."""

NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NUMBER_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


def url_refusal(url: str, *, allow_http: bool) -> str | None:
    """Why ``url`` cannot be a webhook's, or None."""
    if len(url) > MAX_URL_LENGTH:
        return f"the URL is longer than {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
        parsed = URL(url)
        parsed.host  # noqa: B018 (raises on a name IDNA cannot decode, like xn--)
        host = parsed.raw_host or ""  # what the HTTP client will connect to
    except ValueError as exc:  # (yarl's UnicodeError for a bad IDNA name among them)
        return f"not a URL: {exc}"
    if parts.scheme not in ("https", "http"):
        return "the URL must start with https://"
    if parts.scheme == "http" and not allow_http:
        return "only https:// URLs, unless an admin allows http:// for this webhook (allow_http)"
    if not parts.hostname or not host:
        return "the URL has no host"
    if parts.username or parts.password:
        return "the URL must not carry credentials (the body is signed instead)"
    if _looks_numeric(host) and literal_address(host) is None:
        return (
            f"the host {host[:64]!r} is a number but not an IP address in standard form"
            " (a dotted quad like 192.0.2.1, or an IPv6 address in brackets)"
        )
    return None


def target_refusal(url: str, *, allow_http: bool, allow_private: bool) -> str | None:
    """Why ``url`` cannot be a webhook's with these allowances, or None: the
    URL's own checks, then its host's address if the host is an IP literal
    (the HTTP client connects to those without resolving them)."""
    why = url_refusal(url, allow_http=allow_http)
    if why is None:
        literal = literal_address(URL(url).raw_host or "")
        if literal is not None:
            why = address_refusal(literal, allow_private=allow_private)
    return why


def _looks_numeric(host: str) -> bool:
    """Whether a client or resolver may read ``host`` as an address: aiohttp
    takes anything of digits and dots (or with a ``:``) for an IP literal,
    and a name whose last label is a number (``0x7f.1``) is one to the C
    resolver and to browsers (WHATWG's "ends in a number")."""
    if ":" in host or host.replace(".", "").isdigit():
        return True
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return _NUMBER_LABEL.fullmatch(last) is not None


def address_refusal(address: str, *, allow_private: bool) -> str | None:
    """Why the sender must not connect to ``address`` (an IP), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    for meaning in _meanings(ip):
        why = _refusal(meaning, allow_private)
        if why is not None:
            return why if meaning == ip else f"{ip} stands for {meaning}: {why}"
    return None


def _meanings(ip: IPAddress) -> list[IPAddress]:
    """``ip`` and each IPv4 address it stands for: an IPv4-mapped address is
    only its IPv4 one; 6to4, Teredo (server and client) and NAT64 addresses
    are routed to theirs by a relay or gateway, so both count."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    found: list[IPAddress] = [ip]
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _refusal(ip: IPAddress, allow_private: bool) -> str | None:
    if any(ip in net for net in NEVER_ALLOWED):
        return f"{ip} is a link-local or cloud metadata address (never allowed)"
    if allow_private:
        return None
    for refused, what in (
        (ip.is_loopback, "loopback"),
        (ip.is_private, "private"),
        (ip.is_multicast, "multicast"),
        (ip.is_reserved, "reserved"),
        (ip.is_unspecified, "unspecified"),
        (not ip.is_global or any(ip in net for net in NOT_PUBLIC), "non-public"),
    ):
        if refused:
            return (
                f"{ip} is a {what} address; an admin can allow private targets for"
                " this webhook (allow_private)"
            )
    return None


def literal_address(host: str) -> str | None:
    """``host`` if it is an IP literal (``[::1]`` brackets removed), else None."""
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return None
    return bare


def redacted_url(url: str) -> str:
    """``url`` without its path and query: what a viewer, a log line or an
    error may show. Some receivers (Slack's incoming webhooks among them)
    carry their credential in the path."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an invalid URL)"
    if ":" in host:
        host = f"[{host}]"
    rest = "/..." if (parts.path not in ("", "/") or parts.query) else "/"
    return f"{parts.scheme}://{host}{port}{rest}"
