"""Stable short fingerprints for what the dashboard never shows in full: author pubkeys, `#p`
values, endpoints (and their hashes), lease addresses.

A fingerprint is a keyed hash (HMAC-SHA256 under a key derived from the key file), so the same
value shows the same fingerprint on every page and across restarts, while nobody who sees a page
or a screenshot can check it against a pubkey they know (an unkeyed hash could be).
"""

from __future__ import annotations

from typing import Any

from appliance.store.fingerprints import FINGERPRINT_HEX, fingerprint

__all__ = ["FINGERPRINT_HEX", "Redactor"]


class Redactor:
    def __init__(self, key: bytes):
        self.key = key

    def fingerprint(self, value: str, kind: str = "pk") -> str:
        """`pk:1a2b3c4d5e` (kinds: pk a pubkey, author or #p value alike; ep an endpoint; lease a lease address)."""
        return fingerprint(self.key, value, kind)

    def lease(self, pubkey: str, d: str) -> str:
        return self.fingerprint(f"{pubkey}:{d}", "lease")

    def subscriptions(self, subs: list[dict]) -> list[dict]:
        """A lease's subscriptions with authors and #p values fingerprinted (#h channel ids and
        kinds are shown: they name groups and event types, not people)."""
        return [self._subscription(s) for s in subs]

    def _subscription(self, sub: dict) -> dict:
        out: dict[str, Any] = {"class": sub.get("class"), "filter": self._filter(sub.get("filter", {}))}
        if sub.get("ignore"):
            out["ignore"] = [self._filter(f) for f in sub["ignore"]]
        if sub.get("p_tags_max") is not None:
            out["p_tags_max"] = sub["p_tags_max"]
        return out

    def _filter(self, f: dict) -> dict:
        out: dict[str, Any] = {}
        for key, value in f.items():
            if key == "authors":
                out[key] = [self.fingerprint(v, "pk") for v in value]
            elif key == "#p":
                out[key] = [self.fingerprint(v, "pk") for v in value]
            elif key.startswith("#") and key not in ("#h",):
                out[key] = [self.fingerprint(v, "tag") for v in value]
            else:
                out[key] = value
        return out
