"""Quoting what others wrote before it goes into an operator's log.

Job ids, argv, paths and validation messages come from tenants. Logged raw,
a newline forges a log line, a NUL or an escape sequence garbles a
terminal, and a 400 KiB argv buries everything around it. :func:`quoted`
makes any such value one short, escaped, visibly quoted token.
"""

from __future__ import annotations

LOG_LIMIT = 200
"""Characters of one tenant-supplied value kept in a log line."""


def quoted(value: object, limit: int = LOG_LIMIT) -> str:
    """``value`` (its ``str``) as a Python string literal: control, format
    and non-printable characters escaped (``\\n``, ``\\x00``, ``\\u202e``),
    cut to ``limit`` characters with how many more there were. Cut before
    escaping, so a huge value costs no more than a small one."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}...(+{len(text) - limit} chars)"
