import pytest

from tests.pgcluster import start_cluster


@pytest.fixture(scope="session")
def pg_cluster():
    cluster = start_cluster()
    yield cluster
    cluster.close()
