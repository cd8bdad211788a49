"""Process templates, the harness's side: start a server's launcher by
forking it from a long-lived process that has already imported torch and
SGLang (``template_process.py``), instead of spawning a fresh interpreter.

One template per build and base environment (the Python executable and the
environment every server of this harness shares; what differs per server,
its control address, key, patches and the rest, goes with each request).
Started on first use, reused by every server the process starts (the pytest
plugin's pool, ``explore``'s restarts and standby, ``mutate``, ``ab``,
history recovery), and gone with the harness: it exits when the pipe to it
closes, which the harness's exit (clean or killed) does.

CPU only (``enabled``): on a GPU, SGLang spawns its ranks because a forked
child cannot use a CUDA context, and the template path is not proven safe
there. ``SCRIPTED_RUNTIME_TEMPLATES=off`` turns templates off (every server
spawned, as before).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from scripted_runtime import protocol
from scripted_runtime.user_side import processes

ENV_TEMPLATES = "SCRIPTED_RUNTIME_TEMPLATES"  # "off": spawn every server
READY_TIMEOUT_S = 180.0  # importing torch and SGLang on a loaded 2-core box
ANSWER_TIMEOUT_S = 30.0
MAX_TEMPLATES = 2  # a third base environment closes the least recently used
# what differs from one server to the next: sent with each request, never
# part of a template's own environment (so no template carries a patch)
PER_SERVER_ENV = (
    protocol.ENV_IPC_ADDR, protocol.ENV_API_KEY, protocol.ENV_HTTP_URL, protocol.ENV_SERVER_ID,
    protocol.ENV_HARNESS_PID, protocol.ENV_CRASH_DIR, protocol.ENV_SYS_PATH, protocol.ENV_CHECKPOINT,
    protocol.ENV_PATCHES, protocol.ENV_REVERT_FIXES, "SCRIPTED_RUNTIME_EXTENSIONS",
    "SCRIPTED_RUNTIME_EXPECT_WARMUP", "SGLANG_CPU_OMP_THREADS_BIND", "PYTHONPATH", ENV_TEMPLATES,
    # changes with every test under pytest, read by nothing a server imports
    "PYTEST_CURRENT_TEST",
)


class TemplateError(RuntimeError):
    """A template could not start, or stopped answering."""


def enabled(device: str, env: Mapping[str, str]) -> bool:
    """Whether a server of ``device`` with environment ``env`` starts from a
    template: CPU servers with the harness's own scheduler hook, unless
    ``SCRIPTED_RUNTIME_TEMPLATES=off``."""
    if env.get(ENV_TEMPLATES, "on").lower() in ("off", "0", "no", "false"):
        return False
    return (device == "cpu" and env.get("SCRIPTED_RUNTIME_SCHEDULER_HOOK", "1") == "1"
            and env.get("SCRIPTED_RUNTIME_UPSTREAM_HARNESS") != "1")


class ForkedLauncher:
    """A launcher forked by a template, with the part of ``subprocess.Popen``
    a server uses (``pid``, ``poll``, ``wait``). Its parent is the template,
    which reaps it and keeps its exit code."""

    def __init__(self, template: "Template", pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._template = template
        self._started = processes.start_time(pid)

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        if self._started is not None and processes.same_process_running(self.pid, self._started):
            return None
        code = self._template.exit_code(self.pid)
        if code is None and self._started is not None and processes.start_time(self.pid) == self._started:
            return None  # exited a moment ago, not reaped yet
        self.returncode = -9 if code is None else code
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout)
            time.sleep(0.05)


class Template:
    """One template process; ``spawn`` forks a launcher from it."""

    def __init__(self, python: str, env: Dict[str, str], cwd: str) -> None:
        self.python = python
        self.log_path = Path(tempfile.mkstemp(prefix="scripted-runtime-template-", suffix=".log")[1])
        self._lock = threading.Lock()
        self._buf = b""
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [python, "-m", "scripted_runtime.user_side.template_process"],
                env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
        try:
            ready = self._read_answer(READY_TIMEOUT_S, "the template's ready line (importing torch and SGLang)")
        except TemplateError:
            self.close(keep_log=True)
            raise
        if not ready.get("ready"):
            self.close(keep_log=True)
            raise TemplateError(f"the process template could not start: {ready.get('error')} "
                                f"(log kept: {self.log_path}; {ENV_TEMPLATES}=off spawns servers instead)")
        self.info = {**ready, "ready_s": round(time.monotonic() - t0, 2)}

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _read_answer(self, timeout_s: float, what: str) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        out = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TemplateError(f"no answer from the process template (pid {self._proc.pid}) "
                                    f"within {timeout_s:.0f}s: waited for {what} (log: {self.log_path})")
            ready, _, _ = select.select([out], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(out, 1 << 16)
            if not chunk:
                code = self._proc.wait(timeout=5)
                raise TemplateError(f"the process template exited (code {code}) while the harness waited "
                                    f"for {what}; log {self.log_path}:\n{_tail(self.log_path)}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _ask(self, request: Dict[str, Any], what: str) -> Dict[str, Any]:
        with self._lock:
            if not self.alive:
                raise TemplateError(f"the process template (pid {self._proc.pid}) is gone "
                                    f"(log: {self.log_path})")
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise TemplateError(f"the process template stopped reading ({exc}; log: {self.log_path})")
            answer = self._read_answer(ANSWER_TIMEOUT_S, what)
        if "error" in answer:
            raise TemplateError(f"the process template refused {request.get('op')}: {answer['error']}")
        return answer

    def spawn(self, args_json: str, env: Mapping[str, str], cwd: str, log: Path) -> ForkedLauncher:
        """A server launcher forked from this template: ``launch.main(args_json)``
        with ``env`` as its whole environment, output in ``log``."""
        answer = self._ask({"op": "spawn", "args_json": args_json, "env": dict(env), "cwd": cwd,
                            "log": str(log)}, "the forked launcher's pid")
        return ForkedLauncher(self, int(answer["pid"]))

    def exit_code(self, pid: int) -> Optional[int]:
        """A child's exit code, or None while it runs (or the template is gone)."""
        try:
            return self._ask({"op": "status", "pid": pid}, f"the status of launcher {pid}").get("code")
        except TemplateError:
            return None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self, keep_log: bool = False) -> None:
        """End the template (its servers are not touched: each has its own
        owner); its log is removed unless ``keep_log`` (a failed start's)."""
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        try:
            self._proc.stdout.close()
        except OSError:
            pass
        if not keep_log:
            self.log_path.unlink(missing_ok=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


_templates: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], Template] = {}
_registry_lock = threading.Lock()


def base_env(env: Mapping[str, str], python_path: str) -> Dict[str, str]:
    """``env`` without what differs per server, with ``python_path`` (the
    sitecustomize's and the harness's folders, the user's own entries,
    nothing of a patch's) as its PYTHONPATH."""
    base = {k: v for k, v in env.items() if k not in PER_SERVER_ENV}
    base["PYTHONPATH"] = python_path
    return base


def template_for(env: Mapping[str, str], python_path: str, cwd: str, python: str = sys.executable) -> Template:
    """The template for this build and base environment, started if need be."""
    base = base_env(env, python_path)
    key = (python, tuple(sorted(base.items())))
    with _registry_lock:
        template = _templates.get(key)
        if template is not None and template.alive:
            _templates[key] = _templates.pop(key)  # most recently used last
            return template
        _templates.pop(key, None)
        while len(_templates) >= MAX_TEMPLATES:
            _templates.pop(next(iter(_templates))).close()
        template = Template(python, base, cwd)
        _templates[key] = template
        return template


def running() -> List[Template]:
    with _registry_lock:
        return list(_templates.values())


def close_all() -> None:
    with _registry_lock:
        while _templates:
            _templates.popitem()[1].close()


atexit.register(close_all)
