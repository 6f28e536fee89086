"""Ingest benchmark: `depositd serve` against a bare aiohttp app that answers {} unread.

Not a test. By default depositd runs the configuration a merchant runs: the shipped
rules/default.yaml plus a per-wallet rule set (wallet 1001: submits a stored profile on
needs_details, books every credited deposit, alerts on blocked/rejected/failed), a profiles file
with fictitious payers, the scheduler polling the embedded sandbox (`depositd sandbox`, a
subprocess) every 2 s, and storage.synchronous FULL. `--light` runs the light configuration
instead (no rules, no profiles, scheduler off), labelled as such.

Every request is a signed ~600-byte DEPOSIT_ORDER_NOTIFICATION SUCCESS event with a unique
eventId and transaction (wallets 1001 and 1002 in turn): each one creates a credited deposit and
books it. Load comes from `wrk` when installed, else an aiohttp client (bench/load.py). Runs are
paired (depositd, then the bare app, same load); each figure is shown with its ratio to the bare
app of the same pair and the median of the pairs closes the table.

    .venv/bin/python bench/ingest.py [--light] [--pairs 3] [--duration 4] [--connections 50]
                                     [--dup 1] [--profile 8] [--one-process] [--ladder]
                                     [--store postgres [--instances 2]]

Per depositd run: acked events/s, p50/p99, the events still pending when the load stops, the
time the processor then takes to work them off, the end-to-end rate (acked events / (run +
drain)) and the processor's CPU per event while it drains (CPU seconds of the main serve process
/ events processed). Every run starts with no backlog anywhere. A warm-up load (not counted)
first grows the fresh database's files and warms the processes up.

--profile N samples the main serve process with py-spy for N seconds while it drains one more
backlog (all threads) and prints the top functions by own and by cumulative samples;
--profile-server postgres samples the PostgreSQL one instead (with --store postgres).
--one-process also times depositd with `webhook.ingress_process: false`; --ladder also times bare
apps that read the body, and that verify and parse it. --store postgres also times depositd on
PostgreSQL (a throwaway cluster started like the tests', tests/support/pgcluster.py) in the
same pairs, and with --instances 2 two instances sharing one database, the load split between
them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support.pgcluster

import realistic as rl
from load import run_load, summary
from realistic import API_KEY, PATH, SECRET

from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers

AMOUNT = "1234.567800"


def event(event_id: str, n: int) -> bytes:
    """A credited deposit's notification (~600 bytes); the amount a JSON number, as on the wire."""
    tx = f"bench-tx-{n}"
    wallet = 1001 + n % 2
    body = dumpb(
        {
            "eventId": event_id,
            "eventType": "DEPOSIT_ORDER_NOTIFICATION",
            "referenceId": tx,
            "status": "SUCCESS",
            "timestamp": 1_700_000_000_000 + n,
            "data": {
                "transactionId": tx,
                "transactionHash": "0x" + f"{n:064x}",
                "transactionType": "DEPOSIT",
                "amount": "__AMOUNT__",
                "currency": "USDT",
                "network": "TRON",
                "fromAddress": rl.FROM_ADDRESS,
                "toAddress": "TXYZmerchantDepositAddress0000000001",
                "walletId": wallet,
                "walletName": f"merchant wallet {wallet}",
                "status": "SUCCESS",
                "whiteListStatus": "approved",
                "timestamp": 1_700_000_000_000 + n,
            },
        }
    )
    return body.replace(b'"__AMOUNT__"', AMOUNT.encode())


def write_requests(path: Path, start: int, count: int, dup: int) -> None:
    """Signed requests, one per line (ts TAB signature TAB body); each eventId `dup` times."""
    with path.open("w") as out:
        for i in range(count):
            n = start + i // dup
            body = event(f"bench-{n}", n)
            h = signed_headers(API_KEY, SECRET, "POST", PATH, body)
            out.write(f"{h['API-TIMESTAMP']}\t{h['API-SIGNATURE']}\t{body.decode()}\n")


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


class Server:
    """One `depositd serve`, or `instances` of them on one PostgreSQL database (`url`), and the
    sandbox of the realistic configuration (one, shared)."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        args: argparse.Namespace,
        *,
        one: bool,
        url: str | None = None,
        instances: int = 1,
    ) -> None:
        self.name = name
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sandbox = None
        provider_port = None
        for i in range(instances):
            label = name.replace(" ", "-") + (f"-{i}" if instances > 1 else "")
            config, port, self.db, sandbox_port = rl.write_config(
                tmp,
                label,
                light=args.light,
                synchronous=args.synchronous,
                log_level=args.log_level,
                ingress_process=not one,
                provider_port=provider_port,
                url=url,
            )
            if not args.light and provider_port is None:
                self.sandbox = rl.start_sandbox(config, sandbox_port, tmp / f"{label}-sandbox.log")
            provider_port = sandbox_port
            self.ports.append(port)
            self.procs.append(rl.start_serve(config, port, tmp / f"{label}.log"))
        self.port = self.ports[0]
        self.proc = self.procs[0]

    def cpu_s(self) -> float:
        """CPU seconds of the main serve processes so far."""
        return sum(rl.cpu_s(p.pid) for p in self.procs)

    def drain(self) -> tuple[float, float]:
        """Wait until nothing is pending: (seconds, CPU seconds of the main processes meanwhile)."""
        cpu0 = self.cpu_s()
        took = rl.drain(self.db)
        return took, self.cpu_s() - cpu0

    def load(self, reqs: Path, conns: int, duration: float, tmp: Path) -> dict[str, Any]:
        """One load run spread over the instances (each its share of the connections, at the
        same time, as a load balancer would); the figures combined."""
        if len(self.ports) == 1:
            return run_load(self.port, reqs, conns, duration, tmp)
        share = max(1, conns // len(self.ports))
        with concurrent.futures.ThreadPoolExecutor(len(self.ports)) as pool:
            parts = list(
                pool.map(
                    lambda i: run_load(
                        self.ports[i],
                        _slice(reqs, i, len(self.ports)),
                        share,
                        duration,
                        tmp / f"lb{i}",
                    ),
                    range(len(self.ports)),
                )
            )
        combined = {k: sum(p[k] for p in parts) for k in ("requests", "non2xx", "errors", "wraps")}
        combined["duration_us"] = max(p["duration_us"] for p in parts)
        combined["p50_us"] = max(p["p50_us"] for p in parts)  # the slower instance's
        combined["p99_us"] = max(p["p99_us"] for p in parts)
        return combined

    def stop(self) -> None:
        """SIGTERM serve, then the sandbox."""
        for proc in self.procs:
            print(f"{self.name} exit status after SIGTERM: {rl.stop(proc)}")
        if self.sandbox is not None:
            rl.stop(self.sandbox)


def _slice(reqs: Path, i: int, n: int) -> Path:
    """Every n-th request line from the i-th: one instance's share of a request file."""
    part = reqs.with_name(f"{reqs.stem}-{i}of{n}{reqs.suffix}")
    lines = reqs.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[i::n]))
    (reqs.parent / f"lb{i}").mkdir(exist_ok=True)
    return part


def one_run(
    server: Server, port: int, reqs: Path, conns: int, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """One depositd run and its drain."""
    d = summary(server.load(reqs, conns, args.duration, tmp))
    backlog, age, actions = rl.lag(server.db)
    took, cpu = server.drain()
    d.update(
        pending=backlog,
        age=age,
        actions=actions,
        drain_s=took,
        e2e=d["requests"] / (d["seconds"] + took),
        cpu_us=1e6 * cpu / backlog if backlog else float("nan"),
    )
    return d


def profile(server: Server, args: argparse.Namespace, tmp: Path, next_id: int) -> None:
    """Load once more, then sample the main process with py-spy while it drains."""
    from pyspy import record, summarise

    count = args.max_rate * int(args.duration + 1)
    reqs = tmp / "requests.tsv"
    write_requests(reqs, next_id, count, 1)
    run_load(server.port, reqs, 50, args.duration, tmp)
    backlog = rl.lag(server.db)[0]
    raw = tmp / "profile.raw"
    cpu0, t0 = server.cpu_s(), time.monotonic()
    spy = record(server.proc.pid, args.profile, raw)
    spy.wait()
    cpu, took = server.cpu_s() - cpu0, time.monotonic() - t0
    done = backlog - rl.lag(server.db)[0]
    head = (
        f"profile of the main serve process while it drains ({args.profile}s, py-spy, all "
        f"threads): {done} events processed, {cpu:.2f} CPU s in {took:.1f} s: "
        f"{1e6 * cpu / max(done, 1):.0f} us CPU per event\n"
    )
    print("\n" + head, end="")
    if not raw.exists():
        print("py-spy wrote nothing:", spy.stderr.read().decode() if spy.stderr else "")
        return
    text = summarise(raw, args.top)
    print(text, end="")
    if args.profile_out:
        Path(args.profile_out).write_text(head + text)


def table_row(label: str, d: dict[str, Any], b: dict[str, Any]) -> str:
    """One markdown row: depositd's figures and their ratios to the bare app."""
    return (
        f"| {label} | {b['rate']:.0f}/s | {d['rate']:.0f}/s ({d['rate'] / b['rate']:.2f}) "
        f"| {d['p50_ms']:.1f} ms ({d['p50_ms'] / b['p50_ms']:.1f}x) "
        f"| {d['p99_ms']:.1f} ms ({d['p99_ms'] / b['p99_ms']:.1f}x) "
        f"| {d['pending']} ev, {d['actions']} actions | {d['drain_s']:.1f} s "
        f"| {d['e2e']:.0f}/s ({d['e2e'] / b['rate']:.2f}) | {d['cpu_us']:.0f} us |"
    )


HEADER = (
    "| run | bare app | depositd acked (ratio) | p50 (x bare) | p99 (x bare) "
    "| pending at end | drained in | end-to-end (ratio) | CPU/event (drain) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def median_row(runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The medians of the pairs (each ratio's median, not the ratio of medians)."""

    def med(f: Any) -> float:
        return statistics.median(f(d, b) for d, b in runs)

    return (
        f"| median | {med(lambda d, b: b['rate']):.0f}/s "
        f"| {med(lambda d, b: d['rate']):.0f}/s ({med(lambda d, b: d['rate'] / b['rate']):.2f}) "
        f"| {med(lambda d, b: d['p50_ms']):.1f} ms "
        f"({med(lambda d, b: d['p50_ms'] / b['p50_ms']):.1f}x) "
        f"| {med(lambda d, b: d['p99_ms']):.1f} ms "
        f"({med(lambda d, b: d['p99_ms'] / b['p99_ms']):.1f}x) "
        f"| {med(lambda d, b: d['pending']):.0f} ev | {med(lambda d, b: d['drain_s']):.1f} s "
        f"| {med(lambda d, b: d['e2e']):.0f}/s ({med(lambda d, b: d['e2e'] / b['rate']):.2f}) "
        f"| {med(lambda d, b: d['cpu_us']):.0f} us |"
    )


def bench(args: argparse.Namespace) -> None:
    """The paired runs."""
    tmp = Path(tempfile.mkdtemp(prefix="depositd-bench-"))
    env = {**os.environ, "PYTHONPATH": str(rl.ROOT)}
    servers: dict[str, Server] = {}
    helpers: list[subprocess.Popen[bytes]] = []
    cluster = contextlib.ExitStack()
    try:
        servers["depositd"] = Server(tmp, "depositd", args, one=False)
        if args.store == "postgres":
            from tests.support.pgcluster import running_cluster

            pg = cluster.enter_context(running_cluster())
            servers["postgres"] = Server(tmp, "postgres", args, one=False, url=pg.create_database())
            if args.instances > 1:
                name = f"postgres x{args.instances}"
                url = pg.create_database()
                servers[name] = Server(
                    tmp, name, args, one=False, url=url, instances=args.instances
                )
        if args.one_process:
            servers["one process"] = Server(tmp, "one", args, one=True)
        bport = rl.free_port()
        helpers.append(subprocess.Popen([sys.executable, __file__, "bare", str(bport)], env=env))
        steps = {step: rl.free_port() for step in (LADDER if args.ladder else ())}
        for step, port in steps.items():
            helpers.append(
                subprocess.Popen([sys.executable, __file__, "bare", str(port), step], env=env)
            )
        for port, proc in zip([bport, *steps.values()], helpers, strict=True):
            rl.wait_url(f"http://127.0.0.1:{port}/healthz", proc)
        config = (
            "LIGHT configuration (no rules, no profiles, scheduler off)"
            if args.light
            else "realistic configuration (rules/default.yaml + a wallet-1001 rule set, a "
            "profiles file, scheduler every 2 s against the sandbox)"
        )
        tool = "wrk" if shutil.which("wrk") else "aiohttp client"
        print(
            f"{config}; load: {tool}; synchronous={args.synchronous}; log level "
            f"{args.log_level}; {args.duration}s per run; {os.cpu_count()} CPUs shared by load "
            f"and servers; every run starts with no backlog"
        )
        if args.store == "postgres":
            print(
                "depositd: SQLite; postgres: PostgreSQL (a throwaway local cluster, fsync and "
                "synchronous_commit on); postgres xN: N instances on one database, each taking "
                "its share of the connections"
            )

        def drain_all() -> None:
            # No processor works off a backlog while another server is timed.
            for s in servers.values():
                s.drain()

        next_id = 0
        reqs = tmp / "requests.tsv"
        if args.warmup > 0:  # a fresh database and a cold process are slower: not counted
            count = args.max_rate * int(args.warmup + 1)
            write_requests(reqs, next_id, count, 1)
            next_id += count
            for s in servers.values():
                run_load(s.port, reqs, 50, args.warmup, tmp)
                s.drain()
            print(f"warm-up: {args.warmup}s at 50 connections on each server, not counted")
        for dup in args.dup:
            for conns in args.connections:
                tables: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {
                    name: [] for name in servers
                }
                ladder: dict[str, list[float]] = {step: [] for step in steps}
                for _pair in range(args.pairs):
                    count = args.max_rate * int(args.duration + 1)
                    write_requests(reqs, next_id, count, dup)
                    next_id += count
                    runs = {}
                    for name, s in servers.items():
                        drain_all()
                        runs[name] = one_run(s, s.port, reqs, conns, args, tmp)
                    drain_all()
                    b = summary(run_load(bport, reqs, conns, args.duration, tmp))
                    for step, port in steps.items():
                        rate = summary(run_load(port, reqs, conns, args.duration, tmp))["rate"]
                        ladder[step].append(rate / b["rate"])
                    for name, d in runs.items():
                        tables[name].append((d, b))
                        if d["non2xx"] or d["errors"] or d["wraps"]:
                            print(
                                f"  {name}: non-2xx {d['non2xx']}, errors {d['errors']}, "
                                f"wraps {d['wraps']}"
                            )
                for name, rows in tables.items():
                    if not rows:
                        continue
                    print(f"\n{name}, dup x{dup}, {conns} connections, {args.duration}s runs:")
                    print(HEADER)
                    for i, (d, b) in enumerate(rows):
                        print(table_row(chr(ord("a") + i), d, b))
                    print(median_row(rows))
                for step, values in ladder.items():
                    if not values:
                        continue
                    print(
                        f"bare app that also does {step!r}: median ratio "
                        f"{statistics.median(values):.2f}"
                    )
        if args.profile:
            profile(servers[args.profile_server], args, tmp, next_id)
    finally:
        for s in servers.values():
            s.stop()
        for proc in helpers:
            rl.stop(proc, 30)
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Entry point (also the bare server subprocesses)."""
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        bare_server(int(sys.argv[2]), *sys.argv[3:4])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--light",
        action="store_true",
        help="the light configuration: no rules, no profiles, scheduler off",
    )
    parser.add_argument("--connections", type=int, nargs="+", default=[50])
    parser.add_argument("--dup", type=int, nargs="+", default=[1], help="copies per eventId")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "EXTRA"])
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--max-rate", type=int, default=25000, help="requests generated per second")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of uncounted load first")
    parser.add_argument(
        "--profile",
        type=float,
        default=0,
        metavar="SECONDS",
        help="sample the main serve process with py-spy while it drains one more backlog",
    )
    parser.add_argument("--top", type=int, default=25, help="functions listed by --profile")
    parser.add_argument("--profile-out", help="also write the --profile summary to this file")
    parser.add_argument(
        "--profile-server",
        default="depositd",
        choices=["depositd", "postgres"],
        help="the server --profile samples: depositd (SQLite) or postgres (with --store postgres)",
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="also time depositd with webhook.ingress_process: false in each pair",
    )
    parser.add_argument(
        "--store",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="postgres: also time depositd on PostgreSQL (a throwaway local cluster) in each pair",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="with --store postgres: also time this many instances sharing the database",
    )
    parser.add_argument(
        "--ladder",
        action="store_true",
        help="also time bare apps that read the body, and verify + parse it, in each pair",
    )
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
