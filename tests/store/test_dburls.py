"""A database URL as logs, errors and `status` show it: every form libpq accepts, its secrets
masked and its servers named."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from worker.config.settings import StorageSettings
from worker.store.pg import connect
from worker.urls import db_hosts, mask_url

# (the form as given, its masked form, the servers it names)
FORMS = [
    (
        "postgresql://depositd:s3cret@db1:5432,db2:5433/depositd?target_session_attrs=read-write",
        "postgresql://depositd:***@db1:5432,db2:5433/depositd?target_session_attrs=read-write",
        "db1:5432, db2:5433",
    ),
    (
        "postgres://depositd@db1,db2:6432/depositd?password=s3cret&sslpassword=s3cret&sslmode=require",
        "postgres://depositd@db1,db2:6432/depositd?password=***&sslpassword=***&sslmode=require",
        "db1:5432, db2:6432",
    ),
    (
        "postgresql://depositd:s3cret@[::1]:5432,10.0.0.2/depositd",
        "postgresql://depositd:***@[::1]:5432,10.0.0.2/depositd",
        "[::1]:5432, 10.0.0.2:5432",
    ),
    (
        "host=db1,db2 port=5432,5433 dbname=depositd user=depositd password='s3cret wi\\'th' "
        "target_session_attrs=read-write",
        "host=db1,db2 port=5432,5433 dbname=depositd user=depositd password=*** "
        "target_session_attrs=read-write",
        "db1:5432, db2:5433",
    ),
    ("host=db1 password=s3cret", "host=db1 password=***", "db1:5432"),
    ("service=depositd-prod", "service=depositd-prod", "service depositd-prod"),
    (
        "postgresql:///depositd?service=depositd-prod",
        "postgresql:///depositd?service=depositd-prod",
        "service depositd-prod",
    ),
    (
        "postgresql://depositd@/depositd?host=/run/postgresql",
        "postgresql://depositd@/depositd?host=/run/postgresql",
        "/run/postgresql:5432",
    ),
]


@pytest.mark.parametrize(("given", "masked", "hosts"), FORMS)
def test_every_libpq_form_is_masked_and_names_its_servers(
    given: str, masked: str, hosts: str
) -> None:
    """libpq reads each form (so they are forms it accepts); the masked one hides every secret
    and keeps the rest, and the servers are named host:port."""
    conninfo_to_dict(given)  # accepted by libpq
    assert mask_url(given) == masked
    assert "s3cret" not in mask_url(given)
    assert db_hosts(given) == hosts
    assert "s3cret" not in db_hosts(given)


def test_a_password_with_unescaped_slashes_or_ats_is_masked_whole() -> None:
    """A password libpq would misread (an unescaped `/` or `@`) is still never shown."""
    url = "postgresql://depositd:pa/ss@word@db1:5432/depositd"
    assert "pa/ss" not in mask_url(url) and "word" not in mask_url(url).split("@")[0]
    assert mask_url(url) == "postgresql://depositd:***@db1:5432/depositd"
    assert db_hosts(url) == "(unparsed)"


def test_a_multi_host_url_is_named_in_the_configuration_not_called_malformed() -> None:
    """`storage.where` (status, the start line, errors) shows a multi-host URL with its password
    masked."""
    settings = StorageSettings.model_validate(
        {"url": "postgresql://depositd:s3cret@db1:5432,db2:5433/depositd"}
    )
    assert settings.where == "postgresql://depositd:***@db1:5432,db2:5433/depositd"


def test_a_refused_multi_host_connection_names_the_servers_never_the_password() -> None:
    """Connecting to two servers that both refuse: the error names both, masks the password."""
    url = "postgresql://depositd:s3cret-pw@127.0.0.1:1,127.0.0.1:2/depositd?connect_timeout=2"
    with pytest.raises(Exception) as caught:
        connect(url)
    text = str(caught.value)
    assert "s3cret-pw" not in text
    assert "malformed" not in text
    assert "postgresql://depositd:***@127.0.0.1:1,127.0.0.1:2/depositd" in text
