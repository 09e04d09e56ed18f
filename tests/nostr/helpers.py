"""Shared helpers for the appliance.nostr tests: vector lookup and fixed keys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Fixed secrets keep failures reproducible (and are obviously not real keys).
SK1 = "0000000000000000000000000000000000000000000000000000000000000001"
SK2 = "0000000000000000000000000000000000000000000000000000000000000002"
SK3 = "7f3b02c9d3704396ff9b2a530f7e7c7411a5e77fc4f7b7b7c73030b0c3a36e54"


def vectors_dir() -> Path:
    """The shared external vectors folder, or skip the calling test with the reason."""
    env = os.environ.get("APPLIANCE_VECTORS")
    candidates = [Path(env)] if env else []
    # tests/nostr/helpers.py -> parents[2] is the repo root; vectors live beside it.
    candidates.append(Path(__file__).resolve().parents[2].parent / "shared" / "vectors")
    for c in candidates:
        if c.is_dir():
            return c
    pytest.skip(
        "external test vectors not found: set APPLIANCE_VECTORS or provide ../shared/vectors "
        f"(looked in: {', '.join(str(c) for c in candidates)})"
    )


def vector_file(name: str) -> Path:
    path = vectors_dir() / name
    if not path.is_file():
        pytest.skip(f"vector file {name} not found in {path.parent}")
    return path
