"""The start banner: the version, the data directory and every URL the appliance answers on."""

from __future__ import annotations

from appliance import __version__
from appliance.app import Appliance
from appliance.relay import nip11, peers
from appliance.settings import Settings


def local_urls(settings: Settings) -> list[str]:
    """Other URLs that reach the default origin when no public URL is set, for the banner: loopback
    names, and this machine's addresses when listening on all interfaces. (NIP-42 AUTH accepts the
    one a client connected by, see appliance.relay.verbs.auth.)"""
    if settings.public_url:
        return []
    port = settings.port
    host = settings.host
    hosts: list[str] = []
    if host in {"0.0.0.0", "::", ""} or peers.is_loopback(host) or host == "localhost":
        hosts += ["127.0.0.1", "localhost"]
    if host in {"0.0.0.0", "::", ""}:
        hosts += [a for a in peers.local_addresses() if not peers.is_loopback(a)
                  and (host == "::" or ":" not in a) and not a.startswith("fe80:")]
    elif not peers.is_loopback(host) and host != "localhost":
        hosts.append(host)
    urls = []
    for h in hosts:
        url = f"ws://[{h}]:{port}" if ":" in h else f"ws://{h}:{port}"
        if url != settings.effective_public_url and url not in urls:
            urls.append(url)
    return urls


def startup_banner(settings: Settings, app: Appliance) -> list[str]:
    """The lines `serve` prints at start (the plug-ins' lines, `app.banner`, after the relay's)."""
    lines = [f"appliance {__version__}: data in {settings.data_path.resolve()}"]
    for origin in app.relay.origins.origins:
        http = origin.origin.replace("wss://", "https://", 1).replace("ws://", "http://", 1)
        lines.append(f"  relay  {origin.origin}   (NIP-11: {http} with Accept: {nip11.NOSTR_JSON})")
    for url in local_urls(settings):
        lines.append(f"  also   {url}")
    if app.gateway is not None:
        lines.append(f"  gateway  {app.gateway.config.display_url}")
    lines.extend(app.banner)
    lines.append(f"  listening on {settings.host}:{settings.port}")
    if app.gateway is not None and app.gateway.config.listen:
        lines.append(f"  gateway listening on {app.gateway.config.listen}")
    return lines
