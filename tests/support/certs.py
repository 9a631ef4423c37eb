"""Certificates made in the test that needs them: ``aiobk.bench.certs``, shared with
the benchmarks that run TLS (``aiobk bench add --modes tls``)."""

from aiobk.bench.certs import CertAuthority, Issued

__all__ = ["CertAuthority", "Issued"]
