"""What ``bench/vs_trl.py`` measures around each side: is the machine idle, how much CPU each
process and the whole machine used, the stages' Prometheus timings, versions and machine facts.

Linux only (``/proc``); no third-party dependency.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HZ = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, every core, from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user/nice
    return total - idle, total


def process_cpu_s(pid: int, *, children: bool = True) -> float | None:
    """User + system CPU seconds of ``pid``, with ``children`` also of the children it waited for
    (None: it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return sum(int(x) for x in fields[11:15 if children else 13]) / HZ  # utime stime [cutime cstime]


def process_threads(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def idle_check(window_s: float = 3.0, *, max_busy_cores: float = 0.3, settle_s: float = 60.0) -> dict[str, Any]:
    """Is the machine idle before a side starts? Nothing of the bench runs during a window, so
    every busy jiffy is another process's. Windows are taken until one is idle, for ``settle_s``
    at most; loaded when the last one saw others use more than ``max_busy_cores`` cores. The load
    average is recorded, not judged: it still counts the side that just ended for a minute."""
    deadline = time.monotonic() + settle_s
    windows = []
    while True:
        load = os.getloadavg()
        busy0, total0 = machine_jiffies()
        time.sleep(window_s)
        busy1, total1 = machine_jiffies()
        windows.append(round(CORES * (busy1 - busy0) / max(1, total1 - total0), 2))
        if windows[-1] <= max_busy_cores or time.monotonic() >= deadline:
            break
    return {"time": time.time(), "loadavg": [round(x, 2) for x in load], "window_s": window_s,
            "other_cpu_s": round((busy1 - busy0) / HZ, 2), "other_busy_cores": windows[-1],
            "windows_busy_cores": windows, "loaded": windows[-1] > max_busy_cores}


def scrape_seconds(port: int) -> dict[str, float]:
    """Every ``*_seconds_sum``/``*_seconds_count`` series of a stage's metrics endpoint, summed
    over labels, and per phase too where a series has a ``phase`` label (``NAME[phase=P]_sum``);
    empty when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not (match and (kind := re.search(r"_seconds_(sum|count)$", match.group(1)))):
            continue
        name, value = match.group(1), float(match.group(3))
        out[name] = out.get(name, 0.0) + value
        if phase := re.search(r'phase="([^"]*)"', match.group(2) or ""):
            key = f"{name[:kind.start()]}_seconds[phase={phase.group(1)}]_{kind.group(1)}"
            out[key] = out.get(key, 0.0) + value
    return out


@dataclass
class Sampler:
    """Polls, every ``period_s`` in a thread: CPU seconds of the named processes, the machine's busy
    jiffies and (for processes with a metrics port) their seconds metrics. ``snapshot()`` is what
    it saw last; ``on_tick`` runs after each poll (the rollstream side watches its step log there)."""

    period_s: float = 0.5
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    on_tick: Any = None
    last: dict[str, Any] = field(default_factory=dict)
    peak_threads: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._cpu_seen: dict[str, float] = {}

    def poll(self) -> dict[str, Any]:
        busy, _ = machine_jiffies()
        for name, pid in list(self.pids.items()):
            cpu = process_cpu_s(pid)
            if cpu is not None:  # a process that ended keeps its last reading
                self._cpu_seen[name] = cpu
            threads = process_threads(pid)
            if threads:
                self.peak_threads[name] = max(threads, self.peak_threads.get(name, 0))
        metrics = {name: scrape_seconds(port) for name, port in list(self.ports.items())}
        self.last = {"time": time.time(), "machine_busy_s": busy / HZ, "cpu_s": dict(self._cpu_seen),
                     "metrics": metrics}
        return self.last

    def _loop(self) -> None:
        while not self._stop.is_set():
            snap = self.poll()
            if self.on_tick is not None:
                self.on_tick(snap)
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)


def deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots: wall, machine busy cores, CPU seconds per process,
    each stage's seconds metrics."""
    wall = after["time"] - before["time"]
    cpu = {name: round(after["cpu_s"][name] - before["cpu_s"].get(name, 0.0), 2)
           for name in after["cpu_s"]}
    metrics = {}
    for stage, series in after.get("metrics", {}).items():
        old = before.get("metrics", {}).get(stage, {})
        for name, value in series.items():
            if name.endswith("_sum"):
                metrics[f"{stage}:{name[:-4]}"] = round(value - old.get(name, 0.0), 3)
    return {"wall_s": round(wall, 3), "machine_busy_cores": round((after["machine_busy_s"] - before["machine_busy_s"])
                                                                  / max(wall, 1e-9), 2),
            "cpu_s": cpu, "metrics": metrics}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            out[name] = "absent"
    try:
        out["rollstream_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                  text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out["rollstream_commit"] = "?"
    return out


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    flags = re.search(r"flags\s*:\s*(.+)", cpuinfo)
    meminfo = Path("/proc/meminfo").read_text()
    mem = re.search(r"MemTotal:\s*(\d+)", meminfo)
    return {"cpu": model.group(1).strip() if model else "?", "cores": CORES, "platform": platform.platform(),
            "avx512_bf16": bool(flags and "avx512_bf16" in flags.group(1).split()),
            "amx_bf16": bool(flags and "amx_bf16" in flags.group(1).split()),
            "memory_gb": round(int(mem.group(1)) / 2**20, 1) if mem else None}
