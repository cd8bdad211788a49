"""The process tree of a system under bench, read from ``/proc``: its
processes, the ones that outlive it, its memory, and signals to all of it
(bench/compare.py and bench/decode_gap.py freeze and thaw whole server trees).

RSS comes from ``statm`` (cheap, no lock); PSS from ``smaps_rollup``, which
takes each process's mmap lock and walks its page tables: read it only at
quiet points, never while something is timed (sampling it every 0.25 s
stalled the scheduler by up to 80 ms).
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Iterable, List, Optional, Tuple

SAMPLE_EVERY_S = 0.25
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> Optional[Tuple[int, str, int]]:
    """(ppid, state, start time in ticks) of a process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), rest[0].decode(), int(rest[19])


def descendants(root: int) -> Dict[int, int]:
    """pid -> start time of ``root`` and every live process below it."""
    children: Dict[int, List[int]] = {}
    starts: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[1] == "Z":
            continue
        children.setdefault(st[0], []).append(int(name))
        starts[int(name)] = st[2]
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts:
            out[pid] = starts[pid]
        todo.extend(children.get(pid, ()))
    return out


def alive(seen: Dict[int, int], exclude: int) -> List[int]:
    """Processes of ``seen`` still running (same pid, same start time)."""
    left = []
    for pid, start in seen.items():
        st = _stat(pid)
        if pid != exclude and st is not None and st[1] != "Z" and st[2] == start:
            left.append(pid)
    return sorted(left)


def rss_mib(pids: Iterable[int]) -> float:
    """Sum of resident memory, from ``statm``: cheap, takes no mmap lock."""
    rss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return rss / 2**20


def memory_mib(pids: Iterable[int]) -> Tuple[float, float]:
    """(RSS, PSS) sums. PSS reads ``smaps_rollup``, which locks and walks each
    process's address space: only at quiet points, never while timing."""
    pids = list(pids)
    pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return rss_mib(pids), pss / 2**20


def mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each process, skipping those gone (or not ours)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_all(pids: Iterable[int]) -> None:
    signal_all(pids, signal.SIGKILL)


class TreeSampler(threading.Thread):
    """Every process of a tree (for the leftover check) and its peak RSS."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.seen: Dict[int, int] = {}
        self.peak_rss = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            tree = descendants(self.root)
            self.seen.update(tree)
            self.peak_rss = max(self.peak_rss, rss_mib(tree))
            self._stop_event.wait(SAMPLE_EVERY_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
