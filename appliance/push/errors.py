"""Rejection types for NIP-PL push leases (pure, no I/O).

Every rejection a kind:30350 lease can receive carries the *full* NIP-01 OK
message (machine-readable prefix included) in ``LeaseRejected.message``.  All
messages are enumerated in :data:`REASONS` so tests and docs can iterate over
them; ``LeaseRejected`` refuses codes that are not in the catalogue.

Messages the spec words literally are reproduced byte-for-byte; where the spec
says ``invalid: <tag reason>`` / ``invalid: <schema reason>`` the short reasons
below were chosen (see docs/spec-notes.md).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

__all__ = ["REASONS", "SPEC_WORDED", "LeaseRejected", "DescriptorError", "reason_message"]

_REASONS: dict[str, str] = {
    # -- step 1: NIP-42 authentication ------------------------------------
    "auth_required": "auth-required: push lease requires authentication",
    "pubkey_mismatch": "restricted: pubkey does not match authenticated user",
    # -- step 2: NIP-01 id/signature ----------------------------------------
    "bad_signature": "invalid: bad signature",
    # -- step 3: public tags ------------------------------------------------
    "malformed_tag": "invalid: malformed tag",
    "unexpected_tag": "invalid: unexpected tag",
    "duplicate_tag": "invalid: duplicate tag",
    "missing_tag_value": "invalid: missing tag value",
    "extra_tag_value": "invalid: extra tag value",
    "missing_d_tag": "invalid: missing d tag",
    "missing_expiration_tag": "invalid: missing expiration tag",
    "missing_exec_tag": "invalid: missing exec tag",
    "d_too_short": "invalid: d tag too short",
    "d_too_long": "invalid: d tag too long",
    "empty_exec_tag": "invalid: empty exec tag",
    "alt_too_long": "invalid: alt tag too long",
    "malformed_expiration": "invalid: malformed expiration",
    # -- expiration bound (The Lease Event), checked at the end of step 3 -----
    "ttl_too_long": "invalid: lease ttl too long",
    "already_expired": "invalid: lease already expired",
    # -- step 4: executor key / decryption ------------------------------------
    "unknown_executor_key": "invalid: unknown executor key",
    "content_too_long": "invalid: content too long",
    "undecryptable": "invalid: undecryptable content",
    # -- step 5: plaintext size / strict JSON / schema ------------------------
    "plaintext_too_long": "invalid: plaintext too long",
    "malformed_json": "invalid: malformed json",
    "trailing_data": "invalid: trailing data",
    "nesting_too_deep": "invalid: nesting too deep",
    "duplicate_key": "invalid: duplicate key",
    "non_finite_number": "invalid: non-finite number",
    "integer_out_of_range": "invalid: integer out of range",
    "string_too_long": "invalid: string too long",
    "endpoint_too_long": "invalid: endpoint too long",
    "not_an_object": "invalid: plaintext not an object",
    "missing_field": "invalid: missing field",
    "unknown_field": "invalid: unknown field",
    "unexpected_field": "invalid: unexpected field",
    "wrong_type": "invalid: wrong type",
    "unsupported_version": "invalid: unsupported version",
    "generation_out_of_range": "invalid: generation out of range",
    "empty_string": "invalid: empty string",
    "unknown_transport": "invalid: unknown transport",
    "empty_subscriptions": "invalid: empty subscriptions",
    "unknown_class": "invalid: unknown class",
    "empty_ignore": "invalid: empty ignore",
    "p_tags_max_out_of_range": "invalid: p_tags_max out of range",
    # -- step 6: origin binding -----------------------------------------------
    "origin_mismatch": "invalid: origin mismatch",
    # -- step 7: profile / transport -----------------------------------------
    "unknown_app_profile": "invalid: unknown app profile",
    "transport_mismatch": "invalid: transport mismatch",
    # -- step 7: filter grammar ----------------------------------------------
    "time_travel_field": "invalid: time-travel filter field",
    "forbidden_filter_field": "invalid: forbidden filter field",
    "multi_letter_tag": "invalid: multi-letter tag",
    "tag_not_permitted": "invalid: tag selector not permitted",
    "unknown_filter_field": "invalid: unknown filter field",
    "empty_array": "invalid: empty array",
    "duplicate_value": "invalid: duplicate value",
    "missing_kinds": "invalid: missing kinds",
    "too_many_kinds": "invalid: too many kinds",
    "too_many_authors": "invalid: too many authors",
    "too_many_tag_values": "invalid: too many tag values",
    "too_many_h_values": "invalid: too many h values",
    "kind_not_push_eligible": "invalid: kind not push-eligible",
    "not_narrowed": "invalid: lease filter not narrowed",
    "non_exact_value": "invalid: non-exact match value",
    "p_not_self": "invalid: p-tag must be self",
    "invalid_h_value": "invalid: invalid h value",
    "too_many_ignore": "invalid: too many ignore filters",
    # -- step 7: classes -----------------------------------------------------
    "class_not_supported": "invalid: class not supported",
    "class_not_permitted": "invalid: class not permitted for kind",
    # -- step 7: quotas (subscription count is stateless; the rest runs in
    #    the store's write transaction) ----------------------------------------
    "quota_exceeded": "invalid: lease quota exceeded",
    "endpoint_already_leased": "invalid: endpoint already leased",
    # -- step 8: replacement (stateful, inside the write transaction) ---------
    "stale_replacement": "invalid: stale replacement",
    "stale_generation": "invalid: stale generation",
}

#: code -> full OK message (read-only)
REASONS: Mapping[str, str] = MappingProxyType(_REASONS)

#: codes whose message text is given verbatim by NIP-PL (the rest are our
#: choice of ``<tag reason>`` / ``<schema reason>``).
SPEC_WORDED: frozenset[str] = frozenset(
    {
        "pubkey_mismatch",
        "bad_signature",
        "ttl_too_long",
        "already_expired",
        "unknown_executor_key",
        "undecryptable",
        "unknown_field",
        "origin_mismatch",
        "transport_mismatch",
        "not_narrowed",
        "non_exact_value",
        "p_not_self",
        "kind_not_push_eligible",
        "class_not_supported",
        "class_not_permitted",
        "quota_exceeded",
        "endpoint_already_leased",
        "stale_replacement",
        "stale_generation",
    }
)

assert len(set(_REASONS.values())) == len(_REASONS), "reason messages must be unique"


def reason_message(code: str) -> str:
    """Return the full OK message for a catalogue code (KeyError if unknown)."""
    return _REASONS[code]


class LeaseRejected(Exception):
    """A kind:30350 lease failed acceptance.

    ``code`` is the catalogue key, ``message`` the complete NIP-01 OK message
    (e.g. ``"invalid: origin mismatch"``), ``prefix`` its machine-readable
    prefix (``invalid`` / ``auth-required`` / ``restricted``).
    """

    def __init__(self, code: str) -> None:
        if code not in _REASONS:
            raise KeyError(f"unknown lease rejection code: {code!r}")
        self.code = code
        self.message = _REASONS[code]
        super().__init__(self.message)

    @property
    def prefix(self) -> str:
        return self.message.split(":", 1)[0]

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"LeaseRejected({self.code!r}: {self.message!r})"


class DescriptorError(ValueError):
    """The push descriptor violates a NIP-PL rule; ``rule`` names which one."""

    def __init__(self, rule: str, detail: str = "") -> None:
        self.rule = rule
        self.detail = detail
        super().__init__(f"{rule}: {detail}" if detail else rule)
