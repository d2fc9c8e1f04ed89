"""Fixtures of the job and ledger tests: a real PostgreSQL server and ledger URLs of both kinds.

``postgres``: one server per test session (see :mod:`pgserver`), started on 127.0.0.1 on an
ephemeral port with a temporary data directory; its password is put in ``PGPASSWORD`` for the
session, as a job on a cluster would get it. If it cannot start, every test that needs it
*fails* with the reason (never a silent skip).

``pg_url``: a fresh, empty database on that server for one test (no ledger tables yet).

``ledger_url``: parametrised over both backends, ``sqlite`` and ``postgresql``: the URL of a
fresh location where no ledger exists yet.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `pgserver` beside this file

from pgserver import PostgresServer, PostgresUnavailable  # noqa: E402

_counter = itertools.count()


@pytest.fixture(scope="session")
def postgres():
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        pytest.fail(f"the PostgreSQL test server cannot start: {exc}", pytrace=False)
    old = os.environ.get("PGPASSWORD")
    os.environ["PGPASSWORD"] = server.password
    try:
        yield server
    finally:
        if old is None:
            os.environ.pop("PGPASSWORD", None)
        else:
            os.environ["PGPASSWORD"] = old
        server.stop()


@pytest.fixture
def pg_url(postgres) -> str:
    import psycopg

    name = f"t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'ledger.sqlite'}"
    return request.getfixturevalue("pg_url")
