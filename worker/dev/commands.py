"""`depositd sandbox` and `depositd demo`: the development tools, imported when they run."""

from __future__ import annotations

import argparse


def run_sandbox(args: argparse.Namespace) -> int:
    """Run the provider sandbox (`worker.dev.sandbox.cli`), or one control call to the running
    one (`worker.dev.sandboxctl`)."""
    if getattr(args, "sandbox_command", None):
        from worker.dev import sandboxctl

        return sandboxctl.run(args)
    from worker.dev.sandbox.cli import run

    return run(args)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (`worker.dev.demo`)."""
    from worker.dev.demo import run

    return run(args)
