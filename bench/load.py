"""Load for the benchmarks: `wrk` (a separate process) when installed, else an aiohttp client in
a subprocess; both replay signed requests from a file (ts TAB signature TAB body per line) and
print a JSON summary (requests, duration, non-2xx, errors, p50, p99, wraps).

Not a test; `python bench/load.py client URL FILE CONNECTIONS SECONDS` is the fallback client.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realistic import API_KEY, PATH

WRK_SCRIPT = r"""
local lines = {}
local i = 0
local counter = 0
local threads = {}

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local nthreads = tonumber(args[2])
  local n = 0
  for line in io.lines(args[1]) do
    if n % nthreads == id then
      local ts, sig, body = line:match("^([^\t]*)\t([^\t]*)\t(.*)$")
      lines[#lines + 1] = wrk.format("POST", nil, {
        ["API-KEY"] = args[3], ["API-TIMESTAMP"] = ts, ["API-SIGNATURE"] = sig,
        ["Content-Type"] = "application/json"}, body)
    end
    n = n + 1
  end
  wraps = 0
end

function request()
  i = i + 1
  if i > #lines then i = 1; wraps = wraps + 1 end
  return lines[i]
end

function done(summary, latency, requests)
  local w = 0
  for _, t in ipairs(threads) do w = w + (t:get("wraps") or 0) end
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "non2xx": %d, "errors": %d, ' ..
    '"p50_us": %d, "p99_us": %d, "wraps": %d}\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), w))
end
"""


def run_wrk(
    port: int, requests: Path, connections: int, duration: float, tmp: Path
) -> dict[str, Any]:
    """One wrk run; returns its JSON summary."""
    script = tmp / "bench.lua"
    script.write_text(WRK_SCRIPT)
    threads = min(2, connections)
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{int(duration)}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}{PATH}",
            "--",
            str(requests),
            str(threads),
            API_KEY,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("{"))
    data: dict[str, Any] = json.loads(line)
    return data


async def _client_load(url: str, lines: list[str], connections: int, duration: float) -> None:
    """Fallback load generator (aiohttp) run in its own process; prints a wrk-like summary."""
    import aiohttp

    latencies: list[float] = []
    non2xx = 0
    idx = 0
    stop_at = time.monotonic() + duration

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal idx, non2xx
        while time.monotonic() < stop_at:
            ts, sig, body = lines[idx % len(lines)].split("\t", 2)
            idx += 1
            headers = {
                "API-KEY": API_KEY,
                "API-TIMESTAMP": ts,
                "API-SIGNATURE": sig,
                "Content-Type": "application/json",
            }
            t0 = time.perf_counter()
            async with session.post(url, data=body.encode(), headers=headers) as r:
                await r.read()
                non2xx += r.status != 200
            latencies.append(time.perf_counter() - t0)

    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(connections)))
    elapsed = time.monotonic() - started
    latencies.sort()
    print(
        json.dumps(
            {
                "requests": len(latencies),
                "duration_us": int(elapsed * 1e6),
                "non2xx": non2xx,
                "errors": 0,
                "p50_us": int(latencies[len(latencies) // 2] * 1e6),
                "p99_us": int(latencies[int(len(latencies) * 0.99)] * 1e6),
                "wraps": 0,
            }
        )
    )


def run_load(
    port: int, requests: Path, connections: int, duration: float, tmp: Path
) -> dict[str, Any]:
    """One load run with wrk if installed, else the aiohttp client in a subprocess."""
    if shutil.which("wrk"):
        return run_wrk(port, requests, connections, duration, tmp)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "client",
            f"http://127.0.0.1:{port}{PATH}",
            str(requests),
            str(connections),
            str(duration),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return data


def summary(r: dict[str, Any]) -> dict[str, float]:
    """events/s, p50 and p99 in ms."""
    return {
        "requests": r["requests"],
        "rate": r["requests"] / (r["duration_us"] / 1e6),
        "seconds": r["duration_us"] / 1e6,
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "non2xx": r["non2xx"],
        "errors": r["errors"],
        "wraps": r["wraps"],
    }


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "client":
    url, reqs, conns, duration = sys.argv[2:6]
    lines = Path(reqs).read_text().splitlines()
    asyncio.run(_client_load(url, lines, int(conns), float(duration)))
