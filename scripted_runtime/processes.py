"""Find and stop every process of one launched server (Linux /proc).

Each server's processes carry SCRIPTED_RUNTIME_SERVER_ID=<id> in their
environment (SGLang's spawned ranks inherit it), so they are found even if
something moved them out of the launcher's process group.
"""
from __future__ import annotations

import os
import signal
import time
from typing import List

from scripted_runtime.protocol import ENV_SERVER_ID


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has already exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return False


def pids_of_server(server_id: str) -> List[int]:
    marker = f"{ENV_SERVER_ID}={server_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if marker in env.split(b"\0") and is_running(int(name)):
            found.append(int(name))
    return sorted(found)


def kill_server(server_id: str, pgid: int, *, term_grace_s: float = 0.5, kill_wait_s: float = 3.0) -> List[int]:
    """SIGTERM the group, SIGKILL whatever is left; returns pids still alive."""
    for sig, wait_s in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids_of_server(server_id):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pids_of_server(server_id):
                return []
            time.sleep(0.05)
    return pids_of_server(server_id)
