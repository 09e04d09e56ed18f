"""A software App Attest attester: a test CA, P-256 keys, CBOR attestation and assertion objects.

It produces exactly what an iPhone produces (Apple, "Validating apps that connect to your server"),
signed by a locally generated root and intermediate instead of Apple's: a gateway configured with
`app_attest_root_ca = <TestCA.root_pem path>` verifies them end to end, and one still trusting
Apple's root refuses them.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
from dataclasses import dataclass, field

import cbor2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from appliance.gateway.attest import AAGUID, NONCE_OID, encode_nonce_extension

FLAGS = 0x40  # what real devices set (no UP/UV)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Appliance Test CA")])


def _ca_cert(subject: str, key, issuer: str, issuer_key, not_before, not_after) -> x509.Certificate:
    return (x509.CertificateBuilder()
            .subject_name(_name(subject)).issuer_name(_name(issuer))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None if subject == issuer else 0),
                           critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(issuer_key, hashes.SHA384()))


class TestCA:
    """A root and an intermediate (P-384, as Apple's), valid from `not_before` for `days`."""

    __test__ = False  # not a pytest class

    def __init__(self, *, not_before: datetime.datetime | None = None, days: int = 3650, name: str = "Test"):
        start = not_before or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
        end = start + datetime.timedelta(days=days)
        self.root_key = ec.generate_private_key(ec.SECP384R1())
        self.root = _ca_cert(f"{name} App Attestation Root CA", self.root_key,
                             f"{name} App Attestation Root CA", self.root_key, start, end)
        self.inter_key = ec.generate_private_key(ec.SECP384R1())
        self.inter = _ca_cert(f"{name} App Attestation CA 1", self.inter_key,
                              f"{name} App Attestation Root CA", self.root_key, start, end)
        self.not_before, self.not_after = start, end

    @property
    def root_pem(self) -> bytes:
        return self.root.public_bytes(serialization.Encoding.PEM)

    def credential_cert(self, public_key, nonce: bytes, days: int = 3) -> x509.Certificate:
        # Inside the CA's own window (an expired test CA still issues certificates of its time).
        now = min(max(datetime.datetime.now(datetime.timezone.utc), self.not_before),
                  self.not_after - datetime.timedelta(days=days))
        return (x509.CertificateBuilder()
                .subject_name(_name(hashlib.sha256(nonce).hexdigest())).issuer_name(self.inter.subject)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(min(now + datetime.timedelta(days=days), self.not_after))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.UnrecognizedExtension(NONCE_OID, encode_nonce_extension(nonce)), critical=False)
                .sign(self.inter_key, hashes.SHA256()))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class SoftwareAttester:
    """One app install's App Attest key: `attest` once (enrollment), then `assert_` per request."""

    ca: TestCA
    app_id: str
    environment: str = "production"  # or "development" (APNs sandbox)
    counter: int = 0
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    @property
    def point(self) -> bytes:
        return self.key.public_key().public_bytes(serialization.Encoding.X962,
                                                  serialization.PublicFormat.UncompressedPoint)

    @property
    def key_id(self) -> bytes:
        return hashlib.sha256(self.point).digest()

    @property
    def key_id_b64(self) -> str:
        return _b64(self.key_id)

    def auth_data(self) -> bytes:
        point = self.point
        cose = cbor2.dumps({1: 2, 3: -7, -1: 1, -2: point[1:33], -3: point[33:]})
        return (hashlib.sha256(self.app_id.encode()).digest() + bytes([FLAGS]) + (0).to_bytes(4, "big")
                + AAGUID[self.environment] + len(self.key_id).to_bytes(2, "big") + self.key_id + cose)

    def attest(self, client_data: bytes, *, auth_data: bytes | None = None) -> str:
        """The attestation object (standard base64) for `client_data` (the enrollment transcript)."""
        auth_data = self.auth_data() if auth_data is None else auth_data
        nonce = hashlib.sha256(auth_data + hashlib.sha256(client_data).digest()).digest()
        cred = self.ca.credential_cert(self.key.public_key(), nonce)
        obj = {"fmt": "apple-appattest",
               "attStmt": {"x5c": [cred.public_bytes(serialization.Encoding.DER),
                                   self.ca.inter.public_bytes(serialization.Encoding.DER)],
                           "receipt": b"software attester: no receipt"},
               "authData": auth_data}
        return _b64(cbor2.dumps(obj))

    def assert_(self, client_data: bytes, *, counter: int | None = None) -> str:
        """An assertion (standard base64) over SHA-256(client_data); the counter goes up by one."""
        self.counter = self.counter + 1 if counter is None else counter
        auth_data = hashlib.sha256(self.app_id.encode()).digest() + bytes([FLAGS]) + self.counter.to_bytes(4, "big")
        nonce = hashlib.sha256(auth_data + hashlib.sha256(client_data).digest()).digest()
        signature = self.key.sign(nonce, ec.ECDSA(hashes.SHA256()))
        return _b64(cbor2.dumps({"signature": signature, "authenticatorData": auth_data}))
