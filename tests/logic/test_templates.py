"""Process templates, the parts that need no SGLang: when a server is forked
from one, what its environment keeps, and how a forked launcher's exit
reaches the harness (tests/server/test_templates.py runs real ones)."""
from __future__ import annotations

import os
import subprocess
import sys

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
           "PYTEST_CURRENT_TEST": "test_y (call)"}  # changes with every test: one template for all
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
