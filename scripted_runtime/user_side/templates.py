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

Shared with the harness's child processes: a template listens on a socket
in a private directory, and the harness names it, with its secret and the
base environment's digest, in ``SCRIPTED_RUNTIME_TEMPLATE_SHARE`` of its own
environment, which its child processes inherit (an ``ab`` side, an
``explore -n`` worker, a ``scripted-runtime`` command run by a test). A
child whose build and base environment match connects instead of importing
torch and SGLang again (``SharedTemplate``); any other child, or one whose
connection fails, starts its own. Under pytest-xdist the workers are
siblings, not the controller's harness children: the pytest plugin has the
controller offer its template through a ``Rendezvous`` directory, started
when the first worker asks.

CPU only (``enabled``): on a GPU, SGLang spawns its ranks because a forked
child cannot use a CUDA context, and the template path is not proven safe
there. ``SCRIPTED_RUNTIME_TEMPLATES=off`` turns templates off (every server
spawned, as before).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from scripted_runtime import protocol
from scripted_runtime.hooks import sglang_compat
from scripted_runtime.user_side import processes, template_process

ENV_TEMPLATES = "SCRIPTED_RUNTIME_TEMPLATES"  # "off": spawn every server
# the templates a child process may share: a JSON list of {socket, token, key, pid}
ENV_SHARE = "SCRIPTED_RUNTIME_TEMPLATE_SHARE"
# under pytest-xdist, the controller's rendezvous directory (``Rendezvous``), set in the workers'
# environment by the pytest plugin; a worker takes it out of its own (``take_rendezvous``)
ENV_RENDEZVOUS = "SCRIPTED_RUNTIME_TEMPLATE_RENDEZVOUS"
CONNECT_TIMEOUT_S = 5.0
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
    # the terminal's size, which pytest sets during a run (so its children differ from the
    # template its first server started): read when something prints, not at import
    "COLUMNS", "LINES",
    # the templates a harness shares with its children, and the xdist controller's rendezvous
    # (gone from a worker's environment, in the controller's): no part of a template's environment
    ENV_SHARE, ENV_RENDEZVOUS,
    # set by importing SGLang in the harness's own process (a test reading SGLang's classes), so
    # that process's later servers asked for another template than its first: read by nothing
    # at import, and the forked server's processes get the harness's values with their environment
    *sglang_compat.IMPORT_SET_ENV,
)


# pytest's own variables (a pytester run sets PYTEST_DEBUG_TEMPROOT and PY_COLORS): read by pytest
# when it runs or prints, by nothing a server imports
PER_SERVER_PREFIXES = ("PYTEST_", "PY_COLORS")


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

    shared = False  # a template of this process (SharedTemplate: a parent's)

    def __init__(self, python: str, env: Dict[str, str], cwd: str, key: str = "") -> None:
        self.python = python
        self.key = key
        self.log_path = Path(tempfile.mkstemp(prefix="scripted-runtime-template-", suffix=".log")[1])
        self._lock = threading.Lock()
        self._buf = b""
        # where child harnesses reach it: a socket in a directory of mode 0700 (mkdtemp's)
        self._share_dir = tempfile.mkdtemp(prefix="scripted-runtime-template-")
        self.socket_path = os.path.join(self._share_dir, "socket")
        self._token = secrets.token_hex(16)
        t0 = time.monotonic()
        listen = {template_process.ENV_LISTEN: self.socket_path, template_process.ENV_TOKEN: self._token,
                  template_process.ENV_LOG: str(self.log_path)}
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [python, "-m", "scripted_runtime.user_side.template_process"],
                env={**env, **listen}, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
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

    def share_entry(self) -> Optional[Dict[str, Any]]:
        """What a child process needs to use this template (``ENV_SHARE``),
        or None if it does not listen."""
        if not self.info.get("listening") or not self.key:
            return None
        return {"socket": self.socket_path, "token": self._token, "key": self.key, "pid": self.pid}

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _answer_fd(self) -> int:
        return self._proc.stdout.fileno()

    def _write(self, data: bytes) -> None:
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def _gone(self, what: str) -> TemplateError:
        code = self._proc.wait(timeout=5)
        return TemplateError(f"the process template exited (code {code}) while the harness waited "
                             f"for {what}; log {self.log_path}:\n{_tail(self.log_path)}")

    def _read_answer(self, timeout_s: float, what: str) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        out = self._answer_fd()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TemplateError(f"no answer from the process template (pid {self.pid}) "
                                    f"within {timeout_s:.0f}s: waited for {what} (log: {self.log_path})")
            ready, _, _ = select.select([out], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(out, 1 << 16)
            if not chunk:
                raise self._gone(what)
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _ask(self, request: Dict[str, Any], what: str) -> Dict[str, Any]:
        with self._lock:
            if not self.alive:
                raise TemplateError(f"the process template (pid {self.pid}) is gone "
                                    f"(log: {self.log_path})")
            try:
                self._write((json.dumps(request) + "\n").encode())
            except (BrokenPipeError, OSError) as exc:
                raise TemplateError(f"the process template stopped reading ({exc}; log: {self.log_path})")
            answer = self._read_answer(ANSWER_TIMEOUT_S, what)
        if "error" in answer:
            raise TemplateError(f"the process template refused {request.get('op')}: {answer['error']}")
        return answer

    def spawn(self, args_json: str, env: Mapping[str, str], cwd: str, log: Path) -> ForkedLauncher:
        """A server launcher forked from this template: ``launch.main(args_json)``
        with ``env`` as its whole environment (less ``ENV_SHARE``: a server
        starts no template), output in ``log``."""
        env = {k: v for k, v in env.items() if k != ENV_SHARE}
        answer = self._ask({"op": "spawn", "args_json": args_json, "env": env, "cwd": cwd,
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
        shutil.rmtree(self._share_dir, ignore_errors=True)
        if not keep_log:
            self.log_path.unlink(missing_ok=True)


class SharedTemplate(Template):
    """A template another harness process started (this one's parent, or
    further up), reached through its socket: the same ``spawn`` and
    ``exit_code``; ``close`` only hangs up (the template is its owner's)."""

    shared = True

    def __init__(self, entry: Mapping[str, Any], python: str) -> None:  # noqa: super().__init__ starts a process
        self.python = python
        self.key = str(entry["key"])
        self.socket_path = str(entry["socket"])
        self.log_path = Path(self.socket_path)  # its log is the owner's; named in errors by the socket
        self._lock = threading.Lock()
        self._buf = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            self._sock.connect(self.socket_path)
            self._sock.settimeout(None)
            self._closed = False
            self._pid = int(entry.get("pid") or 0)
            self._write((json.dumps({"token": str(entry["token"])}) + "\n").encode())
            hello = self._read_answer(CONNECT_TIMEOUT_S, "the shared template's answer to the secret")
        except (OSError, TemplateError, ValueError) as exc:
            self._sock.close()
            raise TemplateError(f"cannot use the shared template at {self.socket_path}: {exc}") from None
        self._pid = int(hello["pid"])
        self.info = {"shared": True, "pid": self._pid}

    @property
    def alive(self) -> bool:
        return not self._closed and processes.is_running(self._pid)

    def _answer_fd(self) -> int:
        return self._sock.fileno()

    def _write(self, data: bytes) -> None:
        self._sock.sendall(data)

    def _gone(self, what: str) -> TemplateError:
        self._closed = True
        return TemplateError(f"the shared process template (pid {self._pid}) hung up while the harness "
                             f"waited for {what}")

    @property
    def pid(self) -> int:
        return self._pid

    def share_entry(self) -> Optional[Dict[str, Any]]:
        return None  # the owner's entry is in the environment already

    def close(self, keep_log: bool = False) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass


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
    base = {k: v for k, v in env.items() if k not in PER_SERVER_ENV and not k.startswith(PER_SERVER_PREFIXES)}
    base["PYTHONPATH"] = python_path
    return base


def key_digest(python: str, base: Mapping[str, str]) -> str:
    """What a shared template's entry names its build and base environment
    by: a child uses it only if its own digest is the same."""
    return hashlib.sha256(json.dumps([python, sorted(base.items())]).encode()).hexdigest()


def _shared_entries() -> List[Dict[str, Any]]:
    try:
        entries = json.loads(os.environ.get(ENV_SHARE) or "[]")
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict) and {"socket", "token", "key"} <= set(e)]


def publish() -> None:
    """Name this process's listening templates in its environment (its
    children inherit it), keeping the inherited entries of other builds."""
    own = [t.share_entry() for t in _templates.values() if not t.shared]
    own = [e for e in own if e is not None]
    keys = {e["key"] for e in own}
    entries = own + [e for e in _shared_entries() if e["key"] not in keys]
    if entries:
        os.environ[ENV_SHARE] = json.dumps(entries)
    else:
        os.environ.pop(ENV_SHARE, None)


class Rendezvous:
    """One template for every pytest-xdist worker, started by the controller
    (the workers are its children, so it outlives every server they fork),
    and only once a worker asks for it: a worker that needs a template
    creates ``wanted`` in this private directory (mode 0700) and waits for
    ``entry.json`` (the template's share entry: socket, secret, key, pid) or
    ``failed`` (why there is none; the worker then starts its own). The
    controller's thread polls for ``wanted`` and calls ``start`` (which
    returns the template) once. A run whose workers never start a server
    starts no template."""

    POLL_S = 0.1

    def __init__(self, start: Any) -> None:
        self.directory = tempfile.mkdtemp(prefix="scripted-runtime-rendezvous-")
        self.template: Optional[Template] = None
        self._start = start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="scripted-runtime-template-rendezvous",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        wanted = os.path.join(self.directory, "wanted")
        while not os.path.exists(wanted):
            if self._stop.wait(self.POLL_S):
                return
        try:
            template = self._start()
            entry = template.share_entry() if template is not None else None
            if entry is None:
                raise TemplateError("templates are off, or the template does not listen for other processes")
        except Exception as exc:  # noqa: BLE001 - named to the workers, which start their own
            _write_file(os.path.join(self.directory, "failed"), f"{type(exc).__name__}: {exc}"[:500])
            return
        self.template = template
        _write_file(os.path.join(self.directory, "entry.json"), json.dumps(entry))

    def close(self) -> None:
        """Stop answering (a start under way finishes in its thread) and
        remove the directory; the template itself closes with the process."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        shutil.rmtree(self.directory, ignore_errors=True)


def _write_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader sees all of it or no file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


_rendezvous_dir: Optional[str] = None


def take_rendezvous() -> Optional[str]:
    """In a pytest-xdist worker: take the controller's rendezvous directory
    out of the environment, so that this process's children (an ``ab``
    side, a ``scripted-runtime`` command a test runs) do not ask for the
    controller's template themselves: once this process uses it, they
    inherit its share entry (``ENV_SHARE``) as from any parent harness."""
    global _rendezvous_dir
    value = os.environ.pop(ENV_RENDEZVOUS, None)
    if value:
        _rendezvous_dir = value
    return _rendezvous_dir


def _connect_rendezvous(key: str, python: str, timeout_s: float = READY_TIMEOUT_S) -> Optional[Template]:
    """The controller's template (``Rendezvous``), asked for and waited for
    (at most ``timeout_s``: its imports), if its key is ``key``; else None
    (this process then starts its own)."""
    directory = _rendezvous_dir
    if not directory or not os.path.isdir(directory):
        return None
    entry_path, failed = os.path.join(directory, "entry.json"), os.path.join(directory, "failed")
    if not os.path.exists(entry_path) and not os.path.exists(failed):
        try:
            open(os.path.join(directory, "wanted"), "a").close()
        except OSError:
            return None
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(entry_path) and not os.path.exists(failed):
            if time.monotonic() > deadline or not os.path.isdir(directory):
                return None
            time.sleep(Rendezvous.POLL_S)
    try:
        with open(entry_path) as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None  # failed: the reason is in the file; this process starts its own
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    try:
        template = SharedTemplate(entry, python)
    except TemplateError:
        return None
    # this process's children share it as a parent harness's template
    os.environ[ENV_SHARE] = json.dumps([entry] + [e for e in _shared_entries() if e["key"] != key])
    return template


def _connect_shared(key: str, python: str) -> Optional[Template]:
    for entry in _shared_entries():
        if entry["key"] != key or not os.path.exists(str(entry["socket"])):
            continue
        try:
            return SharedTemplate(entry, python)
        except TemplateError:
            continue  # its owner exited, say: this process starts its own
    return None


def template_for(env: Mapping[str, str], python_path: str, cwd: str, python: str = sys.executable) -> Template:
    """The template for this build and base environment: this process's, a
    parent harness's (``ENV_SHARE``), or a new one started here."""
    base = base_env(env, python_path)
    key = (python, tuple(sorted(base.items())))
    with _registry_lock:
        template = _templates.get(key)
        if template is not None and template.alive:
            _templates[key] = _templates.pop(key)  # most recently used last
            return template
        stale = _templates.pop(key, None)
        if stale is not None:
            stale.close()
        while len(_templates) >= MAX_TEMPLATES:
            _templates.pop(next(iter(_templates))).close()
        digest = key_digest(python, base)
        template = _connect_shared(digest, python) or _connect_rendezvous(digest, python)
        if template is None:
            template = Template(python, base, cwd, key=digest)
        _templates[key] = template
        publish()
        return template


def running() -> List[Template]:
    with _registry_lock:
        return list(_templates.values())


def release(template: Template) -> None:
    """Close ``template`` (hang up, for a shared one) and forget it."""
    with _registry_lock:
        for key in [k for k, t in _templates.items() if t is template]:
            del _templates[key]
        template.close()
        publish()


def close_all() -> None:
    with _registry_lock:
        while _templates:
            _templates.popitem()[1].close()
        publish()


atexit.register(close_all)
