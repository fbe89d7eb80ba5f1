"""Where a webhook may point (docs/webhooks.md, "Safety"): pure checks the
API runs when a webhook is written and the sender runs before each POST.

A webhook URL is chosen by a tenant's editor, and the scheduler sends from
inside the cluster's network: without these checks a webhook is a way to
make the scheduler request the cloud's metadata service or an internal
admin port. So: ``https://`` only unless an admin allowed plain HTTP, and
no loopback, private, link-local (169.254.169.254 among them), multicast,
reserved or unspecified address unless an admin allowed private targets.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048


def url_refusal(url: str, *, allow_http: bool) -> str | None:
    """Why ``url`` cannot be a webhook's, or None."""
    if len(url) > MAX_URL_LENGTH:
        return f"the URL is longer than {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("https", "http"):
        return "the URL must start with https://"
    if parts.scheme == "http" and not allow_http:
        return "only https:// URLs, unless an admin allows http:// for this webhook (allow_http)"
    if not parts.hostname:
        return "the URL has no host"
    if parts.username or parts.password:
        return "the URL must not carry credentials (the body is signed instead)"
    return None


def address_refusal(address: str, *, allow_private: bool) -> str | None:
    """Why the sender must not connect to ``address`` (an IP), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow_private:
        return None
    for refused, what in (
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local (cloud metadata)"),
        (ip.is_private, "private"),
        (ip.is_multicast, "multicast"),
        (ip.is_reserved, "reserved"),
        (ip.is_unspecified, "unspecified"),
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
