"""TLS and auth for the etcd that ``EtcdProcess`` runs (tests, standalone clusters).

``EtcdServerTLS`` names the server's certificate files and becomes etcd's client-side TLS
flags (peers stay plaintext: a local member's peers are on loopback). ``EtcdGateway`` speaks
etcd's JSON API (``POST /v3/...``) to a member's client port -- its HTTP gateway, or the same
calls over gRPC when the member serves TLS: the readiness and status probes, and the auth
setup below, without etcdctl.

Auth as etcd 3.4 wants it set up: a ``root`` user holding the ``root`` role must exist before
``auth enable``; then every other user is added by root. ``add_user`` gives a user a role of
its own name granting ``readwrite`` (or ``read``) on one key prefix's range -- what an aiobk
deployment grants its user on ``/PREFIX/`` (docs/operations/security.md).
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiobk.metadata.kv import EtcdTLS, prefix_end


@dataclass(frozen=True)
class EtcdServerTLS:
    """etcd's client port over TLS. ``ca_file`` signs ``cert_file`` (clients trust it); with
    ``client_cert_auth`` etcd also requires a client certificate signed by it (with auth
    enabled, etcd takes a certificate's common name for a user name when a call carries no
    token). ``client_cert`` (cert, key) is what this process presents then, to its probes and
    in ``uri()``; default the server's own pair (usable when it is issued for client use too)."""

    cert_file: str
    key_file: str
    ca_file: str
    client_cert_auth: bool = False
    client_cert: tuple[str, str] | None = None

    @property
    def client_pair(self) -> tuple[str, str] | None:
        if not self.client_cert_auth:
            return None
        return self.client_cert or (self.cert_file, self.key_file)

    def flags(self) -> list[str]:
        flags = [f"--cert-file={self.cert_file}", f"--key-file={self.key_file}"]
        if not self.client_cert_auth:
            # etcd 3.4 requires a client certificate of everyone once it has a CA to check
            # them with (--trusted-ca-file), --client-cert-auth or not.
            return flags
        return [*flags, f"--trusted-ca-file={self.ca_file}", "--client-cert-auth"]

    def uri_options(self) -> str:
        """The query of an ``etcds://`` URI that trusts this etcd (and presents the client
        certificate it requires)."""
        options = [f"ca={quote(self.ca_file, safe='/')}"]
        pair = self.client_pair
        if pair is not None:
            options += [f"cert={quote(pair[0], safe='/')}", f"key={quote(pair[1], safe='/')}"]
        return "?" + "&".join(options)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class EtcdGatewayError(RuntimeError):
    """The gateway answered with an error (its message, e.g. ``etcdserver: role name
    already exists``)."""


# The gateway's paths and the gRPC calls behind them: (stub, method, request message).
_GRPC_CALLS = {
    "/v3/cluster/member/list": ("ClusterStub", "MemberList", "MemberListRequest"),
    "/v3/maintenance/status": ("MaintenanceStub", "Status", "StatusRequest"),
    "/v3/auth/authenticate": ("AuthStub", "Authenticate", "AuthenticateRequest"),
    "/v3/auth/enable": ("AuthStub", "AuthEnable", "AuthEnableRequest"),
    "/v3/auth/user/add": ("AuthStub", "UserAdd", "AuthUserAddRequest"),
    "/v3/auth/user/grant": ("AuthStub", "UserGrantRole", "AuthUserGrantRoleRequest"),
    "/v3/auth/role/add": ("AuthStub", "RoleAdd", "AuthRoleAddRequest"),
    "/v3/auth/role/grant": ("AuthStub", "RoleGrantPermission", "AuthRoleGrantPermissionRequest"),
}


class EtcdGateway:
    """etcd's JSON API (``POST /v3/...`` with the gateway's JSON) on ``endpoint``
    (``host:port``). Plaintext: etcd's HTTP gateway itself. TLS: the same calls over gRPC
    (``_GRPC_CALLS``), with the same JSON in and out -- etcd 3.4's gateway refuses every
    request that carries a client certificate once auth is on ("CommonName of client sending a
    request against gateway will be ignored"), and ``--client-cert-auth`` requires one."""

    def __init__(self, endpoint: str, tls: EtcdServerTLS | None = None) -> None:
        self.endpoint = endpoint
        self.tls = tls
        # Loopback requests must not go through an http_proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def post(
        self, path: str, body: dict[str, Any], *, token: str | None = None, timeout: float = 1.0
    ) -> dict[str, Any]:
        """The JSON answer; OSError when etcd does not answer, ValueError when it answers
        something else than JSON, EtcdGatewayError when it answers an error."""
        if self.tls is not None:
            return self._grpc(path, body, token, timeout)
        request = urllib.request.Request(
            f"http://{self.endpoint}{path}", data=json.dumps(body).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("Authorization", token)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # an error status: etcd says why in JSON
            with exc:
                text = exc.read().decode(errors="replace")
            try:
                message = json.loads(text).get("error") or text
            except (ValueError, AttributeError):
                message = text
            raise EtcdGatewayError(f"etcd {path}: {message}") from None
        if not isinstance(answer, dict):
            raise ValueError(f"etcd {path} answered {answer!r}")
        return answer

    def _grpc(
        self, path: str, body: dict[str, Any], token: str | None, timeout: float
    ) -> dict[str, Any]:
        # Only an etcd with TLS needs gRPC here; quiet on stderr, as in metadata.kv_etcd.
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        import grpc  # type: ignore[import-untyped]  # noqa: PLC0415 - grpcio has no hints
        from aetcd import rpc  # noqa: PLC0415
        from google.protobuf import json_format  # type: ignore[import-untyped]  # noqa: PLC0415

        assert self.tls is not None
        stub_name, method, request_name = _GRPC_CALLS[path]
        pair = self.tls.client_pair
        ca, key, cert = EtcdTLS(self.tls.ca_file, *(pair or (None, None))).read()
        credentials = grpc.ssl_channel_credentials(ca, key, cert)
        request = json_format.ParseDict(body, getattr(rpc, request_name)())
        metadata = (("token", token),) if token is not None else None
        with grpc.secure_channel(self.endpoint, credentials) as channel:
            call = getattr(getattr(rpc, stub_name)(channel), method)
            try:
                response = call(request, timeout=timeout, metadata=metadata)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise ConnectionError(f"etcd {path}: {exc.details()}") from None
                raise EtcdGatewayError(f"etcd {path}: {exc.details()}") from None
        answer: dict[str, Any] = json_format.MessageToDict(
            response, preserving_proto_field_name=True
        )
        return answer

    def authenticate(self, user: str, password: str) -> str:
        answer = self.post(
            "/v3/auth/authenticate", {"name": user, "password": password}, timeout=10
        )
        return str(answer["token"])

    def enable_auth(self, root_password: str) -> None:
        """``user add root``, ``role add root``, ``user grant-role root root``, ``auth
        enable``: afterwards every request needs a user (``root`` with ``root_password``)."""
        self.post("/v3/auth/user/add", {"name": "root", "password": root_password}, timeout=10)
        self.post("/v3/auth/role/add", {"name": "root"}, timeout=10)
        self.post("/v3/auth/user/grant", {"user": "root", "role": "root"}, timeout=10)
        self.post("/v3/auth/enable", {}, timeout=10)

    def add_user(
        self,
        name: str,
        password: str,
        *,
        key_prefix: str | bytes,
        readonly: bool = False,
        root_password: str | None = None,
    ) -> None:
        """A user ``name`` with a role ``name`` granting ``readwrite`` (``read``) on every key
        that starts with ``key_prefix`` (aiobk's keys are ``/PREFIX/...``: give ``/PREFIX/``).
        With auth enabled, ``root_password`` authenticates the change."""
        token = self.authenticate("root", root_password) if root_password is not None else None
        prefix = key_prefix.encode() if isinstance(key_prefix, str) else key_prefix
        permission = {
            "permType": "READ" if readonly else "READWRITE",
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
        }
        steps: list[tuple[str, dict[str, Any]]] = [
            ("/v3/auth/user/add", {"name": name, "password": password}),
            ("/v3/auth/role/add", {"name": name}),
            ("/v3/auth/role/grant", {"name": name, "perm": permission}),
            ("/v3/auth/user/grant", {"user": name, "role": name}),
        ]
        for path, body in steps:
            self.post(path, body, token=token, timeout=10)
