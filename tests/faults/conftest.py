"""Fault-test fixtures: the embedded engine and the shared PostgreSQL come from the
gateway fixtures; ``private_pg`` is a PostgreSQL cluster of the test's own, to stop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.pgcluster import PgCluster, server_bindir
from tests.gateway.conftest import engine, model_dir  # noqa: F401 - shared fixtures


@pytest.fixture
def private_pg() -> Iterator[PgCluster]:
    """A running private cluster (initdb'ed for this test), removed afterwards."""
    bindir = server_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    cluster = PgCluster(bindir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
