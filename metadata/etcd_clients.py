"""The connections of one ``EtcdKV``: a client per endpoint in turn, the move to the next
endpoint after a failure, and the clients retired with a dead token or a dead member.

A client that is left is retired, not closed at once: closing a gRPC channel cancels every
call still on it, and those are other callers' calls (each bounded by the timeout anyway). A
retired client is closed once the timeout has passed, at a later retirement or at ``close()``.
With TLS (``EtcdTLS``) the channel is gRPC's TLS channel: aetcd 1.0 dials plaintext only, so
``_Client`` is its ``connect()`` on a secure channel; the certificate files are read at each
connect.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aetcd
import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from aetcd import exceptions as etcd_errors
from aetcd import rpc

from aiobk.metadata.kv import EtcdCredentials, EtcdTLS, MetadataAuthError


class _Client(aetcd.Client):  # type: ignore[misc]  # aetcd has no type hints
    """aetcd's client; with ``tls`` (gRPC channel credentials) its ``connect()`` opens a TLS
    channel instead of aetcd's plaintext one, and does the rest as aetcd 1.0.0 does."""

    _is_connecting: bool  # aetcd's, set in its __init__

    def __init__(self, *, tls: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tls = tls

    async def connect(self) -> None:
        if self._tls is None:
            await super().connect()
            return
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        self._is_connecting = True
        try:
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(target, self._tls, options=self._options.items())
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                response = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", response.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        except rpc.AioRpcError as exc:
            etcd_errors._handle_exception(exc)
        finally:
            self._is_connecting = False


class EtcdClients:
    """The client of the current endpoint, connected on first use, and the ones retired."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        timeout: float,
        *,
        credentials: EtcdCredentials | None,
        tls: EtcdTLS | None,
    ) -> None:
        self._endpoints = endpoints
        self._index = 0
        self._client: aetcd.Client | None = None
        self._retired: list[tuple[float, aetcd.Client]] = []  # token died: closed later
        self._credentials = credentials
        self._tls = tls
        self.timeout = timeout

    @property
    def endpoint(self) -> str:
        host, port = self._endpoints[self._index]
        return f"{host}:{port}"

    def _channel_credentials(self) -> Any:
        """gRPC's TLS credentials from the files named (read now), or None: plaintext."""
        if self._tls is None:
            return None
        try:
            ca, key, cert = self._tls.read()
        except OSError as exc:
            raise MetadataAuthError(
                f"etcd TLS: cannot read {exc.filename!r}: {exc.strerror or exc}"
            ) from None
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )

    def _new_client(self, host: str, port: int, *, authenticate: bool) -> aetcd.Client:
        creds = self._credentials if authenticate else None
        return _Client(
            tls=self._channel_credentials(),
            host=host,
            port=port,
            timeout=self.timeout,
            username=creds.user if creds is not None else None,
            password=creds.password if creds is not None else None,
        )

    async def get(self) -> aetcd.Client:
        """The connected client; with credentials, connecting authenticates (a round trip)."""
        if self._client is None:
            host, port = self._endpoints[self._index]
            client = self._new_client(host, port, authenticate=True)
            try:
                await client.connect()  # opens the gRPC channel (and authenticates)
            except etcd_errors.PreconditionFailedError as exc:
                await self.close_client(client)
                if "authentication is not enabled" not in str(exc):
                    raise
                # As etcd's own client does: credentials for an etcd without auth are unused.
                client = self._new_client(host, port, authenticate=False)
                await client.connect()
            except BaseException:
                await self.close_client(client)
                raise
            self._client = client
        return self._client

    async def move_on(self, client: aetcd.Client | None) -> None:
        """After ``client`` failed: the next endpoint, if there are several and nothing moved
        on since."""
        if len(self._endpoints) > 1 and client is not None and self._client is client:
            await self.rotate()

    async def rotate(self) -> None:
        """The next endpoint. The client of the last one is retired, not closed: closing a
        channel cancels the calls still on it, which are other callers' (each bounded by the
        timeout anyway)."""
        client = self._client
        self._index = (self._index + 1) % len(self._endpoints)
        if client is not None:
            await self.retire(client)
        self._client = None

    async def retire(self, client: aetcd.Client) -> None:
        """Stop using ``client`` (its token died): the next call connects anew. Calls already
        on it end by themselves within the timeout, so it is closed only once that has passed,
        at a later retirement or at ``close()``."""
        if self._client is client:
            self._client = None
        now = asyncio.get_running_loop().time()
        retired, self._retired = self._retired, []
        for when, old in retired:
            if now - when > self.timeout:
                await self.close_client(old)
            else:
                self._retired.append((when, old))
        if all(old is not client for _when, old in self._retired):
            self._retired.append((now, client))

    async def close_client(self, client: aetcd.Client | None) -> None:
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.timeout):
                    await client.close()

    async def close(self) -> None:
        """Close the current client and every retired one."""
        client, self._client = self._client, None
        retired, self._retired = self._retired, []
        for old in [client, *(old for _when, old in retired)]:
            await self.close_client(old)
