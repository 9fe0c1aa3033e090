"""TLS and mutual TLS with certificates made in the test (trustme), and the protected mode that keeps
a node without authentication off non-loopback addresses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from streamingnode.client import AsyncClient, Client
from streamingnode.server import ServerThread
from streamingnode.server.serve import is_loopback
from tests.integration.conftest import node_config
from tests.node_process import REPO
from wal.errors import InvalidArgumentError, StreamingError, UnavailableError

pytestmark = pytest.mark.integration


class Pki:
    """A server CA with a leaf for 127.0.0.1, a client CA with a leaf, and an unrelated CA; PEM files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        server_ca, client_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
        server = server_ca.issue_cert("127.0.0.1", "localhost")
        client = client_ca.issue_cert("client@example.test")
        stranger = other_ca.issue_cert("stranger@example.test")
        self.server_ca = self._write("server-ca.pem", server_ca.cert_pem.bytes())
        self.client_ca = self._write("client-ca.pem", client_ca.cert_pem.bytes())
        self.other_ca = self._write("other-ca.pem", other_ca.cert_pem.bytes())
        self.server_cert = self._write("server.pem", b"".join(b.bytes() for b in server.cert_chain_pems))
        self.server_key = self._write("server-key.pem", server.private_key_pem.bytes())
        self.client_cert = self._write("client.pem", b"".join(b.bytes() for b in client.cert_chain_pems))
        self.client_key = self._write("client-key.pem", client.private_key_pem.bytes())
        self.stranger_cert = self._write("stranger.pem", b"".join(b.bytes() for b in stranger.cert_chain_pems))
        self.stranger_key = self._write("stranger-key.pem", stranger.private_key_pem.bytes())

    def _write(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def tls_node(tmp_path: Path, pki: Pki) -> Iterator[ServerThread]:
    with ServerThread(node_config(tmp_path / "data", channels=("p",), tls_cert=pki.server_cert,
                                  tls_key=pki.server_key)) as srv:
        yield srv


@pytest.fixture
def mtls_node(tmp_path: Path, pki: Pki) -> Iterator[ServerThread]:
    with ServerThread(node_config(tmp_path / "data", channels=("p",), tls_cert=pki.server_cert,
                                  tls_key=pki.server_key, tls_client_ca=pki.client_ca)) as srv:
        yield srv


def quick(addr: str, **kwargs: object) -> AsyncClient:
    # A refused handshake is UNAVAILABLE to gRPC: a short deadline turns it into a quick failure.
    return AsyncClient(addr, timeout=3.0, **kwargs)  # type: ignore[arg-type]


async def test_tls_serves_a_client_that_trusts_its_ca(tls_node: ServerThread, pki: Pki) -> None:
    async with quick(tls_node.address, tls_ca=pki.server_ca) as client:
        async with client.producer("p") as producer:
            sent = await producer.send("v", b"over tls")
        async with client.consumer("p", "v") as consumer:
            async for pack in consumer:
                if pack.end_ts >= sent.timetick:
                    assert [m.payload for m in pack.messages] == [b"over tls"]
                    break


async def test_tls_refuses_a_client_with_the_wrong_ca_and_a_plaintext_one(tls_node: ServerThread, pki: Pki) -> None:
    async with quick(tls_node.address, tls_ca=pki.other_ca) as wrong:
        with pytest.raises(UnavailableError):
            await wrong.describe_channels()
    async with quick(tls_node.address) as plaintext:
        with pytest.raises(UnavailableError):
            await plaintext.describe_channels()


async def test_mtls_needs_a_client_certificate_from_the_client_ca(mtls_node: ServerThread, pki: Pki) -> None:
    async with quick(mtls_node.address, tls_ca=pki.server_ca) as anonymous:
        with pytest.raises(UnavailableError):
            await anonymous.describe_channels()
    async with quick(mtls_node.address, tls_ca=pki.server_ca, tls_cert=pki.stranger_cert,
                     tls_key=pki.stranger_key) as stranger:
        with pytest.raises(UnavailableError):
            await stranger.describe_channels()
    async with quick(mtls_node.address, tls_ca=pki.server_ca, tls_cert=pki.client_cert,
                     tls_key=pki.client_key) as client:
        (desc,) = await client.describe_channels(["p"])
        assert desc.name == "p"


def test_sync_client_over_mtls(mtls_node: ServerThread, pki: Pki) -> None:
    with Client(mtls_node.address, tls_ca=pki.server_ca, tls_cert=pki.client_cert, tls_key=pki.client_key,
                timeout=3.0) as client:
        assert client.producer("p").send("v", b"x").message_id is not None


def test_client_tls_files_are_checked(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="tls_cert and tls_key go together"):
        AsyncClient("127.0.0.1:1", tls_cert=pki.client_cert)
    with pytest.raises(InvalidArgumentError, match="cannot read tls_ca"):
        AsyncClient("127.0.0.1:1", tls_ca=tmp_path / "absent.pem")


def test_server_tls_files_are_checked(pki: Pki, tmp_path: Path) -> None:
    srv = ServerThread(node_config(tmp_path / "data", tls_cert=tmp_path / "absent.pem", tls_key=pki.server_key))
    try:
        with pytest.raises(InvalidArgumentError, match="cannot read tls_cert"):
            srv.start()
    finally:
        srv.stop()


def _garbage(root: Path, name: str, data: bytes) -> Path:
    path = root / name
    path.write_bytes(data)
    return path


BROKEN_CERTIFICATE = b"-----BEGIN CERTIFICATE-----\nTUlJQm5vdCBhIGNlcnRpZmljYXRl\n-----END CERTIFICATE-----\n"

# (what is wrong, the files (cert, key, client CA) from the Pki and the test's dir, the file the error
# names, what it says)
BAD_TLS: list[tuple[str, Any, str, str]] = [
    ("key of another certificate", lambda p, d: (p.server_cert, p.client_key, None), "key", "does not match"),
    ("garbage certificate", lambda p, d: (_garbage(d, "c.pem", b"hello\n"), p.server_key, None), "cert",
     "holds no PEM certificate"),
    ("certificate that does not parse", lambda p, d: (_garbage(d, "c.pem", BROKEN_CERTIFICATE), p.server_key, None),
     "cert", "does not parse"),
    ("empty key file", lambda p, d: (p.server_cert, _garbage(d, "k.pem", b""), None), "key", "is empty"),
    ("garbage key", lambda p, d: (p.server_cert, _garbage(d, "k.pem", b"not a key\n"), None), "key",
     "holds no PEM private key"),
    ("garbage client CA", lambda p, d: (p.server_cert, p.server_key, _garbage(d, "ca.pem", b"junk\n")), "ca",
     "holds no PEM certificate"),
    ("client CA that does not parse",
     lambda p, d: (p.server_cert, p.server_key, _garbage(d, "ca.pem", BROKEN_CERTIFICATE)), "ca", "does not parse"),
    ("certificate and key swapped", lambda p, d: (p.server_key, p.server_cert, None), "cert", "swapped"),
]


@pytest.mark.parametrize(("case", "files", "named", "problem"), BAD_TLS, ids=[c[0] for c in BAD_TLS])
def test_bad_tls_material_refuses_to_start_naming_the_file(
        pki: Pki, tmp_path: Path, case: str, files: Any, named: str, problem: str) -> None:
    cert, key, ca = files(pki, tmp_path)
    srv = ServerThread(node_config(tmp_path / "data", tls_cert=cert, tls_key=key, tls_client_ca=ca))
    try:
        with pytest.raises(InvalidArgumentError) as refused:
            srv.start()
    finally:
        srv.stop()
    message = str(refused.value)
    path = {"cert": cert, "key": key, "ca": ca}[named]
    assert str(path) in message and problem in message, message
    assert "cannot listen" not in message
    assert not (tmp_path / "data").exists(), "refused before the data dir is touched"


def test_a_bad_key_ends_serve_with_a_message_naming_it(pki: Pki, tmp_path: Path) -> None:
    """The process: exit 1, the file and the problem on stderr, not a failure to listen."""
    env = dict(os.environ, PYTHONPATH=str(REPO), GRPC_VERBOSITY="ERROR")
    done = subprocess.run(
        [sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(tmp_path / "data"), "--listen",
         "127.0.0.1:0", "--metrics-listen", "", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.client_key)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert str(pki.client_key) in done.stderr and "does not match" in done.stderr, done.stderr
    assert "cannot listen" not in done.stderr


# --- protected mode ------------------------------------------------------------------------------

def test_loopback_addresses() -> None:
    assert all(is_loopback(a) for a in ("127.0.0.1:0", "localhost:1", "[::1]:2", "127.5.6.7:3"))
    assert not any(is_loopback(a) for a in ("0.0.0.0:0", ":19530", "[::]:1", "10.0.0.1:1", "node.example:1"))


def start_refused(config: object) -> StreamingError:
    srv = ServerThread(config)  # type: ignore[arg-type]
    try:
        with pytest.raises(StreamingError) as refused:
            srv.start()
    finally:
        srv.stop()
    return refused.value


def test_non_loopback_without_auth_refuses_to_start(tmp_path: Path) -> None:
    err = start_refused(node_config(tmp_path / "data", listen="0.0.0.0:0"))
    assert isinstance(err, InvalidArgumentError)
    assert "--allow-unauthenticated" in str(err) and "STREAMINGNODE_ALLOW_UNAUTHENTICATED" in str(err)
    assert not (tmp_path / "data").exists(), "refused before the data dir is touched"


@pytest.mark.parametrize("secure", ["allow_unauthenticated", "auth_tokens", "tls_client_ca"])
def test_non_loopback_with_auth_or_the_flag_starts(tmp_path: Path, pki: Pki, secure: str) -> None:
    options: dict[str, dict[str, object]] = {
        "allow_unauthenticated": {"allow_unauthenticated": True},
        "auth_tokens": {"auth_tokens": _empty_tokens(tmp_path)},
        "tls_client_ca": {"tls_cert": pki.server_cert, "tls_key": pki.server_key, "tls_client_ca": pki.client_ca},
    }
    extra = options[secure]
    with ServerThread(node_config(tmp_path / "data", listen="0.0.0.0:0", **extra)) as srv:
        assert srv.address.startswith("127.0.0.1:")


def _empty_tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text("")
    return path
