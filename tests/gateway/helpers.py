"""Gateway test helpers: an APNs signing key, a test App Attest CA on disk, a [gateway] config."""

from __future__ import annotations

import secrets
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from appliance.testing.attester import SoftwareAttester, TestCA
from tests.leaks import sensitive

APP_ID = "TEAM123456.com.example.app"
TOPIC = "com.example.app"
PROFILE = "buzz-ios-production"
SANDBOX = "buzz-ios-sandbox"


def write_p8(path: Path) -> Path:
    """An APNs token-signing key in Apple's .p8 form (PKCS#8 PEM, P-256)."""
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    sensitive(key.private_numbers().private_value.to_bytes(32, "big"),
              *path.read_text().splitlines()[1:-1])  # the scalar, and each base64 line of the PEM
    return path


def token() -> str:
    """A fresh APNs device token, lowercase hex."""
    value = secrets.token_hex(32)
    sensitive(value)
    return value


class GatewaySetup:
    """Files a gateway test needs: test CA root, .p8 key; renders the [gateway] table."""

    def __init__(self, tmp: Path, *, ca: TestCA | None = None):
        self.tmp = tmp
        self.ca = ca or TestCA()
        self.root_path = tmp / "test-root.pem"
        self.root_path.write_bytes(self.ca.root_pem)
        self.p8 = write_p8(tmp / "AuthKey_ABC123DEFG.p8")

    def attester(self, environment: str = "production", app_id: str = APP_ID) -> SoftwareAttester:
        return SoftwareAttester(self.ca, app_id, environment)

    def profile_toml(self, pid: str = PROFILE, *, apns_url: str | None = None, ca_file: str | None = None,
                     environment: str | None = None) -> str:
        env = environment or ("production" if pid == PROFILE else "sandbox")
        lines = ["[[gateway.profiles]]", f'id = "{pid}"', f'app_id = "{APP_ID}"', f'environment = "{env}"',
                 f'topic = "{TOPIC}"', 'team_id = "TEAM123456"', 'key_id = "ABC123DEFG"', f'key_file = "{self.p8}"']
        if apns_url:
            lines.append(f'apns_url = "{apns_url}"')
        if ca_file:
            lines.append(f'ca_file = "{ca_file}"')
        return "\n".join(lines) + "\n"

    def config(self, public_url: str = "", *, profiles: str | None = None, extra: str = "", top: str = "") -> str:
        body = [top, "[gateway]", "enabled = true", f'app_attest_root_ca = "{self.root_path}"']
        if public_url:
            body.append(f'public_url = "{public_url}"')
        body.append(extra)
        body.append(self.profile_toml() if profiles is None else profiles)
        return "\n".join(body) + "\n"


def corrupt_intermediate(der: bytes, how: str) -> bytes:
    """An intermediate certificate that still loads but breaks once looked into: its BasicConstraints
    `ca` flag as a non-DER boolean, or its key on a curve nobody supports (OID 1.3.132.0.99)."""
    old, new = {"basic constraints": ("30060101ff", "3006010101"),
                "curve": ("06052b81040022", "06052b81040063")}[how]
    at = der.index(bytes.fromhex(old))
    return der[:at] + bytes.fromhex(new) + der[at + len(old) // 2:]
