from __future__ import annotations

import pytest

from .helpers import Dashboard

ORIGIN = "ws://push.test"
CONFIG = f"""
public_url = "{ORIGIN}"
lease_workers = 0
"""


@pytest.fixture
async def dash(tmp_path, anyio_backend):
    """A fresh appliance (default origin only), not yet set up."""
    d = Dashboard(tmp_path / "data", config=CONFIG)
    yield d
    await d.close()


@pytest.fixture
async def signed_in(dash):
    """The same, with the operator's password set (and signed in)."""
    await dash.set_up()
    return dash
