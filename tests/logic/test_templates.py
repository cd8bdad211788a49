"""Process templates, the parts that need no SGLang: when a server is forked
from one, what its environment keeps, and how a forked launcher's exit
reaches the harness (tests/server/test_templates.py runs real ones)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from scripted_runtime import protocol
from scripted_runtime.user_side import templates


@pytest.mark.parametrize("device, env, expected", [
    ("cpu", {}, True),
    ("cpu", {templates.ENV_TEMPLATES: "off"}, False),
    ("cpu", {templates.ENV_TEMPLATES: "0"}, False),
    ("cpu", {templates.ENV_TEMPLATES: "on"}, True),
    ("cuda", {}, False),  # SGLang spawns GPU ranks: a forked child cannot use its parent's CUDA context
    ("cpu", {"SCRIPTED_RUNTIME_SCHEDULER_HOOK": "0"}, False),  # a plain server for the benches
    ("cpu", {"SCRIPTED_RUNTIME_UPSTREAM_HARNESS": "1"}, False),
])
def test_which_servers_start_from_a_template(device, env, expected):
    assert templates.enabled(device, env) is expected


def test_a_template_environment_holds_nothing_of_one_server():
    env = {"HOME": "/root", protocol.ENV_HOOKS: "1", protocol.ENV_PATCHES: "mut_abort_keeps_row",
           protocol.ENV_REVERT_FIXES: "pr27446", protocol.ENV_API_KEY: "secret", protocol.ENV_SERVER_ID: "abc",
           protocol.ENV_IPC_ADDR: "ipc:///tmp/x/control", "PYTHONPATH": "/patches:/site",
           templates.ENV_TEMPLATES: "on", "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
           "PYTEST_CURRENT_TEST": "test_y (call)",  # changes with every test: one template for all
           "PYTEST_DEBUG_TEMPROOT": "/tmp/p", "PY_COLORS": "0",  # a pytester run's: pytest reads them
           "COLUMNS": "80", "LINES": "24",  # the terminal's, set by pytest mid-run
           # set by importing SGLang in this process (a test reading its classes), as in the template
           "TRITON_CACHE_DIR": "/root/.cache/sglang/triton", "CUDA_CACHE_PATH": "/root/.cache/sglang/nv"}
    base = templates.base_env(env, "/site:/harness")
    assert base == {"HOME": "/root", protocol.ENV_HOOKS: "1", "PYTHONPATH": "/site:/harness"}


class _Reaper:
    """The template's side of ``exit_code``: it is the parent, it reaps."""

    def __init__(self) -> None:
        self.asked = 0

    def exit_code(self, pid: int):
        self.asked += 1
        done, status = os.waitpid(pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if done else None


def test_a_forked_launcher_reports_its_exit_code_through_its_template():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"])
    reaper = _Reaper()
    launcher = templates.ForkedLauncher(reaper, child.pid)
    assert launcher.poll() is None and reaper.asked == 0  # running: /proc answers, the template is not asked
    assert launcher.wait(timeout=10) == 3
    assert launcher.poll() == 3 and reaper.asked >= 1
    child.returncode = 3  # reaped above; keep Popen from waiting on it again


def test_waiting_on_a_forked_launcher_has_a_deadline():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        launcher = templates.ForkedLauncher(_Reaper(), child.pid)
        with pytest.raises(subprocess.TimeoutExpired):
            launcher.wait(timeout=0.2)
    finally:
        child.kill()
        child.wait()


def test_a_template_that_cannot_start_is_a_named_error_with_its_log_kept(tmp_path):
    """Here the 'build' is a program that prints and exits: the harness
    stops waiting at once, says what it waited for and keeps the log."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: no module named torch' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(templates.TemplateError) as err:
        templates.Template(str(fake), {"PATH": os.environ.get("PATH", "")}, str(tmp_path))
    message = str(err.value)
    assert "exited (code 1)" in message and "ready line" in message and "no module named torch" in message
    log = message.split("log ", 1)[1].split(":", 1)[0]
    assert os.path.exists(log), "a failed start's log is kept"
    os.unlink(log)


class _ListeningTemplate:
    """A template's serve loop with its listening socket, in a thread of
    this process (no imports, no fork: only ``status`` requests)."""

    def __init__(self, tmp_path, token: str = "the-secret") -> None:
        import threading

        from scripted_runtime.user_side import template_process

        self.path = str(tmp_path / "socket")
        self._in_r, self._in_w = os.pipe()  # the owner's pipes
        self._out_r, self._out_w = os.pipe()
        self.template = template_process._Template(self._in_r, self._out_w, template_process.listen(self.path),
                                                   token)
        self.thread = threading.Thread(target=self.template.serve, daemon=True)
        self.thread.start()

    def entry(self, **changes):
        return {"socket": self.path, "token": "the-secret", "key": "k", "pid": os.getpid(), **changes}

    def close(self) -> None:
        os.close(self._in_w)  # the owner hangs up: the loop ends
        self.thread.join(5)
        self.template.listener.close()
        for fd in (self._in_r, self._out_r, self._out_w):
            os.close(fd)


def test_a_child_harness_with_the_secret_uses_the_template_and_one_without_learns_nothing(tmp_path):
    import socket
    import stat

    served = _ListeningTemplate(tmp_path)
    try:
        assert stat.S_IMODE(os.stat(served.path).st_mode) == 0o600  # and its directory is 0700 (mkdtemp)
        shared = templates.SharedTemplate(served.entry(), sys.executable)
        assert shared.shared and shared.pid == os.getpid() and shared.alive
        assert shared.exit_code(999_999_999) is None  # asked and answered over the socket: not its child
        with pytest.raises(templates.TemplateError, match="cannot use the shared template"):
            templates.SharedTemplate(served.entry(token="a-guess"), sys.executable)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(5)
        raw.connect(served.path)
        raw.sendall(b'{"op": "status", "pid": 1}\n')  # a request before the secret: closed, unanswered
        assert raw.recv(100) == b""
        raw.close()
        assert shared.exit_code(999_999_999) is None  # the good connection is still served
        shared.close()
    finally:
        served.close()
    assert not served.thread.is_alive(), "the template ends when its owner's pipe closes, whoever is connected"


def test_a_template_is_shared_only_with_a_child_of_the_same_build_and_environment(tmp_path, monkeypatch):
    served = _ListeningTemplate(tmp_path)
    try:
        env = {"HOME": "/root", protocol.ENV_HOOKS: "1"}
        key = templates.key_digest(sys.executable, templates.base_env(env, "/site"))
        with monkeypatch.context() as mp:
            mp.setenv(templates.ENV_SHARE, json.dumps([served.entry(key=key)]))
            template = templates.template_for({**env, protocol.ENV_API_KEY: "per-server"}, "/site", str(tmp_path))
            try:
                assert template.shared and template.pid == os.getpid()
                assert template in templates.running()
            finally:
                templates.release(template)
            assert template not in templates.running()
        # the environment as it was, then this process's own templates named again (the suite's, started
        # by the plugin while this test ran, published into the environment the context then restored)
        templates.publish()
        # the base environment differs (HOME is read at import: huggingface_hub's cache paths): not shared
        assert key != templates.key_digest(sys.executable, templates.base_env({**env, "HOME": "/tmp"}, "/site"))
        assert key != templates.key_digest("/other/python", templates.base_env(env, "/site"))
        assert templates.ENV_SHARE not in templates.base_env(
            {**env, templates.ENV_SHARE: "[]"}, "/site"), "the shared list is no part of a template's key"
    finally:
        served.close()


def test_xdist_workers_share_the_controller_template_started_only_when_one_asks(tmp_path, monkeypatch):
    """The pytest plugin's rendezvous: the controller starts its template
    only once a worker asks, every worker with the same key connects to it,
    and the worker's children inherit its share entry, not the rendezvous."""
    served = _ListeningTemplate(tmp_path)
    started = []

    class _Owned:  # what the controller's prestart returns
        def share_entry(self):
            return served.entry(key=key)

    def start():
        started.append(1)
        return _Owned()

    env = {"HOME": "/root", protocol.ENV_HOOKS: "1"}
    key = templates.key_digest(sys.executable, templates.base_env(env, "/site"))
    rendezvous = templates.Rendezvous(start)
    try:
        time.sleep(3 * templates.Rendezvous.POLL_S)
        assert started == [], "a template was started before any worker asked for one"
        monkeypatch.setenv(templates.ENV_RENDEZVOUS, rendezvous.directory)
        monkeypatch.setattr(templates, "_rendezvous_dir", None)
        monkeypatch.setenv(templates.ENV_SHARE, "[]")
        assert templates.take_rendezvous() == rendezvous.directory
        assert templates.ENV_RENDEZVOUS not in os.environ  # this worker's children do not ask again
        assert templates.ENV_RENDEZVOUS not in templates.base_env({templates.ENV_RENDEZVOUS: "x"}, "/site")
        template = templates.template_for({**env, protocol.ENV_API_KEY: "per-server"}, "/site", str(tmp_path))
        try:
            assert template.shared and template.pid == os.getpid() and started == [1]
            assert [e["key"] for e in json.loads(os.environ[templates.ENV_SHARE])] == [key]  # for its children
            # another build or environment: not this template (that worker starts its own)
            assert templates._connect_rendezvous("another-key", sys.executable, timeout_s=1) is None
        finally:
            templates.release(template)
    finally:
        rendezvous.close()
        served.close()
    assert not os.path.exists(rendezvous.directory)
    assert started == [1]


def test_a_worker_whose_controller_could_not_start_a_template_is_told_at_once(tmp_path, monkeypatch):
    def start():
        raise templates.TemplateError("imports failed")

    rendezvous = templates.Rendezvous(start)
    try:
        monkeypatch.setattr(templates, "_rendezvous_dir", rendezvous.directory)
        t0 = time.monotonic()
        assert templates._connect_rendezvous("k", sys.executable, timeout_s=30) is None
        assert time.monotonic() - t0 < 5  # the failure, not the deadline
        with open(os.path.join(rendezvous.directory, "failed")) as f:
            assert "imports failed" in f.read()
    finally:
        rendezvous.close()
    # and with no answer at all, the wait has a deadline
    silent = tmp_path / "silent"
    silent.mkdir()
    monkeypatch.setattr(templates, "_rendezvous_dir", str(silent))
    t0 = time.monotonic()
    assert templates._connect_rendezvous("k", sys.executable, timeout_s=0.5) is None
    assert time.monotonic() - t0 < 3

