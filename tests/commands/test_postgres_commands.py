"""`storage.url` in the configuration and in the commands: validated, its password never shown,
and `backup` pointing to pg_dump."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.configs import make_config, write_config
from tests.support.pgcluster import Cluster
from worker.commands.cli import main
from worker.config.settings import load_settings
from worker.errors import ConfigError


def problems(path: Path) -> str:
    """The configuration's problems, as one text."""
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return "\n".join(caught.value.problems)


def test_storage_takes_exactly_one_of_path_and_url(tmp_path: Path) -> None:
    """Both or neither of storage.path and storage.url, or a URL that is not PostgreSQL's, is a
    configuration problem that says what to give."""
    both = write_config(tmp_path, make_config({"path": "d.db", "url": "postgresql://u@h/d"}))
    assert "exactly one of storage.path" in problems(both)
    neither = write_config(tmp_path, make_config({"retention_days": 5}))
    assert "exactly one of storage.path" in problems(neither)
    mysql = write_config(tmp_path, make_config({"url": "mysql://u@h/d"}))
    assert "storage.url: must be a postgresql:// URL" in problems(mysql)


def test_the_database_password_comes_from_a_file_and_is_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """storage.password_file is read like any credential; a failing command names the server
    with the password masked, never the password itself."""
    (tmp_path / "db_password").write_text("pw-from-file\n")
    path = write_config(
        tmp_path,
        make_config(
            {
                "url": "postgresql://depositd:inline-pw@127.0.0.1:1/depositd",
                "password_file": "db_password",
            }
        ),
    )
    settings = load_settings(path)
    assert settings.storage.password is not None
    assert settings.storage.password.get_secret_value() == "pw-from-file"
    assert "inline-pw" not in settings.storage.where
    assert main(["events", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "cannot read the database" in err
    assert "pw-from-file" not in out + err and "inline-pw" not in out + err


def test_backup_on_postgresql_refuses_and_names_pg_dump(
    tmp_path: Path, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`backup` copies SQLite files only: on PostgreSQL it exits 2 naming pg_dump, and writes
    nothing."""
    path = write_config(tmp_path, make_config({"url": pg_cluster.url("postgres")}))
    target = tmp_path / "copy.dump"
    assert main(["backup", str(target), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "backup refused" in err and "pg_dump --format=custom" in err
    assert not target.exists()


def test_a_password_in_the_url_query_is_never_shown(tmp_path: Path) -> None:
    """A password given as the URL's `password=` parameter is masked wherever the database is
    named, like one given before the host."""
    url = "postgresql://depositd@127.0.0.1:1/depositd?sslmode=disable&password=query-pw"
    settings = load_settings(write_config(tmp_path, make_config({"url": url})))
    assert "query-pw" not in settings.storage.where
    assert settings.storage.where.endswith("?sslmode=disable&password=***")
