"""Alert channels (Slack incoming webhook, e-mail over SMTP) and the alert text."""

from __future__ import annotations

from worker.errors import NotifyError
from worker.notify.channels import (
    Notifier,
    notifiers_from_settings,
    send_all,
    send_once,
    send_with_retry,
)
from worker.notify.email import EmailNotifier
from worker.notify.message import Alert, build_alert, render_slack, render_text, subject
from worker.notify.slack import SlackNotifier

# The name used in the notify design notes; one class.
ChannelError = NotifyError

__all__ = [
    "Alert",
    "ChannelError",
    "EmailNotifier",
    "Notifier",
    "NotifyError",
    "SlackNotifier",
    "build_alert",
    "notifiers_from_settings",
    "render_slack",
    "render_text",
    "send_all",
    "send_once",
    "send_with_retry",
    "subject",
]
