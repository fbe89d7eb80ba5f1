"""One S3 bucket through aiobotocore: the few calls the object-store log
store makes (:mod:`etcdsched.logs.s3`), with credentials resolved once and
every client error turned into one of ours.

Kept apart from the store so the writer (:mod:`etcdsched.logs.s3_writer`)
and the reader share one client, one connection pool and one error mapping,
and so nothing else in etcdsched touches botocore.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from etcdsched.model.errors import InvalidInput, NotFound, StoreUnavailable

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

DELETE_BATCH = 1000
"""The most keys one DeleteObjects call takes (an S3 limit)."""
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


class LogStoreUnavailable(StoreUnavailable):
    """The object store did not answer, or refused a call (503 at the API,
    retried by the writer; retention logs it and moves on)."""


@dataclass(frozen=True)
class S3Options:
    """How to reach the bucket. ``None`` leaves a setting to botocore's own
    chain (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY``, a profile, an instance role): keys come from
    files so they never sit in a config file or a process listing."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_file: Path | None = None
    secret_key_file: Path | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    max_connections: int = 32
    """Connections to the store, shared by every writer and reader of an agent."""

    def __post_init__(self) -> None:
        for name in ("access_key_file", "secret_key_file"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if (self.access_key_file is None) != (self.secret_key_file is None):
            raise InvalidInput(
                "give both access_key_file and secret_key_file, or neither", field="s3"
            )
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise InvalidInput("addressing_style is auto, path or virtual", field="s3")

    def credentials(self) -> tuple[str | None, str | None]:
        """The key pair from the files (stripped of whitespace), or neither."""
        if self.access_key_file is None or self.secret_key_file is None:
            return None, None
        try:
            access = self.access_key_file.read_text().strip()
            secret = self.secret_key_file.read_text().strip()
        except OSError as error:
            raise InvalidInput(f"cannot read an S3 key file: {error}", field="s3") from error
        return access, secret


@dataclass(frozen=True)
class Listed:
    key: str
    size: int


@dataclass
class Listing:
    objects: list[Listed] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    token: str | None = None


@contextlib.contextmanager
def _mapped(operation: str, key: str) -> Iterator[None]:
    """botocore, aiohttp and socket errors as :class:`LogStoreUnavailable`;
    a missing object as :class:`NotFound`."""
    try:
        yield
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            raise NotFound(f"no object {key}", field="attempt") from error
        raise LogStoreUnavailable(f"log store {operation} {key}: {error}") from error
    except (TimeoutError, BotoCoreError, aiohttp.ClientError, OSError) as error:
        raise LogStoreUnavailable(f"log store {operation} {key}: {error}") from error


class Bucket:
    """A lazily made client for one bucket. The client is bound to the event
    loop that first uses it (aiohttp's session is), which is the agent's one
    loop; :meth:`close` releases its connections."""

    def __init__(self, name: str, options: S3Options) -> None:
        self.name = name
        self.options = options
        self._client: S3Client | None = None
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> S3Client:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await self._connect()
        return self._client

    async def _connect(self) -> S3Client:
        options = self.options
        access, secret = options.credentials()
        config = AioConfig(
            connect_timeout=5,
            read_timeout=30,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=options.max_connections,
            s3={"addressing_style": options.addressing_style},
            # S3-compatible stores differ in the checksums they accept: send
            # and check only what the operation requires
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        stack = AsyncExitStack()
        creator = get_session().create_client(
            "s3",
            endpoint_url=options.endpoint_url,
            region_name=options.region,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            config=config,
        )
        with _mapped("connect to", self.name):
            client = await stack.enter_async_context(creator)
        self._stack = stack
        return client

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def put(self, key: str, body: bytes) -> None:
        client = await self.client()
        with _mapped("put", key):
            await client.put_object(Bucket=self.name, Key=key, Body=body)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object (``end > start``)."""
        client = await self.client()
        with _mapped("get", key):
            response = await client.get_object(
                Bucket=self.name, Key=key, Range=f"bytes={start}-{end - 1}"
            )
            async with response["Body"] as body:
                data: bytes = await body.read()
        return data

    async def page(
        self,
        prefix: str,
        *,
        start_after: str = "",
        delimiter: str = "",
        max_keys: int = 1000,
        token: str | None = None,
    ) -> Listing:
        """One page of keys under ``prefix``, in key order."""
        client = await self.client()
        with _mapped("list", prefix):
            if token:
                page = await client.list_objects_v2(
                    Bucket=self.name, Prefix=prefix, Delimiter=delimiter, ContinuationToken=token
                )
            else:
                page = await client.list_objects_v2(
                    Bucket=self.name,
                    Prefix=prefix,
                    Delimiter=delimiter,
                    MaxKeys=max_keys,
                    StartAfter=start_after,
                )
        return Listing(
            [Listed(obj.get("Key", ""), obj.get("Size", 0)) for obj in page.get("Contents", [])],
            [common.get("Prefix", "") for common in page.get("CommonPrefixes", [])],
            page.get("IsTruncated", False),
            page.get("NextContinuationToken"),
        )

    async def list_all(self, prefix: str) -> list[Listed]:
        objects: list[Listed] = []
        token: str | None = None
        while True:
            page = await self.page(prefix, token=token)
            objects += page.objects
            if not page.truncated or not page.token:
                return objects
            token = page.token

    async def delete(self, keys: list[str]) -> None:
        """Remove ``keys``; keys already gone are fine (S3 says so too)."""
        client = await self.client()
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            with _mapped("delete", batch[0]):
                result = await client.delete_objects(
                    Bucket=self.name,
                    Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
                )
            errors = result.get("Errors", [])
            if errors:
                first = errors[0]
                raise LogStoreUnavailable(
                    f"log store delete {first.get('Key')}: {first.get('Message')}"
                    f" ({len(errors)} keys not deleted)"
                )
