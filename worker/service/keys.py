"""The aiohttp application keys: what the running app holds, in one place."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from worker.config.settings import Settings
from worker.ingest.endpoint import Ingress, ReadyCheck
from worker.ingest.limits import Limits
from worker.metrics import Metrics
from worker.service.supervise import Supervisor
from worker.store.sqlitestore import Store
from worker.track.processor import Processor

SETTINGS_KEY = web.AppKey("settings", Settings)
STORE_KEY = web.AppKey("store", Store)
METRICS_KEY = web.AppKey("metrics", Metrics)
PROCESSOR_KEY = web.AppKey("processor", Processor)
INGRESS_KEY = web.AppKey("ingress", Ingress)
READY_CHECKS_KEY: web.AppKey[list[ReadyCheck]] = web.AppKey("ready_checks")
LIMITS_KEY = web.AppKey("limits", Limits)
# True when no other serve used the database as this one started (`worker.store.servelock`): the
# claims and leases recorded there belong to instances that are gone.
SOLE_KEY = web.AppKey("sole", bool)
# True when other serve instances held the database as this one started: a schema migration is
# refused (`worker.store.sqlitestore.migrate`); False when alone or not known (tests, commands).
OTHERS_KEY = web.AppKey("others_serving", bool)
# Checks the systemd watchdog pings depend on besides the event loop (the ingress process).
LIVENESS_KEY: web.AppKey[list[Callable[[], bool]]] = web.AppKey("liveness")
# The operator console's app (`console.listen`), when configured; `serve` runs it beside the rest.
CONSOLE_APP_KEY = web.AppKey("console_app", web.Application)
# The watcher of the long-running tasks (`worker.service.supervise`).
SUPERVISOR_KEY = web.AppKey("supervisor", Supervisor)
