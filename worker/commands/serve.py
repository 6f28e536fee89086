"""`depositd serve`: the service, imported when the command runs (the command line starts fast)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT (`worker.service.serve`)."""
    from worker.service.serve import run_serve

    return run_serve(args)
