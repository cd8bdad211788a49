"""``ScriptedServer``: launch a real SGLang server with the hooks, run scripts.

    with ScriptedServer.start(topology="pp1-overlap") as server:
        result = server.run(my_script, 32)
        assert result.passed, result.traceback

Only the harness can drive its servers: the control channel to the
scheduler rank is a unix-domain socket in the server's work directory (mode
0700: no other user can connect), and SGLang's HTTP server (on 127.0.0.1)
gets a random per-start key as its ``api_key`` and ``admin_api_key``, which
the harness's own calls carry (docs/internals.md, "Who can reach what").
Every wait has a deadline whose error names what it waited for and shows
the tail of the server log.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import secrets
import shutil
import stat
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import zmq

from scripted_runtime.hooks import fix_toggles, patches as patch_specs, sglang_compat
from scripted_runtime import extensions as extension_points
from scripted_runtime.user_side import engine_config, processes, templates, workdirs
from scripted_runtime import module_paths, protocol, specs
from scripted_runtime.scheduler_side import invariants as invariant_names
from scripted_runtime.errors import EngineArgumentError, ServerDeadError, ServerStartError
from scripted_runtime.user_side.launch import BAD_ARGS_MARKER, EXIT_BAD_ENGINE_ARGS
from scripted_runtime.user_side.models import files as model_files
from scripted_runtime.user_side.models import tokenizer as model_tokenizer
from scripted_runtime.user_side.result import ScriptResult
from scripted_runtime.user_side.server_config import ServerConfig
from scripted_runtime import timeline

HOST = "127.0.0.1"
DEFAULT_START_TIMEOUT_S = 300.0
DEFAULT_RUN_TIMEOUT_S = 120.0
CANCEL_GRACE_S = 10.0
POLL_S = 0.05

ScriptLike = Union[Callable, str, protocol.ScriptTarget]


# SGLang derives ports from the HTTP port (0.5.13: gRPC at port + 10000, which
# must stay <= 65535), so the HTTP port comes from below the kernel's ephemeral
# range (32768+), where an OS-assigned port could land too high; and from below
# the range SGLang picks its own ports from (sglang_compat.SGLANG_OWN_PORT_RANGE:
# with both at 20000-30000 a standby starting beside a restart lost its HTTP port
# to the other server's process-group store, measured 2026-11-27).
HTTP_PORT_RANGE = (20000, sglang_compat.SGLANG_OWN_PORT_RANGE[0])
# A start whose HTTP port was taken between its choice and SGLang's bind is tried
# again on another port this many times.
PORT_TAKEN_RETRIES = 1
LOG_CHECK_S = 1.0  # how often a start reads the server log for a failed bind


class PortTakenError(ServerStartError):
    """SGLang could not bind the HTTP port the harness chose for it."""


def free_port(port_range: Tuple[int, int] = HTTP_PORT_RANGE, tries: int = 200) -> int:
    import random

    for _ in range(tries):
        port = random.randrange(*port_range)
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise ServerStartError(f"no free TCP port in {port_range[0]}-{port_range[1]} after {tries} tries")


# The longest path a unix-domain socket address may have (sun_path, 108 bytes with its NUL).
MAX_SOCKET_PATH = 107


def control_address(workdir: Path) -> str:
    """``ipc://WORKDIR/control``: the harness's channel to the scheduler rank.
    ``WORKDIR`` (a ``tempfile.mkdtemp``) must be the user's alone (no group
    or other permission bit), so no other user can reach the socket; a path
    too long for a unix socket is a ServerStartError naming TMPDIR."""
    mode = stat.S_IMODE(os.stat(workdir).st_mode)
    if mode & 0o077:
        raise ServerStartError(f"the server work directory {workdir} is mode {mode:o}: other users could reach "
                               "the control socket in it; it must be 0700")
    path = str(Path(workdir) / "control")
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ServerStartError(f"the control socket path {path} is {len(path.encode())} bytes, longer than a unix "
                               f"socket allows ({MAX_SOCKET_PATH}); set TMPDIR to a shorter directory")
    return f"ipc://{path}"


def script_target(script: ScriptLike) -> protocol.ScriptTarget:
    """A function, 'path/to/file.py:fn', 'package.module:fn' or a ScriptTarget."""
    if isinstance(script, protocol.ScriptTarget):
        return script
    if callable(script):
        path = inspect.getsourcefile(script)
        return protocol.ScriptTarget(qualname=script.__qualname__, path=os.path.abspath(path) if path else None,
                                     module=script.__module__)
    parsed = specs.parse(str(script), what="script", forms="PATH.py:FUNCTION or MODULE:FUNCTION")
    if parsed.is_file:
        return protocol.ScriptTarget(qualname=parsed.attr, path=parsed.where)
    return protocol.ScriptTarget(qualname=parsed.attr, module=parsed.where)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return "\n".join(text[-lines:])


def last_traceback(text: str) -> Optional[str]:
    idx = text.rfind("Traceback (most recent call last)")
    if idx < 0:
        return None
    block = text[idx:].splitlines()
    out = []
    for line in block:
        out.append(line)
        if out and not line.startswith((" ", "Traceback")) and len(out) > 1:
            break
    return "\n".join(out)


_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


def crash_line(tb: Optional[str]) -> str:
    """The one line a crash is named by: the traceback's exception line, and
    for a bare exception (``AssertionError`` with no message) the function
    and file it was raised in, so two bare assertions in different places
    are different failures. Pure."""
    lines = [l for l in (tb or "").strip().splitlines() if l.strip()]
    if not lines:
        return "no traceback"
    last = lines[-1].strip()
    if ":" not in last:
        frames = _FRAME.findall(tb or "")
        if frames:
            path, func = frames[-1]
            last += f" in {func} ({os.path.basename(path)})"
    return last


def first_crash_text(crash_dir: Path) -> Optional[str]:
    """The traceback of the rank that crashed first (each rank's crash file,
    ``hooks/scheduler_hook.py``, starts with the time it was written), then
    the others' after ``[later: FILE]``; None with no crash file. Under PP
    the first is the cause: the ranks after it die of its absence (the
    driver rank, for one, of a closed gloo connection)."""
    try:
        files = list(crash_dir.iterdir())
    except OSError:
        return None
    crashes = []
    for f in files:
        first, _, tb = f.read_text(errors="replace").partition("\n")
        try:
            crashes.append((float(first), f.name, tb))
        except ValueError:
            crashes.append((float("inf"), f.name, tb))
    if not crashes:
        return None
    crashes.sort()
    return crashes[0][2].rstrip() + "".join(f"\n\n[later: {name}]\n{tb}" for _, name, tb in crashes[1:])


def invariant_selection(invariants: Union[bool, Iterable[str]]) -> Tuple[str, ...]:
    """The invariant names to switch off for ``run(invariants=...)``."""
    if invariants is True:
        return ()
    if invariants is False or invariants is None:
        return tuple(invariant_names.all_names())
    wanted = invariant_names.validate_names(invariants)
    return tuple(n for n in invariant_names.all_names() if n not in wanted)


def config_from_keywords(*, device: str = "cpu", topology: str = "pp1-overlap", revert_fixes: Iterable[str] = (),
                        patches: Iterable[str] = (), extensions: Iterable[str] = (),
                        **engine_overrides: Any) -> ServerConfig:
    """The ``ServerConfig`` of ``ScriptedServer.start``'s keyword form."""
    return ServerConfig(topology=topology, device=device, engine_overrides=engine_overrides,
                        revert_fixes=tuple(revert_fixes), patches=tuple(patches), extensions=tuple(extensions))


# A CPU server's processes run one OpenMP (torch intra-op) thread each, unless
# the user's environment sets OMP_NUM_THREADS. SGLang leaves a CPU server at
# torch's default (one thread per core: it sets 1 itself only off CPU), so on
# the 2-core box a pp=4 server's four ranks spin eight threads on two cores,
# and the tiny model gains nothing from a second thread. Measured on the ci
# exploration of the default suite (2026-11-27, docs/internals.md "Threads of
# a CPU server"): pp4 103 s -> 52 s, pp1 25 s -> 22-23 s, same programs.
CPU_THREAD_ENV = {"OMP_NUM_THREADS": "1"}


def shared_environment(device: str) -> Tuple[Dict[str, str], str, List[str]]:
    """What every server of this harness shares, whatever its configuration:
    the environment (a template's, ``templates.base_env`` of it), the
    PYTHONPATH a template runs with, and the user's own PYTHONPATH entries."""
    harness = module_paths.harness_path_entry()
    env = {**sglang_compat.SERVER_ENV, **(CPU_THREAD_ENV if device == "cpu" else {}), **os.environ}
    first = [str(module_paths.site_dir()), harness]
    # the user's own entries (an ab side's child names the harness again: no second entry for it)
    user_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
    env.update({protocol.ENV_HOOKS: "1", protocol.ENV_DEVICE: device, "PYTHONUNBUFFERED": "1"})
    return env, os.pathsep.join(first + user_path), user_path


def prestart_template(device: str = "cpu") -> Optional[templates.Template]:
    """Start (or find) the process template this process's servers of
    ``device`` would fork from, before any is asked for: a command whose
    child processes start servers (``ab``'s sides) then has them share it.
    None where servers are spawned (templates off, a GPU)."""
    env, path, _ = shared_environment(device)
    if not templates.enabled(device, env):
        return None
    return templates.template_for(env, path, module_paths.harness_path_entry())


def share_template_with_children(device: str, *, tag: str, each: str, together: str) -> None:
    """Start this process's template before the child processes that start
    servers (``ab``'s sides, ``explore -n``'s workers), so they fork from it
    (templates.py: children share it) instead of each importing torch and
    SGLang; say so on stderr as ``[TAG]``. If it cannot start, ``each`` (of
    the children) starts its own, and the line says why."""
    try:
        template = prestart_template(device)
    except templates.TemplateError as exc:
        print(f"[{tag}] no shared process template ({str(exc).splitlines()[0][:200]}); {each} starts its own",
              file=sys.stderr, flush=True)
        return
    if template is not None:
        print(f"[{tag}] process template {template.pid} ready; {together} fork their servers from it",
              file=sys.stderr, flush=True)


class ScriptedServer:
    def __init__(self, config: ServerConfig, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 log_dir: Optional[Path] = None) -> None:
        """A server of ``config`` (validated here: a ValueError before
        anything starts), not yet started: ``launch()`` starts it."""
        self.config = config
        self.device = config.device
        self.topology = config.topology
        self.engine_kwargs = config.engine_kwargs()
        self.revert_fixes = config.resolved_revert_fixes()
        self.patches = list(config.patches)
        self._patch_specs = config.resolved_patches()
        self.extensions = list(config.extensions)
        self._extension_specs = config.resolved_extensions()  # loaded here too: names, actions
        self.start_timeout_s = start_timeout_s
        self._log_dir = log_dir
        self.info: Dict[str, Any] = {}
        self.start_time_s: Optional[float] = None
        self._proc: Optional[Union[subprocess.Popen, templates.ForkedLauncher]] = None
        self.forked = False  # started from a process template (templates.py)
        # the template's pid, and whether a parent harness's (templates.SharedTemplate)
        self.template_pid: Optional[int] = None
        self.template_shared = False
        # (pid, start time) of the launcher: its session holds the server's
        # processes, and it identifies them after the launcher is gone
        self._launcher: Tuple[int, Optional[int]] = (0, None)
        self._zmq: Optional[zmq.Context] = None
        self._sock: Optional[zmq.Socket] = None
        self._dead_reason: Optional[str] = None
        self.server_id = ""
        self._runs = 0
        self._trace_dir: Optional[Path] = None
        self.workdir = Path()
        self.log_path = Path()
        # this start's HTTP key (SGLang's api_key and admin_api_key); a call without it gets 401
        self.api_key = ""
        self.control_address = ""  # ipc://WORKDIR/control, this start's control channel
        self.http_url = ""  # http://127.0.0.1:PORT, this start's SGLang HTTP server
        self._abandon = threading.Event()  # set by another thread: stop waiting for ready, kill what started

    # --- lifecycle ----------------------------------------------------------
    @classmethod
    def start(cls, config: Optional[ServerConfig] = None, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
              log_dir: Optional[Union[str, Path]] = None, **legacy: Any) -> "ScriptedServer":
        """Start a server of ``config`` (``server_config.ServerConfig``:
        device, topology, engine overrides, reverted fixes, patches,
        extensions); blocks until it is ready. An unknown fix, patch or
        extension is a ValueError before anything starts.

        The keyword form builds the config: ``start(topology="pp4",
        device="cpu", revert_fixes=[...], patches=[...], extensions=[...],
        **engine_overrides)``. ``revert_fixes`` names SGLang fixes to undo
        in-process (``hooks/fix_toggles.py``), e.g. ``["pr27446"]``;
        ``patches`` names patches to apply in every scheduler rank: built-in
        fix toggles and mutants (``hooks/mutants/``), or a user's own as
        ``MODULE:ATTR`` / ``PATH.py:ATTR`` (``hooks/patches.py``).
        ``extensions``: modules of windows, invariants and explorer actions
        (``scripted_runtime/extensions.py``), loaded here and in every rank."""
        if config is None:
            config = config_from_keywords(**legacy)
        elif legacy:
            raise TypeError(f"ScriptedServer.start: pass a ServerConfig or keywords, not both "
                            f"(got {', '.join(sorted(legacy))})")
        server = cls(config, start_timeout_s=start_timeout_s, log_dir=Path(log_dir) if log_dir else None)
        return server.launch()

    def restart(self) -> "ScriptedServer":
        self.shutdown()
        self._launch()
        return self

    def sibling(self) -> "ScriptedServer":
        """A new, not yet started server of the same configuration (build,
        topology, engine arguments, fix toggles, patches); ``launch()`` starts it."""
        return ScriptedServer(self.config, start_timeout_s=self.start_timeout_s, log_dir=self._log_dir)

    def launch(self) -> "ScriptedServer":
        """Start this (not yet started) server; blocks until it is ready."""
        self._launch()
        return self

    def abandon(self) -> None:
        """From another thread: a ``launch()`` in progress stops waiting
        (ServerStartError) and kills what it started."""
        self._abandon.set()

    def _launch(self) -> None:
        for attempt in range(PORT_TAKEN_RETRIES + 1):
            try:
                self._launch_once()
                return
            except PortTakenError as exc:
                if attempt == PORT_TAKEN_RETRIES:
                    raise
                print(f"[scripted-runtime] {str(exc).splitlines()[0]}; starting again on another port",
                      file=sys.stderr, flush=True)

    def _launch_once(self) -> None:
        t0 = time.monotonic()
        self.server_id = uuid.uuid4().hex
        workdirs.prune_stale()  # work dirs of earlier servers, untouched for a week
        self.workdir = Path(tempfile.mkdtemp(prefix=workdirs.PREFIX))
        log_dir = self._log_dir or self.workdir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{self.topology}-{self.server_id[:8]}.log"
        crash_dir = self.workdir / "crashes"
        crash_dir.mkdir()
        self._dead_reason = None

        kwargs = dict(self.engine_kwargs)
        model_name = kwargs.pop("model", None) or engine_config.DEVICE_MODELS[self.device]
        expect_warmup = not kwargs.get("skip_server_warmup", False)
        checkpoint = None
        if "model_path" not in kwargs:
            served, checkpoint = model_files.served_and_update_checkpoints(
                model_name, str(kwargs.get("load_format", "auto")))
            kwargs["model_path"] = str(served or model_files.model_dir(model_name))
        if not engine_config.skips_tokenizer(kwargs) and "tokenizer_path" not in kwargs:
            # the model folders hold no tokenizer (no hub): the harness's own, for the tiny model
            if model_name != "tiny-qwen2":
                raise ValueError(f"skip_tokenizer_init=false needs tokenizer_path for {model_name!r} (the "
                                 "harness writes a tokenizer for the tiny CPU model only)")
            kwargs["tokenizer_path"] = str(model_tokenizer.tokenizer_dir())
        http_port = free_port()
        kwargs.update(host=HOST, port=http_port)

        self._zmq = zmq.Context()
        self._sock = self._zmq.socket(zmq.PAIR)
        self._sock.setsockopt(zmq.LINGER, 0)
        control = control_address(self.workdir)
        self._sock.bind(control)
        self.control_address = control
        self.http_url = f"http://{HOST}:{http_port}"
        self.api_key = secrets.token_hex(16)

        harness = module_paths.harness_path_entry()  # where the ranks import scripted_runtime from
        common_env, common_path, user_path = shared_environment(self.device)
        env = dict(common_env)
        env.update({
            protocol.ENV_IPC_ADDR: control,
            protocol.ENV_API_KEY: self.api_key,
            protocol.ENV_HTTP_URL: f"http://{HOST}:{http_port}",
            protocol.ENV_SERVER_ID: self.server_id,
            protocol.ENV_HARNESS_PID: str(os.getpid()),
            protocol.ENV_CRASH_DIR: str(crash_dir),
            protocol.ENV_SYS_PATH: os.pathsep.join([os.getcwd(), harness]),
            "SCRIPTED_RUNTIME_EXPECT_WARMUP": "1" if expect_warmup else "0",
            "PYTHONPATH": os.pathsep.join(
                [str(module_paths.site_dir()), harness] + [r.search_path for r in self._patch_specs if r.search_path]
                + [where for _, where in self._extension_specs if where] + user_path
            ),
            fix_toggles.ENV_REVERT_FIXES: ",".join(self.revert_fixes),
            patch_specs.ENV_PATCHES: ",".join(r.spec for r in self._patch_specs),
            extension_points.ENV_EXTENSIONS: ",".join(spec for spec, _ in self._extension_specs),
        })
        if checkpoint is not None:
            env[protocol.ENV_CHECKPOINT] = str(checkpoint)
        else:
            env[protocol.ENV_CHECKPOINT] = kwargs["model_path"]
        if kwargs.get("enable_lora") and model_name in model_files.CONFIGS:
            from scripted_runtime.user_side.models import lora_adapters

            env[protocol.ENV_LORA_ADAPTERS] = json.dumps(lora_adapters.adapters(model_name))
        if self.device == "cpu":
            env["SGLANG_CPU_OMP_THREADS_BIND"] = sglang_compat.omp_bind_rule().value(
                tp_size=kwargs.get("tp_size", 1), pp_size=kwargs.get("pp_size", 1),
                cores=os.cpu_count() or 1)
        self.forked = templates.enabled(self.device, env)
        if self.forked:  # forked from a process template (templates.py): nothing imported again
            try:
                template = templates.template_for(common_env, common_path, harness)
                self._proc = template.spawn(json.dumps(kwargs), env, harness, self.log_path)
                self.template_pid, self.template_shared = template.pid, template.shared
            except templates.TemplateError as exc:
                self._close_control()
                raise ServerStartError(str(exc)) from None
        else:
            log = open(self.log_path, "wb")
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "scripted_runtime.user_side.launch", json.dumps(kwargs)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=harness,
            )
            log.close()
        self._launcher = (self._proc.pid, processes.start_time(self._proc.pid))
        try:
            ready = self._wait_for_ready(t0)
        except BaseException:
            self._kill()
            raise
        self.info = ready.info
        self.start_time_s = time.monotonic() - t0

    def _wait_for_ready(self, t0: float) -> protocol.Ready:
        deadline = t0 + self.start_timeout_s
        next_log_check = time.monotonic() + LOG_CHECK_S
        while time.monotonic() < deadline:
            if self._abandon.is_set():
                raise ServerStartError("start abandoned (a standby no longer needed)")
            if time.monotonic() >= next_log_check:
                next_log_check = time.monotonic() + LOG_CHECK_S
                self._raise_if_port_taken()
            if self._sock.poll(int(POLL_S * 1000) * 4):
                msg = self._sock.recv_pyobj()
                if isinstance(msg, protocol.Ready):
                    return msg
                if isinstance(msg, protocol.SchedulerCrashed):
                    raise ServerStartError(f"the scheduler died during start-up:\n{msg.traceback}")
                raise ServerStartError(f"expected Ready from the scheduler hook, got {msg!r}")
            code = self._proc.poll()
            if code is not None:
                tail = log_tail(self.log_path)
                if code == EXIT_BAD_ENGINE_ARGS:
                    line = next((l for l in tail.splitlines() if BAD_ARGS_MARKER in l), tail)
                    raise EngineArgumentError(
                        f"SGLang rejected the engine arguments: {line.split(BAD_ARGS_MARKER)[-1].strip()}")
                raise ServerStartError(
                    f"the SGLang server exited with code {code} before the scheduler hook "
                    f"reported ready (log: {self.log_path}):\n{tail}")
        raise ServerStartError(
            f"the scheduler hook did not report ready within {self.start_timeout_s:.0f}s "
            f"(waiting for warmup to drain; log: {self.log_path}):\n{log_tail(self.log_path)}")

    def _raise_if_port_taken(self) -> None:
        """PortTakenError when the log says SGLang could not bind its HTTP
        port (its launcher then waits for good instead of exiting)."""
        tail = log_tail(self.log_path, lines=20)
        line = next((l for l in tail.splitlines() if sglang_compat.HTTP_BIND_FAILED in l), None)
        if line is not None:
            raise PortTakenError(f"the HTTP port of {self.http_url} was taken by another process before SGLang "
                                 f"bound it: {line.strip()} (log: {self.log_path})")

    @property
    def trace_dir(self) -> Path:
        """Where runs write their step traces (kept after shutdown)."""
        return self._trace_dir or (self._log_dir or self.workdir) / "traces"

    @trace_dir.setter
    def trace_dir(self, path: Union[str, Path]) -> None:
        self._trace_dir = Path(path)

    @property
    def origin(self) -> str:
        """How its processes started, for a ready line: "spawned", or
        "forked from process template N" (and "of a parent harness" when that
        template is another process's, templates.SharedTemplate)."""
        if not self.forked:
            return "spawned"
        return f"forked from process template {self.template_pid}" + (
            " of a parent harness" if self.template_shared else "")

    @property
    def alive(self) -> bool:
        return self._dead_reason is None and self._proc is not None and self._proc.poll() is None

    def pids(self) -> List[int]:
        """Every live process of this server (launcher, tokenizer manager,
        scheduler ranks, detokenizer, their helpers)."""
        if not self.server_id:
            return []
        return processes.pids_of_server(self.server_id, *self._launcher)

    def shutdown(self) -> float:
        """Stop every process of this server; returns seconds taken."""
        t0 = time.monotonic()
        if self._proc is None:
            return 0.0
        if self._sock is not None and self.alive:
            try:
                self._sock.send_pyobj(protocol.Shutdown(), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self._kill()
        return time.monotonic() - t0

    def _kill(self) -> None:
        left = []
        if self._proc is not None:
            left = processes.kill_server(self.server_id, self._proc.pid, pgid_start=self._launcher[1])
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None
        self._close_control()
        self._dead_reason = self._dead_reason or "shut down"
        shutil.rmtree(self.workdir / "crashes", ignore_errors=True)
        if left:
            raise ServerDeadError(f"processes of server {self.server_id[:8]} survived SIGKILL: {left}")

    def _close_control(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._zmq.term()
            self._sock = None

    def __enter__(self) -> "ScriptedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- scripts --------------------------------------------------------------
    def run(self, script: ScriptLike, *args: Any, timeout: float = DEFAULT_RUN_TIMEOUT_S,
            max_steps: int = 20_000, invariants: Union[bool, Iterable[str]] = True,
            trace: Union[bool, str, Path] = True, abstract_states: bool = False, **kwargs: Any) -> ScriptResult:
        """Run one script (after an engine reset); never raises for script
        failures: inspect ``result.passed`` / ``result.error``.

        ``invariants``: True (all, the default), False (none), or the names
        to check (see ``scripted_runtime.scheduler_side.invariants.NAMES``).
        ``trace``: True writes the step trace under ``trace_dir``; a path
        writes it there; False records none. ``abstract_states``: record the
        abstract state of every iteration (``result.states``; the explorer's
        programs, ``scheduler_side/abstract_state.py``)."""
        target = script_target(script)
        name = target.describe()
        if not self.alive:
            raise ServerDeadError(
                f"cannot run {name}: the server is not running ({self._dead_reason}); call restart()")
        disabled = invariant_selection(invariants)
        trace_path: Optional[str] = None
        if trace:
            if trace is True:
                self._runs += 1
                slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", target.qualname)[:60]
                trace_path = str(self.trace_dir / f"{self._runs:04d}-{slug}.jsonl")
            else:
                trace_path = str(Path(trace).resolve())
            Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self._sock.send_pyobj(protocol.RunScript(
            target=target, args=tuple(args), kwargs=kwargs, max_steps=max_steps, timeout_s=timeout,
            disabled_invariants=disabled, trace=bool(trace), trace_path=trace_path,
            abstract_states=abstract_states))
        cancel_sent = False
        while True:
            if self._sock.poll(int(POLL_S * 1000)):
                msg = self._sock.recv_pyobj()
                if isinstance(msg, protocol.ScriptDone):
                    return ScriptResult(
                        script=name, passed=msg.passed, steps=msg.steps, reset_steps=msg.reset_steps,
                        duration_s=msg.duration_s, error=msg.error, traceback=msg.traceback,
                        control_log=msg.control_log, value=msg.value, violation=msg.violation,
                        windows=msg.windows, timeline=msg.timeline, trace_path=trace_path,
                        reset_s=msg.reset_s, io_s=msg.io_s,
                        script_stack=list(msg.script_stack) if msg.script_stack else None,
                        states=tuple(msg.states))
                if isinstance(msg, protocol.SchedulerCrashed):
                    crashed = self._with_trace(self._crashed(name, msg.traceback, t0), trace_path)
                    crashed.script_stack = list(msg.script_stack) if msg.script_stack else None
                    crashed.crashed_in_reset = msg.in_reset
                    if getattr(msg, "control_log", None) is not None:
                        crashed.control_log, crashed.control_log_known = list(msg.control_log), True
                    return crashed
            crash = self._first_crash_text()
            if crash is not None or (self._proc is not None and self._proc.poll() is not None):
                time.sleep(0.3)  # a SchedulerCrashed frame may be in flight
                if self._sock.poll(0):
                    continue
                return self._with_trace(self._crashed(name, crash, t0), trace_path)
            elapsed = time.monotonic() - t0
            if elapsed > timeout + 5 and not cancel_sent:
                self._sock.send_pyobj(protocol.Cancel(reason=f"harness timeout {timeout:.0f}s"))
                cancel_sent = True
            if elapsed > timeout + 5 + CANCEL_GRACE_S:
                self._dead_reason = f"script {name} hung past {timeout:.0f}s and did not answer a cancel"
                tail = log_tail(self.log_path, 20)
                self._kill()
                if trace_path and os.path.exists(trace_path):
                    timeline.seal(trace_path)
                return ScriptResult(script=name, passed=False, duration_s=elapsed,
                                    error=f"HarnessTimeout: {self._dead_reason}; server killed",
                                    traceback=tail)

    @staticmethod
    def _with_trace(result: ScriptResult, trace_path: Optional[str]) -> ScriptResult:
        """A crashed run keeps the trace the scheduler flushed up to its death."""
        result.trace_path = trace_path
        if trace_path and os.path.exists(trace_path):
            try:
                timeline.seal(trace_path)  # the writer died with its map ahead of its text
                _, records = timeline.load(trace_path)
                result.timeline = timeline.format_timeline(records, last=20)
                if records:
                    result.steps = int(records[-1].get("step", 0))
            except (OSError, ValueError):
                pass
        return result

    def _first_crash_text(self) -> Optional[str]:
        return first_crash_text(self.workdir / "crashes")

    def _crashed(self, name: str, tb: Optional[str], t0: float) -> ScriptResult:
        log = ""
        try:
            log = self.log_path.read_text(errors="replace")
        except OSError:
            pass
        if tb is not None and self.config.pp_size() > 1:
            time.sleep(0.2)  # another rank's crash file, written as it died, is on disk by now
        tb = self._first_crash_text() or tb or last_traceback(log) or log_tail(self.log_path)
        first = tb.split("\n\n[later: ", 1)[0] if tb else tb
        self._dead_reason = "the scheduler crashed"
        self._kill()
        return ScriptResult(script=name, passed=False, crashed=True, duration_s=time.monotonic() - t0,
                            error=f"SchedulerCrashed: {crash_line(first)}",
                            traceback=tb, control_log_known=False)
