"""Outer-envelope access rules for DMs and gift wraps."""

from __future__ import annotations

from appliance.nostr.event import Event
from appliance.nostr.nip59 import DM_KINDS, GIFT_WRAP_KINDS, is_gated_kind, may_read_private, recipients

A, B, C = "a" * 64, "b" * 64, "c" * 64


def wrap(kind=1059, author=A, tags=None):
    return Event("0" * 64, author, 1, kind, tags if tags is not None else [["p", B]], "ciphertext", "0" * 128)


def test_kinds():
    assert GIFT_WRAP_KINDS == {1059, 1060} and DM_KINDS == {4}
    assert all(is_gated_kind(k) for k in (4, 1059, 1060))
    assert not any(is_gated_kind(k) for k in (1, 14, 13, 1058, 1061, 22242))


def test_recipients():
    assert recipients(wrap(tags=[["p", B], ["p", C, "wss://r"], ["p"], ["e", A]])) == {B, C}
    assert recipients(wrap(tags=[])) == set()


def test_may_read_private():
    ev = wrap(tags=[["p", B]])
    assert may_read_private(ev, A)  # author
    assert may_read_private(ev, B)  # recipient
    assert not may_read_private(ev, C)
    assert not may_read_private(ev, None)
    assert not may_read_private(ev, "")
    assert not may_read_private(wrap(tags=[["P", C]]), C)  # only lowercase p tags count
