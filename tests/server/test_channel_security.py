"""Only the harness can drive its servers (issue 37), tried as another local
user would: the endpoints a server opened are read off ``/proc`` (the
environment passed to its processes), then a process running as ``nobody``
tries each; the harness's own scenario result is unchanged.

* The control channel is a unix socket in a directory only the harness's
  user can enter: another user cannot connect to it (EACCES), during the
  start or after.
* SGLang's HTTP server has a random per-start key (``api_key`` and
  ``admin_api_key``): a control or generate request without it gets 401, from
  another user and from the same one; the key is on no command line.

Acting as another user needs root (``setuid``); elsewhere those tests skip
and say why.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List

import pytest

from scripted_runtime import protocol

ROOT = Path(__file__).resolve().parents[2]
DEMO = f"{ROOT / 'scenarios' / 'demo.py'}:chunked_then_decode"
NOBODY = 65534


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _endpoints(pids: List[int]) -> Dict[str, str]:
    """The control address and HTTP URL the harness passed to a server's processes."""
    for pid in pids:
        env = _environ(pid)
        if protocol.ENV_IPC_ADDR in env:
            return {"control": env[protocol.ENV_IPC_ADDR], "http": env[protocol.ENV_HTTP_URL]}
    return {}


def _endpoints_of(server) -> Dict[str, str]:
    """What the harness gave the server; for a spawned server the same as
    its processes' environment shows (a forked one shows the template's)."""
    found = _endpoints(server.pids())
    if not server.forked:
        assert found == {"control": server.control_address, "http": server.http_url}, found
    return {"control": server.control_address, "http": server.http_url}


def _control_sockets_in_tmp(since: float) -> List[str]:
    """Control sockets of server work directories made since ``since``: what
    another user finds by listing the temporary directory (it cannot enter
    the directories, but the names are public)."""
    import tempfile

    from scripted_runtime.user_side import workdirs

    found = []
    for d in Path(tempfile.gettempdir()).glob(workdirs.PREFIX + "*"):
        try:
            if d.stat().st_mtime >= since and (d / "control").exists():
                found.append(f"ipc://{d / 'control'}")
        except OSError:
            continue
    return found


def _pids() -> List[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and int(p.name) != os.getpid()]


def _post(url: str, path: str, payload: dict, key: str = "") -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + path, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _as_nobody(fn: Callable[[], object]) -> object:
    """``fn()`` in a forked child running as user nobody; its JSON result."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (setuid nobody)")
    # what the child needs but could not import as nobody (the checkout may be root's alone)
    "127.0.0.1".encode("idna")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest code past this point, os._exit always
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = f"child error {type(exc).__name__}: {exc}"
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        data = os.read(r, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"null")


def _try_control(address: str) -> str:
    """Connect to the control socket as a raw unix socket: what zmq's ipc does."""
    path = address[len("ipc://"):]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as exc:
            return type(exc).__name__
        return "connected"


def test_another_user_reaches_neither_the_control_socket_nor_the_http_server(server_pool):
    server = server_pool.get("pp1-overlap")
    before = server.run(DEMO)
    assert before.passed, before.summary()
    found = _endpoints_of(server)
    assert found["control"].startswith("ipc://") and found["http"].startswith("http://127.0.0.1:"), found
    control_dir = Path(found["control"][len("ipc://"):]).parent
    assert oct(control_dir.stat().st_mode & 0o777) == "0o700", control_dir
    tried = _as_nobody(lambda: {
        "control": _try_control(found["control"]),
        "flush": _post(found["http"], "/flush_cache", {}),
        "generate": _post(found["http"], "/generate", {"input_ids": [3, 4, 5], "sampling_params": {}}),
    })
    assert tried == {"control": "PermissionError", "flush": 401, "generate": 401}, tried
    after = server.run(DEMO)
    assert after.passed and after.value == before.value, (before.value, after.value)


def test_a_request_without_the_key_gets_401_and_changes_nothing(server_pool):
    """The same user, without the key (any local process that found the port)."""
    server = server_pool.get("pp1-overlap")
    before = server.run(DEMO)
    url = _endpoints_of(server)["http"]
    for path, payload in (("/flush_cache", {}), ("/pause_generation", {"mode": "in_place"}),
                          ("/update_weights_from_disk", {"model_path": "/nonexistent"}),
                          ("/abort_request", {"abort_all": True}),
                          ("/generate", {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 2}})):
        assert _post(url, path, payload) == 401, path
        assert _post(url, path, payload, key="not-the-key") == 401, path
    after = server.run(DEMO)
    assert before.passed and after.passed and after.value == before.value, (before.value, after.value)
    for pid in server.pids():  # the key is in no command line (every local user can read those)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert server.api_key not in cmdline, pid


@pytest.mark.slow  # a server start of its own (~25 s)
def test_while_a_server_starts_another_user_cannot_take_its_control_channel(tmp_path):
    """The window issue 37 measured: the channel is open for the whole start.
    A process running as nobody watches for the launcher, reads the control
    address off its environment (a spawned launcher) or finds the socket by
    its work directory's name (a launcher forked from a template shows no
    address in its environment) and tries to connect until the server is
    ready; the server starts, and its scenario passes as on any server."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (setuid nobody)")
    import threading

    from scripted_runtime import ScriptedServer

    attempts: List[str] = []
    stop = threading.Event()

    since = time.time() - 1

    def watch() -> None:
        seen = False
        while not stop.is_set():
            addresses = {_endpoints([pid]).get("control") for pid in _pids()} | set(_control_sockets_in_tmp(since))
            for address in sorted(a for a in addresses if a):
                attempts.append(str(_as_nobody(lambda: _try_control(address))))
                seen = True
            time.sleep(0.5 if seen else 0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with ScriptedServer.start(topology="pp1-overlap", log_dir=tmp_path) as server:
            stop.set()
            watcher.join(timeout=30)
            result = server.run(DEMO)
    finally:
        stop.set()
    assert attempts and set(attempts) == {"PermissionError"}, attempts
    assert result.passed, result.summary()
