"""Fixtures of the several-nodes tests: appliance processes over one database of the suite's
PostgreSQL cluster (the `pg_cluster` fixture, tests/conftest.py)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import Server


PUBLIC = "ws://relay.test"


class Nodes:
    """Node A and node B over one database; more can be started with `add`."""

    def __init__(self, tmp_path, url: str, config: str | None = None, extra: tuple = ()):
        self.tmp_path = tmp_path
        self.url = url
        self.config = config
        self.extra = extra
        self.servers: list[Server] = []

    def add(self, name: str) -> Server:
        data = self.tmp_path / name
        data.mkdir()
        if self.servers:  # every node needs the key file that wraps the keys in the database
            shutil.copy2(self.servers[0].data_dir / "appliance.key", data / "appliance.key")
        extra = ("--public-url", PUBLIC) if self.config is None else ()
        srv = Server(data, *extra, *self.extra, env={"APPLIANCE_STORAGE": self.url}, config=self.config).start()
        self.servers.append(srv)
        return srv

    def rows(self, sql: str, args=()) -> list[tuple]:
        """Rows of one query (PostgreSQL's text) on the nodes' database."""
        import psycopg

        with psycopg.connect(self.url) as conn:
            return conn.execute(sql, args).fetchall()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


@pytest.fixture
def nodes(tmp_path, pg_cluster):
    pytest.importorskip("appliance.store.postgres", reason="several nodes need the PostgreSQL store "
                        "(appliance.store.postgres), which this build does not have")
    made: list[Nodes] = []

    def make(config: str | None = None, extra: tuple = ()) -> Nodes:
        n = Nodes(tmp_path, pg_cluster.new_database(), config, extra)
        made.append(n)
        return n

    yield make
    for n in made:
        n.stop()


