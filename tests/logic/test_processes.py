"""How a server's processes are found and stopped (scripted_runtime.user_side.processes),
with real processes shaped like an SGLang server: a launcher in a session of
its own whose children rename themselves with ``setproctitle`` (as SGLang's
scheduler and detokenizer do), which wipes what ``/proc/PID/environ`` shows.
No SGLang needed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from scripted_runtime.user_side import processes
from scripted_runtime.protocol import ENV_SERVER_ID

# The launcher starts two renamed children, prints their pids, then waits.
LAUNCHER = r"""
import subprocess, sys, time
child = "import setproctitle, time; setproctitle.setproctitle('sglang::fake-rank'); time.sleep(120)"
kids = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(120)
"""


def _wait_renamed(pid: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().startswith(b"sglang::fake-rank"):
                return
        time.sleep(0.02)
    raise TimeoutError(f"child {pid} did not rename itself within {timeout_s:.0f}s")


@pytest.fixture
def fake_server():
    pytest.importorskip("setproctitle")  # SGLang's own dependency
    server_id = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], env={**os.environ, ENV_SERVER_ID: server_id},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    start = processes.start_time(proc.pid)
    try:
        kids = [int(p) for p in proc.stdout.readline().split()]
        assert len(kids) == 2, "the fake launcher did not report its children"
        for kid in kids:
            _wait_renamed(kid)
        yield server_id, proc, start, kids
    finally:
        processes.kill_server(server_id, proc.pid, term_grace_s=0.0, pgid_start=start)
        proc.wait(timeout=10)


def test_renamed_ranks_lose_the_environment_marker(fake_server):
    """Why the marker alone is not enough: after setproctitle, a rank's
    /proc/PID/environ no longer carries it (the launcher's still does)."""
    server_id, proc, _, kids = fake_server
    marker = f"{ENV_SERVER_ID}={server_id}".encode()
    with open(f"/proc/{proc.pid}/environ", "rb") as f:
        assert marker in f.read().split(b"\0")
    for kid in kids:
        with open(f"/proc/{kid}/environ", "rb") as f:
            assert marker not in f.read().split(b"\0")


def test_finds_renamed_ranks_and_their_orphans(fake_server):
    server_id, proc, start, kids = fake_server
    assert processes.pids_of_server(server_id, proc.pid, start) == sorted([proc.pid] + kids)
    # Without the session, descent from the marked launcher still finds them.
    assert processes.pids_of_server(server_id) == sorted([proc.pid] + kids)
    os.kill(proc.pid, signal.SIGKILL)  # the launcher dies first: its children are orphaned
    proc.wait(timeout=10)
    assert processes.pids_of_server(server_id) == [], "no marker and no marked parent is left"
    assert processes.pids_of_server(server_id, proc.pid, start) == sorted(kids), "the session still holds them"
    assert processes.kill_server(server_id, proc.pid, term_grace_s=0.0, pgid_start=start) == []
    assert [k for k in kids if processes.is_running(k)] == []


def test_a_reused_launcher_pid_does_not_claim_its_session(fake_server):
    """A session whose leader has another start time belongs to someone
    else: only the marker (and descent) counts then."""
    server_id, proc, start, kids = fake_server
    assert processes.pids_of_server(server_id, proc.pid, start + 1) == sorted([proc.pid] + kids)
    other_id = uuid.uuid4().hex
    assert processes.pids_of_server(other_id, proc.pid, start + 1) == []
    assert processes.pids_of_server(other_id, proc.pid, start) == sorted([proc.pid] + kids)
    assert processes.pids_of_server(other_id, 0) == [], "session 0 (kernel threads) is never a server"


# A stand-in launcher: one child in its group, then the real watchdog.
WATCHED_LAUNCHER = r"""
import subprocess, sys
from scripted_runtime.user_side import launch
launch.WATCH_INTERVAL_S = 0.1
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
launch._watch_harness(int(sys.argv[1]))
"""


def test_watchdog_kills_the_server_group_when_the_harness_exits_unreaped():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    launcher = subprocess.Popen([sys.executable, "-c", WATCHED_LAUNCHER, str(harness.pid)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=root,
                                env={**os.environ, "PYTHONPATH": root})
    try:
        child = int(launcher.stdout.readline())
        time.sleep(0.5)
        assert launcher.poll() is None and processes.is_running(child)  # the harness lives: nothing killed
        harness.kill()  # and not reaped: a zombie, which kill(pid, 0) still finds
        deadline = time.monotonic() + 10
        while processes.is_running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes.is_running(child), "the watchdog left the server's group running"
        assert launcher.wait(timeout=5) == -signal.SIGKILL
        assert processes.start_time(harness.pid) is not None  # it was a zombie all along
    finally:
        harness.kill()
        harness.wait()
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def test_same_process_running_tells_a_reused_pid_and_a_zombie():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started = processes.start_time(proc.pid)
    assert processes.same_process_running(proc.pid, started)
    assert not processes.same_process_running(proc.pid, started + 1)  # another process with the pid
    proc.kill()
    deadline = time.monotonic() + 5
    while processes.is_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not processes.same_process_running(proc.pid, started)  # a zombie
    proc.wait()
    assert not processes.same_process_running(proc.pid, started)  # gone
