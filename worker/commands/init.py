"""`depositd init --sandbox DIR`: a working local setup against the provider sandbox.

DIR gets a configuration with three free loopback ports fixed in it (the sandbox's, the
webhook's and the operator console's), a rules folder laid out as the shipped one (`rules/`:
the default rule set, the per-wallet example under `examples/` and a profiles file with one
fictitious profile, so every path those files mention exists), the credentials and the
console's login token as files under `secrets/` (read through `*_file` keys), the JSON Schemas
of the three YAML files under `schemas/` (each file's `# yaml-language-server: $schema=` line
names its own: editors complete and check keys, docs/configuration.md), and the database path
(the first `serve` creates it). No alert channel is configured: alerts are logged only, as the
config file's comment says.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import socket
import sys
from pathlib import Path

from worker.commands.schema import KINDS, text_of
from worker.config.shipped import shipped_rules
from worker.errors import ConfigError

_CONFIG = """\
# yaml-language-server: $schema=schemas/config.schema.json
# A local setup against the provider sandbox, written by `depositd init --sandbox`.
# Terminal 1: {depositd} sandbox --config {config} --auto-review
# Terminal 2: {depositd} serve --config {config}
# Then:       {depositd} sandbox inject --config {config} --amount 125.50
# Console:    http://127.0.0.1:{console_port}/ (login token: secrets/console_token)
# Every key is described in docs/reference.md. Relative paths resolve against this folder.

provider:
  base_url: http://127.0.0.1:{sandbox_port}   # where `depositd sandbox` listens
  api_key_file: secrets/provider_api_key
  api_secret_file: secrets/provider_api_secret
  signature: published                        # how requests are signed (docs/signatures.md)

webhook:
  listen: 127.0.0.1:{webhook_port}            # where the sandbox delivers webhooks
  path: /webhooks/provider
  api_key_file: secrets/provider_api_key
  secret_file: secrets/webhook_secret
  signature: published                        # how deliveries are signed; the sandbox follows

storage:
  path: depositd.db

scheduler:
  history_interval_s: 10                      # poll often: a local setup has nothing to spare
  detail_interval_s: 10

rules: rules                                  # a folder: every rules/*.yaml (docs/rules.md)
profiles: rules/profiles.yaml

console:
  listen: 127.0.0.1:{console_port}            # the operator console (docs/console.md)
  token_file: secrets/console_token           # its login token
  hosted_url: http://127.0.0.1:{sandbox_port}/hosted   # the sandbox's hosted Travel Rule page

# notify: no channel, so alerts are logged only (a warning line named "alert") and
# `depositd check` says so. Add notify.slack or notify.email (docs/reference.md) to send them.

log:
  format: console
  level: info
"""

_PROFILES = """\
# yaml-language-server: $schema=../schemas/profiles.schema.json
# Payer profiles for the local sandbox setup. The one profile here is fictitious: its name,
# company and address are made up, for the sandbox only. Every field: docs/reference.md.
profiles:
  fictitious-demo-payer:
    correspondentType: ENTITY
    fullName: Fictitious Demo Payer Ltd
    countryCode: SG
    companyAddress: 1 Example Road, Singapore
    walletType: VASP
    provider: Binance
    walletLabel: Fictitious demo wallet
    addressType: STANDARD

# Deposits into wallet 1002 from an address no profile names use the fictitious profile.
wallets:
  1002: fictitious-demo-payer
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def default_rules() -> Path:
    """The shipped default rule set, `rules/default.yaml`."""
    return shipped_rules() / "default.yaml"


def invoked_as(argv0: str | None = None) -> str:
    """The command as this process was started, for the commands `init` prints: `depositd`
    when that name on PATH is this very program, else its path (`.venv/bin/depositd` made
    absolute), or `PYTHON -m worker`."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).name == "__main__.py" or not argv0:
        return f"{shlex.quote(sys.executable)} -m worker"
    name = Path(argv0).name
    found = shutil.which(name)
    if found is not None and os.path.realpath(found) == os.path.realpath(argv0):
        return name
    return shlex.quote(os.path.abspath(argv0))


_CREDENTIALS = ("provider_api_key", "provider_api_secret", "webhook_secret", "console_token")


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports."""
    ports: list[int] = []
    while len(ports) < count:
        port = _free_port()
        if port not in ports:
            ports.append(port)
    return ports


def write_sandbox_setup(folder: Path, depositd: str = "depositd") -> Path:
    """Write the setup into `folder` (created; must be empty); return the config's path."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError([f"{folder}: exists and is not an empty folder; give a new one"])
    rules = default_rules().read_text(encoding="utf-8")
    example = (shipped_rules() / "examples" / _EXAMPLE).read_text(encoding="utf-8")
    folder.mkdir(parents=True, exist_ok=True)
    secret_dir = folder / "secrets"
    secret_dir.mkdir(mode=0o700)
    for name in _CREDENTIALS:
        path = secret_dir / name
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24) + "\n", encoding="utf-8")
    config = folder / "depositd.yaml"
    sandbox_port, webhook_port, console_port = free_ports(3)
    config.write_text(
        _CONFIG.format(
            config=config,
            sandbox_port=sandbox_port,
            webhook_port=webhook_port,
            console_port=console_port,
            depositd=depositd,
        ),
        encoding="utf-8",
    )
    # The shipped layout (rules/default.yaml, rules/profiles.yaml, rules/examples/): the
    # paths the default rules and the example name exist here as they do in the repository.
    (folder / "rules" / "examples").mkdir(parents=True)
    (folder / "rules" / "default.yaml").write_text(
        _schema_line(rules, "../schemas/rules"), encoding="utf-8"
    )
    (folder / "rules" / "examples" / _EXAMPLE).write_text(
        _schema_line(example, "../../schemas/rules"), encoding="utf-8"
    )
    (folder / "rules" / "profiles.yaml").write_text(_PROFILES, encoding="utf-8")
    (folder / "schemas").mkdir()
    for kind in KINDS:
        (folder / "schemas" / f"{kind}.schema.json").write_text(text_of(kind), encoding="utf-8")
    return config


_EXAMPLE = "wallet-1001.example.yaml"


def console_address(config: Path) -> str:
    """The console's URL in a configuration `init` wrote."""
    found = re.search(
        r"^  listen: (127\.0\.0\.1:\d+) +# the operator console", config.read_text(), re.M
    )
    assert found is not None
    return f"http://{found.group(1)}/"


def _schema_line(text: str, schema: str) -> str:
    """`text` with its `$schema=` line naming `SCHEMA.schema.json`."""
    line = f"# yaml-language-server: $schema={schema}.schema.json\n"
    text, found = _MODELINE.subn(line, text, count=1)
    return text if found else line + text


_MODELINE = re.compile(r"^# yaml-language-server: \$schema=.*\n", re.M)


def run(args: argparse.Namespace) -> int:
    """`depositd init --sandbox DIR`."""
    depositd = invoked_as()
    config = write_sandbox_setup(Path(args.sandbox).resolve(), depositd)
    quoted = shlex.quote(str(config))
    print(f"wrote depositd.yaml, rules/, schemas/ and secrets/ in {config.parent}")
    print("next, in two terminals:")
    print(f"  {depositd} sandbox --config {quoted} --auto-review")
    print(f"  {depositd} serve --config {quoted}")
    print("then inject a deposit and look:")
    print(f"  {depositd} sandbox inject --config {quoted} --amount 125.50")
    print(f"  {depositd} deposits --config {quoted}")
    print(f"  {depositd} ledger --config {quoted}")
    token = shlex.quote(str(config.parent / "secrets" / "console_token"))
    print(f"the console, while serve runs: {console_address(config)}")
    print(f"its login token: cat {token}")
    return 0
