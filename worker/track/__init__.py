"""Tracking: facts from webhooks and polls, the pure tracker, the processor."""
