"""Front-end assets of the dashboard (htmx), from the npm registry at a pinned version with their
integrity checked, never committed.

How an asset arrives (`fetch`): the npm client downloads the package tarball (`npm pack NAME@VERSION`,
through whatever registry and proxy npm is configured with); the tarball's SHA-512 must equal the
pinned `dist.integrity` the registry published for that version, and the file taken out of it must
equal its pinned SHA-384 (also sent to browsers as the script's Subresource Integrity). Only then is
it written, atomically, to `static/vendor/` (gitignored) or, where that is not writable, to the data
directory's `vendor/`. `.ci/run`, the Docker build and `appliance admin fetch-assets` run it; the
first start runs it when the file is missing and, offline, says so and serves the dashboard without
htmx (every page is a plain HTML form that works without it; htmx adds live refresh and previews).

Every load checks the file against its pin again (`load`): a modified file is refused.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("appliance.admin")

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "static" / "vendor"
# Seconds `npm pack` may take before the fetch gives up (a first start must not hang offline).
DEFAULT_FETCH_TIMEOUT = 120


@dataclass(frozen=True)
class Asset:
    package: str
    version: str
    integrity: str  # the registry's dist.integrity of the tarball (sha512-<base64>)
    member: str  # path of the file inside the tarball
    name: str  # served as /admin/static/<name>
    sri: str  # sha384-<base64> of the file itself

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


HTMX = Asset(
    package="htmx.org",
    version="2.0.11",
    integrity="sha512-Thx/WtpeOQqSrqBCw/A1cwGJGg4UrVa3+sW0GmrM3p4gJgO89ecH4qtbnyzDDWFvBTqjnIMCgELTNt636dtamA==",
    member="package/dist/htmx.min.js",
    name="htmx.min.js",
    sri="sha384-2OatzQy1H+Zd/IIrjr1TcuDGqLXeHhbooAyJY1KdQMKnr4LZ22k31GBLdYKHmVjg",
)
ASSETS = (HTMX,)


class AssetError(Exception):
    """An asset could not be fetched or did not match its pin."""


def _digest(algorithm: str, data: bytes) -> str:
    return f"{algorithm}-" + base64.b64encode(hashlib.new(algorithm, data).digest()).decode()


def locations(data_dir: Path | None = None) -> list[Path]:
    """Where an asset may be: the source tree's static/vendor/, then the data directory's vendor/."""
    out = [VENDOR]
    if data_dir is not None:
        out.append(Path(data_dir) / "vendor")
    return out


def load(asset: Asset, data_dir: Path | None = None) -> bytes | None:
    """The asset's bytes if a copy matching its pin is on disk, else None (a mismatch is logged)."""
    for folder in locations(data_dir):
        path = folder / asset.name
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if _digest("sha384", data) == asset.sri:
            return data
        log.error("%s does not match its pinned integrity %s: ignored (run `appliance admin fetch-assets`)",
                  path, asset.sri)
    return None


def verify_tarball(asset: Asset, tarball: bytes) -> bytes:
    """The member file out of a package tarball, after both integrity checks."""
    got = _digest("sha512", tarball)
    if got != asset.integrity:
        raise AssetError(f"{asset.spec}: the tarball's integrity {got} is not the pinned {asset.integrity}")
    try:
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
            member = tar.extractfile(asset.member)
            data = member.read() if member is not None else None
    except (tarfile.TarError, KeyError, OSError) as exc:
        raise AssetError(f"{asset.spec}: cannot read {asset.member} from the tarball: {exc}") from None
    if data is None:
        raise AssetError(f"{asset.spec}: {asset.member} is not a file in the tarball")
    if _digest("sha384", data) != asset.sri:
        raise AssetError(f"{asset.spec}: {asset.member} does not match its pinned {asset.sri}")
    return data


def _npm_pack(asset: Asset, workdir: Path, timeout: float) -> bytes:
    npm = shutil.which("npm")
    if npm is None:
        raise AssetError(f"fetching {asset.spec} needs the npm client (install Node.js and npm), or copy a "
                         f"verified {asset.name} into {VENDOR}")
    try:
        out = subprocess.run([npm, "pack", asset.spec, "--json", "--pack-destination", str(workdir)],
                             capture_output=True, text=True, timeout=timeout, cwd=workdir,
                             env={**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
                                  "npm_config_audit": "false"})
    except subprocess.TimeoutExpired:
        raise AssetError(f"npm pack {asset.spec} gave no answer within {timeout:g} s (offline?)") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise AssetError(f"npm pack {asset.spec} failed (offline, or the registry is unreachable): {last}")
    try:
        filename = json.loads(out.stdout)[0]["filename"]
    except (ValueError, LookupError, TypeError):
        raise AssetError(f"npm pack {asset.spec}: unexpected output {out.stdout[:200]!r}") from None
    return (workdir / Path(filename).name).read_bytes()


def fetch(asset: Asset, data_dir: Path | None = None, *, timeout: float = DEFAULT_FETCH_TIMEOUT) -> Path:
    """Download, verify and install one asset; the path written. AssetError on any failure."""
    with tempfile.TemporaryDirectory(prefix="appliance-assets-") as tmp:
        data = verify_tarball(asset, _npm_pack(asset, Path(tmp), timeout))
    errors = []
    for folder in locations(data_dir):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / asset.name
            partial = folder / f".{asset.name}.partial"
            partial.write_bytes(data)
            os.replace(partial, target)
            return target
        except OSError as exc:
            errors.append(f"{folder}: {exc.strerror or exc}")
    raise AssetError(f"cannot write {asset.name}: " + "; ".join(errors))


def ensure(data_dir: Path | None = None, *, timeout: float = DEFAULT_FETCH_TIMEOUT) -> dict[str, bytes]:
    """Every asset's bytes, fetching the missing ones; AssetError names what could not be had."""
    out: dict[str, bytes] = {}
    problems: list[str] = []
    for asset in ASSETS:
        data = load(asset, data_dir)
        if data is None:
            try:
                fetch(asset, data_dir, timeout=timeout)
                data = load(asset, data_dir)
            except AssetError as exc:
                problems.append(str(exc))
        if data is not None:
            out[asset.name] = data
    if problems:
        raise AssetError("; ".join(problems))
    return out
