"""Ingest benchmark: `depositd serve` against a bare aiohttp app that answers {} unread.

Not a test. Both servers run as subprocesses; the load comes from `wrk` (a separate process)
when installed, else from an aiohttp client subprocess. Every request is a signed ~600-byte
DEPOSIT_WHITELIST_REQUIRED event with a unique eventId (or each eventId 10 times in the
duplicate run). Runs are paired (depositd, then bare, same load) and the median ratio is shown.

    .venv/bin/python bench/ingest.py [--connections 50 8] [--dup 1 10] [--pairs 3] [--duration 4]
                                     [--warmup 2] [--one-process] [--ladder]

The processor keeps running throughout. Every run (depositd's and the bare app's) starts with
no backlog anywhere: the bench first waits for the events of earlier runs to be processed, so
that no server's processor competes with the one timed and the pairs do not depend on each
other. After each depositd run it prints the lag that run left (events still pending, the age
of the oldest) and how long the processor then took to work it off. A warm-up load (not counted)
first grows the fresh database's files and warms the processes up.

With --one-process each pair also times a second depositd with `webhook.ingress_process: false`
(webhook endpoint, store and processor in one process), the design before the ingress process.

With --ladder each pair also loads two more bare apps: one that reads the body ('read') and one
that also verifies the signature and parses the JSON with depositd's own functions ('verify'),
both answering {} without storing anything: the ceiling of any design that does those steps on
one core in one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from worker.provider.jsonio import dumpb  # noqa: E402
from worker.provider.signing import signed_headers  # noqa: E402

PATH = "/webhooks/provider"
API_KEY = "bench-key"
SECRET = "bench-secret"

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


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def event(event_id: str, n: int) -> bytes:
    """A signed-size-realistic deposit event (~600 bytes)."""
    tx = f"bench-tx-{n}"
    return dumpb(
        {
            "eventId": event_id,
            "eventType": "DEPOSIT_WHITELIST_REQUIRED",
            "referenceId": tx,
            "status": "PROCESSING",
            "timestamp": 1_700_000_000_000 + n,
            "data": {
                "transactionId": tx,
                "transactionHash": "0x" + f"{n:064x}",
                "transactionType": "DEPOSIT",
                "amount": "1234.567800",
                "currency": "USDT",
                "network": "TRON",
                "fromAddress": "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB",
                "toAddress": "TXYZmerchantDepositAddress0000000001",
                "walletId": 1001,
                "walletName": "merchant main wallet",
                "status": "PROCESSING",
                "whiteListStatus": "init",
                "timestamp": 1_700_000_000_000 + n,
            },
        }
    )


def write_requests(path: Path, start: int, count: int, dup: int) -> None:
    """Signed requests, one per line (ts TAB signature TAB body); each eventId `dup` times."""
    with path.open("w") as out:
        for i in range(count):
            n = start + i // dup
            body = event(f"bench-{n}", n)
            h = signed_headers(API_KEY, SECRET, "POST", PATH, body)
            out.write(f"{h['API-TIMESTAMP']}\t{h['API-SIGNATURE']}\t{body.decode()}\n")


def wait_healthy(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the server answers /healthz."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("server did not start")


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


# The --ladder servers: the bare app plus one step of depositd's ingest path each, to show where
# the rate goes before anything is stored.
LADDER = ("read", "verify")


def bare_server(port: int, step: str = "bare") -> None:
    """The reference: answers {} without reading the body; `step` adds part of the ingest path
    ("read": reads the body; "verify": also checks the signature and parses the JSON)."""
    from aiohttp import web

    from worker.provider import jsonio
    from worker.provider.signing import verify

    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=b"{}", content_type="application/json")

    async def read(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"{}", content_type="application/json")

    async def checked(request: web.Request) -> web.Response:
        body = await request.read()
        verify(
            request.headers,
            request.method,
            request.raw_path,
            body,
            api_key=API_KEY,
            secrets=[SECRET],
            tolerance_s=300,
        )
        jsonio.loads(body)["eventId"]
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application()
    app.router.add_post(PATH, {"bare": ok, "read": read, "verify": checked}[step])
    app.router.add_get("/healthz", ok)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def summary(r: dict[str, Any]) -> dict[str, float]:
    """events/s, p50 and p99 in ms."""
    return {
        "rate": r["requests"] / (r["duration_us"] / 1e6),
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "non2xx": r["non2xx"],
        "errors": r["errors"],
        "wraps": r["wraps"],
    }


def pending(db: Path) -> int:
    """Events stored but not yet processed."""
    return lag(db)[0]


def lag(db: Path) -> tuple[int, float]:
    """Events stored but not yet processed, and the age in seconds of the oldest of them."""
    conn = sqlite3.connect(db)
    try:
        count, oldest = conn.execute(
            "SELECT COUNT(*), MIN(received_at) FROM events WHERE status='pending'"
        ).fetchone()
    finally:
        conn.close()
    if not oldest:
        return int(count), 0.0
    received = datetime.fromisoformat(oldest.replace("Z", "+00:00")).timestamp()
    return int(count), max(0.0, time.time() - received)


def start_depositd(
    tmp: Path, name: str, args: argparse.Namespace, *, ingress_process: bool
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """One `depositd serve` with a database of its own: (process, port, database)."""
    port = free_port()
    db = tmp / f"{name}.db"
    cfg = {
        "provider": {"base_url": "http://127.0.0.1:9", "api_key": "k", "api_secret": "s"},
        "webhook": {
            "listen": f"127.0.0.1:{port}",
            "path": PATH,
            "api_key": API_KEY,
            "secret": SECRET,
            "ingress_process": ingress_process,
        },
        "storage": {"path": str(db), "synchronous": args.synchronous},
        "scheduler": {"enabled": False},
        "log": {"format": "json", "level": args.log_level},
    }
    (tmp / f"{name}.yaml").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "serve", "--config", str(tmp / f"{name}.yaml")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    log.close()
    return proc, port, db


def drain(db: Path, limit_s: float = 120) -> float:
    """Wait until no event is pending; the seconds it took."""
    t0 = time.monotonic()
    while pending(db) and time.monotonic() - t0 < limit_s:
        time.sleep(0.1)
    return time.monotonic() - t0


def bench(args: argparse.Namespace) -> None:
    """The paired runs."""
    tmp = Path(tempfile.mkdtemp(prefix="depositd-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # name -> (process, port, database); "depositd" is the default configuration.
    servers = {"depositd": start_depositd(tmp, "depositd", args, ingress_process=True)}
    if args.one_process:
        servers["one process"] = start_depositd(tmp, "one", args, ingress_process=False)
    bport = free_port()
    bare = subprocess.Popen([sys.executable, __file__, "bare", str(bport)], env=env)
    steps = {step: free_port() for step in (LADDER if args.ladder else ())}
    ladder = [
        subprocess.Popen([sys.executable, __file__, "bare", str(port), step], env=env)
        for step, port in steps.items()
    ]
    try:
        for proc, port, _ in servers.values():
            wait_healthy(port, proc)
        wait_healthy(bport, bare)
        for proc, port in zip(ladder, steps.values(), strict=True):
            wait_healthy(port, proc)
        tool = "wrk" if shutil.which("wrk") else "aiohttp client"
        print(
            f"load: {tool}; synchronous={args.synchronous}; log level {args.log_level}; "
            f"{args.duration}s per run; {os.cpu_count()} CPUs shared by load and servers; "
            f"every run starts with no backlog"
        )

        def drain_all() -> float:
            # No processor works off a backlog while another server is timed.
            return sum(drain(db) for _, _, db in servers.values())

        next_id = 0
        if args.warmup > 0:  # a fresh database and a cold process are slower: not counted
            count = args.max_rate * int(args.warmup + 1)
            reqs = tmp / "requests.tsv"
            write_requests(reqs, next_id, count, 1)
            next_id += count
            for _, port, db in servers.values():
                run_load(port, reqs, 50, args.warmup, tmp)
                drain(db)
            print(f"warm-up: {args.warmup}s at 50 connections on each server, not counted")
        for dup in args.dup:
            for conns in args.connections:
                ratios: dict[str, list[float]] = {name: [] for name in (*servers, *steps)}
                for pair in range(args.pairs):
                    count = args.max_rate * int(args.duration + 1)
                    reqs = tmp / "requests.tsv"
                    write_requests(reqs, next_id, count, dup)
                    next_id += count
                    runs = []
                    for name, (_, port, db) in servers.items():
                        drain_all()
                        d = summary(run_load(port, reqs, conns, args.duration, tmp))
                        backlog, age = lag(db)
                        runs.append((name, d, backlog, age, drain(db)))
                    drain_all()
                    b = summary(run_load(bport, reqs, conns, args.duration, tmp))
                    for step, port in steps.items():
                        drain_all()
                        rate = summary(run_load(port, reqs, conns, args.duration, tmp))["rate"]
                        ratios[step].append(rate / b["rate"])
                    print(
                        f"dup x{dup:<2} c={conns:<3} pair {pair + 1}: bare {b['rate']:7.0f}/s "
                        f"p50 {b['p50_ms']:6.2f} ms p99 {b['p99_ms']:6.2f} ms"
                    )
                    for name, d, backlog, age, worked_off in runs:
                        ratios[name].append(d["rate"] / b["rate"])
                        print(
                            f"    {name:<12} {d['rate']:7.0f}/s p50 {d['p50_ms']:6.2f} ms "
                            f"p99 {d['p99_ms']:6.2f} ms (non-2xx {d['non2xx']}, "
                            f"errors {d['errors']}, wraps {d['wraps']}) ratio "
                            f"{d['rate'] / b['rate']:.2f} | after the run {backlog} pending, "
                            f"oldest {age:.1f}s, worked off in {worked_off:.1f}s"
                        )
                for name, values in ratios.items():
                    what = name if name in servers else f"bare app that also does {name!r}"
                    print(
                        f"dup x{dup:<2} c={conns:<3} {what}: "
                        f"median ratio {statistics.median(values):.2f}"
                    )
        for name, (_, _, db) in servers.items():
            left = pending(db)
            print(f"{name}: {left} pending at the end of the load; drained in {drain(db):.1f}s")
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
        bare.terminate()
        for proc in ladder:
            proc.terminate()
        for name, (proc, _, _) in servers.items():
            print(f"{name} exit status after SIGTERM: {proc.wait(60)}")
        bare.wait(30)
        for proc in ladder:
            proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Entry point (also the bare server and client subprocesses)."""
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        bare_server(int(sys.argv[2]), *sys.argv[3:4])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        url, reqs, conns, duration = sys.argv[2:6]
        lines = Path(reqs).read_text().splitlines()
        asyncio.run(_client_load(url, lines, int(conns), float(duration)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[50, 8])
    parser.add_argument("--dup", type=int, nargs="+", default=[1, 10], help="copies per eventId")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "EXTRA"])
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--max-rate", type=int, default=25000, help="requests generated per second")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of uncounted load first")
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="also time depositd with webhook.ingress_process: false in each pair",
    )
    parser.add_argument(
        "--ladder",
        action="store_true",
        help="also time bare apps that read the body, and verify + parse it, in each pair",
    )
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
