"""Apple App Attest verification: attestation objects (enrollment) and assertions (every other route).

Attestation (Apple, "Validating apps that connect to your server", steps 1-9), all required:

1. CBOR map {fmt: "apple-appattest", attStmt: {x5c: [credCert, intermediate], receipt}, authData};
2. credCert <- intermediate <- a configured root: each link's issuer name and signature, every
   certificate inside its validity window at `now` (injectable), the intermediate a CA. Verified
   link by link: generic web-PKI verifiers reject Apple's chain (leaf without AKI, Apple EKU);
3. nonce = SHA-256(authData || SHA-256(clientData)) equals the credCert extension
   1.2.840.113635.100.8.2 (SEQUENCE { [1] { OCTET STRING nonce } });
4. SHA-256(credCert's uncompressed P-256 point) equals the key id;
5. authData RP ID hash equals SHA-256(app id); 6. signCount is 0; 7. AAGUID is `appattest` + 7
   zero bytes (production) or `appattestdevelop` (development, the APNs sandbox profile);
8. credentialId equals the key id, and the COSE key that follows is the credCert's key
   (newer iOS appends a CBOR map after it without the ED flag: trailing bytes are tolerated).

Assertion: CBOR map of exactly {signature, authenticatorData}; authenticatorData is 37 bytes, or
longer with the ED flag and exactly one CBOR extension map; its RP ID hash equals SHA-256(app id);
the ECDSA P-256/SHA-256 signature over nonce = SHA-256(authenticatorData || clientDataHash)
verifies with the installation's key; the counter is returned for the caller's strictly-increasing
check (done atomically in the store). Every failure is `AttestationFailed` (one class: the HTTP
answer never says which step failed).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import cbor2
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

NONCE_OID = x509.ObjectIdentifier("1.2.840.113635.100.8.2")
AAGUID = {
    "production": b"appattest" + b"\x00" * 7,
    "development": b"appattestdevelop",
}
FLAG_AT = 0x40  # attested credential data included
FLAG_ED = 0x80  # extension data included
MAX_ATTESTATION_BYTES = 16384
MAX_ASSERTION_BYTES = 1024

#: Apple App Attestation Root CA (SHA-256 of DER 1cb9823b...c932, valid 2020-03-18 to 2045-03-15)
BUNDLED_ROOT = "apple_app_attestation_root_ca.pem"


class AttestationFailed(Exception):
    """An attestation or assertion that does not verify; str() is for DEBUG logs only."""


def load_roots(path: str | Path | None = None) -> tuple[x509.Certificate, ...]:
    """Trust anchors from a PEM file (one or more certificates); default: Apple's bundled root."""
    if path is None:
        data = resources.files("appliance.gateway").joinpath(BUNDLED_ROOT).read_bytes()
    else:
        data = Path(path).read_bytes()
    roots = tuple(x509.load_pem_x509_certificates(data))
    if not roots:
        raise ValueError("no certificate in the file")
    return roots


def environment_of_profile(apns_environment: str) -> str:
    """App Attest environment of an APNs environment: sandbox builds attest in development."""
    return "production" if apns_environment == "production" else "development"


@dataclass(frozen=True)
class AttestedKey:
    key_id: bytes
    public_key: bytes  # uncompressed SEC1 point, 65 bytes


def _utc(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _check_validity(cert: x509.Certificate, now: datetime, what: str) -> None:
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise AttestationFailed(f"{what} certificate outside its validity window")


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _der_read(data: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """One DER TLV with the expected tag at `pos`: (content, end). Definite lengths only."""
    if pos + 2 > len(data) or data[pos] != tag:
        raise AttestationFailed("malformed nonce extension")
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if n == 0 or n > 2 or pos + n > len(data):
            raise AttestationFailed("malformed nonce extension")
        length = int.from_bytes(data[pos:pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise AttestationFailed("malformed nonce extension")
    return data[pos:pos + length], pos + length


def nonce_extension_value(der: bytes) -> bytes:
    """The nonce from the DER of extension 1.2.840.113635.100.8.2: SEQUENCE { [1] { OCTET STRING } }."""
    seq, end = _der_read(der, 0, 0x30)
    if end != len(der):
        raise AttestationFailed("trailing bytes in nonce extension")
    tagged, end = _der_read(seq, 0, 0xA1)
    if end != len(seq):
        raise AttestationFailed("unexpected members in nonce extension")
    octets, end = _der_read(tagged, 0, 0x04)
    if end != len(tagged):
        raise AttestationFailed("unexpected members in nonce extension")
    return octets


def encode_nonce_extension(nonce: bytes) -> bytes:
    """DER of the nonce extension (for the software attester)."""
    octets = b"\x04" + bytes([len(nonce)]) + nonce
    tagged = b"\xa1" + bytes([len(octets)]) + octets
    return b"\x30" + bytes([len(tagged)]) + tagged


def _uncompressed_point(cert: x509.Certificate) -> bytes:
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise AttestationFailed("credential certificate key is not P-256")
    return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


def _cbor_map(data: bytes, what: str) -> dict:
    try:
        obj = cbor2.loads(data)
    except Exception:  # cbor2 raises several types for malformed input
        raise AttestationFailed(f"{what} is not CBOR") from None
    if not isinstance(obj, dict):
        raise AttestationFailed(f"{what} is not a CBOR map")
    return obj


def _cose_p256(cose: object) -> bytes:
    """Uncompressed point of a COSE EC2 P-256 key map {1: 2, 3: -7, -1: 1, -2: x, -3: y}."""
    if not isinstance(cose, dict) or cose.get(1) != 2 or cose.get(-1) != 1 or cose.get(3, -7) != -7:
        raise AttestationFailed("credential public key is not a COSE P-256 key")
    x, y = cose.get(-2), cose.get(-3)
    if not isinstance(x, bytes) or not isinstance(y, bytes) or len(x) != 32 or len(y) != 32:
        raise AttestationFailed("credential public key coordinates malformed")
    return b"\x04" + x + y


def _only_attestation_failures(check, *args):
    """Run one verification so that every refusal is AttestationFailed. Certificates parse their
    extensions and keys lazily, so a broken one (a non-DER BasicConstraints, an unknown curve in an
    intermediate not yet checked against the root) raises ValueError, UnsupportedAlgorithm and the
    like from deep inside: still a bad attestation (401), never a server fault."""
    try:
        return check(*args)
    except AttestationFailed:
        raise
    except Exception as exc:
        raise AttestationFailed(f"malformed object ({type(exc).__name__}: {exc})") from None


class Verifier:
    """App Attest checks for one app id and environment against configured roots."""

    def __init__(self, app_id: str, environment: str, roots: tuple[x509.Certificate, ...]):
        if environment not in AAGUID:
            raise ValueError(f"unknown App Attest environment {environment!r}")
        self.app_id = app_id
        self.environment = environment
        self.rp_id_hash = hashlib.sha256(app_id.encode("utf-8")).digest()
        self.roots = roots

    # -- enrollment ----------------------------------------------------------------------------

    def verify_attestation(self, attestation: bytes, key_id: bytes, client_data: bytes, now: int) -> AttestedKey:
        """The attested key, or AttestationFailed (whatever part of the object is malformed)."""
        return _only_attestation_failures(self._verify_attestation, attestation, key_id, client_data, now)

    def _verify_attestation(self, attestation: bytes, key_id: bytes, client_data: bytes, now: int) -> AttestedKey:
        if not 1 <= len(attestation) <= MAX_ATTESTATION_BYTES:
            raise AttestationFailed("attestation size")
        obj = _cbor_map(attestation, "attestation")
        if set(obj) != {"fmt", "attStmt", "authData"} or obj["fmt"] != "apple-appattest":
            raise AttestationFailed("not an apple-appattest object")
        stmt, auth_data = obj["attStmt"], obj["authData"]
        if not isinstance(stmt, dict) or not isinstance(auth_data, bytes):
            raise AttestationFailed("attStmt/authData types")
        x5c = stmt.get("x5c")
        if not isinstance(x5c, list) or len(x5c) != 2 or not all(isinstance(c, bytes) for c in x5c):
            raise AttestationFailed("x5c must hold the credential and intermediate certificates")
        if not isinstance(stmt.get("receipt"), bytes):
            raise AttestationFailed("receipt missing")
        try:
            cred = x509.load_der_x509_certificate(x5c[0])
            inter = x509.load_der_x509_certificate(x5c[1])
        except ValueError:
            raise AttestationFailed("unparseable certificate") from None
        self._verify_chain(cred, inter, _utc(now))
        # Step 3: the nonce binds authData and the exact clientData (our transcript).
        nonce = hashlib.sha256(auth_data + hashlib.sha256(client_data).digest()).digest()
        try:
            ext = cred.extensions.get_extension_for_oid(NONCE_OID).value
        except x509.ExtensionNotFound:
            raise AttestationFailed("nonce extension missing") from None
        if not isinstance(ext, x509.UnrecognizedExtension) or nonce_extension_value(ext.value) != nonce:
            raise AttestationFailed("nonce mismatch")
        point = _uncompressed_point(cred)
        if hashlib.sha256(point).digest() != key_id:  # step 4
            raise AttestationFailed("key id mismatch")
        self._check_attested_auth_data(auth_data, key_id, point)
        return AttestedKey(key_id=key_id, public_key=point)

    def _verify_chain(self, cred: x509.Certificate, inter: x509.Certificate, now: datetime) -> None:
        try:
            cred.verify_directly_issued_by(inter)
        except (ValueError, TypeError, InvalidSignature):
            raise AttestationFailed("credential certificate not issued by the intermediate") from None
        if not _is_ca(inter):
            raise AttestationFailed("intermediate is not a CA")
        for root in self.roots:
            try:
                inter.verify_directly_issued_by(root)
            except (ValueError, TypeError, InvalidSignature):
                continue
            _check_validity(root, now, "root")
            break
        else:
            raise AttestationFailed("intermediate not issued by a configured root")
        _check_validity(inter, now, "intermediate")
        _check_validity(cred, now, "credential")

    def _check_attested_auth_data(self, auth_data: bytes, key_id: bytes, point: bytes) -> None:
        if len(auth_data) < 55:
            raise AttestationFailed("authData too short")
        if auth_data[:32] != self.rp_id_hash:  # step 5
            raise AttestationFailed("RP ID hash mismatch")
        if not auth_data[32] & FLAG_AT:
            raise AttestationFailed("no attested credential data")
        if int.from_bytes(auth_data[33:37], "big") != 0:  # step 6
            raise AttestationFailed("attestation counter is not 0")
        if auth_data[37:53] != AAGUID[self.environment]:  # step 7
            raise AttestationFailed("AAGUID of another environment")
        cred_len = int.from_bytes(auth_data[53:55], "big")
        if auth_data[55:55 + cred_len] != key_id or cred_len != len(key_id):  # step 8
            raise AttestationFailed("credential id mismatch")
        stream = io.BytesIO(auth_data[55 + cred_len:])
        try:
            cose = cbor2.CBORDecoder(stream).decode()  # trailing bytes tolerated (newer iOS)
        except Exception:
            raise AttestationFailed("credential public key is not CBOR") from None
        if _cose_p256(cose) != point:
            raise AttestationFailed("credential public key differs from the certificate")

    # -- assertions ------------------------------------------------------------------------------

    def verify_assertion(self, assertion: bytes, client_data: bytes, public_key: bytes) -> int:
        """The assertion's counter if its signature and RP id verify; the caller checks it increased."""
        return _only_attestation_failures(self._verify_assertion, assertion, client_data, public_key)

    def _verify_assertion(self, assertion: bytes, client_data: bytes, public_key: bytes) -> int:
        if not 1 <= len(assertion) <= MAX_ASSERTION_BYTES:
            raise AttestationFailed("assertion size")
        obj = _cbor_map(assertion, "assertion")
        if set(obj) != {"signature", "authenticatorData"}:
            raise AttestationFailed("assertion members")
        signature, auth_data = obj["signature"], obj["authenticatorData"]
        if not isinstance(signature, bytes) or not isinstance(auth_data, bytes) or len(auth_data) < 37:
            raise AttestationFailed("assertion member types")
        if len(auth_data) > 37:
            # Extension data is allowed only when flagged, and must be exactly one CBOR map.
            if not auth_data[32] & FLAG_ED:
                raise AttestationFailed("trailing authenticator data without the ED flag")
            stream = io.BytesIO(auth_data[37:])
            try:
                ext = cbor2.CBORDecoder(stream).decode()
            except Exception:
                raise AttestationFailed("malformed extension data") from None
            if not isinstance(ext, dict) or stream.tell() != len(auth_data) - 37:
                raise AttestationFailed("malformed extension data")
        if auth_data[:32] != self.rp_id_hash:
            raise AttestationFailed("RP ID hash mismatch")
        nonce = hashlib.sha256(auth_data + hashlib.sha256(client_data).digest()).digest()
        try:
            key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), public_key)
            key.verify(signature, nonce, ec.ECDSA(hashes.SHA256()))
        except (ValueError, InvalidSignature):
            raise AttestationFailed("assertion signature does not verify") from None
        return int.from_bytes(auth_data[33:37], "big")
