"""Messages between the harness and the scheduler hook, and the environment
variables through which the harness configures the hook.

The harness binds a pyzmq PAIR socket on a unix-domain socket (``ipc://``)
inside its server's work directory, which only the harness's user can enter
(mode 0700); the hook on the driver rank (pp_rank == tp_rank == 0) connects
to it. No TCP port is opened for it. Messages are pickled
dataclasses: both ends run this same package.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

# The checkpoint folder ``ctx.update_weights_from_disk`` loads by default (set by the launcher).
ENV_CHECKPOINT = "SCRIPTED_RUNTIME_CHECKPOINT"
# JSON {name: folder} of the LoRA adapters a LoRA server offers (user_side/models/lora_adapters.py)
ENV_LORA_ADAPTERS = "SCRIPTED_RUNTIME_LORA_ADAPTERS"
ENV_HOOKS = "SCRIPTED_RUNTIME_HOOKS"  # "1": activate hooks in this process tree
ENV_DEVICE = "SCRIPTED_RUNTIME_DEVICE"  # "cpu" turns on the CPU enablement patches
ENV_IPC_ADDR = "SCRIPTED_RUNTIME_IPC_ADDR"  # ipc://WORKDIR/control of the harness (WORKDIR mode 0700)
# The server's random per-start key: SGLang's api_key and admin_api_key (the launcher sets both),
# sent by the harness's own HTTP calls. In the environment (readable by the same user only),
# never on a command line.
ENV_API_KEY = "SCRIPTED_RUNTIME_API_KEY"
ENV_HTTP_URL = "SCRIPTED_RUNTIME_HTTP_URL"  # the server's own HTTP base URL
ENV_SYS_PATH = "SCRIPTED_RUNTIME_SYS_PATH"  # os.pathsep-joined entries for scripts
ENV_SERVER_ID = "SCRIPTED_RUNTIME_SERVER_ID"  # marks every process of one server
ENV_HARNESS_PID = "SCRIPTED_RUNTIME_HARNESS_PID"  # server exits when this pid dies
ENV_CRASH_DIR = "SCRIPTED_RUNTIME_CRASH_DIR"  # where ranks write crash tracebacks
# the patches (built-in names, MODULE:ATTR or PATH.py:ATTR) and the reverted fixes every rank
# installs, comma-separated (hooks/patches.py, hooks/fix_toggles.py)
ENV_PATCHES = "SCRIPTED_RUNTIME_PATCHES"
ENV_REVERT_FIXES = "SCRIPTED_RUNTIME_REVERT_FIXES"


def listed(env: str) -> List[str]:
    """The comma-separated items of environment variable ``env`` (none when unset or empty)."""
    return [item for item in os.environ.get(env, "").split(",") if item]


@dataclass(frozen=True)
class ScriptTarget:
    """Where the hook finds a script: a file path (preferred) or a module."""

    qualname: str
    path: Optional[str] = None
    module: Optional[str] = None

    def describe(self) -> str:
        return f"{self.path or self.module}:{self.qualname}"


@dataclass(frozen=True)
class RunScript:
    target: ScriptTarget
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)
    max_steps: int = 20_000
    timeout_s: float = 120.0
    disabled_invariants: Tuple[str, ...] = ()  # names from scripted_runtime.scheduler_side.invariants.NAMES
    trace: bool = True  # record the step trace
    trace_path: Optional[str] = None  # where the scheduler writes it (JSON lines)
    # record the abstract state of every iteration (scheduler_side/abstract_state.py; the explorer's
    # programs): ScriptDone.states
    abstract_states: bool = False


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Cancel:
    """Stop the running script at its next step (sent when the harness gives up)."""

    reason: str


@dataclass(frozen=True)
class Ready:
    info: Dict[str, Any]


@dataclass(frozen=True)
class ScriptDone:
    passed: bool
    steps: int
    reset_steps: int
    duration_s: float
    error: Optional[str] = None  # one line: "ExceptionType: message"
    traceback: Optional[str] = None
    control_log: List[Dict[str, Any]] = field(default_factory=list)
    value: Any = None  # the script's return value, if picklable
    violation: Optional[Dict[str, Any]] = None  # the invariant that failed the script
    windows: Dict[str, Dict[str, int]] = field(default_factory=dict)  # name -> hit counts
    timeline: str = ""  # last steps of the trace, one line each (on failure)
    reset_s: float = 0.0  # of duration_s: the engine reset before the script
    io_s: float = 0.0  # of duration_s: the script's HTTP posts and arrival waits
    # (file, line, function) of the script's generator frames, outermost
    # first, where it stood when it failed (None when it passed)
    script_stack: Optional[Tuple[Tuple[str, int, str], ...]] = None
    # the distinct abstract states the script reached, as sorted keys (with RunScript.abstract_states)
    states: Tuple[str, ...] = ()


@dataclass(frozen=True)
class SchedulerCrashed:
    traceback: str
    script_stack: Optional[Tuple[Tuple[str, int, str], ...]] = None  # where the script stood
    # it died in the reset before the script: what the previous script left behind broke it
    in_reset: bool = False
    # the control operations the script had posted (ControlLedger.log()), as ScriptDone's:
    # a crash's cause is read with them (a known bug's needs_ops); None where not known.
    # A crash in the reset (in_reset): the previous script's unsettled ones, then those the
    # reset posted
    control_log: Optional[Tuple[Any, ...]] = None
