"""airflow_adrq_testing.servers: database creation, discovery errors, throwaway servers."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from airflow_adrq_testing import servers
from tests.support.ci import skip_or_fail

# Nothing listens on port 1 of the loopback: connections are refused at once.
DEAD_URLS = {
    "postgresql": "postgresql+psycopg2://nobody@127.0.0.1:1/nothing",
    "mysql": "mysql+mysqldb://nobody@127.0.0.1:1/nothing",
}


@pytest.mark.backends("postgresql", "mysql")
def test_created_database_is_empty_utf8_and_dropped(server_info):
    name = f"adrq_srv_{uuid.uuid4().hex[:10]}"
    url = servers.create_database(server_info.url, name)
    try:
        assert sa.make_url(url).database == name
        engine = sa.create_engine(url, poolclass=NullPool)
        with engine.begin() as conn:
            assert sa.inspect(conn).get_table_names() == []
            # The database default charset must hold 4-byte UTF-8 (utf8mb4 on MySQL).
            conn.exec_driver_sql("CREATE TABLE t (s VARCHAR(10))")
            conn.execute(sa.text("INSERT INTO t (s) VALUES (:s)"), {"s": "a🚀b"})
            assert conn.scalar(sa.text("SELECT s FROM t")) == "a🚀b"
        engine.dispose()
        with pytest.raises(sa.exc.DBAPIError):
            servers.create_database(server_info.url, name)
    finally:
        servers.drop_database(server_info.url, name)
    with pytest.raises(sa.exc.DBAPIError):
        servers.server_version(url)
    servers.drop_database(server_info.url, name)  # IF EXISTS: dropping twice is fine


@pytest.mark.parametrize(
    "name", ["", "Upper", "1st", "x; DROP DATABASE test", 'a"b', "a`b", "a-b", "é", "x" * 64]
)
def test_database_names_are_validated_before_connecting(name):
    for url in DEAD_URLS.values():
        with pytest.raises(ValueError, match="must match"):
            servers.create_database(url, name)
        with pytest.raises(ValueError, match="must match"):
            servers.drop_database(url, name)


@pytest.mark.parametrize("backend_name", servers.BACKENDS)
def test_a_named_server_that_does_not_answer_is_an_error(backend_name):
    variable = servers.env_var(backend_name)
    with (
        pytest.raises(servers.ServerNotFoundError, match=f"{variable} is set but"),
        servers.discover(backend_name, environ={variable: DEAD_URLS[backend_name]}),
    ):
        pytest.fail("discover yielded a server")


@pytest.mark.parametrize(
    ("backend_name", "package"), [("postgresql", "postgresql"), ("mysql", "mariadb-server")]
)
def test_nothing_found_names_the_package_and_the_variable(backend_name, package, monkeypatch):
    monkeypatch.setattr(servers.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(servers.shutil, "which", lambda *args, **kwargs: None)
    with (
        pytest.raises(servers.ServerNotFoundError) as info,
        servers.discover(backend_name, environ={servers.ENV_NO_LOCAL: "1"}),
    ):
        pytest.fail("discover yielded a server")
    message = str(info.value)
    assert f"Debian package {package!r}" in message
    assert f"{servers.env_var(backend_name)}=" in message
    assert "local servers skipped" in message


@pytest.mark.parametrize("backend_name", servers.BACKENDS)
def test_throwaway_server_starts_serves_and_stops(backend_name):
    try:
        with servers.discover(backend_name, environ={servers.ENV_NO_LOCAL: "1"}) as info:
            assert info.how_found.startswith("throwaway server from ")
            if os.geteuid() == 0:
                assert " as user " in info.how_found
            assert servers.server_version(info.url) == info.version
            port = sa.make_url(info.url).port
            name = f"adrq_srv_{uuid.uuid4().hex[:10]}"
            servers.create_database(info.url, name)
            servers.drop_database(info.url, name)
    except servers.ServerNotFoundError as exc:
        skip_or_fail(f"cannot start a throwaway {backend_name} server here: {exc}")
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", port))
