"""The certificates the operator issues itself where no cert-manager issuer is named: a CA per fleet, and
from it the listeners' server certificates and the client certificates of MqttUsers of type tls.

Pure functions over PEM bytes and a clock, so issuance and renewal decisions are unit-tested without a
cluster. Keys are ECDSA P-256 (what cert-manager's ECDSA default gives); a renewal makes a new key, as
cert-manager's rotationPolicy Always does, so a leaked key ends with its certificate.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=3650)
MAX_COMMON_NAME = 64  # X.509's upper bound (RFC 5280 ub-common-name)
#: a certificate's notBefore is this far in the past, for clocks of the cluster slightly behind ours
BACKDATE = dt.timedelta(minutes=5)

Usage = Literal["server", "client"]


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class Wanted:
    """A certificate as it should be: who it names, for what, and for how long."""

    common_name: str
    usage: Usage
    duration: float  # seconds of validity
    renew_before: float  # seconds before the end at which it is renewed
    dns_names: tuple[str, ...] = field(default=())


def short_name(text: str) -> str:
    """`text` as a common name: cut to MAX_COMMON_NAME, and made unique with a digest when cut."""
    if len(text) <= MAX_COMMON_NAME:
        return text
    return f"{text[: MAX_COMMON_NAME - 9]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _key_usage(**on: bool) -> x509.KeyUsage:
    """Digital signature, and what `on` adds."""
    flags = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement", "key_cert_sign",
         "crl_sign", "encipher_only", "decipher_only"),
        False,
    )  # fmt: skip
    return x509.KeyUsage(digital_signature=True, **(flags | on))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(common_name: str, now: dt.datetime) -> KeyPair:
    """A self-signed CA that signs only end-entity certificates (pathlen 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: KeyPair, wanted: Wanted, now: dt.datetime) -> KeyPair:
    """A new key and its certificate, signed by `ca`, valid from now for `wanted.duration`."""
    ca_cert = ca.cert
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if wanted.usage == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, wanted.common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(seconds=wanted.duration))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(key_encipherment=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if wanted.dns_names:
        names = [x509.DNSName(n) for n in wanted.dns_names]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def renewal_due(cert_pem: bytes | None, ca: KeyPair, wanted: Wanted, now: dt.datetime) -> dt.datetime:
    """When the certificate in `cert_pem` must be issued again: now if there is none, it is unreadable,
    `ca` did not sign it, or it names or serves otherwise than `wanted` or was issued for another
    duration; else `renew_before` ahead of its end."""
    if cert_pem is None:
        return now
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(ca.cert)
    except (ValueError, TypeError, InvalidSignature):
        return now
    if _describe(cert) != (wanted.common_name, wanted.usage, frozenset(wanted.dns_names)):
        return now
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if abs((end - start - BACKDATE).total_seconds() - wanted.duration) > 1:
        return now
    return end - dt.timedelta(seconds=wanted.renew_before)


def _describe(cert: x509.Certificate) -> tuple[str, Usage | None, frozenset[str]]:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(cns[0].value) if cns else ""
    usage: Usage | None = None
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        usage = "server" if ExtendedKeyUsageOID.SERVER_AUTH in eku else "client"
    except x509.ExtensionNotFound:
        pass
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = frozenset(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = frozenset()
    return cn, usage, dns


def not_after(cert_pem: bytes) -> dt.datetime | None:
    try:
        return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
    except ValueError:
        return None
