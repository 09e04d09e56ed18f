"""htmx comes from the npm registry at a pinned version, checked against its pinned integrity:
a tarball or a file that differs is refused (no network needed for these checks)."""

from __future__ import annotations

import io
import tarfile

import pytest

from appliance.admin import assets


def tarball(member: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_tarball_that_is_not_the_pinned_one_is_refused():
    with pytest.raises(assets.AssetError, match="integrity"):
        assets.verify_tarball(assets.HTMX, tarball(assets.HTMX.member, b"alert('not htmx')"))


def test_a_file_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    pinned = assets.Asset("x", "1.0.0", assets._digest("sha512", b"t"), "package/x.js", "x.js",
                          assets._digest("sha384", b"good"))
    monkeypatch.setattr(assets, "VENDOR", tmp_path / "vendor")
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "x.js").write_bytes(b"tampered")
    assert assets.load(pinned) is None
    (tmp_path / "vendor" / "x.js").write_bytes(b"good")
    assert assets.load(pinned) == b"good"
    # A tarball with the right integrity whose member differs from its pin is refused too.
    tb = tarball("package/x.js", b"evil")
    pinned = assets.Asset("x", "1.0.0", assets._digest("sha512", tb), "package/x.js", "x.js",
                          assets._digest("sha384", b"good"))
    with pytest.raises(assets.AssetError, match="does not match"):
        assets.verify_tarball(pinned, tb)


def test_the_pinned_htmx_is_installed_where_ci_fetched_it():
    """`.ci/run` fetched it (`appliance admin fetch-assets`); without npm or network it is absent."""
    data = assets.load(assets.HTMX)
    if data is None:
        pytest.skip("htmx not fetched here: run `appliance admin fetch-assets` (needs npm)")
    assert b"htmx" in data[:2000]


@pytest.mark.anyio
async def test_a_registry_that_never_answers_does_not_delay_the_start(tmp_path, monkeypatch, anyio_backend):
    """htmx missing and a registry (or proxy) that takes connections but never answers: the start
    does not wait for npm (whose own timeout is 120 s); the fetch runs once serving, and stopping
    the appliance ends it."""
    import asyncio
    import shutil
    import socket
    import threading

    from appliance.admin import install
    from appliance.app import build
    from appliance.settings import load
    from tests.pg import storage_env

    if shutil.which("npm") is None:
        pytest.skip("no npm client here")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    held: list[socket.socket] = []

    def take_connections() -> None:
        try:
            for _ in range(16):
                held.append(silent.accept()[0])
        except OSError:  # the test closed the listener
            pass

    threading.Thread(target=take_connections, daemon=True).start()
    monkeypatch.setattr(assets, "VENDOR", tmp_path / "vendor")
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{silent.getsockname()[1]}/")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    app = build(load(flags={"data_dir": str(tmp_path / "data")}, environ=storage_env(tmp_path / "data")))
    try:
        admin = await asyncio.wait_for(asyncio.to_thread(install, app), 30)
        assert admin.assets == {} and admin.fetch_missing_assets
        await admin.start()
        for _ in range(600):  # npm is asking the silent registry now, while the appliance serves
            if held:
                break
            await asyncio.sleep(0.05)
        assert held, "npm never reached the registry"
        fetch = admin.tasks[-1]
        assert not fetch.done()
        await admin.stop()
        assert fetch.cancelled() and admin.assets == {}
    finally:
        app.relay.close()
        app.store.close()
        for conn in held:
            conn.close()
        silent.close()
