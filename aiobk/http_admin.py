"""The bookie's HTTP admin API (BookKeeper's ``BookieHttpServer`` paths), on aiohttp.

Off unless ``http_port`` is set; it listens on the bookie's host unless ``http_host`` says
otherwise, on the bookie's own event loop, and is started after the bookie serves and stopped
before it stops (``aiobk.runner``). Every endpoint answers JSON, except ``/heartbeat`` (``OK``,
as BookKeeper's, for load balancers) and ``/metrics`` (Prometheus text):

- ``GET /heartbeat``; ``GET /metrics``;
- ``GET /api/v1/bookie/info``; ``GET|PUT /api/v1/bookie/state`` (body ``{"readOnly": bool}``,
  as BookKeeper's ``/api/v1/bookie/state/readonly``); ``PUT /api/v1/bookie/gc``;
  ``GET /api/v1/bookie/gc_details``;
- ``GET /api/v1/autorecovery/status``, ``GET /api/v1/autorecovery/list_under_replicated_ledger``,
  ``GET /api/v1/autorecovery/explain?ledger_id=N[&check=false]`` (what ``aiobk autorecovery
  status|list-underreplicated|explain --json`` print);
- ``GET /api/v1/ledger/metadata?ledger_id=N``.

Nothing here is a second bookie: admin actions call the same ``Bookie`` methods and state the
binary protocol's handlers do (``bookie.ops.admin``), and the autorecovery reports are
``aiobk.autorecovery.status``'s.

What a request can cost is bounded: bodies are at most ``MAX_BODY`` bytes; every metadata
store call runs under ``store_timeout`` (503 when it passes, or when the store answers with an
error: etcd unreachable), and at most ``MAX_STORE_REQUESTS`` of them at once (429 beyond); a
garbage collection pass is waited for at most ``gc_wait`` seconds, then goes on in the
background (202; ``gc_details`` shows its result), and only one requested here runs at a time.
Bad input answers 4xx with ``{"error": "..."}``: 400 (bad query or body), 404 (unknown path or
ledger), 405 (wrong method), 409 (a state that cannot change), 413 (body too large).

A bookie with TLS (``tls_cert_file``) serves this API over HTTPS with its certificate; with
``tls_client_auth`` a client certificate is required and its roles are checked as on the
bookie port (``bookie.access``): PUTs need ``admin``, GETs any role, ``/heartbeat`` none
(403 with the reason otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from aiobk.autorecovery.explain import explain_ledger
from aiobk.autorecovery.status import gather_status, under_replicated
from aiobk.bookie import Bookie
from aiobk.bookie.access import roles_of
from aiobk.bookie.config import ConfigError
from aiobk.bookie.errors import BookieStateError
from aiobk.bookie.gc import GcResult
from aiobk.bookie.server import SOFTWARE_VERSION
from aiobk.bookie.tls import server_context
from aiobk.client.config import ClientConfig
from aiobk.client.net import TlsConnector
from aiobk.client.pool import BookiePool
from aiobk.metadata import MetadataFormatError, MetadataStore
from aiobk.metadata.uri import redact_uri
from aiobk.protocol import ADMIN, KNOWN_ROLES
from aiobk.protocol.errors import BKError, NoSuchLedgerError
from aiobk.protocol.limits import MAX_LEDGER_ID

log = logging.getLogger(__name__)

MAX_BODY = 4096  # the largest body any endpoint takes is a few bytes of JSON
STORE_TIMEOUT = 10.0  # seconds for one request's metadata store work (etcd's own is 5 s a call)
MAX_STORE_REQUESTS = 4  # requests working on the store at once; more get 429
GC_WAIT = 30.0  # seconds PUT /gc waits for its pass before answering 202 (the pass goes on)
SHUTDOWN_TIMEOUT = 2.0  # seconds a stop waits for requests in progress (the bookie is stopping)
DISK_TIMEOUT = 5.0  # seconds to measure the directories' filesystems (a hung mount)
REPORT_TIMEOUT = 30.0  # seconds for the garbage collection report (it reads each entry log's size)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
_DIGITS = re.compile(r"[0-9]{1,19}")


class HttpError(Exception):
    """Answered as ``{"error": message}`` with ``status`` (and ``extra`` fields)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class HttpAdmin:
    """The HTTP admin server of one bookie (``aiobk.runner.start_http_admin`` builds it from
    the bookie's config). ``registries``: what ``/metrics`` exposes, in order (default the
    process's ``prometheus_client.REGISTRY``). The endpoints that need the metadata store
    use the bookie's own (``Bookie.metadata``)."""

    def __init__(
        self,
        bookie: Bookie,
        host: str,
        port: int,
        *,
        registries: Sequence[CollectorRegistry] = (REGISTRY,),
        store_timeout: float = STORE_TIMEOUT,
        gc_wait: float = GC_WAIT,
    ) -> None:
        self.bookie = bookie
        self.host = host
        self._port = port
        self._registries = tuple(registries)
        self.store_timeout = store_timeout
        self.gc_wait = gc_wait
        self._store_slots = asyncio.Semaphore(MAX_STORE_REQUESTS)
        self._runner: web.AppRunner | None = None
        self._gc: asyncio.Task[GcResult] | None = None
        self._gc_started = 0.0
        self._gc_record: tuple[asyncio.Task[GcResult], dict[str, Any]] | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The port bound (``port`` 0 asks the system for a free one)."""
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.bookie.tls is not None else "http"
        return f"{scheme}://{host}:{self._port}"

    def _ssl_context(self) -> ssl.SSLContext | None:
        """HTTPS with the bookie's certificate when the bookie has TLS. Each
        handshake switches to the bookie's current context, so renewed files (reloaded by the
        bookie) serve here too without a restart."""
        tls = self.bookie.tls
        if tls is None:
            return None
        context = server_context(self.bookie.config)

        def current(sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            sslobj.context = tls.server

        context.sni_callback = current
        return context

    async def start(self) -> None:
        """Bind and serve; OSError when the port cannot be bound."""
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors, self._access])
        routes = app.router
        routes.add_get("/heartbeat", self.heartbeat)
        routes.add_get("/metrics", self.metrics)
        routes.add_get("/api/v1/bookie/info", self.info)
        routes.add_get("/api/v1/bookie/state", self.state)
        routes.add_put("/api/v1/bookie/state", self.change_state)
        routes.add_put("/api/v1/bookie/gc", self.gc)
        routes.add_get("/api/v1/bookie/gc_details", self.gc_details)
        routes.add_get("/api/v1/autorecovery/status", self.autorecovery_status)
        routes.add_get(
            "/api/v1/autorecovery/list_under_replicated_ledger", self.list_under_replicated
        )
        routes.add_get("/api/v1/autorecovery/explain", self.explain)
        routes.add_get("/api/v1/ledger/metadata", self.ledger_metadata)
        # A client that goes away cancels its handler: nothing is worked on for nobody.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self._port, ssl_context=self._ssl_context())
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                exc.errno, f"HTTP admin API on {self.host}:{self._port}: {exc.strerror or exc}"
            ) from exc
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        for address in runner.addresses:
            self._port = int(address[1])
            break
        log.info("bookie %s: HTTP admin API on %s", self.bookie.bookie_id, self.url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        gc, self._gc = self._gc, None
        if gc is not None and not gc.done():
            # As the bookie's own periodic pass is cancelled when it stops.
            gc.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await gc

    # ------------------------------------------------------------------ plumbing

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every error as JSON: ours, aiohttp's (404, 405 with its Allow header, 413), and a
        bug's (500, logged)."""
        try:
            return await handler(request)
        except HttpError as exc:
            return _error(exc.status, str(exc), **exc.extra)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {
                404: f"no such path: {request.path}",
                405: f"{request.method} is not allowed on {request.path}",
                413: f"request body over {MAX_BODY} bytes",
            }.get(exc.status, exc.reason)
            response = _error(exc.status, message)
            if "Allow" in exc.headers:
                response.headers["Allow"] = exc.headers["Allow"]
            return response
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("HTTP admin: %s %s failed", request.method, request.path)
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    @web.middleware
    async def _access(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """With ``tls_client_auth`` the roles of the client's certificate decide, as on the
        bookie port: changes (PUT) need ``admin``; reads need a known role, but
        ``/heartbeat`` (what a liveness probe asks) needs none."""
        if not self.bookie.config.tls_client_auth or request.path == "/heartbeat":
            return await handler(request)
        transport = request.transport
        roles = roles_of(transport.get_extra_info("peercert") if transport else None)
        needed = frozenset({ADMIN}) if request.method != "GET" else KNOWN_ROLES
        if not roles & needed:
            have = ", ".join(sorted(roles)) or "none"
            raise HttpError(
                403, f"{request.method} {request.path} needs the role "
                f"{' or '.join(sorted(needed))} (the certificate has {have})"
            )  # fmt: skip
        return await handler(request)

    def _store(self) -> MetadataStore:
        """The bookie's own store (while it serves with one)."""
        store = self.bookie.metadata
        if store is None:
            raise HttpError(503, f"bookie {self.bookie.bookie_id} runs without a metadata store")
        return store

    async def _with_store(self, work: Callable[[MetadataStore], Awaitable[T]]) -> T:
        """``work`` on the bookie's store, under ``store_timeout``; errors become 503."""
        store = self._store()
        if self._store_slots.locked():
            raise HttpError(429, f"{MAX_STORE_REQUESTS} metadata requests already running")
        async with self._store_slots:
            deadline = asyncio.timeout(self.store_timeout)
            try:
                async with deadline:
                    return await work(store)
            except TimeoutError as exc:
                if deadline.expired():
                    raise HttpError(
                        503, f"the metadata store did not answer within {self.store_timeout:g}s"
                    ) from None
                raise HttpError(503, f"metadata store: {exc}") from None
            except NoSuchLedgerError:
                raise
            except BKError as exc:  # MetadataStoreError: etcd unreachable, refused, ...
                raise HttpError(503, f"metadata store: {exc}") from None
            except MetadataFormatError as exc:
                raise HttpError(500, f"unreadable metadata: {exc}") from None

    # ------------------------------------------------------------------ the bookie

    async def heartbeat(self, _request: web.Request) -> web.StreamResponse:
        if not self.bookie.running:
            raise HttpError(503, f"bookie {self.bookie.bookie_id} is not running")
        return web.Response(text="OK\n")

    async def metrics(self, _request: web.Request) -> web.StreamResponse:
        """Collected off the loop, as the ``--metrics-port`` exporter's thread does (the disk
        collector measures filesystems; the bookie's figures are read as they stand)."""

        def exposition() -> bytes:
            return b"".join(generate_latest(registry) for registry in self._registries)

        try:
            async with asyncio.timeout(DISK_TIMEOUT):
                body = await asyncio.to_thread(exposition)
        except TimeoutError:
            raise HttpError(503, f"metrics not collected within {DISK_TIMEOUT:g}s") from None
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _state_document(self) -> dict[str, Any]:
        """``aiobk bookie state --json``'s document, with BookKeeper's ``readOnly``."""
        bookie, state = self.bookie, self.bookie.write_state
        return {
            "id": bookie.bookie_id,
            "state": "writable" if state.writable else "readonly",
            "readOnly": not state.writable,
            "reasons": state.reasons,
            "high_priority_writes": state.high_priority,
            "checkpoint_error": bookie.checkpoint_error,
            "running": bookie.running,
        }

    async def info(self, _request: web.Request) -> web.StreamResponse:
        bookie, config = self.bookie, self.bookie.config
        gauges = bookie.gauges()
        directories = {"data": config.data_dir, "journal": config.journal_path}
        try:
            async with asyncio.timeout(DISK_TIMEOUT):
                usage = [await _disk_usage(role, path) for role, path in directories.items()]
        except TimeoutError:
            raise HttpError(503, f"the disks did not answer within {DISK_TIMEOUT:g}s") from None
        document = {
            "id": bookie.bookie_id,
            "address": bookie.advertised_address,
            "listening": str(bookie.address),
            "rack": config.rack,
            "version": SOFTWARE_VERSION,
            **{k: v for k, v in self._state_document().items() if k != "id"},
            "directories": {**directories, "ledgers": config.ledgers_path},
            "disk_usage": usage,
            "disk_usage_threshold": config.disk_usage_threshold,
            "ledgers_held": gauges["ledgers_held"],
            "instance_id": bookie.booted.instance_id,
            "unclean_start": bookie.booted.unclean_start,
            "limbo_ledgers": len(bookie.booted.limbo_ledgers),
            "repairing": bookie.repairing,
            "registered": bookie.registration is not None,
            "metadata": redact_uri(config.metadata_uri) if config.metadata_uri else None,
            "journal_write_data": config.journal_write_data,
            # What GET_BOOKIE_INFO answers (bookie.ops.admin): counters, then gauges.
            "figures": {**bookie.stats.as_dict(), **gauges},
        }
        return web.json_response(document)

    async def state(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(self._state_document())

    async def change_state(self, request: web.Request) -> web.StreamResponse:
        """As BOOKIE_STATE (``bookie.ops.admin``): read-only under the operator's reason, and
        lifting only that reason: a full disk or a failed journal still holds (409)."""
        body = await _json_body(request)
        _only(body, {"readOnly"})
        read_only = body.get("readOnly")
        if not isinstance(read_only, bool):
            raise HttpError(400, 'the body must be {"readOnly": true} or {"readOnly": false}')
        state = self.bookie.write_state
        self.bookie.set_read_only(read_only)
        document = self._state_document()
        if not read_only and not state.writable:
            reasons = "; ".join(state.reasons)
            return _error(409, f"the bookie stays read-only: {reasons}", **document)
        return web.json_response(document)

    async def gc(self, request: web.Request) -> web.StreamResponse:
        """One pass now (``Bookie.collect_garbage``, as the GC opcode): its figures, or 202
        when it runs past ``gc_wait`` (it goes on; ``gc_details`` shows its result)."""
        body = await _json_body(request)
        _only(body, set())
        if self._gc is not None and not self._gc.done():
            raise HttpError(409, "a garbage collection pass requested here is running")
        self._store()  # a bookie without a store never collects: say so as 503 as well
        self._gc_started = time.time()
        self._gc = task = asyncio.get_running_loop().create_task(
            self.bookie.collect_garbage(), name="http-admin-gc"
        )
        task.add_done_callback(self._gc_done)
        done, _pending = await asyncio.wait([task], timeout=self.gc_wait)
        if not done:
            return web.json_response(
                {"running": True, "started": self._gc_started, "see": "/api/v1/bookie/gc_details"},
                status=202,
            )
        try:
            task.result()
        except (ConfigError, BookieStateError) as exc:
            raise HttpError(503, str(exc)) from None
        except OSError as exc:
            raise HttpError(500, f"garbage collection failed: {exc}") from None
        return web.json_response(self._record(task))

    def _gc_done(self, task: asyncio.Task[GcResult]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, ConfigError | BookieStateError | OSError):
            log.error("HTTP admin: garbage collection failed", exc_info=error)
        self._record(task)

    def _record(self, task: asyncio.Task[GcResult]) -> dict[str, Any]:
        """What the ended pass ``task`` did (or why it failed), with when it ran; made once,
        by whichever of its done callback and its readers comes first."""
        if self._gc_record is not None and self._gc_record[0] is task:
            return self._gc_record[1]
        finished = time.time()
        when = {
            "started": self._gc_started,
            "finished": finished,
            "duration": round(finished - self._gc_started, 6),
        }
        error = task.exception()
        document = {"error": str(error)} if error is not None else task.result().figures()
        self._gc_record = (task, {**document, **when})
        return self._gc_record[1]

    async def gc_details(self, _request: web.Request) -> web.StreamResponse:
        """The settings, the last pass requested here, the totals, and the report: each entry
        log's live and total bytes and why it is kept, and the pass running now, if any
        (``aiobk bookie gc --report``)."""
        config, figures = self.bookie.config, self.bookie.stats.as_dict()
        task = self._gc
        if task is not None and task.done() and not task.cancelled():
            self._record(task)
        try:
            async with asyncio.timeout(REPORT_TIMEOUT):
                report = await self.bookie.gc_report()
        except TimeoutError:
            raise HttpError(503, f"no report within {REPORT_TIMEOUT:g}s") from None
        document = {
            "gc_interval": config.gc_interval,
            "compaction_threshold": config.gc_compaction_threshold,
            "periodic": config.gc_interval > 0 and self._has_store(),
            "running": task is not None and not task.done(),
            # The last pass requested here that ended (a running one shows once it ends).
            "last_requested_pass": self._gc_record[1] if self._gc_record is not None else None,
            # Every pass since the bookie started: periodic, forced by a full disk, requested.
            "totals": {name: value for name, value in figures.items() if name.startswith("gc_")},
            "report": report,
        }
        return web.json_response(document)

    def _has_store(self) -> bool:
        try:
            self._store()
        except HttpError:
            return False
        return True

    # ------------------------------------------------------------------ the metadata store

    async def autorecovery_status(self, _request: web.Request) -> web.StreamResponse:
        report = await self._with_store(gather_status)
        return web.json_response(report.to_document())

    async def list_under_replicated(self, _request: web.Request) -> web.StreamResponse:
        """The ids of ``aiobk autorecovery list-underreplicated --json``, with each mark's
        missing bookies, since when, why and the entries found lost (no claims: those would
        be one store read per ledger)."""
        marked = await self._with_store(under_replicated)
        documents = []
        for mark in marked:
            document = mark.to_document()
            document.pop("claimed_by", None)
            documents.append(document)
        return web.json_response(
            {"ledgers": [d["ledger_id"] for d in documents], "marks": documents}
        )

    async def explain(self, request: web.Request) -> web.StreamResponse:
        """``aiobk autorecovery explain --json``'s document; ``check=false`` does not ask the
        bookies what they hold (they are asked with this bookie's TLS identity, if any)."""
        ledger_id = ledger_id_of(request)
        check = request.query.get("check", "true")
        if check not in ("true", "false"):
            raise HttpError(400, f"check must be true or false, got {check!r}")
        tls = self.bookie.tls
        connector = TlsConnector(lambda: tls.client) if tls is not None else None

        async def work(store: MetadataStore) -> dict[str, Any]:
            pool = BookiePool(store, ClientConfig(), connector) if check == "true" else None
            try:
                return (await explain_ledger(store, ledger_id, pool=pool)).to_document()
            finally:
                if pool is not None:
                    await pool.close()

        return web.json_response(await self._with_store(work))

    async def ledger_metadata(self, request: web.Request) -> web.StreamResponse:
        ledger_id = ledger_id_of(request)
        try:
            found = await self._with_store(lambda store: store.read_ledger(ledger_id))
        except NoSuchLedgerError:
            raise HttpError(404, f"no such ledger: {ledger_id}") from None
        # ``aiobk ledger show --json``'s document less the password digest: this port has no
        # authentication, and the digest would let anyone try passwords offline.
        document: dict[str, Any] = json.loads(found.to_json())
        document.pop("password_digest", None)
        return web.json_response({"ledger_id": ledger_id, "version": found.version, **document})


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; an empty body is ``{}``."""
    raw = await request.read()  # over MAX_BODY: aiohttp raises 413
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise HttpError(400, f"unknown field(s) in the body: {', '.join(unknown)}")


def ledger_id_of(request: web.Request) -> int:
    """``?ledger_id=N``: given once, a decimal integer in 0..2**63-1."""
    given = request.query.getall("ledger_id", [])
    if not given:
        raise HttpError(400, "ledger_id is required: ?ledger_id=N")
    if len(given) > 1:
        raise HttpError(400, "give ledger_id once")
    text = given[0]
    if not _DIGITS.fullmatch(text) or int(text) > MAX_LEDGER_ID:
        raise HttpError(400, f"ledger_id must be an integer in 0..{MAX_LEDGER_ID}, got {text!r}")
    return int(text)


async def _disk_usage(role: str, path: str) -> dict[str, Any]:
    """One directory's filesystem, measured off the loop."""
    try:
        usage = await asyncio.to_thread(shutil.disk_usage, path)
        device = (await asyncio.to_thread(os.stat, path)).st_dev
    except OSError as exc:
        return {"directory": role, "path": path, "error": exc.strerror or str(exc)}
    used = 1.0 - usage.free / usage.total if usage.total else 1.0
    return {
        "directory": role,
        "path": path,
        "device": device,
        "free": usage.free,
        "total": usage.total,
        "used": round(used, 4),
    }


__all__ = ["GC_WAIT", "MAX_BODY", "STORE_TIMEOUT", "HttpAdmin"]
