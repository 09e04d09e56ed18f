"""Front-end assets of the dashboard (htmx), from the npm registry at a pinned version with their
integrity checked, never committed.

How an asset arrives (`fetch`): the npm client downloads the package tarball (`npm pack NAME@VERSION`,
through whatever registry and proxy npm is configured with); the tarball's SHA-512 must equal the
pinned `dist.integrity` the registry published for that version, and the file taken out of it must
equal its pinned SHA-384 (also sent to browsers as the script's Subresource Integrity). Only then is
it written, atomically, to `static/vendor/` (gitignored) or, where that is not writable, to the data
directory's `vendor/`. `.ci/run`, the Docker build and `appliance admin fetch-assets` run it; a
start that finds the file missing serves at once and fetches it in the background (`fetch_async`):
until it arrives, or offline, the dashboard works without htmx (every page is a plain HTML form;
htmx adds live refresh and previews). A registry that never answers does not delay the start.

Every load checks the file against its pin again (`load`): a modified file is refused.
"""

from __future__ import annotations

import asyncio
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
# Seconds `npm pack` may take before the fetch gives up (a registry that never answers).
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


def _npm_command(asset: Asset, workdir: Path) -> tuple[list[str], dict[str, str]]:
    npm = shutil.which("npm")
    if npm is None:
        raise AssetError(f"fetching {asset.spec} needs the npm client (install Node.js and npm), or copy a "
                         f"verified {asset.name} into {VENDOR}")
    return ([npm, "pack", asset.spec, "--json", "--pack-destination", str(workdir)],
            {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
             "npm_config_audit": "false"})


def _packed(asset: Asset, workdir: Path, returncode: int, stdout: str, stderr: str) -> bytes:
    """The tarball `npm pack` wrote, from its exit status and output."""
    if returncode != 0:
        last = (stderr.strip().splitlines() or ["no message"])[-1]
        raise AssetError(f"npm pack {asset.spec} failed (offline, or the registry is unreachable): {last}")
    try:
        filename = json.loads(stdout)[0]["filename"]
    except (ValueError, LookupError, TypeError):
        raise AssetError(f"npm pack {asset.spec}: unexpected output {stdout[:200]!r}") from None
    return (workdir / Path(filename).name).read_bytes()


def _timed_out(asset: Asset, timeout: float) -> AssetError:
    return AssetError(f"npm pack {asset.spec} gave no answer within {timeout:g} s (offline?)")


def _npm_pack(asset: Asset, workdir: Path, timeout: float) -> bytes:
    cmd, env = _npm_command(asset, workdir)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir, env=env)
    except subprocess.TimeoutExpired:
        raise _timed_out(asset, timeout) from None
    return _packed(asset, workdir, out.returncode, out.stdout, out.stderr)


def _install(asset: Asset, data: bytes, data_dir: Path | None) -> Path:
    """Write verified bytes, atomically, to the first writable location."""
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


def fetch(asset: Asset, data_dir: Path | None = None, *, timeout: float = DEFAULT_FETCH_TIMEOUT) -> Path:
    """Download, verify and install one asset; the path written. AssetError on any failure."""
    with tempfile.TemporaryDirectory(prefix="appliance-assets-") as tmp:
        data = verify_tarball(asset, _npm_pack(asset, Path(tmp), timeout))
    return _install(asset, data, data_dir)


async def fetch_async(asset: Asset, data_dir: Path | None = None, *,
                      timeout: float = DEFAULT_FETCH_TIMEOUT) -> Path:
    """`fetch` from a running appliance: npm is a child process the event loop waits on, killed if
    the fetch is cancelled (the appliance stops) or times out."""
    with tempfile.TemporaryDirectory(prefix="appliance-assets-") as tmp:
        cmd, env = _npm_command(asset, Path(tmp))
        proc = await asyncio.create_subprocess_exec(*cmd, cwd=tmp, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            raise _timed_out(asset, timeout) from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        data = verify_tarball(asset, _packed(asset, Path(tmp), proc.returncode, out.decode(errors="replace"),
                                             err.decode(errors="replace")))
    return _install(asset, data, data_dir)


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
