"""Reading a request body before any model sees it: its size, its media
type, and that it is JSON with no key given twice.

A duplicate key is refused rather than resolved: parsers disagree on which
of two values wins (the last, the first, an error), so a proxy, a policy
check or an audit log in front of us could have read another request than
the one we would carry out. The body is then validated from the same bytes
by pydantic, in its JSON mode, so types are as strict as the models say.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from etcdsched.api.errors import MalformedRequest, UnsupportedMediaType
from etcdsched.model.errors import InvalidInput, PayloadTooLarge

JSON_MEDIA_TYPE = "application/json"


async def read_json(request: web.Request, max_bytes: int) -> bytes:
    """The body's bytes, checked to be one JSON document without a
    duplicate key; ``b""`` for an empty (or blank) body, which needs no
    ``Content-Type``. 413 over ``max_bytes``, 415 for a body of another
    media type, 400 for what is not JSON, 422 for a duplicate key."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"request body is over {max_bytes} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body is over {max_bytes} bytes") from None
    if not raw.strip():
        return b""
    _json_media_type(request)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRequest("malformed JSON: the body is not UTF-8") from None
    try:
        document, repeated = _parse(text)
    except RecursionError:
        raise MalformedRequest("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise MalformedRequest(f"malformed JSON: {exc}") from None
    if repeated:
        duplicate = _first_duplicate(document)
        raise InvalidInput(f"{duplicate}: the key is given more than once", field=duplicate)
    return raw


def _json_media_type(request: web.Request) -> None:
    """``application/json``, with any parameters, but a ``charset`` must
    be UTF-8 (RFC 8259: JSON between systems is UTF-8)."""
    header = request.headers.get("Content-Type")
    mime, _, params = (header or "").partition(";")
    charset = ""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    if mime.strip().lower() != JSON_MEDIA_TYPE or charset not in ("", "utf-8", "utf8"):
        got = repr(header[:100]) if header is not None else "none"
        raise UnsupportedMediaType(
            f"a request body must be {JSON_MEDIA_TYPE} (UTF-8); Content-Type was {got}",
            field="Content-Type",
        )


class _Duplicated(dict[str, Any]):
    """An object that named ``key`` twice (what the hook returns then)."""

    key: str = ""


def _parse(text: str) -> tuple[Any, bool]:
    """The document, and whether some object in it repeats a key. The hook
    sees an object before knowing where it is (inner objects come first),
    so it only marks it; the path is looked for afterwards, when needed."""
    repeated = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        repeated = True
        marked, seen = _Duplicated(obj), set()
        for key, _ in pairs:
            if key in seen:
                marked.key = key
                break
            seen.add(key)
        return marked

    return json.loads(text, object_pairs_hook=hook), repeated


def _first_duplicate(document: Any) -> str:
    """The path (``spec.trigger.kind``, ``items[3].id``) of the first
    repeated key in document order. A stack, not recursion: the document
    may be as deep as the parser allowed."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Duplicated):
            return f"{path}.{value.key}" if path else value.key
        if isinstance(value, dict):
            children = [(f"{path}.{k}" if path else k, v) for k, v in value.items()]
        elif isinstance(value, list):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(children))
    raise AssertionError("a repeated key was seen but not found")
