"""Process readings for the bench: fd limits and /proc readings (RSS, CPU) for a process tree.

The broker may fork workers, so memory and CPU are summed over the whole tree. Free ports, waiting for a
port and stopping a process come from tests/support.py, shared with the tests.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def raise_nofile() -> int:
    """Lift the soft fd limit to the hard limit so brokers and loadgen inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


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
