"""`depositd register-address`: the known-address flow, imported when the command runs."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Register a known source address with the provider (`worker.poll.addresses`)."""
    from worker.poll.addresses import run as register

    return register(args)
