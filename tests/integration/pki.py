"""A throwaway PKI for TLS tests: a CA, a server certificate for 127.0.0.1 and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HOST = "127.0.0.1"  # the certificate is for this address


def _cert(subject: str, issuer_key, issuer_name, key, *, ca: bool = False, server: bool = False):
    now = datetime.datetime.now(datetime.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(d: Path) -> dict:
    """{"server": (crt, key), "client": (crt, key), "ca": crt}: PEM file paths under d."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetmq test CA")])
    ca = _cert("fleetmq test CA", ca_key, ca_name, ca_key, ca=True)
    files = {}
    for name, server in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, ca_key, ca_name, key, server=server)
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        files[name] = (str(d / f"{name}.crt"), str(d / f"{name}.key"))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["ca"] = str(d / "ca.crt")
    return files
