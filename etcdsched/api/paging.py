"""Cursor pagination over a key range with a server-side filter.

A cursor is opaque to clients (:func:`seal_cursor`) and is the last key
read *within the listing's own prefix*: a tenant's listing reads only its
tenant's keys, so its cursors never carry another tenant's.

Filters the store cannot apply (tenant, state, labels) are applied to each
page read. To bound the work of one request a page may come back with fewer
items than asked for — even none — and a cursor: clients keep going until
``next_cursor`` is null.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TypeVar

from etcdsched.model.errors import InvalidInput
from etcdsched.store.kv import KV, Store

T = TypeVar("T")
SCAN_FACTOR = 10


async def filtered_range(
    store: Store,
    start: str,
    end: str,
    *,
    limit: int,
    accept: Callable[[KV], T | None],
    descending: bool = False,
) -> tuple[list[T], str | None]:
    """Up to ``limit`` accepted items of ``[start, end)`` and the key to
    continue after (``None`` when the range is exhausted). Reads at most
    about ``SCAN_FACTOR * limit`` keys."""
    items: list[T] = []
    scanned = 0
    while True:
        page = await store.range(start, end, limit=limit, descending=descending)
        for i, kv in enumerate(page.kvs):
            item = accept(kv)
            if item is None:
                continue
            items.append(item)
            if len(items) == limit:
                more = page.more or i < len(page.kvs) - 1
                return items, (kv.key if more else None)
        scanned += len(page.kvs)
        if not page.more or not page.kvs:
            return items, None
        last = page.kvs[-1].key
        if scanned >= SCAN_FACTOR * limit:
            return items, last
        if descending:
            end = last
        else:
            start = last + "\0"


def seal_cursor(key: str, prefix: str) -> str:
    """The cursor that continues after ``key`` in a listing of ``prefix``."""
    return base64.urlsafe_b64encode(key.removeprefix(prefix).encode()).decode().rstrip("=")


def open_cursor(cursor: str, prefix: str) -> str:
    """The key a cursor of this listing continues after, or a 422."""
    try:
        rest = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("not a cursor of this listing", field="cursor") from None
    if not rest or "\0" in rest:
        raise InvalidInput("not a cursor of this listing", field="cursor")
    return prefix + rest


def after_cursor(start: str, end: str, cursor_key: str | None, descending: bool) -> tuple[str, str]:
    """Narrow ``[start, end)`` to the keys after ``cursor_key`` in scan order."""
    if cursor_key is None:
        return start, end
    if descending:
        return start, min(end, cursor_key)
    return max(start, cursor_key + "\0"), end
