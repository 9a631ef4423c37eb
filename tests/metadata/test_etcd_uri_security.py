"""The secured etcd URI, taken apart without an etcd: ``etcds://``, the TLS options,
credentials from the URI, a password file or the environment (in that order), and errors that
are one line and never hold the password. ``test_uri.py`` has the plain
credentials' cases; ``test_etcd_security.py`` the real etcd."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiobk.metadata import MetadataAuthError, MetadataPermissionError, open_store, redact_uri
from aiobk.metadata.kv import EtcdCredentials, EtcdTLS
from aiobk.metadata.uri import (
    ENV_PASSWORD,
    ENV_PASSWORD_FILE,
    ENV_USER,
    MetadataURIError,
    parse_etcd_uri,
)
from aiobk.protocol.errors import MetadataStoreError

SECRET = "s3cr3t-Pw"
pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    """Readable files standing for a CA, a certificate and a key (never parsed here)."""
    files = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}+1.pem"  # a + in a path stays a + (not form data)
        path.write_text("-----BEGIN NOTHING-----\n")
        files[name] = str(path)
    return files


def test_etcds_means_tls_and_the_options_name_its_files(pem: dict[str, str]) -> None:
    target = parse_etcd_uri("etcds://h:1/x", env={})
    assert target.tls == EtcdTLS()
    query = f"ca={pem['ca']}&cert={pem['cert']}&key={pem['key']}"
    target = parse_etcd_uri(f"etcds://h:1,g:2/x?{query}", env={})
    assert target.tls == EtcdTLS(pem["ca"], pem["cert"], pem["key"])
    assert target.endpoints == (("h", 1), ("g", 2))
    assert target.prefix == "x"
    # A CA alone on etcd:// turns TLS on as well; no option, no TLS.
    assert parse_etcd_uri(f"etcd://h:1/x?ca={pem['ca']}", env={}).tls == EtcdTLS(pem["ca"])
    assert parse_etcd_uri("etcd://h:1/x", env={}).tls is None


def test_percent_encoded_credentials_and_paths(tmp_path: Path) -> None:
    ca = tmp_path / "a dir" / "c&a%.pem"
    ca.parent.mkdir()
    ca.write_text("x")
    uri = f"etcds://us%40er:p%3Aw%2F%3F%23%25%26%20%C3%BC@h:1/x?ca={tmp_path}/a%20dir/c%26a%25.pem"
    target = parse_etcd_uri(uri, env={})
    assert target.credentials == EtcdCredentials("us@er", "p:w/?#%& ü")
    assert target.tls == EtcdTLS(str(ca))
    assert redact_uri(uri).startswith("etcds://us%40er:***@h:1/x?ca=")


@pytest.mark.parametrize(
    ("content", "password"),
    [
        (f"{SECRET}\n", SECRET),
        (f"{SECRET}\r\n", SECRET),
        (SECRET, SECRET),
        (f" {SECRET} \n\n", f" {SECRET} \n"),  # one newline goes, the rest is the password
    ],
)
def test_password_file_loses_its_trailing_newline(
    tmp_path: Path, content: str, password: str
) -> None:
    path = tmp_path / "pw"
    path.write_bytes(content.encode())
    target = parse_etcd_uri(f"etcd://app@h:1/x?password_file={path}", env={})
    assert target.credentials == EtcdCredentials("app", password)


def _env_file(tmp_path: Path, password: str) -> str:
    path = tmp_path / "env-pw"
    path.write_text(password + "\n")
    return str(path)


def test_credentials_come_from_the_first_place_that_has_them(tmp_path: Path) -> None:
    uri_file = tmp_path / "uri-pw"
    uri_file.write_text("from-uri-file\n")
    env = {ENV_USER: "env-user", ENV_PASSWORD: "from-env"}

    def creds(uri: str, environment: dict[str, str]) -> EtcdCredentials | None:
        return parse_etcd_uri(uri, env=environment).credentials

    # The URI's user and password beat the environment's.
    assert creds("etcd://u:p@h:1/x", env) == EtcdCredentials("u", "p")
    # The URI's user, the environment's password.
    assert creds("etcd://u@h:1/x", env) == EtcdCredentials("u", "from-env")
    # Nothing in the URI: both from the environment.
    assert creds("etcd://h:1/x", env) == EtcdCredentials("env-user", "from-env")
    # password_file beats the environment's password.
    uri = f"etcd://h:1/x?password_file={uri_file}"
    assert creds(uri, env) == EtcdCredentials("env-user", "from-uri-file")
    # AIOBK_ETCD_PASSWORD_FILE, when no other password is given.
    file_env = {ENV_USER: "env-user", ENV_PASSWORD_FILE: _env_file(tmp_path, "from-env-file")}
    assert creds("etcd://h:1/x", file_env) == EtcdCredentials("env-user", "from-env-file")
    assert creds("etcd://u:p@h:1/x", file_env) == EtcdCredentials("u", "p")
    # No credentials anywhere: none (etcd without auth); empty variables count as unset.
    assert creds("etcd://h:1/x", {}) is None
    assert creds("etcd://h:1/x", {ENV_USER: "", ENV_PASSWORD: ""}) is None


def test_the_environment_is_read_when_no_env_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_USER, "app")
    monkeypatch.setenv(ENV_PASSWORD, SECRET)
    monkeypatch.delenv(ENV_PASSWORD_FILE, raising=False)
    assert parse_etcd_uri("etcd://h:1/x").credentials == EtcdCredentials("app", SECRET)


def _refused(uri: str, env: dict[str, str] | None = None, match: str = "") -> str:
    with pytest.raises(MetadataURIError, match=match) as refused:
        parse_etcd_uri(uri, env={} if env is None else env)
    message = str(refused.value)
    assert "\n" not in message
    assert SECRET not in message
    assert SECRET[:4] not in message
    return message


def test_conflicting_or_missing_credentials_are_refused(tmp_path: Path) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text(SECRET)
    _refused(f"etcd://u:{SECRET}@h:1/x?password_file={pw_file}", match="pick one")
    both = {ENV_USER: "u", ENV_PASSWORD: SECRET, ENV_PASSWORD_FILE: str(pw_file)}
    _refused("etcd://h:1/x", both, match="both AIOBK_ETCD_PASSWORD and")
    _refused("etcd://u@h:1/x", match="no password for the etcd user")
    _refused("etcd://h:1/x", {ENV_USER: "u"}, match="no password")
    _refused("etcd://h:1/x", {ENV_PASSWORD: SECRET}, match="no user")
    _refused(f"etcd://h:1/x?password_file={pw_file}", match="no user")
    _refused(f"etcd://u:{SECRET}@h:1/x?password={SECRET}", match="unknown option 'password'")


def test_bad_files_are_refused_by_path_without_their_content(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    _refused(f"etcd://u@h:1/x?password_file={missing}", match="cannot read the etcd password")
    env = {ENV_USER: "u", ENV_PASSWORD_FILE: str(missing)}
    _refused("etcd://h:1/x", env, match=ENV_PASSWORD_FILE)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    _refused(f"etcd://u@h:1/x?password_file={empty}", match="is empty")
    binary = tmp_path / "binary"
    binary.write_bytes(SECRET.encode() + b"\xff\xfe")
    _refused(f"etcd://u@h:1/x?password_file={binary}", match="not UTF-8")
    _refused(f"etcds://h:1/x?ca={missing}", match="the ca file .* cannot be read")
    _refused(f"etcds://h:1/x?cert={missing}&key={missing}", match="the cert file")


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("cert=/c", "needs both cert= and key="),
        ("key=/k", "needs both cert= and key="),
        ("ca=", "needs a value"),
        ("ca=/a&ca=/b", "given twice"),
        ("cafile=/a", "unknown option 'cafile' \\(takes ca, cert, key, password_file\\)"),
        ("verbose", "unknown option 'verbose' \\(options are NAME=VALUE\\)"),
    ],
)
def test_bad_options_are_one_clear_line(query: str, match: str) -> None:
    _refused(f"etcds://u:{SECRET}@h:1/x?{query}", match=match)


@pytest.mark.parametrize(
    "uri",
    [
        f"etcds://u:{SECRET[:4]}?{SECRET[4:]}@h:1/x",  # an unencoded ? ends the endpoints
        f"etcds://u:{SECRET[:4]}#{SECRET[4:]}@h:1/x",
        f"etcds://u:{SECRET[:4]}/{SECRET[4:]}@h:1/x?ca=/a",
        f"etcds://u:{SECRET}@h:1/x#frag",
        f"etcds://u:{SECRET}:@h/x",
        f"etcdz://u:{SECRET}@h:1/x",
        f"etcds://u:{SECRET}@h:1/x?ca=/no/such/file",
    ],
)
def test_malformed_uris_do_not_echo_the_password(uri: str) -> None:
    with pytest.raises(MetadataURIError) as refused:
        open_store(uri)
    message = str(refused.value)
    assert "\n" not in message
    assert all(part not in message for part in (SECRET, SECRET[:4], SECRET[4:]))


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (f"etcds://u:{SECRET}@h:1,g:2/x?ca=/c.pem", "etcds://u:***@h:1,g:2/x?ca=/c.pem"),
        # A lone name may be a password typed without its user: hidden as well.
        ("etcds://u@h:1/x?password_file=/pw", "etcds://***@h:1/x?password_file=/pw"),
        (f"etcd://h:1/x?password={SECRET}&ca=/c", "etcd://h:1/x?password=***&ca=/c"),
        (f"etcd://h:1/x?ca=/c&PW={SECRET}", "etcd://h:1/x?ca=/c&PW=***"),
        (f"etcds://u:{SECRET}@h:1/x?password={SECRET}", "etcds://u:***@h:1/x?password=***"),
    ],
)
def test_redact_uri_hides_passwords_wherever_they_are(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_nothing_printable_shows_the_password(pem: dict[str, str]) -> None:
    uri = f"etcds://app:{SECRET}@127.0.0.1:1/x?ca={pem['ca']}"
    target = parse_etcd_uri(uri, env={})
    store = open_store(uri)
    shown = [repr(target), str(target), repr(target.credentials), str(target.credentials)]
    shown += [store.uri, store.kv.description, repr(store.kv)]
    assert all(SECRET not in text for text in shown), shown
    assert store.kv.description == "etcds://app:***@127.0.0.1:1"
    assert store.uri == f"etcds://app:***@127.0.0.1:1/x?ca={pem['ca']}"


def test_auth_errors_are_store_errors_that_are_not_retried() -> None:
    assert issubclass(MetadataAuthError, MetadataStoreError)
    assert issubclass(MetadataPermissionError, MetadataAuthError)
    assert not MetadataAuthError.retriable
    assert not MetadataPermissionError.retriable
    assert MetadataStoreError.retriable
    assert MetadataAuthError.code == MetadataStoreError.code  # not a code of its own
