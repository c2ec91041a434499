"""Process helpers: free ports, fd limits and /proc readings (RSS, CPU) for a process tree.

The broker may fork workers, so memory and CPU are summed over the whole tree.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that is free right now (the broker binds it shortly after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def raise_nofile() -> int:
    """Lift the soft fd limit to the hard limit so brokers and loadgen inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until host:port accepts TCP connections; raise if proc dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {port} not accepting connections after {timeout:.0f}s") from None
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM by pid, then SIGKILL after grace seconds."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)
    except ProcessLookupError:
        pass


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(pid: int) -> list[int]:
    """pid and all of its descendants."""
    tree = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def rss_kb(pid: int) -> int:
    """Total VmRSS (KiB) of pid and its descendants."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds used so far by pid and its live descendants."""
    ticks = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLK_TCK


def system_cpu_seconds() -> tuple[float, float]:
    """Machine-wide CPU seconds (all cores) spent busy in tasks, and in irq/softirq, from /proc/stat.

    Used to report how much CPU other processes took during a run (on a shared
    or small machine that noise explains odd numbers). Loopback TCP processing
    is largely softirq time, which is not charged to broker or loadgen.
    """
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + steal) / CLK_TCK, (irq + softirq) / CLK_TCK
