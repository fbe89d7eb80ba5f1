"""Which log store an agent uses, from one URL (docs/operations.md, "Log store").

``s3://bucket/prefix`` is an object store (:mod:`etcdsched.logs.s3`); a
path, or ``file:///path``, is a directory (:class:`DirLogStore`); an empty
URL is the directory the agent was given (``LOG_DIR``). The S3 module is
imported only when asked for: an agent on a directory never loads botocore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from etcdsched.logs.store import DirLogStore, LogStore
from etcdsched.model.errors import InvalidInput


def log_store_from_url(url: str, local_dir: Path, **s3_options: Any) -> LogStore:
    """The store ``url`` names. ``s3_options`` are the fields of
    :class:`~etcdsched.logs.bucket.S3Options` (``endpoint_url``, ``region``,
    ``access_key_file``, ``secret_key_file``, ``addressing_style``,
    ``max_connections``); ``None`` values are left out, and a directory
    store ignores them all (so one config can carry them whatever the URL)."""
    url = url.strip()
    if not url:
        return DirLogStore(local_dir)
    parts = urlsplit(url)
    if parts.scheme == "s3":
        return _s3_store(parts.netloc, parts.path, s3_options)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidInput("a file:// log store URL names a local path", field="log_store")
        return DirLogStore(Path(unquote(parts.path)))
    if parts.scheme and len(parts.scheme) > 1:  # (a one-letter scheme is a Windows drive)
        raise InvalidInput(
            f"log store URL scheme {parts.scheme!r}: use s3://, file:// or a path",
            field="log_store",
        )
    return DirLogStore(Path(url))


def _s3_store(bucket: str, path: str, options: dict[str, Any]) -> LogStore:
    from etcdsched.logs.bucket import S3Options
    from etcdsched.logs.s3 import S3LogStore

    if not bucket:
        raise InvalidInput("an s3:// log store URL names a bucket", field="log_store")
    given = {name: value for name, value in options.items() if value is not None}
    try:
        settings = S3Options(**given)
    except TypeError as error:
        raise InvalidInput(f"unknown S3 log store option: {error}", field="log_store") from error
    settings.credentials()  # an unreadable key file fails the agent's start, not its first job
    return S3LogStore(bucket, unquote(path), settings)
