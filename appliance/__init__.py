"""The appliance: a self-hosted Nostr relay with a NIP-PL push executor, in one process."""

from __future__ import annotations

__version__ = "0.1.0"

# The standalone build writes the git revision it was built from here (packaging/appliance.spec).
REVISION_FILE = "REVISION"


def revision() -> str:
    """The git revision this program was built from: embedded by the standalone build, else asked
    of git when run from a checkout ("-dirty" when it has uncommitted changes), else "unknown"."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    try:
        embedded = (here / REVISION_FILE).read_text().strip()
    except OSError:
        embedded = ""
    if embedded:
        return embedded
    if not (here.parent / ".git").exists():  # installed elsewhere: not our checkout to ask about
        return "unknown"
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12", "--exclude", "*"],
                             cwd=here.parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = out.stdout.strip()
    return text if out.returncode == 0 and text else "unknown"


def version_line() -> str:
    """What `appliance --version` prints: the version and the git revision."""
    return f"appliance {__version__} (git {revision()})"
