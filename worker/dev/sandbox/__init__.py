"""The provider sandbox (docs/sandbox.md): the provider's deposit-whitelist and wallet
operations on loopback, with the real state machine, balances, signed webhooks and a control API.
"""

from __future__ import annotations

from worker.dev.sandbox.app import create_app
from worker.dev.sandbox.config import SandboxConfig, WalletSpec
from worker.dev.sandbox.handle import SANDBOX_KEY, Sandbox

__all__ = ["SANDBOX_KEY", "Sandbox", "SandboxConfig", "WalletSpec", "create_app"]
