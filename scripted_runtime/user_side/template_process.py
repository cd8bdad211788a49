"""A process template: ``python -m scripted_runtime.user_side.template_process``.

Imports torch, SGLang's launcher and the harness once, then forks a server
launcher on each request of the harness that started it, instead of a fresh
interpreter importing all of it again (``templates.py`` is the harness's side;
docs/internals.md, "Process templates"). The launcher's scheduler ranks and
detokenizer are then forked from it too (``hooks/forked_ranks.py``), so no
process of a server imports torch or SGLang.

Protocol: one JSON object per line on the pipes the harness gave it as stdin
(requests) and stdout (answers), so no other process can talk to it. The
template moves both pipes off fds 0 and 1 before it imports anything: what
SGLang or torch print goes to its log (fd 2), never into the protocol.

* first line out: ``{"ready": true, "import_s": ..., "threads": ...}``, or
  ``{"ready": false, "error": ...}`` and the template exits;
* ``{"op": "spawn", "args_json", "env", "cwd", "log"}`` -> ``{"pid": N}``:
  a child that leads a session of its own, has stdin from /dev/null and
  stdout and stderr in ``log``, takes ``env`` as its whole environment,
  applies the hooks that environment asks for, and runs ``launch.main``;
* ``{"op": "status", "pid": N}`` -> ``{"running": bool, "code": int|null}``
  (a child's exit code as ``subprocess`` gives it: negative for a signal);
* end of input (the harness closed the pipe or died): the template exits.
  Servers it started do not depend on it: each watches the harness itself.

Shared with the harness's child processes (an ``ab`` side, an ``explore -n``
worker, a ``scripted-runtime`` command a test or script runs): when started
with ``SCRIPTED_RUNTIME_TEMPLATE_LISTEN`` (a socket path in a directory of
mode 0700 the harness made) and ``SCRIPTED_RUNTIME_TEMPLATE_TOKEN`` (a random
secret), the template also listens there. A connection's first line must be
``{"token": T}`` with that secret (answered ``{"pid": template pid}``; a
wrong one is closed unanswered); then the same requests as on the pipes,
one answer per request on that connection. Both variables leave the
template's environment before its imports, and the socket and every
connection are closed in a forked child. When its harness hangs up the
template removes the socket, its directory and its own log
(``SCRIPTED_RUNTIME_TEMPLATE_LOG``) before it exits: a harness killed with
SIGKILL leaves nothing behind. Another local user cannot reach
the socket (the directory's mode); the same user reads the token from the
harness's environment, as it can the control socket's (docs/internals.md,
"Who can reach what"). The template still exits when its own harness's
pipe closes, whoever else is connected.

What a fork must not inherit, and how the template guarantees it (checked
before it answers ready; a template that fails a check says so and exits):

* threads: a fork copies only the calling thread, so a lock another thread
  held stays locked forever in the child. The template starts no thread,
  and after the imports ``/proc/self/task`` holds the main thread and the
  worker pools of the OpenBLAS libraries numpy and scipy load at import
  (one pool each, ``num_threads - 1`` workers): OpenBLAS registers
  ``blas_thread_shutdown_`` with ``pthread_atfork``, which stops its pool
  before a fork and lets it start again on first use, so those are safe. A
  thread of anything else fails the check.
* OpenMP's pool: libgomp's worker threads do not survive a fork, and a child
  of a process that had started them can hang in its first parallel region.
  The template runs no torch operation, so no pool exists (the thread count
  above also counts OpenMP's threads).
* ZMQ: a context owns I/O threads and sockets; none is made
  (``zmq.Context._instance`` is None and the thread count is 1).
* CUDA: a CUDA context cannot be used in a forked child. Templates serve CPU
  servers only (``templates.enabled``); the template never asks torch about
  a device.
* random state: Python's ``random`` reseeds in every child (its at-fork
  hook); SGLang seeds torch, numpy and ``random`` from ``random_seed`` in
  every rank, as it does in a spawned one.
* per-server patches: the template's environment names no reverted fix,
  patch or extension (``templates.py`` strips them); a child applies its
  own after the fork (``hooks.activate_requested``), on modules already
  imported.
"""
from __future__ import annotations

import gc
import hmac
import json
import os
import select
import socket
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

READ_CHUNK = 1 << 16
REAP_INTERVAL_S = 1.0
ENV_LISTEN = "SCRIPTED_RUNTIME_TEMPLATE_LISTEN"  # a socket path in a 0700 directory, for child harnesses
ENV_TOKEN = "SCRIPTED_RUNTIME_TEMPLATE_TOKEN"  # the secret a connection's first line must carry
ENV_LOG = "SCRIPTED_RUNTIME_TEMPLATE_LOG"  # its log (stderr): removed when its harness hangs up
MAX_LINE = 1 << 20  # a connection sending more without a newline is dropped
# imported before the first fork: what a spawned launcher imports (the
# entry point and everything SGLang's launch_server pulls in, the scheduler
# module among them) and SGLang's model registry, which every rank imports
# when it builds its model (~1.7 s a rank). A patch applied after the fork
# meets these modules already imported (post_import.when_imported applies it
# at once); none of ours replaces a name a model module imported by value.
PREIMPORTS = ("sglang.srt.entrypoints.http_server", "sglang.srt.server_args",
              "scripted_runtime.user_side.launch", "sglang.srt.models.registry")


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: the check cannot be made
        return 1


OPENBLAS_THREAD_COUNTS = ("openblas_get_num_threads", "openblas_get_num_threads64_",
                          "scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_")


def openblas_pool_threads() -> int:
    """Worker threads of the fork-safe OpenBLAS pools loaded in this process
    (each library's ``num_threads - 1``; one that lacks the at-fork shutdown
    ``blas_thread_shutdown_`` counts none, so its threads fail the check)."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f
                           if "openblas" in line.lower() and line.split()[-1].startswith("/")})
    except OSError:
        return 0
    workers = 0
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if not hasattr(lib, "blas_thread_shutdown_"):
            continue
        for name in OPENBLAS_THREAD_COUNTS:
            if hasattr(lib, name):
                workers += max(int(getattr(lib, name)()) - 1, 0)
                break
    return workers


def _preimport() -> Dict[str, Any]:
    import importlib

    t0 = time.monotonic()
    for name in PREIMPORTS:
        importlib.import_module(name)
    import_s = round(time.monotonic() - t0, 2)
    # What the imports left is the servers' too: its garbage collected once
    # here, the rest moved out of the collector's reach (gc.freeze). A child's
    # collections (SGLang's own gc.collect() before it sizes the KV pool, ~0.7 s
    # a rank over the whole inherited heap) then walk only what the child
    # made, and do not write into the inherited objects' headers, which would
    # copy their pages into every rank (the use Python documents gc.freeze for).
    gc.collect()
    gc.freeze()
    info: Dict[str, Any] = {"import_s": import_s, "threads": _thread_count(),
                            "openblas_workers": openblas_pool_threads()}
    zmq = sys.modules.get("zmq")
    if zmq is not None and getattr(zmq.Context, "_instance", None) is not None:
        info["error"] = "importing SGLang made a ZMQ context: a fork would share its I/O threads"
    elif info["threads"] > 1 + info["openblas_workers"]:
        info["error"] = (f"importing SGLang started threads ({info['threads']} in /proc/self/task, "
                         f"{info['openblas_workers']} of them OpenBLAS workers): a fork would copy "
                         f"their locks, not them")
    return info


def _become_server(request: Dict[str, Any], protocol_fds: Tuple[int, ...]) -> None:
    """In the forked child: become the server's launcher. Never returns.
    ``protocol_fds``: the template's pipes, listening socket and connections
    (closed here: a launcher holds none of them)."""
    code = 1
    try:
        os.setsid()
        for fd in protocol_fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        # key by key, never os.environ.clear(): clearing rewrites every entry
        # of libc's environ, and setproctitle (SGLang names its ranks with it)
        # then finds no argv area it may overwrite and names nothing
        for key in [k for k in os.environ if k not in request["env"]]:
            del os.environ[key]
        for key, value in request["env"].items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        try:  # what ps shows for it (else the template's command line)
            import setproctitle

            setproctitle.setproctitle(f"scripted-runtime launcher (forked from template {os.getppid()})")
        except ImportError:
            pass
        # a patch's or extension's folder, as PYTHONPATH gives a spawned process
        for entry in reversed([p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        import importlib

        importlib.invalidate_caches()
        from scripted_runtime import hooks
        from scripted_runtime.hooks import forked_ranks

        hooks.activate_requested()
        forked_ranks.install()
        from scripted_runtime.user_side import launch

        launch.main(request["args_json"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _Connection:
    """A child harness's connection to the listening socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.authenticated = False


class _Template:
    def __init__(self, proto_in: int, proto_out: int, listener: Optional[socket.socket] = None,
                 token: str = "") -> None:
        self.proto_in = proto_in
        self.proto_out = proto_out
        self.listener = listener
        self.token = token
        self.connections: Dict[int, _Connection] = {}
        self.codes: Dict[int, int] = {}  # reaped children: pid -> exit code
        self.children: set = set()

    def send(self, obj: Dict[str, Any]) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(self.proto_out, data):]

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.codes[pid] = os.waitstatus_to_exitcode(status)

    def _own_fds(self) -> Tuple[int, ...]:
        fds: List[int] = [self.proto_in, self.proto_out, *self.connections]
        if self.listener is not None:
            fds.append(self.listener.fileno())
        return tuple(fds)

    def handle(self, request: Dict[str, Any]) -> Dict[str, Any]:
        op = request.get("op")
        if op == "spawn":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_server(request, self._own_fds())
            self.children.add(pid)
            return {"pid": pid}
        if op == "status":
            self.reap()
            pid = int(request["pid"])
            if pid in self.codes:
                return {"running": False, "code": self.codes[pid]}
            return {"running": pid in self.children, "code": None}
        return {"error": f"unknown request {op!r}"}

    def _answer(self, line: bytes) -> Dict[str, Any]:
        try:
            return self.handle(json.loads(line))
        except Exception as exc:  # a bad request must not take the template down
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _drop(self, fd: int) -> None:
        conn = self.connections.pop(fd, None)
        if conn is not None:
            conn.sock.close()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(True)
        self.connections[sock.fileno()] = _Connection(sock)

    def _serve_connection(self, fd: int) -> None:
        conn = self.connections[fd]
        try:
            chunk = conn.sock.recv(READ_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(fd)
            return
        conn.buf += chunk
        if len(conn.buf) > MAX_LINE and b"\n" not in conn.buf:
            self._drop(fd)
            return
        while b"\n" in conn.buf and fd in self.connections:
            line, conn.buf = conn.buf.split(b"\n", 1)
            if not conn.authenticated:
                try:
                    given = str(json.loads(line).get("token", ""))
                except (ValueError, AttributeError):
                    given = ""
                if not self.token or not hmac.compare_digest(given.encode(), self.token.encode()):
                    self._drop(fd)  # unanswered: a wrong secret learns nothing
                    return
                conn.authenticated = True
                answer: Dict[str, Any] = {"pid": os.getpid()}
            else:
                answer = self._answer(line)
            try:
                conn.sock.sendall((json.dumps(answer) + "\n").encode())
            except OSError:
                self._drop(fd)

    def serve(self) -> None:
        buf = b""
        while True:
            watched = [self.proto_in, *self.connections]
            if self.listener is not None:
                watched.append(self.listener.fileno())
            ready, _, _ = select.select(watched, [], [], REAP_INTERVAL_S)
            self.reap()
            for fd in ready:
                if self.listener is not None and fd == self.listener.fileno():
                    self._accept()
                elif fd in self.connections:
                    self._serve_connection(fd)
            if self.proto_in not in ready:
                continue
            chunk = os.read(self.proto_in, READ_CHUNK)
            if not chunk:
                return  # the harness closed its end, or died
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.send(self._answer(line))


def listen(path: str) -> socket.socket:
    """The listening socket for child harnesses, readable and writable by
    this user only (its directory is 0700 too)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(16)
    return sock


def main() -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # whatever the imports print goes to the log, not the protocol
    listen_path, token = os.environ.pop(ENV_LISTEN, ""), os.environ.pop(ENV_TOKEN, "")
    log_path = os.environ.pop(ENV_LOG, "")
    template = _Template(proto_in, proto_out)
    try:
        info = _preimport()
    except BaseException:
        template.send({"ready": False, "error": traceback.format_exc()})
        sys.exit(1)
    if "error" in info:
        template.send({"ready": False, **info})
        sys.exit(1)
    if listen_path and token:
        try:
            template.listener, template.token = listen(listen_path), token
            info["listening"] = True
        except OSError as exc:  # the harness then shares nothing; its own servers are not affected
            info["listening"] = False
            print(f"template: cannot listen on {listen_path}: {exc}", file=sys.stderr, flush=True)
    template.send({"ready": True, **info})
    template.serve()
    _remove_own_files(listen_path, log_path)


def _remove_own_files(listen_path: str, log_path: str) -> None:
    """Its harness hung up (closed or killed): the socket, its directory
    and the log go with the template (a harness killed with SIGKILL runs
    no cleanup of its own; one that closes it removes them too)."""
    for path in (listen_path, log_path):
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass
    if listen_path:
        try:
            os.rmdir(os.path.dirname(listen_path))
        except OSError:
            pass


if __name__ == "__main__":
    main()
