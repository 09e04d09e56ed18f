"""`appliance backup PATH` and `appliance restore PATH`: the database and its key file, together.

A backup is a consistent copy of the database taken while the server runs (SQLite's online backup
API, `store.sqlite.backup_database`, the same function as the dashboard's download) plus the key
file, written beside it as `appliance.key`: the database alone cannot unwrap the private keys it
holds, and the key file alone holds no user's secret. PATH names the database copy, or a
directory that receives `appliance.sqlite3` and `appliance.key`.

A restore refuses to touch the data directory while an appliance serves it (its lock, see
`store.instance`), and checks everything before it replaces anything: the copy is an SQLite
database this version can open (quick_check, schema version) and the key file beside it unwraps
every key the copy holds. The data it replaces is moved aside, never deleted.

On PostgreSQL neither writes anything: the database is backed up with its own tools, and both
commands say how (`postgres_backup`: the pg_dump and pg_restore commands with the URL redacted,
what the dump holds, the key file to keep beside it) and exit 2, as any refused command does.
The dashboard's backup section shows the same.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from appliance.errors import StoreError
from appliance.settings import Settings
from appliance.store.backend import database_errors
from appliance.store.dsn import has_password, is_postgres, without_password
from appliance.store.instance import InstanceLock
from appliance.store.interface import Connection
from appliance.store.keyfile import KEYFILE_NAME, KeyFile, holds_wrapped_keys, wrapped_inventory
from appliance.store.schema import SCHEMA_VERSION
from appliance.store.sqlite import DB_FILENAME, backup_database, open_checked


def add_parser(backup: argparse.ArgumentParser, restore: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    backup.add_argument("path", metavar="PATH",
                        help=f"The database copy to write, or a directory (then {DB_FILENAME} inside it). "
                        f"The key file goes beside it as {KEYFILE_NAME}.")
    backup.add_argument("--force", action="store_true", help="Replace an existing database copy at PATH.")
    add_setting_flags(backup)
    restore.add_argument("path", metavar="PATH",
                         help=f"A database copy made by `appliance backup` (with {KEYFILE_NAME} beside it), "
                         "or the directory holding both.")
    add_setting_flags(restore)


@dataclass(frozen=True)
class BackupFiles:
    database: Path
    keyfile: Path


def backup_files(path: str | Path) -> BackupFiles:
    """Where a backup at PATH keeps its database and its key file."""
    text = str(path)
    p = Path(path)
    if p.is_dir() or text.endswith(os.sep):
        return BackupFiles(p / DB_FILENAME, p / KEYFILE_NAME)
    return BackupFiles(p, p.parent / KEYFILE_NAME)


# -- PostgreSQL: the database's own tools ----------------------------------------------------------

# What a dump of the appliance's PostgreSQL database holds (every table of its schema).
POSTGRES_COVERS = ("every table of the appliance: events and their tags, deletions, groups, origins and their "
                   "settings, leases, wake jobs and the delivery log, dashboard settings and the admin password "
                   "hash, and the private keys (relay, executor, gateway grant keys, uploaded APNs keys), "
                   "wrapped by the key file")
# What it does not hold: the files of each node.
POSTGRES_NOT_COVERED = ("the key file (appliance.key, the same on every node), the configuration file, and the "
                        "certificate and .p8 files it names")


@dataclass(frozen=True)
class PostgresBackup:
    """How to back up and restore a PostgreSQL store: commands to run as they stand, with the URL
    left without its password (`password_hint` then says where it comes from)."""

    url: str
    password_hint: str
    dump: str
    restore: tuple[str, ...]
    keyfile: Path
    covers: str = POSTGRES_COVERS
    not_covered: str = POSTGRES_NOT_COVERED


def postgres_backup(settings: Settings, folder: str | Path | None = None) -> PostgresBackup:
    """The commands that back up the store `settings` name (a PostgreSQL URL), the dump written to
    `folder` (the current directory when None)."""
    url = without_password(settings.storage)
    hint = ("the password is left out: pg_dump takes it from PGPASSWORD or ~/.pgpass"
            if has_password(settings.storage) else "")
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    dump = f"appliance-{stamp}.dump" if folder is None else str(Path(folder) / f"appliance-{stamp}.dump")
    return PostgresBackup(
        url=url,
        password_hint=hint,
        dump=f"pg_dump --format=custom --file={dump} '{url}'",
        restore=("createdb --encoding UTF8 --lc-collate C --lc-ctype C --template template0 --owner OWNER NEWDB",
                 f"pg_restore --no-owner --dbname 'URL-OF-NEWDB' {dump}"),
        keyfile=settings.data_path.resolve() / KEYFILE_NAME,
    )


def _postgres_refusal(settings: Settings, command: str, folder: str | Path | None) -> str:
    plan = postgres_backup(settings, folder)
    return "\n".join([
        f"appliance: this appliance keeps its data in PostgreSQL ({plan.url}): `appliance {command}` copies a SQLite "
        "store only, and changed nothing.",
        "Back the database up with PostgreSQL's own tools (or its replicas), and keep the key file beside the dump:",
        f"  {plan.dump}" + (f"   ({plan.password_hint})" if plan.password_hint else ""),
        f"  cp {plan.keyfile} <beside the dump>   (mode 0600; every node has the same file)",
        f"The dump holds {plan.covers}. It does not hold {plan.not_covered}.",
        "To restore: stop every node, restore the dump into an empty database, point `storage` at it and put the "
        "key file in each node's data directory:",
        *(f"  {line}" for line in plan.restore),
    ])


# -- the key check (shared by backup, restore and doctor) ------------------------------------------

def check_keyfile(conn: Connection, keyfile: KeyFile) -> int:
    """Unwrap every private key the database holds with `keyfile`; the number checked.
    StoreError naming the first key it cannot unwrap (a key file of another database)."""
    from appliance.gateway.authority import load_keyring, token_label
    from appliance.push.keys import load_secrets
    from appliance.relay.groups import RelayKeys
    from appliance.store.credentials import load_apns_keys

    inventory = wrapped_inventory(conn)
    n = 0
    relay_keys = RelayKeys(keyfile)
    for origin in inventory["relay_key_origins"]:
        relay_keys.get(conn, origin)  # the row exists: this only unwraps
        n += 1
    for origin in inventory["executor_key_origins"]:
        n += len(load_secrets(conn, keyfile, origin))
    if inventory["gateway_grant_keys"]:
        try:
            n += len(load_keyring(conn, keyfile, 0).key_ids)  # now=0: every key still holding material
        except LookupError:
            pass  # no current grant key (the gateway makes one at start): nothing it would unwrap
    for handle, epoch, blob in inventory["gateway_tokens"]:
        keyfile.unwrap(blob, label=token_label(handle, epoch))
        n += 1
    if inventory["apns_keys"]:
        n += len(load_apns_keys(conn, keyfile))
    if inventory["vapid_keys"]:
        from appliance.store.vapid_keys import load_vapid_keys

        n += load_vapid_keys(conn, keyfile)
    return n


def _open_copy(path: Path) -> Connection:
    """A read-only connection to a database copy, after quick_check and the schema version."""
    if not path.is_file():
        raise StoreError(f"there is no database copy at {path}")
    try:
        conn, result, version = open_checked(path)
    except database_errors() as exc:
        raise StoreError(f"{path} is not a usable SQLite database ({exc})") from None
    if result != ["ok"]:
        conn.close()
        raise StoreError(f"{path} fails SQLite's quick_check: {'; '.join(result[:3])}")
    if version > SCHEMA_VERSION:
        conn.close()
        raise StoreError(f"{path} has schema version {version}, newer than this appliance knows "
                         f"({SCHEMA_VERSION}): restore it with the version that made it, or upgrade")
    if version == 0:
        conn.close()
        raise StoreError(f"{path} is not an appliance database (no schema version)")
    return conn


def _holds_keys(conn: Connection) -> bool:
    inv = wrapped_inventory(conn)
    return bool(inv["relay_key_origins"] or inv["executor_key_origins"] or inv["gateway_grant_keys"]
                or inv["gateway_tokens"] or inv["apns_keys"] or inv["vapid_keys"])


def _write_key(key_bytes: bytes, target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key_bytes)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, target)


# -- backup ----------------------------------------------------------------------------------------

def backup(settings: Settings, path: str | Path, *, force: bool = False) -> tuple[BackupFiles, int, int]:
    """Copy the database (consistently, while the server may run) and the key file to `path`.
    Returns (files written, database bytes, keys checked)."""
    data_dir = settings.data_path
    source = data_dir / DB_FILENAME
    files = backup_files(path)
    if not source.is_file():
        raise StoreError(f"there is no database in {data_dir} (check --data-dir)")
    if files.database.resolve() == source.resolve() or files.database.resolve().parent == data_dir.resolve():
        raise StoreError(f"{files.database} is inside the data directory: write the backup somewhere else")
    if files.database.exists() and not force:
        raise StoreError(f"{files.database} exists already: choose a new name, or pass --force to replace it")
    try:
        files.database.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {files.database.parent}: {exc.strerror or exc}") from None
    live_key_path = data_dir / KEYFILE_NAME
    key = KeyFile.read(live_key_path) if live_key_path.exists() else None
    if files.keyfile.exists():
        if key is None or not KeyFile.read(files.keyfile).same_key(key):
            raise StoreError(f"{files.keyfile} is the key file of another database: write this backup to "
                             "another directory")
    size = backup_database(source, files.database)
    conn = _open_copy(files.database)
    try:
        if key is None:
            if _holds_keys(conn):
                raise StoreError(f"the key file {live_key_path} is missing, but the database holds keys wrapped "
                                 "by it: this backup could not be restored")
            return files, size, 0
        checked = check_keyfile(conn, key)
    finally:
        conn.close()
    if not files.keyfile.exists():
        _write_key(live_key_path.read_bytes(), files.keyfile)
    return files, size, checked


# -- restore ---------------------------------------------------------------------------------------

def restore(settings: Settings, path: str | Path) -> tuple[BackupFiles, Path | None]:
    """Replace the data directory's database and key file with a backup's, after checking it.
    Returns (the backup's files, the folder the replaced files were moved to, or None)."""
    data_dir = settings.data_path
    files = backup_files(path)
    lock = InstanceLock(data_dir)
    with lock.acquire():  # InstanceBusy while a server runs; a server started meanwhile is refused
        _give_to_owner(data_dir, [lock.path])
        conn = _open_copy(files.database)
        try:
            key: KeyFile | None = None
            if files.keyfile.exists():
                key = KeyFile.read(files.keyfile)
                try:
                    check_keyfile(conn, key)
                except StoreError as exc:
                    raise StoreError(f"{files.keyfile} does not match the keys wrapped in {files.database} "
                                     f"({exc}); nothing was replaced") from None
            elif _holds_keys(conn):
                raise StoreError(f"{files.database} holds keys wrapped by a key file, but there is no "
                                 f"{files.keyfile}: put the backup's key file there; nothing was replaced")
        finally:
            conn.close()
        live_db = data_dir / DB_FILENAME
        live_key = data_dir / KEYFILE_NAME
        staged = data_dir / f".{DB_FILENAME}.restoring"
        backup_database(files.database, staged)
        moved = _move_aside(data_dir, [live_db, live_db.with_name(DB_FILENAME + "-wal"),
                                       live_db.with_name(DB_FILENAME + "-shm"),
                                       *([live_key] if key is not None else [])])
        os.replace(staged, live_db)
        if key is not None:
            _write_key(files.keyfile.read_bytes(), live_key)
        # else: the copy holds no wrapped key, so any key file serves it; the current one stays.
        _give_to_owner(data_dir, [live_db, live_key])
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return files, moved


def _give_to_owner(data_dir: Path, paths: list[Path]) -> None:
    """Run as root (say, beside a systemd service with its own user), the restored files get the
    data directory's owner: the service could not open root's files."""
    if os.geteuid() != 0:
        return
    st = data_dir.stat()
    for p in paths:
        if p.exists():
            os.chown(p, st.st_uid, st.st_gid)


def _move_aside(data_dir: Path, paths: list[Path]) -> Path | None:
    present = [p for p in paths if p.exists()]
    if not present:
        return None
    aside = data_dir / f"before-restore-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    n = 1
    while aside.exists():
        n += 1
        aside = aside.with_name(f"{aside.name.split('.')[0]}.{n}")
    aside.mkdir(mode=0o700)
    for p in present:
        shutil.move(str(p), aside / p.name)
    return aside


# -- the commands ----------------------------------------------------------------------------------

def run_backup(args: argparse.Namespace, settings: Settings) -> int:
    if is_postgres(settings.storage):
        folder = args.path if Path(args.path).is_dir() or str(args.path).endswith(os.sep) else Path(args.path).parent
        print(_postgres_refusal(settings, "backup", folder), file=sys.stderr)
        return 2
    files, size, checked = backup(settings, args.path, force=args.force)
    print(f"appliance: backed up {settings.data_path / DB_FILENAME} to {files.database} ({size:,} bytes)")
    if files.keyfile.exists():
        print(f"appliance: key file beside it: {files.keyfile} (it unwraps the {checked} private key(s) inside; "
              "keep the two together, and the key file private)")
    return 0


def run_restore(args: argparse.Namespace, settings: Settings) -> int:
    if is_postgres(settings.storage):
        print(_postgres_refusal(settings, "restore", None), file=sys.stderr)
        return 2
    files, moved = restore(settings, args.path)
    print(f"appliance: restored {files.database} into {settings.data_path}")
    if moved is not None:
        print(f"appliance: the replaced database and key file were moved to {moved}")
    return 0


__all__ = ["backup", "restore", "check_keyfile", "backup_files", "holds_wrapped_keys", "postgres_backup",
           "PostgresBackup"]
