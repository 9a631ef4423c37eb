"""The bookie's TLS material: the context its port upgrades connections with, the
context its own client connections use (repair, autorecovery), and their reload when the files
change on disk (BookKeeper's ``tlsCertFilesRefreshDurationSeconds``): a renewed certificate is
used by the connections made after it is read, without a restart, and a broken one is reported
and ignored until fixed (the bookie keeps the last good pair).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl

from aiobk.bookie.config import BookieConfig, ConfigError

log = logging.getLogger(__name__)

TLS_HANDSHAKE_TIMEOUT = 10.0  # seconds a peer has to finish the TLS handshake


def server_context(config: BookieConfig) -> ssl.SSLContext:
    """The context the bookie's port upgrades connections with (TLS 1.2 or later)."""
    assert config.tls_cert_file is not None
    assert config.tls_key_file is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, config)
    if config.tls_client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
    elif config.tls_ca_file is not None:
        context.verify_mode = ssl.CERT_OPTIONAL  # a certificate offered is checked anyway
    return context


def client_context(config: BookieConfig) -> ssl.SSLContext:
    """What the bookie's own client connections use: it trusts ``tls_ca_file`` (the system's
    store without one) and shows its certificate, which should carry the ``bookie`` role."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, config)
    return context


def _load(context: ssl.SSLContext, config: BookieConfig) -> None:
    assert config.tls_cert_file is not None
    assert config.tls_key_file is not None
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        if config.tls_ca_file is not None:
            context.load_verify_locations(cafile=config.tls_ca_file)
    except FileNotFoundError as exc:
        raise ConfigError(f"TLS file {exc.filename} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"TLS files {config.tls_cert_file}, {config.tls_key_file}"
            + (f", {config.tls_ca_file}" if config.tls_ca_file else "")
            + f" cannot be used: {exc}"
        ) from None


class BookieTls:
    """The current contexts; ``reload_if_changed`` swaps them when the files change."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.server = server_context(config)  # ConfigError at start: refuse to start
        self.client = client_context(config)
        self._stamp = self._files_stamp()
        self.reloads = 0
        self.reload_error: str | None = None

    def _files_stamp(self) -> tuple[tuple[int, int, int], ...]:
        files = (self.config.tls_cert_file, self.config.tls_key_file, self.config.tls_ca_file)
        stamp = []
        for path in files:
            if path is None:
                continue
            try:
                info = os.stat(path)
            except OSError:
                stamp.append((-1, -1, -1))
            else:
                stamp.append((info.st_mtime_ns, info.st_size, info.st_ino))
        return tuple(stamp)

    def reload_if_changed(self) -> bool:
        """Read the files again if any changed since last read; True when swapped in."""
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return False
        try:
            server, client = server_context(self.config), client_context(self.config)
        except ConfigError as exc:
            if self.reload_error != str(exc):
                log.error("TLS files changed but cannot be used (keeping the old ones): %s", exc)
            self.reload_error = str(exc)
            return False  # retried at the next interval: a half-written renewal settles
        self.server, self.client = server, client
        self._stamp = stamp
        self.reloads += 1
        self.reload_error = None
        log.info("TLS certificate files reloaded (%s)", self.config.tls_cert_file)
        return True

    async def reload_every(self, interval: float) -> None:
        """Read the files again when they change, every ``interval`` seconds
        (``tls_reload_interval``), until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()
