"""Sample a process with py-spy and summarise it: the top functions by own samples (the function
itself was running) and by cumulative samples (it was on the stack), as shares of all samples.

Not a test. `python bench/pyspy.py RAWFILE [TOP]` summarises an earlier `py-spy record --format
raw` file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
SHELL = ("asyncio/", "stdlib/asyncio/", "<frozen runpy>", "worker/__main__.py", "worker/cli.py")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def py_spy() -> str | None:
    """The py-spy executable (the venv's first), or None."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def record(pid: int, seconds: float, out: Path, rate: int = 200) -> subprocess.Popen[bytes]:
    """Start sampling `pid` (every thread, active samples only) into `out` (raw format)."""
    exe = py_spy()
    if exe is None:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return subprocess.Popen(
        [
            exe,
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(seconds)),
            "-r",
            str(rate),
            "--format",
            "raw",
            "--nonblocking",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _name(frame: str) -> str:
    """`func (path:line)` as `func (path relative to the repository or site-packages)`."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for prefix in (str(ROOT) + "/", "site-packages/"):
        if prefix in path:
            path = path.split(prefix, 1)[1]
    if "/lib/python3" in path:
        path = "stdlib/" + path.rsplit("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{m['func']} ({path})"


def summarise(raw: Path, top: int = 25) -> str:
    """The top functions by own and by cumulative samples, as text."""
    own: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        count = int(m["count"])
        frames = [_name(f) for f in m["stack"].split(";") if f and not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            cum[name] += count
    if not total:
        return "no samples\n"
    lines = [f"{total} samples (active threads only)"]
    # The entry and event-loop frames every sample shares say nothing; left out of the list.
    for name in [n for n in cum if n.split(" (")[1].startswith(SHELL)]:
        del cum[name]
    for title, counts in (("own (tottime)", own), ("cumulative", cum)):
        lines.append(f"\ntop {top} by {title}: share of samples, function (file)")
        for name, count in counts.most_common(top):
            lines.append(f"  {100 * count / total:5.1f}%  {name}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25), end="")
