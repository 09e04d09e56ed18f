"""The VAPID keys an origin signs its UnifiedPush requests with: one per push service origin, made on
first use, kept wrapped in the store (`store.vapid_keys`) and in memory once read.

A key per (origin, push service) rather than one per appliance: a push service cannot tell that
two communities of one appliance, or one community's wakes to two push services, come from the
same application server (NIP-PL keeps origins unlinkable)."""

from __future__ import annotations

import time
from collections import OrderedDict

from appliance.store.keyfile import KeyFile
from appliance.store.vapid_keys import get_vapid_key, save_vapid_key, vapid_label
from appliance.transports.webpush import VapidKey

__all__ = ["VapidKeys"]


class VapidKeys:
    """`await keys(push_origin)` -> this origin's VapidKey for that push service."""

    CACHE = 1024

    def __init__(self, store, keyfile: KeyFile, origin: int):
        self.store = store
        self.keyfile = keyfile
        self.origin = origin
        self._cache: OrderedDict[str, VapidKey] = OrderedDict()

    async def __call__(self, push_origin: str) -> VapidKey:
        key = self._cache.get(push_origin)
        if key is not None:
            self._cache.move_to_end(push_origin)
            return key
        label = vapid_label(self.origin, push_origin)
        wrapped = await self.store.read(lambda conn: get_vapid_key(conn, self.origin, push_origin))
        if wrapped is None:
            made = self.keyfile.wrap(VapidKey.generate().to_der(), label=label)
            now = int(time.time())
            # Kept only if no worker or node made one first: every request then signs with the stored key.
            wrapped = await self.store.write(lambda conn: save_vapid_key(conn, self.origin, push_origin, made, now))
        key = VapidKey.from_der(self.keyfile.unwrap(wrapped, label=label))
        self._cache[push_origin] = key
        if len(self._cache) > self.CACHE:
            self._cache.popitem(last=False)
        return key
