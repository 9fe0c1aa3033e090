"""The node's TLS material, checked before gRPC is given it.

gRPC takes PEM bytes and says nothing about them until the port is bound, and then only that the
port could not be: a key that belongs to another certificate, a certificate file that holds garbage,
an empty key file, a client CA that does not parse, or the certificate and the key swapped all ended
the same way, naming no file.  Here each file is read and parsed with the standard library's ``ssl``
(OpenSSL), and the key is matched with the certificate, so that the node refuses to start with an
error (INVALID_ARGUMENT naming the setting) that names the file and what is wrong with it.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from wal.errors import InvalidArgumentError

_LABEL = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """What gRPC's server credentials are made of, checked: PEM bytes as read from the files."""

    chain: bytes
    key: bytes
    client_ca: bytes | None


class _EncryptedKeyError(Exception):
    """Raised by the password callback: OpenSSL asked for a passphrase, so the key is encrypted."""


def _no_password() -> str:
    raise _EncryptedKeyError


def _bad(field: str, path: Path, problem: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{field} file {str(path)[:300]!r} {problem}", field=field)


def _read(path: Path, field: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {field} {str(path)[:300]!r}: {exc.strerror}", field=field) from None
    if not data.strip():
        raise _bad(field, path, "is empty")
    return data


def _labels(data: bytes) -> set[str]:
    """The kinds of the PEM blocks in ``data`` ("CERTIFICATE", "PRIVATE KEY", "RSA PRIVATE KEY", ...)."""
    return {m.group(1).decode() for m in _LABEL.finditer(data)}


def _has_key(labels: set[str]) -> bool:
    return any(label.endswith("PRIVATE KEY") for label in labels)


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc)[:200]


def _certificates(data: bytes, path: Path, field: str, *, swapped_with: str | None = None) -> None:
    """Refuse ``data`` unless it holds PEM certificates that all parse."""
    labels = _labels(data)
    if "CERTIFICATE" not in labels:
        if _has_key(labels) and swapped_with is not None:
            raise _bad(field, path, f"holds a private key, not a certificate: are {field} and {swapped_with} swapped?")
        raise _bad(field, path, "holds no PEM certificate (a '-----BEGIN CERTIFICATE-----' block)")
    try:
        # Parses every certificate block (a private key block beside them is passed over).
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii", "replace"))
    except ssl.SSLError as exc:
        raise _bad(field, path, f"holds a certificate that does not parse ({_reason(exc)})") from None


def _private_key(data: bytes, path: Path, field: str) -> None:
    labels = _labels(data)
    if not _has_key(labels):
        if "CERTIFICATE" in labels:
            raise _bad(field, path, "holds a certificate, not a private key: are tls_cert and tls_key swapped?")
        raise _bad(field, path, "holds no PEM private key (a '-----BEGIN PRIVATE KEY-----' block)")
    if "ENCRYPTED PRIVATE KEY" in labels or b"Proc-Type: 4,ENCRYPTED" in data:
        raise _bad(field, path, "holds an encrypted private key: the node takes no passphrase, give it the key "
                                "unencrypted (readable by the node's user only)")


def load_tls(cert: Path, key: Path, client_ca: Path | None) -> TlsMaterial:
    """Read and check the server's certificate chain, its private key and the client CA bundle."""
    chain = _read(cert, "tls_cert")
    key_pem = _read(key, "tls_key")
    ca = _read(client_ca, "tls_client_ca") if client_ca is not None else None
    _certificates(chain, cert, "tls_cert", swapped_with="tls_key")
    _private_key(key_pem, key, "tls_key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_no_password)
    except _EncryptedKeyError:
        raise _bad("tls_key", key, "holds an encrypted private key: the node takes no passphrase") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise _bad("tls_key", key, "holds a private key that does not match the certificate of tls_cert "
                       f"{str(cert)[:300]!r} (the chain's first certificate must be the key's)") from None
        raise _bad("tls_key", key, "holds a private key that does not parse, or that OpenSSL cannot use with "
                   f"tls_cert {str(cert)[:300]!r} ({_reason(exc)})") from None
    except OSError as exc:  # the files went away since they were read
        raise _bad("tls_key", key, f"cannot be loaded with tls_cert {str(cert)[:300]!r}: {exc.strerror}") from None
    if ca is not None and client_ca is not None:
        _certificates(ca, client_ca, "tls_client_ca")
    return TlsMaterial(chain, key_pem, ca)


__all__ = ["TlsMaterial", "load_tls"]
