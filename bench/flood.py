"""Unauthenticated flood against `depositd serve` (not a test): the ingress limits at work.

Opens `--connections` connections that each announce a 1 MB body without an API-KEY and send
it, and as many that send nothing, then posts signed deliveries through the flood. Reports the
ingress process's peak memory (VmHWM), the deliveries' answers and how many flood connections
the server closed.

    .venv/bin/python bench/flood.py --connections 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from ingest import event
from realistic import API_KEY, PATH, ROOT, SECRET, start_serve, write_config

from worker.provider.signing import signed_headers

BODY = b"x" * 1_000_000


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def ingress_pid(parent: int) -> int:
    """The ingress process (the child of `serve`)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(") ")[2].split()[1]) == parent:
                return int(entry)
    return parent


async def unauthenticated(port: int, idle: bool) -> bool:
    """One flood connection; True when the server closed it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if not idle:
            writer.write(
                f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
            )
            writer.write(BODY)
        while await asyncio.wait_for(reader.read(65536), 60):
            pass
        writer.close()
    except TimeoutError:
        return False  # still open after a minute
    except (ConnectionError, OSError):
        pass
    return True


async def delivery(port: int, n: int) -> tuple[int, float]:
    """One signed delivery: (status, seconds)."""
    body = event(f"flood-{n}", n)
    headers = signed_headers(API_KEY, SECRET, "POST", PATH, body)
    started = time.monotonic()
    url = f"http://127.0.0.1:{port}{PATH}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=headers) as r,
    ):
        return r.status, time.monotonic() - started


async def flood(port: int, connections: int) -> dict[str, object]:
    tasks = [
        asyncio.ensure_future(unauthenticated(port, i % 2 == 1)) for i in range(2 * connections)
    ]
    await asyncio.sleep(2)
    answers = [await delivery(port, n) for n in range(5)]
    closed = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return {"deliveries": answers, "floodClosedByServer": sum(closed)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1000)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        config, port, _, _ = write_config(Path(tmp), "flood", light=True, log_level="warning")
        proc = start_serve(config, port, Path(tmp) / "flood.log")
        try:
            pid = ingress_pid(proc.pid)
            before = peak_rss_mb(pid)
            result = asyncio.run(flood(port, args.connections))
            result.update(
                ingressPeakMbBefore=round(before, 1), ingressPeakMb=round(peak_rss_mb(pid), 1)
            )
            log = (Path(tmp) / "flood.log").read_text().splitlines()
            result["warningLines"] = len(log)
            print(json.dumps(result, indent=2))
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
