"""Message framing (RFC 9420 §6): signing, membership tags, PrivateMessage encryption."""

from __future__ import annotations

import os

from . import crypto
from .codec import Reader, u8, u32, u64, vl
from .errors import DecodeError, MembershipTagError, SignatureError
from .keyschedule import sender_data_key_nonce
from .secrettree import APPLICATION, HANDSHAKE, SecretTree
from .structs import (
    CT_APPLICATION,
    SENDER_MEMBER,
    WF_PUBLIC_MESSAGE,
    AuthenticatedContent,
    FramedContent,
    FramedContentAuthData,
    GroupContext,
    PrivateMessage,
    PublicMessage,
    Sender,
    encode_content_body,
    framed_content_tbs,
    read_content_body,
)


def sign_content(wire_format: int, content: FramedContent, context: GroupContext | None, priv: bytes) -> bytes:
    return crypto.sign_with_label(priv, b"FramedContentTBS", framed_content_tbs(wire_format, content, context))


def verify_content(wire_format: int, content: FramedContent, auth: FramedContentAuthData,
                   context: GroupContext | None, pub: bytes) -> None:
    if not crypto.verify_with_label(pub, b"FramedContentTBS", framed_content_tbs(wire_format, content, context),
                                    auth.signature):
        raise SignatureError("message signature does not verify")


def membership_tag(membership_key: bytes, content: FramedContent, auth: FramedContentAuthData,
                   context: GroupContext) -> bytes:
    tbm = framed_content_tbs(WF_PUBLIC_MESSAGE, content, context) + auth.encode()
    return crypto.mac(membership_key, tbm)


def protect_public(content: FramedContent, auth: FramedContentAuthData, context: GroupContext,
                   membership_key: bytes | None) -> PublicMessage:
    tag = None
    if content.sender.sender_type == SENDER_MEMBER:
        tag = membership_tag(membership_key, content, auth, context)
    return PublicMessage(content, auth, tag)


def check_membership_tag(msg: PublicMessage, context: GroupContext, membership_key: bytes) -> None:
    if msg.content.sender.sender_type != SENDER_MEMBER:
        return
    expected = membership_tag(membership_key, msg.content, msg.auth, context)
    if msg.membership_tag is None or not crypto.hmac.compare_digest(expected, msg.membership_tag):
        raise MembershipTagError("membership tag does not verify")


def _content_aad(group_id: bytes, epoch: int, content_type: int, authenticated_data: bytes) -> bytes:
    return vl(group_id) + u64(epoch) + u8(content_type) + vl(authenticated_data)


def protect_private(content: FramedContent, auth: FramedContentAuthData, secret_tree: SecretTree,
                    sender_data_secret: bytes, padding: int = 0) -> PrivateMessage:
    """Encrypt (advancing the sender's ratchet in `secret_tree`)."""
    if content.sender.sender_type != SENDER_MEMBER:
        raise ValueError("only members send PrivateMessages")
    kind = APPLICATION if content.content_type == CT_APPLICATION else HANDSHAKE
    generation, key, nonce = secret_tree.next_key(content.sender.index, kind)
    reuse_guard = os.urandom(4)
    nonce = bytes(a ^ b for a, b in zip(reuse_guard, nonce[:4])) + nonce[4:]
    plaintext = encode_content_body(content.content_type, content.content) + auth.encode() + bytes(padding)
    aad = _content_aad(content.group_id, content.epoch, content.content_type, content.authenticated_data)
    ciphertext = crypto.aead_seal(key, nonce, aad, plaintext)
    sd_key, sd_nonce = sender_data_key_nonce(sender_data_secret, ciphertext)
    sender_data = u32(content.sender.index) + u32(generation) + reuse_guard
    sd_aad = vl(content.group_id) + u64(content.epoch) + u8(content.content_type)
    encrypted_sender_data = crypto.aead_seal(sd_key, sd_nonce, sd_aad, sender_data)
    return PrivateMessage(content.group_id, content.epoch, content.content_type, content.authenticated_data,
                          encrypted_sender_data, ciphertext)


def unprotect_private(msg: PrivateMessage, secret_tree: SecretTree,
                      sender_data_secret: bytes) -> tuple[FramedContent, FramedContentAuthData]:
    """Decrypt (consuming the key in `secret_tree`). The signature is checked by the caller."""
    sd_key, sd_nonce = sender_data_key_nonce(sender_data_secret, msg.ciphertext)
    sd_aad = vl(msg.group_id) + u64(msg.epoch) + u8(msg.content_type)
    sender_data = crypto.aead_open(sd_key, sd_nonce, sd_aad, msg.encrypted_sender_data)
    if len(sender_data) != 12:
        raise DecodeError("sender data has the wrong length")
    r = Reader(sender_data)
    leaf, generation, reuse_guard = r.u32(), r.u32(), r.fixed(4)
    kind = APPLICATION if msg.content_type == CT_APPLICATION else HANDSHAKE
    key, nonce = secret_tree.key_for(leaf, kind, generation)
    nonce = bytes(a ^ b for a, b in zip(reuse_guard, nonce[:4])) + nonce[4:]
    aad = _content_aad(msg.group_id, msg.epoch, msg.content_type, msg.authenticated_data)
    plaintext = crypto.aead_open(key, nonce, aad, msg.ciphertext)
    r = Reader(plaintext)
    body = read_content_body(r, msg.content_type)
    auth = FramedContentAuthData.read(r, msg.content_type)
    if any(plaintext[r.pos:]):
        raise DecodeError("non-zero padding in PrivateMessage content")
    content = FramedContent(msg.group_id, msg.epoch, Sender(SENDER_MEMBER, leaf), msg.authenticated_data,
                            msg.content_type, body)
    return content, auth


def authenticated_content(wire_format: int, content: FramedContent, auth: FramedContentAuthData) -> bytes:
    return AuthenticatedContent(wire_format, content, auth).encode()


__all__ = ["sign_content", "verify_content", "membership_tag", "protect_public", "check_membership_tag",
           "protect_private", "unprotect_private", "authenticated_content"]
