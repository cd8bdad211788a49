"""Find and stop every process of one launched server (Linux /proc).

A server's processes are found three ways, and the union is taken:

* the launcher is started in a session of its own (``start_new_session``),
  and every process it spawns stays in that session unless it calls
  ``setsid``: the session id outlives the launcher, so orphans are found too;
* each process inherits SCRIPTED_RUNTIME_SERVER_ID=<id> in its environment,
  which finds one that left the session. Not alone enough: SGLang names its
  ranks with ``setproctitle``, which overwrites the memory
  ``/proc/PID/environ`` reads, so a scheduler or detokenizer shows no marker;
* every descendant (by parent pid) of a process found either way.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Dict, List, Optional, Tuple

from scripted_runtime.protocol import ENV_SERVER_ID


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has already exited)."""
    return _running(_stat(pid))


def _running(st: Optional[Tuple[int, int, bytes, int]]) -> bool:
    return st is not None and st[2] != b"Z"


def _stat(pid: int) -> Optional[Tuple[int, int, bytes, int]]:
    """(parent pid, session id, state letter, start time in clock ticks) of
    a process; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b") ", 1)[1].split()
        return int(fields[1]), int(fields[3]), fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> Optional[int]:
    """When a process started (clock ticks since boot): with its pid, an
    identity that survives pid reuse. None if it is gone."""
    st = _stat(pid)
    return st[3] if st is not None else None


def same_process_running(pid: int, started: int) -> bool:
    """``pid`` is still the process that started at ``started`` and has not
    exited: not gone, not a zombie (exited, not yet reaped by its parent),
    not another process that got the pid since."""
    st = _stat(pid)
    return _running(st) and st[3] == started


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def pids_of_server(server_id: str, session: Optional[int] = None,
                   session_start: Optional[int] = None) -> List[int]:
    """Live (non-zombie) processes of one server: in the launcher's
    ``session`` (its pid, when it was started with ``start_new_session``),
    carrying the server-id marker, or descending from one that does.
    ``session_start`` (the launcher's ``start_time``) guards against pid
    reuse: a live process with that pid and another start time leads some
    other session, which is then not counted."""
    marker = f"{ENV_SERVER_ID}={server_id}".encode()
    if session is not None and session <= 0:
        session = None  # session 0 holds the kernel's threads, not a server
    stats: Dict[int, Tuple[int, int, bytes, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                stats[int(name)] = st
    if session is not None and session_start is not None and session in stats \
            and stats[session][3] != session_start:
        session = None  # the launcher is gone and its pid now leads another session
    found = {pid for pid, st in stats.items() if session is not None and st[1] == session}
    found |= {pid for pid in stats if pid not in found and _has_marker(pid, marker)}
    children: Dict[int, List[int]] = {}
    for pid, st in stats.items():
        ppid = st[0]
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(pid for pid in found if stats[pid][2] != b"Z")


def kill_server(server_id: str, pgid: int, *, term_grace_s: float = 0.5, kill_wait_s: float = 3.0,
                pgid_start: Optional[int] = None) -> List[int]:
    """SIGTERM the group, SIGKILL whatever is left; returns pids still alive.
    ``pgid`` is the launcher's pid: with ``start_new_session`` also its
    session id, which the server's processes keep after it is gone;
    ``pgid_start`` is its ``start_time`` (see ``pids_of_server``)."""
    own_group = pgid_start is None or start_time(pgid) in (None, pgid_start)  # else the pid was reused
    for sig, wait_s in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, kill_wait_s)):
        if own_group:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids_of_server(server_id, pgid, pgid_start):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pids_of_server(server_id, pgid, pgid_start):
                return []
            time.sleep(0.05)
    return pids_of_server(server_id, pgid, pgid_start)
