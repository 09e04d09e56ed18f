"""Fixtures: an APNs signing key on disk and the APNs emulator serving in the test's event loop."""

from __future__ import annotations

import pytest

from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.tls import make_p8
from appliance.transports.apns import ApnsProfile, ApnsTransport
from appliance.transports.credentials import ApnsKey

TEAM = "TEAM123456"
KEY_ID = "ABC123DEFG"
TOPIC = "com.example.app"
TOKEN = "0f" * 32


@pytest.fixture
def p8(tmp_path):
    path = tmp_path / "AuthKey_ABC123DEFG.p8"
    key = make_p8(path)
    return path, key


@pytest.fixture
async def emulator(tmp_path, p8, anyio_backend):
    emu = ApnsEmulator(topics=[TOPIC], pki_dir=tmp_path / "pki")
    emu.add_key(TEAM, KEY_ID, p8[1])
    await emu.start()
    yield emu
    await emu.stop()


@pytest.fixture
async def transport(emulator, p8):
    profile = ApnsProfile("com.example.app/ios", TOPIC, "production", ApnsKey.load(TEAM, KEY_ID, p8[0]),
                          apns_url=emulator.url, ca_file=emulator.ca_file)
    t = ApnsTransport(profile, timeout=5)
    yield t
    await t.close()
