"""Shared helpers for the Marmot/MLS tests: the official MLS vectors (skip with the reason if absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def mls_vectors(name: str) -> list:
    """Load ../shared/vectors/mls/<name>.json (or $APPLIANCE_VECTORS/mls/...), or skip the test."""
    env = os.environ.get("APPLIANCE_VECTORS")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2].parent / "shared" / "vectors")
    for c in candidates:
        path = c / "mls" / f"{name}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            return data if isinstance(data, list) else [data]
    pytest.skip(f"MLS test vectors {name}.json not found: set APPLIANCE_VECTORS or provide ../shared/vectors/mls "
                f"(looked in: {', '.join(str(c) for c in candidates)})")


def cases(name: str, suite_field: bool = True) -> list:
    """Cipher-suite-1 cases of a vector file, as pytest params (the file is loaded at collection)."""
    try:
        data = mls_vectors(name)
    except pytest.skip.Exception as exc:
        return [pytest.param(None, marks=pytest.mark.skip(reason=str(exc)), id="absent")]
    if suite_field:
        data = [v for v in data if v.get("cipher_suite", 1) == 1]
    return [pytest.param(v, id=f"{name}-{i}") for i, v in enumerate(data)]


def h(x: str | None) -> bytes | None:
    return None if x is None else bytes.fromhex(x)
