"""``etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX``: the KV on a real etcd v3, through
aetcd.

aetcd drops response headers and has no range limit, so requests that need the revision or
pagination go through its generated ``rpc`` stubs directly. Every call runs under
``asyncio.timeout()`` (not ``wait_for``, which on Python 3.11 can swallow a cancellation that
arrives as the call completes, leaving a cancelled task running); gRPC reconnects by itself
when etcd comes back. With several endpoints, a call that finds its endpoint unavailable (the
request never reached etcd, or the member has no leader: every call asks for one) moves to the
next one, and so does a watch whose stream broke; a timeout is reported as it is, since the
request may have been applied.

With credentials (etcd's ``auth enable``), connecting authenticates and every call carries the
token. A token dies with an etcd restart or after ``--auth-token-ttl`` idle seconds; a call
refused with ``invalid auth token`` authenticates again and is retried once (nothing was applied).
The client holding the dead token is retired, not closed at once: calls already on it (racing
the renewal, every one bounded by the timeout) end with their own answer instead of a
cancellation; it is closed at a later renewal or at ``close()``. A watch is created right after
a unary call on the same client: a watch created with a dead token (or by a user without
permission) is cancelled by etcd in a way aetcd does not report, so the unary call renews the
token first and finds a missing permission.

With TLS (``EtcdTLS``), the channel is gRPC's TLS channel. The clients, one endpoint at a time,
and their retirement are ``etcd_clients``'s.

What the configuration, not the network, got wrong is ``MetadataAuthError`` (not retriable): a
wrong user or password, no user where auth is on, a certificate one side does not trust; and
``MetadataPermissionError`` when the user's roles do not cover a key. Their messages are one
line and hold no password (etcd's own messages never echo one): ``etcd_refusals`` words them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

# gRPC's C core writes its own diagnostics to stderr (three lines for a refused certificate):
# the errors raised here carry the cause, on one line. GRPC_VERBOSITY=ERROR brings them back.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import aetcd  # after the line above: gRPC reads it when it loads
from aetcd import exceptions as etcd_errors
from aetcd import rpc

from aiobk.metadata.etcd_clients import EtcdClients
from aiobk.metadata.etcd_refusals import Refusals, one_line
from aiobk.metadata.kv import (
    KV,
    EtcdCredentials,
    EtcdTLS,
    KeyExistsError,
    KeyMissingError,
    KeyValue,
    MetadataAuthError,
    MetadataPermissionError,
    RevisionMismatchError,
    Watch,
    WatchCompactedError,
    WatchEvent,
    prefix_end,
)
from aiobk.protocol.errors import MetadataStoreError
from aiobk.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")
REQUIRE_LEADER = ("hasleader", "true")  # clientv3's WithRequireLeader


def _put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def _compare_mod(key: bytes, revision: int) -> Any:
    return rpc.Compare(
        key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=revision
    )


def _compare_absent(key: bytes) -> Any:
    return rpc.Compare(
        key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0
    )


def _kv(item: Any) -> KeyValue:
    return KeyValue(bytes(item.key), bytes(item.value), int(item.mod_revision), int(item.lease))


class _EtcdWatch(Watch):
    """Follows a key or prefix; re-establishes itself after etcd drops the stream."""

    def __init__(self, owner: EtcdKV, key: bytes, prefix: bool, start_revision: int) -> None:
        super().__init__()
        self._owner = owner
        self._key = key
        self._range_end = prefix_end(key) if prefix else None
        self._next = start_revision
        self._current: Any = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name="etcd-watch")

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closed:
            client: aetcd.Client | None = None
            try:
                client = await self._owner._client_for_watch(self._key)
                async with asyncio.timeout(self._owner.timeout):
                    self._current = await client.watch(
                        self._key, range_end=self._range_end, start_revision=self._next
                    )
                backoff = 0.05
                async for event in self._current:
                    revision = int(event.kv.mod_revision)
                    value = None if event.kind == "DELETE" else bytes(event.kv.value)
                    self._push(WatchEvent(bytes(event.kv.key), value, revision))
                    self._next = revision + 1
            except asyncio.CancelledError:
                raise
            except etcd_errors.RevisionCompactedError as exc:
                self._push(WatchCompactedError(f"watch of {self._key!r} fell behind: {exc}"))
                return
            except MetadataAuthError as exc:  # retrying cannot help: its owner hears of it
                self._push(exc)
                return
            except Exception as exc:  # stream broken: etcd restarting or unreachable
                log.debug("watch of %r interrupted (%r); retrying", self._key, exc)
                # With several endpoints the next attempt goes to the next one: the client
                # would otherwise keep dialling a dead member until some unary call moved it.
                await self._owner._clients.move_on(client)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _stop(self) -> None:
        await cancel_and_wait(self._task, Exception)
        if self._current is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._owner.timeout):
                    await self._current.cancel()


class EtcdKV(KV):
    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        timeout: float = 5.0,
        *,
        credentials: EtcdCredentials | None = None,
        tls: EtcdTLS | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self._clients = EtcdClients(endpoints, timeout, credentials=credentials, tls=tls)
        self._endpoints = endpoints
        self._credentials = credentials
        self._tls = tls
        self._refusals = Refusals(credentials, tls)
        self.timeout = timeout
        self._shut = False  # close() was called: no call connects again
        user = f"{credentials.user}:***@" if credentials is not None else ""
        scheme = "etcds://" if tls is not None else "etcd://"
        self.description = scheme + user + ",".join(f"{h}:{p}" for h, p in endpoints)

    def __repr__(self) -> str:
        return f"<EtcdKV {self.description}>"

    @property
    def endpoint(self) -> str:
        return self._clients.endpoint

    async def connect(self) -> None:
        """Connect now (with credentials: authenticate) and make one read, instead of at the
        first call: a wrong password, an untrusted certificate or an unreachable etcd shows
        here, as the first call would show it."""
        probe = rpc.RangeRequest(key=b"\0", count_only=True)
        with contextlib.suppress(MetadataPermissionError):  # a user limited to its prefix
            await self._call("connect", lambda c: c.kvstub.Range(probe, **self._opts(c)))

    async def _client_for_watch(self, key: bytes) -> aetcd.Client:
        if self._credentials is not None or self._tls is not None:
            probe = rpc.RangeRequest(key=key, count_only=True)
            await self._call("watch", lambda c: c.kvstub.Range(probe, **self._opts(c)), key)
        return await self._clients.get()

    def _opts(self, client: aetcd.Client) -> dict[str, Any]:
        """Keyword arguments of a raw stub call: the deadline, the auth token (if any), and
        etcd's require-leader flag: a member that has lost its leader (an election, or cut off
        from the others) answers "no leader" at once instead of holding the call for the whole
        timeout, and the call moves on to the next endpoint."""
        metadata = (*(client.metadata or ()), REQUIRE_LEADER)
        return {"timeout": self.timeout, "metadata": metadata}

    async def _call(
        self, what: str, fn: Callable[[aetcd.Client], Awaitable[T]], key: bytes | None = None
    ) -> T:
        last: BaseException | None = None
        tls_failed: MetadataAuthError | None = None
        attempts = len(self._endpoints)
        renewed = closed_under = False
        while attempts > 0:
            attempts -= 1
            endpoint = self.endpoint
            client: aetcd.Client | None = None
            try:
                try:
                    async with asyncio.timeout(self.timeout):
                        client = await self._clients.get()
                        answer = await fn(client)
                    self.connected = True
                    return answer
                except rpc.AioRpcError as exc:  # raw stubs: classify as aetcd would
                    if exc.code() == rpc.StatusCode.PERMISSION_DENIED:
                        raise self._refusals.denied(endpoint, what, key) from None
                    etcd_errors._handle_exception(exc)
                    raise  # pragma: no cover - _handle_exception always raises
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this call was cancelled
                if self._shut:
                    raise MetadataStoreError(f"{self.description}: closed during {what}") from None
                # gRPC cancels the calls of a channel that is closed under them: another call
                # moved to the next endpoint, or a token died. Not a cancellation of this
                # call's task (which would end a lease's keep-alive, a GC loop, ... silently):
                # try again on the client that is current now.
                last = exc
                if not closed_under:
                    closed_under = True
                    attempts += 1
                continue
            except etcd_errors.ConnectionFailedError as exc:
                last = exc
                # The next endpoint may trust us (or be up); if none does: say so.
                tls_failed = self._refusals.tls_refusal(endpoint, exc) or tls_failed
                if len(self._endpoints) > 1:
                    await self._clients.rotate()
                continue
            except (TimeoutError, etcd_errors.ConnectionTimeoutError) as exc:
                self.connected = False
                if len(self._endpoints) > 1:
                    await self._clients.rotate()
                raise MetadataStoreError(
                    f"etcd {endpoint} did not answer {what} within {self.timeout}s"
                ) from exc
            except etcd_errors.UnauthenticatedError as exc:
                # A token etcd no longer knows (it restarted, or the token idled out).
                if self._credentials is None or renewed or client is None:
                    raise MetadataAuthError(
                        f"etcd {endpoint}: {what} refused: {one_line(exc)}"
                    ) from None
                renewed = True
                attempts += 1
                await self._clients.retire(client)
                continue
            except etcd_errors.ClientError as exc:
                refused = self._refusals.refused(endpoint, what, exc)
                if refused is not None:
                    raise refused from None
                if "permission denied" in str(exc):  # through aetcd's own methods
                    raise self._refusals.denied(endpoint, what, key) from None
                raise MetadataStoreError(
                    f"etcd {endpoint}: {what} failed: {one_line(exc)}"
                ) from exc
        self.connected = False
        if tls_failed is not None:
            raise tls_failed from None
        raise self._refusals.unreachable(self.description, what, last) from last

    async def _txn(
        self, what: str, compare: list[Any], success: list[Any], failure: list[Any], key: bytes
    ) -> Any:
        request = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        return await self._call(what, lambda c: c.kvstub.Txn(request, **self._opts(c)), key)

    # ------------------------------------------------------------------ KV

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        request = rpc.RangeRequest(key=key)
        response = await self._call("get", lambda c: c.kvstub.Range(request, **self._opts(c)), key)
        found = _kv(response.kvs[0]) if response.kvs else None
        return found, int(response.header.revision)

    async def create(self, key: bytes, value: bytes, lease: int = 0) -> int:
        response = await self._txn(
            "create", [_compare_absent(key)], [_put(key, value, lease)], [], key
        )
        if not response.succeeded:
            raise KeyExistsError(key.decode(errors="replace"))
        return int(response.header.revision)

    async def _why_not(self, key: bytes, expected: int) -> Exception:
        current, _revision = await self.get(key)
        if current is None:
            return KeyMissingError(key.decode(errors="replace"))
        return RevisionMismatchError(key, expected, current.mod_revision)

    async def compare_and_set(self, key: bytes, value: bytes, expected: int, lease: int = 0) -> int:
        response = await self._txn(
            "compare-and-set", [_compare_mod(key, expected)], [_put(key, value, lease)], [], key
        )
        if not response.succeeded:
            raise await self._why_not(key, expected)
        return int(response.header.revision)

    async def delete(self, key: bytes, expected: int | None = None) -> None:
        delete = rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))
        if expected is None:
            compare = rpc.Compare(
                key=key, target=rpc.Compare.CREATE, result=rpc.Compare.GREATER, create_revision=0
            )
            response = await self._txn("delete", [compare], [delete], [], key)
            if not response.succeeded:
                raise KeyMissingError(key.decode(errors="replace"))
            return
        response = await self._txn("delete", [_compare_mod(key, expected)], [delete], [], key)
        if not response.succeeded:
            raise await self._why_not(key, expected)

    async def bump(self, key: bytes) -> int:
        # One transaction with no condition: its revision is unique across every client.
        response = await self._txn("allocate", [], [_put(key, b"")], [], key)
        return int(response.header.revision)

    async def range(
        self,
        prefix: bytes,
        after: bytes | None = None,
        limit: int = 1000,
        *,
        keys_only: bool = False,
        end: bytes | None = None,
    ) -> tuple[list[KeyValue], int]:
        start = after + b"\x00" if after is not None else prefix
        # No sort order: etcd answers a range in key order by itself, and a request that asks
        # for any sort makes it drop the limit -- it reads the whole range, values and all,
        # sorts it and then cuts it (etcd's apply.go: "fetch everything; sort and truncate
        # afterwards"): a page of one key under a million cost a million reads.
        request = rpc.RangeRequest(
            key=start,
            range_end=end if end is not None else prefix_end(prefix),
            limit=limit,
            keys_only=keys_only,
        )
        response = await self._call(
            "range", lambda c: c.kvstub.Range(request, **self._opts(c)), start
        )
        return [_kv(item) for item in response.kvs], int(response.header.revision)

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> Watch:
        return _EtcdWatch(self, key, prefix, start_revision)

    async def compact(self, revision: int) -> None:
        async def run(client: aetcd.Client) -> None:
            try:
                await client.compact(revision)
            except (rpc.AioRpcError, etcd_errors.ClientError) as exc:
                # Compacted that far already (another bookie's pass, auto-compaction): done.
                # etcd says so with OUT_OF_RANGE, which aetcd leaves a plain ClientError.
                if "revision has been compacted" not in str(exc):
                    raise

        await self._call("compact", run)

    async def db_size(self) -> int:
        """Bytes of the answering member's database file (etcd's ``status``)."""
        status = await self._call("status", lambda client: client.status())
        return int(status.db_size)

    async def grant_lease(self, ttl: float) -> tuple[int, float]:
        request = rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))
        response = await self._call(
            "lease grant", lambda c: c.leasestub.LeaseGrant(request, **self._opts(c))
        )
        return int(response.ID), float(response.TTL)

    async def keep_alive(self, lease: int) -> float:
        reply = await self._call("lease keep-alive", lambda c: c.refresh_lease(lease))
        return float(reply.TTL) if reply is not None else 0.0

    async def lease_time_to_live(self, lease: int) -> tuple[float, float] | None:
        request = rpc.LeaseTimeToLiveRequest(ID=lease)
        response = await self._call(
            "lease time-to-live", lambda c: c.leasestub.LeaseTimeToLive(request, **self._opts(c))
        )
        return float(response.TTL), float(response.grantedTTL)  # TTL -1: expired

    async def revoke_lease(self, lease: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease)
        with contextlib.suppress(MetadataStoreError):
            await self._call(
                "lease revoke", lambda c: c.leasestub.LeaseRevoke(request, **self._opts(c))
            )

    async def close(self) -> None:
        self._shut = True
        await self._clients.close()
