"""Polls: the scheduler's jobs and the known-address flow."""
