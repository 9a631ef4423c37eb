"""The address a bookie publishes for clients (registered in the metadata store).

The rule (also at ``BookieConfig.advertised_address``): ``advertised_address`` when it is set;
otherwise ``host:port``, except that a bookie listening on every interface (``--host 0.0.0.0``
or ``::``) publishes the address this host reaches other hosts from, the source address the
kernel picks toward an outside destination (BookKeeper resolves its default interface the same
way). With no such address (a host with only loopback or link-local addresses) the bookie
refuses to start and asks for ``--advertised-address``: ``0.0.0.0:PORT`` is an address no
client can dial. The bookie id defaults to the published address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from aiobk.bookie.config import BookieConfig, ConfigError

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
# Documentation addresses (RFC 5737, RFC 3849): only the route to them is looked up. Connecting
# a UDP socket sends nothing; it asks the kernel which source address it would use.
_OUTSIDE = ((socket.AF_INET, "198.51.100.1"), (socket.AF_INET6, "2001:db8::1"))


def routable_host() -> str | None:
    """An address of this host that other hosts can reach, IPv4 first; None if none."""
    for family, destination in _OUTSIDE:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((destination, 9))
                address: str = probe.getsockname()[0]
        except OSError:  # no route off this host for this family
            continue
        ip = ipaddress.ip_address(address.partition("%")[0])
        if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
            return address
    return None


def advertised_host(config: BookieConfig, resolve: Callable[[], str | None] | None = None) -> str:
    """The host part of the address to publish when ``advertised_address`` is not set."""
    if config.advertised_address is not None or config.host not in WILDCARD_HOSTS:
        return config.host
    found = (resolve or routable_host)()
    if found is None:
        raise ConfigError(
            f"host {config.host or '(empty)'} listens on every interface, but this host has no "
            "address other hosts can reach; set --advertised-address HOST:PORT (what clients "
            "dial) or --host to one address"
        )
    return found
