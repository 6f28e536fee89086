"""Start-up time of `depositd serve` and its parts (not a test).

Against the local sandbox (`depositd init --sandbox`), `--runs` times each:

- `python -c "import aiohttp, pydantic"`: the floor any aiohttp + pydantic service pays;
- the imports of `serve`'s stages (`import worker.service.setup`: `serve` imports them after
  starting the ingress process) and of the ingress process (`import worker.ingest.process`),
  each in a fresh interpreter;
- exec -> READY (the start-up step "rules, profiles and store checked: READY", logged as READY=1
  is sent), exec -> "serving" (the webhook answered from then on) and exec -> /healthz
  answered, with the parts seen in serve's log (its start-up steps, logged at debug): exec ->
  settings read (the interpreter, the imports of the command line and the settings), -> the
  ports and the database's lock held, -> the ingress process started, -> the rules, profiles
  and store checked (READY), -> the stages imported, -> built, -> "store open", -> the stages
  started, -> the ingress process listening, -> "serving".

Prints medians as JSON. docs/operations.md ("Start-up time") holds the figures.

    .venv/bin/python bench/startup.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

PY = sys.executable
# serve's log lines kept besides its start-up steps (logged at debug).
MILESTONES = ("store open", "leading", "serving", "shutting down", "stopped")
READY_STEP = "rules, profiles and store checked: READY"
LAST_LOG: dict[str, float] = {}


def timed(code: str) -> float:
    started = time.monotonic()
    subprocess.run([PY, "-c", code], check=True)
    return time.monotonic() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wall(line: dict[str, str]) -> float:
    return datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


def serve_once(config: Path, port: int, log: Path) -> dict[str, float]:
    """One start: seconds from exec to each milestone, then a clean stop."""
    with log.open("w") as err:
        started_wall, started = time.time(), time.monotonic()
        proc = subprocess.Popen(
            [PY, "-m", "worker", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = started + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
        else:
            raise SystemExit("serve did not answer /healthz: " + log.read_text())
        healthz = time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(30)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    at = {}
    for line in lines:
        if line["event"] == "start-up step":
            at.setdefault(line["step"], wall(line) - started_wall)
        elif line["event"] in MILESTONES:
            at.setdefault(line["event"], wall(line) - started_wall)
    global LAST_LOG
    LAST_LOG = {event: round(t, 3) for event, t in at.items()}
    return {
        "exec -> settings read": at["settings read"],
        "exec -> stages imported": at["stages imported"],
        "exec -> READY": at[READY_STEP],
        "exec -> store open": at["store open"],
        "exec -> serving": at["serving"],
        "exec -> /healthz": healthz,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        sbx = Path(tmp) / "sbx"
        subprocess.run(
            [PY, "-m", "worker", "init", "--sandbox", str(sbx)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        config = yaml.safe_load((sbx / "depositd.yaml").read_text())
        port = free_port()
        config["webhook"]["listen"] = f"127.0.0.1:{port}"
        config.pop("console", None)
        config["log"] = {"format": "json", "level": "debug"}  # with the start-up steps
        serve_config = sbx / "serve.yaml"
        serve_config.write_text(yaml.safe_dump(config))
        sandbox = subprocess.Popen(
            [PY, "-m", "worker", "sandbox", "--config", str(sbx / "depositd.yaml")],
            cwd=sbx,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(args.runs):
                add("import aiohttp, pydantic", timed("import aiohttp, pydantic"))
                add("import worker.service.setup", timed("import worker.service.setup"))
                add("import worker.ingest.process", timed("import worker.ingest.process"))
                for name, value in serve_once(serve_config, port, Path(tmp) / "serve.log").items():
                    add(name, value)
        finally:
            sandbox.terminate()
            sandbox.wait(30)
    medians = {name: round(statistics.median(v), 3) for name, v in figures.items()}
    medians["READY / import aiohttp, pydantic"] = round(
        medians["exec -> READY"] / medians["import aiohttp, pydantic"], 2
    )
    print(json.dumps(medians, indent=1))
    print("the last start, seconds from exec to each step:")
    print(json.dumps(LAST_LOG, indent=1))


if __name__ == "__main__":
    main()
