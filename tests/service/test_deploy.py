"""deploy/: the systemd unit, the example configuration and install.sh."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from jsonschema import Draft7Validator
from pydantic import BaseModel

from worker import __version__
from worker.commands.schema import text_of
from worker.config.settings import Settings, load_settings
from worker.config.yamlsrc import loads
from worker.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "depositd.service"
EXAMPLE = DEPLOY / "depositd.example.yaml"
INSTALL = DEPLOY / "install.sh"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
# The units shipped next to depositd.service: the socket holding the webhook port, first-start
# setup and the daily backup.
COMPANIONS = (
    "depositd.socket",
    "depositd-setup.service",
    "depositd-backup.service",
    "depositd-backup.timer",
)
CREDENTIALS = (
    "api_secret",
    "webhook_secret",
    "console_token",
    "slack_webhook_url",
    "smtp_password",
    "db_password",
)
# Keys the example shows commented out: the alternative to storage.path (PostgreSQL).
ALTERNATIVES = ("storage.url", "storage.password")

needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed on this machine"
)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (keys may repeat, e.g. LoadCredential)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def verify_unit(text: str, tmp_path: Path) -> tuple[int, list[str]]:
    """Run systemd-analyze verify on a copy; return its status and the lines about the unit."""
    assert SYSTEMD_ANALYZE is not None
    folder = tmp_path / "units"
    folder.mkdir(exist_ok=True)
    path = folder / "depositd.service"
    # verify insists that ExecStart exists; any real executable stands in for the virtualenv's.
    path.write_text(text.replace("/opt/depositd/venv/bin/depositd", sys.executable))
    # The units it names (Wants=) and the backup timer's, checked in the same run; depositctl
    # stands in as an executable too.
    others = []
    for name in COMPANIONS:
        other = folder / name
        other.write_text(
            (DEPLOY / name).read_text().replace("/opt/depositd/bin/depositctl", "/bin/sh")
        )
        others.append(str(other))
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", "--generators=no", str(path), *others],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Unknown keys and bad values are only warnings (status 0): every line naming our unit
    # counts. Lines about the host's own units (targets we order after) are not ours to judge.
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if "depositd" in line]
    return proc.returncode, ours


@needs_systemd_analyze
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit and its companions (setup, backup service and
    timer) without a single warning about them."""
    status, problems = verify_unit(UNIT.read_text(), tmp_path)
    assert (status, problems) == (0, [])


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("[Install]", "ProtectSytem=strict\n[Install]"), "ProtectSytem"),
        (("WatchdogSec=30", "WatchdogSec=thirty"), "thirty"),
    ],
)
def test_verify_check_catches_a_broken_unit(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    """The verify check above reports a misspelt key or a bad value, so it can fail."""
    status, problems = verify_unit(UNIT.read_text().replace(*change, 1), tmp_path)
    assert status != 0 or any(expected in line for line in problems)


@needs_systemd_analyze
def test_unit_security_exposure_is_at_most_1_3(tmp_path: Path) -> None:
    """`systemd-analyze security` rates the unit 1.3 or better, with PrivateMounts=yes and
    ProcSubset=pid among its settings."""
    assert SYSTEMD_ANALYZE is not None
    service = parse_unit(UNIT.read_text())["Service"]
    assert service["PrivateMounts"] == ["yes"]
    assert service["ProcSubset"] == ["pid"]
    path = tmp_path / "depositd.service"
    path.write_text(UNIT.read_text().replace("/opt/depositd/venv/bin/depositd", sys.executable))
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for depositd.service: (\d+\.\d)", proc.stdout)
    assert match is not None, proc.stdout + proc.stderr
    assert float(match[1]) <= 1.3


def test_unit_settings() -> None:
    """The unit is Type=notify with a watchdog, restarts on failure and is sandboxed."""
    unit = parse_unit(UNIT.read_text())
    service = unit["Service"]
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "RestartSec": "5",
        "StateDirectory": "depositd",
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "SystemCallArchitectures": "native",
        "Environment": "DEPOSITD_CONFIG=/etc/depositd/depositd.yaml",
        "ExecStart": "/opt/depositd/venv/bin/depositd serve",
        # The shell's builtin kill: minimal images have no /bin/kill (procps).
        "ExecReload": "/bin/sh -c 'kill -HUP \"$1\"' depositd-reload $MAINPID",
        "KillSignal": "SIGTERM",
        "TimeoutStopSec": "30",
    }
    for key, value in expected.items():
        assert value in service[key], key
    loaded = dict(value.split(":", 1) for value in service["LoadCredential"])
    assert loaded == {
        "api_secret": "/etc/depositd/credentials/api_secret",
        "webhook_secret": "/etc/depositd/credentials/webhook_secret",
        "console_token": "/etc/depositd/credentials/console_token",
    }
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_every_credential_the_example_reads_is_loaded_by_the_unit() -> None:
    """Each ${CREDENTIALS_DIRECTORY}/NAME in the example has a LoadCredential line for NAME."""
    used = set(re.findall(r"\$\{CREDENTIALS_DIRECTORY\}/(\w+)", EXAMPLE.read_text()))
    assert used == set(CREDENTIALS)
    # Optional channels' lines are commented out (a missing file would stop the unit).
    lines = re.findall(r"^#?LoadCredential=(\w+):/etc/depositd/credentials/(\w+)$",
                       UNIT.read_text(), re.MULTILINE)  # fmt: skip
    assert {name for name, file in lines if name == file} == used


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A credentials folder as systemd would fill it, plus the example's ${VAR}s."""
    folder = tmp_path / "credentials"
    folder.mkdir()
    for name in CREDENTIALS:
        (folder / name).write_text(f"{name}-value\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(folder))
    monkeypatch.setenv("PROVIDER_API_KEY", "key-1")
    monkeypatch.setenv("SMTP_USER", "depositd")
    return folder


def test_example_config_validates(credentials: Path) -> None:
    """The example loads with the credentials present; secrets come from the files."""
    settings = load_settings(EXAMPLE)
    assert settings.provider.api_key.get_secret_value() == "key-1"
    assert settings.provider.api_secret.get_secret_value() == "api_secret-value"
    assert [s.get_secret_value() for s in settings.webhook.secret] == ["webhook_secret-value"]
    assert settings.webhook.api_key.get_secret_value() == "key-1"
    assert settings.notify.slack is not None
    assert settings.notify.slack.webhook_url.get_secret_value() == "slack_webhook_url-value"
    assert settings.notify.email is not None
    assert settings.notify.email.password is not None
    assert settings.notify.email.password.get_secret_value() == "smtp_password-value"
    assert settings.notify.email.username == "depositd"
    assert settings.storage.path == Path("/var/lib/depositd/depositd.db")
    assert settings.rules == Path("/etc/depositd/rules")
    assert settings.profiles == Path("/etc/depositd/profiles.yaml")
    assert settings.log.format == "json"


def _keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = f"{prefix}{field.alias or name}"
        nested = [
            arg
            for arg in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(arg, type) and issubclass(arg, BaseModel)
        ]
        if nested:
            yield from _keys(nested[0], key + ".")
        else:
            yield key


def test_example_config_sets_every_key(credentials: Path) -> None:
    """Every key Settings accepts is spelt out in the example (directly or as <key>_file); the
    alternatives to storage.path commented out, ready to use."""
    example = load_settings(EXAMPLE)
    dumped = example.model_dump(by_alias=True, exclude_unset=True)
    text = EXAMPLE.read_text()
    for key in ALTERNATIVES:
        name = key.rpartition(".")[2]
        assert re.search(rf"^\s*# {name}(_file)?: \S", text, re.MULTILINE), key
    missing = []
    for key in _keys(Settings):
        if key in ALTERNATIVES:
            continue
        holder: typing.Any = dumped
        for part in key.split("."):
            holder = holder.get(part) if isinstance(holder, dict) else None
        if holder is None:
            missing.append(key)
    assert missing == []


def test_example_config_names_a_missing_credential(credentials: Path) -> None:
    """Without the smtp_password credential, loading names the key, file and line."""
    (credentials / "smtp_password").unlink()
    with pytest.raises(ConfigError) as info:
        load_settings(EXAMPLE)
    line = next(
        n
        for n, text in enumerate(EXAMPLE.read_text().splitlines(), 1)
        if text.strip().startswith("password_file")
    )
    assert info.value.problems == [
        f"{EXAMPLE}:{line}: notify.email.password_file: cannot read "
        f"{credentials / 'smtp_password'}: No such file or directory"
    ]


def test_rotation_lists_two_secret_files(credentials: Path, tmp_path: Path) -> None:
    """The README's rotation step (two secret files) gives the webhook both secrets."""
    (credentials / "webhook_secret_new").write_text("new-value\n")
    text = EXAMPLE.read_text().replace(
        "  secret_file: ${CREDENTIALS_DIRECTORY}/webhook_secret\n",
        "  secret_file:\n"
        "    - ${CREDENTIALS_DIRECTORY}/webhook_secret\n"
        "    - ${CREDENTIALS_DIRECTORY}/webhook_secret_new\n",
    )
    config = tmp_path / "depositd.yaml"
    config.write_text(text)
    secrets = [s.get_secret_value() for s in load_settings(config).webhook.secret]
    assert secrets == ["webhook_secret-value", "new-value"]


# --- install.sh -------------------------------------------------------------------------------

PREFIX = "/opt/depositd-test"


@dataclass
class Installed:
    """A tree install.sh wrote under a temporary root."""

    root: Path
    output: str
    new_in_source: set[str]

    @property
    def etc(self) -> Path:
        """The root's /etc/depositd."""
        return self.root / "etc/depositd"

    @property
    def venv(self) -> Path:
        """The virtualenv under the prefix."""
        return self.root / PREFIX.lstrip("/") / "venv"


def run_install(root: Path) -> str:
    """Run install.sh into `root`; return its output, failing the test on a non-zero exit."""
    proc = subprocess.run(
        ["bash", str(INSTALL), "--root", str(root), "--prefix", PREFIX, "--python", sys.executable],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# The install (a virtualenv from the locked wheels) takes minutes on a busy machine: the tests
# that share it may wait that long in their setup.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """One install into a temporary root, shared by the tests below (it takes a few seconds)."""
    root = tmp_path_factory.mktemp("root")
    before = {p.name for p in REPO.iterdir()}
    output = run_install(root)
    return Installed(root, output, {p.name for p in REPO.iterdir()} - before)


def tree(root: Path) -> set[str]:
    """Every path under root, the virtualenv's contents left out."""
    paths = {p.relative_to(root) for p in root.rglob("*")}
    return {str(p) for p in paths if "venv" not in p.parts[:-1]}


def test_install_puts_files_in_place(installed: Installed) -> None:
    """Config, env, rules, profiles, examples, credentials folder, unit and docs land in place."""
    etc = installed.etc
    share = installed.root / PREFIX.lstrip("/") / "share"
    assert (etc / "depositd.yaml").read_text() == installed_copy(EXAMPLE.read_text())
    # Never the demo's fictitious payers: an empty profiles file.
    assert "profiles: {}" in (etc / "profiles.yaml").read_text()
    assert "Demo" not in (etc / "profiles.yaml").read_text()
    shipped_sets = {
        p.name for p in (REPO / "rules").glob("*.yaml") if p.name != "profiles.yaml"
        and "example" not in p.name
    }  # fmt: skip
    assert {p.name for p in (etc / "rules").iterdir()} == shipped_sets
    examples = {p.name for p in (REPO / "rules").rglob("*example*.yaml")}
    assert {p.name for p in (etc / "examples").iterdir()} == examples
    assert (share / "doc/deploy.md").is_file()
    assert (share / "depositd.example.yaml").read_text() == installed_copy(EXAMPLE.read_text())
    # A staged tree ships no secret, not even the console's login token: every host built from
    # it would share one. depositd-setup.service makes it on the target (tests/deploy).
    assert list((etc / "credentials").iterdir()) == []
    # The config group and the folders' modes, for systemd-sysusers and systemd-tmpfiles on
    # the target (a staged tree has no /etc/group, and its owners are the build's).
    sysusers = (share / "sysusers.conf").read_text()
    assert "g depositd-config -" in sysusers.splitlines()
    tmpfiles = (share / "tmpfiles.conf").read_text().splitlines()
    assert "d /etc/depositd 0750 root depositd-config -" in tmpfiles
    assert "d /etc/depositd/credentials 0700 root root -" in tmpfiles
    units = installed.root / "etc/systemd/system"
    assert {p.name for p in units.iterdir()} == {
        "depositd.service",
        "depositd.socket",
        "depositd-setup.service",
        "depositd-backup.service",
        "depositd-backup.timer",
    }
    modes = {
        "etc/depositd": 0o750,
        "etc/depositd/credentials": 0o700,
        "etc/depositd/depositd.env": 0o600,
        "etc/depositd/depositd.yaml": 0o644,
    }
    for path, mode in modes.items():
        assert stat.S_IMODE((installed.root / path).stat().st_mode) == mode, path


def installed_copy(text: str) -> str:
    """A shipped YAML file as installed: its schema line names the installed schema."""
    return re.sub(r"\$schema=\S*/", f"$schema={PREFIX}/share/schemas/", text, count=1)


def test_installed_yaml_names_the_installed_schemas(installed: Installed) -> None:
    """Every YAML file install.sh writes names, in its `$schema=` line, a schema file that the
    install wrote from the installed depositd (`depositd schema KIND`), valid for that file."""
    files = sorted(installed.root.glob("etc/depositd/**/*.yaml"))
    files += sorted((installed.root / PREFIX.lstrip("/") / "share").rglob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        line = path.read_text().splitlines()[0]
        m = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", line)
        assert m, path
        schema = installed.root / m.group(1).lstrip("/")
        assert m.group(1).startswith(f"{PREFIX}/share/schemas/") and schema.is_file(), path
        kind = schema.name.split(".")[0]
        assert schema.read_text() == text_of(kind)
        data = loads(path.read_text(), path, bool_keys_as_text=True).data
        errors = list(
            Draft7Validator(json.loads(schema.read_text())).iter_errors(
                json.loads(json.dumps(data, default=str))
            )
        )
        assert errors == [], path


def test_install_rewrites_the_unit_for_the_prefix(installed: Installed) -> None:
    """The installed unit runs the prefix's virtualenv; the rest is the shipped unit."""
    text = (installed.root / "etc/systemd/system/depositd.service").read_text()
    assert "/opt/depositd/" not in text
    assert text == UNIT.read_text().replace("/opt/depositd/", PREFIX + "/")
    assert parse_unit(text)["Service"]["ExecStart"] == [f"{PREFIX}/venv/bin/depositd serve"]


def test_staged_tree_names_only_final_paths(installed: Installed) -> None:
    """Nothing under the staged root names the staging directory (the tree runs where it is
    copied to, not where it was built): the console scripts' #! lines, pyvenv.cfg, the
    activate scripts and the byte code name the prefix."""
    staged = str(installed.root)
    leaked = [
        str(path)
        for path in installed.root.rglob("*")
        if path.is_file() and not path.is_symlink() and staged.encode() in path.read_bytes()
    ]
    assert leaked == []
    script = (installed.venv / "bin/depositd").read_text().splitlines()[0]
    assert script == f"#!{PREFIX}/venv/bin/python"
    assert f"{PREFIX}/venv" in (installed.venv / "pyvenv.cfg").read_text()
    code = next((installed.venv / "lib").rglob("worker/__pycache__/logs.*.pyc")).read_bytes()
    assert f"{PREFIX}/venv/lib/".encode() in code


def test_installed_depositd_runs(installed: Installed) -> None:
    """The installed package runs on its own virtualenv's interpreter and prints its help
    (the staged console script names the final path, tested above and in tests/deploy)."""
    proc = subprocess.run(
        [str(installed.venv / "bin/python"), "-m", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        cwd=installed.root,
    )
    assert proc.returncode == 0, proc.stderr
    assert "serve" in proc.stdout
    assert "check" in proc.stdout
    # The package comes from the virtualenv, not from the source tree.
    where = subprocess.run(
        [str(installed.venv / "bin/python"), "-c", "import worker; print(worker.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=installed.root,
    )
    assert where.stdout.startswith(str(installed.venv))


def test_install_takes_exactly_the_runtime_lock(installed: Installed) -> None:
    """install.sh installs the pinned versions of requirements/runtime.txt and nothing else:
    no dev tools, no demo SMTP server."""
    listing = subprocess.run(
        [
            str(installed.venv / "bin/python"),
            "-c",
            "from importlib import metadata\n"
            "for d in metadata.distributions(): print(d.metadata['Name'], d.version)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    have = {
        re.sub(r"[-_.]+", "-", name).lower(): version
        for name, version in (line.split() for line in listing.splitlines())
    }
    assert have.pop("depositd") == __version__
    pins = dict(
        re.findall(
            r"^([a-z0-9][a-z0-9-]*)==(\S+)", (REPO / "requirements/runtime.txt").read_text(), re.M
        )
    )
    assert have == pins
    assert "aiosmtpd" not in have


def test_installed_service_has_no_demo_smtp_server(installed: Installed) -> None:
    """The service install leaves the demo's SMTP server out; `depositd demo` there names the
    extra to install instead of failing with a traceback."""
    proc = subprocess.run(
        [str(installed.venv / "bin/python"), "-m", "worker", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install 'depositd[demo]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_installed_check_accepts_the_installed_config(
    installed: Installed, credentials: Path, tmp_path: Path
) -> None:
    """`depositd check` passes on the installed config, rules and profiles with credentials."""
    config = tmp_path / "depositd.yaml"
    # The installed config names host paths (/etc/depositd/...); point them into the root.
    config.write_text(
        (installed.etc / "depositd.yaml")
        .read_text()
        .replace("/etc/depositd/", f"{installed.etc}/")
        .replace("/var/lib/depositd/", f"{tmp_path}/")
    )
    proc = subprocess.run(
        [str(installed.venv / "bin/python"), "-m", "worker", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=installed.root,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"ok: {config}")


def test_depositctl_is_valid_shell(installed: Installed) -> None:
    """The depositctl helper parses with sh and runs the prefix's depositd as the service user."""
    helper = installed.root / PREFIX.lstrip("/") / "bin/depositctl"
    assert os.access(helper, os.X_OK)
    subprocess.run(["sh", "-n", str(helper)], check=True, timeout=10)
    text = helper.read_text()
    assert f"{PREFIX}/venv/bin/depositd" in text
    assert "-p User=depositd" in text
    assert "SupplementaryGroups=depositd-config" in text


def test_install_twice_keeps_merchant_edits(installed: Installed) -> None:
    """A second run keeps edited config and rules, does not bring back a removed rule set,
    restores a deleted (empty) profiles file, reuses the venv."""
    etc = installed.etc
    edited = (etc / "depositd.yaml").read_text().replace("level: info", "level: debug")
    (etc / "depositd.yaml").write_text(edited)
    (etc / "depositd.env").write_text("PROVIDER_API_KEY=mine\n")
    # The merchant replaces the shipped catch-all rule set with one of their own.
    removed = etc / "rules/default.yaml"
    rule_set = etc / "rules/mine.yaml"
    rule_set.write_text(removed.read_text() + "# merchant note\n")
    removed.unlink()
    (etc / "profiles.yaml").unlink()
    (etc / "credentials/api_secret").write_text("s3cret\n")
    venv_python = (installed.venv / "bin/python").stat()
    before = tree(installed.root)

    output = run_install(installed.root)

    assert "created virtualenv" not in output
    assert (installed.venv / "bin/python").stat().st_ino == venv_python.st_ino
    assert tree(installed.root) == before | {"etc/depositd/profiles.yaml"}
    assert (etc / "depositd.yaml").read_text() == edited
    assert (etc / "depositd.env").read_text() == "PROVIDER_API_KEY=mine\n"
    assert rule_set.read_text().endswith("# merchant note\n")
    assert not removed.exists()
    assert "profiles: {}" in (etc / "profiles.yaml").read_text()
    assert (etc / "credentials/api_secret").read_text() == "s3cret\n"
    assert f"kept {etc / 'depositd.yaml'}" in output


def test_install_leaves_the_source_tree_clean(installed: Installed) -> None:
    """install.sh builds from a copy: no build/ or *.egg-info appear in the source tree."""
    assert installed.new_in_source == set()


def test_install_rejects_bad_options(tmp_path: Path) -> None:
    """Unknown options and a relative prefix exit 2 with a message, before touching anything."""
    for args in (["--bogus"], ["--prefix", "relative/dir"], ["--prefix", "/opt/with space"]):
        proc = subprocess.run(
            ["bash", str(INSTALL), "--root", str(tmp_path / "r"), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 2, args
        assert "install.sh:" in proc.stderr
        assert not (tmp_path / "r/etc").exists()


def test_depositctl_loads_what_the_unit_loads(installed: Installed, tmp_path: Path) -> None:
    """depositctl passes exactly the credentials the unit and its drop-ins load (as
    `systemctl cat` shows them), not every file of the credentials folder, so `depositctl
    check` fails when `systemctl start` would. systemctl and systemd-run are stand-ins here
    (no service manager runs in the test): one prints a unit, the other its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    unit = (
        UNIT.read_text()
        + "\n# /etc/systemd/system/depositd.service.d/override.conf\n[Service]\n"
        + "LoadCredential=smtp_password:/etc/depositd/credentials/smtp_password\n"
    )
    (bin_dir / "unit.txt").write_text(unit)
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\ncat "{bin_dir}/unit.txt"\n')
    (bin_dir / "systemd-run").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    for tool in ("systemctl", "systemd-run"):
        (bin_dir / tool).chmod(0o755)
    helper = installed.root / PREFIX.lstrip("/") / "bin/depositctl"
    proc = subprocess.run(
        ["sh", str(helper), "check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    loaded = sorted(a.split("=", 1)[1].split(":")[0] for a in proc.stdout.splitlines()
                    if a.startswith("LoadCredential="))  # fmt: skip
    assert loaded == ["api_secret", "console_token", "smtp_password", "webhook_secret"]
    assert proc.stdout.splitlines()[-2:] == [f"{PREFIX}/venv/bin/depositd", "check"]


def test_depositctl_has_the_units_protections(installed: Installed, tmp_path: Path) -> None:
    """depositctl's transient unit gets every protection of the unit's hardening block (so it
    cannot read /home either) and keeps the state folder 0700, where a transient unit's
    default would open it (0755). systemd-run is a stand-in that prints its arguments; the real
    behaviour is checked under systemd in tests/deploy."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\ncat "{UNIT}"\n')
    (bin_dir / "systemd-run").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    for tool in ("systemctl", "systemd-run"):
        (bin_dir / tool).chmod(0o755)
    helper = installed.root / PREFIX.lstrip("/") / "bin/depositctl"
    args = subprocess.run(
        ["sh", str(helper), "check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    ).stdout.splitlines()
    given = {args[i + 1] for i, arg in enumerate(args) if arg == "-p"}
    text = UNIT.read_text()
    hardening = text[text.index("# Hardening.") : text.index("[Install]")]
    wanted = {line for line in hardening.splitlines() if line and not line.startswith("#")}
    assert wanted, hardening
    assert wanted <= given, sorted(wanted - given)
    assert {"StateDirectoryMode=0700", "UMask=0077", "ProtectHome=yes"} <= given


@pytest.mark.parametrize(
    "arg", ["/home/alice/x.yaml", "/root/e.json", "/tmp/copy.db", "--config=/home/a.yaml"]
)
def test_depositctl_refuses_paths_its_command_cannot_see(
    installed: Installed, tmp_path: Path, arg: str
) -> None:
    """A path under /home, /root or /tmp is refused (exit 2) before anything runs: the command
    could not read it, or would write a file into a /tmp of its own that vanishes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\ncat "{UNIT}"\n')
    (bin_dir / "systemd-run").write_text("#!/bin/sh\necho ran\n")
    for tool in ("systemctl", "systemd-run"):
        (bin_dir / tool).chmod(0o755)
    helper = installed.root / PREFIX.lstrip("/") / "bin/depositctl"
    proc = subprocess.run(
        ["sh", str(helper), "backup", arg],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 2
    assert "ran" not in proc.stdout
    assert f"depositctl: {arg}: " in proc.stderr
    assert "/etc/depositd or /var/lib/depositd" in proc.stderr


def test_install_under_root_says_what_root_is_for(installed: Installed) -> None:
    """With --root, install.sh says the tree is staged (its paths are the final system's) and
    names every credential the installed config reads, with the drop-in lines for the
    optional channels; --help says what --root is for."""
    out = installed.output
    assert f"staged under {installed.root}" in out
    assert "nothing here runs or checks from" in out
    for name in CREDENTIALS:
        if name != "db_password":  # read only with storage.url, commented out in the example
            assert f"/etc/depositd/credentials/{name}" in out
    assert "db_password" not in out
    for name in ("slack_webhook_url", "smtp_password"):
        assert f"LoadCredential={name}:/etc/depositd/credentials/{name}" in out
    usage = subprocess.run(
        ["bash", str(INSTALL), "--help"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert "stage the files under DIR" in usage and "not to run them there" in usage
