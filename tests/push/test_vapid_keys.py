"""VAPID keys: one per (origin, push service), made once, kept wrapped, the same after a restart."""

from __future__ import annotations

import pytest

from appliance.commands.backup import check_keyfile
from appliance.push.vapid import VapidKeys
from appliance.store.keyfile import KeyFile, holds_wrapped_keys, wrapped_inventory
from appliance.store.statement import SQL
from tests.pg import make_store

pytestmark = pytest.mark.anyio

PUSH_A, PUSH_B = "https://push.example.net", "https://up.example.org:8443"


async def test_one_key_per_origin_and_push_service_made_once_and_kept(tmp_path):
    store = make_store(tmp_path).open()
    try:
        keyfile = KeyFile.for_store(tmp_path, store)
        keys = VapidKeys(store, keyfile, 1)
        a = await keys(PUSH_A)
        assert (await keys(PUSH_A)).public_key == a.public_key
        assert (await keys(PUSH_B)).public_key != a.public_key
        assert (await VapidKeys(store, keyfile, 2)(PUSH_A)).public_key != a.public_key
        # Another worker or node (a fresh cache) signs with the stored key, not one of its own.
        assert (await VapidKeys(store, keyfile, 1)(PUSH_A)).public_key == a.public_key
        rows = store.read_sync(lambda c: c.execute(SQL("SELECT wrapped FROM vapid_keys",
                                                       "SELECT wrapped FROM vapid_keys")).fetchall())
        der = a.to_der()
        assert len(rows) == 3 and all(der[-32:] not in bytes(w) for (w,) in rows)  # wrapped at rest
        assert store.read_sync(holds_wrapped_keys)
        assert store.read_sync(wrapped_inventory)["vapid_keys"] == 3
        assert store.read_sync(lambda c: check_keyfile(c, keyfile)) >= 3  # the backup's key check
    finally:
        store.close()
    reopened = make_store(tmp_path).open()
    try:
        again = VapidKeys(reopened, KeyFile.for_store(tmp_path, reopened), 1)
        assert (await again(PUSH_A)).public_key == a.public_key
    finally:
        reopened.close()
