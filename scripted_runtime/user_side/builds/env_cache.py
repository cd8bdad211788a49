"""Listing and pruning the cached build environments
(``scripted-runtime envs list|prune``; harness process).

Every ``--sglang sglang==X`` side builds a ~10 GB environment under the
cache root (``envs.py``). ``entries`` describes each one: its requirement,
path, size, when it was last used (``envs.ensure_env`` stamps
``envs.LAST_USED`` on every use; before the first stamp, when it was
built) and whether it is in use: a process runs that environment's python
(read from /proc), the running harness itself lives in it, or a build
holds its lock. ``plan_prune`` picks what
``--keep N`` and ``--older-than DAYS`` remove, never one in use.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from scripted_runtime.user_side.builds import envs

@dataclass
class Entry:
    path: Path
    requirement: str
    size_gb: float
    last_used: float  # epoch seconds
    in_use: str = ""  # why it is in use; "" when it is not
    ready: bool = True  # False: an unfinished build

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.last_used) / 86400)


def _last_used(env: Path) -> float:
    for name in (envs.LAST_USED, envs.READY):
        try:
            return (env / name).stat().st_mtime
        except OSError:
            continue
    return env.stat().st_mtime


def _processes_in(env: Path, proc: Path = Path("/proc")) -> List[int]:
    """PIDs whose executable lies in ``env`` (Linux; none found elsewhere)."""
    root = str(env.resolve()) + os.sep
    pids = []
    for entry in proc.glob("[0-9]*"):
        try:
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        if exe.startswith(root):
            pids.append(int(entry.name))
    return pids


def _build_locked(env: Path) -> bool:
    lock_path = env.parent / f".{env.name}.lock"
    if not lock_path.exists():
        return False
    with open(lock_path) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def in_use(env: Path) -> str:
    if str(Path(sys.prefix).resolve()).startswith(str(env.resolve())):
        return "this harness runs from it"
    if _build_locked(env):
        return "a build holds its lock"
    pids = _processes_in(env)
    if pids:
        return f"process{'es' if len(pids) > 1 else ''} {', '.join(map(str, pids[:5]))} run{'' if len(pids) > 1 else 's'} its python"
    return ""


def entries() -> List[Entry]:
    """Every cached environment, most recently used first."""
    out = []
    for env in envs.cached_envs():
        info = envs.ready_info(env)
        size = info.get("size_gb") if info else None
        out.append(Entry(path=env, requirement=(info or {}).get("requirement", "?"),
                         size_gb=float(size) if size is not None else envs.dir_size_gb(env),
                         last_used=_last_used(env), in_use=in_use(env), ready=info is not None))
    return sorted(out, key=lambda e: -e.last_used)


def plan_prune(items: Sequence[Entry], *, keep: Optional[int] = None,
               older_than_days: Optional[float] = None) -> List[Entry]:
    """What to remove: beyond the ``keep`` most recently used, or unused for
    more than ``older_than_days`` (both given: either); never one in use."""
    if keep is None and older_than_days is None:
        raise ValueError("say what to prune: --keep N and/or --older-than DAYS")
    if keep is not None and keep < 0:
        raise ValueError(f"--keep must be >= 0, got {keep}")
    ordered = sorted(items, key=lambda e: -e.last_used)
    chosen = []
    for rank, e in enumerate(ordered):
        beyond = keep is not None and rank >= keep
        stale = older_than_days is not None and e.age_days > older_than_days
        if (beyond or stale) and not e.in_use:
            chosen.append(e)
    return chosen


def remove(items: Iterable[Entry]) -> float:
    """Delete them; returns the GB freed."""
    freed = 0.0
    for e in items:
        shutil.rmtree(e.path)
        log = e.path.parent / f".{e.path.name}.lock"
        if log.exists():
            log.unlink()
        freed += e.size_gb
    return freed


def table(items: Sequence[Entry]) -> str:
    if not items:
        return f"no cached environments under {envs.cache_root()}"
    rows = [("requirement", "size", "last used", "in use", "path")]
    for e in items:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)) + f" ({e.age_days:.0f} d ago)"
        rows.append((e.requirement if e.ready else f"{e.requirement} (unfinished build)", f"{e.size_gb:.1f} GB",
                     when, e.in_use or "-", str(e.path)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    total = sum(e.size_gb for e in items)
    return "\n".join(lines + [f"{len(items)} environments, {total:.1f} GB, under {envs.cache_root()}"])
