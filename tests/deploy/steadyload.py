"""Steady signed load on depositd's webhook, run inside the test container (not a test).

Sends `--rate` deliveries a second for `--seconds`, each on a connection of its own (as a
provider delivers), open loop: a slow answer does not slow the sending. With `--stop-file`, the
load goes on past `--seconds` until TAIL_S after that file appears (an action that outlasts the
window still ends under load), at most MAX_S. Each delivery is an event stored and nothing more
(STABLE_ORDER_UPDATED with a unique eventId). Writes `--started` once the first delivery is
out (its CLOCK_MONOTONIC time, which the container shares with the test), and prints a JSON
summary when every delivery has its outcome:

    {"sent": n, "loadS": s, "answered": {"200": n, ...}, "refused": n, "reset": n,
     "timeout": n, "errors": {...}, "longestGapS": s, "ok": [eventId, ...]}

loadS is the time from the first delivery sent to the last; longestGapS the longest time
without an HTTP answer, from the first delivery sent to the last answer. Run with depositd's own
interpreter (it signs with worker.provider.signing):

    /opt/depositd/venv/bin/python steadyload.py --url http://127.0.0.1:8080/webhooks/provider \
        --key KEY --secret-file FILE --prefix restart --rate 50 --seconds 20 --started FILE
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from pathlib import Path
from urllib.parse import urlsplit

from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers

ANSWER_S = 60.0
TAIL_S = 3.0  # steady load after --stop-file appears
MAX_S = 300.0  # a stop file that never comes


async def deliver(host: str, port: int, path: str, key: str, secret: str, event_id: str) -> str:
    """One delivery: its outcome ("200", "503", "refused", "reset", "timeout", or an error)."""
    body = dumpb(
        {"eventId": event_id, "eventType": "STABLE_ORDER_UPDATED", "referenceId": event_id}
    )
    headers = signed_headers(key, secret, "POST", path, body)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), ANSWER_S)
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), ANSWER_S)
        if not line:
            return "reset"  # closed without an answer
        return line.split()[1].decode()
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--started", type=Path, required=True)
    parser.add_argument("--stop-file", type=Path)
    args = parser.parse_args()
    url = urlsplit(args.url)
    host, port, path = url.hostname or "127.0.0.1", url.port or 80, url.path
    secret = args.secret_file.read_text().strip()
    count = int(args.rate * args.seconds)  # at least these; more until the stop file's tail
    answers: list[float] = []
    outcomes: dict[str, str] = {}

    async def one(n: int) -> None:
        event_id = f"{args.prefix}-{n}"
        outcome = await deliver(host, port, path, args.key, secret, event_id)
        outcomes[event_id] = outcome
        if outcome.isdigit():  # an HTTP answer
            answers.append(time.monotonic())

    loop = asyncio.get_running_loop()
    start = loop.time()  # loop.time() is time.monotonic()
    tasks = []
    end: float | None = None  # TAIL_S after the stop file appeared
    last = start
    for n in itertools.count():
        await asyncio.sleep(max(0.0, start + n / args.rate - loop.time()))
        now = loop.time()
        if end is None and args.stop_file is not None and args.stop_file.exists():
            end = now + TAIL_S
        if n >= count and (
            args.stop_file is None or (end is not None and now > end) or now - start > MAX_S
        ):
            break
        last = now
        tasks.append(asyncio.create_task(one(n)))
        if n == 0:
            args.started.write_text(f"{start}\n")
    await asyncio.gather(*tasks)
    times = [start, *sorted(answers)]
    counted: dict[str, int] = {}
    for outcome in outcomes.values():
        counted[outcome] = counted.get(outcome, 0) + 1
    answered = {k: v for k, v in counted.items() if k.isdigit()}
    summary = {
        "sent": len(tasks),
        "loadS": round(last - start, 3),
        "answered": answered,
        "refused": counted.get("refused", 0),
        "reset": counted.get("reset", 0),
        "timeout": counted.get("timeout", 0),
        "errors": {
            k: v
            for k, v in counted.items()
            if not k.isdigit() and k not in ("refused", "reset", "timeout")
        },
        "longestGapS": round(max(b - a for a, b in itertools.pairwise(times)), 3),
        "ok": sorted(k for k, v in outcomes.items() if v == "200"),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())
