"""A minimal Debian 12 booted with systemd as PID 1 (systemd-nspawn), for tests/deploy.

The root filesystem is built once by mmdebstrap (`--variant=minbase`, the way slim images are
built, plus the packages below) and cached under CACHE, keyed on its package list; the locked
wheels of requirements/runtime.txt are downloaded once on this host, keyed on the lock, so the
container needs no network (`--private-network` keeps its ports off the host's). Each boot runs
on a throwaway overlay of the cached tree (`--volatile=overlay`): nothing it writes survives.

Commands enter the container with nsenter (PID 1 of this host need not be systemd, so nspawn
runs with `--register=no --keep-unit` and machinectl cannot reach it). Every wait has a deadline
and fails the test with what it saw.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DEPOSITD_TEST_CACHE", "/var/cache/depositd-tests"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# systemd as PID 1 and Python for the virtualenv; dbus for systemctl's and systemd-analyze's
# calls; jq for the deploy guide's log command. No procps: minimal images lack /bin/kill.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "jq")
# The container's interpreter (Debian 12's), for which the wheels are chosen.
PYTHON_TAGS = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"] + [
    arg
    for platform in (
        "manylinux2014_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux_2_34_x86_64",
        "linux_x86_64",
    )
    for arg in ("--platform", platform)
]
# A clean environment for commands in the container: nothing of the host's pip or Python
# settings leaks in.
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
TOOLS = {
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "nsenter": "util-linux",
}


class MachineError(Exception):
    """The container cannot be built, booted or reached; the message says what is missing."""


def missing_requirements() -> list[str]:
    """What this host lacks to boot the container, each with the way to get it."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root (systemd-nspawn boots the container as root): run as root")
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            problems.append(f"{tool}: apt-get install -y {package} (or `make tools` as root)")
    for ns in ("mnt", "pid", "uts", "ipc", "net"):
        if not Path(f"/proc/self/ns/{ns}").exists():
            problems.append(f"{ns} namespaces (/proc/self/ns/{ns}) in this kernel")
    return problems


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock in CACHE, so that two runs build one cache entry once."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def rootfs() -> Path:
    """The cached root filesystem, built when its package list changed (about two minutes)."""
    path = CACHE / f"rootfs-{_key(SUITE, MIRROR, 'minbase', *PACKAGES)}"
    with _locked("rootfs"):
        if (path / "usr/lib/systemd/systemd").exists():
            return path
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        proc = subprocess.run(
            [
                *("mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}"),
                *(SUITE, str(partial), MIRROR),
            ],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise MachineError(f"mmdebstrap failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        partial.rename(path)
    return path


def wheels() -> Path:
    """The locked runtime wheels for the container's Python, downloaded when the lock changed."""
    lock = REPO / "requirements" / "runtime.txt"
    path = CACHE / f"wheels-{_key(lock.read_bytes(), *PYTHON_TAGS)}"
    with _locked("wheels"):
        if (path / ".complete").exists():
            return path
        shutil.rmtree(path, ignore_errors=True)
        proc = subprocess.run(
            [
                *(
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                ),
                *("--require-hashes", "--only-binary", ":all:", *PYTHON_TAGS),
                *("-r", str(lock), "-d", str(path)),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if proc.returncode != 0:
            raise MachineError(f"pip download failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        (path / ".complete").touch()
    return path


class Machine:
    """A booted container: `run` executes a command inside, as root."""

    def __init__(self, tree: Path, binds: dict[Path, str], log: Path) -> None:
        self.log = log
        args = ["systemd-nspawn", "--quiet", "-D", str(tree), "--volatile=overlay"]
        args += ["--register=no", "--keep-unit", "--private-network", "--console=passive"]
        args += [f"--bind-ro={host}:{inside}" for host, inside in binds.items()]
        with log.open("wb") as out:
            self.nspawn = subprocess.Popen(
                [*args, "-b"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self.leader = self._find_leader(within_s=30)
            self._wait_for_systemd(within_s=30)
        except BaseException:
            self.close()  # a container that did not boot is not left running
            raise

    def _wait_for_systemd(self, within_s: float) -> None:
        """Until PID 1 is systemd and listens on its private socket, which systemctl needs."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise MachineError(f"systemd-nspawn exited {self.nspawn.returncode}: {self.tail()}")
            with contextlib.suppress(OSError):
                if self.path("/run/systemd/private").exists():
                    return
            time.sleep(0.1)
        raise MachineError(f"systemd did not start within {within_s} s: {self.tail()}")

    def _find_leader(self, within_s: float) -> int:
        """The container's PID 1 as this host sees it: the nspawn child whose NSpid ends in 1."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise MachineError(f"systemd-nspawn exited {self.nspawn.returncode}: {self.tail()}")
            for status in Path("/proc").glob("[0-9]*/status"):
                with contextlib.suppress(OSError):
                    fields = dict(
                        line.split(":", 1)
                        for line in status.read_text().splitlines()
                        if ":" in line
                    )
                    if fields.get("PPid", "").strip() == str(self.nspawn.pid) and fields.get(
                        "NSpid", ""
                    ).split()[-1:] == ["1"]:
                        return int(status.parent.name)
            time.sleep(0.1)
        raise MachineError(f"no PID 1 in the container after {within_s} s: {self.tail()}")

    def tail(self) -> str:
        """The end of the container's console output."""
        return self.log.read_text(errors="replace")[-3000:]

    def run(
        self, command: str, timeout: float = 60, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`sh -c command` inside the container; a non-zero exit fails when `check`."""
        proc = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "--", "/bin/sh", "-c", command],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=ENV,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"`{command}` exited {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def path(self, inside: str) -> Path:
        """A path of the container's file system, seen from this host."""
        return Path(f"/proc/{self.leader}/root") / inside.lstrip("/")

    def wait_until(self, what: str, command: str, within_s: float, every_s: float = 0.2) -> str:
        """Run `command` until it exits 0; its output, or a failure naming `what`."""
        deadline = time.monotonic() + within_s
        last: subprocess.CompletedProcess[str] | None = None
        while time.monotonic() < deadline:
            last = self.run(command, check=False, timeout=max(5.0, within_s))
            if last.returncode == 0:
                return last.stdout
            time.sleep(every_s)
        seen = "" if last is None else last.stdout + last.stderr
        raise AssertionError(f"{what}: not within {within_s} s; last output: {seen[-2000:]}")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """`systemctl show` properties of `unit`."""
        out = self.run(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def close(self) -> None:
        """Power the container off (SIGTERM to nspawn halts it), then kill what is left."""
        if self.nspawn.poll() is None:
            self.nspawn.send_signal(signal.SIGTERM)
            try:
                self.nspawn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.nspawn.pid, signal.SIGKILL)
                self.nspawn.wait(timeout=30)
