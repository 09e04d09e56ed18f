"""The draft multi-device MLS extensions (marmot-multi-device.md; bytes are draft placeholders):

- `marmot.multi-device.v1` (0xf2f0), a GroupContext extension, the group-level signaling gate;
- `marmot.encrypted-device-name.v1` (0xf2ef), an optional LeafNode extension: a device label
  NIP-44-encrypted to the account's own key. Display metadata only, never identity or authorization.

Neither body is defined by the draft; the layouts below are ours (spec notes M7, M8).
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.nostr import nip44
from appliance.nostr.keys import public_key

from .errors import ComponentError, DeviceLabelError
from .wire import Reader, quic_vector, uint16

__all__ = [
    "MULTI_DEVICE_VERSION",
    "MAX_DEVICE_LABEL_CHARS",
    "MultiDeviceExtension",
    "EncryptedDeviceName",
]

MULTI_DEVICE_VERSION = 1
# The label is for a picker in a UI; 64 characters as MDK's MIP-06 code bounds it.
MAX_DEVICE_LABEL_CHARS = 64
# Upper bound on the NIP-44 payload a 64-character label can produce (4 UTF-8 bytes each -> 256 bytes
# plaintext -> 324 bytes raw -> 432 base64 characters); anything longer is refused before decrypting.
_MAX_PAYLOAD = nip44.max_payload_len(4 * MAX_DEVICE_LABEL_CHARS)


@dataclass(frozen=True)
class MultiDeviceExtension:
    """`struct { uint16 version; } MarmotMultiDeviceV1;` with version 1: exactly two bytes, 00 01."""

    version: int = MULTI_DEVICE_VERSION

    def encode(self) -> bytes:
        return uint16(self.version)

    @classmethod
    def decode(cls, data: bytes) -> "MultiDeviceExtension":
        r = Reader(data, "marmot.multi-device.v1")
        version = r.uint16()
        r.done()
        if version != MULTI_DEVICE_VERSION:
            raise ComponentError(f"marmot.multi-device.v1 version {version} is not 1", "component.multi_device.version")
        return cls(version)

    def to_json(self) -> dict:
        return {"extension": "0xf2f0", "name": "marmot.multi-device.v1", "version": self.version}


@dataclass(frozen=True)
class EncryptedDeviceName:
    """`struct { opaque nip44_payload<1..V>; } MarmotEncryptedDeviceNameV1;`

    `nip44_payload` is the ASCII base64 NIP-44 v2 payload (as NIP-44 writes it), encrypted with the
    conversation key of the account's secret key and its own public key.
    """

    payload: str

    def encode(self) -> bytes:
        return quic_vector(self.payload.encode("ascii"))

    @classmethod
    def decode(cls, data: bytes) -> "EncryptedDeviceName":
        r = Reader(data, "marmot.encrypted-device-name.v1")
        raw = r.vector(1, _MAX_PAYLOAD, field="nip44_payload")
        r.done()
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise DeviceLabelError("device name payload is not ASCII base64", "device_label.encoding") from None
        return cls(text)

    @classmethod
    def seal(cls, secret_hex: str, label: str, *, nonce: bytes | None = None) -> "EncryptedDeviceName":
        """Encrypt a label to the account's own key."""
        if not isinstance(label, str) or not label:
            raise DeviceLabelError("device label is empty", "device_label.empty")
        if len(label) > MAX_DEVICE_LABEL_CHARS:
            raise DeviceLabelError(f"device label is longer than {MAX_DEVICE_LABEL_CHARS} characters",
                                   "device_label.too_long")
        try:
            key = nip44.get_conversation_key(secret_hex, public_key(secret_hex))
            return cls(nip44.encrypt(label, key, nonce))
        except (nip44.Nip44Error, ValueError) as exc:
            raise DeviceLabelError(f"cannot encrypt device label: {exc}", "device_label.encrypt") from None

    def open(self, secret_hex: str) -> str:
        """Decrypt with the account's secret key; any other key fails (MAC)."""
        try:
            key = nip44.get_conversation_key(secret_hex, public_key(secret_hex))
            label = nip44.decrypt(self.payload, key, max_plaintext=4 * MAX_DEVICE_LABEL_CHARS)
        except (nip44.Nip44Error, ValueError) as exc:
            raise DeviceLabelError(f"cannot decrypt device label: {exc}", "device_label.decrypt") from None
        if len(label) > MAX_DEVICE_LABEL_CHARS:
            raise DeviceLabelError("decrypted device label is too long", "device_label.too_long")
        return label

    def to_json(self) -> dict:
        return {"extension": "0xf2ef", "name": "marmot.encrypted-device-name.v1", "nip44_payload": self.payload}
