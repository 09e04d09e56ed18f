"""Key schedule (RFC 9420 §8): epoch secrets, PSK secret, transcript hashes, exporter."""

from __future__ import annotations

from dataclasses import dataclass

from . import crypto
from .codec import u16, vl
from .structs import PreSharedKeyID

ZERO = bytes(crypto.NH)
EXTERNAL_INIT_LABEL = b"MLS 1.0 external init secret"


@dataclass(frozen=True, repr=False)
class EpochSecrets:
    """One epoch's secrets (its repr names no value: they must not reach logs or tracebacks)."""

    joiner_secret: bytes
    welcome_secret: bytes
    epoch_secret: bytes
    sender_data_secret: bytes
    encryption_secret: bytes
    exporter_secret: bytes
    external_secret: bytes
    confirmation_key: bytes
    membership_key: bytes
    resumption_psk: bytes
    epoch_authenticator: bytes
    init_secret: bytes  # for the next epoch

    FIELDS = ("joiner_secret", "welcome_secret", "epoch_secret", "sender_data_secret", "encryption_secret",
              "exporter_secret", "external_secret", "confirmation_key", "membership_key", "resumption_psk",
              "epoch_authenticator", "init_secret")

    def __repr__(self) -> str:
        return "EpochSecrets(<redacted>)"

    def to_list(self) -> list[bytes]:
        return [getattr(self, f) for f in self.FIELDS]

    @classmethod
    def from_list(cls, values) -> "EpochSecrets":
        return cls(*values)

    def external_keypair(self) -> tuple[bytes, bytes]:
        return crypto.derive_keypair(self.external_secret)


def joiner_secret(init_secret: bytes, commit_secret: bytes, group_context: bytes) -> bytes:
    return crypto.expand_with_label(crypto.extract(init_secret, commit_secret), b"joiner", group_context, crypto.NH)


def from_joiner(joiner: bytes, psk_secret: bytes, group_context: bytes) -> EpochSecrets:
    member_prk = crypto.extract(joiner, psk_secret)
    welcome = crypto.derive_secret(member_prk, b"welcome")
    epoch = crypto.expand_with_label(member_prk, b"epoch", group_context, crypto.NH)
    d = crypto.derive_secret
    return EpochSecrets(
        joiner_secret=joiner,
        welcome_secret=welcome,
        epoch_secret=epoch,
        sender_data_secret=d(epoch, b"sender data"),
        encryption_secret=d(epoch, b"encryption"),
        exporter_secret=d(epoch, b"exporter"),
        external_secret=d(epoch, b"external"),
        confirmation_key=d(epoch, b"confirm"),
        membership_key=d(epoch, b"membership"),
        resumption_psk=d(epoch, b"resumption"),
        epoch_authenticator=d(epoch, b"authentication"),
        init_secret=d(epoch, b"init"),
    )


def advance(init_secret: bytes, commit_secret: bytes, psk_secret: bytes, group_context: bytes) -> EpochSecrets:
    return from_joiner(joiner_secret(init_secret, commit_secret, group_context), psk_secret, group_context)


def welcome_key_nonce(welcome_secret: bytes) -> tuple[bytes, bytes]:
    return (crypto.expand_with_label(welcome_secret, b"key", b"", crypto.NK),
            crypto.expand_with_label(welcome_secret, b"nonce", b"", crypto.NN))


def psk_secret(psks: list[tuple[PreSharedKeyID, bytes]]) -> bytes:
    """Chain the PSKs in order (§8.4); all-zero when there are none."""
    secret = ZERO
    count = len(psks)
    for index, (psk_id, psk) in enumerate(psks):
        label = psk_id.encode() + u16(index) + u16(count)
        extracted = crypto.extract(ZERO, psk)
        psk_input = crypto.expand_with_label(extracted, b"derived psk", label, crypto.NH)
        secret = crypto.extract(psk_input, secret)
    return secret


def exporter(exporter_secret: bytes, label: bytes, context: bytes, length: int) -> bytes:
    """MLS-Exporter(Label, Context, Length) (§8.5)."""
    return crypto.expand_with_label(crypto.derive_secret(exporter_secret, label), b"exported",
                                    crypto.hash(context), length)


def confirmed_transcript_hash(interim: bytes, wire_format: int, framed_content: bytes, signature: bytes) -> bytes:
    return crypto.hash(interim + u16(wire_format) + framed_content + vl(signature))


def interim_transcript_hash(confirmed: bytes, confirmation_tag: bytes) -> bytes:
    return crypto.hash(confirmed + vl(confirmation_tag))


def sender_data_key_nonce(sender_data_secret: bytes, ciphertext: bytes) -> tuple[bytes, bytes]:
    sample = ciphertext[:crypto.NH]
    return (crypto.expand_with_label(sender_data_secret, b"key", sample, crypto.NK),
            crypto.expand_with_label(sender_data_secret, b"nonce", sample, crypto.NN))


__all__ = ["EpochSecrets", "joiner_secret", "from_joiner", "advance", "welcome_key_nonce", "psk_secret", "exporter",
           "confirmed_transcript_hash", "interim_transcript_hash", "sender_data_key_nonce", "ZERO"]
