"""Lease renewal over a blocking gRPC channel, for a session's renewal thread.

The renewal thread (ADR 0005) used to run a second asyncio loop with a
second ``grpc.aio`` connection. ``grpc.aio`` has one completion poller per
process, and every loop that has made a call listens on it; whichever loop
wakes first handles *all* completed events and hands those of other loops
over with ``call_soon_threadsafe``. The idle renewal loop nearly always
woke first, so almost every RPC and watch message of the busy main loop
took a detour through the renewal thread and a second wake-up of the main
loop. A blocking channel has its own completion queue per call and never
touches the asyncio poller (ADR 0005, addendum).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from etcd3aio._protobuf import AuthenticateRequest, AuthStub, LeaseKeepAliveRequest, LeaseStub
from etcd3aio.connections import ConnectionManager

from etcdsched.model.errors import StoreUnavailable
from etcdsched.store.etcd import EtcdOptions


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def blocking_channel(options: EtcdOptions) -> grpc.Channel:
    """A channel like the asyncio store's (same target, balancing,
    keep-alives and TLS), but blocking."""
    manager = ConnectionManager(list(options.endpoints))
    settings = list(manager.grpc_options)
    if options.ca_cert is None:
        return grpc.insecure_channel(manager.target, options=settings)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(options.ca_cert),
        private_key=_read(options.key),
        certificate_chain=_read(options.cert),
    )
    if options.tls_server_name is not None:
        settings.append(("grpc.ssl_target_name_override", options.tls_server_name))
    return grpc.secure_channel(manager.target, credentials, options=settings)


class BlockingRenewer:
    """Renews leases, one short-lived keep-alive stream per renewal.

    Its methods are ``async`` only to fit the session's renewal loop, which
    runs alone on the renewal thread's event loop: they block that loop
    for at most ``timeout``, which nothing else is waiting on."""

    def __init__(self, options: EtcdOptions) -> None:
        self._options = options
        self._channel = blocking_channel(options)
        self._lease = LeaseStub(self._channel)
        self._auth = AuthStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = ()

    async def keepalive_once(self, lease_id: int, timeout: float) -> int:
        """The remaining TTL after one renewal (0 or less: the lease is gone)."""
        try:
            return self._renew(lease_id, timeout)
        except grpc.RpcError as exc:
            if _code(exc) is not grpc.StatusCode.UNAUTHENTICATED or not self._options.username:
                raise StoreUnavailable(f"keep-alive failed: {_code(exc)}") from exc
        try:  # the token expired: authenticate again, once
            self._authenticate(timeout)
            return self._renew(lease_id, timeout)
        except grpc.RpcError as exc:
            raise StoreUnavailable(f"keep-alive failed: {_code(exc)}") from exc

    def _renew(self, lease_id: int, timeout: float) -> int:
        if self._options.username and not self._metadata:
            self._authenticate(timeout)
        responses = self._lease.LeaseKeepAlive(
            iter([LeaseKeepAliveRequest(ID=lease_id)]),
            timeout=timeout,
            metadata=self._metadata or None,
        )
        try:
            for response in responses:
                return int(response.TTL)
        finally:
            responses.cancel()
        raise StoreUnavailable("keep-alive stream closed without a response")

    def _authenticate(self, timeout: float) -> None:
        request = AuthenticateRequest(
            name=self._options.username, password=self._options.password or ""
        )
        response = self._auth.Authenticate(request, timeout=timeout)
        self._metadata = (("token", response.token),)

    async def close(self) -> None:
        self._channel.close()


def _code(exc: grpc.RpcError) -> Any:
    code = getattr(exc, "code", None)
    return code() if callable(code) else None
