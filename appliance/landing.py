"""The landing page: what a browser sees at a relay URL (NIP-11 clients ask for JSON instead)."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from appliance import __version__
from appliance.origins import Origin

# templates/ and static/ sit beside the package in the source tree (the fixed top-level layout).
ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "static"
TEMPLATES = Environment(loader=FileSystemLoader(ROOT / "templates"), autoescape=select_autoescape(default=True))


def landing_page(origin: Origin) -> str:
    """The origin's landing page: its name, description and URL."""
    return TEMPLATES.get_template("index.html").render(
        name=origin.name or origin.origin,
        description=origin.description,
        url=origin.origin,
        version=__version__,
    )
