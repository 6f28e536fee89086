"""The store a configuration's `storage` section names: SQLite's (`worker.store.sqlitestore`) or
PostgreSQL's (`worker.store.pgstore`, and psycopg with it, imported only then)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.store.sqlitestore import Store

if TYPE_CHECKING:
    from worker.config.settings import StorageSettings


def store_for(storage: StorageSettings) -> Store:
    """The store `storage` names: PostgreSQL with `url`, else the SQLite file at `path`."""
    if storage.url is not None:
        from worker.store.pgstore import PgStore

        password = storage.password.get_secret_value() if storage.password else None
        store: Store = PgStore(storage.url, password=password)
    else:
        store = Store(storage.file, synchronous=storage.synchronous)
    store.outage.alert_after_s = storage.outage_alert_s
    return store
