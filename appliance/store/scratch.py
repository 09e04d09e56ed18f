"""Scratch PostgreSQL databases, made and dropped through a cluster's maintenance database (the
benchmarks of several nodes each run on a fresh one)."""

from __future__ import annotations

import uuid

SQL_CREATE_DATABASE = "CREATE DATABASE \"{name}\" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
SQL_DROP_DATABASE = 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'


def database_url(admin_url: str, name: str) -> str:
    """`admin_url` (a postgresql:// URL) naming database `name` instead."""
    head, _, query = admin_url.partition("?")
    return f"{head.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


def create_scratch_database(admin_url: str, prefix: str = "appliance_scratch_") -> tuple[str, str]:
    """A new empty database: (its name, its URL). The name is ours (a prefix and random hex), never
    a caller's string, so it is safe to put in the statement."""
    from appliance.store.postgres import psycopg

    name = prefix + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(SQL_CREATE_DATABASE.format(name=name))
    return name, database_url(admin_url, name)


def drop_databases(admin_url: str, names: list[str]) -> None:
    from appliance.store.postgres import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        for name in names:
            admin.execute(SQL_DROP_DATABASE.format(name=name))
