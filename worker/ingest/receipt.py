"""What a webhook delivery passed before it was stored, as an evidence bundle states it
(docs/audit.md, "Evidence for one deposit").

Nothing reaches the events table without passing the checks of `worker.ingest.endpoint.Gate`:
API-KEY, the timestamp window, the body's size, API-SIGNATURE over the raw bytes before they
are parsed, then the envelope. A stored row keeps a few headers (`STORED_HEADERS`; API-KEY and
API-SIGNATURE are credentials and are not kept), not which secret verified nor the settings in
force at the time: the bundle says so rather than guess.
"""

from __future__ import annotations

from typing import Any

from worker.config.settings import WebhookSettings
from worker.store.sqlitestore import STORED_HEADERS


def checks_at_receipt(settings: WebhookSettings) -> dict[str, Any]:
    """The checks every stored delivery passed, with the settings in force now."""
    scheme = settings.scheme
    signed = "the method, the path and the body" if scheme.covers_path else "the body"
    return {
        "stored_only_after": [
            "API-KEY equal to webhook.api_key (compared in constant time)",
            f"API-TIMESTAMP within {settings.tolerance_s:g} s of the receiver's clock",
            f"body at most {settings.max_body_bytes} bytes",
            f"API-SIGNATURE verified over {signed} exactly as received, before parsing",
            "body a JSON object with eventId and eventType",
        ],
        "signature_scheme": scheme.describe(),
        "signature_settings": scheme.values(),
        "secrets_configured": len(settings.secret),
        "secret_that_verified": "not recorded (any one of the configured secrets is enough)",
        "headers_kept": list(STORED_HEADERS),
        "settings_as_of": "when this bundle was written; a delivery was checked with the"
        " settings in force when it arrived",
    }
