"""A throwaway PKI for local TLS servers: a CA and one server certificate, made at run time."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class LocalPki:
    ca_file: Path  # the CA certificate (PEM): what a client adds to its trust store
    cert_file: Path  # the server certificate (PEM)
    key_file: Path  # the server's private key (PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_test_pki(directory: str | Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                  days: int = 30) -> LocalPki:
    """Write ca.pem, server.pem and server.key into `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("appliance test CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0])).issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pki = LocalPki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    pki.key_file.chmod(0o600)
    return pki


def make_p8(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """A fresh APNs-style signing key written as a .p8 file (PEM PKCS#8, P-256); returns the key."""
    key = ec.generate_private_key(ec.SECP256R1())
    path = Path(path)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return key


def existing_pki(directory: str | Path, hosts: tuple[str, ...], min_days: int = 1) -> LocalPki | None:
    """The PKI `make_test_pki` wrote into `directory` earlier, when its certificate is still valid
    for `min_days` more days and names every one of `hosts`; else None."""
    directory = Path(directory)
    pki = LocalPki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    try:
        cert = x509.load_pem_x509_certificate(pki.cert_file.read_bytes())
        x509.load_pem_x509_certificate(pki.ca_file.read_bytes())
        serialization.load_pem_private_key(pki.key_file.read_bytes(), None)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return None
    have = {str(n) for n in names.get_values_for_type(x509.DNSName)}
    have |= {str(a) for a in names.get_values_for_type(x509.IPAddress)}
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    if left < datetime.timedelta(days=min_days) or not set(hosts) <= have:
        return None
    return pki
